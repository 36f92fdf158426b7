//! Test support: real services started through `./dev` (the same helper the dev script uses),
//! brokers on free ports, isolated key prefixes, MQTT clients.
#![allow(dead_code)]

use courier_wire::{Keys, MqttEndpoint};
use ingest::{Ingest, IngestConfig, Stats};
use rumqttc::{AsyncClient, Event, LastWill, Packet, Publish, QoS};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub struct Services {
    pub redis_url: String,
    pub database_url: String,
}

/// REDIS_URL / DATABASE_URL from the environment (`./dev test` sets them), else `./dev
/// services env` starts them.
pub fn services() -> &'static Services {
    static S: OnceLock<Services> = OnceLock::new();
    S.get_or_init(|| {
        if let (Ok(r), Ok(d)) = (std::env::var("REDIS_URL"), std::env::var("DATABASE_URL")) {
            return Services { redis_url: r, database_url: d };
        }
        let out = Command::new(repo_root().join("dev"))
            .args(["services", "env"])
            .stderr(Stdio::inherit())
            .output()
            .expect("running ./dev services env");
        assert!(out.status.success(), "./dev services env failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
                .unwrap_or_else(|| panic!("./dev services env printed no {k}"))
        };
        Services { redis_url: get("REDIS_URL"), database_url: get("DATABASE_URL") }
    })
}

pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A key prefix no other test uses.
pub fn prefix() -> String {
    format!("t{:016x}:", rand::random::<u64>())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    Embedded,
    Mosquitto,
}

pub struct TestBroker {
    pub endpoint: MqttEndpoint,
    child: Option<Child>,
    _dir: Option<PathBuf>,
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(d) = &self._dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

pub fn mosquitto_bin() -> PathBuf {
    for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("mosquitto not installed: run ./dev test (it installs it)");
}

/// Starts a broker on a free port: rumqttd in this process, or a Mosquitto child process.
pub fn start_broker(kind: BrokerKind) -> TestBroker {
    let addr = free_addr();
    match kind {
        BrokerKind::Embedded => {
            let config = courier_pipeline::broker::load_config(None, addr).unwrap();
            courier_pipeline::broker::start(config, addr).unwrap();
            TestBroker { endpoint: MqttEndpoint::new("127.0.0.1", addr.port()), child: None, _dir: None }
        }
        BrokerKind::Mosquitto => {
            let dir = std::env::temp_dir().join(format!("mosq-{:x}", rand::random::<u64>()));
            std::fs::create_dir_all(&dir).unwrap();
            let conf = dir.join("mosquitto.conf");
            std::fs::write(
                &conf,
                format!(
                    "listener {} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\nlog_type error\n",
                    addr.port()
                ),
            )
            .unwrap();
            let child = Command::new(mosquitto_bin())
                .arg("-c")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("starting mosquitto");
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::net::TcpStream::connect(addr).is_err() {
                assert!(Instant::now() < deadline, "mosquitto did not listen on {addr}");
                std::thread::sleep(Duration::from_millis(20));
            }
            TestBroker {
                endpoint: MqttEndpoint::new("127.0.0.1", addr.port()),
                child: Some(child),
                _dir: Some(dir),
            }
        }
    }
}

pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(services().redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Ingest settings for tests: the defaults, with sweeps fast enough to watch.
pub fn test_ingest_config() -> IngestConfig {
    IngestConfig { sweep_every: Duration::from_millis(200), ..Default::default() }
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
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("ingest did not stop within 10s")
            .unwrap()
            .unwrap();
    }
}

/// Starts the ingest role against `broker` with a fresh key prefix and waits until every
/// worker's subscriptions are acknowledged.
pub async fn start_ingest(broker: &TestBroker, config: IngestConfig, keys: Keys) -> RunningIngest {
    let stats = Arc::new(Stats::default());
    let shutdown = CancellationToken::new();
    let workers = config.workers as u64;
    let ingest = Ingest {
        config,
        mqtt: broker.endpoint.clone(),
        redis_url: services().redis_url.clone(),
        keys: keys.clone(),
        stats: stats.clone(),
    };
    let task = tokio::spawn(ingest.run(shutdown.clone()));
    let s = stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || s.subscriptions_acked.load(Relaxed) >= 2 * workers).await,
        "ingest workers did not subscribe"
    );
    RunningIngest { stats, keys, shutdown, task }
}

/// An MQTT client whose event loop runs in the background.
pub async fn client(endpoint: &MqttEndpoint, will: Option<LastWill>) -> (AsyncClient, tokio::task::JoinHandle<()>) {
    let mut o = courier_wire::mqtt::options(endpoint, &courier_wire::mqtt::client_id("test", 0), 10_000);
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
    tokio::time::timeout(Duration::from_secs(5), ready_rx.recv()).await.expect("client did not connect");
    (c, h)
}

/// Subscribes and hands every received publish to the returned channel.
pub async fn subscriber(endpoint: &MqttEndpoint, filter: &str) -> mpsc::UnboundedReceiver<Publish> {
    let o = courier_wire::mqtt::options(endpoint, &courier_wire::mqtt::client_id("test-sub", 0), 100);
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
    tokio::time::timeout(Duration::from_secs(5), ready_rx.recv()).await.expect("no SUBACK");
    rx
}

pub fn point(id: &str, lat: f64, lon: f64, ts: f64, seq: u64) -> Vec<u8> {
    format!(r#"{{"id":"{id}","lat":{lat},"lon":{lon},"ts":{ts},"seq":{seq}}}"#).into_bytes()
}

pub async fn publish(c: &AsyncClient, topic: &str, payload: Vec<u8>) {
    c.publish(topic, QoS::AtMostOnce, false, payload).await.unwrap();
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

/// GEOPOS of one member, rounded to what Redis GEO keeps (about 6 decimals).
pub async fn geopos(r: &mut redis::aio::MultiplexedConnection, keys: &Keys, id: &str) -> Option<(f64, f64)> {
    let v: Vec<Option<(f64, f64)>> = redis::cmd("GEOPOS").arg(&keys.live).arg(id).query_async(r).await.unwrap();
    v.into_iter().next().flatten().map(|(lon, lat)| (lat, lon))
}

pub fn near(a: (f64, f64), b: (f64, f64)) -> bool {
    (a.0 - b.0).abs() < 1e-5 && (a.1 - b.1).abs() < 1e-5
}

/// Removes every key of a test prefix.
pub async fn cleanup(keys: &Keys) {
    let mut r = redis().await;
    let _: () = redis::cmd("DEL").arg(&keys.live).arg(&keys.seen).arg(&keys.order).arg(&keys.seq).query_async(&mut r).await.unwrap();
}
