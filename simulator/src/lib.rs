//! Load for courier-pipeline: couriers moving at about 30 km/h inside a bounding box, each
//! publishing `{"id","lat","lon","ts","seq"}` QoS 0 on `couriers/{id}/loc`, against any broker;
//! and customers watching their orders on `track/{order}`, measuring the phone-to-viewer delay.
//!
//! ```text
//! simulator --couriers/<id>/loc, couriers/<id>/status--> broker --> pipeline
//!   customer path:  --POST /orders/{order}/assign, /tracking-token, /events--> orders API
//!                   <--track/<order> over WebSocket (token)-- viewer gateway (watchers)
//!   fallback:       --courier:order--> Redis;  <--track/<order>-- broker (watchers)
//! ```
//!
//! The pure part: `motion` (movement, payloads), `phone` (profiles, faults, offline buffer),
//! `faults` (who fails when), `histogram`, `report`. The edges: `links` (MQTT connections, one
//! per courier by default, each with its Last Will), `watchers` (orders and viewers), `orders`
//! (the orders API client).

pub mod cli;
pub mod config;
pub(crate) mod faults;
pub(crate) mod histogram;
pub mod links;
pub(crate) mod motion;
pub(crate) mod orders;
pub(crate) mod phone;
pub mod report;
pub mod watchers;

pub use config::{Faults, Mix, Profile, SimConfig, Watchers};
pub use report::{Report, Second, SimStats};

use courier_wire::{clock::unix_now, loc_topic, status_topic, MqttEndpoint};
use links::{Link, Opener};
use phone::{Action, Counts, Kind, Phone};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use rumqttc::QoS;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use watchers::{Assigner, Viewer};

/// A simulator failure.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A setting that cannot work.
    #[error("simulator: {0}")]
    Config(String),
    /// Assigning orders in Redis failed.
    #[error("simulator: redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// An orders API call failed: no answer (`status` None) or an answer other than 200.
    #[error("simulator: orders API: {message}")]
    Api {
        status: Option<u16>,
        message: String,
    },
}

impl SimError {
    /// True when the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            SimError::Config(_) => false,
            SimError::Redis(e) => e.is_io_error() || e.is_connection_dropped() || e.is_timeout(),
            SimError::Api { status, .. } => matches!(status, None | Some(503)),
        }
    }
}

/// Request queue of a shared connection: deep, since it carries thousands of couriers.
const SHARED_QUEUE: usize = 16_384;
/// Request queue of one phone's connection: a few points while it connects.
const PHONE_QUEUE: usize = 32;
/// Shards (tasks) that drive the phones when every phone has its own connection.
const PHONE_SHARDS: usize = 4;
/// Most phones one shard wakes before yielding, so stop and the clock are checked.
const WAKE_BATCH: usize = 4096;

/// The simulator: couriers and, with `watchers.orders`, customers.
pub struct Simulator {
    pub config: SimConfig,
    pub mqtt: MqttEndpoint,
    /// More addresses of the same broker (other listeners, or cluster nodes): courier
    /// connections are spread over `mqtt` and these. One source address has about 28,000
    /// ephemeral ports per destination, so 50,000 phones on one machine need two.
    pub also: Vec<MqttEndpoint>,
    pub assigner: Assigner,
    pub viewer: Viewer,
    pub stats: Arc<SimStats>,
    /// Device tokens for courier connections (see [`links::CourierLogin`]).
    pub courier_login: Option<links::CourierLogin>,
}

