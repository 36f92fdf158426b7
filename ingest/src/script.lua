-- One call per batch: decides, for each point, whether it becomes the courier's last location,
-- and writes the winners. Runs atomically, so workers that receive consecutive points of one
-- courier (a shared subscription hands them out round robin) cannot overwrite a newer point
-- with an older one.
--
-- KEYS: 1 live (GEO), 2 seen (ZSET), 3 order (HASH courier -> his orders, comma-separated),
--       4 seq (HASH courier -> state),
--       5 this batch's record: its reply, kept 30 s (retries stop after ingest.redis_retry_for,
--       at most 20 s). A batch retried after a response timeout (Redis had applied it) gets the
--       reply of its first run back instead of being judged again, when every point would be
--       stale (its own seq) and no track sent.
--       6 order:places (HASH), 7 order:tenant (HASH), 8 events (STREAM), 9 events:dropped
-- ARGV: 1 now (server unix seconds), 2 reset_after (seconds), 3 the batch, one MessagePack
--       array (ingest/src/batch.rs, script_call): per courier, each once, in the order of his
--       first entry: id, n, then his n entries in batch order, three values each: seq, ts and
--       the location's GEO score (as a string: the 52-bit geohash GEOADD would store, computed
--       by ingest, so a plain ZADD writes it). An `offline` status is false, false, false: the
--       courier leaves the live index at once.
--       4 seen_every (seconds; 0: every point), 5 the events stream's cap
--       (courier_wire::events; 0: no events)
-- State per courier, packed: struct.pack('<Bdddd', tag, seq, phone_ts, epoch_ts, server_ts),
-- where epoch_ts is the phone time of the first point since the last seq reset and server_ts
-- the server time of his last accepted point; tag 1: his `seen` score lies in the same
-- seen_every bucket as server_ts, tag 2: his `offline` took him out of live and seen. The text
-- form "seq|phone_ts|epoch_ts|server_ts" of earlier versions is read too (it starts with a
-- digit) and counts as tag 2.
-- `seen` is written for an accepted courier only when (so it stays within one bucket of
-- server_ts, the true last-seen time, which the eviction sweep confirms against):
--   no state, tag 2 or text state                   -> ZADD seen now
--   floor(now / seen_every) ~= floor(server_ts / seen_every), or seen_every = 0
--                                                   -> ZADD seen now
--   same bucket as his last accepted point          -> nothing (the score there is in it)
-- Rule for a point (s, p):
--   no state                                        -> accept (new epoch)
--   s > seq and p >= epoch_ts                       -> accept
--   s <= seq and p > phone_ts and
--     now - server_ts >= reset_after                -> accept as a seq reset (new epoch)
--   anything else                                   -> stale (older, duplicate, or a replay of
--                                                      the epoch before a reset)
-- A courier's entries are judged in turn, each against the state the one before left; only his
-- last accepted point reaches live and seen (an earlier one would be overwritten in the same
-- call), unless an `offline` after it removes him.
-- Returns { codes, then courier, orders, places for each courier with an accepted point and an
-- order }: codes holds one character per entry in the order above ('0' stale, '1' accepted,
-- '2' accepted as reset, '3' offline handled); courier counts from 1 in the order above; orders
-- is his courier:order value; places an array, one order:places value (or nil) per order of
-- it, from one HMGET for the batch: ingest decides arrival from them (ingest/src/arrival.rs).
-- A courier removed by his `offline` while carrying orders emits `courier.offline_during_order`
-- for each.
local live, seen, orders, seqs, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local places_key, tenants, events, dropped = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local done = redis.call('GET', record)
if done then
  return cmsgpack.unpack(done)
end
local now_s = ARGV[1]
local now = tonumber(now_s)
local reset_after = tonumber(ARGV[2])
local a = cmsgpack.unpack(ARGV[3])
local every = tonumber(ARGV[4])
local floor = math.floor
local len = #a

-- Every courier's state and order in two calls for the whole batch.
local ids, at, nc = {}, {}, 0
local i = 1
while i <= len do
  nc = nc + 1
  ids[nc] = a[i]
  at[nc] = i
  i = i + 2 + 3 * a[i + 1]
end
local raws = redis.call('HMGET', seqs, unpack(ids))
local carried = redis.call('HMGET', orders, unpack(ids))

