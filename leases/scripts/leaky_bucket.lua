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
--                 round-trip decimal)
--              o  outstanding: Σ granted over the open leases
--              n  open leases
--              c  clients holding open leases
--              x  an upper bound of the open leases' expiries (µs)
--              "p|<client>"  processes of that client holding open leases
--              "<slot>|<client>/<process>"  a lease:
--                 "<id> <granted> <expiry µs> <slice start> <slice end>"
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

-- free returns ⌊burst − (start − now)/T⌋: the free slots of the queue when
-- the next slot starts at start.
local function free(start)
  return math.floor(burst - (start - now) / t + eps)
end

local st
if mode == 'lease' then
  st = redis.call('HMGET', H, 'a', 'o', 'n', 'c', 'x', field, ofield, 'p|' .. client)
else
  st = redis.call('HMGET', H, 'a', 'o', 'n', 'c', 'x')
end
local existed = st[1] ~= false
local tat
if existed then
  tat = tonumber(st[1])
  out = tonumber(st[2]) or 0
  n = tonumber(st[3]) or 0
  clients = tonumber(st[4]) or 0
  maxexp = tonumber(st[5]) or 0
else
  tat = now
  if ARGV[16] ~= '1' then
    -- The hash lost while leases were open: restart the queue at the
    -- latest expiry, after every slice handed out.
    local tail = redis.call('ZRANGE', Z, -1, -1, 'WITHSCORES')
    if #tail > 0 and tonumber(tail[2]) > now then
      tat = tonumber(tail[2])
      changed = true
    end
  end
end
if mode == 'lease' then
  recs[field] = st[6]
  recs[ofield] = st[7]
  pc[client] = tonumber(st[8]) or 0
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
  if tat > now then level = (tat - now) / t end
  local k = 0
  if n > 0 then k = count_owners(redis.call('ZRANGEBYSCORE', Z, '(' .. fmtd(now), '+inf')) end
  local start = tat
  if now > start then start = now end
  local f = free(start)
  if f < 0 then f = 0 end
  local nx, full = 0, 0
  if f < burst then
    nx = ms_up(start - now - (burst - (f + 1)) * t)
    full = ms_up(tat - now)
  end
  return { fmtf(level), out, n, fmtd(now), k, f, nx, full, 0 }
end

local function save()
  if n <= 0 and tat <= now then
    -- An empty queue and no lease: the same as no state.
    if existed then redis.call('DEL', H, Z) end
    return
  end
  local hold = tat - now
  if n > 0 and maxexp - now > hold then hold = maxexp - now end
  local px = math.ceil(hold / 1000) + 1000
  local args = { 'a', fmtf(tat), 'o', fmtd(out), 'n', fmtd(n), 'c', fmtd(clients), 'x', fmtd(maxexp) }
  local dels = {}
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
  local start = tat
  if now > start then start = now end
  local f = free(start)
  if f < 0 then f = 0 end
  return f, ms_up(tat - now)
end

if mode == 'take' then
  local cost = tonumber(ARGV[9])
  local start = tat
  if now > start then start = now end
  local maxd = tonumber(ARGV[11]) or -1 -- µs; −1: no maximum
  local taken, retry, delay = 0, 0, 0
  if cost == 0 then
    taken = 1
  elseif cost + pfloor > burst then
    retry = -1
  elseif free(start) >= cost + pfloor and maxd >= 0 and start - now > maxd then
    -- The slot is further away than the caller waits: not taken.
    retry = ms_up(start - now - maxd)
  elseif free(start) >= cost + pfloor then
    taken = 1
    tat = start + cost * t
    delay = ms_up(start - now)
    changed = true
  else
    retry = ms_up(start - now - (burst - pfloor - cost) * t)
  end
  if changed then save() end
  local rem, reset = status()
  -- The stamp of a take is its slots' end, for its refund.
  local stamp = 0
  if taken == 1 and cost > 0 then stamp = math.floor(tat) end
  return { taken, retry, rem, expired, reset, delay, stamp }
end

if mode == 'refund' then
  -- The take's slots come back while they are still the last ones handed
  -- out (see lbState.refund).
  local cost = tonumber(ARGV[9])
  local at = tonumber(ARGV[10]) or 0
  if at > 0 and cost > 0 and t >= 1 and math.floor(tat) == at then
    tat = tat - cost * t
    if tat < now then tat = now end
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
  if tat == en then
    -- Nothing was handed out after this slice: its unused tail comes back.
    local v = s + used * t
    if v < now then v = now end
    tat = v
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
  local start = tat
  if now > start then start = now end
  local g = want
  local f = free(start) - pfloor
  if f < g then g = f end
  if h > 1 then
    local fair = math.floor(burst / h)
    if fair < 1 then fair = 1 end
    if fair < g then g = fair end
  end
  if g > 0 then
    local en = start + g * t
    tat = en
    local e = math.ceil(en)
    if now + ttl > e then e = now + ttl end
    open_lease(new_id .. ' ' .. fmtd(g) .. ' ' .. fmtd(e) .. ' ' .. fmtf(start) .. ' ' .. fmtf(en), g, e)
    redis.call('ZADD', Z, fmtd(e), field)
    granted = g
    delay = ms_up(start - now)
    lttl = e - now
  else
    retry = ms_up(start - now - (burst - pfloor - 1) * t)
  end
end
save()
local rem, reset = status()
return { 0, granted, retry, rem, h, settled, expired, reset, delay, lttl }
