-- Trail read figure on generated data (scaled down from 6.5 billion rows, see README):
--   30 daily partitions (2026-10-01 .. 2026-10-30) holding 10,000 couriers every 30 min
--   (14.4 M rows), plus on 2026-10-15 the same 10,000 couriers every 5 min (2.88 M rows)
--   with courier c00042 every 4 s for the whole day (21,600 rows). Rows go in in receive-time
--   order, as the writer appends them, so each of c00042's rows sits on its own heap page as it
--   would among 10,000 couriers sending every 4 s.
-- Run from the repository root (it reads sql/0001_courier_points.sql):
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f history-writer/bench/trail_read.sql
-- Everything lives in schema trailbench, dropped at the end.
\timing off
DROP SCHEMA IF EXISTS trailbench CASCADE;
CREATE SCHEMA trailbench;
SET search_path = trailbench;
\i sql/0001_courier_points.sql
DO $$
DECLARE d date;
BEGIN
  FOR d IN SELECT generate_series(date '2026-10-01', date '2026-10-30', interval '1 day')::date LOOP
    EXECUTE format('CREATE TABLE %I PARTITION OF courier_points FOR VALUES FROM (%L) TO (%L)',
                   'courier_points_p' || to_char(d, 'YYYYMMDD'), d::timestamptz, (d + 1)::timestamptz);
  END LOOP;
END $$;
SET TIME ZONE 'UTC';
\echo generating 30 days x 10,000 couriers every 30 min ...
\timing on
INSERT INTO courier_points (courier_id, seq, phone_ts, received_at, order_id, lat, lon)
SELECT 'c' || lpad(c::text, 5, '0'), extract(epoch FROM t)::bigint, t + (c % 1800) * interval '1 s' - interval '1 s',
       t + (c % 1800) * interval '1 s', NULL, 24.6 + (c % 300) * 0.001, 46.6 + (c % 211) * 0.001
FROM generate_series(timestamptz '2026-10-01 00:00', timestamptz '2026-10-30 23:30', interval '30 min') t,
     generate_series(1, 10000) c
WHERE NOT (t >= '2026-10-15' AND t < '2026-10-16');
\echo the full day 2026-10-15: 10,000 couriers every 5 min, c00042 every 4 s ...
INSERT INTO courier_points (courier_id, seq, phone_ts, received_at, order_id, lat, lon)
SELECT id, seq, r - interval '1 s', r, ord, lat, lon FROM (
  SELECT 'c' || lpad(c::text, 5, '0') AS id, extract(epoch FROM t)::bigint AS seq, t + (c % 300) * interval '1 s' AS r,
         NULL::text AS ord, 24.6 + (c % 300) * 0.001 AS lat, 46.6 + (c % 211) * 0.001 AS lon
  FROM generate_series(timestamptz '2026-10-15 00:00', timestamptz '2026-10-15 23:55', interval '5 min') t,
       generate_series(1, 10000) c WHERE c <> 42
  UNION ALL
  SELECT 'c00042', n, timestamptz '2026-10-15' + n * interval '4 s' + interval '300 ms',
         'o-' || (n / 900), 24.7 + n * 1e-6, 46.7 + n * 1e-6
  FROM generate_series(0, 21599) n
) s ORDER BY r;
\timing off
ANALYZE courier_points;
SELECT (SELECT count(*) FROM courier_points) AS total_rows,
       (SELECT count(*) FROM pg_inherits WHERE inhparent = 'courier_points'::regclass) AS partitions,
       pg_size_pretty((SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = 'courier_points'::regclass)) AS on_disk;
\echo the trail read of the API (one day of c00042), plan:
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT seq, phone_ts, received_at, order_id, lat, lon FROM (
  SELECT DISTINCT ON (seq, phone_ts) seq, phone_ts, received_at, order_id, lat, lon
  FROM courier_points WHERE courier_id = 'c00042' AND received_at >= '2026-10-15' AND received_at < '2026-10-16'
  ORDER BY seq, phone_ts, received_at) t
ORDER BY phone_ts, seq;
\echo timed, three runs:
\timing on
\o /dev/null
SELECT seq, phone_ts, received_at, order_id, lat, lon FROM (SELECT DISTINCT ON (seq, phone_ts) seq, phone_ts, received_at, order_id, lat, lon FROM courier_points WHERE courier_id = 'c00042' AND received_at >= '2026-10-15' AND received_at < '2026-10-16' ORDER BY seq, phone_ts, received_at) t ORDER BY phone_ts, seq;
SELECT seq, phone_ts, received_at, order_id, lat, lon FROM (SELECT DISTINCT ON (seq, phone_ts) seq, phone_ts, received_at, order_id, lat, lon FROM courier_points WHERE courier_id = 'c00042' AND received_at >= '2026-10-15' AND received_at < '2026-10-16' ORDER BY seq, phone_ts, received_at) t ORDER BY phone_ts, seq;
SELECT seq, phone_ts, received_at, order_id, lat, lon FROM (SELECT DISTINCT ON (seq, phone_ts) seq, phone_ts, received_at, order_id, lat, lon FROM courier_points WHERE courier_id = 'c00042' AND received_at >= '2026-10-15' AND received_at < '2026-10-16' ORDER BY seq, phone_ts, received_at) t ORDER BY phone_ts, seq;
\o
\timing off
\echo one hour of another courier on a coarse day (2026-10-03 10:00-11:00):
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT seq FROM courier_points WHERE courier_id = 'c00007' AND received_at >= '2026-10-03 10:00' AND received_at < '2026-10-03 11:00';
DROP SCHEMA trailbench CASCADE;
