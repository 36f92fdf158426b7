-- Removes couriers silent since before a cutoff from the live index. GEO has no per-member
-- TTL, so `seen` says who may be silent: its score is at most one seen_every bucket off the
-- server time of the courier's last accepted point (script.lua writes it once per bucket), and
-- that true time is in his seq state. So candidates come from `seen` by score and each is
-- confirmed against his state:
--   state's server_ts < cutoff                     -> evicted (ZREM live and seen)
--   no state, or state unreadable                  -> evicted (nothing says he is alive)
--   state's server_ts >= cutoff (seen lagged)      -> kept, `seen` re-scored to server_ts
-- Idempotent and atomic: several workers may sweep at once. An evicted courier carrying
-- orders emits `courier.offline_during_order` for each (courier_wire::events).
-- KEYS: 1 live, 2 seen, 3 courier:order, 4 order:tenant, 5 events, 6 events:dropped, 7 seq.
-- ARGV: 1 cutoff (server unix seconds), 2 limit, 3 events cap, 4 now (unix s).
-- Returns { evicted, examined } (examined == limit means: call again; the re-scored are
-- past the cutoff, so they are not examined again).
local cutoff = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then
  return { 0, 0 }
end
local raws = redis.call('HMGET', KEYS[7], unpack(ids))
local gone, alive = {}, {}
for i = 1, #ids do
  local v, t = raws[i], nil
  if v then
    local tag = string.byte(v)
    if #v == 33 and (tag == 1 or tag == 2) then
      t = select(5, struct.unpack('<Bdddd', v))
    else
      t = tonumber(string.match(v, '|([^|]+)$'))
    end
  end
  if t and t >= cutoff then
    alive[#alive + 1] = t
    alive[#alive + 1] = ids[i]
  else
    gone[#gone + 1] = ids[i]
  end
end
if #alive > 0 then
  redis.call('ZADD', KEYS[2], unpack(alive))
end
if #gone > 0 then
  redis.call('ZREM', KEYS[1], unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
  local carried = redis.call('HMGET', KEYS[3], unpack(gone))
  for i = 1, #gone do
    if carried[i] then
      for o in string.gmatch(carried[i], '[^,]+') do
        emit(KEYS[5], KEYS[6], ARGV[3], 'courier.offline_during_order',
          'courier.offline_during_order:' .. o .. ':' .. gone[i] .. ':' .. math.floor(tonumber(ARGV[4])),
          o, gone[i], redis.call('HGET', KEYS[4], o) or 'default', ARGV[4])
      end
    end
  end
end
return { #gone, #ids }
