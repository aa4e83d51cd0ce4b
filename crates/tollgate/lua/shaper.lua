-- shaper (code 11): the leaky bucket as a queue. Params: scale, interval (1/scale us
-- ticks), queue. State: "last_us last_frac r_1 ... r_n": when the last admitted
-- request is released (ticks, as gcra's TAT) and the release times (us) of the
-- admitted requests still waiting, earliest first; missing before the first request.
-- The schedule is shared by every client of the key: each admitted request learns its
-- release time (`wait`) and holds itself until then.

local function sh_schedule(p, s, now, cost)
  if not s.u then return now, 0 end
  local u, f = ticks_norm(s.u, s.f + cost * p.interval, p.scale)
  if u < now then return now, 0 end
  return u, f
end

local function sh_release(u, f)
  if f > 0 then return u + 1 end
  return u
end

ALGOS[CODE.SHAPER] = {
  params = function(a) return { scale = a[1], interval = a[2], queue = a[3] } end,
  load = function(p, key)
    local v = load_fields(key)
    local s = { pending = {} }
    if not v then return s end
    s.u, s.f = v[1], v[2]
    for i = 3, #v do s.pending[#s.pending + 1] = v[i] end
    return s
  end,
  encode = function(p, s)
    if not s.u then return '' end
    local out = { int(s.u), int(s.f) }
    for _, r in ipairs(s.pending) do out[#out + 1] = int(r) end
    return table.concat(out, ' ')
  end,
  check = function(p, s, now, cost, acquire, max_wait)
    local kept = {}
    for _, r in ipairs(s.pending) do if r > now then kept[#kept + 1] = r end end
    s.pending = kept
    local u, f = sh_schedule(p, s, now, cost)
    local release = sh_release(u, f)
    local wait = math.max(release - now, 0)
    local queued = #s.pending
    if not acquire and wait > 0 and queued >= p.queue then
      -- A place frees when enough earlier requests have been released, or the
      -- request needs none once its own release time has come.
      local r = s.pending[queued - p.queue + 1]
      if r then return false, math.min(r - now, wait) end
      return false, wait
    end
    if acquire and not fits(wait, true, max_wait) then return false, wait - (max_wait or wait) end
    s.u, s.f = u, f
    if wait > 0 then s.pending[#s.pending + 1] = release end
    return true, wait
  end,
  refund = function(p, s, now, cost) end,
  reset_after = function(p, s, now)
    if not s.u then return 0 end
    local u, f = ticks_norm(s.u, s.f + p.interval, p.scale)
    local until_us = sh_release(u, f)
    local n = #s.pending
    if n > 0 then until_us = math.max(until_us, s.pending[n]) end
    return math.max(until_us - now, 0)
  end,
}
