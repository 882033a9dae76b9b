-- Token bucket with leases: the Redis twin of tokenbucket.go. Both must do
-- the same floating-point operations in the same order; the conformance
-- suite in leases/storetest checks that both stores answer alike.
--
-- KEYS[1]  bucket hash: l (level, %.17g), t (last refill, µs), o (outstanding)
-- KEYS[2]  leases hash: "<slot>|<owner>" -> "<lease id> <granted> <expiry µs>",
--          and "t|<owner>" -> the owner's fair-share clock (µs, %.17g)
-- ARGV     1 mode (lease|take|refund|state), 2 now µs ("" = Redis TIME),
--          3 limit, 4 period µs, 5 burst, 6 lease ttl µs, 7 owner,
--          8 want or cost, 9 lease id to settle, 10 used, 11 new lease id,
--          12 slot (0 or 1)
--
-- Both keys carry the hash tag of the bucket key, so they live in one slot.

if redis.replicate_commands then redis.replicate_commands() end

local mode = ARGV[1]
local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local limit = tonumber(ARGV[3])
local period = tonumber(ARGV[4])
local burst = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local rate = limit / period
local eps = 1e-9

local st = redis.call('HMGET', KEYS[1], 'l', 't', 'o')
local level, last, out
if st[1] then
  level = tonumber(st[1])
  last = tonumber(st[2])
  out = tonumber(st[3])
else
  level = burst
  last = now
  out = 0
end

