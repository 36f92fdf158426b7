//! Redis, the ingest role and plain MQTT clients on the bus: the live path's helpers.

use super::*;

pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(services().redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Ingest settings for tests: the defaults, with sweeps fast enough to watch.
pub fn test_ingest_config() -> IngestConfig {
    IngestConfig {
        sweep_every: Duration::from_millis(200),
        ..Default::default()
    }
}

/// Cancels a role started by a test and waits (10 s at most) for it to return without error.
pub async fn stop_role<E: std::fmt::Debug>(
    what: &str,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), E>>,
) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap_or_else(|_| panic!("{what} did not stop within 10s"))
        .unwrap()
        .unwrap();
}

pub struct RunningIngest {
    pub stats: Arc<Stats>,
    pub keys: Keys,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), ingest::IngestError>>,
}

impl RunningIngest {
    /// Stops intake, drains, and waits for the role to return.
    pub async fn stop(self) {
        stop_role("ingest", self.shutdown, self.task).await;
    }
}

/// Starts the ingest role against `broker` with a fresh key prefix and waits until every
/// worker's subscriptions are acknowledged.
pub async fn start_ingest(broker: &TestBroker, config: IngestConfig, keys: Keys) -> RunningIngest {
    start_ingest_on(broker, &services().redis(), config, keys).await
}

/// [`start_ingest`] on another Redis (one a test may stop).
pub async fn start_ingest_on(
    broker: &TestBroker,
    redis: &RedisTarget,
    config: IngestConfig,
    keys: Keys,
) -> RunningIngest {
    let stats = Arc::new(Stats::default());
    let shutdown = CancellationToken::new();
    let workers = config.workers as u64;
    let ingest = Ingest {
        config,
        mqtt: broker.endpoint.clone(),
        redis: redis.clone(),
        keys: keys.clone(),
        stats: stats.clone(),
    };
    let task = tokio::spawn(ingest.run(shutdown.clone()));
    let s = stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || s
            .subscriptions_acked
            .load(Relaxed)
            >= 2 * workers)
        .await,
        "ingest workers did not subscribe"
    );
    RunningIngest {
        stats,
        keys,
        shutdown,
        task,
    }
}

/// An MQTT client whose event loop runs in the background.
pub async fn client(
    endpoint: &MqttEndpoint,
    will: Option<LastWill>,
) -> (AsyncClient, tokio::task::JoinHandle<()>) {
    let mut o =
        courier_wire::mqtt::options(endpoint, &courier_wire::mqtt::client_id("test", 0), 10_000);
    if let Some(w) = will {
        o.set_last_will(w);
    }
    let (c, mut el) = AsyncClient::new(o, 10_000);
    let (ready_tx, mut ready_rx) = mpsc::channel(1);
    let h = tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = ready_tx.try_send(());
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(5), ready_rx.recv())
        .await
        .expect("client did not connect");
    (c, h)
}

/// Subscribes and hands every received publish to the returned channel.
pub async fn subscriber(endpoint: &MqttEndpoint, filter: &str) -> mpsc::UnboundedReceiver<Publish> {
    let o =
        courier_wire::mqtt::options(endpoint, &courier_wire::mqtt::client_id("test-sub", 0), 100);
    let (c, mut el) = AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready_rx) = mpsc::channel(1);
    c.subscribe(filter, QoS::AtMostOnce).await.unwrap();
    tokio::spawn(async move {
        let _keep = c;
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = ready_tx.try_send(());
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(5), ready_rx.recv())
        .await
        .expect("no SUBACK");
    rx
}

pub fn point(id: &str, lat: f64, lon: f64, ts: f64, seq: u64) -> Vec<u8> {
    format!(r#"{{"id":"{id}","lat":{lat},"lon":{lon},"ts":{ts},"seq":{seq}}}"#).into_bytes()
}

pub async fn publish(c: &AsyncClient, topic: &str, payload: Vec<u8>) {
    c.publish(topic, QoS::AtMostOnce, false, payload)
        .await
        .unwrap();
}

pub async fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// [`wait_until`] for a condition that must await (an HTTP call, a query).
pub async fn wait_until_async<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Hands each message `rx` receives to `f` until `f` returns true (it has what it waits for)
/// or `timeout` passes; returns whether it got there.
pub async fn recv_until(
    rx: &mut mpsc::UnboundedReceiver<Publish>,
    timeout: Duration,
    mut f: impl FnMut(Publish) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while let Ok(Some(p)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        if f(p) {
            return true;
        }
    }
    false
}

/// GEOPOS of one member, rounded to what Redis GEO keeps (about 6 decimals).
pub async fn geopos(
    r: &mut redis::aio::MultiplexedConnection,
    keys: &Keys,
    id: &str,
) -> Option<(f64, f64)> {
    let v: Vec<Option<(f64, f64)>> = redis::cmd("GEOPOS")
        .arg(&keys.live)
        .arg(id)
        .query_async(r)
        .await
        .unwrap();
    v.into_iter().next().flatten().map(|(lon, lat)| (lat, lon))
}

pub fn near(a: (f64, f64), b: (f64, f64)) -> bool {
    (a.0 - b.0).abs() < 1e-5 && (a.1 - b.1).abs() < 1e-5
}

/// Removes every key of a test prefix.
pub async fn cleanup(keys: &Keys) {
    let mut r = redis().await;
    let _: () = redis::cmd("DEL")
        .arg(&keys.live)
        .arg(&keys.seen)
        .arg(&keys.order)
        .arg(&keys.seq)
        .arg(&keys.order_courier)
        .arg(&keys.orders_ended)
        .arg(&keys.order_tenant)
        .arg(&keys.order_places)
        .arg(&keys.events)
        .arg(&keys.events_dropped)
        .query_async(&mut r)
        .await
        .unwrap();
}

/// How many couriers had a point accepted at or after `t` (server time): the server time in
/// their seq state, not `couriers:seen`, which ingest writes once per `ingest.seen_every` bucket
/// and so lags by up to that.
pub async fn accepted_since<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    keys: &Keys,
    t: f64,
) -> redis::RedisResult<u64> {
    redis::Script::new(
        "local kv, n, t = redis.call('HGETALL', KEYS[1]), 0, tonumber(ARGV[1])
         for i = 2, #kv, 2 do
           local v = kv[i]
           if #v == 33 and select(5, struct.unpack('<Bdddd', v)) >= t then n = n + 1 end
         end
         return n",
    )
    .key(&keys.seq)
    .arg(t)
    .invoke_async(conn)
    .await
}
