-- Leaky bucket (a shaper, GCRA) with leases: the Redis twin of
-- leakybucket.go. Both must do the same floating-point operations in the
-- same order; TestStoresAgreeLeaky runs random operations against both
-- stores and requires equal answers. The Redis store runs lease_common.lua
-- followed by this as one script: the clock, the number formatting and the
-- bookkeeping of the holders (recs, pc, close_lease, …) are there.
--
-- Keys, arguments and reply shapes are those of token_bucket.lua (see its
-- header); the lease reply carries one value more, the lease's TTL in µs
-- (its expiry is the later of its slice's end and now + the rule's TTL).
--
-- KEYS[1] H  the bucket hash (absent while the queue is empty and no lease
--            is open: that is the same as no state):
--              a  TAT, the end of the last slot handed out (µs, shortest
--                 round-trip decimal), rounded to the nearest float64
--              q  TAT exact: "<whole µs> <fraction of a µs>" (see
--                 lbTime in leakybucket.go), read only while a is still
--                 its rounding (a script from before q writes a alone)
--              o  outstanding: Σ granted over the open leases
--              n  open leases
--              c  clients holding open leases
--              x  an upper bound of the open leases' expiries (µs)
--              "p|<client>"  processes of that client holding open leases
--              "<slot>|<client>/<process>"  a lease:
--                 "<id> <granted> <expiry µs> <slice start> <slice end>",
--                 the start rounded up, the end to the nearest
-- KEYS[2] Z  the expiry index while a lease is open: member
--            "<slot>|<client>/<process>", score expiry
-- KEYS[3]    unused
--
-- No call scans the leases: they are read by owner (their H fields) and by
-- expiry (Z). Should H be lost alone (eviction) while Z lists leases, TAT
-- restarts at the latest expiry in Z, which is at or after every slice
-- handed out: no new slice can overlap an old one. Should Z be lost alone,
-- the leases in H are no longer dropped at their expiry; they count as
-- holders until H expires (fairness only: an expiry credits nothing).

local limit = tonumber(ARGV[3])
local period = tonumber(ARGV[4])
local burst = tonumber(ARGV[5])
local t = period / limit -- the emission interval T, µs

-- ms_up rounds a duration in µs up to whole milliseconds.
local function ms_up(us)
  if us <= 0 then return 0 end
  local c = math.ceil(us - 1e-6)
  if c <= 0 then return 0 end
  return math.floor((c + 999) / 1000)
end

-- An instant is kept exact as two numbers, whole µs i and the fraction f
-- of a µs after it (0 ≤ f < 1): the twin of lbTime in leakybucket.go, each
-- function performing the same operations.

-- add_up returns the least double at or above the exact sum a + b.
local function add_up(a, b)
  local s = a + b
  local bb = s - a
  local e = (a - (s - bb)) + (b - bb)
  if e > 0 then
    local _, x = math.frexp(s)
    s = s + math.ldexp(1, x - 53)
  end
  return s
end

-- from splits the double v (µs, positive).
local function from(v)
  local i = math.floor(v)
  return i, v - i
end

-- add returns the instant x µs after i + f.
local function add(i, f, x)
  local s = f + x
  local k = math.floor(s)
  i, f = i + k, s - k
  if f >= 1 then i, f = i + 1, f - 1 end
  return i, f
end

local function after(i, f)
  return i > now or (i == now and f > 0)
end

local function since(i, f)
  return (i - now) + f
end

-- later returns the later of i + f and now.
local function later(i, f)
  if after(i, f) then return i, f end
  return now, 0
end

-- free returns ⌊burst − (start − now)/T⌋: the free slots of the queue when
-- the next slot starts at si + sf.
local function free(si, sf)
  return math.floor(burst - since(si, sf) / t + eps)
end

local st
if mode == 'lease' then
  st = redis.call('HMGET', H, 'a', 'o', 'n', 'c', 'x', 'q', field, ofield, 'p|' .. client)
