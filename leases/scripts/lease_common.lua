-- The beginning every algorithm's script shares: the Redis store runs this
-- followed by the algorithm's script (token_bucket.lua, leaky_bucket.lua,
-- or window_leases.lua and a window algorithm's body) as one script, so
-- that what they all do alike is written once: the clock, the formatting
-- of numbers, chunked calls, and the bookkeeping of the open leases'
-- holders. Keys, arguments and replies: see token_bucket.lua.
--
-- A lease is a field of the bucket's hash H, "<slot>|<client>/<process>"
-- (slot 0 or 1: a process holds at most two leases of a key, the one it
-- spends and the one that replaces it), whose value, the lease's record,
-- is the algorithm's. The holders are counted per client: "p|<client>"
-- holds the number of its processes holding a lease, and each algorithm
-- keeps the number of clients holding one (clients, below) in a field of
-- its own. Every record and count a script reads goes into the tables
-- below, and save writes back those that changed (pending_writes).
--
-- Numbers passed to Redis are formatted with fmtd/fmtf: Lua's own
-- conversion keeps 14 digits, too few for a time in µs.

if redis.replicate_commands then redis.replicate_commands() end

local H, Z = KEYS[1], KEYS[2]
local mode = ARGV[1]
local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local ttl = tonumber(ARGV[6])
local pfloor = tonumber(ARGV[17]) or 0 -- the priority floor (LeaseOp.Floor)
local eps = 1e-9
local dry = mode == 'state'

local function fmtd(x) return string.format('%d', x) end

-- fmtf formats x as the shortest decimal that reads back as x.
local function fmtf(x)
  local s = string.format('%.15g', x)
  if tonumber(s) ~= x then
    s = string.format('%.16g', x)
    if tonumber(s) ~= x then s = string.format('%.17g', x) end
  end
  return s
end

-- Lua passes at most a few thousand values to one call (unpack): a key
-- whose thousands of leases expire together must not fail on that, so
-- long argument lists go in chunks.
local CHUNK = 1000

-- call_chunked runs cmd on key with items, CHUNK items a call, and returns
-- the replies joined.
local function call_chunked(cmd, key, items)
  local out = {}
  for i = 1, #items, CHUNK do
    local part = {}
    for j = i, math.min(i + CHUNK - 1, #items) do part[#part + 1] = items[j] end
    local r = redis.call(cmd, key, unpack(part))
    if type(r) == 'table' then
      for j = 1, #r do out[#out + 1] = r[j] end
    end
  end
  return out
end

-- The asking owner of a lease call, its lease field in its slot (field)
-- and in the other (ofield), and what it asks: want tokens in a new lease
-- new_id, after settling lease settle_id of its slot ('' for none) with
-- used spent, within max_leases open leases of the key and max_procs
-- processes of its client holding one.
local client, process, slot, owner, field, ofield
local want, settle_id, used, new_id, max_leases, max_procs
if mode == 'lease' then
  client, process, slot = ARGV[7], ARGV[8], ARGV[13]
  owner = client .. '/' .. process
  field = slot .. '|' .. owner
  if slot == '0' then ofield = '1|' .. owner else ofield = '0|' .. owner end
  want, settle_id, used, new_id = tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11]), ARGV[12]
  max_leases, max_procs = tonumber(ARGV[14]), tonumber(ARGV[15])
end

-- The open leases as the algorithm reads them and the call changes them.
local out, n, maxexp = 0, 0, 0 -- outstanding (Σ granted), open leases, upper bound of their expiries
local clients = 0       -- clients holding open leases
local changed = false   -- the state changed beyond what the next call recomputes
local expired = 0       -- leases this call closed at their expiry (or replaced)
local recs = {}   -- lease field -> record, or false when none
local pend = {}   -- lease fields to write at save: a record, or false to delete
local pc = {}     -- client -> processes holding
local pdirty = {} -- clients whose count changed

