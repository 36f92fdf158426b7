-- Removes couriers silent since before a cutoff from the live index. GEO has no per-member
-- TTL, so `seen` (server time of the last accepted point) says who is silent. Idempotent and
-- atomic: several workers may sweep at once.
-- KEYS: 1 live, 2 seen.  ARGV: 1 cutoff (server unix seconds), 2 limit.
-- Returns how many couriers it removed (== limit means: call again).
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('ZREM', KEYS[2], unpack(ids))
end
return #ids