impl Simulator {
    /// Runs until `duration` passes or `shutdown` fires; `on_second` sees each second's
    /// figures (the progress line). Returns every figure of the run.
    pub async fn run(
        self,
        shutdown: CancellationToken,
        mut on_second: impl FnMut(&Second),
    ) -> Result<Report, SimError> {
        let cfg = Arc::new(self.config);
        cfg.validate().map_err(SimError::Config)?;
        self.assigner.check(&self.viewer)?;
        let watched_via = (cfg.watchers.orders > 0).then(|| self.viewer.label());
        // Each watcher holds a connection too, so shared mode raises the limit as well.
        let want =
            cfg.connections.unwrap_or(cfg.couriers) as u64 + cfg.watchers.orders as u64 + 1024;
        let got = courier_wire::limits::raise_nofile(want);
        if got < want {
            tracing::warn!(
                want,
                got,
                "open-file limit below one descriptor per connection; some will not connect"
            );
        }
        let stats = self.stats.clone();
        let stop = shutdown.child_token();
        let start = unix_now();
        let mut rng = SmallRng::seed_from_u64(cfg.seed);

        // Phones, their kinds and faults; then the orders.
        let phones = build_phones(&cfg, start, &mut rng);
        let mut kinds: Vec<(Kind, usize)> = Vec::new();
        for p in &phones {
            match kinds.iter_mut().find(|(k, _)| *k == p.kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((p.kind, 1)),
            }
        }
        let active = phones.iter().filter(|p| p.active()).count();
        let expected = phone::expected_rate(&cfg, &kinds);
        let tag: u32 = rng.random();
        let picks: Vec<(Kind, bool)> = phones
            .iter()
            .map(|p| (p.kind, p.plan.is_faulty()))
            .collect();
        let pairs: Vec<(String, String)> = phone::pick_order_couriers(&picks, cfg.watchers.orders)
            .into_iter()
            .enumerate()
            .map(|(n, i)| (phones[i].id.clone(), format!("o{tag:08x}-{n:05}")))
            .collect();

        // Watchers first, so the first tracks are seen.
        let watch_stop = CancellationToken::new();
        let watch_tasks = TaskTracker::new();
        if !pairs.is_empty() {
            if let Err(e) = self.assigner.assign(&pairs).await {
                // Leave nothing half-assigned behind.
                let _ = self.assigner.finish(&pairs).await;
                return Err(e);
            }
            let mut ready = Vec::new();
            for (n, (_, order)) in pairs.iter().enumerate() {
                let r = CancellationToken::new();
                ready.push(r.clone());
                watch_tasks.spawn(watchers::watch(
                    self.viewer.clone(),
                    self.assigner.clone(),
                    n,
                    order.clone(),
                    stats.clone(),
                    r,
                    watch_stop.clone(),
                ));
            }
            let all = async {
                for r in &ready {
                    r.cancelled().await;
                }
            };
            if tokio::time::timeout(Duration::from_secs(10), all)
                .await
                .is_err()
            {
                tracing::warn!(
                    "not every watcher subscribed within 10s; measuring with those that did"
                );
            }
        }
        watch_tasks.close();

        // Couriers: shards of phones, each shard one task.
        let opener = Opener {
            endpoints: Arc::new(
                std::iter::once(self.mqtt.clone())
                    .chain(self.also.iter().cloned())
                    .collect(),
            ),
            stats: stats.clone(),
            permits: Arc::new(Semaphore::new(cfg.connect_concurrency)),
            tasks: TaskTracker::new(),
            courier_login: self.courier_login.clone(),
        };
        let shards = match cfg.connections {
            Some(k) => k.min(cfg.couriers),
            None => PHONE_SHARDS.min(cfg.couriers),
        };
        let groups = deal(phones, shards);
        let started = Instant::now();
        let mut shard_tasks = Vec::new();
        for (k, group) in groups.into_iter().enumerate() {
            let seed = cfg.seed.wrapping_add(k as u64 + 1);
            shard_tasks.push(tokio::spawn(shard(
                k,
                group,
                cfg.clone(),
                opener.clone(),
                seed,
                stop.clone(),
            )));
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

        // One progress line a second until the shards stop.
        let mut per_second = Vec::new();
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let (mut last_sent, mut last_upd) = (0, 0);
        let all_done = futures_join(shard_tasks);
        tokio::pin!(all_done);
        let links = loop {
            tokio::select! {
                links = &mut all_done => break links,
                _ = tick.tick() => {
                    let (sent, upd) = (stats.sent.load(Relaxed), stats.watcher_updates.load(Relaxed));
                    let h = stats.take_second();
                    let s = Second {
                        t: started.elapsed().as_secs_f64().round() as u64,
                        sent: sent - last_sent,
                        waiting: stats.queued.load(Relaxed).saturating_sub(sent),
                        watcher_updates: upd - last_upd,
                        connections_up: stats.connections_up.load(Relaxed),
                        delay_p50_ms: h.quantile(0.5).map(|v| v as f64 / 1000.0),
                        delay_p99_ms: h.quantile(0.99).map(|v| v as f64 / 1000.0),
                        watched_via,
                    };
                    (last_sent, last_upd) = (sent, upd);
                    on_second(&s);
                    per_second.push(s);
                }
            }
        };
        let seconds = started.elapsed().as_secs_f64();

        // Shift end: courier connections say DISCONNECT (after `offline` on their own
        // connection); the last tracks have a moment to arrive; then everything is closed.
        opener.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), opener.tasks.wait()).await;
        drop(links);
        tokio::time::sleep(Duration::from_millis(if pairs.is_empty() {
            0
        } else {
            300
        }))
        .await;
        watch_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), watch_tasks.wait()).await;
        let orders_ended = match self.assigner.finish(&pairs).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "could not end this run's orders");
                0
            }
        };

        let (sent, queued) = (stats.sent.load(Relaxed), stats.queued.load(Relaxed));
        let (cpu_seconds, max_rss_kib) = report::own_usage();
        Ok(Report {
            couriers: cfg.couriers,
            active,
            interval: cfg.interval_label(),
            connections: cfg
                .connections
                .map_or("per_courier".to_string(), |k| k.to_string()),
            orders: pairs.len(),
            assigned_via: self.assigner.label().to_string(),
            watched_via: self.viewer.label().to_string(),
            orders_ended,
            expected_rate: expected,
            seconds,
            sent,
            rate: sent as f64 / seconds.max(1e-9),
            queued,
            unsent: queued.saturating_sub(sent),
            status_sent: stats.status_sent.load(Relaxed),
            client_dropped: stats.client_dropped.load(Relaxed),
            connects: stats.connects.load(Relaxed),
            connect_errors: stats.connect_errors.load(Relaxed),
            connections_max: stats.connections_max.load(Relaxed),
            faults: stats.counts(),
            watcher_updates: stats.watcher_updates.load(Relaxed),
            watcher_bad: stats.watcher_bad.load(Relaxed),
            watcher_initial: stats.watcher_initial.load(Relaxed),
            watcher_errors: stats.watcher_errors.load(Relaxed),
            delay: report::Delay::of(&stats.delay_total()),
            cpu_seconds,
            max_rss_kib,
            per_second,
        })
    }
}

