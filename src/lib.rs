//! courier-pipeline: the process. It reads the configuration, starts the roles a command asks
//! for (MQTT edge, embedded bus broker, ingest, history writer and trail API, fanout) and stops
//! them in order.
//!
//! ```text
//! courier phone --couriers/<id>/loc--> edge (courier policy) --> bus (embedded rumqttd via an
//!   in-process link, or external at MQTT_URL; workers only)
//!   --$share/ingest--> ingest --> Redis couriers:live / couriers:seen, bus track/<order>
//!   --$share/history--> history writer --> PostgreSQL courier_points (trail API on HTTP_LISTEN)
//!   --track/+--> fanout viewer gateway (WS_LISTEN) --> customers
//! ```

pub mod app;
pub mod broker;
pub mod config;
pub mod http;
pub mod telemetry;

pub use app::{run, Role, RunOptions};
pub use config::{Config, FileConfig, Overrides};
