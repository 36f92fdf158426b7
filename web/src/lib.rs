//! The live maps, served by the pipeline itself on `HTTP_LISTEN` (docs/maps.md):
//!
//! - `/ops` (operations staff, an `ops` token): every live courier in the view, refreshed from
//!   `couriers:live` by a bounding-box query (`api.rs`, pure core `live.rs`), clustered past
//!   `web.max_markers`; a courier's card; his trail through the audited trail API; totals from
//!   the pipeline's own metrics (`totals.rs`).
//! - `/track/<order>?token=` (a customer, his tracking token): the courier's marker, over MQTT
//!   on WebSocket at the viewer gateway like any customer app; `/track/<order>/status` says
//!   whether the order still runs.
//!
//! The pages and their bundles are embedded (`assets.rs`; built from `web/ui/` by `./dev web`).

pub mod api;
pub mod assets;
pub mod config;
pub mod error;
pub mod live;
pub(crate) mod totals;

pub use api::{MetricsText, Web};
pub use config::WebConfig;
pub use error::WebError;
