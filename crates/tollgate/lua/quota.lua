-- tollgate's quota buckets (Envoy's RLQS) shared by several servers: one bucket's
-- state (its ledger and clients, encoded by the Rust core) with a version. A server
-- loads the state, applies a report or a tick with the core, and stores the result
-- only if nobody stored in between (else it gets the newer state and applies again),
-- so every change is made on the state before it, as on one server.
--
-- KEYS[1]  the bucket: HASH 'v' -> version (an integer), 's' -> state (bytes)
-- ARGV[1]  op: 'load' | 'store'
-- ARGV[2]  (store) the version the state was computed from (0: none existed)
-- ARGV[3]  (store) the new state; '' deletes the bucket (nobody left to count, and
--          its tokens back to the full burst)
-- ARGV[4]  (store) the bucket's time to live (ms): past it, every share it counted
--          has ended, every client is stale and its tokens have refilled, so
--          forgetting it loses nothing
--
-- Returns {stored, now, version, state}: stored 1 if this call stored ARGV[3] (the
-- rest then describe the new state: version, no state), else 0 with the state as it
-- stands (version 0 and no state when the bucket is new); now is Redis' time in us
-- since the Unix epoch, the instant the core decides at.

local key, op = KEYS[1], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local version = tonumber(redis.call('HGET', key, 'v') or '0')

if op == 'store' and tonumber(ARGV[2]) == version then
  if ARGV[3] == '' then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'v', version + 1, 's', ARGV[3])
    redis.call('PEXPIRE', key, ARGV[4])
  end
  return {1, now, version + 1, false}
end
return {0, now, version, redis.call('HGET', key, 's')}
