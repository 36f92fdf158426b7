-- Stacked deliveries (docs/events.md): a courier may carry several orders at once. order_ids
-- holds every order running when the point arrived, oldest first; order_id keeps the first of
-- them, as before, for readers of the single column. An array column rather than one row per
-- order: a point is stored once (the trail, the aggregates and erasure count points, not
-- orders), and one row costs about 25 bytes more per order instead of a whole row.
-- All points of an order: WHERE 'o-1' = ANY (order_ids).
ALTER TABLE courier_points ADD COLUMN order_ids text[];
