-- Who read whose trail, over which window, why, when, and how many points they got.
-- Written in the same transaction as the read: no audit row, no data.
CREATE TABLE trail_access_log (
    id          bigserial PRIMARY KEY,
    actor       text NOT NULL,         -- the token's subject
    courier_id  text NOT NULL,
    window_from timestamptz NOT NULL,
    window_to   timestamptz NOT NULL,
    reason      text NOT NULL,
    accessed_at timestamptz NOT NULL DEFAULT now(),
    row_count   integer NOT NULL
);

CREATE INDEX trail_access_log_courier ON trail_access_log (courier_id, accessed_at);
CREATE INDEX trail_access_log_actor ON trail_access_log (actor, accessed_at);
