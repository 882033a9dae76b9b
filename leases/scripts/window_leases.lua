-- Lease bookkeeping of the window algorithms: the Redis twin of
-- windowleases.go. The Redis store runs lease_common.lua, then this, then
-- one algorithm's body (fixed_window.lua, sliding_window_log.lua) as one
-- script; lease_common.lua has the clock, the number formatting and the
-- bookkeeping of the holders (recs, pc, close_lease, …), and the body
-- defines the algorithm's callbacks (a table A) and ends with
-- "return run(A)".
--
-- KEYS, ARGV and replies are those of token_bucket.lua, and a lease reply
-- has one element more: 10 the granted lease's TTL in µs (a window's end
-- may come before now + lease TTL).
--
-- KEYS[1] H  a hash: the algorithm's fields (one letter each), and while
--            leases are open:
--              o  outstanding: Σ granted over the open leases
--              n  number of open leases
--              k  clients holding open leases
--              "p|<client>"  processes of that client holding open leases
--              "<slot>|<client>/<process>"  a lease:
--                  "<id> <granted> <deadline µs> <window start µs>"
-- KEYS[2] Z  the deadline index of the open leases: member
--            "<slot>|<client>/<process>", score deadline (µs)
-- KEYS[3] X  the algorithm's own (sliding_window_log: its log buckets)
--
-- No call scans the leases: they are read by owner (H fields) and by
-- deadline (Z); a call costs O(log n) plus the leases it closes.

local X = KEYS[3]
local limit = tonumber(ARGV[3])
local W = tonumber(ARGV[4]) -- the window, µs
local RETRY_WALK = 64

-- floor_to returns the largest multiple of q at or below t; ceil_to the
-- smallest at or above. Products of integers below 2^53 are exact.
local function floor_to(t, q)
  local k = math.floor(t / q)
  while k * q > t do k = k - 1 end
  while (k + 1) * q <= t do k = k + 1 end
  return k * q
end
local function ceil_to(t, q)
  local f = floor_to(t, q)
  if f < t then f = f + q end
  return f
end

-- ms rounds a wait in µs up to whole ms (microsToRetry).
local function ms(us)
  if us <= 0 then return 0 end
  return math.floor((us + 999) / 1000)
end

local had_leases = false

