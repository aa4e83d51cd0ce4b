-- limit-req (code 10): nginx limit_req. Params: rate_milli, burst_milli, delay_milli
-- (-1: nodelay). State: "last_ms excess" (milli-requests); a new key is
-- "created_ms -1000".
local FRESH = -1000

-- Excess at `ms` (>= last) before adding a request, clamped at -1000. The drain is
-- compared before it is multiplied, so a long idle time never leaves double range.
local function lr_drained(p, s, ms)
  local elapsed = math.max(ms - s.last, 0)
  local need = s.excess - FRESH
  if need <= 0 or elapsed >= cdiv(1000 * need, p.rate_milli) then return FRESH end
  return math.max(s.excess - idiv(p.rate_milli * elapsed, 1000), FRESH)
end

-- The first ms (>= last) at which the drained excess is <= target.
local function lr_when_drained_to(p, s, target)
  local over = s.excess - target
  if over <= 0 then return s.last end
  return s.last + cdiv(1000 * over, p.rate_milli)
end

ALGOS[CODE.LIMIT_REQ] = {
  params = function(a) return { rate_milli = a[1], burst_milli = a[2], delay_milli = a[3] } end,
  load = function(p, key, created)
    local v = load_fields(key)
    if not v then return { last = idiv(created, 1000), excess = FRESH } end
    return { last = v[1], excess = v[2] }
  end,
  encode = function(p, s) return int(s.last) .. ' ' .. int(s.excess) end,
  check = function(p, s, now, cost, acquire, max_wait)
    local add = cost * 1000
    local now_ms = idiv(now, 1000)
    -- Never ahead of an earlier admission (acquire may have reserved a later ms).
    local ms = math.max(now_ms, s.last)
    if lr_drained(p, s, ms) + add > p.burst_milli then
      ms = lr_when_drained_to(p, s, p.burst_milli - add)
    end
    local at = now
    if ms ~= now_ms then at = ms * 1000 end
    local excess = lr_drained(p, s, ms) + add
    local delay = 0
    if p.delay_milli >= 0 and excess > p.delay_milli then
      delay = idiv((excess - p.delay_milli) * 1000, p.rate_milli) * 1000
    end
    local to_admit = at - now
    local admitted
    if acquire then admitted = fits(to_admit + delay, true, max_wait) else admitted = to_admit == 0 end
    if admitted then
      s.last, s.excess = ms, excess
      return true, to_admit + delay
    end
    return false, math.max(to_admit, 1)
  end,
  refund = function(p, s, now, cost)
    local ms = math.max(idiv(now, 1000), s.last)
    s.excess = math.max(lr_drained(p, s, ms) - cost * 1000, FRESH)
    s.last = ms
  end,
  -- Charges (check.lua): excess += cost*1000 after the leak, up to `debt` requests
  -- past the burst, with no burst test.
  charge = function(p, s, now, cost, debt)
    local ms = math.max(idiv(now, 1000), s.last)
    local excess = lr_drained(p, s, ms)
    local room = p.burst_milli + debt * 1000 - excess
    if room <= 0 then return end
    local n = math.min(cost, idiv(room, 1000))
    if n > 0 then s.last, s.excess = ms, excess + n * 1000 end
  end,
  reset_after = function(p, s, now)
    return math.max(lr_when_drained_to(p, s, FRESH) * 1000 - now, 0)
  end,
}
