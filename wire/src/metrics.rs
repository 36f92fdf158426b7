//! Every Prometheus metric name of courier-pipeline, in one place. Labels never carry a courier
//! or order id: their values come from small fixed sets (results, reasons).

/// Counter, labels `route` (live, courier, totals, track_status) and `result` (ok,
/// unauthorized, bad_request, not_found, error): the maps' data requests.
pub const WEB_REQUESTS: &str = "web_requests_total";
/// Counter, label `result`: accepted | stale | invalid | dropped | error.
pub const INGEST_POINTS: &str = "ingest_points_total";
/// Counter, label `reason`: one of [`crate::Invalid::reason`].
pub const INGEST_INVALID: &str = "ingest_invalid_total";
/// Counter: MQTT messages the ingest source handed on (points and status).
pub const INGEST_RECEIVED: &str = "ingest_messages_received_total";
/// Counter, label `reason`: queue_full. Messages the bounded ingest queue refused.
pub const INGEST_QUEUE_DROPPED: &str = "ingest_queue_dropped_total";
/// Gauge: messages waiting in the ingest queue.
pub const INGEST_QUEUE_DEPTH: &str = "ingest_queue_depth";
/// Histogram: points per batch script call.
pub const INGEST_BATCH_SIZE: &str = "ingest_batch_size";
/// Histogram, seconds: batch script round trip.
pub const INGEST_REDIS_SECONDS: &str = "ingest_redis_seconds";
/// Counter, label `kind`: retryable | fatal. Failed batch script calls.
pub const INGEST_REDIS_ERRORS: &str = "ingest_redis_errors_total";
/// Histogram, seconds: server receive time minus phone ts of accepted points.
pub const INGEST_PHONE_LAG_SECONDS: &str = "ingest_phone_lag_seconds";
/// Counter: accepted points that restarted a courier's seq (app reinstall).
pub const INGEST_SEQ_RESETS: &str = "ingest_seq_resets_total";
/// Counter: points published to `track/{order}`.
pub const INGEST_TRACKS_PUBLISHED: &str = "ingest_tracks_published_total";
/// Counter: tracks the MQTT client could not take (its request queue full).
pub const INGEST_TRACKS_DROPPED: &str = "ingest_tracks_dropped_total";
/// Counter: arrivals at an order's pickup or drop-off place that ingest reported (each order
/// and place once).
pub const INGEST_ARRIVALS: &str = "ingest_arrivals_total";
/// Counter, label `reason`: silent | offline. Couriers removed from the live index.
pub const INGEST_EVICTED: &str = "ingest_evicted_total";
/// Counter: `offline` statuses whose batch did not reach Redis (those couriers stay live until
/// the eviction sweep).
pub const INGEST_STATUS_ERRORS: &str = "ingest_status_errors_total";
/// Counter, label `state`: connected | disconnected. MQTT connection changes of a role.
pub const MQTT_CONNECTION_EVENTS: &str = "mqtt_connection_events_total";
/// Counter: `CursorJump` alerts of the embedded broker (a slow subscriber lost messages).
pub const BROKER_CURSOR_JUMPS: &str = "broker_cursor_jumps_total";
/// Counter, label `result`: courier | service | refused. Logins checked by the embedded broker.
pub const BROKER_LOGINS: &str = "broker_logins_total";
/// Counter: other alerts of the embedded broker.
pub const BROKER_ALERTS_OTHER: &str = "broker_alerts_other_total";
/// Gauge: viewers connected to this gateway process (CONNECT accepted, not yet gone).
pub const FANOUT_VIEWERS_CONNECTED: &str = "fanout_viewers_connected";
/// Counter, label `reason`: bad_token | expired_token | order_ended | filter | publish |
/// protocol | timeout | max_viewers | unavailable | token_sessions. Viewers refused at CONNECT, SUBSCRIBE filters refused,
/// viewers disconnected for publishing or for breaking the protocol.
pub const FANOUT_REFUSALS: &str = "fanout_refusals_total";
/// Counter: PUBLISH packets written to viewers.
pub const FANOUT_POINTS_SENT: &str = "fanout_points_sent_total";
/// Counter, label `reason`: queue_full (a slow viewer's oldest point) | interval (superseded
/// within the per-viewer send interval).
pub const FANOUT_POINTS_DROPPED: &str = "fanout_points_dropped_total";
/// Counter, labels `event`: assign | tracking_token | picked_up | delivered | unknown, and `result`:
/// ok | replay | unauthorized | bad_request | not_found | conflict | unprocessable | error.
pub const FANOUT_ORDER_EVENTS: &str = "fanout_order_events_total";
/// Counter: `track/+` messages the gateway's source received.
pub const FANOUT_TRACKS_RECEIVED: &str = "fanout_tracks_received_total";

