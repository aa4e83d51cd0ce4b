-- Leases: an instance reserves a slice of a key's budget (n admissions it may decide
-- locally until a deadline) and later gives back what it did not spend. One atomic
-- call ends the previous lease of the key (if any) and takes the next.
--
-- Taking: the slice must fit now (each policy's lease_avail), and each policy's state
-- is charged as if the n admissions happened at the deadline (lease_charge): the
-- slice may be spent at any instant up to then, so charging it at the reservation
-- would let the key refill past its burst while the slice is still held. Windows
-- clamp the deadline to the end of the window the slice is taken from.
--
-- Giving back: when the key's states are still exactly what the lease left
-- (`charged`: nobody else decided since), the holder's own states replace them: the
-- holder decided locally with the exact algorithm from the states it was given
-- (`snapshot`), so the key is left as if there had been no lease. Otherwise the unspent
-- units are refunded (lease_return), but only up to the lease's deadline: until then
-- the key's states count the whole slice as still to come; after it, refills may have
-- absorbed the unspent part (a full bucket cannot hold more), and refunding it then
-- would free what others have used since. Past the deadline the unspent units stay
-- charged and come back as the key refills.
--
-- ARGV: the rule set (as check.lua: one string, or inline for EVALSHA), then
--   want      slice size asked for (0: only give back)
--   need      the least slice worth taking (the cost waiting for it)
--   duration  us from now until the deadline
--   unspent   units of the previous lease not spent (0 if none)
--   until     the previous lease's deadline (us; 0 if none)
--   times     '' for Redis TIME, or "now created" (tests and replay)
--   then per policy: charged (the state the previous lease left, '' if none) and
--   local (the holder's state after its local decisions, '' if none)
-- Returns {now, granted, deadline, snapshot_1, charged_1, ..., snapshot_n, charged_n}
-- or {now, 0, retry_us} when `need` does not fit (retry_us: until it would).

local function run_lease(keys, args, inline)
  floor = math.floor
  local pols, i = rules_at(args, 1, inline)
  local want, need = tonumber(args[i]), tonumber(args[i + 1])
  local duration, unspent = tonumber(args[i + 2]), tonumber(args[i + 3])
  local prev_deadline = tonumber(args[i + 4])
  local now, created = times(args[i + 5])
  local prev = i + 6
  local n = #pols
  local states = load_all(pols, keys, 0, created, '', 1)

  -- End the previous lease.
  if args[prev] ~= '' then
    local untouched = true
    for k, pol in ipairs(pols) do
      local cur = states[k].raw or pol.alg.encode(pol.p, states[k])
      if type(cur) == 'number' then cur = int(cur) end
      if cur ~= args[prev + 2 * (k - 1)] then untouched = false end
    end
    for k, pol in ipairs(pols) do
      local key = keys[k]
      if untouched then
        local mine = args[prev + 2 * (k - 1) + 1]
        if mine == '' then redis.call('DEL', key) else redis.call('SET', key, mine) end
        states[k] = load_one(pol, keys, 0, k, created, '', 1)
      elseif unspent > 0 and now <= prev_deadline then
        pol.alg.lease_return(pol.p, states[k], now, unspent, args[prev + 2 * (k - 1)])
      end
      states[k].raw = nil
      save(pol, key, states[k], now, pols.margin)
    end
  end
  if want == 0 then return { now, 0, 0 } end

  -- Take the next.
  local avail = want
  local deadline = now + duration
  for k, pol in ipairs(pols) do
    avail = math.min(avail, pol.alg.lease_avail(pol.p, states[k], now))
    if pol.alg.lease_deadline then
      deadline = pol.alg.lease_deadline(pol.p, states[k], now, deadline)
    end
  end
  if avail < need then
    local retry = 0
    for k, pol in ipairs(pols) do
      local s = states[k]
      if pol.alg.expire then pol.alg.expire(pol.p, s, now) end
      retry = math.max(retry, pol.alg.earliest(pol.p, s, now, need) - now)
    end
    return { now, 0, retry }
  end
  local out = { now, avail, deadline }
  for k, pol in ipairs(pols) do
    local s = states[k]
    local snapshot = s.raw or pol.alg.encode(pol.p, s)
    if type(snapshot) == 'number' then snapshot = int(snapshot) end
    s.raw = nil
    pol.alg.lease_charge(pol.p, s, now, avail, deadline)
    save(pol, keys[k], s, now, pols.margin)
    local charged = pol.alg.encode(pol.p, s)
    if type(charged) == 'number' then charged = int(charged) end
    out[#out + 1] = snapshot
    out[#out + 1] = charged
  end
  return out
end
