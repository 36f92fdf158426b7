//! Every Prometheus metric name of courier-pipeline, in one place. Labels never carry a courier
//! or order id: their values come from small fixed sets (results, reasons).

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
/// Counter, label `reason`: silent | offline. Couriers removed from the live index.
pub const INGEST_EVICTED: &str = "ingest_evicted_total";
/// Counter, label `state`: connected | disconnected. MQTT connection changes of a role.
pub const MQTT_CONNECTION_EVENTS: &str = "mqtt_connection_events_total";
/// Counter: `CursorJump` alerts of the embedded broker (a slow subscriber lost messages).
pub const BROKER_CURSOR_JUMPS: &str = "broker_cursor_jumps_total";
/// Counter: other alerts of the embedded broker.
pub const BROKER_ALERTS_OTHER: &str = "broker_alerts_other_total";
/// Gauge: viewers connected to this gateway process (CONNECT accepted, not yet gone).
pub const FANOUT_VIEWERS_CONNECTED: &str = "fanout_viewers_connected";
/// Counter, label `reason`: bad_token | expired_token | order_ended | filter | publish |
/// protocol | timeout | max_viewers | unavailable. Viewers refused at CONNECT, SUBSCRIBE filters refused,
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

/// Histogram buckets for the batch script round trip and phone lag (seconds).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Histogram buckets for batch sizes.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];
