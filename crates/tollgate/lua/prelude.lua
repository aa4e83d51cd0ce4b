-- tollgate: shared helpers of the decision script (see check.lua for KEYS and ARGV).
--
-- Lua numbers are doubles: integers are exact below 2^53. Every quantity the
-- algorithms keep is an integer in microseconds (or a scaled unit) below that bound
-- (the Rust side refuses policies whose constants could exceed it), and divisions go
-- through `idiv`, which corrects the rounding of `/` so that it is exact.

-- Redis 7.0 loads a Functions library with only the `redis` API in scope (the standard
-- libraries are there once a function runs), so `floor` is bound by the first call.
local floor

-- floor(a / b) for integers |a| < 2^53, b > 0.
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end

-- (us, frac) with frac brought into [0, scale): times kept as us plus a fraction in
-- 1/scale us (gcra, shaper).
local function ticks_norm(u, f, scale)
  local q = idiv(f, scale)
  return u + q, f - q * scale
end

-- ceil(a / b) for integers |a| < 2^53, b > 0.
local function cdiv(a, b)
  return -idiv(-a, b)
end

-- An integer as Redis and the Rust side read it (tostring would print 1e+15).
local function int(x)
  return string.format('%.0f', x)
end

-- A double, exactly (17 significant digits round-trip).
local function dbl(x)
  return string.format('%.17g', x)
end

-- Java's (long) cast of a double: truncation toward zero.
local function trunc(x)
  if x >= 0 then return floor(x) else return -floor(-x) end
end

-- The numbers of a space-separated state string.
local function fields(str)
  local out = {}
  for w in string.gmatch(str, '%S+') do out[#out + 1] = tonumber(w) end
  return out
end

-- Whether an earliest admission `wait` us away is admitted: try admits only at once,
-- acquire within max-wait (nil: unbounded).
local function fits(wait, acquire, max_wait)
  if not acquire then return wait == 0 end
  return max_wait == nil or wait <= max_wait
end

-- Algorithms by wire code. Each has:
--   load(p, key, created) -> state    (a missing key is the state of a new key; `raw`:
--                                      the stored string, when the state is one)
--   encode(p, s) -> string or number (what the Rust side parses, and what is stored;
--                                      '' for a state that is as new: the key is deleted)
--   nonce                             (optional: true if the state needs s.nonce)
--   save(p, key, s, ttl_ms)           (optional: states that are not one string)
--   check(p, s, now, cost, acquire, max_wait) -> admitted, wait   (mutates s when admitted)
--   refund(p, s, now, cost)
--   room(p, s, at, debt) -> units a charge may add (with earliest/admit), optionally
--   charge_at(p, s, now) -> the instant a charge is recorded at; or instead
--   charge(p, s, now, cost, debt)     (charges: see check.lua)
--   reset_after(p, s, now) -> us until the state is fully replenished (its TTL)
-- The wire code of each algorithm, as the Rust side sends it (the list of algorithms,
-- crates/tollgate-core/src/list.rs, and `lua` in src/redis/script.rs are the source;
-- a test checks this block).
local CODE = {
  GCRA = 1,
  TOKEN_BUCKET = 2,
  LEAKY_BUCKET = 3,
  FIXED_WINDOW = 4,
  SLIDING_LOG = 5,
  SLIDING_WINDOW = 6,
  SLIDING_WINDOW_WEIGHTED = 7,
  SMOOTH_BURSTY = 8,
  SMOOTH_WARMUP = 9,
  LIMIT_REQ = 10,
  SHAPER = 11,
  CONCURRENCY = 12,
}

local ALGOS = {}

-- Most states are one key holding space-separated numbers.
local function load_fields(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  return fields(v)
end

-- Writes a state as its encoding with a time to live, or deletes the key when the
-- state is as new.
local function save_encoded(alg, p, key, s, ttl_ms)
  if alg.save then return alg.save(p, key, s, ttl_ms) end
  local str = alg.encode(p, s)
  if str == '' then redis.call('DEL', key) else redis.call('SET', key, str, 'PX', ttl_ms) end
end

-- Admission at the earliest instant a request fits: the shared try/acquire logic of
-- the algorithms that define earliest(p, s, now, cost) and admit(p, s, now, at, cost).
local function check_schedule(alg, p, s, now, cost, acquire, max_wait)
  if alg.expire then alg.expire(p, s, now) end
  local at = alg.earliest(p, s, now, cost)
  if at < now then at = now end
  local wait = at - now
  if fits(wait, acquire, max_wait) then
    alg.admit(p, s, now, at, cost)
    return true, wait
  end
  return false, wait
end
