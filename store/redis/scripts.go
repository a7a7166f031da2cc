package redis

import goredis "github.com/redis/go-redis/v9"

// The Lua scripts. Names of keys follow docs/redis.md: for a pod, pp is
// "{<prefix>p:<pod>}", its state pp.."s", lease pp.."l", engine-hash map
// pp.."e" and membership buckets pp.."m:00" to pp.."m:ff"; a block is
// bp..<16 hex digits>, bp being "<prefix>b:". A pod's id is a decimal
// string, the field of its holdings. Applied seqs travel as 20-digit
// zero-padded decimals, which Lua compares in two halves (its numbers are
// doubles). Membership entries are the keys as signed 64-bit decimals, so
// that Redis keeps a bucket as an intset of 8 bytes an entry; dec2hex
// turns one back into the hex of its block key (and its last two digits
// name its bucket).
//
// Scripts that only run on a single node build key names from ARGV:
// Redis checks the keys a script touches only in cluster mode. The
// cluster scripts touch only keys of one pod's hash tag.

const luaPrelude = `
local function dec2hex(s)
  local neg = string.byte(s, 1) == 45
  if neg then s = string.sub(s, 2) end
  local len = #s
  local A, B = 0, 0
  if len > 9 then
    A = tonumber(string.sub(s, 1, len - 9))
    B = tonumber(string.sub(s, len - 8))
  else
    B = tonumber(s)
  end
  local A0 = A % 65536
  local X = (A - A0) / 65536 * 1000000000
  local Xl = X % 65536
  local Y = Xl * 65536 + A0 * 1000000000 + B
  local lo = Y % 4294967296
  local hi = (X - Xl) / 65536 + (Y - lo) / 4294967296
  if neg then
    if lo == 0 then
      hi = (4294967296 - hi) % 4294967296
    else
      lo = 4294967296 - lo
      hi = 4294967295 - hi
    end
  end
  return string.format('%08x%08x', hi, lo)
end

local function seqle(a, b)
  local ah, bh = tonumber(string.sub(a, 1, 10)), tonumber(string.sub(b, 1, 10))
  if ah ~= bh then return ah < bh end
  return tonumber(string.sub(a, 11)) <= tonumber(string.sub(b, 11))
end

-- lease takes or refreshes the lease lk for owner, or returns the other
-- owner holding it.
-- dropHoldings takes up to left of pod id's holdings away: members popped
-- from its buckets (prefix mp), their holders' fields deleted (block
-- prefix bp), its count n in state sk kept. It returns how much of left
-- is unused: 0 when the chunk was full and holdings may remain.
local function dropHoldings(sk, mp, bp, id, left)
  local popped = 0
  for x = 0, 255 do
    local ms = redis.call('SPOP', mp .. string.format('%02x', x), left)
    for j = 1, #ms do redis.call('HDEL', bp .. dec2hex(ms[j]), id) end
    popped = popped + #ms
    left = left - #ms
    if left == 0 then break end
  end
  if popped > 0 then
    local n = tonumber(redis.call('HGET', sk, 'n') or '0') - popped
    if n > 0 then redis.call('HSET', sk, 'n', n) else redis.call('HDEL', sk, 'n') end
  end
  return left
end

local function lease(lk, owner, ms)
  local cur = redis.call('GET', lk)
  if cur and cur ~= owner then return cur end
  redis.call('SET', lk, owner, 'PX', ms)
  return nil
end
`