/// Gauge: phones logged in to this edge process (CONNECT accepted, not yet gone).
pub const EDGE_CONNECTIONS: &str = "edge_connections";
/// Counter, label `transport`: tcp | tls | ws. Phone logins the edge accepted.
pub const EDGE_LOGINS: &str = "edge_logins_total";
/// Counter, label `reason`: one of `edge::Refusal::reason` (bad_token, expired_token,
/// wrong_courier, will, topic, retain, qos, subscribe, protocol, too_large, timeout, full, tls,
/// websocket). Refused logins, packets and connections.
pub const EDGE_REFUSALS: &str = "edge_refusals_total";
/// Counter, label `result`: forwarded | rate_limited | off_shift | queue_full. PUBLISH packets of phones
/// that the courier policy allowed: handed to the bus, over the courier's rate, a point of a
/// courier off shift (after his own `offline`), or dropped because the bounded queue to the bus
/// was full.
pub const EDGE_MESSAGES: &str = "edge_messages_total";
/// Counter: Last Wills the edge published for phones gone without DISCONNECT (or expired).
pub const EDGE_WILLS: &str = "edge_wills_published_total";
/// Counter: logins that took over an open connection of the same courier.
pub const EDGE_TAKEOVERS: &str = "edge_takeovers_total";
/// Gauge: messages waiting in the edge's queue to the bus.
pub const EDGE_QUEUE_DEPTH: &str = "edge_queue_depth";

