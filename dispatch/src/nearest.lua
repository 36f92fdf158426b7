-- Nearest couriers in expanding rings, skipping those not seen recently. One call per query.
-- KEYS[1] = couriers:live (GEO), KEYS[2] = couriers:seen (ZSET: ingest writes it once per
-- ingest.seen_every bucket, so its score may lag), KEYS[3] = couriers:seq (HASH: ingest's
-- state, whose packed form holds the server time of the last accepted point exactly). A
-- courier must be in `seen`; his time is the state's, or the `seen` score when the state is
-- missing or in the text form of earlier versions.
-- ARGV = lon, lat, count, min_seen, any (1|0), fetch_max, radius_km...
-- Returns {ring (1-based; 0 when no ring held enough), member, dist_km, seen, member, ...}
local lon, lat = ARGV[1], ARGV[2]
local count, min_seen = tonumber(ARGV[3]), tonumber(ARGV[4])
local any, fetch_max = ARGV[5] == '1', tonumber(ARGV[6])
local out, n = {0}, 0
for r = 7, #ARGV do
  local fetch = count
  while true do
    local found
    if any then
      found = redis.call('GEOSEARCH', KEYS[1], 'FROMLONLAT', lon, lat, 'BYRADIUS', ARGV[r], 'km',
        'COUNT', fetch, 'ANY', 'ASC', 'WITHDIST')
    else
      found = redis.call('GEOSEARCH', KEYS[1], 'FROMLONLAT', lon, lat, 'BYRADIUS', ARGV[r], 'km',
        'COUNT', fetch, 'ASC', 'WITHDIST')
    end
    out, n = {0}, 0
    if #found > 0 then
      local members = {}
      for i, f in ipairs(found) do members[i] = f[1] end
      local seen = redis.call('ZMSCORE', KEYS[2], unpack(members))
      local states = redis.call('HMGET', KEYS[3], unpack(members))
      for i, f in ipairs(found) do
        local s = seen[i]
        local v = states[i]
        if s and v and #v == 33 and (string.byte(v) == 1 or string.byte(v) == 2) then
          s = string.format('%.17g', select(5, struct.unpack('<Bdddd', v)))
        end
        if s and tonumber(s) >= min_seen then
          out[#out + 1] = f[1]
          out[#out + 1] = f[2]
          out[#out + 1] = s
          n = n + 1
          if n == count then break end
        end
      end
    end
    -- Enough; or the ring holds no more; or stale couriers crowd it beyond what we fetch.
    if n == count or #found < fetch or fetch >= fetch_max then break end
    fetch = math.min(fetch * 4, fetch_max)
  end
  if n == count then
    out[1] = r - 6
    return out
  end
end
return out