// applyScript applies one batch on a single node.
//
// KEYS: state, lease, engine map, pod id hash. ARGV: owner, lease ms,
// seq, pod id, membership prefix (pp.."m:"), block prefix, block TTL ms
// (0: none), pod name, number of ops, then each op: a code (kind a/r/c,
// mode k/p/e, tier bit), an entry count and its entries: mode k: block
// key, dec; p: block key, dec, engine hash; e: engine hash.
//
// Returns {'ok', removed, unknown}, {'dup', applied seq}, {'owner',
// other} or {'id', id}: the pod's id is not the one given (the server
// lost its data since the caller learned it), and nothing changed.
var applyScript = goredis.NewScript(luaPrelude + `
local call = redis.call
local sk, lk, ek = KEYS[1], KEYS[2], KEYS[3]
local id, mp, bp = ARGV[4], ARGV[5], ARGV[6]
local ttl = tonumber(ARGV[7])
local cur = call('HGET', KEYS[4], ARGV[8])
if cur ~= id then return {'id', cur or ''} end
local other = lease(lk, ARGV[1], ARGV[2])
if other then return {'owner', other} end
local qn = call('HMGET', sk, 'q', 'n')
local q = qn[1]
if q and seqle(ARGV[3], q) then return {'dup', q} end

local removed, unknown, dn, paired = 0, 0, 0, 0
local n0 = tonumber(qn[2] or '0')
-- bucket names by the last two hex digits of a block key
local buckets = setmetatable({}, {__index = function(t, x)
  local v = mp .. x
  t[x] = v
  return v
end})

local function add(bk, dec, b)
  if call('HSETNX', bk, id, b) == 1 then
    if call('SADD', buckets[string.sub(bk, -2)], dec) == 1 then dn = dn + 1 end
  else
    local m = tonumber(call('HGET', bk, id))
    if bit.band(m, b) == 0 then call('HSET', bk, id, m + b) end
  end
  if ttl > 0 then call('PEXPIRE', bk, ttl) end
end

-- remove takes tier bit b off the pod's holding of a block and returns
-- the mask left, or false when the pod did not hold it at all.
local function remove(bk, dec, b)
  local m = call('HGET', bk, id)
  if not m then
    unknown = unknown + 1
    return false
  end
  m = tonumber(m)
  if bit.band(m, b) == 0 then
    unknown = unknown + 1
    return m
  end
  removed = removed + 1
  m = m - b
  if m == 0 then
    call('HDEL', bk, id)
    if call('SREM', buckets[string.sub(bk, -2)], dec) == 1 then dn = dn - 1 end
  else
    call('HSET', bk, id, m)
  end
  return m
end

local function clearAll()
  if n0 + dn > 0 then
    for x = 0, 255 do
      local mk = mp .. string.format('%02x', x)
      local ms = call('SMEMBERS', mk)
      if #ms > 0 then
        for j = 1, #ms do call('HDEL', bp .. dec2hex(ms[j]), id) end
        call('DEL', mk)
        dn = dn - #ms
      end
    end
  end
  call('UNLINK', ek)
  call('HDEL', sk, 'ec')
end

local i = 10
for _ = 1, tonumber(ARGV[9]) do
  local code, cnt = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local kind, mode, b = string.sub(code, 1, 1), string.sub(code, 2, 2), tonumber(string.sub(code, 3, 3))
  if kind == 'c' then
    clearAll()
  elseif mode == 'k' then
    local f = kind == 'a' and add or remove
    for _ = 1, cnt do
      f(ARGV[i], ARGV[i + 1], b)
      i = i + 2
    end
  elseif mode == 'p' then
    local kv = {}
    for j = 1, cnt do
      add(ARGV[i], ARGV[i + 1], b)
      kv[#kv + 1] = ARGV[i + 2]
      kv[#kv + 1] = ARGV[i + 1]
      i = i + 3
      if j % 2000 == 0 or j == cnt then
        call('HSET', ek, unpack(kv))
        kv = {}
      end
    end
    paired = paired + cnt
  else
    for _ = 1, cnt do
      local e = ARGV[i]
      i = i + 1
      local dec = call('HGET', ek, e)
      if not dec then
        unknown = unknown + 1
      else
        local bk = bp .. dec2hex(dec)
        if kind == 'r' then
          local m = remove(bk, dec, b)
          if not m or m == 0 then call('HDEL', ek, e) end
        else
          local m = call('HGET', bk, id)
          if not m then
            unknown = unknown + 1
            call('HDEL', ek, e)
          else
            m = tonumber(m)
            if bit.band(m, b) == 0 then call('HSET', bk, id, m + b) end
            if ttl > 0 then call('PEXPIRE', bk, ttl) end
          end
        end
      end
    end
  end
end

-- Pairs whose key went other than by a removal by engine hash are swept
-- while the map is over twice the pod's blocks: a few entries for each
-- pair added, from a cursor kept in the state.
if paired > 0 then
  local nn = n0 + dn
  if call('HLEN', ek) > 2 * nn + 256 then
    local r = call('HSCAN', ek, call('HGET', sk, 'ec') or '0', 'COUNT', math.max(16, 2 * paired))
    local kv = r[2]
    for j = 1, #kv, 2 do
      if call('HEXISTS', bp .. dec2hex(kv[j + 1]), id) == 0 then call('HDEL', ek, kv[j]) end
    end
    if r[1] == '0' then call('HDEL', sk, 'ec') else call('HSET', sk, 'ec', r[1]) end
  end
end

if n0 + dn > 0 then
  call('HSET', sk, 'q', ARGV[3], 'n', n0 + dn)
else
  call('HSET', sk, 'q', ARGV[3])
  call('HDEL', sk, 'n')
end
return {'ok', removed, unknown}
`)

