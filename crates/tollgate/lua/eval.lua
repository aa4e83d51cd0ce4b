-- The decision driver as one EVALSHA script (Redis < 7, or when Functions are
-- turned off): every call runs the definitions above, then the batch.
return run_batch(KEYS, ARGV, false)
