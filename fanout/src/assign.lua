-- Binds a courier to an order, atomically in both directions, records the order's places and
-- tenant, and reports `order.assigned`. A courier carries up to ARGV[6] orders at once
-- (stacked deliveries); assigning one never ends another.
-- KEYS: 1 order:courier (HASH order -> courier), 2 courier:order (HASH courier -> his orders,
--       see stack.lua), 3 orders:ended (ZSET), 4 order:tenant (HASH), 5 events (STREAM),
--       6 events:dropped, 7 order:places (HASH order -> "pickup|dropoff|fired", docs/events.md)
-- ARGV: 1 order, 2 courier, 3 tenant, 4 events cap, 5 now (unix s), 6 most orders per courier,
--       7 places ('' keeps what the order had)
-- Returns 'ended' (an ended order never runs again), 'full' (the courier carries the most
-- orders already) or 'ok'. The event's key holds the courier: assigning the same courier
-- again is no new event, reassigning to another is.
local order, courier = ARGV[1], ARGV[2]
if redis.call('ZSCORE', KEYS[3], order) then
  return 'ended'
end
local old = redis.call('HGET', KEYS[1], order)
local mine = redis.call('HGET', KEYS[2], courier)
local others = without(mine, order)
if others ~= (mine or '') then
  -- He carries it already: his list stays as it is.
  others = mine
else
  local n = 0
  for _ in string.gmatch(others, '[^,]+') do
    n = n + 1
  end
  if n >= tonumber(ARGV[6]) then
    return 'full'
  end
  others = (others == '') and order or (others .. ',' .. order)
end
if old and old ~= courier then
  -- Reassigned: the previous courier's points no longer go to this order.
  set_list(KEYS[2], old, without(redis.call('HGET', KEYS[2], old), order))
end
redis.call('HSET', KEYS[1], order, courier)
set_list(KEYS[2], courier, others)
redis.call('HSET', KEYS[4], order, ARGV[3])
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[7], order, ARGV[7])
end
if old ~= courier then
  emit(KEYS[5], KEYS[6], ARGV[4], 'order.assigned', 'order.assigned:' .. order .. ':' .. courier,
    order, courier, ARGV[3], ARGV[5])
end
return 'ok'
