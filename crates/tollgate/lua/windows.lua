-- The window counters: fixed-window (4), sliding-log (5), sliding-window with K
-- buckets (6) and the weighted sliding window (7).

-- The end of the period of length `width` (clock-aligned) that holds `now`: a leased
-- slice never outlives the window or bucket it was charged to.
local function period_end(now, width) return (idiv(now, width) + 1) * width end

-- fixed-window. Params: limit, window, align (0 clock, 1 first), debt (1 carry, 0
-- forgive). State: "start count": `count` admitted in the window starting at `start`
-- (us). A count past the limit (a charge's debt) carries into the windows after its
-- own, `limit` paid back per window, unless the debt is forgiven.

-- (start, count) as they stand at `now`: an ended window in debt hands the debt on.
local function fw_at(p, start, count, now)
  if not p.carry or count <= p.limit or now < start + p.window then return start, count end
  local passed = idiv(now - start, p.window)
  local left = count - passed * p.limit
  if left <= 0 then return 0, 0 end
  return start + passed * p.window, left
end

-- Whether (start, count), as they stand at `now`, hold a current or future window.
local function fw_live(p, start, count, now) return count > 0 and now < start + p.window end

-- The end of the first window from `start` on whose count is at most `left` (the
-- next one, or later while a debt is paid back).
local function fw_until(p, start, count, left)
  local k = 1
  if p.carry then k = math.max(cdiv(count - left, p.limit), 1) end
  return start + k * p.window
end

-- The stored value `v` (nil: no state) as start, count at `now`; nil when it is not
-- "start count".
local function fw_parse(p, v, now)
  if not v then return 0, 0 end
  local sp = string.find(v, ' ', 1, true)
  if not sp then return nil end
  return fw_at(p, tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1)), now)
end

-- The start of a window opened at `now`.
local function fw_open(p, now)
  if p.first then return now end
  return now - (now - idiv(now, p.window) * p.window)
end

ALGOS[CODE.FIXED_WINDOW] = {
  params = function(a) return { limit = a[1], window = a[2], first = a[3] == 1, carry = a[4] == 1 } end,
  load = function(p, key)
    local v = load_fields(key)
    if not v then return { start = 0, count = 0 } end
    return { start = v[1], count = v[2] }
  end,
  encode = function(p, s) return int(s.start) .. ' ' .. int(s.count) end,
  earliest = function(p, s, now, cost)
    local start, count = fw_at(p, s.start, s.count, now)
    if not fw_live(p, start, count, now) then return now end
    if count + cost <= p.limit then return math.max(now, start) end
    return fw_until(p, start, count, p.limit - cost)
  end,
  admit = function(p, s, now, at, cost)
    local start, count = fw_at(p, s.start, s.count, at)
    if fw_live(p, start, count, at) and at >= start then
      s.start, s.count = start, count + cost
    else
      s.start, s.count = fw_open(p, at), cost
    end
  end,
  refund = function(p, s, now, cost)
    local start, count = fw_at(p, s.start, s.count, now)
    if fw_live(p, start, count, now) then s.start, s.count = start, count - math.min(cost, count) end
  end,
  -- A try on the stored value `v` (nil: no state) with no tables, as gcra's try_fast
  -- (the same decision as earliest/admit above); nil for a window reserved ahead.
  try_fast = function(p, v, now, cost, shadow)
    local start, count = fw_parse(p, v, now)
    if not start then return nil end
    if count > 0 and now < start + p.window then
      if now < start then return nil end
    else
      start, count = fw_open(p, now), 0
    end
    if count + cost <= p.limit then
      return 1, int(start) .. ' ' .. int(count + cost), fw_until(p, start, count + cost, 0)
    end
    return shadow and 1 or 0, nil
  end,
  -- A charge on the stored value `v`, as try_fast (the same change as room/charge_at
  -- /admit below, a reserved window included): false when nothing changes.
  charge_fast = function(p, v, now, cost, debt)
    local start, count = fw_parse(p, v, now)
    if not start then return nil end
    if not fw_live(p, start, count, now) then start, count = fw_open(p, now), 0 end
    local n = math.min(cost, p.limit + debt - count)
    if n <= 0 then return false end
    return int(start) .. ' ' .. int(count + n), fw_until(p, start, count + n, 0)
  end,
  -- Leases (lease.lua): a slice is taken from the window that holds `now` and never
  -- outlives it; one reserved into a later window (acquire) leaves nothing to lease.
  lease_avail = function(p, s, now)
    local start, count = fw_at(p, s.start, s.count, now)
    if not fw_live(p, start, count, now) then return p.limit end
    if now < start then return 0 end
    return math.max(p.limit - count, 0)
  end,
  lease_deadline = function(p, s, now, deadline)
    local start, count = fw_at(p, s.start, s.count, now)
    if not fw_live(p, start, count, now) then start = fw_open(p, now) end
    return math.min(deadline, start + p.window)
  end,
  lease_charge = function(p, s, now, n, deadline) ALGOS[CODE.FIXED_WINDOW].admit(p, s, now, now, n) end,
  -- Only into the window the slice was charged to (`charged`: that state).
  lease_return = function(p, s, now, units, charged)
    local c = fields(charged)
    if c[1] == s.start then ALGOS[CODE.FIXED_WINDOW].refund(p, s, now, units) end
  end,
  -- Charges (check.lua): the count may pass the limit by `debt`; a charge before a
  -- reserved window goes into it.
  room = function(p, s, at, debt)
    local start, count = fw_at(p, s.start, s.count, at)
    if fw_live(p, start, count, at) then return math.max(p.limit + debt - count, 0) end
    return p.limit + debt
  end,
  charge_at = function(p, s, now)
    local start, count = fw_at(p, s.start, s.count, now)
    if fw_live(p, start, count, now) then return math.max(now, start) end
    return now
  end,
  reset_after = function(p, s, now)
    local start, count = fw_at(p, s.start, s.count, now)
    if fw_live(p, start, count, now) then return fw_until(p, start, count, 0) - now end
    return 0
  end,
}

