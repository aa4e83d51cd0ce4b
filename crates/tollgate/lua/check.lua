-- tollgate's decision driver: one atomic call decides a batch of checks, each against
-- every policy of its rule set (all-or-nothing), and applies it, or peeks, or refunds.
-- Loaded once per node as a Redis Function library (functions.lua registers `batch`),
-- or sent by EVALSHA where Functions are missing (eval.lua); the same code decides.
--
-- KEYS     the state keys of every check in order: check i has one key per policy of
--          its rule set. The keys of one call share one Redis Cluster slot.
-- ARGV[1]  a nonce unique to this call (sliding-log members: nonce.check.policy)
-- ARGV[2]  C, the number of checks; then per check, 4 arguments:
--          op ('t' try, 'a' acquire, 'p' peek, 'r' refund, 'c' charge: work done,
--          consumed with no limit test up to each policy's debt cap); its rule set's
--          index r;
--          '' to decide at Redis TIME (so that clients with skewed clocks agree) or
--          "now created" in us (replay passes its trace time, and the creation time of
--          a key without state); cost (>= 1; checked by the caller)
-- then     the rule sets, in order, each one string (as EVALSHA: a word count, then
--          the words): "margin n code shadow max_wait debt m p_1 .. p_m code ..."
--          (margin: ms added to each key's time to live, which is otherwise the time
--          until its state is fully replenished; n policies; shadow 1/0; max_wait in
--          us or '-' for unbounded; debt: the most units a charge may leave the state
--          past empty, computed by the Rust side; m parameters, see each algorithm's
--          file)
--
-- Returns one flat array {now, reply_1, ..., reply_C}: now is Redis TIME ('' when no
-- check asked for it); reply_i is admitted (1/0) then state_1, ..., state_n, each
-- policy's state as it was before this check ('' for a new key), from which the caller
-- derives the full decision (remaining, reset, retry, wait) with the same core code as
-- the memory store. For a refund the states are those after it. A charge always
-- answers 1 (the caller derives the verdict of Envoy's counting from the states).

-- The rule set whose words start at a[i]: margin, n, then per policy code, shadow,
-- max_wait, debt, m and m parameters.
local function parse_rule_set(a, i)
  local pols = { margin = tonumber(a[i]) }
  local n = tonumber(a[i + 1])
  i = i + 2
  for k = 1, n do
    local alg = ALGOS[tonumber(a[i])]
    if not alg then error('tollgate: unknown algorithm code ' .. a[i]) end
    local max_wait = nil
    if a[i + 2] ~= '-' then max_wait = tonumber(a[i + 2]) end
    local m = tonumber(a[i + 4])
    local params = {}
    for j = 1, m do params[j] = tonumber(a[i + 4 + j]) end
    pols[k] = { alg = alg, p = alg.params(params), shadow = a[i + 1] == '1', max_wait = max_wait,
                debt = tonumber(a[i + 3]) }
    i = i + 5 + m
  end
  -- A single policy with a fast path for tries (and charges): called straight from
  -- the batch loop (and the one-check entry points).
  if n == 1 then
    pols.try_fast = pols[1].alg.try_fast
    pols.charge_fast = pols[1].alg.charge_fast
  end
  -- Several, each with one: a one-try call decides them all without tables.
  local all = n > 1
  for k = 1, n do all = all and pols[k].alg.try_fast ~= nil end
  pols.all_fast = all
  return pols
end

-- Parsed rule sets by their string. Loaded as Functions, the library keeps this table
-- between calls, so a rule set is parsed once per node (a cache: decisions never
-- depend on it).
local RULE_SETS = {}
local RULE_SETS_LEN = 0

local function rule_set(str)
  local pols = RULE_SETS[str]
  if pols then return pols end
  local words = {}
  for w in string.gmatch(str, '%S+') do words[#words + 1] = w end
  pols = parse_rule_set(words, 1)
  if RULE_SETS_LEN >= 1000 then
    RULE_SETS = {}
    RULE_SETS_LEN = 0
  end
  RULE_SETS[str] = pols
  RULE_SETS_LEN = RULE_SETS_LEN + 1
  return pols
end

-- The rule set at args[i] and the index after it: one string (Functions), or
-- `inline` (EVALSHA, which would parse a string on every call) a word count and the
-- words.
local function rules_at(args, i, inline)
  if not inline then return rule_set(args[i]), i + 1 end
  return parse_rule_set(args, i + 1), i + 1 + tonumber(args[i])
end

-- The states of one check's policies (keys[base + k] holds policy k's).
-- Loads policy k's state; `nonce`..`check` names the check (built only when needed).
local function load_one(pol, keys, base, k, created, nonce, check)
  local s = pol.alg.load(pol.p, keys[base + k], created)
  if pol.alg.nonce then s.nonce = nonce .. '.' .. check .. '.' .. k end
  return s
end

local function load_all(pols, keys, base, created, nonce, check)
  local states = {}
  for k, pol in ipairs(pols) do states[k] = load_one(pol, keys, base, k, created, nonce, check) end
  return states
end

-- What the caller parses: the stored string when the state was one (cheaper than
-- encoding it again), else the algorithm's encoding, always as a string.
local function encode_all(pols, states)
  local out = {}
  for k, pol in ipairs(pols) do
    local e = states[k].raw or pol.alg.encode(pol.p, states[k])
    if type(e) == 'number' then e = int(e) end
    out[k] = e
  end
  return out
end

local function decide(pol, s, at, cost, acq, max_wait)
  if pol.alg.check then return pol.alg.check(pol.p, s, at, cost, acq, max_wait) end
  return check_schedule(pol.alg, pol.p, s, at, cost, acq, max_wait)
end

-- A charge (work already done): the units that fit before the policy's debt cap,
-- with no limit test. Algorithms with earliest/admit define room(p, s, at, debt) and
-- optionally charge_at(p, s, now); the others define charge(p, s, now, cost, debt).
local function charge(pol, s, now, cost)
  local alg = pol.alg
  if alg.charge then return alg.charge(pol.p, s, now, cost, pol.debt) end
  if alg.expire then alg.expire(pol.p, s, now) end
  local at = now
  if alg.charge_at then at = math.max(alg.charge_at(pol.p, s, now), now) end
  local n = math.min(cost, alg.room(pol.p, s, at, pol.debt))
  if n > 0 then alg.admit(pol.p, s, now, at, n) end
end

-- Writes a state with a time to live of its time to replenish plus the margin.
local function save(pol, key, s, now, margin_ms)
  local ttl_ms = floor(pol.alg.reset_after(pol.p, s, now) / 1000) + 1 + margin_ms
  save_encoded(pol.alg, pol.p, key, s, ttl_ms)
end

-- Appends one check's reply to `out`.
local function reply(out, admitted, encoded)
  out[#out + 1] = admitted and 1 or 0
  for k = 1, #encoded do out[#out + 1] = encoded[k] end
end

-- One check (op, its policies, its keys from keys[base + 1]); its reply goes to `out`.
local function run_check(out, op, pols, keys, base, now, created, cost, margin_ms, nonce, check)
  local n = #pols
  if n == 1 and (op == 't' or op == 'c') then
    -- The common cases, without the tables of the general path below.
    local pol = pols[1]
    local key = keys[base + 1]
    local s = load_one(pol, keys, base, 1, created, nonce, check)
    local before = s.raw or pol.alg.encode(pol.p, s)
    if type(before) == 'number' then before = int(before) end
    if op == 'c' then
      s.raw = nil
      charge(pol, s, now, cost)
      save(pol, key, s, now, margin_ms)
      out[#out + 1] = 1
      out[#out + 1] = before
      return
    end
    local ok = decide(pol, s, now, cost, false, nil)
    if ok then save(pol, key, s, now, margin_ms) end
    out[#out + 1] = (ok or pol.shadow) and 1 or 0
    out[#out + 1] = before
    return
  end
  local states = load_all(pols, keys, base, created, nonce, check)
  if op == 'p' then return reply(out, true, encode_all(pols, states)) end
  if op == 'r' then
    for k, pol in ipairs(pols) do
      states[k].raw = nil
      pol.alg.refund(pol.p, states[k], now, cost)
      save(pol, keys[base + k], states[k], now, margin_ms)
    end
    return reply(out, true, encode_all(pols, states))
  end
  local before = encode_all(pols, states)
  if op == 'c' then
    for k, pol in ipairs(pols) do
      states[k].raw = nil
      charge(pol, states[k], now, cost)
      save(pol, keys[base + k], states[k], now, margin_ms)
    end
    return reply(out, true, before)
  end
  local acquire = op == 'a'
  if n == 1 then
    local pol = pols[1]
    local ok = decide(pol, states[1], now, cost, acquire, pol.max_wait)
    if ok then save(pol, keys[base + 1], states[1], now, margin_ms) end
    return reply(out, ok or pol.shadow, before)
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
    return reply(out, all, before)
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
  if rejected then return reply(out, false, before) end
  states = load_all(pols, keys, base, created, nonce, check)
  for k, pol in ipairs(pols) do
    decide(pol, states[k], at, cost, true, nil)
    save(pol, keys[base + k], states[k], now, margin_ms)
  end
  return reply(out, true, before)
end

-- The whole call (see the top of this file). `read_only`: peeks only (FCALL_RO).
-- Decides at Redis TIME ('') or at "now created" (replay).
local function times(at)
  if at == '' then
    local t = redis.call('TIME')
    local now = t[1] * 1000000 + t[2]
    return now, now
  end
  local sp = string.find(at, ' ', 1, true)
  return tonumber(string.sub(at, 1, sp - 1)), tonumber(string.sub(at, sp + 1))
end

-- The time to live (ms) of a fast-path state that is fully replenished at `full`.
local function fast_ttl(full, now, margin_ms)
  return floor((full - now) / 1000) + 1 + margin_ms
end

-- Scratch of batch_fast, reused by every check (no tables per check).
local BEFORE, NEWS, FULLS = {}, {}, {}

-- A try decided by its policies' fast paths (no tables of states) on the values in
-- `cache` (read from Redis when missing; false: no state): admitted (1/0) and the
-- values before (BEFORE[1..n], valid until the next call); the new values are staged
-- in `cache`, their times to live in `pending`, when every policy admits
-- (all-or-nothing, a shadow policy's reject not counting, as the general path).
-- nil when a state needs the general path (nothing staged).
local function batch_fast(pols, keys, base, cache, pending, now, cost)
  local all = 1
  for k, pol in ipairs(pols) do
    local key = keys[base + k]
    local v = cache[key]
    if v == nil then v = redis.call('GET', key) or false end
    local admitted, new, full = pol.alg.try_fast(pol.p, v or nil, now, cost, pol.shadow)
    if admitted == nil then return nil end
    if admitted == 0 then all = 0 end
    BEFORE[k], NEWS[k], FULLS[k] = v, new, full
  end
  if all == 1 then
    for k = 1, #pols do
      if NEWS[k] then
        local key = keys[base + k]
        cache[key] = NEWS[k]
        pending[key] = fast_ttl(FULLS[k], now, pols.margin)
      end
    end
  end
  return all, BEFORE
end

-- A charge of a single policy with a fast path (`charge_fast`), decided as
-- batch_fast decides a try: 1 and the value before (BEFORE[1]), the new value staged
-- in `cache` and its time to live in `pending`; nil when a state needs the general
-- path (nothing staged).
local function batch_charge(pols, keys, base, cache, pending, now, cost)
  local pol = pols[1]
  local key = keys[base + 1]
  local v = cache[key]
  if v == nil then v = redis.call('GET', key) or false end
  local new, full = pols.charge_fast(pol.p, v or nil, now, cost, pol.debt)
  if new == nil then return nil end
  if new then
    cache[key] = new
    pending[key] = fast_ttl(full, now, pols.margin)
  end
  BEFORE[1] = v
  return 1, BEFORE
end

-- Writes the staged states (`cache`) of the keys in `pending` with their times to live.
local function write_pending(pending, cache)
  for key, ttl in pairs(pending) do redis.call('SET', key, cache[key], 'PX', ttl) end
end

-- One charge of a single policy with a fast path (`charge_fast`): nil when it does
-- not apply (the general path decides), else the reply {now, 1, value before}.
local function charge_one(pols, keys, now, cost)
  local fast = pols.charge_fast
  if not fast then return nil end
  local pol = pols[1]
  local v = redis.call('GET', keys[1])
  local new, full = fast(pol.p, v or nil, now, cost, pol.debt)
  if new == nil then return nil end
  if new then redis.call('SET', keys[1], new, 'PX', fast_ttl(full, now, pols.margin)) end
  return { now, 1, v or '' }
end

-- One try (or with `charging`, one charge) with short arguments, the common call
-- when checks are not batched: ARGV = {rule set, cost, '' or "now created", [nonce]};
-- returns {now, reply} as run_batch does for one check.
local function run_try(keys, args, inline, charging)
  floor = math.floor
  local pols, i = RULE_SETS[args[1]], 2
  if not pols then pols, i = rules_at(args, 1, inline) end
  local cost = tonumber(args[i])
  local now, created
  if args[i + 1] == '' then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
    created = now
  else
    now, created = times(args[i + 1])
  end
  if charging then
    local done = charge_one(pols, keys, now, cost)
    if done then return done end
    local out = { now }
    run_check(out, 'c', pols, keys, 0, now, created, cost, pols.margin, args[i + 2] or '', 1)
    return out
  end
  local fast = pols.try_fast
  if fast then
    local pol = pols[1]
    local v = redis.call('GET', keys[1])
    local admitted, new, full = fast(pol.p, v, now, cost, pol.shadow)
    if admitted then
      if new then
        redis.call('SET', keys[1], new, 'PX', fast_ttl(full, now, pols.margin))
      end
      return { now, admitted, v or '' }
    end
  end
  if pols.all_fast then
    -- Several policies, each with a fast path: their states read with one MGET.
    local cache, pending = {}, {}
    local vs = redis.call('MGET', unpack(keys))
    for k, key in ipairs(keys) do cache[key] = vs[k] end
    local admitted, before = batch_fast(pols, keys, 0, cache, pending, now, cost)
    if admitted then
      write_pending(pending, cache)
      local out = { now, admitted }
      for k = 1, #pols do out[k + 2] = before[k] or '' end
      return out
    end
  end
  local out = { now }
  run_check(out, 't', pols, keys, 0, now, created, cost, pols.margin, args[i + 2] or '', 1)
  return out
end

-- A batch's fast-path states (tries, and charges of one policy): read together with
-- one MGET, decided in order against the values this call has written, and each
-- written once at the end (or before a check of the general path, which reads Redis
-- itself). The same decisions, in the same order, as one call per check.
local function fast_reads(keys, args, count, sets)
  local list, seen = {}, {}
  local i, base = 3, 0
  for c = 1, count do
    local pols = sets[tonumber(args[i + 1])]
    local op = args[i]
    if (op == 't' and (pols.try_fast or pols.all_fast)) or (op == 'c' and pols.charge_fast) then
      for k = 1, #pols do
        local key = keys[base + k]
        if not seen[key] then
          seen[key] = true
          list[#list + 1] = key
        end
      end
    end
    base = base + #pols
    i = i + 4
  end
  local cache = {}
  if #list > 0 then
    local values = redis.call('MGET', unpack(list))
    for k, key in ipairs(list) do cache[key] = values[k] end -- false: no state
  end
  return cache
end

local function run_batch(keys, args, read_only, inline)
  floor = math.floor
  local nonce = args[1]
  local count = tonumber(args[2])
  local sets = {}
  local j = 3 + 4 * count
  while j <= #args do sets[#sets + 1], j = rules_at(args, j, inline) end
  local cache = {}
  if not read_only then cache = fast_reads(keys, args, count, sets) end
  local pending = {}
  local time = nil
  local out = { '' }
  local base = 0
  local i = 3
  for c = 1, count do
    local op = args[i]
    local pols = sets[tonumber(args[i + 1])]
    if read_only and op ~= 'p' then error('tollgate: only peeks are read-only') end
    local now, created
    local at = args[i + 2]
    if at == '' then
      if not time then
        local t = redis.call('TIME')
        time = t[1] * 1000000 + t[2]
        out[1] = time
      end
      now, created = time, time
    else
      now, created = times(at)
    end
    local cost = tonumber(args[i + 3])
    local admitted, before
    if op == 't' and (pols.try_fast or pols.all_fast) then
      admitted, before = batch_fast(pols, keys, base, cache, pending, now, cost)
    elseif op == 'c' and pols.charge_fast then
      admitted, before = batch_charge(pols, keys, base, cache, pending, now, cost)
    end
    if admitted then
      out[#out + 1] = admitted
      for k = 1, #pols do
        local v = before[k]
        if not v then v = '' elseif type(v) == 'number' then v = int(v) end
        out[#out + 1] = v
      end
    else
      -- The general path reads and writes Redis: bring it up to date first.
      write_pending(pending, cache)
      pending, cache = {}, {}
      run_check(out, op, pols, keys, base, now, created, cost, pols.margin, nonce, c)
    end
    base = base + #pols
    i = i + 4
  end
  write_pending(pending, cache)
  return out
end
