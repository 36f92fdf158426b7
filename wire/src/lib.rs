//! The wire format of courier-pipeline, with no I/O (features `mqtt`, `redis`, `http-client` and
//! `api` add the client options, the Redis connection every role shares, the tools' HTTP client
//! and the error answer of the HTTP APIs).
//!
//! Everything clients and operators depend on by name lives here: the MQTT topics
//! (`couriers/{id}/loc`, `couriers/{id}/status`, `track/{order}`), the point payload and its
//! validation, the Redis key names, the `track/{order}` payload and the Prometheus metric
//! names. Every stage (ingest, history, fanout, simulator) uses this crate, so a point that one
//! stage accepts is a point every stage accepts.

#[cfg(feature = "api")]
pub mod api_error;
pub mod clock;
pub mod config_error;
pub mod duration;
pub mod endpoint;
pub mod events;
pub mod health;
#[cfg(feature = "http-client")]
pub mod http_client;
pub mod keys;
pub mod limits;
pub mod metrics;
#[cfg(feature = "mqtt")]
pub mod mqtt;
pub mod point;
#[cfg(feature = "redis")]
pub mod redis_conn;
pub mod redis_target;
pub mod seq_state;
pub mod topic;
pub mod track;

#[cfg(feature = "api")]
pub use api_error::ApiError;
pub use config_error::ConfigError;
pub use endpoint::MqttEndpoint;
pub use keys::Keys;
pub use point::{decode_point, Invalid, Point, Validation};
#[cfg(feature = "redis")]
pub use redis_conn::{RedisConn, RedisOptions};
pub use redis_target::RedisTarget;
pub use seq_state::SeqState;
pub use topic::{loc_topic, parse_courier_topic, status_topic, track_topic, CourierTopic};
pub use track::encode_track;