/// The run's phones, courier `i` at index `i`, with their kinds and faults.
fn build_phones(cfg: &SimConfig, start: f64, rng: &mut SmallRng) -> Vec<Phone> {
    let window = cfg.fault_window();
    (0..cfg.couriers)
        .map(|i| {
            let kind = Kind::of(&cfg.profile, i);
            let plan = if kind == Kind::OffShift {
                faults::Plan::default()
            } else {
                faults::Plan::draw(&cfg.faults, start, window, rng)
            };
            Phone::new(
                format!("{}{i:05}", cfg.id_prefix),
                i,
                kind,
                plan,
                cfg,
                start,
                rng,
            )
        })
        .collect()
}

/// Deals the phones over `shards` in turn: courier `i` to shard `i % shards`.
fn deal(phones: Vec<Phone>, shards: usize) -> Vec<Vec<Phone>> {
    let mut groups: Vec<Vec<Phone>> = (0..shards).map(|_| Vec::new()).collect();
    for (i, p) in phones.into_iter().enumerate() {
        groups[i % shards].push(p);
    }
    groups
}

/// Waits for every shard and gathers the links they still hold.
async fn futures_join(tasks: Vec<tokio::task::JoinHandle<Vec<Link>>>) -> Vec<Link> {
    let mut links = Vec::new();
    for t in tasks {
        match t.await {
            Ok(l) => links.extend(l),
            Err(e) => tracing::error!(error = %e, "simulator shard panicked"),
        }
    }
    links
}