else
  st = redis.call('HMGET', H, 'a', 'o', 'n', 'c', 'x', 'q')
end
local existed = st[1] ~= false
local ti, tf -- TAT
if existed then
  ti, tf = from(tonumber(st[1]))
  if st[6] then
    local qi, qf = string.match(st[6], '^(%S+) (%S+)$')
    qi, qf = tonumber(qi), tonumber(qf)
    if qi and qf and fmtf(qi + qf) == st[1] then ti, tf = qi, qf end
  end
  out = tonumber(st[2]) or 0
  n = tonumber(st[3]) or 0
  clients = tonumber(st[4]) or 0
  maxexp = tonumber(st[5]) or 0
else
  ti, tf = now, 0
  if ARGV[16] ~= '1' then
    -- The hash lost while leases were open: restart the queue at the
    -- latest expiry, after every slice handed out.
    local tail = redis.call('ZRANGE', Z, -1, -1, 'WITHSCORES')
    if #tail > 0 and tonumber(tail[2]) > now then
      ti, tf = tonumber(tail[2]), 0
      changed = true
    end
  end
end
if mode == 'lease' then
  recs[field] = st[7]
  recs[ofield] = st[8]
  pc[client] = tonumber(st[9]) or 0
end

local function parse(rec)
  local id, g, e, s, en = string.match(rec, '^(%S+) (%d+) (%d+) (%S+) (%S+)$')
  return id, tonumber(g), tonumber(e), tonumber(s), tonumber(en)
end

-- expire drops the leases whose expiry is at or before now; nothing comes
-- back.
if n > 0 then
  local due = redis.call('ZRANGEBYSCORE', Z, '-inf', now)
  if #due > 0 then
    load_recs(due)
    load_counts(due)
    for i = 1, #due do
      local rec = recs[due[i]]
      if rec then
        local _, g = parse(rec)
        close_lease(due[i], g)
        expired = expired + 1
      end
    end
    if not dry then redis.call('ZREMRANGEBYSCORE', Z, '-inf', now) end
  end
end

if mode == 'state' then
  -- {level, outstanding, open leases, now µs, holders, free, next ms,
  -- full ms, 0}: see lbState.snapshot. Holders are the distinct owners of
  -- the leases open at now (the range skips the expired ones, which a dry
  -- run leaves in Z).
  local level = 0
  if after(ti, tf) then level = since(ti, tf) / t end
  local k = 0
  if n > 0 then k = count_owners(redis.call('ZRANGEBYSCORE', Z, '(' .. fmtd(now), '+inf')) end
  local si, sf = later(ti, tf)
  local f = free(si, sf)
  if f < 0 then f = 0 end
  local nx, full = 0, 0
  if f < burst then
    nx = ms_up(since(si, sf) - (burst - (f + 1)) * t)
    full = ms_up(since(ti, tf))
  end
  return { fmtf(level), out, n, fmtd(now), k, f, nx, full, 0 }
end

