//! Customer tracking: the orders API, short-lived tracking tokens, and the viewer gateway that
//! lets a customer (or the restaurant) watch ONE order's courier over MQTT-over-WebSocket.
//!
//! ```text
//! order service --POST /orders/{order}/assign, /tracking-token, /events--> [orders] --Lua--> Redis
//!     (order:courier, courier:order, orders:ended, idempotency records; PUBLISH orders:ended:channel)
//! broker --track/+ (ONE subscription per process)--> [source] --> [hub: last point + bounded
//!     queue per viewer, oldest dropped] --> [session] --MQTT 3.1.1 / 5 over WebSocket--> viewer
//! Redis orders:ended:channel --> [source: ended orders] --> hub: close that order's viewers
//! ```
//!
//! The embedded rumqttd cannot do this itself: it has no per-topic authorization and its
//! WebSocket listener speaks MQTT 3.1.1 only. Pure parts: `authz` (token, filters), `queue`
//! (per-viewer queue, pacing), `codec` (packets, on rumqttc's codecs), `hub`. Edges: `source`
//! (MQTT, Redis pub/sub), `gateway` + `session` (WebSocket), `orders` (HTTP + Redis).

pub(crate) mod authz;
pub mod config;
pub mod error;
pub mod events;
mod gateway;
pub(crate) mod hub;
mod orders;
pub(crate) mod queue;
mod session;
mod source;

pub use config::FanoutConfig;
pub use edge::codec;
pub use edge::transport::{PATH, SUBPROTOCOL};
pub use error::FanoutError;
pub use events::{Stats, ViewerRefusal};

use courier_auth::{SigningKey, Verifier};
use courier_wire::{Keys, MqttEndpoint, RedisConn, RedisOptions, RedisTarget};
use hub::Hub;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The fanout role: orders API + viewer gateway of one process.
pub struct Fanout {
    pub config: FanoutConfig,
    pub mqtt: MqttEndpoint,
    /// One Redis or a cluster (then `keys` must carry a hash tag).
    pub redis: RedisTarget,
    pub keys: Keys,
    /// Mints tracking tokens (`viewer.key`).
    pub signer: SigningKey,
    /// Checks them at the gateway (`viewer.pub` and the signer's own public key).
    pub verifier: Verifier,
    /// Where the gateway listens (`WS_LISTEN`); gives the default `public_ws_url`.
    pub ws_listen: SocketAddr,
    /// Shared with whoever reports progress (tests, benchmarks).
    pub stats: Arc<Stats>,
}

/// A fanout role connected to Redis, ready to serve.
pub struct Prepared {
    gateway: Arc<gateway::Gateway>,
    api: Arc<orders::OrdersApi>,
    mqtt: MqttEndpoint,
    redis_target: RedisTarget,
}

impl Fanout {
    /// Validates the settings and connects to Redis (an error if it is unreachable now).
    pub async fn prepare(self) -> Result<Prepared, FanoutError> {
        self.config
            .validate()
            .map_err(|e| FanoutError::Config(e.to_string()))?;
        let service_key = self
            .config
            .require_service_key()
            .map_err(FanoutError::Config)?
            .to_string();
        self.redis
            .check_prefix(self.keys.prefix())
            .map_err(|e| FanoutError::Config(format!("redis.key_prefix {e}")))?;
        let redis = RedisConn::connect(&self.redis, &RedisOptions::default()).await?;
        let nofile = courier_wire::limits::raise_nofile(0);
        if nofile < self.config.max_viewers as u64 + 64 {
            tracing::warn!(
                nofile,
                max_viewers = self.config.max_viewers,
                "open-file limit is below fanout.max_viewers; the limit decides"
            );
        }
        let hub = Arc::new(Hub::default());
        let metrics = Arc::new(events::Metrics::new());
        let ws_url = self
            .config
            .public_ws_url
            .clone()
            .unwrap_or_else(|| format!("ws://{}{}", self.ws_listen, PATH));
        let api = Arc::new(
            orders::OrdersApi::new(
                redis.clone(),
                self.keys.clone(),
                self.signer,
                service_key,
                self.config.token_ttl,
                ws_url,
                self.config.idempotency_ttl,
                hub.clone(),
                self.stats.clone(),
                self.config.events_stream_max,
                self.config.max_orders_per_courier,
            )
            .with_tracking_page(self.config.tracking_page_url.clone()),
        );
        let gateway = Arc::new(gateway::Gateway {
            hub,
            tokens: self.verifier,
            redis,
            keys: self.keys,
            config: self.config,
            metrics,
            stats: self.stats,
            connections: AtomicUsize::new(0),
            token_sessions: Default::default(),
            token_hasher: Default::default(),
        });
        Ok(Prepared {
            gateway,
            api,
            mqtt: self.mqtt,
            redis_target: self.redis,
        })
    }
}

impl Prepared {
    /// The orders API, to be served on `HTTP_LISTEN`.
    pub fn router(&self) -> axum::Router {
        orders::router(self.api.clone())
    }

    /// Runs the gateway on `listener` (bound by the caller, so a port in use is a start-up
    /// error), its `track/+` source and its ended-orders listener until `shutdown`; then
    /// closes every viewer and returns.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), FanoutError> {
        let gw = self.gateway;
        let tasks = TaskTracker::new();
        tasks.spawn(source::tracks(
            self.mqtt,
            gw.hub.clone(),
            gw.metrics.clone(),
            gw.stats.clone(),
            shutdown.clone(),
        ));
        tasks.spawn(source::ended_orders(
            self.redis_target,
            gw.redis.clone(),
            gw.keys.clone(),
            gw.hub.clone(),
            gw.stats.clone(),
            shutdown.clone(),
        ));
        let (hub, keep, stop) = (gw.hub.clone(), gw.config.token_ttl, shutdown.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => hub.prune(Instant::now(), keep),
                }
            }
        });
        tasks.close();
        let served = gateway::serve(gw, listener, shutdown).await;
        tasks.wait().await;
        served
    }
}
