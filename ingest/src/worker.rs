//! One ingest worker: its MQTT receive loop, and the writer that turns queued messages into
//! batch script calls and publishes the tracks of couriers with an order.

use crate::batch::{self, Entry, Message, Verdict};
use crate::config::IngestConfig;
use crate::events::{Metrics, Stats};
use crate::sink::RedisSink;
use crate::source;
use courier_wire::clock::unix_now;
use courier_wire::{encode_track, topic, track_topic, MqttEndpoint, Validation};
use rumqttc::{AsyncClient, QoS};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every batch task of a worker shares.
struct Ctx {
    sink: RedisSink,
    client: AsyncClient,
    limits: Validation,
    reset_after: f64,
    /// `ingest.seen_every`, seconds.
    seen_every: f64,
    retry_for: Duration,
    arrival: crate::arrival::Rule,
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
}

pub(crate) async fn run(
    n: usize,
    config: &IngestConfig,
    endpoint: &MqttEndpoint,
    sink: RedisSink,
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let client_id = courier_wire::mqtt::client_id(config.client_role(), n);
    // Tracks wait here for the connection; room for a few full batches.
    let options = courier_wire::mqtt::options(
        endpoint,
        &client_id,
        config.batch_max * config.max_in_flight * 2,
    );
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    courier_wire::mqtt::no_delay(&mut eventloop);
    let filters = vec![
        topic::loc_filter(&config.group),
        topic::status_filter(&config.status_group),
    ];
    let (tx, mut rx) = mpsc::channel::<Message>(config.queue_capacity);
    let done = CancellationToken::new();
    let receiver = tokio::spawn(source::receive(
        eventloop,
        client.clone(),
        filters,
        tx,
        metrics.clone(),
        stats.clone(),
        source::Lifetime {
            stop: shutdown.clone(),
            done: done.clone(),
        },
    ));

    let ctx = Arc::new(Ctx {
        sink,
        client,
        limits: config.validation(),
        reset_after: config.seq_reset_after.as_secs_f64(),
        seen_every: config.seen_every.as_secs_f64(),
        retry_for: config.redis_retry_for,
        arrival: config.arrival(),
        metrics,
        stats,
    });
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
    let tasks = TaskTracker::new();
    loop {
        let mut messages = Vec::with_capacity(config.batch_max);
        // Returns at once with what is queued (up to batch_max): batches grow with load and a
        // lone point is not held back waiting for company; only under load does the linger
        // wait for more.
        if rx.recv_many(&mut messages, config.batch_max).await == 0 {
            break; // the receive loop closed the queue and it is drained
        }
        linger(&mut rx, &mut messages, config).await;
        ctx.metrics.queue_depth.set(rx.len() as f64);
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let ctx = ctx.clone();
        tasks.spawn(async move {
            process(&ctx, messages).await;
            drop(permit);
        });
    }
    tasks.close();
    tasks.wait().await;
    done.cancel();
    let _ = receiver.await;
}

/// A batch whose first take from the queue held fewer messages than this goes at once: points
/// arrive slower than batches go, Redis has room, and waiting would only add delay.
const LINGER_FROM: usize = 16;

/// `ingest.batch_linger`: under load (the first take held at least [`LINGER_FROM`] messages) a
/// batch short of `batch_max` waits up to the linger for more; fuller batches cost Redis less
/// per point (docs/benchmarks.md, "Batch linger"). Under light load it goes at once.
async fn linger(
    rx: &mut mpsc::Receiver<Message>,
    messages: &mut Vec<Message>,
    config: &IngestConfig,
) {
    if config.batch_linger.is_zero() || messages.len() < LINGER_FROM {
        return;
    }
    let deadline = tokio::time::Instant::now() + config.batch_linger;
    while messages.len() < config.batch_max {
        let room = config.batch_max - messages.len();
        match tokio::time::timeout_at(deadline, rx.recv_many(messages, room)).await {
            Ok(0) | Err(_) => return, // the queue closed, or the linger passed
            Ok(_) => {}
        }
    }
}

