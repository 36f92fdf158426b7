//! courier-pipeline: the process. It reads the configuration, starts the roles a command asks
//! for (embedded broker, ingest, history writer and trail API; fanout comes later) and stops
//! them in order.
//!
//! ```text
//! courier phone --couriers/<id>/loc--> broker (embedded rumqttd or external)
//!   --$share/ingest--> ingest --> Redis couriers:live / couriers:seen, broker track/<order>
//!   --$share/history--> history writer --> PostgreSQL courier_points (trail API on HTTP_LISTEN)
//! ```

pub mod app;
pub mod broker;
pub mod config;
pub mod telemetry;

pub use app::{run, Role, RunOptions};
pub use config::{Config, FileConfig, Overrides};
