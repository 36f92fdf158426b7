//! Load for courier-pipeline: couriers moving at about 30 km/h inside a bounding box, each
//! publishing `{"id","lat","lon","ts","seq"}` QoS 0 on `couriers/{id}/loc` at a fixed interval,
//! over `connections` MQTT connections, against any broker.
//!
//! Sits before the broker in the data flow: `simulator --couriers/{id}/loc--> broker`.
//! `motion` is the pure part (movement, payloads); `run` is the MQTT edge.

pub mod motion;

use courier_wire::{loc_topic, MqttEndpoint};
use motion::{BBox, Courier};
use rand::{rngs::SmallRng, SeedableRng};
use courier_wire::clock::unix_now;
use rumqttc::{AsyncClient, Event, Outgoing, QoS};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub couriers: usize,
    /// Each courier sends one point per interval.
    pub interval: Duration,
    /// MQTT connections the couriers are spread over.
    pub connections: usize,
    /// Stop after this long (`None`: until shutdown).
    pub duration: Option<Duration>,
    pub bbox: BBox,
    /// Courier ids are `<prefix><5-digit number>`.
    pub id_prefix: String,
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            couriers: 1000,
            interval: Duration::from_secs(4),
            connections: 8,
            duration: None,
            bbox: BBox::RIYADH,
            id_prefix: "c".into(),
            seed: 42,
        }
    }
}

impl SimConfig {
    /// Points per second this configuration asks for.
    pub fn expected_rate(&self) -> f64 {
        self.couriers as f64 / self.interval.as_secs_f64()
    }
}

/// Points handed to the MQTT connections so far.
#[derive(Debug, Default)]
pub struct SimStats {
    pub sent: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulator: {0}")]
    Config(String),
}

/// Final figures.
#[derive(Debug, Clone)]
pub struct Report {
    pub sent: u64,
    pub seconds: f64,
}

impl Report {
    /// The summary line in the reference article's form.
    pub fn line(&self, cfg: &SimConfig) -> String {
        format!(
            "sim: {} couriers every {}s -> expected {:.0} msg/s; sent {} in {:.1}s = {:.0} msg/s",
            cfg.couriers,
            cfg.interval.as_secs_f64(),
            cfg.expected_rate(),
            self.sent,
            self.seconds,
            self.sent as f64 / self.seconds.max(1e-9)
        )
    }
}

/// Publishes until `duration` passes or `shutdown` fires.
pub async fn run(
    cfg: SimConfig,
    endpoint: MqttEndpoint,
    stats: Arc<SimStats>,
    shutdown: CancellationToken,
) -> Result<Report, SimError> {
    if cfg.couriers == 0 || cfg.connections == 0 || cfg.interval.is_zero() {
        return Err(SimError::Config("couriers, connections and interval must be above zero".into()));
    }
    let stop = shutdown.child_token();
    let started = Instant::now();
    let connections = cfg.connections.min(cfg.couriers);
    let mut tasks = Vec::new();
    for k in 0..connections {
        let ids: Vec<usize> = (k..cfg.couriers).step_by(connections).collect();
        tasks.push(tokio::spawn(connection(k, ids, cfg.clone(), endpoint.clone(), stats.clone(), stop.clone())));
    }
    if let Some(d) = cfg.duration {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(d) => stop.cancel(),
                _ = stop.cancelled() => {}
            }
        });
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(Report {
        sent: stats.sent.load(Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One MQTT connection carrying the points of `ids`, paced evenly: every 10 ms it sends what
/// the rate says is due, so the load is smooth rather than a burst per interval.
async fn connection(
    k: usize,
    ids: Vec<usize>,
    cfg: SimConfig,
    endpoint: MqttEndpoint,
    stats: Arc<SimStats>,
    stop: CancellationToken,
) {
    let o = courier_wire::mqtt::options(&endpoint, &courier_wire::mqtt::client_id("sim", k), 4096);
    let (client, mut eventloop) = AsyncClient::new(o, 4096);
    let ev_stop = stop.clone();
    let driver = tokio::spawn(async move {
        loop {
            tokio::select! {
                ev = eventloop.poll() => match ev {
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
                    Ok(_) => {}
                    Err(e) => {
                        if ev_stop.is_cancelled() { break; }
                        tracing::warn!(error = %e, "simulator connection failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                },
            }
        }
    });

    let mut rng = SmallRng::seed_from_u64(cfg.seed.wrapping_add(k as u64));
    let now = unix_now();
    let mut couriers: Vec<(String, String, Courier)> = ids
        .iter()
        .map(|&i| {
            let id = format!("{}{i:05}", cfg.id_prefix);
            let topic = loc_topic(&id);
            (id, topic, Courier::new(cfg.bbox, &mut rng, now))
        })
        .collect();
    let rate = couriers.len() as f64 / cfg.interval.as_secs_f64();
    let started = Instant::now();
    let mut sent = 0u64;
    let mut next = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    'outer: loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        let now = unix_now();
        let mut batch = 0u64;
        while sent < due {
            let (id, topic, c) = &mut couriers[next];
            next = (next + 1) % ids.len();
            let payload = c.advance(now, &mut rng, cfg.bbox).payload(id);
            if client.publish(topic.clone(), QoS::AtMostOnce, false, payload).await.is_err() {
                break 'outer;
            }
            sent += 1;
            batch += 1;
            if stop.is_cancelled() {
                break;
            }
        }
        stats.sent.fetch_add(batch, Relaxed);
    }
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), driver).await;
}