/// Validates, decides in Redis, publishes tracks and counts one batch.
async fn process(ctx: &Ctx, messages: Vec<Message>) {
    let now = unix_now();
    let mut plan = batch::plan(&messages, &ctx.limits, now);
    if !plan.entries.is_empty() {
        let call = batch::script_call(&plan, now, ctx.reset_after, ctx.seen_every);
        ctx.metrics.batch_size.record(plan.entries.len() as f64);
        // One id for the batch and all its retries: a retry after a timeout gets the verdicts
        // of the run that Redis did apply.
        let batch_id = next_batch_id();
        match call_with_retry(ctx, &batch_id, &call.args).await {
            Ok(reply) => match batch::parse_reply(&reply, &call) {
                Ok(verdicts) => {
                    let arrivals = apply(ctx, &mut plan, &verdicts);
                    if !arrivals.is_empty() {
                        report_arrivals(ctx, &mut plan, &arrivals).await;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "batch script reply unreadable; batch counted as error");
                    plan.failed();
                }
            },
            Err(e) => {
                tracing::error!(error = %e, points = plan.points(), "batch not written to redis");
                plan.failed();
            }
        }
    }
    ctx.metrics.batch(&ctx.stats, &plan.tally);
}

/// An arrival a batch decided: order, courier, place.
type Arrival<'v, 'a> = (&'v str, &'a str, crate::arrival::Place);

/// Counts the verdicts, publishes every accepted point to the track of each order its courier
/// carries, and returns the arrivals at those orders' places (each order and place once).
fn apply<'v, 'a>(
    ctx: &Ctx,
    plan: &mut batch::Plan<'a>,
    verdicts: &'v [Verdict],
) -> Vec<Arrival<'v, 'a>> {
    let mut arrivals: Vec<Arrival<'v, 'a>> = Vec::new();
    let t = &mut plan.tally;
    for (entry, verdict) in plan.entries.iter().zip(verdicts) {
        match (entry, verdict) {
            (Entry::Point { point, received }, Verdict::Accepted { reset, orders }) => {
                t.accepted += 1;
                t.seq_resets += u64::from(*reset);
                ctx.metrics.phone_lag.record((received - point.ts).max(0.0));
                let Some(orders) = orders else { continue };
                for carried in orders.iter() {
                    let order = carried.order.as_str();
                    if !topic::valid_id(order) {
                        tracing::warn!(courier = %point.id, "courier:order holds an unusable order id; no track published");
                        continue;
                    }
                    let payload = encode_track(point.lat, point.lon, point.ts);
                    match ctx.client.try_publish(
                        track_topic(order),
                        QoS::AtMostOnce,
                        false,
                        payload,
                    ) {
                        Ok(()) => t.tracks_published += 1,
                        Err(_) => t.tracks_dropped += 1,
                    }
                    let Some(places) = &carried.places else {
                        continue;
                    };
                    for place in ctx.arrival.arrivals((point.lat, point.lon), places) {
                        if !arrivals.iter().any(|(o, _, p)| *o == order && *p == place) {
                            arrivals.push((order, point.id, place));
                        }
                    }
                }
            }
            (Entry::Point { .. }, _) => t.stale += 1,
            (Entry::Offline(_), _) => t.offline += 1,
        }
    }
    arrivals
}

/// One call for the batch's arrivals (rare: a courier reaches a place once per order). A
/// failure is logged and the arrival is decided again from his next point.
async fn report_arrivals(ctx: &Ctx, plan: &mut batch::Plan<'_>, arrivals: &[Arrival<'_, '_>]) {
    let args: Vec<(&str, &str, &str)> = arrivals
        .iter()
        .map(|(o, c, p)| (*o, *c, p.flag()))
        .collect();
    match ctx.sink.arrive(&args).await {
        Ok(n) => plan.tally.arrivals += n,
        Err(e) => {
            ctx.metrics.redis_error(e.is_retryable());
            tracing::warn!(error = %e, arrivals = arrivals.len(), "arrival events not written; the next point decides again");
        }
    }
}

/// An id no other batch of any process uses within the record's minute: a random seed per
/// process (RandomState is seeded from the OS) and a counter.
fn next_batch_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    format!("{seed:016x}{:x}", COUNT.fetch_add(1, Ordering::Relaxed))
}

