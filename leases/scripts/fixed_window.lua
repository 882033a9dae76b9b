-- fixed_window and sliding_window_counter (COUNTER, set by the line the
-- Redis store puts before this body): the Redis twin of fixedwindow.go,
-- run after window_leases.lua. Both must do the same operations in the
-- same order; TestStoresAgreeWindows holds them to it.
--
-- H fields: w the window's start (µs), c its count, v the previous
-- window's count (counter only), t the part of c taken directly, x the
-- latest deadline of the leases granted or carried (see save). Z the lease
-- deadlines; X unused.

local st = load({ 'w', 'c', 'v', 't', 'x' })
local start = tonumber(st.w)
local cur = tonumber(st.c) or 0
local prev = tonumber(st.v) or 0
local taken = tonumber(st.t) or 0
local carried = tonumber(st.x) or 0
if not start then start = floor_to(now, W) end

-- roll moves the counts to now's window, carrying the tokens of the leases
-- still open: none under one rule, some after a rule change (see
-- fixedwindow.go); the keys then live until the latest of them ends. A
-- clock that went back stays.
local function roll()
  local s = floor_to(now, W)
  if s <= start then return end
  if COUNTER and s == start + W then prev = cur else prev = 0 end
  cur = out
  taken = 0
  start = s
  if out > 0 then
    -- Carried counts cannot be recomputed once those leases end: the
    -- roll must be saved even by a call that changes nothing else (a
    -- denied take once left it unsaved, and a later roll from the old
    -- window carried nothing).
    changed = true
  end
  if n > 0 then
    local last = redis.call('ZRANGE', Z, -1, -1, 'WITHSCORES')
    local dl = tonumber(last[2]) or 0
    if dl > carried then carried = dl end
  end
end

local function estimate()
  if not COUNTER then return cur end
  local el = now - start
  if el < 0 then el = 0 end
  return prev * (1 - el / W) + cur
end

local A = {}

function A.advance()
  expire(nil)
  roll()
end

function A.free()
  if not COUNTER then
    local f = limit - cur
    if f < 0 then f = 0 end
    return f
  end
  local f = math.floor(limit - estimate() + eps)
  if f <= 0 then return 0 end
  return f
end

function A.level()
  local l = limit - estimate()
  if l < 0 then l = 0 end
  return fmtf(l)
end

function A.spend(k)
  cur = cur + k
  taken = taken + k
end

function A.grant(g)
  cur = cur + g
  local dl = now + ttl
  if start + W < dl then dl = start + W end
  if dl > carried then carried = dl end
  return dl, start
end

function A.settled(g, used, dl, win)
  if win == start then
    cur = cur - (g - used)
    if cur < 0 then cur = 0 end
  end
end

function A.replaced() end

function A.retry(need)
  if need > limit then return -1 end
  local e_ = start + W
  if not COUNTER then return ms(e_ - now) end
  local r = limit - need
  if cur <= r and prev > 0 then
    local e = math.ceil(W * (1 - (r - cur) / prev) - 1e-6)
    if e < W then
      local w = start + e - now
      if w < 0 then w = 0 end
      return ms(w)
    end
  end
  if cur <= r then return ms(e_ - now) end
  local e = math.ceil(W * (1 - r / cur) - 1e-6)
  return ms(e_ + e - now)
end

function A.reset()
  if not COUNTER then return ms(start + W - now) end
  if cur > 0 then return ms(start + 2 * W - now) end
  if prev > 0 then return ms(start + W - now) end
  return 0
end

-- A refund gives back only a take of the current window (at: the take's
-- time): one of an earlier window would give back tokens that this
-- window's admissions count.
function A.refund(cost, at)
  if at <= 0 or floor_to(at, W) ~= start then return end
  local k = cost
  if taken < k then k = taken end
  cur = cur - k
  if cur < 0 then cur = 0 end
  taken = taken - k
end

function A.finish() end

function A.next(f) return A.retry(f + 1) end

function A.window_end() return ms(start + W - now) end

function A.save()
  if n == 0 and cur == 0 and prev == 0 and taken == 0 then
    -- The same as no state: the next call starts afresh in its window.
    redis.call('DEL', H)
    return
  end
  local life = start + W - now
  if COUNTER then life = life + W end
  local args = { 'w', fmtd(start), 'c', fmtd(cur), 't', fmtd(taken) }
  if COUNTER then
    args[#args + 1] = 'v'; args[#args + 1] = fmtd(prev)
  end
  if n > 0 and carried > now then
    -- The keys live as long as the latest lease, whatever the rule is
    -- now: after a reload to a shorter period, a lease of the old rule
    -- outlives the new window (a call in the new window's first
    -- period, which does not roll, once let the keys lapse under it).
    if carried - now > life then life = carried - now end
    args[#args + 1] = 'x'; args[#args + 1] = fmtd(carried)
  end
  save_common(args, ms(life) + 1000)
end

return run(A)
