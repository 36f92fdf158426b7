-- Forgets the seq state of couriers not accepted since before a cutoff, a slice at a time,
-- so the seq hash does not grow with every courier ever seen.
-- KEYS: 1 seq.  ARGV: 1 cursor, 2 cutoff (server unix seconds), 3 count.
-- State is packed (struct '<Bdddd', tag 1 or 2, server time last) or, written by an earlier version,
-- text "seq|phone_ts|epoch_ts|server_ts"; anything unreadable is forgotten.
-- Returns { next cursor, removed }.
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[3]))
local cutoff = tonumber(ARGV[2])
local kv = r[2]
local gone = {}
for i = 1, #kv, 2 do
  local v = kv[i + 1]
  local t
  local tag = string.byte(v)
  if #v == 33 and (tag == 1 or tag == 2) then
    t = select(5, struct.unpack('<Bdddd', v))
  else
    t = tonumber(string.match(v, '|([^|]+)$'))
  end
  if t == nil or t < cutoff then
    gone[#gone + 1] = kv[i]
  end
end
if #gone > 0 then
  redis.call('HDEL', KEYS[1], unpack(gone))
end
return { r[1], #gone }
