-- Token bucket with leases: the Redis twin of tokenbucket.go. Both must do
-- the same floating-point operations in the same order; TestStoresAgree
-- runs random operations against both stores and requires equal answers.
-- The Redis store runs lease_common.lua followed by this as one script:
-- the clock, the number formatting and the bookkeeping of the holders
-- (recs, pc, close_lease, …) are there.
--
-- KEYS[1] H  the bucket: while no lease is open, a string
--            "<level> <refill clock µs>" written with SET PX (one command
--            for the state and its TTL, as a per-request limiter writes);
--            while a lease server owns it (own.go), the same string with
--            the ownership after it: "<level> <refill clock µs> <deadline
--            µs> <contested 0|1> =<id> <owner>" (the ID of the op that
--            began it, hex; the owner last, as it may hold spaces; a
--            record without "=<id>", written before IDs, has ID ""; a
--            script from before IDs reads "=<id> <owner>" as another
--            server's name, and refuses), where level and clock are the owner's L0 and t0,
--            which nothing changes while it lasts, and PX outlives the
--            deadline by the refill of the whole burst (an expiry empties
--            the bucket at the deadline); while any lease is open, a hash
--            (never while owned):
--              l  level (shortest round-trip decimal)
--              t  refill clock (µs)
--              o  outstanding: Σ granted over the open leases  \ present only
--              n  number of open leases                        | while a lease
--              x  upper bound of the open leases' expiries, less t | is open
--                 and, after a space, the Redis time (ms) H's TTL   |
--                 runs to, less t in ms (see save)                  |
--              c  clients holding open leases                  /
--              "p|<client>"  processes of that client holding open leases
--              "<slot>|<client>/<process>"  a lease: "<id> <granted> <expiry µs>"
--                (id "-" and granted 0: a waiter, see tokenbucket.go)
--              "g|"  a ghost lease standing for leases lost with the hash
--              L  while at most INLINE leases are open: their fields, one a
--                 line (the expiry index kept inline; Z does not exist)
--              m  with L: at most the earliest expiry of those leases, less t;
--                 their records are read only once it has passed
-- KEYS[2] Z  the expiry index once more than INLINE leases are open:
--            member "<slot>|<client>/<process>", score expiry
-- KEYS[3] S  the fair-share clocks: member "<client>/<process>", score clock (µs)
-- Replies: lease {status (0 ok, 1 unknown lease, 2 used exceeds granted,
--          3 too many leases), granted, retry ms, remaining, holders,
--          settled (0|1), expired, reset ms, delay ms} (a refusal on an
--          owned bucket adds a grant TTL of 0 and owned (1: refused
--          because owned), LeaseOutcome.Owned); take {taken (0|1),
--          retry ms (−1: never), remaining, expired, reset ms, delay ms,
--          now µs (the take's time, which a refund names in ARGV[10]),
--          and after them, when refused because the bucket is owned, 1,
--          or 2 when by the server taking (TakeOutcome.Owned,
--          OwnedByServer)};
--          refund {}; state {level, outstanding, open leases, now µs,
--          holders, free, next ms, full ms, window end ms} (BucketState),
--          and the owner after them while the bucket is owned.
--          Every algorithm's script takes these keys and arguments and
--          answers in these shapes (see algorithm.go); only this one has
--          the modes own and release (OwnOp), which answer {owned (0|1),
--          acquired (0|1), level (a decimal string: the bucket's L0 when
--          acquired, else "0"), now µs, contested (0|1), retry ms, the
--          ownership's ID when owned (else "")}; for them ARGV[7] is the
--          server, ARGV[9] the released level (a decimal string, finite,
--          0 to burst: OwnOp.releaseLevel), ARGV[10] the op's ID,
--          ARGV[11] '1' for a renewal (OwnOp.Renew: it never begins an
--          ownership) and ARGV[12] the lost IDs, space-separated (OwnOp.ID,
--          OwnOp.Lost, checked by the store: hex).
-- ARGV     1 mode (lease|take|refund|state|own|release), 2 now µs ("" = Redis TIME),
--          3 limit, 4 period µs, 5 burst, 6 lease ttl µs, 7 client (for a
--          take: the lease server taking, TakeOp.Server, or ""),
--          8 process, 9 want or cost, 10 lease id to settle, 11 used,
--          12 new lease id, 13 slot (0 or 1), 14 max open leases per key,
--          15 max processes per client on the key, 16 "1" when Redis is
--          known to evict nothing (the check for a lost hash is skipped),
--          17 the floor: the part of the capacity a grant or take must
--          leave free for higher priority classes (LeaseOp.Floor; "" or
--          absent: 0), 18 the µs a lease may defer a grant it would
--          refuse (LeaseOp.MaxDelay; "" or absent: 0, never); the lease
--          reply's delay ms is then the wait before its tokens may be
--          spent, and the level may be below zero (in debt) meanwhile
--
-- The three keys carry the bucket key's hash tag, so they live in one slot.
-- O lives in H with the leases it sums, written by the same script, so the
-- two cannot drift; the leases are indexed by owner (their H fields) and by
-- expiry (Z), and the holders are counted per client (c, "p|..."), so no
-- call scans the leases: its cost is O(log n) plus the leases it closes.
--
-- A bucket's keys may be lost one at a time (eviction). Without H, the
-- leases in Z are kept as one ghost lease of the whole burst until the last
-- of them expires, and the level starts empty: never a full bucket that
-- forgets open leases. Without Z, H's leases stay counted as outstanding
-- until x passes, then Z is rebuilt from H and they are closed in order.
-- Without S, the fair-share clocks start afresh (fairness only).

local S = KEYS[3]
local limit = tonumber(ARGV[3])
local period = tonumber(ARGV[4])
local burst = tonumber(ARGV[5])
local maxdelay = tonumber(ARGV[18]) or 0 -- µs a grant may be deferred (LeaseOp.MaxDelay)
local rate = limit / period
local RETRY_WALK = 64
local INLINE = 16 -- open leases indexed inline in H; more move the index to Z

-- The bucket is a string while no lease is open, a hash while any is. The
-- read that fits the mode's usual case comes first: GET for takes (keys
-- decided directly), HMGET for leases; a WRONGTYPE error sends it to the
-- other.
local function wrongtype(r) return type(r) == 'table' and r['err'] ~= nil end
local raw = false -- the string bucket, false when none
local is_hash = false
local st = {}
if mode == 'lease' then
  local r = redis.pcall('HMGET', H, 'l', 't', 'o', 'n', 'x', 'c', 'L', field, ofield, 'p|' .. client, 'm')
  if wrongtype(r) then raw = redis.call('GET', H) else st = r; is_hash = r[1] ~= false end
else
  local r = redis.pcall('GET', H)
  if wrongtype(r) then
    local v = redis.call('HMGET', H, 'l', 't', 'o', 'n', 'x', 'c', 'L', 'm')
    st = { v[1], v[2], v[3], v[4], v[5], v[6], v[7], false, false, false, v[8], false }
    is_hash = true
  else
    raw = r
  end
end
-- The ownership of the bucket by a lease server, when the string records
-- one: the owner, its deadline (µs), its contested mark ('0' or '1') and
-- its ID.
local ow, odl, ocon, oid = nil, 0, '0', ''
-- The lease server whose direct take last took from the bucket (a string
-- with no owner), when, and the last time the taker changed
-- (tokenbucket_own.go, noteTaker): "<level> <clock> t <taken µs> <mixed
-- µs> <taker>".
local tk, tkat, tkmix = nil, 0, 0
if not is_hash then
  st = {}
  for i = 1, 12 do st[i] = false end
  if raw then
    local l, t, d, c, i, w = string.match(raw, '^(%S+) (%d+) (%d+) ([01]) =(%x*) (.*)$')
    if not l then
      l, t, d, c, w = string.match(raw, '^(%S+) (%d+) (%d+) ([01]) (.*)$')
      i = ''
    end
    if l then
      ow, odl, ocon, oid = w, tonumber(d), c, i
    else
      local a, m
      l, t, a, m, w = string.match(raw, '^(%S+) (%d+) t (%d+) (%d+) (.*)$')
      if l then
        tk, tkat, tkmix = w, tonumber(a), tonumber(m)
      else
        l, t = string.match(raw, '^(%S+) (%d+)$')
      end
    end
    st[1], st[2] = l, t
  end
end

local level, last
local had_inline = st[7] ~= false
-- inl lists the open leases' fields while the index is inline, nil once it
-- is in Z.
local inl = nil
local minexp = 0 -- with inl: at most the earliest expiry of its leases
if st[1] then
  level = tonumber(st[1])
  last = tonumber(st[2])
  out = tonumber(st[3]) or 0
  n = tonumber(st[4]) or 0
  -- x and m are kept as offsets from t: small integers, which Redis
  -- stores in fewer bytes.
  maxexp = 0
  if st[5] then
    -- x is "<maxexp - last> <e - last ms>": e, the Redis time (ms) the
    -- hash's TTL runs to, as an offset rewritten at every save. Kept in x,
    -- not a field of its own: a script of an older rateleased fails on
    -- this x (503) rather than rewrite t under a field it does not know,
    -- which would make e claim a TTL that PEXPIRE never set. (A field of
    -- its own measured 232 B per leased bucket instead of 264 B.)
    local x, e = string.match(st[5], '^(%S+) (%S+)$')
    if x then st[5], st[12] = x, math.floor(last / 1000) + tonumber(e) end
    maxexp = last + tonumber(st[5])
  end
  clients = tonumber(st[6]) or 0
  if st[7] then
    inl = {}
    for f in string.gmatch(st[7], '[^\n]+') do inl[#inl + 1] = f end
    minexp = 0
    if st[11] then minexp = last + tonumber(st[11]) end
  elseif n == 0 then
    inl = {}
  end
else
  level = burst
  last = now
  out = 0
  n = 0
  maxexp = 0
  clients = 0
  inl = {}
  -- No bucket. If the expiry index still lists leases, the hash was lost
  -- while they were open (evicted): they stand as one ghost lease of the
  -- whole burst (L + O never exceeded it) until the last of them ends,
  -- from an empty level. A Redis that evicts nothing cannot lose the hash
  -- alone, and the check is skipped.
  local tail = {}
  if ARGV[16] ~= '1' then tail = redis.call('ZRANGE', Z, -1, -1, 'WITHSCORES') end
  if #tail > 0 and tonumber(tail[2]) > now then
    local e = tonumber(tail[2])
    level = 0
    out = burst
    n = 1
    maxexp = e
    recs['g|'] = 'ghost ' .. fmtd(burst) .. ' ' .. fmtd(e)
    inl = nil
    changed = true
    if not dry then
      is_hash = true
      redis.call('HSET', H, 'g|', recs['g|'])
      redis.call('ZADD', Z, fmtd(e), 'g|')
    end
  end
end
if ow and odl <= now then
  -- The ownership expired unrenewed: the bucket is empty at its deadline
  -- and refills from there (tokenbucket_own.go, endOwnership).
  level, last, ow = 0, odl, nil
  changed = true
end
if mode == 'lease' then
  recs[field] = st[8]
  recs[ofield] = st[9]
  pc[client] = tonumber(st[10]) or 0
end

local function grant_of(rec)
  return tonumber(string.match(rec, ' (%d+) '))
end

-- cap_level returns lv capped at c, the burst less what is outstanding,
-- where prev is the level before the refill or credit that made lv
-- (capLevel): never below zero, nor below prev when prev was in debt (a
-- deferred grant).
local function cap_level(lv, c, prev)
  local l = lv
  if l > c then l = c end
  local fl = 0
  if prev < 0 then fl = prev end
  if l < fl then l = fl end
  return l
end

local function refill_to(t)
  local prev = level
  if t > last then
    level = level + rate * (t - last)
    last = t
  end
  level = cap_level(level, burst - out, prev)
end

-- expire closes the leases that expired at or before now in (expiry,
-- member) order, refilling piecewise up to each expiry under the cap that
-- held until then.
local function exp_of(rec)
  return tonumber(string.match(rec, ' (%d+)$'))
end

-- by_expiry orders {field, expiry} pairs as a sorted set orders members.
local function by_expiry(a, b)
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[1] < b[1]
end

-- inline_open returns the open leases of the inline index in expiry order,
-- as "field, expiry, field, expiry, …" like ZRANGE WITHSCORES.
local function inline_open(upto)
  load_recs(inl)
  local l = {}
  for i = 1, #inl do
    local rec = recs[inl[i]]
    if rec then
      local e = exp_of(rec)
      if upto == nil or e <= upto then l[#l + 1] = { inl[i], e } end
    end
  end
  table.sort(l, by_expiry)
  local flat = {}
  for i = 1, #l do
    flat[#flat + 1] = l[i][1]
    flat[#flat + 1] = l[i][2]
  end
  return flat
end

local function inline_remove(f)
  for i = 1, #inl do
    if inl[i] == f then
      table.remove(inl, i)
      return
    end
  end
end

local function expire()
  local due
  if inl then
    if minexp > now then return end -- nothing inline can have expired
    due = inline_open(now)
    -- inline_open loaded every inline record: the earliest expiry left.
    minexp = 0
    for i = 1, #inl do
      local rec = recs[inl[i]]
      if rec then
        local e = exp_of(rec)
        if e > now and (minexp == 0 or e < minexp) then minexp = e end
      end
    end
  else
    due = redis.call('ZRANGEBYSCORE', Z, '-inf', now, 'WITHSCORES')
  end
  if #due == 0 then return end
  local fields = {}
  for i = 1, #due, 2 do fields[#fields + 1] = due[i] end
  load_recs(fields)
  load_counts(fields)
  local dels = {}
  for i = 1, #due, 2 do
    local f = due[i]
    local rec = recs[f]
    if rec then
      local g = grant_of(rec)
      refill_to(tonumber(due[i + 1]))
      close_lease(f, g)
      if g > 0 then expired = expired + 1 end
      dels[#dels + 1] = f
    end
  end
  if inl then
    for i = 1, #dels do inline_remove(dels[i]) end
  elseif not dry then
    redis.call('ZREMRANGEBYSCORE', Z, '-inf', now)
  end
end

if n > 0 then
  expire()
  if n > 0 and not dry and not inl and redis.call('EXISTS', Z) == 0 then
    -- Leases are open beyond the inline limit, yet the expiry index is
    -- gone: it was lost (evicted). Rebuild it from the hash, then close
    -- the expired ones.
    local all = redis.call('HGETALL', H)
    for i = 1, #all, 2 do
      local f = all[i]
      local s = string.sub(f, 1, 2)
      if (s == '0|' or s == '1|' or s == 'g|') and recs[f] ~= false then
        local e = string.match(all[i + 1], ' (%d+)$')
        redis.call('ZADD', Z, e, f)
      end
    end
    expire()
  end
end

local function remaining()
  if level <= 0 then return 0 end
  return math.floor(level + eps)
end

local function microsceil(tokens)
  return math.ceil(tokens / rate - 1e-6)
end

-- us_ms rounds a wait of us µs up to whole ms (microsToRetry).
local function us_ms(us)
  if us <= 0 then return 0 end
  return math.floor((us + 999) / 1000)
end

-- refill_ms is the time, in whole ms rounded up, the refill takes to add
-- tk tokens (resetAfter).
local function refill_ms(tk)
  if tk <= eps then return 0 end
  local us = microsceil(tk)
  if us <= 0 then return 0 end
  return math.floor((us + 999) / 1000)
end

-- reset_ms is the time, in whole ms rounded up, until the bucket is full
-- again if nothing else happens: its refill from the level to the burst.
local function reset_ms()
  return refill_ms(burst - level)
end

-- retry_after returns the time (ms) until the bucket holds target tokens if
-- nothing else happens: the latest of the refill from the level now and,
-- for each lease that must expire before the cap burst − O admits target,
-- its expiry plus the refill from the cap that held until then (at most
-- RETRY_WALK leases are walked; the rest are bounded by x).
local function retry_after(target)
  if target > burst then return -1 end
  local wait = 0
  local need = target - level
  if need > 0 then wait = microsceil(need) end
  local c = burst - out
  if c < target then
    local done = false
    local first
    if inl then
      first = inline_open(nil)
    else
      first = redis.call('ZRANGE', Z, 0, RETRY_WALK - 1, 'WITHSCORES')
    end
    if #first > 0 then
      local fields = {}
      for i = 1, #first, 2 do fields[#fields + 1] = first[i] end
      load_recs(fields)
      local vals = {}
      for j = 1, #fields do vals[j] = recs[fields[j]] end
      for j = 1, #fields do
        if vals[j] then
          local w = tonumber(first[2 * j]) - now + microsceil(target - math.max(c, 0))
          if w > wait then wait = w end
          c = c + grant_of(vals[j])
          if c >= target then
            done = true
            break
          end
        end
      end
    end
    if not done then
      local w = maxexp - now + microsceil(target - math.max(c, 0))
      if w > wait then wait = w end
    end
  end
  return us_ms(wait)
end

-- ensure_hash makes the bucket a hash before a lease field is written:
-- a string bucket is dropped first (save writes its level and clock back).
local function ensure_hash()
  if not is_hash then
    if raw then redis.call('DEL', H) end
    is_hash = true
  end
end

local shares_touched = false
local function save()
  -- The state outlives every open lease and then the refill to full: a
  -- full bucket with no lease is the same as no state.
  -- An owned bucket outlives its deadline and then the refill from empty.
  local us
  if n > 0 then
    us = maxexp - now + burst / rate
  elseif ow then
    us = odl - now + burst / rate
  else
    us = (burst - level) / rate
    if tk then
      -- The record of its takers lasts a lease TTL past the latest.
      local keep = tkat
      if tkmix > keep then keep = tkmix end
      keep = keep + ttl - now
      if keep > us then us = keep end
    end
  end
  if us < 0 then us = 0 end
  local px = math.ceil(us / 1000) + 1000
  if shares_touched then redis.call('PEXPIRE', S, px) end
  if n <= 0 then
    -- No lease open: the bucket is a string, written with its TTL. A hash
    -- left from the leases is dropped whole (its counts are all zero).
    if is_hash then redis.call('DEL', H) end
    local v = fmtf(level) .. ' ' .. fmtd(last)
    if ow then
      v = v .. ' ' .. fmtd(odl) .. ' ' .. ocon .. ' =' .. oid .. ' ' .. ow
    elseif tk then
      v = v .. ' t ' .. fmtd(tkat) .. ' ' .. fmtd(tkmix) .. ' ' .. tk
    end
    redis.call('SET', H, v, 'PX', px)
    return
  end
  -- The hash's TTL (PEXPIRE) is set with half again of slack, and the
  -- Redis time (ms) it then runs to is kept in x (e); while e still covers
  -- px, the TTL is left as it is, and a renewal costs one command less.
  -- e is Redis's own clock (TIME, read once more only when the store's
  -- clock is not Redis's: tests), since the TTL runs on it; it is written
  -- only beside its PEXPIRE, and goes with the hash. (Redis counts a
  -- PEXPIRE from the script's start, a fraction of a ms before e's base:
  -- px's second of slack covers it.)
  local kept = st[1] and is_hash and tonumber(st[12])
  local rms
  if ARGV[2] == '' then
    rms = math.floor(now / 1000)
  else
    local t = redis.call('TIME')
    rms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local hpx = nil
  if not kept or kept < rms + px then
    hpx = px + math.floor(px / 2)
    kept = rms + hpx
  end
  ensure_hash()
  local args = { 'l', fmtf(level), 't', fmtd(last),
    'o', fmtd(out), 'n', fmtd(n),
    'x', string.format('%d %d', maxexp - last, kept - math.floor(last / 1000)), 'c', fmtd(clients) }
  local dels = {}
  if inl then
    args[#args + 1] = 'L'; args[#args + 1] = table.concat(inl, '\n')
    args[#args + 1] = 'm'; args[#args + 1] = fmtd(minexp - last)
  elseif had_inline then
    dels[#dels + 1] = 'L'
    dels[#dels + 1] = 'm'
  end
  pending_writes(args, dels)
  call_chunked('HSET', H, args) -- field-value pairs: CHUNK is even
  if #dels > 0 then call_chunked('HDEL', H, dels) end
  if hpx then redis.call('PEXPIRE', H, hpx) end
  -- Z expires with H (kept − rms ≥ px): were it to go first, the next call
  -- would take it for evicted and rebuild it from H.
  if not inl then redis.call('PEXPIRE', Z, kept - rms) end
end

-- holders counts the distinct owners of the leases open at now (a dry run
-- leaves the expired ones in Z: the range skips them). Should Z be lost
-- while leases are open, the hash's lease fields stand in for it.
local function holders()
  if n <= 0 then return 0 end
  local fs = inl
  if not fs then
    fs = redis.call('ZRANGEBYSCORE', Z, '(' .. fmtd(now), '+inf')
    if #fs == 0 then
      local all = redis.call('HGETALL', H)
      for i = 1, #all, 2 do
        local e = string.match(all[i + 1], ' (%d+)$')
        if e and tonumber(e) > now then fs[#fs + 1] = all[i] end
      end
    end
  end
  return count_owners(fs)
end

if ow then
  -- A live ownership (tokenbucket_own.go): level and clock are the owner's
  -- L0 and t0 and stay so. Waits assume it expires at its deadline, empty.
  local function owned_ms(tk) return us_ms(odl - now + microsceil(tk)) end
  if mode == 'state' then
    refill_to(now) -- the most the owner can hold
    return { fmtf(level), 0, 0, fmtd(now), 0, 0, owned_ms(1), owned_ms(burst), 0, ow }
  end
  if mode == 'own' then
    if ow ~= ARGV[7] then return { 0, 0, '0', now, 0, us_ms(odl - now), '' } end
    if ARGV[10] ~= oid then
      for lost in string.gmatch(ARGV[11] == '1' and '' or ARGV[12], '%x+') do
        if lost == oid then
          -- Begun by an acquisition of this server's whose answer was
          -- lost, that nobody decided from: afresh, from the level the
          -- bucket would have had (the contested mark stays).
          refill_to(now)
          odl, oid = now + ttl, ARGV[10]
          save()
          return { 1, 1, fmtf(level), now, 0, 0, oid }
        end
      end
      -- An ownership of this server's the op does not know: unchanged.
      return { 1, 0, '0', now, 0, 0, oid }
    end
    local contested = 0
    if ocon == '1' then contested = 1 end
    odl, ocon = now + ttl, '0'
    save()
    return { 1, 0, '0', now, contested, 0, oid }
  end
  if mode == 'release' then
    if ow == ARGV[7] and ARGV[10] == oid then
      -- At most L0 and the refill since t0, under the burst, at now.
      ow = nil
      refill_to(now)
      local rl = tonumber(ARGV[9])
      if rl < level then level = rl end
      save()
    end
    return { 0, 0, '0', now, 0, 0, '' }
  end
  if mode == 'refund' then return {} end -- nothing was taken while owned
  if mode == 'lease' and ARGV[10] ~= '' then return { 1, 0, 0, 0, 0, 0, 0 } end -- no lease is open
  -- A take, or a lease asking for tokens, is refused and marks the
  -- ownership contested (one SET, the first time), but a take through the
  -- owner itself (an owner that lost track of its ownership: nobody else
  -- wants the bucket); a lease of nothing is answered alone.
  local retry = 0
  if mode == 'take' or tonumber(ARGV[9]) > 0 then
    local d = odl - now
    if d > 100000 then d = 100000 end
    retry = us_ms(d)
    local by_owner = mode == 'take' and ARGV[7] ~= '' and ow == ARGV[7]
    if ocon == '0' and not by_owner then
      ocon = '1'
      save()
    end
  end
  if mode == 'take' then
    -- The eighth: refused because owned (TakeOutcome.Owned), 2 when by
    -- the server taking (OwnedByServer).
    local by = 1
    if ARGV[7] ~= '' and ow == ARGV[7] then by = 2 end
    return { 0, retry, 0, 0, owned_ms(burst), 0, now, by }
  end
  -- The eleventh element says that the lease was refused because the
  -- bucket is owned (LeaseOutcome.Owned); the tenth, a grant's TTL, is 0.
  local refused = 0
  if tonumber(ARGV[9]) > 0 then refused = 1 end
  return { 0, 0, retry, 0, 1, 0, 0, owned_ms(burst), 0, 0, refused }
end
refill_to(now)

if mode == 'own' and ARGV[11] == '1' then
  -- A renewal of an ownership no longer live (it expired): not owned, and
  -- nothing begun (tokenbucket_own.go).
  if changed then save() end
  return { 0, 0, '0', now, 0, 0, '' }
end
if mode == 'own' then
  if n > 0 then
    -- Open leases: retry once the last of them ends, at most a lease TTL.
    if changed then save() end
    local w = maxexp - now
    if w > ttl then w = ttl end
    return { 0, 0, '0', now, 0, us_ms(w), '' }
  end
  if level < 0 then
    -- In debt (a deferred grant): ask again once the refill has paid it.
    if changed then save() end
    return { 0, 0, '0', now, 0, us_ms(microsceil(-level)), '' }
  end
  if tk and (tkmix > now - ttl or (tk ~= ARGV[7] and tkat > now - ttl)) then
    -- Taken through other servers lately (sharedTakes): not owned; ask
    -- again a TTL later.
    if changed then save() end
    return { 0, 0, '0', now, 0, us_ms(ttl), '' }
  end
  tk = nil
  ow, odl, ocon, oid = ARGV[7], now + ttl, '0', ARGV[10]
  save()
  return { 1, 1, fmtf(level), now, 0, 0, oid }
end
if mode == 'release' then
  -- Not the owner's: nothing changes (but what this call closed).
  if changed then save() end
  return { 0, 0, '0', now, 0, 0, '' }
end

if mode == 'state' then
  -- {level, outstanding, open leases, now µs, holders, free, next ms,
  -- full ms, window end ms (none: 0)}: see BucketState and tbTimes.
  local free = remaining()
  local nx, full = 0, 0
  local missing = (burst - out) - level
  if missing > eps then
    local tk = (free + 1) - level
    if missing < tk then tk = missing end
    nx, full = refill_ms(tk), refill_ms(missing)
  end
  return { fmtf(level), out, n, fmtd(now), holders(), free, nx, full, 0 }
end

if mode == 'take' then
  local cost = tonumber(ARGV[9])
  local taken, retry = 0, 0
  if cost == 0 or level + eps >= cost + pfloor then
    level = level - cost
    taken = 1
    if ARGV[7] ~= '' and n <= 0 then
      -- noteTaker: the server whose take this is (TakeOp.Server).
      if tk and tk ~= ARGV[7] then tkmix = now end
      tk, tkat = ARGV[7], now
    end
  else
    retry = retry_after(cost + pfloor)
  end
  -- A denied take that closed nothing changes nothing: the next call's
  -- refill from the stored state gives the same level, so nothing is
  -- written (two commands fewer per denial).
  if taken == 1 or changed then save() end
  return { taken, retry, remaining(), expired, reset_ms(), 0, now }
end

if mode == 'refund' then
  local cost = tonumber(ARGV[9])
  level = cap_level(level + cost, burst - out, level)
  save()
  return {}
end

-- mode == 'lease'

local cur = recs[field]
local settled = 0
if settle_id ~= '' then
  if not cur or grant_of(cur) == 0 or string.match(cur, '^(%S+) ') ~= settle_id then
    save()
    return { 1, 0, 0, 0, 0, 0, expired }
  end
  local g = grant_of(cur)
  if used > g then
    save()
    return { 2, 0, 0, 0, 0, 0, expired }
  end
  close_lease(field, g)
  -- What comes back never lifts the level above burst − O: after a rule
  -- shrank, an old lease returned unused must not bring back the old
  -- burst.
  level = cap_level(level + (g - used), burst - out, level)
  if inl then inline_remove(field) else redis.call('ZREM', Z, field) end
  settled = 1
elseif cur then
  -- A new lease replaces the open one of this slot, which counts as fully
  -- spent.
  local g = grant_of(cur)
  close_lease(field, g)
  if inl then inline_remove(field) else redis.call('ZREM', Z, field) end
  if g > 0 then expired = expired + 1 end
end

-- Holders from this owner's view: clients (its own counted) times the
-- processes of its client (itself counted).
local holds, h = asker_holders()

if want > 0 and not cur then
  if n >= max_leases or (not holds and pc[client] >= max_procs) then
    save()
    return { 3, 0, 0, 0, 0, 0, expired }
  end
end

-- index_add indexes a new lease; past INLINE open leases the inline index
-- moves to Z.
local function index_add(f, e)
  if inl and #inl < INLINE then
    inl[#inl + 1] = f
    if minexp == 0 or e < minexp then minexp = e end
    return
  end
  if inl then
    load_recs(inl)
    local args = {}
    for i = 1, #inl do
      args[#args + 1] = fmtd(exp_of(recs[inl[i]]))
      args[#args + 1] = inl[i]
    end
    if #args > 0 then redis.call('ZADD', Z, unpack(args)) end
    inl = nil
  end
  redis.call('ZADD', Z, fmtd(e), f)
end

-- deferral returns the wait (ms) after which a batch of g tokens, refused
-- now, could be granted whole, or -1 (tbState.deferral).
local function deferral(g, h, capf, shared)
  if g > burst - out then return -1 end -- only once other leases end
  local wait = retry_after(g)
  if wait < 0 then return -1 end
  if shared and capf < g then
    -- The share comes later than the level: only if the level until then
    -- stays within half the burst (tbState.deferral).
    local ws = us_ms(math.ceil((g - capf) * h / rate))
    if ws > wait then
      if level + rate * (ws * 1000) > burst / 2 then return -1 end
      wait = ws
    end
  end
  if wait * 1000 > maxdelay or wait * 1000 * 2 > ttl then return -1 end
  return wait
end

local granted, retry, delay = 0, 0, 0
if want > 0 then
  local g = want
  local batch = g
  local capf = 0
  local share, base = 0, 0
  local share_wait = 0
  local shared = false
  local need = 1
  local floor = now - burst / rate
  local fair0 = math.floor(burst / h)
  if fair0 < 1 then fair0 = 1 end
  local gg = g
  if fair0 < gg then gg = fair0 end
  if h > 1 and level - gg >= burst / 2 then
    -- Roomy: no share binds; the share clock is neither read nor moved.
    g = gg
    batch = g
    need = math.floor((g + 1) / 2)
  elseif h > 1 then
    -- Fair share: a batch of at most burst/h per lease, once the owner's
    -- share of the refill since its share clock, plus whatever the bucket
    -- holds above a quarter full, covers it; until then nothing, and a
    -- retry_after for when it will (see tokenbucket.go).
    base = floor
    local vt = tonumber(redis.call('ZSCORE', S, owner))
    if vt and vt > floor then base = vt end
    local fair = math.floor(burst / h)
    if fair < 1 then fair = 1 end
    if fair < g then g = fair end
    batch = g
    need = math.floor((g + 1) / 2)
    share = rate * (now - base) / h
    local spare = 0
    if level > burst / 4 then spare = math.floor(level - burst / 4) end
    capf = share + spare
    local cap = math.floor(capf)
    if cap < g then g = cap end
    if g < need then
      -- Too soon: the owner's share has not reached half its batch.
      g = 0
      share_wait = math.ceil((need - capf) * h / rate)
    end
    shared = true
  end
  local avail = 0
  if level > 0 then avail = math.floor(level + eps) end
  -- The floor of the owner's class stays in the bucket.
  avail = avail - pfloor
  if avail < 0 then avail = 0 end
  if avail < g then
    g = avail
    if g < need then g = 0 end -- half a batch at least, or nothing until the bucket holds it
  end
  if g < batch and maxdelay > 0 and pfloor == 0 then
    -- Deferred: the whole batch, spendable once both the level and the
    -- owner's share cover it, rather than a part of it now (tbState.lease,
    -- tbState.deferral).
    local d = deferral(batch, h, capf, shared)
    if d >= 0 then
      g, delay = batch, d
      -- The share as it will stand when the batch may be spent.
      if shared then share = share + rate * (d * 1000) / h end
    end
  end
  if g > 0 then
    level = level - g
    local e = now + ttl
    open_lease(new_id .. ' ' .. fmtd(g) .. ' ' .. fmtd(e), g, e)
    index_add(field, e)
    if shared then
      -- The clock advances by the tokens taken from the share; tokens
      -- taken from the spare above a quarter full are free.
      local adv = g
      if share < adv then adv = share end
      if redis.call('ZADD', S, fmtf(base + adv * h / rate), owner) == 1 then
        -- A new owner: drop the clocks that limit nothing any more, and
        -- make the set last as long as the bucket. (Between new owners it
        -- may expire first: the clocks start afresh, fairness only.)
        redis.call('ZREMRANGEBYSCORE', S, '-inf', '(' .. fmtf(floor))
        shares_touched = true
      end
    end
    granted = g
  else
    retry = retry_after(need + pfloor)
    if share_wait > 0 and retry >= 0 then
      local ms = math.floor((share_wait + 999) / 1000)
      if ms > retry then retry = ms end
    end
    if not recs[field] then
      -- A waiter holds a lease of nothing for one TTL, so that the others'
      -- fair share counts it while it waits.
      local e = now + ttl
      open_lease('- 0 ' .. fmtd(e), 0, e)
      index_add(field, e)
    end
  end
end
save()
return { 0, granted, retry, remaining(), h, settled, expired, reset_ms(), delay }
