-- Prepended to the scripts that change an order (see orders.rs): the one way an order event
-- enters the events stream, in the same atomic call as the change it reports, so an event is
-- written exactly when its change is. The stream is bounded: past `cap` entries (the notify
-- relay down or behind) the event is counted in `dropped` instead; cap 0 turns events off.
-- Fields: kind, key (the outbox's dedupe key), order, courier, tenant, at (unix s).
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