/// Where a shard's points go.
enum Conns {
    /// Every phone its own connection (index = phone), `None` while offline or off shift.
    PerPhone(Vec<Option<Link>>),
    /// One connection for the whole shard.
    Shared(Link),
}

/// Drives a group of phones: wakes each when due (a heap of due times), does what it asks.
/// Returns its links after saying goodbye on them, so the caller can let them finish.
async fn shard(
    k: usize,
    mut phones: Vec<Phone>,
    cfg: Arc<SimConfig>,
    opener: Opener,
    seed: u64,
    stop: CancellationToken,
) -> Vec<Link> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let topics: Vec<String> = phones.iter().map(|p| loc_topic(&p.id)).collect();
    let mut conns = match cfg.connections {
        Some(_) => Conns::Shared(opener.open(k, k, None, SHARED_QUEUE)),
        None => Conns::PerPhone((0..phones.len()).map(|_| None).collect()),
    };
    let stats = opener.stats.clone();
    let base = Instant::now();
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::with_capacity(phones.len());
    let mut out = Vec::new();
    let mut counts = Counts::default();
    let (mut queued, mut status, mut dropped) = (0u64, 0u64, 0u64);
    for i in 0..phones.len() {
        if let Some(first) = phones[i].start(&cfg, &mut rng, &mut out) {
            heap.push(Reverse(((first * 1e9) as u64, i as u32)));
        }
        apply(
            i,
            &mut out,
            &phones,
            &topics,
            &mut conns,
            &opener,
            &mut queued,
            &mut status,
            &mut dropped,
        )
        .await;
    }
    let mut last_flush = Instant::now();
    'run: loop {
        let Some(&Reverse((due, _))) = heap.peek() else {
            stop.cancelled().await;
            break;
        };
        let at = base + Duration::from_nanos(due);
        if at > Instant::now() {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(at.into()) => {}
            }
        }
        let now = Instant::now();
        let wall = unix_now();
        for _ in 0..WAKE_BATCH {
            let Some(&Reverse((due, i))) = heap.peek() else {
                break;
            };
            if base + Duration::from_nanos(due) > now {
                break;
            }
            heap.pop();
            let i = i as usize;
            let gap = phones[i].wake(wall, &cfg, &mut rng, &mut out, &mut counts);
            heap.push(Reverse((due + (gap * 1e9) as u64, i as u32)));
            if !apply(
                i,
                &mut out,
                &phones,
                &topics,
                &mut conns,
                &opener,
                &mut queued,
                &mut status,
                &mut dropped,
            )
            .await
            {
                break 'run;
            }
        }
        if last_flush.elapsed() >= Duration::from_millis(100) {
            flush(&stats, &mut counts, &mut queued, &mut status, &mut dropped);
            last_flush = Instant::now();
        }
        if stop.is_cancelled() {
            break;
        }
        tokio::task::yield_now().await;
    }
    flush(&stats, &mut counts, &mut queued, &mut status, &mut dropped);
    // Shift end: a clean DISCONNECT (no Will); a phone's own connection says `offline` first.
    match conns {
        Conns::Shared(link) => {
            let _ = link.client.try_disconnect();
            vec![link]
        }
        Conns::PerPhone(links) => links
            .into_iter()
            .zip(&phones)
            .filter_map(|(l, p)| {
                let l = l?;
                let _ =
                    l.client
                        .try_publish(status_topic(&p.id), QoS::AtLeastOnce, false, "offline");
                let _ = l.client.try_disconnect();
                Some(l)
            })
            .collect(),
    }
}

