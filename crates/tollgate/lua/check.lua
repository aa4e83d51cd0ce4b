-- tollgate's decision script: one atomic call decides a request against every policy
-- of a rule set (all-or-nothing) and applies it, or peeks, or refunds.
--
-- KEYS[i]  the state key of policy i. The keys of one limiter key share a hash tag,
--          so that they live in one Redis Cluster slot.
-- ARGV[1]  op: 'check' | 'peek' | 'refund'
-- ARGV[2]  now in us since the Unix epoch, or '' to take it from Redis TIME (so that
--          clients with skewed clocks agree); replay passes its trace time
-- ARGV[3]  the creation time of a key without state (us), or '' for now
-- ARGV[4]  cost (>= 1; checked against each policy's capacity by the caller)
-- ARGV[5]  '1' for acquire (wait for the earliest admission), '0' for try
-- ARGV[6]  margin (ms) added to each key's time to live: the time until its state is
--          fully replenished
-- ARGV[7]  a nonce unique to this call (sliding-log members)
-- ARGV[8]  n, the number of policies; then per policy:
--          code, shadow ('1'/'0'), max-wait in us ('' = unbounded), m, m parameters
--          (see each algorithm's file for its code and parameters)
--
-- Returns {now, admitted (1/0), state_1, ..., state_n}: each policy's state as it was
-- before this call ('' for a new key), from which the caller derives the full decision
-- (remaining, reset, retry, wait) with the same core code as the memory store. For
-- 'refund' the states are those after the refund.

local op = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
local created = now
if ARGV[3] ~= '' then created = tonumber(ARGV[3]) end
local cost = tonumber(ARGV[4])
local acquire = ARGV[5] == '1'
local margin_ms = tonumber(ARGV[6])
local nonce = ARGV[7]
local n = tonumber(ARGV[8])

local policies = {}
local i = 9
for k = 1, n do
  local alg = ALGOS[tonumber(ARGV[i])]
  if not alg then return redis.error_reply('tollgate: unknown algorithm code ' .. ARGV[i]) end
  local max_wait = nil
  if ARGV[i + 2] ~= '' then max_wait = tonumber(ARGV[i + 2]) end
  local m = tonumber(ARGV[i + 3])
  local a = {}
  for j = 1, m do a[j] = tonumber(ARGV[i + 3 + j]) end
  policies[k] = { alg = alg, p = alg.params(a), shadow = ARGV[i + 1] == '1',
                  max_wait = max_wait, key = KEYS[k] }
  i = i + 4 + m
end

local function load_all()
  local states = {}
  for k, pol in ipairs(policies) do
    local s = pol.alg.load(pol.p, pol.key, created)
    s.nonce = nonce .. '.' .. k
    states[k] = s
  end
  return states
end

local function encode_all(states)
  local out = {}
  for k, pol in ipairs(policies) do out[k] = pol.alg.encode(pol.p, states[k]) end
  return out
end

local function decide(pol, s, at, acq, max_wait)
  if pol.alg.check then return pol.alg.check(pol.p, s, at, cost, acq, max_wait) end
  return check_schedule(pol.alg, pol.p, s, at, cost, acq, max_wait)
end

-- Writes a state with a time to live of its time to replenish plus the margin.
local function save(pol, s)
  local ttl_ms = floor(pol.alg.reset_after(pol.p, s, now) / 1000) + 1 + margin_ms
  save_encoded(pol.alg, pol.p, pol.key, s, int(ttl_ms))
end

local function reply(admitted, encoded)
  local out = { now, admitted and 1 or 0 }
  for k = 1, n do out[k + 2] = encoded[k] end
  return out
end

local states = load_all()

if op == 'peek' then
  return reply(true, encode_all(states))
end

if op == 'refund' then
  for k, pol in ipairs(policies) do
    pol.alg.refund(pol.p, states[k], now, cost)
    save(pol, states[k])
  end
  return reply(true, encode_all(states))
end

local before = encode_all(states)

if n == 1 then
  local pol = policies[1]
  local ok = decide(pol, states[1], now, acquire, pol.max_wait)
  if ok then save(pol, states[1]) end
  return reply(ok or pol.shadow, before)
end

if not acquire then
  -- Every policy decides on its own state; all are written only if none rejects
  -- (a shadow policy's reject does not count).
  local all = true
  for k, pol in ipairs(policies) do
    local ok = decide(pol, states[k], now, false, nil)
    if not ok and not pol.shadow then all = false end
  end
  if all then
    for k, pol in ipairs(policies) do save(pol, states[k]) end
  end
  return reply(all, before)
end

-- Acquire: the common admission instant is the latest of the policies' earliest; if
-- it is within every policy's max-wait, every policy is charged at that instant.
local at = now
local rejected = false
for k, pol in ipairs(policies) do
  local ok, wait = decide(pol, states[k], now, true, nil)
  if ok then
    at = math.max(at, now + wait)
  elseif not pol.shadow then
    rejected = true
  end
end
for _, pol in ipairs(policies) do
  if pol.max_wait ~= nil and at - now > pol.max_wait then rejected = true end
end
if rejected then return reply(false, before) end
states = load_all()
for k, pol in ipairs(policies) do
  decide(pol, states[k], at, true, nil)
  save(pol, states[k])
end
return reply(true, before)
