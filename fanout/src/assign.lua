-- Binds a courier to an order, atomically in both directions.
-- KEYS: 1 order:courier (HASH order -> courier), 2 courier:order (HASH courier -> order),
--       3 orders:ended (ZSET)
-- ARGV: 1 order, 2 courier
-- Returns 'ended' (an ended order never runs again) or 'ok'.
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  return 'ended'
end
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old and old ~= ARGV[2] and redis.call('HGET', KEYS[2], old) == ARGV[1] then
  -- Reassigned: the previous courier's points no longer go to this order.
  redis.call('HDEL', KEYS[2], old)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
return 'ok'