// lookupScript walks a query on a single node.
//
// ARGV: pod key start ("{<prefix>p:"), pod id hash, pod name hash, the
// number of keys n, the n block keys' names, then the candidate pod names
// (none: every pod).
//
// Returns name, blocks, GPU, CPU and disk blocks, stale (0 or 1) for each
// pod matching at least one block.
var lookupScript = goredis.NewScript(`#!lua flags=no-writes
local call = redis.call
local nkeys = tonumber(ARGV[4])
local filter = nil
if #ARGV > 4 + nkeys then
  filter = {}
  local names = {}
  for j = 5 + nkeys, #ARGV do names[#names + 1] = ARGV[j] end
  local any = false
  for s = 1, #names, 1000 do
    local ids = call('HMGET', ARGV[2], unpack(names, s, math.min(s + 999, #names)))
    for j = 1, #ids do
      if ids[j] then
        filter[ids[j]] = true
        any = true
      end
    end
  end
  if not any then return {} end
end
-- the count index of a mask's fastest tier: GPU 2, CPU 3, disk 4
local low = {['1'] = 2, ['2'] = 3, ['3'] = 2, ['4'] = 4, ['5'] = 2, ['6'] = 3, ['7'] = 2}
local alive, na = {}, 0
local cnt = {}
local h = call('HGETALL', ARGV[5])
for j = 1, #h, 2 do
  local id = h[j]
  if filter == nil or filter[id] then
    local c = {1, 0, 0, 0}
    local t = low[h[j + 1]]
    c[t] = 1
    cnt[id] = c
    na = na + 1
    alive[na] = id
  end
end
local i = 6
local last = 4 + nkeys
while na == 1 and i <= last do
  -- One candidate left (a prompt held by one pod): one HGET a key.
  local id = alive[1]
  local c = cnt[id]
  while i <= last do
    local m = call('HGET', ARGV[i], id)
    if not m then
      na = 0
      break
    end
    local t = low[m]
    c[1] = c[1] + 1
    c[t] = c[t] + 1
    i = i + 1
  end
end
while na > 1 and i <= last do
  h = call('HGETALL', ARGV[i])
  local hm = {}
  for j = 1, #h, 2 do hm[h[j]] = h[j + 1] end
  local k = 0
  for j = 1, na do
    local id = alive[j]
    local m = hm[id]
    if m then
      local c = cnt[id]
      local t = low[m]
      c[1] = c[1] + 1
      c[t] = c[t] + 1
      k = k + 1
      alive[k] = id
    end
  end
  na = k
  i = i + 1
  if na == 1 then
    local id = alive[1]
    local c = cnt[id]
    while i <= last do
      local m = call('HGET', ARGV[i], id)
      if not m then break end
      local t = low[m]
      c[1] = c[1] + 1
      c[t] = c[t] + 1
      i = i + 1
    end
    na = 0
  end
end
local out = {}
for id, c in pairs(cnt) do
  local name = call('HGET', ARGV[3], id)
  if name then
    local st = call('HGET', ARGV[1] .. name .. '}s', 'st')
    out[#out + 1] = name
    out[#out + 1] = c[1]
    out[#out + 1] = c[2]
    out[#out + 1] = c[3]
    out[#out + 1] = c[4]
    out[#out + 1] = st and 1 or 0
  end
end
return out
`)