fn flush(
    stats: &SimStats,
    counts: &mut Counts,
    queued: &mut u64,
    status: &mut u64,
    dropped: &mut u64,
) {
    stats.queued.fetch_add(std::mem::take(queued), Relaxed);
    stats.status_sent.fetch_add(std::mem::take(status), Relaxed);
    stats
        .client_dropped
        .fetch_add(std::mem::take(dropped), Relaxed);
    stats.add_counts(&std::mem::take(counts));
}

/// Does what phone `i` asked. A shared connection takes points with back-pressure (the
/// simulator slows down rather than drops); a phone's own connection never blocks the shard:
/// when its queue is full the point is dropped and counted. Returns false when a shared
/// connection is gone.
#[allow(clippy::too_many_arguments)]
async fn apply(
    i: usize,
    out: &mut Vec<Action>,
    phones: &[Phone],
    topics: &[String],
    conns: &mut Conns,
    opener: &Opener,
    queued: &mut u64,
    status: &mut u64,
    dropped: &mut u64,
) -> bool {
    for a in out.drain(..) {
        match conns {
            Conns::Shared(link) => {
                if let Action::Send(p) | Action::Flush(p) = a {
                    if link
                        .client
                        .publish(topics[i].clone(), QoS::AtMostOnce, false, p)
                        .await
                        .is_err()
                    {
                        return false;
                    }
                    *queued += 1;
                }
            }
            Conns::PerPhone(links) => match a {
                Action::Connect => {
                    links[i] = Some(opener.open(i, phones[i].n, Some(&phones[i].id), PHONE_QUEUE))
                }
                Action::Drop => links[i] = None,
                Action::Online => {
                    if let Some(l) = &links[i] {
                        // QoS 1: a status is rare and matters; and only points go at QoS 0, which
                        // is how the link counts what it wrote (`SimStats::sent`).
                        match l.client.try_publish(
                            status_topic(&phones[i].id),
                            QoS::AtLeastOnce,
                            false,
                            "online",
                        ) {
                            Ok(()) => *status += 1,
                            Err(_) => *dropped += 1,
                        }
                    }
                }
                Action::Send(p) | Action::Flush(p) => match &links[i] {
                    Some(l) => {
                        match l
                            .client
                            .try_publish(topics[i].clone(), QoS::AtMostOnce, false, p)
                        {
                            Ok(()) => *queued += 1,
                            Err(_) => *dropped += 1,
                        }
                    }
                    None => *dropped += 1,
                },
            },
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opener(ports: &[u16]) -> Opener {
        Opener {
            endpoints: Arc::new(
                ports
                    .iter()
                    .map(|&p| MqttEndpoint::new("127.0.0.1", p))
                    .collect(),
            ),
            stats: Arc::new(SimStats::default()),
            permits: Arc::new(Semaphore::new(1)),
            tasks: TaskTracker::new(),
            courier_login: None,
        }
    }

    #[test]
    fn per_courier_connections_go_round_robin_over_every_endpoint_across_shards() {
        let cfg = SimConfig {
            couriers: 6,
            connections: None,
            id_prefix: "c".into(),
            ..Default::default()
        };
        let opener = opener(&[1001, 1002, 1003]);
        let phones = build_phones(&cfg, 1_764_460_800.0, &mut SmallRng::seed_from_u64(1));
        let groups = deal(phones, PHONE_SHARDS.min(cfg.couriers));
        // Four shards: an index within a shard would give 0 0 0 0 1 1, and all phones at 0
        // was the old bug; only the run's number gives 0 1 2 0 1 2.
        assert!(groups.len() > 1, "the phones are sharded");
        let mut ports: Vec<(usize, u16)> = groups
            .iter()
            .flatten()
            .map(|p| {
                let i: usize = p.id.strip_prefix("c").unwrap().parse().unwrap();
                (i, opener.endpoint(p.n).port)
            })
            .collect();
        ports.sort();
        assert_eq!(
            ports,
            [
                (0, 1001),
                (1, 1002),
                (2, 1003),
                (3, 1001),
                (4, 1002),
                (5, 1003)
            ]
        );
    }
}
