-- Binds a courier to an order, atomically in both directions, and reports `order.assigned`.
-- KEYS: 1 order:courier (HASH order -> courier), 2 courier:order (HASH courier -> order),
--       3 orders:ended (ZSET), 4 order:tenant (HASH), 5 events (STREAM), 6 events:dropped
-- ARGV: 1 order, 2 courier, 3 tenant, 4 events cap, 5 now (unix s)
-- Returns 'ended' (an ended order never runs again) or 'ok'. The event's key holds the
-- courier: assigning the same courier again is no new event, reassigning to another is.
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
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
if old ~= ARGV[2] then
  emit(KEYS[5], KEYS[6], ARGV[4], 'order.assigned',
    'order.assigned:' .. ARGV[1] .. ':' .. ARGV[2], ARGV[1], ARGV[2], ARGV[3], ARGV[5])
end
return 'ok'