// engineKeysScript resolves engine hashes through a pod's map on a single
// node: a hash resolves while the pod holds its key.
//
// KEYS: engine map. ARGV: pod id hash, pod name, block prefix, then the
// hashes. Returns one decimal key or false a hash.
var engineKeysScript = goredis.NewScript(`#!lua flags=no-writes
` + luaPrelude + `
local id = redis.call('HGET', ARGV[1], ARGV[2])
local out = {}
local hs = {}
for j = 4, #ARGV do hs[#hs + 1] = ARGV[j] end
if not id then
  for j = 1, #hs do out[j] = false end
  return out
end
for s = 1, #hs, 1000 do
  local ks = redis.call('HMGET', KEYS[1], unpack(hs, s, math.min(s + 999, #hs)))
  for j = 1, #ks do
    local dec = ks[j]
    if dec and redis.call('HEXISTS', ARGV[3] .. dec2hex(dec), id) == 0 then dec = false end
    out[s + j - 1] = dec
  end
end
return out
`)

// forgetScript forgets up to a chunk of a pod's blocks on a single node,
// and the pod itself (state and engine map; its lease and id stay) once
// none is left.
//
// KEYS: state, lease, engine map, pod id hash. ARGV: owner, lease ms, pod
// id, membership prefix, block prefix, chunk size, pod name. Returns
// {'more'}, {'done'}, {'owner', other} or {'id', id} (see applyScript).
var forgetScript = goredis.NewScript(luaPrelude + `
local sk, lk, ek = KEYS[1], KEYS[2], KEYS[3]
local id, mp, bp = ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HGET', KEYS[4], ARGV[7])
if cur ~= id then return {'id', cur or ''} end
local other = lease(lk, ARGV[1], ARGV[2])
if other then return {'owner', other} end
if dropHoldings(sk, mp, bp, id, tonumber(ARGV[6])) == 0 then return {'more'} end
redis.call('UNLINK', ek)
redis.call('DEL', sk)
return {'done'}
`)

// sweepScript drops, on a single node, the membership entries of buckets
// [from, to) whose block the pod no longer holds (it expired), and
// records the time of the sweep once to is 256.
//
// KEYS: state. ARGV: pod id, membership prefix, block prefix, from, to,
// now ms. Returns the pod's block count.
var sweepScript = goredis.NewScript(luaPrelude + `
local sk, id, mp, bp = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local gone = 0
for x = tonumber(ARGV[4]), tonumber(ARGV[5]) - 1 do
  local mk = mp .. string.format('%02x', x)
  local ms = redis.call('SMEMBERS', mk)
  for j = 1, #ms do
    if redis.call('HEXISTS', bp .. dec2hex(ms[j]), id) == 0 then
      redis.call('SREM', mk, ms[j])
      gone = gone + 1
    end
  end
end
local n = tonumber(redis.call('HGET', sk, 'n') or '0') - gone
if n > 0 then redis.call('HSET', sk, 'n', n) else redis.call('HDEL', sk, 'n') end
if ARGV[5] == '256' and redis.call('EXISTS', sk) == 1 then redis.call('HSET', sk, 'swt', ARGV[6]) end
return n
`)

// podIDScript returns a pod's id, allocating the next one the first time.
//
// KEYS: pod id hash [, pod name hash (single node only)]. ARGV: name.
var podIDScript = goredis.NewScript(`
local id = redis.call('HGET', KEYS[1], ARGV[1])
if id then return id end
id = tostring(redis.call('HINCRBY', KEYS[1], '', 1))
redis.call('HSET', KEYS[1], ARGV[1], id)
if KEYS[2] then redis.call('HSET', KEYS[2], id, ARGV[1]) end
return id
`)

// firstWinsScript sets a field unless it is set and returns its value.
//
// KEYS: hash. ARGV: field, value.
var firstWinsScript = goredis.NewScript(`
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], ARGV[1])
`)

// The cluster's scripts: each runs on one pod's slot.

