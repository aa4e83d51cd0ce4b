-- smooth-bursty (code 8) and smooth-warmup (code 9): Guava's SmoothRateLimiter.
-- Params: stable_interval, max_permits, threshold, slope, cool_down (doubles, as
-- Guava computes them; the Rust side sends them exactly). State: "stored next_free":
-- stored permits (a double) and the next free ticket (us). Guava's double arithmetic
-- is repeated operation for operation: Lua's numbers are the same IEEE doubles.

local function sm_resync(p, s, now)
  if now > s.next_free then
    s.stored = math.min(p.max_permits, s.stored + (now - s.next_free) / p.cool_down)
    s.next_free = now
  end
end

local function sm_permits_to_time(p, permits) return p.stable_interval + permits * p.slope end

local function sm_wait_for_stored(p, stored, to_take)
  if not p.warmup then return 0 end
  local above = stored - p.threshold
  local micros = 0
  if above > 0 then
    local take_above = math.min(above, to_take)
    local length = sm_permits_to_time(p, above) + sm_permits_to_time(p, above - take_above)
    micros = trunc(take_above * length / 2.0)
    to_take = to_take - take_above
  end
  return micros + trunc(p.stable_interval * to_take)
end

-- Guava's reserveEarliestAvailable: returns the moment the reservation is free.
local function sm_reserve(p, s, permits, now)
  sm_resync(p, s, now)
  local moment = s.next_free
  local spend = math.min(permits, s.stored)
  local fresh = permits - spend
  local wait = sm_wait_for_stored(p, s.stored, spend) + trunc(fresh * p.stable_interval)
  s.next_free = s.next_free + math.max(wait, 0)
  s.stored = s.stored - spend
  return moment
end

local function smooth(warmup)
  return {
    params = function(a)
      return { stable_interval = a[1], max_permits = a[2], threshold = a[3], slope = a[4],
               cool_down = a[5], warmup = warmup }
    end,
    load = function(p, key, created)
      local v = redis.call('GET', key)
      if not v then
        local stored = 0
        if warmup then stored = p.max_permits end
        return { stored = stored, next_free = created }
      end
      local stored, next_free = string.match(v, '^(%S+) (%S+)$')
      return { stored = tonumber(stored), next_free = tonumber(next_free) }
    end,
    encode = function(p, s) return dbl(s.stored) .. ' ' .. int(s.next_free) end,
    -- tryAcquire(permits, timeout): admitted iff next_free - timeout <= now.
    check = function(p, s, now, cost, acquire, max_wait)
      local timeout = 0
      if acquire then timeout = max_wait end
      if timeout ~= nil and math.max(s.next_free - timeout, 0) > now then
        return false, s.next_free - timeout - now
      end
      local moment = sm_reserve(p, s, cost, now)
      return true, math.max(moment - now, 0)
    end,
    refund = function(p, s, now, cost)
      sm_resync(p, s, now)
      local price = cost * p.stable_interval
      local debt = math.max(s.next_free - now, 0)
      if debt > 0 then
        local back = math.min(floor(price), debt)
        s.next_free = s.next_free - back
        local left = math.max(price - back, 0) / p.stable_interval
        s.stored = math.min(p.max_permits, s.stored + left)
      else
        s.stored = math.min(p.max_permits, s.stored + cost)
      end
    end,
    -- Charges (check.lua): Guava's reserve without the wait, nextFree capped at
    -- now + debt/rate (at most 2^40 us).
    charge = function(p, s, now, cost, debt)
      if cost == 0 then return end
      local debt_us = floor(math.min(debt * p.stable_interval, 1099511627776))
      local cap = math.max(now, s.next_free, now + debt_us)
      sm_reserve(p, s, cost, now)
      if s.next_free > cap then s.next_free = cap end
    end,
    reset_after = function(p, s, now)
      local c = { stored = s.stored, next_free = s.next_free }
      local start = math.max(c.next_free, now)
      sm_resync(p, c, start)
      local refill = math.ceil(math.max(p.max_permits - c.stored, 0) * p.cool_down)
      return start - now + refill
    end,
  }
end

ALGOS[CODE.SMOOTH_BURSTY] = smooth(false)
ALGOS[CODE.SMOOTH_WARMUP] = smooth(true)