/// Counter: messages the history source received on `couriers/+/loc`.
pub const HISTORY_ROWS_RECEIVED: &str = "history_rows_received_total";
/// Counter: rows committed to `courier_points`.
pub const HISTORY_ROWS_WRITTEN: &str = "history_rows_written_total";
/// Counter, label `reason`: buffer_full (the oldest made room), no_partition (a day whose
/// partition could not be created), rejected (PostgreSQL refused the row itself), shutdown
/// (not flushed within the deadline).
pub const HISTORY_ROWS_DROPPED: &str = "history_rows_dropped_total";
/// Counter, label `reason`: one of [`crate::Invalid::reason`], or bad_topic.
pub const HISTORY_INVALID: &str = "history_invalid_total";
/// Gauge: rows waiting in the history buffer.
pub const HISTORY_BUFFER_DEPTH: &str = "history_buffer_depth";
/// Histogram: rows per COPY.
pub const HISTORY_BATCH_SIZE: &str = "history_batch_size";
/// Histogram, seconds: one COPY and its commit.
pub const HISTORY_COPY_SECONDS: &str = "history_copy_seconds";
/// Histogram, seconds: from a row's receipt to the commit that made it durable.
pub const HISTORY_COMMIT_LAG_SECONDS: &str = "history_commit_lag_seconds";
/// Counter, label `kind`: retryable (connection, server overload) | database (PostgreSQL refuses
/// every row: read-only, permissions, schema; the batch is kept) | data (a row's fault: the
/// batch is split to find it). Failed COPYs.
pub const HISTORY_COPY_ERRORS: &str = "history_copy_errors_total";
/// Counter: day partitions created (ahead, or on demand for a batch).
pub const HISTORY_PARTITIONS_CREATED: &str = "history_partitions_created_total";
/// Counter: day partitions dropped past retention.
pub const HISTORY_PARTITIONS_DROPPED: &str = "history_partitions_dropped_total";
/// Gauge: day partitions past retention kept because the aggregates have not passed them.
pub const HISTORY_PARTITIONS_HELD: &str = "history_partitions_held";
/// Counter: hours aggregated (each committed with the watermark).
pub const AGGREGATE_HOURS: &str = "aggregate_hours_total";
/// Counter: cell-hours written (at least k couriers each).
pub const AGGREGATE_CELLS: &str = "aggregate_cells_written_total";
/// Histogram, seconds: aggregating one hour (query, insert, commit).
pub const AGGREGATE_HOUR_SECONDS: &str = "aggregate_hour_seconds";
/// Gauge, seconds: server time minus the aggregates' watermark (an hour plus the delay when
/// caught up).
pub const AGGREGATE_LAG_SECONDS: &str = "aggregate_lag_seconds";
/// Counter: aggregator runs that failed (retried on the next tick).
pub const AGGREGATE_ERRORS: &str = "aggregate_errors_total";
/// Counter, label `log`: trail_access | erasure. Audit rows deleted past their retention.
pub const AUDIT_ROWS_EXPIRED: &str = "audit_rows_expired_total";
/// Counter, label `result`: ok | unauthorized | bad_request | error. Aggregate API requests.
pub const AGGREGATE_REQUESTS: &str = "aggregate_requests_total";
/// Counter, label `result`: ok | unauthorized | bad_request | error. Erasure requests.
pub const ERASURE_REQUESTS: &str = "erasure_requests_total";
/// Counter: history rows deleted by erasures.
pub const ERASURE_POINTS: &str = "erasure_points_removed_total";
/// Counter, label `result`: ok | unauthorized | forbidden | bad_request | too_large | error.
/// A courier's requests for his own trail.
pub const ACCESS_REQUESTS: &str = "access_requests_total";
/// Counter, label `result`: ok | unauthorized | forbidden | bad_request | too_large | error. Trail
/// API requests.
pub const TRAIL_REQUESTS: &str = "trail_requests_total";
/// Counter, label `reason`: missing | malformed | unknown_key | bad_signature | expired. Trail
/// requests refused for their token (the caller is told only "401").
pub const TRAIL_TOKEN_REFUSALS: &str = "trail_token_refusals_total";

/// Counter, labels `kind` (one of `crate::events::KINDS`, or other) and
/// `result`: recorded (a new outbox row) | duplicate (already recorded: a relay retry) |
/// invalid (a stream entry missing fields, or one PostgreSQL refused; dropped). Events the
/// relay moved to the outbox.
pub const NOTIFY_EVENTS: &str = "notify_events_total";
/// Counter: order events not written to the Redis events stream because it held
/// `fanout.events_stream_max` (the relay down or behind). Read from Redis by the relay.
pub const NOTIFY_EVENTS_DROPPED: &str = "notify_events_dropped_total";
/// Gauge: events waiting in the Redis events stream.
pub const NOTIFY_STREAM_LENGTH: &str = "notify_stream_length";
/// Counter, label `result`: delivered | retry (failed, tried again later) | dead (failed, given
/// up: dead-letter list). Webhook attempts.
pub const NOTIFY_DELIVERIES: &str = "notify_deliveries_total";
/// Histogram, seconds: one webhook attempt (connect, send, answer).
pub const NOTIFY_ATTEMPT_SECONDS: &str = "notify_attempt_seconds";
/// Gauge: webhook deliveries not yet delivered nor dead (all processes).
pub const NOTIFY_PENDING: &str = "notify_deliveries_pending";
/// Gauge, seconds: age of the oldest pending delivery since its event was recorded (retry age).
pub const NOTIFY_OLDEST_PENDING_SECONDS: &str = "notify_oldest_pending_seconds";
/// Gauge: dead letters kept (replayable).
pub const NOTIFY_DEAD_LETTERS: &str = "notify_dead_letters";
/// Gauge: webhook endpoints whose circuit breaker is open.
pub const NOTIFY_BREAKERS_OPEN: &str = "notify_breakers_open";
/// Counter, label `result`: sent | retry | dead | unregistered (the provider said the device
/// token is dead: the device is retired) | skipped (its device was retired). Push notices.
pub const NOTIFY_NOTICES: &str = "notify_notices_total";
/// Counter, label `result`: ok | unauthorized | bad_request | not_found | error. Webhooks API
/// requests.
pub const NOTIFY_API_REQUESTS: &str = "notify_api_requests_total";