// beginScript is step 1 of a batch on a cluster: lease, seq fence, the
// membership of the keys the batch adds, and what the batch reads of the
// pod's slot.
//
// KEYS: state, lease, engine map. ARGV: owner, lease ms, seq, membership
// prefix, n, then n (bucket, dec) pairs to add, m, then m engine hashes to
// resolve, clear ('1': return every member), pairs (how many engine-hash
// pairs the batch adds: when the map is over twice the pod's blocks, a
// chunk of it twice that size, at least 16, is returned to check).
//
// Returns {'ok', resolved (dec or false per hash), members, {cursor,
// engine, dec, ...}, had a seq (1 or 0)} or {'dup', seq} or {'owner',
// other}.
var beginScript = goredis.NewScript(luaPrelude + `
local sk, lk, ek, mp = KEYS[1], KEYS[2], KEYS[3], ARGV[4]
local other = lease(lk, ARGV[1], ARGV[2])
if other then return {'owner', other} end
local q = redis.call('HGET', sk, 'q')
if q and seqle(ARGV[3], q) then return {'dup', q} end
local i = 5
local n = tonumber(ARGV[i])
local dn = 0
for j = 1, n do
  dn = dn + redis.call('SADD', mp .. ARGV[i + 2 * j - 1], ARGV[i + 2 * j])
end
i = i + 2 * n + 1
if dn ~= 0 then redis.call('HINCRBY', sk, 'n', dn) end
local m = tonumber(ARGV[i])
local resolved = {}
for s = 1, m, 1000 do
  local hs = {}
  for j = s, math.min(s + 999, m) do hs[#hs + 1] = ARGV[i + j] end
  local ks = redis.call('HMGET', ek, unpack(hs))
  for j = 1, #ks do resolved[s + j - 1] = ks[j] end
end
i = i + m + 1
local members = {}
if ARGV[i] == '1' then
  for x = 0, 255 do
    local ms = redis.call('SMEMBERS', mp .. string.format('%02x', x))
    for j = 1, #ms do members[#members + 1] = ms[j] end
  end
end
local sweep = {}
local paired = tonumber(ARGV[i + 1])
if paired > 0 then
  local nn = tonumber(redis.call('HGET', sk, 'n') or '0')
  if redis.call('HLEN', ek) > 2 * nn + 256 then
    local r = redis.call('HSCAN', ek, redis.call('HGET', sk, 'ec') or '0', 'COUNT', math.max(16, 2 * paired))
    sweep[1] = r[1]
    for j = 1, #r[2] do sweep[j + 1] = r[2][j] end
  end
end
return {'ok', resolved, members, sweep, q and 1 or 0}
`)

// endScript is step 3 of a batch on a cluster: if the lease is still
// ours, the membership entries of blocks the batch left unheld go, the
// engine map changes, and the applied seq moves.
//
// KEYS: state, lease, engine map. ARGV: owner, lease ms, seq, membership
// prefix, clear ('1': the map goes first), n, n (engine, dec) pairs to
// set, m, m engine hashes to delete, k, k (bucket, dec) members to
// remove, sweep cursor (empty: unchanged).
//
// Returns {'ok'} or {'owner', other}.
var endScript = goredis.NewScript(luaPrelude + `
local sk, lk, ek, mp = KEYS[1], KEYS[2], KEYS[3], ARGV[4]
local other = lease(lk, ARGV[1], ARGV[2])
if other then return {'owner', other} end
if ARGV[5] == '1' then
  redis.call('UNLINK', ek)
  redis.call('HDEL', sk, 'ec')
end
local i = 6
local n = tonumber(ARGV[i])
for s = 1, n, 1000 do
  local kv = {}
  for j = s, math.min(s + 999, n) do
    kv[#kv + 1] = ARGV[i + 2 * j - 1]
    kv[#kv + 1] = ARGV[i + 2 * j]
  end
  redis.call('HSET', ek, unpack(kv))
end
i = i + 2 * n + 1
local m = tonumber(ARGV[i])
for j = 1, m do redis.call('HDEL', ek, ARGV[i + j]) end
i = i + m + 1
local k = tonumber(ARGV[i])
local dn = 0
for j = 1, k do
  dn = dn - redis.call('SREM', mp .. ARGV[i + 2 * j - 1], ARGV[i + 2 * j])
end
i = i + 2 * k + 1
local cur = ARGV[i]
if cur == '0' then redis.call('HDEL', sk, 'ec') elseif cur ~= '' then redis.call('HSET', sk, 'ec', cur) end
local nn = tonumber(redis.call('HGET', sk, 'n') or '0') + dn
if nn > 0 then
  redis.call('HSET', sk, 'q', ARGV[3], 'n', nn)
else
  redis.call('HSET', sk, 'q', ARGV[3])
  redis.call('HDEL', sk, 'n')
end
return {'ok'}
`)