local function save()
  if n <= 0 and not after(ti, tf) then
    -- An empty queue and no lease: the same as no state.
    if existed then redis.call('DEL', H, Z) end
    return
  end
  local hold = since(ti, tf)
  if n > 0 and maxexp - now > hold then hold = maxexp - now end
  local px = math.ceil(hold / 1000) + 1000
  local dels = {}
  local a = fmtf(ti + tf)
  local args = { 'a', a, 'o', fmtd(out), 'n', fmtd(n), 'c', fmtd(clients), 'x', fmtd(maxexp) }
  if tf ~= 0 then
    args[#args + 1] = 'q'; args[#args + 1] = fmtd(ti) .. ' ' .. fmtf(tf)
  elseif existed and st[6] then
    dels[#dels + 1] = 'q'
  end
  pending_writes(args, dels)
  call_chunked('HSET', H, args)
  if #dels > 0 then call_chunked('HDEL', H, dels) end
  redis.call('PEXPIRE', H, px)
  if n > 0 then
    redis.call('PEXPIRE', Z, px)
  elseif existed then
    redis.call('DEL', Z)
  end
end

local function status()
  local f = free(later(ti, tf))
  if f < 0 then f = 0 end
  return f, ms_up(since(ti, tf))
end

if mode == 'take' then
  local cost = tonumber(ARGV[9])
  local si, sf = later(ti, tf)
  local maxd = tonumber(ARGV[11]) or -1 -- µs; −1: no maximum
  local taken, retry, delay = 0, 0, 0
  if cost == 0 then
    taken = 1
  elseif cost + pfloor > burst then
    retry = -1
  elseif free(si, sf) >= cost + pfloor and maxd >= 0 and since(si, sf) > maxd then
    -- The slot is further away than the caller waits: not taken.
    retry = ms_up(since(si, sf) - maxd)
  elseif free(si, sf) >= cost + pfloor then
    taken = 1
    ti, tf = add(si, sf, cost * t)
    delay = ms_up(since(si, sf))
    changed = true
  else
    retry = ms_up(since(si, sf) - (burst - pfloor - cost) * t)
  end
  if changed then save() end
  local rem, reset = status()
  -- The stamp of a take is its slots' end, for its refund.
  local stamp = 0
  if taken == 1 and cost > 0 then stamp = ti end
  return { taken, retry, rem, expired, reset, delay, stamp }
end

if mode == 'refund' then
  -- The take's slots come back while they are still the last ones handed
  -- out (see lbState.refund).
  local cost = tonumber(ARGV[9])
  local at = tonumber(ARGV[10]) or 0
  if at > 0 and cost > 0 and t >= 1 and ti == at then
    ti, tf = later(add(ti, tf, -(cost * t)))
    changed = true
  end
  if changed then save() end
  return {}
end

-- mode == 'lease'

local cur = recs[field]
local settled = 0
if settle_id ~= '' then
  if not cur then
    save()
    return { 1, 0, 0, 0, 0, 0, expired }
  end
  local id, g, _, s, en = parse(cur)
  if id ~= settle_id then
    save()
    return { 1, 0, 0, 0, 0, 0, expired }
  end
  if used > g then
    save()
    return { 2, 0, 0, 0, 0, 0, expired }
  end
  close_lease(field, g)
  redis.call('ZREM', Z, field)
  if ti + tf == en then
    -- Nothing was handed out after this slice: its unused tail comes back.
    local si, sf = from(s)
    ti, tf = later(add(si, sf, used * t))
  end
  settled = 1
elseif cur then
  -- A new lease replaces the open one of this slot, as if fully used.
  local _, g = parse(cur)
  close_lease(field, g)
  redis.call('ZREM', Z, field)
  expired = expired + 1
end

local holds, h = asker_holders()

if want > 0 and not cur then
  if n >= max_leases or (not holds and pc[client] >= max_procs) then
    save()
    return { 3, 0, 0, 0, 0, 0, expired }
  end
end

local granted, retry, delay, lttl = 0, 0, 0, 0
if want > 0 then
  local si, sf = later(ti, tf)
  local g = want
  local f = free(si, sf) - pfloor
  if f < g then g = f end
  if h > 1 then
    local fair = math.floor(burst / h)
    if fair < 1 then fair = 1 end
    if fair < g then g = fair end
  end
  if g > 0 then
    ti, tf = add(si, sf, g * t)
    local e = ti
    if tf > 0 then e = e + 1 end
    if now + ttl > e then e = now + ttl end
    open_lease(new_id .. ' ' .. fmtd(g) .. ' ' .. fmtd(e) .. ' ' .. fmtf(add_up(si, sf)) .. ' ' .. fmtf(ti + tf), g, e)
    redis.call('ZADD', Z, fmtd(e), field)
    granted = g
    delay = ms_up(since(si, sf))
    lttl = e - now
  else
    retry = ms_up(since(si, sf) - (burst - pfloor - 1) * t)
  end
end
save()
local rem, reset = status()
return { 0, granted, retry, rem, h, settled, expired, reset, delay, lttl }