/// Retries retryable failures with backoff until `redis_retry_for` has passed.
async fn call_with_retry(
    ctx: &Ctx,
    batch_id: &str,
    args: &[Vec<u8>],
) -> Result<Vec<redis::Value>, crate::IngestError> {
    let started = Instant::now();
    let mut backoff = Duration::from_millis(50);
    loop {
        let t0 = Instant::now();
        match ctx.sink.batch(batch_id, args).await {
            Ok(v) => {
                ctx.stats.redis_up.set(true);
                ctx.metrics.redis_seconds.record(t0.elapsed().as_secs_f64());
                return Ok(v);
            }
            Err(e) => {
                let retryable = e.is_retryable();
                ctx.stats.redis_up.set(!retryable);
                ctx.metrics.redis_error(retryable);
                if !retryable || started.elapsed() + backoff > ctx.retry_for {
                    return Err(e);
                }
                tracing::warn!(error = %e, "batch script failed; retrying");
                tokio::time::sleep(backoff).await;
                // At most 250 ms between tries: once Redis is back, the live index must be whole
                // again within one send interval (tests/it/faults.rs), not a second later.
                backoff = (backoff * 2).min(Duration::from_millis(250));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn message() -> Message {
        Message {
            topic: "couriers/c1/loc".into(),
            payload: bytes::Bytes::from_static(b"{}"),
            received: 0.0,
        }
    }

    fn config(batch_max: usize, linger_ms: u64) -> IngestConfig {
        IngestConfig {
            batch_max,
            batch_linger: Duration::from_millis(linger_ms),
            ..Default::default()
        }
    }

    /// A batch as the worker loop starts one: what is queued now, then the linger.
    async fn batch(rx: &mut mpsc::Receiver<Message>, config: &IngestConfig) -> Vec<Message> {
        let mut messages = Vec::new();
        rx.recv_many(&mut messages, config.batch_max).await;
        linger(rx, &mut messages, config).await;
        messages
    }

    fn queue(n: usize) -> (mpsc::Sender<Message>, mpsc::Receiver<Message>) {
        let (tx, rx) = mpsc::channel(1024);
        for _ in 0..n {
            tx.try_send(message()).unwrap();
        }
        (tx, rx)
    }

    /// Sends `n` messages after `after` on the paused clock.
    fn later(tx: &mpsc::Sender<Message>, after: Duration, n: usize) {
        let tx = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            for _ in 0..n {
                tx.send(message()).await.unwrap();
            }
        });
    }

    #[tokio::test(start_paused = true)]
    async fn under_light_load_a_batch_goes_at_once() {
        let (tx, mut rx) = queue(LINGER_FROM - 1);
        later(&tx, Duration::from_millis(1), 100);
        let t0 = Instant::now();
        let got = batch(&mut rx, &config(512, 20)).await;
        assert_eq!(got.len(), LINGER_FROM - 1);
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn under_load_a_batch_waits_the_linger_for_more() {
        let (tx, mut rx) = queue(LINGER_FROM);
        later(&tx, Duration::from_millis(1), 10);
        later(&tx, Duration::from_millis(5), 10); // after the linger: the next batch's
        let t0 = Instant::now();
        let got = batch(&mut rx, &config(512, 2)).await;
        assert_eq!(got.len(), LINGER_FROM + 10);
        assert_eq!(t0.elapsed(), Duration::from_millis(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_without_waiting_out_the_linger() {
        let (tx, mut rx) = queue(LINGER_FROM);
        later(&tx, Duration::from_millis(1), 100);
        let t0 = Instant::now();
        let got = batch(&mut rx, &config(LINGER_FROM + 20, 50)).await;
        assert_eq!(got.len(), LINGER_FROM + 20);
        assert_eq!(t0.elapsed(), Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_queue_ends_the_linger_with_what_it_held() {
        let (tx, mut rx) = queue(LINGER_FROM + 3);
        drop(tx);
        let t0 = Instant::now();
        let got = batch(&mut rx, &config(512, 50)).await;
        assert_eq!(got.len(), LINGER_FROM + 3);
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn no_linger_when_it_is_off() {
        let (tx, mut rx) = queue(100);
        later(&tx, Duration::from_millis(1), 100);
        let t0 = Instant::now();
        let got = batch(&mut rx, &config(512, 0)).await;
        assert_eq!(got.len(), 100);
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }
}
