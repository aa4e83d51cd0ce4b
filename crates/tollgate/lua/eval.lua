-- The decision driver as one EVALSHA script (Redis < 7, or when Functions are
-- turned off): every call runs the definitions above, then this. ARGV[1] is 't' for
-- one try (the rest as run_try takes it), 'c' for one charge (the same), 'l' for a
-- lease (run_lease) or 'b' for a batch (as run_batch takes it),
-- with rule sets inline (a word count, then the words).
local args = {}
for i = 2, #ARGV do args[i - 1] = ARGV[i] end
if ARGV[1] == 't' then return run_try(KEYS, args, true, false) end
if ARGV[1] == 'c' then return run_try(KEYS, args, true, true) end
if ARGV[1] == 'l' then return run_lease(KEYS, args, true) end
return run_batch(KEYS, args, false, true)