// chunkScript serves the cluster's ForgetPod and sweep, which work a
// chunk at a time under the pod's lease: it removes the members the last
// chunk dealt with, then returns the next chunk, or, when forgetting and
// no member is left, forgets the pod's state and engine map.
//
// KEYS: state, lease, engine map. ARGV: owner, lease ms, membership
// prefix, mode ('forget' or 'sweep'), chunk size, from bucket, now ms,
// k, then k (bucket, dec) members to remove.
//
// Returns {'more', bucket reached, members...}, {'done'} or {'owner',
// other}. A sweep chunk is whole buckets from the given one.
var chunkScript = goredis.NewScript(luaPrelude + `
local sk, lk, ek, mp = KEYS[1], KEYS[2], KEYS[3], ARGV[3]
local other = lease(lk, ARGV[1], ARGV[2])
if other then return {'owner', other} end
local k = tonumber(ARGV[8])
local dn = 0
for j = 1, k do
  dn = dn - redis.call('SREM', mp .. ARGV[8 + 2 * j - 1], ARGV[8 + 2 * j])
end
if dn ~= 0 then
  local nn = tonumber(redis.call('HGET', sk, 'n') or '0') + dn
  if nn > 0 then redis.call('HSET', sk, 'n', nn) else redis.call('HDEL', sk, 'n') end
end
local limit = tonumber(ARGV[5])
local out = {'more', 0}
local x = tonumber(ARGV[6])
while x < 256 do
  local ms = redis.call('SMEMBERS', mp .. string.format('%02x', x))
  for j = 1, #ms do out[#out + 1] = ms[j] end
  x = x + 1
  if #out - 2 >= limit then break end
end
out[2] = x
if #out > 2 then return out end
if ARGV[4] == 'forget' then
  redis.call('UNLINK', ek)
  redis.call('DEL', sk)
elseif redis.call('EXISTS', sk) == 1 then
  redis.call('HSET', sk, 'swt', ARGV[7])
end
return {'done'}
`)

// clearChunkScript takes up to a chunk of a pod's blocks away, ahead of a
// batch that clears the pod on a single node, so that the batch's own
// script, which clears whatever is left, does not hold the server for the
// time a large pod's clear takes. It checks what applyScript checks first
// (pod id, lease, seq fence) and changes nothing when a check fails; the
// blocks it takes away are the clear's, which the batch's script then
// finishes (a batch failing after it is applied again from its seq, and
// converges).
//
// KEYS: state, lease, pod id hash. ARGV: owner, lease ms, seq, pod id,
// membership prefix, block prefix, chunk, pod name.
//
// Returns {'more'}, {'done'} (no block left), {'dup', applied seq},
// {'owner', other} or {'id', id}.
var clearChunkScript = goredis.NewScript(luaPrelude + `
local sk, lk = KEYS[1], KEYS[2]
local id, mp, bp = ARGV[4], ARGV[5], ARGV[6]
local cur = redis.call('HGET', KEYS[3], ARGV[8])
if cur ~= id then return {'id', cur or ''} end
local other = lease(lk, ARGV[1], ARGV[2])
if other then return {'owner', other} end
local q = redis.call('HGET', sk, 'q')
if q and seqle(ARGV[3], q) then return {'dup', q} end
if dropHoldings(sk, mp, bp, id, tonumber(ARGV[7])) == 0 then return {'more'} end
return {'done'}
`)

var allScripts = []*goredis.Script{
	applyScript, lookupScript, engineKeysScript, forgetScript, sweepScript, podIDScript, firstWinsScript,
	beginScript, endScript, chunkScript, clearChunkScript,
}
