-- One order event under an idempotency key, decided and recorded atomically: a replay (even a
-- concurrent one) finds the record and changes nothing.
-- KEYS: 1 idempotency record, 2 order:courier, 3 courier:order, 4 orders:ended (ZSET),
--       5 order:tenant (HASH), 6 events (STREAM), 7 events:dropped, 8 order:places (HASH)
-- ARGV: 1 order, 2 event (picked_up | delivered), 3 fingerprint of the request, 4 now (unix s),
--       5 record TTL (s), 6 how long ended orders are remembered (s), 7 ended-orders channel,
--       8 the answer to record, 9 events cap
-- Reports `order.<event>` once per order: a second `picked_up` under another key is done again
-- (answered alike) but its event has the first one's dedupe key. `picked_up` also marks the
-- pickup as arrived (no `courier.arriving_pickup` after it); `delivered` ends the order: it
-- leaves the courier's orders (his others run on) and its places are forgotten.
-- Returns {outcome, record}: outcome 'replay' (record = the stored one), 'done', 'ended' or
-- 'unknown'. Only 'done' stores a record: a refused call may be retried with the same key.
local rec = redis.call('GET', KEYS[1])
if rec then
  return {'replay', rec}
end
local courier = redis.call('HGET', KEYS[2], ARGV[1])
if not courier then
  if redis.call('ZSCORE', KEYS[4], ARGV[1]) then
    return {'ended', ''}
  end
  return {'unknown', ''}
end
local tenant = redis.call('HGET', KEYS[5], ARGV[1]) or 'default'
if ARGV[2] == 'delivered' then
  redis.call('HDEL', KEYS[2], ARGV[1])
  set_list(KEYS[3], courier, without(redis.call('HGET', KEYS[3], courier), ARGV[1]))
  redis.call('HDEL', KEYS[8], ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', tonumber(ARGV[4]) - tonumber(ARGV[6]))
  redis.call('PUBLISH', ARGV[7], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
elseif ARGV[2] == 'picked_up' then
  local places = redis.call('HGET', KEYS[8], ARGV[1])
  if places and not string.find(places, 'p', 1, true) then
    redis.call('HSET', KEYS[8], ARGV[1], places .. 'p')
  end
end
emit(KEYS[6], KEYS[7], ARGV[9], 'order.' .. ARGV[2], 'order.' .. ARGV[2] .. ':' .. ARGV[1],
  ARGV[1], courier, tenant, ARGV[4])
local stored = ARGV[3] .. '\n' .. ARGV[8]
redis.call('SET', KEYS[1], stored, 'EX', ARGV[5])
return {'done', stored}
