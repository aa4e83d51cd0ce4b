-- token-bucket (code 2) and leaky-bucket (code 3). Params: per_unit (scaled units per
-- token or unit), per_us (scaled units per microsecond), cap (capacity in scaled units).
-- State: "level last": the level in scaled units at `last` (us). Fractions of a
-- token are kept as scaled units, never truncated away.

local function bucket_params(a) return { per_unit = a[1], per_us = a[2], cap = a[3] } end

local function bucket_encode(p, s) return int(s.level) .. ' ' .. int(s.last) end

-- ceil(a / b) us, or 0 for a <= 0.
local function ceil_us(a, b)
  if a <= 0 then return 0 end
  return cdiv(a, b)
end

-- Token bucket: tokens at `at`.
local function tokens_at(p, s, at)
  if at >= s.last then
    -- Full once the missing units have refilled (checked first, so that a long idle
    -- time times the rate never has to fit a double).
    local missing = p.cap - s.level
    if missing <= 0 or at - s.last >= cdiv(missing, p.per_us) then return p.cap end
    return s.level + (at - s.last) * p.per_us
  end
  return s.level - (s.last - at) * p.per_us
end

ALGOS[CODE.TOKEN_BUCKET] = {
  params = bucket_params,
  load = function(p, key)
    local v = load_fields(key)
    if not v then return { level = p.cap, last = 0 } end
    return { level = v[1], last = v[2] }
  end,
  encode = bucket_encode,
  earliest = function(p, s, now, cost)
    return now + ceil_us(cost * p.per_unit - tokens_at(p, s, now), p.per_us)
  end,
  -- A reservation's refill from arrival to admission is never capped (see Rust).
  admit = function(p, s, now, at, cost)
    s.level = tokens_at(p, s, now) + (at - now) * p.per_us - cost * p.per_unit
    s.last = at
  end,
  refund = function(p, s, now, cost)
    s.level = math.min(tokens_at(p, s, now) + cost * p.per_unit, p.cap)
    s.last = now
  end,
  -- Leases (lease.lua): the tokens there now; charged as if `n` were taken at the
  -- deadline (the refill until then capped at the capacity, as time would).
  lease_avail = function(p, s, now)
    local t = tokens_at(p, s, now)
    if t <= 0 then return 0 end
    return idiv(t, p.per_unit)
  end,
  lease_charge = function(p, s, now, n, deadline)
    s.level = tokens_at(p, s, deadline) - n * p.per_unit
    s.last = deadline
  end,
  lease_return = function(p, s, now, units) ALGOS[CODE.TOKEN_BUCKET].refund(p, s, now, units) end,
  -- Charges (check.lua): tokens may go `debt` below zero.
  room = function(p, s, at, debt)
    local r = tokens_at(p, s, at) + debt * p.per_unit
    if r <= 0 then return 0 end
    return idiv(r, p.per_unit)
  end,
  reset_after = function(p, s, now) return ceil_us(p.cap - tokens_at(p, s, now), p.per_us) end,
}

-- Leaky bucket (meter): level at `at`.
local function level_at(p, s, at)
  if at >= s.last then
    local dt = at - s.last
    if dt >= cdiv(s.level, p.per_us) then return 0 end
    return math.max(s.level - dt * p.per_us, 0)
  end
  return s.level + (s.last - at) * p.per_us
end

ALGOS[CODE.LEAKY_BUCKET] = {
  params = bucket_params,
  load = function(p, key)
    local v = load_fields(key)
    if not v then return { level = 0, last = 0 } end
    return { level = v[1], last = v[2] }
  end,
  encode = bucket_encode,
  earliest = function(p, s, now, cost)
    return now + ceil_us(level_at(p, s, now) + cost * p.per_unit - p.cap, p.per_us)
  end,
  admit = function(p, s, now, at, cost)
    s.level = level_at(p, s, now) - (at - now) * p.per_us + cost * p.per_unit
    s.last = at
  end,
  refund = function(p, s, now, cost)
    s.level = math.max(level_at(p, s, now) - cost * p.per_unit, 0)
    s.last = now
  end,
  -- Leases: the room there now; charged as if `n` were added at the deadline.
  lease_avail = function(p, s, now)
    local room = p.cap - level_at(p, s, now)
    if room <= 0 then return 0 end
    return idiv(room, p.per_unit)
  end,
  lease_charge = function(p, s, now, n, deadline)
    s.level = level_at(p, s, deadline) + n * p.per_unit
    s.last = deadline
  end,
  lease_return = function(p, s, now, units) ALGOS[CODE.LEAKY_BUCKET].refund(p, s, now, units) end,
  -- Charges: the level may pass the capacity by `debt`.
  room = function(p, s, at, debt)
    local r = p.cap + debt * p.per_unit - level_at(p, s, at)
    if r <= 0 then return 0 end
    return idiv(r, p.per_unit)
  end,
  reset_after = function(p, s, now) return ceil_us(level_at(p, s, now), p.per_us) end,
}
