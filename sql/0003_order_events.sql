-- Order events and their webhook deliveries (notify role, docs/events.md).
--
-- order_events is the durable outbox: one row per event, written once (dedupe_key is unique:
-- the relay may hand an event twice, PostgreSQL keeps one). webhook_deliveries holds one row
-- per (event, endpoint): the dispatchers claim due rows with FOR UPDATE SKIP LOCKED and a
-- lease, so several processes deliver side by side and a dispatcher that dies mid-delivery
-- only delays its rows until the lease runs out.
CREATE TABLE order_events (
    id          bigserial PRIMARY KEY,
    dedupe_key  text NOT NULL UNIQUE,
    kind        text NOT NULL,
    tenant      text NOT NULL,
    order_id    text NOT NULL,
    courier_id  text,
    occurred_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON order_events (order_id);

CREATE TABLE webhook_endpoints (
    id          bigserial PRIMARY KEY,
    tenant      text NOT NULL,
    url         text NOT NULL,
    kinds       text[] NOT NULL,
    secret      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    disabled_at timestamptz,
    -- The circuit breaker, shared by every dispatcher process.
    failures    integer NOT NULL DEFAULT 0,
    open_until  timestamptz
);
CREATE INDEX ON webhook_endpoints (tenant) WHERE disabled_at IS NULL;

CREATE TABLE webhook_deliveries (
    id               bigserial PRIMARY KEY,
    event_id         bigint NOT NULL REFERENCES order_events (id) ON DELETE CASCADE,
    endpoint_id      bigint NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    first_attempt_at timestamptz,
    last_attempt_at  timestamptz,
    last_status      integer,
    last_error       text,
    done_at          timestamptz,
    UNIQUE (event_id, endpoint_id)
);
CREATE INDEX ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
-- The probe of a half-open endpoint: its first due delivery.
CREATE INDEX ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE state = 'pending';
CREATE INDEX ON webhook_deliveries (endpoint_id, done_at) WHERE state = 'dead';
CREATE INDEX ON webhook_deliveries (done_at) WHERE state = 'delivered';

-- Notices to a customer's closed app, through a push provider (docs/events.md). A device token
-- belongs to one order; push_notices holds one row per (device, kind): UNIQUE, so however often
-- an event is relayed or retried, a customer's phone is notified of it once.
CREATE TABLE push_devices (
    id             bigserial PRIMARY KEY,
    tenant         text NOT NULL,
    order_id       text NOT NULL,
    token          text NOT NULL,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    -- Set when the provider answered that the token is dead: no notice is sent to it again.
    retired_at     timestamptz,
    UNIQUE (order_id, token)
);

CREATE TABLE push_notices (
    id               bigserial PRIMARY KEY,
    event_id         bigint NOT NULL REFERENCES order_events (id) ON DELETE CASCADE,
    device_id        bigint NOT NULL REFERENCES push_devices (id) ON DELETE CASCADE,
    kind             text NOT NULL,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead', 'skipped')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    first_attempt_at timestamptz,
    last_status      integer,
    last_error       text,
    done_at          timestamptz,
    UNIQUE (device_id, kind)
);
CREATE INDEX ON push_notices (next_attempt_at) WHERE state = 'pending';
CREATE INDEX ON push_notices (done_at) WHERE state <> 'pending';
