-- Reports arrivals that ingest decided from a batch's verdicts (ingest/src/arrival.rs): each
-- once per order and place, and only while the courier still carries the order. Called only
-- for batches with an arrival, so it costs nothing per point.
-- KEYS: 1 order:places, 2 order:courier, 3 order:tenant, 4 events, 5 events:dropped
-- ARGV: 1 events cap, 2 now (unix s), then per arrival: order, courier, place ('p' | 'd')
-- Returns how many events it wrote.
local n = 0
for i = 3, #ARGV, 3 do
  local order, courier, place = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local places = redis.call('HGET', KEYS[1], order)
  if places and redis.call('HGET', KEYS[2], order) == courier then
    local flags = string.match(places, '|([pd]*)$')
    if flags and not string.find(flags, place, 1, true) then
      redis.call('HSET', KEYS[1], order, places .. place)
      local kind = (place == 'p') and 'courier.arriving_pickup' or 'courier.arriving_dropoff'
      emit(KEYS[4], KEYS[5], ARGV[1], kind, kind .. ':' .. order, order, courier,
        redis.call('HGET', KEYS[3], order) or 'default', ARGV[2])
      n = n + 1
    end
  end
end
return n
