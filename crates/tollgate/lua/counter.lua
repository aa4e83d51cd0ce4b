-- The window counter: a `fixed-window` with `align=clock` and `debt=forgive` kept as
-- envoyproxy/ratelimit keeps its counters, one integer key per window (KEYS[1]), so
-- that counting (Envoy's hits, a charge) is a plain INCRBY and PEXPIRE with no script.
-- This script makes the two changes that must read before they write, atomically:
--   ARGV[1] = 't': a try of ARGV[2] units within the limit ARGV[3]: adds them and
--                  expires the key in ARGV[4] ms when they fit;
--   ARGV[1] = 'r': a refund of ARGV[2] units, never below 0.
-- Returns the count before the change (the Rust core decides from it).
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local cost = tonumber(ARGV[2])
if ARGV[1] == 't' then
  if n + cost <= tonumber(ARGV[3]) then
    redis.call('INCRBY', KEYS[1], ARGV[2])
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
  end
elseif n > 0 then
  redis.call('DECRBY', KEYS[1], math.min(cost, n))
end
return n
