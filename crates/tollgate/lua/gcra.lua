-- gcra (code 1). Params: scale, interval, tau (interval and tau in 1/scale us ticks).
-- State: the TAT as "us frac" (tat = us*scale + frac, 0 <= frac < scale), so that
-- an epoch-anchored time times the scale never has to fit a double; "us" alone when
-- frac is 0 (always, for a rate whose interval is whole microseconds).
-- new = max(tat, now) + cost*T; admitted iff now >= new - tau; then tat = new.

-- max(tat, now) + cost*interval, as (us, frac).
local function gcra_next(p, s, now, cost)
  local u, f = s.u, s.f
  if u < now then u, f = now, 0 end
  return ticks_norm(u, f + cost * p.interval, p.scale)
end

ALGOS[CODE.GCRA] = {
  params = function(a) return { scale = a[1], interval = a[2], tau = a[3] } end,
  load = function(p, key)
    local v = redis.call('GET', key)
    if not v then return { u = 0, f = 0, raw = '' } end
    local sp = string.find(v, ' ', 1, true)
    if not sp then return { u = tonumber(v), f = 0, raw = v } end
    return { u = tonumber(string.sub(v, 1, sp - 1)), f = tonumber(string.sub(v, sp + 1)), raw = v }
  end,
  encode = function(p, s)
    if s.f == 0 then return s.u end
    return int(s.u) .. ' ' .. int(s.f)
  end,
  -- A try on the stored value `v` (nil: no state) when the TAT is whole microseconds
  -- (always, for an interval of whole microseconds), with no tables; the general path
  -- below gives the same decision. Returns admitted (1/0), the value to store (nil:
  -- nothing changes) and when that state is fully replenished (its TTL), or nil when
  -- it does not apply.
  try_fast = function(p, v, now, cost, shadow)
    if p.scale ~= 1 then return nil end
    local tat = now
    if v then
      tat = tonumber(v) -- nil for "us frac"
      if not tat then return nil end
      if tat < now then tat = now end
    end
    local new = tat + cost * p.interval
    if new - p.tau <= now then return 1, new, new end
    return shadow and 1 or 0, nil
  end,
  -- A charge on the stored value `v` when the TAT is whole microseconds, as
  -- try_fast (the same change as room/admit below): the value to store and when it
  -- is fully replenished; false when nothing changes; nil when it does not apply.
  charge_fast = function(p, v, now, cost, debt)
    if p.scale ~= 1 then return nil end
    local tat = now
    if v then
      tat = tonumber(v)
      if not tat then return nil end
      if tat < now then tat = now end
    end
    local room = now + p.tau + debt * p.interval - tat
    if room <= 0 then return false end
    local n = math.min(cost, idiv(room, p.interval))
    if n <= 0 then return false end
    local new = tat + n * p.interval
    return new, new
  end,
  check = function(p, s, now, cost, acquire, max_wait)
    if p.scale ~= 1 or s.f ~= 0 then return check_schedule(ALGOS[CODE.GCRA], p, s, now, cost, acquire, max_wait) end
    -- Whole-microsecond intervals (every state's frac is 0): the arithmetic of
    -- earliest/admit below without the fractions.
    local new = s.u
    if new < now then new = now end
    new = new + cost * p.interval
    local wait = new - p.tau - now
    if wait < 0 then wait = 0 end
    if fits(wait, acquire, max_wait) then
      s.u = new
      return true, wait
    end
    return false, wait
  end,
  earliest = function(p, s, now, cost)
    local u, f = gcra_next(p, s, now, cost)
    u, f = ticks_norm(u, f - p.tau, p.scale)
    if f > 0 then u = u + 1 end
    return u
  end,
  admit = function(p, s, now, at, cost)
    s.u, s.f = gcra_next(p, s, now, cost)
  end,
  refund = function(p, s, now, cost)
    if s.u > now or (s.u == now and s.f > 0) then
      local u, f = ticks_norm(s.u, s.f - cost * p.interval, p.scale)
      if u < now then u, f = now, 0 end
      s.u, s.f = u, f
    end
  end,
  -- Leases (lease.lua): the units that fit now, and the state charged as if `n` were
  -- admitted at the deadline (a slice may be spent any time up to it).
  lease_avail = function(p, s, now)
    local d = p.tau
    if s.u > now or (s.u == now and s.f > 0) then d = (now - s.u) * p.scale - s.f + p.tau end
    if d < 0 then return 0 end
    return idiv(d, p.interval)
  end,
  lease_charge = function(p, s, now, n, deadline)
    local u, f = s.u, s.f
    if u < deadline then u, f = deadline, 0 end
    s.u, s.f = ticks_norm(u, f + n * p.interval, p.scale)
  end,
  lease_return = function(p, s, now, units) ALGOS[CODE.GCRA].refund(p, s, now, units) end,
  -- Charges (check.lua): the TAT may reach now + tau + debt*T.
  room = function(p, s, now, debt)
    local bu, bf = s.u, s.f
    if bu < now then bu, bf = now, 0 end
    local ahead = (now - bu) * p.scale - bf + p.tau + debt * p.interval
    if ahead <= 0 then return 0 end
    return idiv(ahead, p.interval)
  end,
  reset_after = function(p, s, now)
    local u = s.u
    if s.f > 0 then u = u + 1 end
    return math.max(u - now, 0)
  end,
}