-- load reads the shared fields and the algorithm's (names) in one HMGET
-- and returns the algorithm's by name.
local function load(names)
  local f = { 'o', 'n', 'k' }
  for i = 1, #names do f[#f + 1] = names[i] end
  if mode == 'lease' then
    f[#f + 1] = field; f[#f + 1] = ofield; f[#f + 1] = 'p|' .. client
  end
  local r = redis.call('HMGET', H, unpack(f))
  out = tonumber(r[1]) or 0
  n = tonumber(r[2]) or 0
  clients = tonumber(r[3]) or 0
  had_leases = n > 0
  local vals = {}
  for i = 1, #names do vals[names[i]] = r[3 + i] end
  if mode == 'lease' then
    local b = 3 + #names
    recs[field] = r[b + 1]
    recs[ofield] = r[b + 2]
    pc[client] = tonumber(r[b + 3]) or 0
  end
  return vals
end

-- parse returns a record's id, granted, deadline and window.
local function parse(rec)
  local id, g, dl, win = string.match(rec, '^(%S+) (%d+) (%d+) (%-?%d+)$')
  return id, tonumber(g), tonumber(dl), tonumber(win)
end

-- expire closes the leases whose deadline is at or before now in
-- (deadline, member) order, calling on_expire(granted, deadline, window)
-- for each after closing it.
local function expire(on_expire)
  if n == 0 then return end
  local due = redis.call('ZRANGEBYSCORE', Z, '-inf', fmtd(now), 'WITHSCORES')
  if #due == 0 then return end
  local fields = {}
  for i = 1, #due, 2 do fields[#fields + 1] = due[i] end
  load_recs(fields)
  load_counts(fields)
  for i = 1, #fields do
    local rec = recs[fields[i]]
    if rec then
      local _, g, dl, win = parse(rec)
      close_lease(fields[i], g)
      if on_expire then on_expire(g, dl, win) end
      expired = expired + 1
    end
  end
  if not dry then redis.call('ZREMRANGEBYSCORE', Z, '-inf', fmtd(now)) end
end

-- save_common writes the algorithm's fields (args, field-value pairs) with
-- the shared ones, and gives the keys px ms to live.
local function save_common(args, px)
  local dels = {}
  if n > 0 then
    args[#args + 1] = 'o'; args[#args + 1] = fmtd(out)
    args[#args + 1] = 'n'; args[#args + 1] = fmtd(n)
    args[#args + 1] = 'k'; args[#args + 1] = fmtd(clients)
  elseif had_leases then
    dels[#dels + 1] = 'o'; dels[#dels + 1] = 'n'; dels[#dels + 1] = 'k'
  end
  pending_writes(args, dels)
  if #dels > 0 then call_chunked('HDEL', H, dels) end
  call_chunked('HSET', H, args) -- field-value pairs: CHUNK is even
  redis.call('PEXPIRE', H, px)
  if n > 0 then redis.call('PEXPIRE', Z, px) end
end

-- holders counts the distinct owners of the leases open at now (a dry run
-- leaves the expired ones in Z: the range skips them).
local function holders()
  if n <= 0 then return 0 end
  return count_owners(redis.call('ZRANGEBYSCORE', Z, '(' .. fmtd(now), '+inf'))
end

-- run answers the call with the algorithm's callbacks A:
--   advance()            bring the state to now (closing expired leases)
--   free()               whole tokens a spend may take now
--   spend(k)             a take of k tokens now
--   grant(g)             a lease of g now: returns its deadline and window
--   settled(g, used, dl, win) / replaced(g, dl, win)
--   retry(need)          ms until free reaches need, −1 never
--   reset()              ms until the key is whole
--   refund(cost), finish() (after a lease call), level() (a string)
--   save()               write the state (or delete it when it is none)
--   next(free)           (state only) ms until free is one more
--   window_end()         (state only) ms until the window ends, 0: none
local function run(A)
  A.advance()
  if mode == 'state' then
    -- Next and full are zero when the key is whole (see BucketState).
    local f = A.free()
    local nx, full = 0, 0
    if f < limit then nx, full = A.next(f), A.reset() end
    return { A.level(), out, n, fmtd(now), holders(), f, nx, full, A.window_end() }
  end
  if mode == 'take' then
    local cost = tonumber(ARGV[9])
    local taken, retry = 0, 0
    if cost == 0 or cost + pfloor <= A.free() then
      A.spend(cost)
      taken = 1
    else
      retry = A.retry(cost + pfloor)
    end
    -- A denied take that changed nothing writes nothing: the next call
    -- recomputes the same state from what is stored.
    if taken == 1 or changed then A.save() end
    return { taken, retry, A.free(), expired, A.reset(), 0, now }
  end
  if mode == 'refund' then
    A.refund(tonumber(ARGV[9]), tonumber(ARGV[10]) or 0)
    A.save()
    return {}
  end
  -- mode == 'lease'

  local cur = recs[field]
  local settled = 0
  if settle_id ~= '' then
    if not cur then
      A.save()
      return { 1, 0, 0, 0, 0, 0, expired }
    end
    local id, g, dl, win = parse(cur)
    if id ~= settle_id then
      A.save()
      return { 1, 0, 0, 0, 0, 0, expired }
    end
    if used > g then
      A.save()
      return { 2, 0, 0, 0, 0, 0, expired }
    end
    close_lease(field, g)
    redis.call('ZREM', Z, field)
    A.settled(g, used, dl, win)
    settled = 1
  elseif cur then
    -- A new lease replaces the open one of this slot, as if fully spent.
    local _, g, dl, win = parse(cur)
    close_lease(field, g)
    redis.call('ZREM', Z, field)
    A.replaced(g, dl, win)
    expired = expired + 1
  end
  local holds, h = asker_holders()
  if want > 0 and not cur then
    if n >= max_leases or (not holds and pc[client] >= max_procs) then
      A.save()
      return { 3, 0, 0, 0, 0, 0, expired }
    end
  end
  local granted, retry, lttl = 0, 0, 0
  if want > 0 then
    local g = want
    local fair = math.floor(limit / h)
    if fair < 1 then fair = 1 end
    if fair < g then g = fair end
    local f = A.free() - pfloor
    if f < 0 then f = 0 end
    if f < g then g = f end
    if g > 0 then
      local dl, win = A.grant(g)
      open_lease(new_id .. ' ' .. fmtd(g) .. ' ' .. fmtd(dl) .. ' ' .. fmtd(win), g, dl)
      redis.call('ZADD', Z, fmtd(dl), field)
      granted = g
      lttl = dl - now
    else
      retry = A.retry(1 + pfloor)
    end
  end
  A.finish()
  A.save()
  return { 0, granted, retry, A.free(), h, settled, expired, A.reset(), 0, lttl }
end