-- Open leases; expired ones are closed without credit.
local leases = {}
local expired = 0
local raw = redis.call('HGETALL', KEYS[2])
local dels = {}
local shares = {} -- owner -> fair-share clock (µs)
local share_floor = now - burst / rate
for i = 1, #raw, 2 do
  if string.sub(raw[i], 1, 2) == 't|' then
    -- "t|<owner>" -> the owner's fair-share clock, kept until it falls
    -- burst/rate behind now (then it limits nothing).
    local vt = tonumber(raw[i + 1])
    if vt == nil or vt <= share_floor then
      dels[#dels + 1] = raw[i]
    else
      shares[string.sub(raw[i], 3)] = vt
    end
  else
  local id, g, exp = string.match(raw[i + 1], '^(%S+) (%d+) (%d+)$')
  g = tonumber(g)
  exp = tonumber(exp)
  if exp <= now then
    out = out - g
    expired = expired + 1
    dels[#dels + 1] = raw[i]
  else
    local slot, who = string.match(raw[i], '^(%d)|(.*)$')
    leases[#leases + 1] = { field = raw[i], owner = who, slot = slot, id = id, g = g, exp = exp }
  end
  end
end

-- Close the expired leases now, before an owner's new lease may take the
-- same field.
if mode ~= 'state' and #dels > 0 then
  redis.call('HDEL', KEYS[2], unpack(dels))
end

-- Refill.
if now > last then
  level = level + rate * (now - last)
  last = now
end
if level > burst - out then
  level = burst - out
end
if level < 0 then
  level = 0
end

local function remaining()
  if level <= 0 then return 0 end
  return math.floor(level + eps)
end

local function retry_after(target)
  if target > burst then return -1 end
  local wait = 0
  local need = target - level
  if need > 0 then
    wait = math.ceil(need / rate - 1e-6)
  end
  if burst - out < target then
    local sorted = {}
    for i = 1, #leases do sorted[i] = leases[i] end
    table.sort(sorted, function(a, b) return a.exp < b.exp end)
    local o = out
    for i = 1, #sorted do
      o = o - sorted[i].g
      if burst - o >= target then
        if sorted[i].exp - now > wait then wait = sorted[i].exp - now end
        break
      end
    end
  end
  if wait <= 0 then return 0 end
  return math.floor((wait + 999) / 1000)
end

local function save()
  redis.call('HSET', KEYS[1], 'l', string.format('%.17g', level), 't', string.format('%d', last), 'o', string.format('%d', out))
  -- A full bucket with no lease is the same as no key: expire both keys
  -- once the bucket can have refilled and every lease has ended.
  local full_ms = 0
  if burst - level > 0 then full_ms = math.ceil((burst - level) / rate / 1000) end
  local px = full_ms + math.ceil(ttl / 1000) + 1000
  redis.call('PEXPIRE', KEYS[1], px)
  redis.call('PEXPIRE', KEYS[2], px)
end

if mode == 'state' then
  return { string.format('%.17g', level), out, #leases, string.format('%d', now) }
end

if mode == 'take' then
  local cost = tonumber(ARGV[8])
  local taken, retry = 0, 0
  if cost == 0 or level + eps >= cost then
    level = level - cost
    taken = 1
  else
    retry = retry_after(cost)
  end
  save()
  return { taken, retry, remaining(), expired }
end

if mode == 'refund' then
  local cost = tonumber(ARGV[8])
  level = level + cost
  if level > burst - out then level = burst - out end
  save()
  return {}
end

-- mode == 'lease'
local owner = ARGV[7]
local want = tonumber(ARGV[8])
local settle_id = ARGV[9]
local used = tonumber(ARGV[10])
local new_id = ARGV[11]
local slot = ARGV[12]
local field = slot .. '|' .. owner

local mine = nil
local base = shares[owner] or share_floor -- this owner's fair-share clock
for i = 1, #leases do
  if leases[i].field == field then mine = i end
end

local settled = 0
if settle_id ~= '' then
  if mine == nil or leases[mine].id ~= settle_id then
    save()
    return { 1, 0, 0, 0, 0, 0, expired }
  end
  local l = leases[mine]
  if used > l.g then
    save()
    return { 2, 0, 0, 0, 0, 0, expired }
  end
  out = out - l.g
  level = level + (l.g - used)
  table.remove(leases, mine)
  redis.call('HDEL', KEYS[2], field)
  settled = 1
elseif mine ~= nil then
  -- A new lease replaces the open one, which counts as fully spent.
  out = out - leases[mine].g
  table.remove(leases, mine)
  redis.call('HDEL', KEYS[2], field)
  expired = expired + 1
end

-- Holders: owners with an open lease (two slots count once), plus this one.
local seen = {}
local holders = 1
for i = 1, #leases do
  local who = leases[i].owner
  if who ~= owner and not seen[who] then
    seen[who] = true
    holders = holders + 1
  end
end
local granted, retry = 0, 0
local share_wait = 0
local shared = false
local share = 0
if want > 0 then
  local g = want
  if holders > 1 then
    -- Fair share: at most burst/holders per lease, and at most the
    -- owner's share of the refill since its share clock, plus whatever the
    -- bucket holds above a quarter full (0 when it asks again too soon).
    local fair = math.floor(burst / holders)
    if fair < 1 then fair = 1 end
    if fair < g then g = fair end
    share = rate * (now - base) / holders
    local spare = 0
    if level > burst / 4 then spare = math.floor(level - burst / 4) end
    local capf = share + spare
    local cap = math.floor(capf)
    if cap < g then g = cap end
    if g < 1 then
      -- Too soon: the owner's share has not reached a token.
      share_wait = math.ceil((1 - capf) * holders / rate)
    end
    shared = true
  end
  local avail = 0
  if level > 0 then avail = math.floor(level + eps) end
  if avail < g then g = avail end
  if g > 0 then
    level = level - g
    out = out + g
    redis.call('HSET', KEYS[2], field, new_id .. ' ' .. string.format('%d', g) .. ' ' .. string.format('%d', now + ttl))
    if shared then
      -- The clock advances by the tokens taken from the share; tokens
      -- taken from the spare above a quarter full are free.
      local adv = g
      if share < adv then adv = share end
      redis.call('HSET', KEYS[2], 't|' .. owner, string.format('%.17g', base + adv * holders / rate))
    end
    granted = g
  else
    retry = retry_after(1)
    if share_wait > 0 then
      local ms = math.floor((share_wait + 999) / 1000)
      if ms > retry then retry = ms end
    end
  end
end
save()
return { 0, granted, retry, remaining(), holders, settled, expired }
