-- A minimal GCRA decision in the shape of go-redis/redis_rate's script: the yardstick
-- for what one tollgate decision costs Redis (scripts/bench-redis.sh drives both with
-- redis-benchmark the same way). Written here, not copied.
--
-- KEYS[1]  the key's theoretical arrival time (TAT, us since the Unix epoch)
-- ARGV[1]  burst   ARGV[2]  rate   ARGV[3]  period (s)   ARGV[4]  cost
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local interval = period * 1000000 / rate
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + cost * interval
local allow_at = new_tat - burst * interval
if now < allow_at then
  return {0, 0, math.ceil(allow_at - now), math.ceil(tat - now)}
end
local reset_after = new_tat - now
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil(reset_after / 1000))
return {1, math.floor((now - allow_at) / interval), 0, math.ceil(reset_after)}