/// Histogram buckets for the batch script round trip and phone lag (seconds).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Histogram buckets for batch sizes.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];
/// Histogram buckets for history COPY sizes.
pub const HISTORY_BATCH_BUCKETS: &[f64] = &[
    1.0, 10.0, 100.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 20000.0, 50000.0,
];

/// Every metric name above (for checks of dashboards and alert rules).
pub const ALL: &[&str] = &[
    INGEST_POINTS,
    INGEST_INVALID,
    INGEST_RECEIVED,
    INGEST_QUEUE_DROPPED,
    INGEST_QUEUE_DEPTH,
    INGEST_BATCH_SIZE,
    INGEST_REDIS_SECONDS,
    INGEST_REDIS_ERRORS,
    INGEST_PHONE_LAG_SECONDS,
    INGEST_SEQ_RESETS,
    INGEST_TRACKS_PUBLISHED,
    INGEST_TRACKS_DROPPED,
    INGEST_ARRIVALS,
    INGEST_EVICTED,
    INGEST_STATUS_ERRORS,
    MQTT_CONNECTION_EVENTS,
    BROKER_CURSOR_JUMPS,
    BROKER_LOGINS,
    BROKER_ALERTS_OTHER,
    FANOUT_VIEWERS_CONNECTED,
    FANOUT_REFUSALS,
    FANOUT_POINTS_SENT,
    FANOUT_POINTS_DROPPED,
    FANOUT_ORDER_EVENTS,
    FANOUT_TRACKS_RECEIVED,
    EDGE_CONNECTIONS,
    EDGE_LOGINS,
    EDGE_REFUSALS,
    EDGE_MESSAGES,
    EDGE_WILLS,
    EDGE_TAKEOVERS,
    EDGE_QUEUE_DEPTH,
    HISTORY_ROWS_RECEIVED,
    HISTORY_ROWS_WRITTEN,
    HISTORY_ROWS_DROPPED,
    HISTORY_INVALID,
    HISTORY_BUFFER_DEPTH,
    HISTORY_BATCH_SIZE,
    HISTORY_COPY_SECONDS,
    HISTORY_COMMIT_LAG_SECONDS,
    HISTORY_PARTITIONS_CREATED,
    HISTORY_PARTITIONS_DROPPED,
    HISTORY_COPY_ERRORS,
    TRAIL_REQUESTS,
    TRAIL_TOKEN_REFUSALS,
    NOTIFY_EVENTS,
    NOTIFY_EVENTS_DROPPED,
    NOTIFY_STREAM_LENGTH,
    NOTIFY_DELIVERIES,
    NOTIFY_ATTEMPT_SECONDS,
    NOTIFY_PENDING,
    NOTIFY_OLDEST_PENDING_SECONDS,
    NOTIFY_DEAD_LETTERS,
    NOTIFY_BREAKERS_OPEN,
    NOTIFY_API_REQUESTS,
    NOTIFY_NOTICES,
    HISTORY_PARTITIONS_HELD,
    AGGREGATE_HOURS,
    AGGREGATE_CELLS,
    AGGREGATE_HOUR_SECONDS,
    AGGREGATE_LAG_SECONDS,
    AGGREGATE_ERRORS,
    AUDIT_ROWS_EXPIRED,
    AGGREGATE_REQUESTS,
    ERASURE_REQUESTS,
    ERASURE_POINTS,
    ACCESS_REQUESTS,
    WEB_REQUESTS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_prometheus_names() {
        let mut seen = std::collections::HashSet::new();
        for n in ALL {
            assert!(seen.insert(n), "{n} twice");
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{n}"
            );
        }
    }
}
