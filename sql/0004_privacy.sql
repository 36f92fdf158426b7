-- Issue 17: what outlives the raw trail, and the records of erasures.

-- Anonymous aggregates, one row per geohash-6 cell (about 1.2 x 0.6 km) and UTC hour of
-- received_at, written only where at least k distinct couriers were present. No courier or
-- order id, no coordinates finer than the cell. Kept history.aggregate_retention_days.
CREATE TABLE courier_aggregates (
    hour             timestamptz NOT NULL,
    cell             text NOT NULL,
    couriers         integer NOT NULL,   -- distinct couriers seen in the cell that hour
    points           integer NOT NULL,   -- points (each delivered point once)
    segments         integer NOT NULL,   -- speed samples: consecutive points of one courier
    median_speed_mps double precision,   -- NULL when no segment
    p90_speed_mps    double precision,
    PRIMARY KEY (hour, cell)
);

-- Every hour before done_until is aggregated; the partition drop keeps a day past this mark.
CREATE TABLE aggregate_watermark (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    done_until timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Who erased whom, why, when, and what was removed. Written in the transaction that deletes
-- the points: no record, no erasure.
CREATE TABLE erasure_log (
    id              bigserial PRIMARY KEY,
    actor           text NOT NULL,      -- the privacy token's subject
    courier_id      text NOT NULL,
    reason          text NOT NULL,
    erased_at       timestamptz NOT NULL DEFAULT now(),
    points          bigint NOT NULL,    -- rows deleted from courier_points (every partition)
    redis_live      integer NOT NULL,   -- couriers:live and couriers:seen members removed
    redis_seq       integer NOT NULL,   -- couriers:seq fields removed
    order_bindings  integer NOT NULL    -- courier:order and order:courier fields removed
);

CREATE INDEX erasure_log_erased_at ON erasure_log (erased_at);
CREATE INDEX trail_access_log_accessed_at ON trail_access_log (accessed_at);
