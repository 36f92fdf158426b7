-- One call per batch: decides, for each point, whether it becomes the courier's last location,
-- and writes the winners. Runs atomically, so workers that receive consecutive points of one
-- courier (a shared subscription hands them out round robin) cannot overwrite a newer point
-- with an older one.
--
-- KEYS: 1 live (GEO), 2 seen (ZSET), 3 order (HASH courier -> order), 4 seq (HASH courier -> state),
--       5 this batch's record: its verdicts, kept 30 s (retries stop after ingest.redis_retry_for,
--       at most 20 s). A batch retried after a response
--       timeout (Redis had applied it) gets the verdicts of its first run back instead of being
--       judged again, when every point would be stale (its own seq) and no track sent.
-- ARGV: 1 now (server unix seconds), 2 reset_after (seconds),
--       then 5 per entry: id, lon, lat, seq, ts. seq == "off" is an `offline` status (the
--       other three fields are empty): the courier leaves the live index at once.
-- State per courier: "seq|phone_ts|epoch_ts|server_ts" where epoch_ts is the phone time of the
-- first point since the last seq reset.
-- Rule for a point (s, p):
--   no state                                        -> accept (new epoch)
--   s > seq and p >= epoch_ts                       -> accept
--   s <= seq and p > phone_ts and
--     now - server_ts >= reset_after                -> accept as a seq reset (new epoch)
--   anything else                                   -> stale (older, duplicate, or a replay of
--                                                      the epoch before a reset)
-- Returns two values per entry: a code (0 stale, 1 accepted, 2 accepted as reset,
-- 3 offline handled) and the order the courier carries ('' if none; accepted points only).
local live, seen, orders, seqs, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local done = redis.call('GET', record)
if done then
  return cjson.decode(done)
end
local now_s = ARGV[1]
local now = tonumber(now_s)
local reset_after = tonumber(ARGV[2])

local out = {}
local state = {}
local dirty = {}
local geo = {}
local zs = {}

local function flush()
  if #geo > 0 then
    redis.call('GEOADD', live, unpack(geo))
    redis.call('ZADD', seen, unpack(zs))
    geo = {}
    zs = {}
  end
end

-- Every courier's state and order in two calls for the whole batch, not two calls a point: the
-- call overhead was the larger part of the script's time. The order cannot change while the
-- script runs, so reading it up front is the same as reading it on acceptance.
local ids = {}
for i = 3, #ARGV, 5 do
  ids[#ids + 1] = ARGV[i]
end
local raws, carried = {}, {}
if #ids > 0 then
  raws = redis.call('HMGET', seqs, unpack(ids))
  carried = redis.call('HMGET', orders, unpack(ids))
end

-- k: the entry's place in the batch (its HMGET answer); a courier seen earlier in the batch
-- uses the state this script left.
local function load(id, k)
  local st = state[id]
  if st == nil then
    local raw = raws[k]
    st = false
    if raw then
      local a, b, c, d = string.match(raw, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)$')
      if a then
        st = { tonumber(a), tonumber(b), c, tonumber(c), tonumber(d) }
      end
    end
    state[id] = st
  end
  return st
end

for i = 3, #ARGV, 5 do
  local k = (i + 2) / 5
  local id = ARGV[i]
  local seq_s = ARGV[i + 3]
  if seq_s == 'off' then
    flush()
    redis.call('ZREM', live, id)
    redis.call('ZREM', seen, id)
    out[#out + 1] = 3
    out[#out + 1] = ''
  else
    local s = tonumber(seq_s)
    local ts_s = ARGV[i + 4]
    local p = tonumber(ts_s)
    local st = load(id, k)
    local code = 0
    local epoch_s = ts_s
    if not st then
      code = 1
    elseif s > st[1] and p >= st[4] then
      code = 1
      epoch_s = st[3]
    elseif s <= st[1] and p > st[2] and now - st[5] >= reset_after then
      code = 2
    end
    if code > 0 then
      state[id] = { s, p, epoch_s, tonumber(epoch_s), now }
      dirty[id] = seq_s .. '|' .. ts_s .. '|' .. epoch_s .. '|' .. now_s
      geo[#geo + 1] = ARGV[i + 1]
      geo[#geo + 1] = ARGV[i + 2]
      geo[#geo + 1] = id
      zs[#zs + 1] = now_s
      zs[#zs + 1] = id
      out[#out + 1] = code
      out[#out + 1] = carried[k] or ''
    else
      out[#out + 1] = 0
      out[#out + 1] = ''
    end
  end
end
flush()

local hs = {}
for id, v in pairs(dirty) do
  hs[#hs + 1] = id
  hs[#hs + 1] = v
end
if #hs > 0 then
  redis.call('HSET', seqs, unpack(hs))
end
redis.call('SET', record, cjson.encode(out), 'EX', 30)
return out
