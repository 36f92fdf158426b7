-- Prepended to the orders API's scripts (after courier_wire's emit): a courier's running
-- orders are one courier:order value, the order ids comma-separated, oldest first (an order id
-- never holds a comma). One order is the single id, as before stacked orders.
local function without(list, order)
  if not list then
    return ''
  end
  local kept = {}
  for o in string.gmatch(list, '[^,]+') do
    if o ~= order then
      kept[#kept + 1] = o
    end
  end
  return table.concat(kept, ',')
end
local function set_list(key, courier, list)
  if list == '' then
    redis.call('HDEL', key, courier)
  else
    redis.call('HSET', key, courier, list)
  end
end
