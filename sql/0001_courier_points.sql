-- The history of every valid point, one partition per UTC day of received_at.
-- Partitions are created ahead and dropped past retention by the history writer
-- (history-writer/src/partitions.rs); there is deliberately no DEFAULT partition: it would
-- make every new day's partition scan it, and a row without its day is reported instead.
CREATE TABLE courier_points (
    courier_id  text NOT NULL,
    seq         bigint NOT NULL,
    phone_ts    timestamptz NOT NULL,               -- the phone's clock
    received_at timestamptz NOT NULL DEFAULT now(), -- the server's clock
    order_id    text,                               -- set while the courier carries an order
    lat double precision NOT NULL,
    lon double precision NOT NULL
) PARTITION BY RANGE (received_at);

CREATE INDEX courier_points_received_at_brin ON courier_points USING brin (received_at);
CREATE INDEX courier_points_courier_received ON courier_points (courier_id, received_at);