-- sibling returns the field of the same owner's lease in the other slot;
-- client_of the client of a lease field. Both return nil for a field of
-- no slot (token_bucket.lua's ghost lease, "g|").
local function sibling(f)
  local s = string.sub(f, 1, 1)
  if s == '0' then return '1' .. string.sub(f, 2) end
  if s == '1' then return '0' .. string.sub(f, 2) end
  return nil
end

local function client_of(f)
  local rest = string.sub(f, 3)
  local i = string.find(rest, '/', 1, true)
  if not i then return nil end
  return string.sub(rest, 1, i - 1)
end

-- adj changes the count of client c's processes holding by d, and the
-- count of clients holding with it.
local function adj(c, d)
  local old = pc[c]
  local new = old + d
  if old == 0 and new > 0 then clients = clients + 1 end
  if old > 0 and new <= 0 then clients = clients - 1 end
  pc[c] = new
  pdirty[c] = true
end

-- load_recs loads the records of fs and of their siblings into recs.
local function load_recs(fs)
  local fields = {}
  for i = 1, #fs do
    local f = fs[i]
    if recs[f] == nil then fields[#fields + 1] = f end
    local sib = sibling(f)
    if sib and recs[sib] == nil then fields[#fields + 1] = sib end
  end
  if #fields > 0 then
    local vals = call_chunked('HMGET', H, fields)
    for i = 1, #fields do
      if recs[fields[i]] == nil then recs[fields[i]] = vals[i] end
    end
  end
end

-- load_counts loads into pc the process counts of the clients of fs that
-- it does not hold yet, in one HMGET.
local function load_counts(fs)
  local cs, seen = {}, {}
  for i = 1, #fs do
    local c = client_of(fs[i])
    if c and pc[c] == nil and not seen[c] then
      seen[c] = true
      cs[#cs + 1] = c
    end
  end
  if #cs > 0 then
    local pf = {}
    for i = 1, #cs do pf[i] = 'p|' .. cs[i] end
    local pv = call_chunked('HMGET', H, pf)
    for i = 1, #cs do pc[cs[i]] = tonumber(pv[i]) or 0 end
  end
end

-- close_lease closes the lease in field f of grant g, whose record and its
-- sibling's are loaded: its record is deleted at save, and its owner no
-- longer counts as a holder unless it holds the other slot. The caller
-- credits what the algorithm gives back and drops f from the expiry index.
local function close_lease(f, g)
  changed = true
  out = out - g
  n = n - 1
  recs[f] = false
  pend[f] = false
  local sib = sibling(f)
  if sib and not recs[sib] then adj(client_of(f), -1) end
  if n <= 0 then maxexp = 0 end
end

-- open_lease records the asking owner's lease of g tokens in its slot
-- (rec, expiring at e); the caller indexes it.
local function open_lease(rec, g, e)
  if not (recs[field] or recs[ofield]) then adj(client, 1) end
  changed = true
  out = out + g
  n = n + 1
  if e > maxexp then maxexp = e end
  recs[field] = rec
  pend[field] = rec
end

-- asker_holders returns whether the asking owner holds a lease in either
-- slot and the holders as it counts them: the clients holding, itself
-- included, times the processes of its client holding, itself included.
local function asker_holders()
  local holds = recs[field] or recs[ofield]
  local hc, hp = clients, pc[client]
  if hp == 0 then hc = hc + 1 end
  if not holds then hp = hp + 1 end
  return holds, hc * hp
end

-- count_owners counts the distinct owners of the lease fields fs.
local function count_owners(fs)
  local seen, k = {}, 0
  for i = 1, #fs do
    local f = fs[i]
    local s = string.sub(f, 1, 2)
    if (s == '0|' or s == '1|') and not seen[string.sub(f, 3)] then
      seen[string.sub(f, 3)] = true
      k = k + 1
    end
  end
  return k
end

-- pending_writes adds the lease records and process counts that changed to
-- args (HSET field-value pairs) and dels (HDEL fields).
local function pending_writes(args, dels)
  for f, v in pairs(pend) do
    if v then
      args[#args + 1] = f; args[#args + 1] = v
    else
      dels[#dels + 1] = f
    end
  end
  for c in pairs(pdirty) do
    if pc[c] > 0 then
      args[#args + 1] = 'p|' .. c; args[#args + 1] = fmtd(pc[c])
    else
      dels[#dels + 1] = 'p|' .. c
    end
  end
end
