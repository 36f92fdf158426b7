-- Removes couriers silent since before a cutoff from the live index. GEO has no per-member
-- TTL, so `seen` (server time of the last accepted point) says who is silent. Idempotent and
-- atomic: several workers may sweep at once. An evicted courier carrying orders emits
-- `courier.offline_during_order` for each (courier_wire::events).
-- KEYS: 1 live, 2 seen, 3 courier:order, 4 order:tenant, 5 events, 6 events:dropped.
-- ARGV: 1 cutoff (server unix seconds), 2 limit, 3 events cap, 4 now (unix s).
-- Returns how many couriers it removed (== limit means: call again).
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('ZREM', KEYS[2], unpack(ids))
  local carried = redis.call('HMGET', KEYS[3], unpack(ids))
  for i = 1, #ids do
    if carried[i] then
      for o in string.gmatch(carried[i], '[^,]+') do
        emit(KEYS[5], KEYS[6], ARGV[3], 'courier.offline_during_order',
          'courier.offline_during_order:' .. o .. ':' .. ids[i] .. ':' .. math.floor(tonumber(ARGV[4])),
          o, ids[i], redis.call('HGET', KEYS[4], o) or 'default', ARGV[4])
      end
    end
  end
end
return #ids