-- sliding-log. Params: limit, window.
-- State: a sorted set, one member per admission: score = its time (us), member =
-- "time:nonce:cost" (the per-call nonce makes every member unique). An entry counts
-- at `at` while time + window > at.
ALGOS[CODE.SLIDING_LOG] = {
  nonce = true,
  params = function(a) return { limit = a[1], window = a[2] } end,
  load = function(p, key)
    local s = { entries = {}, added = {}, removed = {}, key = key }
    local raw = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    for i = 1, #raw, 2 do
      local member = raw[i]
      local ts, cost = string.match(member, '^(%d+):[^:]*:(%d+)$')
      s.entries[#s.entries + 1] = { tonumber(ts), tonumber(cost), member }
    end
    return s
  end,
  encode = function(p, s)
    local out = {}
    for i, e in ipairs(s.entries) do out[i] = int(e[1]) .. ' ' .. int(e[2]) end
    return table.concat(out, ' ')
  end,
  save = function(p, key, s, ttl_ms)
    for _, m in ipairs(s.removed) do redis.call('ZREM', key, m) end
    for _, e in ipairs(s.added) do redis.call('ZADD', key, e[1], e[3]) end
    if #s.entries > 0 then redis.call('PEXPIRE', key, ttl_ms) else redis.call('DEL', key) end
  end,
  -- Drops the entries that no longer count at `now`.
  expire = function(p, s, now)
    local drop = 0
    while drop < #s.entries and s.entries[drop + 1][1] + p.window <= now do drop = drop + 1 end
    if drop == 0 then return end
    for i = 1, drop do s.removed[#s.removed + 1] = s.entries[i][3] end
    local kept = {}
    for i = drop + 1, #s.entries do kept[#kept + 1] = s.entries[i] end
    s.entries = kept
  end,
  earliest = function(p, s, now, cost)
    -- Never ahead of an earlier admission (a reservation may lie in the future).
    local at = now
    local n = #s.entries
    if n > 0 and s.entries[n][1] > at then at = s.entries[n][1] end
    local sum = 0
    for _, e in ipairs(s.entries) do
      if e[1] + p.window > at then sum = sum + e[2] end
    end
    if sum + cost <= p.limit then return at end
    local must_leave = sum + cost - p.limit
    local left = 0
    for _, e in ipairs(s.entries) do
      if e[1] + p.window > at then
        left = left + e[2]
        if left >= must_leave then return e[1] + p.window end
      end
    end
    return at
  end,
  admit = function(p, s, now, at, cost)
    local e = { at, cost, int(at) .. ':' .. s.nonce .. ':' .. int(cost) }
    s.entries[#s.entries + 1] = e
    s.added[#s.added + 1] = e
  end,
  -- Takes back from the newest entries that still count.
  refund = function(p, s, now, cost)
    while cost > 0 and #s.entries > 0 do
      local e = s.entries[#s.entries]
      if e[1] + p.window <= now then break end
      local take = math.min(cost, e[2])
      cost = cost - take
      s.removed[#s.removed + 1] = e[3]
      s.entries[#s.entries] = nil
      if e[2] > take then
        local rest = { e[1], e[2] - take, int(e[1]) .. ':' .. s.nonce .. 'r:' .. int(e[2] - take) }
        s.entries[#s.entries + 1] = rest
        s.added[#s.added + 1] = rest
        break
      end
    end
  end,
  -- Charges: the window may hold `debt` past the limit; entries stay in time order.
  room = function(p, s, at, debt)
    local sum = 0
    for _, e in ipairs(s.entries) do
      if e[1] + p.window > at then sum = sum + e[2] end
    end
    return math.max(p.limit + debt - sum, 0)
  end,
  charge_at = function(p, s, now)
    local n = #s.entries
    if n > 0 and s.entries[n][1] > now then return s.entries[n][1] end
    return now
  end,
  reset_after = function(p, s, now)
    local n = #s.entries
    if n == 0 then return 0 end
    return math.max(s.entries[n][1] + p.window - now, 0)
  end,
}

-- sliding-window with K buckets. Params: limit, window, buckets (K), width (window/K).
-- State: "newest total c_0 ... c_(K-1)": counts[b % K] holds bucket b for b in
-- (newest - K, newest]; missing until the first admission.
local function sw_slot(p, b) return b - idiv(b, p.buckets) * p.buckets + 1 end

-- The sum over the window ending with bucket `end_b` (>= newest).
local function sw_sum(p, s, end_b)
  if not s.counts or end_b >= s.newest + p.buckets then return 0 end
  local first_kept = math.max(end_b + 1 - p.buckets, 0)
  local first_held = math.max(s.newest + 1 - p.buckets, 0)
  local gone = 0
  for b = first_held, first_kept - 1 do gone = gone + s.counts[sw_slot(p, b)] end
  return s.total - gone
end

ALGOS[CODE.SLIDING_WINDOW] = {
  params = function(a) return { limit = a[1], window = a[2], buckets = a[3], width = a[4] } end,
  load = function(p, key)
    local v = load_fields(key)
    if not v then return { newest = 0, total = 0 } end
    local counts = {}
    for i = 1, p.buckets do counts[i] = v[i + 2] or 0 end
    return { newest = v[1], total = v[2], counts = counts }
  end,
  encode = function(p, s)
    if not s.counts then return '' end
    local out = { int(s.newest), int(s.total) }
    for i = 1, p.buckets do out[i + 2] = int(s.counts[i]) end
    return table.concat(out, ' ')
  end,
  earliest = function(p, s, now, cost)
    local at = now
    local end_b = idiv(now, p.width)
    if s.counts and s.newest > end_b then
      end_b = s.newest
      at = end_b * p.width
    end
    local sum = sw_sum(p, s, end_b)
    if sum + cost <= p.limit then return at end
    local must_leave = sum + cost - p.limit
    local left = 0
    local first = math.max(end_b + 1 - p.buckets, s.newest + 1 - p.buckets, 0)
    for b = first, math.min(end_b, s.newest) do
      left = left + s.counts[sw_slot(p, b)]
      if left >= must_leave then return (b + p.buckets) * p.width end
    end
    return at
  end,
  admit = function(p, s, now, at, cost)
    local b = idiv(at, p.width)
    if not s.counts then
      s.counts = {}
      for i = 1, p.buckets do s.counts[i] = 0 end
      s.newest = b
    end
    if b > s.newest then
      local stale = math.min(b - s.newest, p.buckets)
      for k = 0, stale - 1 do
        local slot = sw_slot(p, b - k)
        s.total = s.total - s.counts[slot]
        s.counts[slot] = 0
      end
      s.newest = b
    end
    local slot = sw_slot(p, b)
    s.counts[slot] = s.counts[slot] + cost
    s.total = s.total + cost
  end,
  refund = function(p, s, now, cost)
    if not s.counts then return end
    local oldest = math.max(idiv(now, p.width) + 1 - p.buckets, 0)
    local b = s.newest
    while cost > 0 and b >= oldest and b + p.buckets > s.newest do
      local slot = sw_slot(p, b)
      local take = math.min(cost, s.counts[slot])
      s.counts[slot] = s.counts[slot] - take
      s.total = s.total - take
      cost = cost - take
      if b == 0 then break end
      b = b - 1
    end
  end,
  -- Leases (lease.lua): a slice is charged to the bucket that holds `now` and never
  -- outlives it, so its admissions count in the very bucket they fall in; a bucket
  -- reserved ahead (acquire) leaves nothing to lease.
  lease_avail = function(p, s, now)
    local b = idiv(now, p.width)
    if s.counts and s.newest > b then return 0 end
    return math.max(p.limit - sw_sum(p, s, b), 0)
  end,
  lease_deadline = function(p, s, now, deadline)
    return math.min(deadline, period_end(now, p.width))
  end,
  lease_charge = function(p, s, now, n, deadline) ALGOS[CODE.SLIDING_WINDOW].admit(p, s, now, now, n) end,
  lease_return = function(p, s, now, units)
    if s.counts and s.newest == idiv(now, p.width) then ALGOS[CODE.SLIDING_WINDOW].refund(p, s, now, units) end
  end,
  -- Charges: the window may hold `debt` past the limit; never before the newest bucket.
  room = function(p, s, at, debt)
    return math.max(p.limit + debt - sw_sum(p, s, idiv(at, p.width)), 0)
  end,
  charge_at = function(p, s, now)
    if s.counts and s.newest > idiv(now, p.width) then return s.newest * p.width end
    return now
  end,
  reset_after = function(p, s, now)
    if not s.counts then return 0 end
    local end_b = math.max(idiv(now, p.width), s.newest)
    local first = math.max(end_b + 1 - p.buckets, s.newest + 1 - p.buckets, 0)
    for b = math.min(end_b, s.newest), first, -1 do
      if s.counts[sw_slot(p, b)] > 0 then return math.max((b + p.buckets) * p.width - now, 0) end
    end
    return 0
  end,
}

-- sliding-window, weighted. Params: limit, window.
-- State: "win prev curr": counts of window `win` (index time/window) and the one before.
local function wt_counts(s, w)
  if w == s.win then return s.prev, s.curr end
  if w == s.win + 1 then return s.curr, 0 end
  return 0, 0
end

-- limit*window - prev*(window - elapsed) - curr*window.
local function wt_headroom(p, s, at)
  local w = idiv(at, p.window)
  local prev, curr = wt_counts(s, w)
  local elapsed = at - w * p.window
  return p.limit * p.window - prev * (p.window - elapsed) - curr * p.window
end

ALGOS[CODE.SLIDING_WINDOW_WEIGHTED] = {
  params = function(a) return { limit = a[1], window = a[2] } end,
  load = function(p, key)
    local v = load_fields(key)
    if not v then return { win = 0, prev = 0, curr = 0 } end
    return { win = v[1], prev = v[2], curr = v[3] }
  end,
  encode = function(p, s) return int(s.win) .. ' ' .. int(s.prev) .. ' ' .. int(s.curr) end,
  earliest = function(p, s, now, cost)
    local at = math.max(now, s.win * p.window)
    while true do
      if wt_headroom(p, s, at) >= cost * p.window then return at end
      local w = idiv(at, p.window)
      local prev, curr = wt_counts(s, w)
      local room = p.limit - curr - cost
      if room >= 0 and prev > 0 then
        local elapsed = p.window - idiv(room * p.window, prev)
        if elapsed < p.window then return w * p.window + elapsed end
      end
      at = (w + 1) * p.window
    end
  end,
  admit = function(p, s, now, at, cost)
    local w = idiv(at, p.window)
    local prev, curr = wt_counts(s, w)
    s.win, s.prev, s.curr = w, prev, curr + cost
  end,
  refund = function(p, s, now, cost)
    if idiv(now, p.window) <= s.win + 1 then s.curr = s.curr - math.min(cost, s.curr) end
  end,
  -- Leases: as the bucketed window, with the window as the bucket.
  lease_avail = function(p, s, now)
    if s.win > idiv(now, p.window) then return 0 end
    local room = wt_headroom(p, s, now)
    if room <= 0 then return 0 end
    return idiv(room, p.window)
  end,
  lease_deadline = function(p, s, now, deadline)
    return math.min(deadline, period_end(now, p.window))
  end,
  lease_charge = function(p, s, now, n, deadline) ALGOS[CODE.SLIDING_WINDOW_WEIGHTED].admit(p, s, now, now, n) end,
  lease_return = function(p, s, now, units)
    if s.win == idiv(now, p.window) then s.curr = s.curr - math.min(units, s.curr) end
  end,
  -- Charges: the estimate may pass the limit by `debt`.
  room = function(p, s, at, debt)
    return math.max(debt + idiv(wt_headroom(p, s, at), p.window), 0)
  end,
  charge_at = function(p, s, now) return math.max(now, s.win * p.window) end,
  reset_after = function(p, s, now)
    local til
    if s.curr > 0 then til = s.win + 2 elseif s.prev > 0 then til = s.win + 1 else return 0 end
    return math.max(til * p.window - now, 0)
  end,
}