local pack, unpack_state, match, byte = struct.pack, struct.unpack, string.match, string.byte
local codes, out, ncodes, nout = {}, { false }, 0, 1
local geo, zs, hs, gone = {}, {}, {}, {} -- ZADD live, ZADD seen, HSET seq, ZREM both
local offline = {} -- order, courier of each order whose courier went offline
local ngeo, nzs, nhs, ngone = 0, 0, 0, 0
for c = 1, nc do
  local id = ids[c]
  local j = at[c]
  local last = j + 2 + 3 * a[j + 1]
  -- The courier's state: have, seq, phone_ts, epoch_ts, server_ts.
  local have, seq, pts, ets, sts = false, 0, 0, 0, 0
  local listed = false -- tag 1: his seen score is in the bucket of sts
  local raw = raws[c]
  if raw then
    local tag = byte(raw)
    if #raw == 33 and (tag == 1 or tag == 2) then
      have, listed = true, tag == 1
      local _
      _, seq, pts, ets, sts = unpack_state('<Bdddd', raw)
    else
      local s1, s2, s3, s4 = match(raw, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)$')
      if s1 then
        seq, pts, ets, sts = tonumber(s1), tonumber(s2), tonumber(s3), tonumber(s4)
        have = seq ~= nil and pts ~= nil and ets ~= nil and sts ~= nil
      end
    end
  end
  local was_listed, last_sts = listed, sts
  local changed, accepted, final = false, false, 0 -- final: 0 nothing, -1 offline, k the point
  for k = j + 2, last - 1, 3 do
    local s = a[k]
    if s == false then
      ncodes = ncodes + 1
      codes[ncodes] = '3'
      final = -1
    else
      local p = a[k + 1]
      local code
      if not have then
        code = '1'
        ets = p
      elseif s > seq and p >= ets then
        code = '1'
      elseif s <= seq and p > pts and now - sts >= reset_after then
        code = '2'
        ets = p
      end
      if code then
        have, seq, pts, sts = true, s, p, now
        changed, accepted, final = true, true, k
      else
        code = '0'
      end
      ncodes = ncodes + 1
      codes[ncodes] = code
    end
  end
  if final > 0 then
    geo[ngeo + 1] = a[final + 2]
    geo[ngeo + 2] = id
    ngeo = ngeo + 2
    if not listed or every <= 0 or floor(now / every) ~= floor(last_sts / every) then
      zs[nzs + 1] = now_s
      zs[nzs + 2] = id
      nzs = nzs + 2
    end
    listed = true
  elseif final < 0 then
    ngone = ngone + 1
    gone[ngone] = id
    listed = false
  end
  if changed or (have and listed ~= was_listed) then
    hs[nhs + 1] = id
    hs[nhs + 2] = pack('<Bdddd', listed and 1 or 2, seq, pts, ets, sts)
    nhs = nhs + 2
  end
  local order = carried[c]
  if order and order ~= '' then
    if final < 0 then
      for o in string.gmatch(order, '[^,]+') do
        offline[#offline + 1] = o
        offline[#offline + 1] = id
      end
    end
    if accepted then
      out[nout + 1] = c
      out[nout + 2] = order
      out[nout + 3] = false
      nout = nout + 3
    end
  end
end

-- The places of every order of the couriers above, in one HMGET.
if nout > 1 then
  local names, slots = {}, {}
  for k = 3, nout, 3 do
    local first = #names + 1
    for o in string.gmatch(out[k], '[^,]+') do
      names[#names + 1] = o
    end
    slots[k] = first
  end
  local got = redis.call('HMGET', places_key, unpack(names))
  for k = 3, nout, 3 do
    local p, n = {}, 0
    for q = slots[k], (slots[k + 3] or (#names + 1)) - 1 do
      n = n + 1
      p[n] = got[q]
    end
    out[k + 1] = p
  end
end
for k = 1, #offline, 2 do
  local o, id = offline[k], offline[k + 1]
  emit(events, dropped, ARGV[5], 'courier.offline_during_order',
    'courier.offline_during_order:' .. o .. ':' .. id .. ':' .. math.floor(now), o, id,
    redis.call('HGET', tenants, o) or 'default', now_s)
end

if ngone > 0 then
  redis.call('ZREM', live, unpack(gone))
  redis.call('ZREM', seen, unpack(gone))
end
if ngeo > 0 then
  redis.call('ZADD', live, unpack(geo))
end
if nzs > 0 then
  redis.call('ZADD', seen, unpack(zs))
end
if nhs > 0 then
  redis.call('HSET', seqs, unpack(hs))
end
out[1] = table.concat(codes)
redis.call('SET', record, cmsgpack.pack(out), 'EX', 30)
return out
