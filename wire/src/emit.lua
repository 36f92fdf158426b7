-- courier_wire::events::EMIT_LUA, prepended to every script that causes an order event: the one
-- way an event enters the events stream, in the same atomic call as the change it reports.
-- Fields: kind, key (the outbox's dedupe key: the same event written twice is one row), order,
-- courier, tenant, at (unix s). Past `cap` entries the event is counted in `dropped`; cap 0
-- turns events off.
local function emit(stream, dropped, cap, kind, key, order, courier, tenant, at)
  cap = tonumber(cap)
  if cap == 0 then
    return
  end
  if redis.call('XLEN', stream) >= cap then
    redis.call('INCR', dropped)
    return
  end
  redis.call('XADD', stream, '*', 'kind', kind, 'key', key, 'order', order,
    'courier', courier, 'tenant', tenant, 'at', at)
end
