-- tollgate's decision driver: one atomic call decides a batch of checks, each against
-- every policy of its rule set (all-or-nothing), and applies it, or peeks, or refunds.
-- Loaded once per node as a Redis Function library (functions.lua registers `batch`),
-- or sent by EVALSHA where Functions are missing (eval.lua); the same code decides.
--
-- KEYS     the state keys of every check in order: check i has one key per policy of
--          its rule set. The keys of one call share one Redis Cluster slot.
-- ARGV[1]  margin (ms) added to each key's time to live: the time until its state is
--          fully replenished
-- ARGV[2]  a nonce unique to this call (sliding-log members: nonce.check.policy)
-- ARGV[3]  R, the number of rule sets; then per rule set: n, the number of policies,
--          then per policy: code, shadow ('1'/'0'), max-wait in us ('' = unbounded),
--          m, m parameters (see each algorithm's file for its code and parameters)
-- then     C, the number of checks; then per check:
--          op ('t' try, 'a' acquire, 'p' peek, 'r' refund), rule set index (1-based),
--          now in us since the Unix epoch or '' for Redis TIME (so that clients with
--          skewed clocks agree; replay passes its trace time), the creation time of a
--          key without state ('' = now), cost (>= 1; checked by the caller)
--
-- Returns {now, reply_1, ..., reply_C}: now is Redis TIME ('' when no check asked for
-- it); reply_i = {admitted (1/0), state_1, ..., state_n}, each policy's state as it was
-- before this check ('' for a new key), from which the caller derives the full
-- decision (remaining, reset, retry, wait) with the same core code as the memory
-- store. For a refund the states are those after it.

local function parse_rule_sets(args, i)
  local sets = {}
  local count = tonumber(args[i])
  i = i + 1
  for r = 1, count do
    local n = tonumber(args[i])
    i = i + 1
    local pols = {}
    for k = 1, n do
      local alg = ALGOS[tonumber(args[i])]
      if not alg then error('tollgate: unknown algorithm code ' .. args[i]) end
      local max_wait = nil
      if args[i + 2] ~= '' then max_wait = tonumber(args[i + 2]) end
      local m = tonumber(args[i + 3])
      local a = {}
      for j = 1, m do a[j] = tonumber(args[i + 3 + j]) end
      pols[k] = { alg = alg, p = alg.params(a), shadow = args[i + 1] == '1', max_wait = max_wait }
      i = i + 4 + m
    end
    sets[r] = pols
  end
  return sets, i
end

-- The states of one check's policies (keys[base + k] holds policy k's).
local function load_all(pols, keys, base, created, nonce)
  local states = {}
  for k, pol in ipairs(pols) do
    local s = pol.alg.load(pol.p, keys[base + k], created)
    s.nonce = nonce .. '.' .. k
    states[k] = s
  end
  return states
end

-- What the caller parses: the stored string when the state was one (cheaper than
-- encoding it again), else the algorithm's encoding.
local function encode_all(pols, states)
  local out = {}
  for k, pol in ipairs(pols) do out[k] = states[k].raw or pol.alg.encode(pol.p, states[k]) end
  return out
end

local function decide(pol, s, at, cost, acq, max_wait)
  if pol.alg.check then return pol.alg.check(pol.p, s, at, cost, acq, max_wait) end
  return check_schedule(pol.alg, pol.p, s, at, cost, acq, max_wait)
end

-- Writes a state with a time to live of its time to replenish plus the margin.
local function save(pol, key, s, now, margin_ms)
  local ttl_ms = floor(pol.alg.reset_after(pol.p, s, now) / 1000) + 1 + margin_ms
  save_encoded(pol.alg, pol.p, key, s, int(ttl_ms))
end

local function reply(admitted, encoded)
  local out = { admitted and 1 or 0 }
  for k = 1, #encoded do out[k + 1] = encoded[k] end
  return out
end

-- One check: op, its policies, its keys from keys[base + 1].
local function run_check(op, pols, keys, base, now, created, cost, margin_ms, nonce)
  local n = #pols
  local states = load_all(pols, keys, base, created, nonce)
  if op == 'p' then return reply(true, encode_all(pols, states)) end
  if op == 'r' then
    for k, pol in ipairs(pols) do
      states[k].raw = nil
      pol.alg.refund(pol.p, states[k], now, cost)
      save(pol, keys[base + k], states[k], now, margin_ms)
    end
    return reply(true, encode_all(pols, states))
  end
  local before = encode_all(pols, states)
  local acquire = op == 'a'
  if n == 1 then
    local pol = pols[1]
    local ok = decide(pol, states[1], now, cost, acquire, pol.max_wait)
    if ok then save(pol, keys[base + 1], states[1], now, margin_ms) end
    return reply(ok or pol.shadow, before)
  end
  if not acquire then
    -- Every policy decides on its own state; all are written only if none rejects
    -- (a shadow policy's reject does not count).
    local all = true
    for k, pol in ipairs(pols) do
      local ok = decide(pol, states[k], now, cost, false, nil)
      if not ok and not pol.shadow then all = false end
    end
    if all then
      for k, pol in ipairs(pols) do save(pol, keys[base + k], states[k], now, margin_ms) end
    end
    return reply(all, before)
  end
  -- Acquire: the common admission instant is the latest of the policies' earliest; if
  -- it is within every policy's max-wait, every policy is charged at that instant.
  local at = now
  local rejected = false
  for k, pol in ipairs(pols) do
    local ok, wait = decide(pol, states[k], now, cost, true, nil)
    if ok then
      at = math.max(at, now + wait)
    elseif not pol.shadow then
      rejected = true
    end
  end
  for _, pol in ipairs(pols) do
    if pol.max_wait ~= nil and at - now > pol.max_wait then rejected = true end
  end
  if rejected then return reply(false, before) end
  states = load_all(pols, keys, base, created, nonce)
  for k, pol in ipairs(pols) do
    decide(pol, states[k], at, cost, true, nil)
    save(pol, keys[base + k], states[k], now, margin_ms)
  end
  return reply(true, before)
end

-- The whole call (see the top of this file). `read_only`: peeks only (FCALL_RO).
local function run_batch(keys, args, read_only)
  floor = math.floor
  local margin_ms = tonumber(args[1])
  local nonce = args[2]
  local sets, i = parse_rule_sets(args, 3)
  local time = nil
  local out = { '' }
  local base = 0
  for c = 1, tonumber(args[i]) do
    local op, pols = args[i + 1], sets[tonumber(args[i + 2])]
    if read_only and op ~= 'p' then error('tollgate: only peeks are read-only') end
    local now
    if args[i + 3] == '' then
      if not time then
        local t = redis.call('TIME')
        time = tonumber(t[1]) * 1000000 + tonumber(t[2])
        out[1] = time
      end
      now = time
    else
      now = tonumber(args[i + 3])
    end
    local created = now
    if args[i + 4] ~= '' then created = tonumber(args[i + 4]) end
    local cost = tonumber(args[i + 5])
    out[c + 1] = run_check(op, pols, keys, base, now, created, cost, margin_ms, nonce .. '.' .. c)
    base = base + #pols
    i = i + 5
  end
  return out
end
