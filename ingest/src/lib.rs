//! The live path of courier-pipeline.
//!
//! ```text
//! broker --$share/<group>/couriers/+/loc--> [source: receive loop] --bounded queue-->
//!   [worker: batch -> one Lua call] --> Redis (seq check, GEOADD couriers:live, ZADD couriers:seen)
//!   [worker] --accepted points of couriers with an order--> broker track/<order>
//! [sweep] --> Redis: evict silent couriers, forget old seq state
//! ```
//!
//! `batch` is the pure core (validation, script arguments, reply parsing); `source` and `sink`
//! are the MQTT and Redis edges; `events` counts.

pub mod arrival;
pub mod batch;
pub mod config;
pub mod error;
pub mod events;
pub mod pack;
pub mod sink;
pub(crate) mod source;
mod sweep;
mod worker;

pub use config::IngestConfig;
pub use error::IngestError;
pub use events::Stats;
pub use sink::RedisSink;

use courier_wire::{Keys, MqttEndpoint, RedisTarget};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The ingest role: `workers` MQTT clients in the shared-subscription group plus the sweep.
pub struct Ingest {
    pub config: IngestConfig,
    pub mqtt: MqttEndpoint,
    /// One Redis or a cluster (then `keys` must carry a hash tag).
    pub redis: RedisTarget,
    pub keys: Keys,
    /// Shared with whoever reports progress (status line, tests).
    pub stats: Arc<Stats>,
}

impl Ingest {
    /// Connects to Redis (an error if it is unreachable now), then runs until `shutdown`:
    /// intake stops, queued messages are written, the last tracks published, and it returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), IngestError> {
        self.config
            .validate()
            .map_err(|e| IngestError::Config(e.to_string()))?;
        let sink = RedisSink::connect(
            &self.redis,
            self.keys.clone(),
            self.config.events_stream_max,
        )
        .await?;
        self.stats.redis_up.set(true);
        let metrics = Arc::new(events::Metrics::new());
        let tasks = TaskTracker::new();
        for n in 0..self.config.workers {
            let (config, mqtt, sink) = (self.config.clone(), self.mqtt.clone(), sink.clone());
            let (metrics, stats, shutdown) =
                (metrics.clone(), self.stats.clone(), shutdown.clone());
            tasks.spawn(async move {
                worker::run(n, &config, &mqtt, sink, metrics, stats, shutdown).await;
            });
        }
        tasks.spawn(sweep::run(
            self.config.clone(),
            sink,
            metrics,
            self.stats.clone(),
            shutdown,
        ));
        tasks.close();
        tasks.wait().await;
        Ok(())
    }
}
