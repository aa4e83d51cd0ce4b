-- tollgate's concurrency limiter in Redis: a semaphore whose permits are leases. A
-- holder renews its lease while the work runs; a holder that dies stops renewing, and
-- its permits come back when the lease expires. Waiters queue first come, first served
-- and must poll to stay in the queue. One atomic call per operation.
--
-- KEYS[1]  leases: ZSET lease id -> expiry (us since the Unix epoch)
-- KEYS[2]  book: HASH 'n' -> permits held; 'l:<id>' -> permits of lease <id>;
--          'w:<id>' -> the instant (us) waiter <id> leaves the queue unless it polls
--          again; 'seq' -> the last ticket handed to a waiter
-- KEYS[3]  queue: ZSET waiter id -> ticket (arrival order)
--          The three keys share a hash tag (one Redis Cluster slot).
-- ARGV[1]  op: 'acquire' | 'renew' | 'release' | 'peek'
-- ARGV[2]  id: the lease (and waiter) id, unique to one acquisition
-- ARGV[3]  cost: permits asked (1..limit, checked by the caller)
-- ARGV[4]  limit
-- ARGV[5]  lease length (us): how long permits outlive their holder's last renewal
-- ARGV[6]  '1' to join (or stay in) the queue when the permits are not free now,
--          '0' to fail at once (try)
-- ARGV[7]  how long (us) a waiter stays queued after its last poll
-- ARGV[8]  margin (ms) added to the keys' time to live
--
-- Returns {status, held, queued}: status 1 = granted / renewed / released, 0 = not
-- (busy, queued, or the lease was already gone); held = permits held after the call;
-- queued = waiters in the queue after the call. 'release' also leaves the queue, so a
-- waiter that gives up calls it too (and gets back a lease granted while it gave up).

local leases, book, queue = KEYS[1], KEYS[2], KEYS[3]
local op, id = ARGV[1], ARGV[2]
local cost, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local lease_us, wait = tonumber(ARGV[5]), ARGV[6] == '1'
local waiter_us, margin_ms = tonumber(ARGV[7]), tonumber(ARGV[8])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function held()
  return tonumber(redis.call('HGET', book, 'n') or '0')
end

-- Expired leases give their permits back; waiters that stopped polling leave the
-- head of the queue (only the head holds anyone back; the rest leave when they
-- reach it).
local function expire()
  local dead = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  if #dead > 0 then
    local n = held()
    for _, d in ipairs(dead) do
      n = n - tonumber(redis.call('HGET', book, 'l:' .. d) or '0')
      redis.call('HDEL', book, 'l:' .. d)
    end
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
    redis.call('HSET', book, 'n', n)
  end
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then break end
    local deadline = tonumber(redis.call('HGET', book, 'w:' .. head) or '0')
    if deadline > now then break end
    redis.call('ZREM', queue, head)
    redis.call('HDEL', book, 'w:' .. head)
  end
end

-- Every entry expires by now + max(lease, waiter time): the keys live that long plus
-- the margin, or go when nothing is held or queued.
local function finish(status)
  local n, q = held(), redis.call('ZCARD', queue)
  if n == 0 and q == 0 then
    redis.call('DEL', leases, book, queue)
  else
    local ttl = math.floor(math.max(lease_us, waiter_us) / 1000) + 1 + margin_ms
    redis.call('PEXPIRE', leases, ttl)
    redis.call('PEXPIRE', book, ttl)
    if q > 0 then redis.call('PEXPIRE', queue, ttl) else redis.call('DEL', queue) end
  end
  return { status, n, q }
end

local function leave_queue()
  if redis.call('ZREM', queue, id) == 1 then redis.call('HDEL', book, 'w:' .. id) end
end

expire()

if op == 'peek' then
  return { 1, held(), redis.call('ZCARD', queue) }
end

if op == 'renew' then
  if not redis.call('ZSCORE', leases, id) then return finish(0) end
  redis.call('ZADD', leases, 'XX', now + lease_us, id)
  return finish(1)
end

if op == 'release' then
  leave_queue()
  local c = redis.call('HGET', book, 'l:' .. id)
  if not c then return finish(0) end
  redis.call('ZREM', leases, id)
  redis.call('HDEL', book, 'l:' .. id)
  redis.call('HSET', book, 'n', held() - tonumber(c))
  return finish(1)
end

if op ~= 'acquire' then
  return redis.error_reply('tollgate: unknown concurrency op ' .. op)
end

-- Granted when the permits are free and nobody queued earlier (try never jumps the
-- queue; a waiter asking for many permits holds back smaller ones behind it).
local head = redis.call('ZRANGE', queue, 0, 0)[1]
local n = held()
if (head == nil or head == id) and n + cost <= limit then
  leave_queue()
  redis.call('ZADD', leases, now + lease_us, id)
  redis.call('HSET', book, 'l:' .. id, cost, 'n', n + cost)
  return finish(1)
end
if wait then
  if not redis.call('ZSCORE', queue, id) then
    redis.call('ZADD', queue, redis.call('HINCRBY', book, 'seq', 1), id)
  end
  redis.call('HSET', book, 'w:' .. id, now + waiter_us)
end
return finish(0)
