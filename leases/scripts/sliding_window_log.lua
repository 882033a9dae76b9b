-- sliding_window_log: the Redis twin of slidinglog.go, run after
-- window_leases.lua. Both must do the same operations in the same order;
-- TestStoresAgreeWindows holds them to it.
--
-- H fields: s the sum of the log (the buckets and the open leases), e at
-- least the latest end of an entry (0 when the log is empty), "b|<end µs>"
-- the tokens of the bucket of closed entries ending at end. Z the lease
-- deadlines. X the buckets: member "<end µs>", score end.

local st = load({ 's', 'e' })
local sum = tonumber(st.s) or 0
local maxend = tonumber(st.e) or 0
local q = math.floor(W / 64)
if q < 1000 then q = 1000 end

-- add adds k tokens to the bucket ending at e. In a dry run (state) it
-- is skipped: the sum does not change, and the bucket is after now − W.
local function add(e, k)
  if k == 0 or dry then return end
  local m = fmtd(e)
  redis.call('HINCRBY', H, 'b|' .. m, fmtd(k))
  redis.call('ZADD', X, m, m)
  changed = true
end

-- tidy forgets the latest end of a log that counts nothing.
local function tidy()
  if sum == 0 and n == 0 then maxend = 0 end
end

local A = {}

function A.advance()
  expire(function(g, dl)
    local e = ceil_to(dl, q)
    if e > now - W then add(e, g) else sum = sum - g end
  end)
  local cut = fmtd(now - W)
  local old = redis.call('ZRANGEBYSCORE', X, '-inf', cut)
  if #old > 0 then
    local f = {}
    for i = 1, #old do f[i] = 'b|' .. old[i] end
    local v = call_chunked('HMGET', H, f)
    for i = 1, #old do sum = sum - (tonumber(v[i]) or 0) end
    if not dry then
      call_chunked('HDEL', H, f)
      redis.call('ZREMRANGEBYSCORE', X, '-inf', cut)
      changed = true
    end
  end
  tidy()
end

function A.free()
  local f = limit - sum
  if f < 0 then f = 0 end
  return f
end

function A.level() return fmtf(A.free()) end

function A.spend(k)
  if k == 0 then return end
  local e = ceil_to(now, q)
  add(e, k)
  sum = sum + k
  if e > maxend then maxend = e end
end

function A.grant(g)
  local dl = now + ttl
  sum = sum + g
  local e = ceil_to(dl, q)
  if e > maxend then maxend = e end
  return dl, 0
end

function A.settled(g, used)
  sum = sum - (g - used)
  add(ceil_to(now, q), used)
  tidy()
end

function A.replaced(g, dl)
  add(ceil_to(dl, q), g)
end

-- retry walks the entries in end order (the buckets, then the open leases
-- as if they ended unsettled; buckets first at equal ends), at most
-- RETRY_WALK of them, until the sum left admits need; beyond, maxend
-- bounds the wait.
function A.retry(need)
  if need > limit then return -1 end
  local target = sum - (limit - need)
  if target <= 0 then return 0 end
  local bs = redis.call('ZRANGE', X, 0, RETRY_WALK - 1, 'WITHSCORES')
  local bn = {}
  if #bs > 0 then
    local f = {}
    for i = 1, #bs, 2 do f[#f + 1] = 'b|' .. bs[i] end
    bn = redis.call('HMGET', H, unpack(f))
  end
  local ls = {}
  if n > 0 then ls = redis.call('ZRANGE', Z, 0, RETRY_WALK - 1, 'WITHSCORES') end
  local lf = {}
  for i = 1, #ls, 2 do lf[#lf + 1] = ls[i] end
  load_recs(lf)
  local bi, li = 1, 1
  local nb, nl = #bs / 2, #lf
  local freed = 0
  for _ = 1, RETRY_WALK do
    local e, k
    local le = nil
    if li <= nl then le = ceil_to(tonumber(ls[2 * li]), q) end
    if bi <= nb and (le == nil or tonumber(bs[2 * bi]) <= le) then
      e, k = tonumber(bs[2 * bi]), tonumber(bn[bi]) or 0
      bi = bi + 1
    elseif le ~= nil then
      local _, g = parse(recs[lf[li]])
      e, k = le, g
      li = li + 1
    else
      break
    end
    freed = freed + k
    if freed >= target then
      local w = e + W - now
      if w < 0 then w = 0 end
      return ms(w)
    end
  end
  local w = maxend + W - now
  if w < 0 then w = 0 end
  return ms(w)
end

function A.reset()
  if sum == 0 then return 0 end
  local w = maxend + W - now
  if w < 0 then w = 0 end
  return ms(w)
end

-- A refund gives back from the bucket of the take's time at, where it
-- counted (nothing once that bucket has left the window).
function A.refund(cost, at)
  if at <= 0 then return end
  local m = fmtd(ceil_to(at, q))
  local v = tonumber(redis.call('HGET', H, 'b|' .. m))
  if not v then return end
  local k = cost
  if v < k then k = v end
  sum = sum - k
  if v - k == 0 then
    redis.call('HDEL', H, 'b|' .. m)
    redis.call('ZREM', X, m)
  else
    redis.call('HINCRBY', H, 'b|' .. m, fmtd(-k))
  end
  tidy()
end

function A.finish() tidy() end

-- next is the wait until the oldest entry counted leaves the window: the
-- first bucket in the window, or the first lease (open, or expired and
-- still counted: a dry run leaves it in Z) whose end rounded up to q is in
-- it (ceil_to(e, q) > now − W exactly when e > floor_to(now − W, q)).
function A.next()
  local e = maxend
  local b = redis.call('ZRANGEBYSCORE', X, '(' .. fmtd(now - W), '+inf', 'LIMIT', 0, 1)
  if #b > 0 then e = tonumber(b[1]) end
  local l = redis.call('ZRANGEBYSCORE', Z, '(' .. fmtd(floor_to(now - W, q)), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #l > 0 then
    local le = ceil_to(tonumber(l[2]), q)
    if le < e then e = le end
  end
  local w = e + W - now
  if w < 0 then w = 0 end
  return ms(w)
end

function A.window_end() return 0 end

function A.save()
  if sum == 0 and n == 0 then
    -- The log counts nothing: the same as no state.
    redis.call('DEL', H, X)
    return
  end
  local px = ms(maxend + W - now) + 1000
  save_common({ 's', fmtd(sum), 'e', fmtd(maxend) }, px)
  redis.call('PEXPIRE', X, px)
end

return run(A)
