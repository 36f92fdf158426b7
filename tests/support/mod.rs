//! Test support: real services started through `./dev` (the same helper the dev script uses),
//! brokers on free ports, isolated key prefixes, MQTT clients.
#![allow(dead_code)]

use courier_wire::{Keys, MqttEndpoint, RedisTarget};
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

impl Services {
    /// The shared single Redis, as the roles take it.
    pub fn redis(&self) -> RedisTarget {
        RedisTarget::single(self.redis_url.as_str())
    }
}

/// REDIS_URL / DATABASE_URL from the environment (`./dev test` sets them), else `./dev
/// services env` starts them.
pub fn services() -> &'static Services {
    static S: OnceLock<Services> = OnceLock::new();
    S.get_or_init(|| {
        if let (Ok(r), Ok(d)) = (std::env::var("REDIS_URL"), std::env::var("DATABASE_URL")) {
            return Services {
                redis_url: r,
                database_url: d,
            };
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
        Services {
            redis_url: get("REDIS_URL"),
            database_url: get("DATABASE_URL"),
        }
    })
}

pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
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

impl TestBroker {
    /// A broker some test started itself (a child process, files in `dir`).
    pub fn external(endpoint: MqttEndpoint, child: Child, dir: PathBuf) -> Self {
        TestBroker {
            endpoint,
            child: Some(child),
            _dir: Some(dir),
        }
    }

    /// Another way into a running broker (other credentials); owns nothing.
    pub fn external_view(endpoint: MqttEndpoint) -> Self {
        TestBroker {
            endpoint,
            child: None,
            _dir: None,
        }
    }
}

pub fn mosquitto_bin() -> PathBuf {
    for p in [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ] {
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
            courier_pipeline::broker::start(embedded_config(addr), addr).unwrap();
            TestBroker {
                endpoint: MqttEndpoint::new("127.0.0.1", addr.port()),
                child: None,
                _dir: None,
            }
        }
        BrokerKind::Mosquitto => start_mosquitto(addr),
    }
}

/// The shipped rumqttd configuration, listening on `addr`, anonymous.
fn embedded_config(addr: SocketAddr) -> rumqttd::Config {
    courier_pipeline::broker::load_config(None, addr).unwrap()
}

/// Starts an anonymous Mosquitto on `addr` (its configuration in `dir`) and waits until it
/// accepts connections; the caller owns the process (kill it to inject a broker fault).
pub fn mosquitto_child(addr: SocketAddr, dir: &std::path::Path) -> Child {
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {} 127.0.0.1\nallow_anonymous true\npersistence false\nqueue_qos0_messages true\nmax_queued_messages 1000000\nlog_dest stderr\nlog_type error\n",
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
        assert!(
            Instant::now() < deadline,
            "mosquitto did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// An anonymous Mosquitto child process on `addr`, once it accepts connections.
fn start_mosquitto(addr: SocketAddr) -> TestBroker {
    let dir = std::env::temp_dir().join(format!("mosq-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = mosquitto_child(addr, &dir);
    TestBroker {
        endpoint: MqttEndpoint::new("127.0.0.1", addr.port()),
        child: Some(child),
        _dir: Some(dir),
    }
}

// ---- the MQTT edge in front of a test bus (phones log in there) ----

// ---- token keys ----

/// A key directory (`AUTH_KEY_DIR`) with a fresh key pair of every audience, written once per
/// test binary; child processes get it through [`with_test_keys`].
pub fn test_key_dir() -> &'static std::path::Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!(
            "courier-test-keys-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&d).unwrap();
        for aud in courier_auth::Audience::ALL {
            let k = courier_auth::SigningKey::generate(aud).unwrap();
            std::fs::write(d.join(format!("{aud}.key")), k.to_pem()).unwrap();
            std::fs::write(d.join(format!("{aud}.pub")), k.public().to_pem()).unwrap();
        }
        d
    })
}

/// The test key directory, every private key read.
pub fn test_keys() -> &'static courier_auth::KeySet {
    static KEYS: OnceLock<courier_auth::KeySet> = OnceLock::new();
    KEYS.get_or_init(|| {
        courier_auth::KeySet::load(test_key_dir(), &courier_auth::Audience::ALL).unwrap()
    })
}

/// A token of `claims`, signed with its audience's test key.
pub fn sign(claims: &courier_auth::Claims) -> String {
    test_keys().signer(claims.aud).unwrap().sign(claims)
}

/// The public keys of `aud` that the test processes accept.
pub fn test_verifier(aud: courier_auth::Audience) -> courier_auth::Verifier {
    test_keys().verifier(aud).unwrap().clone()
}

/// `courier-pipeline` with the test key directory (and the test service key) in its
/// environment, and no AUTH_KEY_DIR / SERVICE_KEY inherited from `./dev`.
pub fn with_test_keys(cmd: &mut Command) -> &mut Command {
    cmd.env("AUTH_KEY_DIR", test_key_dir())
        .env("SERVICE_KEY", TEST_SERVICE_KEY)
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

/// Edge settings for tests: a free port, no SO_REUSEPORT, and a rate bucket that no test's
/// burst empties (the rate limit has a test of its own in edge_security).
pub fn test_edge_config() -> edge::EdgeConfig {
    edge::EdgeConfig {
        listen: "127.0.0.1:0".into(),
        reuse_port: false,
        rate_burst: 100_000.0,
        ..Default::default()
    }
}

/// A running edge: where phones connect, what it counted, how to stop it.
pub struct TestEdge {
    /// The edge's TCP listener, without a login (see [`TestEdge::login`]).
    pub phones: MqttEndpoint,
    pub stats: Arc<edge::Stats>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), edge::EdgeError>>,
}

impl TestEdge {
    /// A fresh device token of `courier` (10 minutes).
    pub fn device_token(&self, courier: &str) -> String {
        let now = courier_wire::clock::unix_now() as u64;
        sign(&courier_auth::Claims::courier(courier, now, 600))
    }

    /// The edge as `courier`'s phone logs in: username = his id, password = his token.
    pub fn login(&self, courier: &str) -> MqttEndpoint {
        MqttEndpoint {
            username: Some(courier.into()),
            password: Some(self.device_token(courier)),
            ..self.phones.clone()
        }
    }

    /// Cancels the edge and waits for `run` to return (its queue drained to the bus).
    pub async fn stop(self) {
        stop_role("edge", self.shutdown, self.task).await;
    }
}

/// A test bus with an edge in front, wired as in production: embedded rumqttd fed by the
/// edge through the in-process link (`courier-pipeline run`), or Mosquitto with the edge
/// forwarding over MQTT (`courier-pipeline edge`). The bus stays anonymous for the workers;
/// only the edge checks tokens. Returns once the edge's bus side is up.
pub async fn start_bus_with_edge(kind: BrokerKind) -> (TestBroker, TestEdge) {
    let stats = Arc::new(edge::Stats::default());
    let mut bound = edge::Edge {
        settings: test_edge_config().validate().unwrap(),
        keys: test_verifier(courier_auth::Audience::Courier),
        stats: stats.clone(),
    }
    .bind()
    .unwrap();
    let tcp = bound
        .local_addrs()
        .into_iter()
        .find(|(via, _)| *via == edge::Via::Tcp)
        .map(|(_, a)| a)
        .expect("edge TCP listener");
    let (broker, bus) = match kind {
        BrokerKind::Embedded => {
            let addr = free_addr();
            let queue = bound.take_queue().unwrap();
            courier_pipeline::broker::start_with_edge(embedded_config(addr), addr, queue).unwrap();
            let broker = TestBroker {
                endpoint: MqttEndpoint::new("127.0.0.1", addr.port()),
                child: None,
                _dir: None,
            };
            (broker, None)
        }
        BrokerKind::Mosquitto => {
            let broker = start_mosquitto(free_addr());
            let bus = broker.endpoint.clone();
            (broker, Some(bus))
        }
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(bound.run(bus, shutdown.clone()));
    let s = stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || s.bus_up.get()).await,
        "the edge did not reach the bus"
    );
    let edge = TestEdge {
        phones: MqttEndpoint::new("127.0.0.1", tcp.port()),
        stats,
        shutdown,
        task,
    };
    (broker, edge)
}

/// A courier's phone: its own connection to the edge, logged in as `courier` with a fresh
/// device token, optionally with a Will; its event loop runs in the background (abort the
/// handle to drop the socket without DISCONNECT). Panics unless the edge accepts the login.
pub async fn phone(
    edge: &TestEdge,
    courier: &str,
    will: Option<LastWill>,
) -> (AsyncClient, tokio::task::JoinHandle<()>) {
    let mut o = courier_wire::mqtt::options(
        &edge.login(courier),
        &courier_wire::mqtt::client_id("phone", 0),
        10_000,
    );
    if let Some(w) = will {
        o.set_last_will(w);
    }
    let (c, mut el) = AsyncClient::new(o, 10_000);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let h = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(Ok(()));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(Err(format!("{e:?}")));
                    }
                    return;
                }
            }
        }
    });
    match tokio::time::timeout(Duration::from_secs(5), ready_rx).await {
        Ok(Ok(Ok(()))) => (c, h),
        other => panic!("phone {courier} not logged in at the edge: {other:?}"),
    }
}

/// One phone per courier, logged in concurrently, no Will: `phones[i]` is `couriers[i]`'s.
/// Dropping a client ends its connection.
pub async fn phones<S: AsRef<str>>(edge: &TestEdge, couriers: &[S]) -> Vec<AsyncClient> {
    futures_util::future::join_all(couriers.iter().map(|c| phone(edge, c.as_ref(), None)))
        .await
        .into_iter()
        .map(|(c, _driver)| c)
        .collect()
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

/// A throwaway CA and a server certificate for 127.0.0.1 / localhost signed by it (openssl).
/// Returns (ca.crt, server.crt, server.key).
pub fn throwaway_tls(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    let p = |f: &str| dir.join(f);
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(
        p("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.crt",
    ]);
    (p("ca.crt"), p("server.crt"), p("server.key"))
}

// ---- PostgreSQL (history) ----

pub async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to postgres: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A fresh schema of its own for one test: `url` sets the search path to it, so the
/// migrations, partitions and reads of that test land there and nowhere else.
pub struct PgSchema {
    pub url: String,
    pub name: String,
}

/// Adds `options=-csearch_path=<schema>` to a PostgreSQL URL.
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

pub async fn pg_schema() -> PgSchema {
    let name = format!("t{:016x}", rand::random::<u64>());
    let base = &services().database_url;
    pg_connect(base)
        .await
        .batch_execute(&format!("CREATE SCHEMA {name}"))
        .await
        .unwrap();
    PgSchema {
        url: with_search_path(base, &name),
        name,
    }
}

impl PgSchema {
    pub async fn drop(self) {
        let _ = pg_connect(&services().database_url)
            .await
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await;
    }
}

/// A throwaway PostgreSQL cluster that a test can stop and start: initdb + pg_ctl of the newest
/// installed version, on a free port, in a temp dir, as the `postgres` user when running as root
/// (PostgreSQL refuses root), exactly as ./dev does.
pub struct TempPostgres {
    pub url: String,
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn pg_bin_dir() -> PathBuf {
    let mut dirs: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL not installed: run ./dev test (it installs it)")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e
                .file_name()
                .to_string_lossy()
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().expect("no /usr/lib/postgresql/*/bin/pg_ctl").1
}

impl TempPostgres {
    fn as_pg(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("pg-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            assert!(
                Command::new("chown")
                    .arg("postgres")
                    .arg(&dir)
                    .status()
                    .unwrap()
                    .success(),
                "chown postgres"
            );
        }
        let port = free_addr().port();
        let pg = TempPostgres {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            port,
            dir,
            bin: pg_bin_dir(),
        };
        let out = pg
            .as_pg("initdb")
            .arg("-D")
            .arg(pg.dir.join("data"))
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.start_again();
        pg
    }

    /// Starts the (stopped) server again on the same port.
    pub fn start_again(&self) {
        let out = self
            .as_pg("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "30", "-o"])
            .arg(format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
                self.port,
                self.dir.display()
            ))
            .arg("start")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the server (fast: open transactions are rolled back, connections cut).
    pub fn stop(&self) {
        let out = self
            .as_pg("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        let _ = self
            .as_pg("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---- HTTP ----

/// A response as received.
pub struct HttpReply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl HttpReply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// GET over a real socket (HTTP/1.1, one request per connection).
pub async fn http_get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> HttpReply {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("http timeout")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("no header end");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    HttpReply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

// ---- fanout: orders API, viewer gateway, viewers ----

/// Development-only service key of the orders API in tests.
pub const TEST_SERVICE_KEY: &str = "fanout-test-service-key-0123";

pub struct RunningFanout {
    pub stats: Arc<fanout::Stats>,
    /// Orders API.
    pub http: SocketAddr,
    /// Viewer gateway.
    pub ws: SocketAddr,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), fanout::FanoutError>>,
}

impl RunningFanout {
    pub async fn stop(self) {
        stop_role("fanout", self.shutdown, self.task).await;
    }
}

/// Fanout settings for tests: the defaults with the test service key.
pub fn test_fanout_config() -> fanout::FanoutConfig {
    fanout::FanoutConfig {
        service_key: Some(TEST_SERVICE_KEY.into()),
        ..Default::default()
    }
}

/// Starts a fanout role (orders API + gateway, each on a port of its own) and waits until its
/// `track/+` subscription is acknowledged.
pub async fn start_fanout(
    broker: &TestBroker,
    keys: Keys,
    config: fanout::FanoutConfig,
) -> RunningFanout {
    start_fanout_on(broker, &services().redis(), keys, config).await
}

/// [`start_fanout`] on another Redis.
pub async fn start_fanout_on(
    broker: &TestBroker,
    redis: &RedisTarget,
    keys: Keys,
    config: fanout::FanoutConfig,
) -> RunningFanout {
    let http_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ws_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http, ws) = (http_l.local_addr().unwrap(), ws_l.local_addr().unwrap());
    let stats = Arc::new(fanout::Stats::default());
    let prepared = fanout::Fanout {
        config,
        mqtt: broker.endpoint.clone(),
        redis: redis.clone(),
        keys,
        signer: test_keys()
            .signer(courier_auth::Audience::Viewer)
            .unwrap()
            .clone(),
        verifier: test_verifier(courier_auth::Audience::Viewer),
        ws_listen: ws,
        stats: stats.clone(),
    }
    .prepare()
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    let (router, stop) = (prepared.router(), shutdown.clone());
    tokio::spawn(async move {
        axum::serve(http_l, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    let task = tokio::spawn(prepared.run(ws_l, shutdown.clone()));
    let s = stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || s
            .source_subscribed
            .load(Relaxed)
            >= 1)
        .await,
        "fanout source did not subscribe"
    );
    RunningFanout {
        stats,
        http,
        ws,
        shutdown,
        task,
    }
}

/// An HTTP answer: status, headers (lower-case names), JSON body (Null when not JSON).
#[derive(Debug)]
pub struct HttpAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
    pub raw_body: String,
}

impl HttpAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A plain HTTP/1.1 POST over a socket (`Connection: close`).
pub async fn http_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpAnswer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("HTTP answer")
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, raw_body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = serde_json::from_str(raw_body).unwrap_or(serde_json::Value::Null);
    HttpAnswer {
        status,
        headers,
        body,
        raw_body: raw_body.to_string(),
    }
}

/// POST with the test service key.
pub async fn api(f: &RunningFanout, path: &str, body: &str) -> HttpAnswer {
    http_post(
        f.http,
        path,
        &[("Authorization", &format!("Bearer {TEST_SERVICE_KEY}"))],
        body,
    )
    .await
}

/// Assigns `courier` to `order` and returns a customer token for it.
pub async fn assign_and_token(f: &RunningFanout, order: &str, courier: &str) -> String {
    let a = api(
        f,
        &format!("/orders/{order}/assign"),
        &format!(r#"{{"courier_id":"{courier}"}}"#),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    let t = api(
        f,
        &format!("/orders/{order}/tracking-token"),
        r#"{"viewer":"customer"}"#,
    )
    .await;
    assert_eq!(t.status, 200, "{t:?}");
    t.body["token"].as_str().unwrap().to_string()
}

/// What a test viewer saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    Connected,
    /// One entry per filter: granted or not.
    SubAck(Vec<bool>),
    Point {
        topic: String,
        payload: bytes::Bytes,
    },
    /// MQTT 5: the DISCONNECT reason code the gateway sent.
    Disconnect(u8),
    /// The connection ended (refused CONNECT included): the error, as text.
    Closed(String),
}

/// An MQTT 3.1.1 viewer over ws:// (rumqttc v4 client).
pub async fn viewer_v4(
    ws: SocketAddr,
    token: &str,
) -> (AsyncClient, mpsc::UnboundedReceiver<Seen>) {
    let id = courier_wire::mqtt::client_id("viewer4", 0);
    let mut o = rumqttc::MqttOptions::new(id, format!("ws://{ws}/mqtt"), ws.port());
    o.set_transport(rumqttc::Transport::Ws)
        .set_keep_alive(Duration::from_secs(30))
        .set_credentials("customer", token);
    let (c, mut el) = AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let seen = match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => Seen::Connected,
                Ok(Event::Incoming(Packet::SubAck(a))) => Seen::SubAck(
                    a.return_codes
                        .iter()
                        .map(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_)))
                        .collect(),
                ),
                Ok(Event::Incoming(Packet::Publish(p))) => Seen::Point {
                    topic: p.topic,
                    payload: p.payload,
                },
                Ok(_) => continue,
                Err(e) => {
                    let _ = tx.send(Seen::Closed(format!("{e:?}")));
                    return;
                }
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    (c, rx)
}

/// An MQTT 5 viewer over ws:// (rumqttc v5 client).
pub async fn viewer_v5(
    ws: SocketAddr,
    token: &str,
) -> (rumqttc::v5::AsyncClient, mpsc::UnboundedReceiver<Seen>) {
    use rumqttc::v5::mqttbytes::v5::Packet as P5;
    use rumqttc::v5::Event as E5;
    let id = courier_wire::mqtt::client_id("viewer5", 0);
    let mut o = rumqttc::v5::MqttOptions::new(id, format!("ws://{ws}/mqtt"), ws.port());
    o.set_transport(rumqttc::Transport::Ws)
        .set_keep_alive(Duration::from_secs(30))
        .set_credentials("customer", token);
    let (c, mut el) = rumqttc::v5::AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let seen = match el.poll().await {
                Ok(E5::Incoming(P5::ConnAck(_))) => Seen::Connected,
                Ok(E5::Incoming(P5::SubAck(a))) => Seen::SubAck(
                    a.return_codes
                        .iter()
                        .map(|c| {
                            matches!(
                                c,
                                rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                            )
                        })
                        .collect(),
                ),
                Ok(E5::Incoming(P5::Publish(p))) => Seen::Point {
                    topic: String::from_utf8_lossy(&p.topic).to_string(),
                    payload: p.payload,
                },
                Ok(E5::Incoming(P5::Disconnect(d))) => Seen::Disconnect(d.reason_code as u8),
                Ok(_) => continue,
                // rumqttc reports the server's DISCONNECT as an error of the event loop.
                Err(rumqttc::v5::ConnectionError::MqttState(
                    rumqttc::v5::StateError::ServerDisconnect { reason_code, .. },
                )) => {
                    let _ = tx.send(Seen::Disconnect(reason_code as u8));
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Seen::Closed(format!("{e:?}")));
                    return;
                }
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    (c, rx)
}

/// The next thing a viewer saw, within `within`.
pub async fn next_seen(rx: &mut mpsc::UnboundedReceiver<Seen>, within: Duration) -> Option<Seen> {
    tokio::time::timeout(within, rx.recv()).await.ok().flatten()
}

/// Removes every key of a test prefix, fanout's included.
pub async fn cleanup_all(keys: &Keys) {
    cleanup(keys).await;
    let mut r = redis().await;
    let mut doomed: Vec<String> = vec![keys.order_courier.clone(), keys.orders_ended.clone()];
    let mut cursor = 0u64;
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}*", keys.order_event_idem))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut r)
            .await
            .unwrap();
        doomed.extend(found);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let _: () = redis::cmd("DEL")
        .arg(&doomed)
        .query_async(&mut r)
        .await
        .unwrap();
}

/// Runs `courier-pipeline token <args>` with the test key directory and returns the token it
/// prints (the test fails, with the command's stderr, if it does not succeed).
pub fn cli_token(args: &[&str]) -> String {
    cli_token_with(test_key_dir(), args)
}

/// [`cli_token`] with another key directory.
pub fn cli_token_with(dir: &std::path::Path, args: &[&str]) -> String {
    let out = with_test_keys(&mut Command::new(env!("CARGO_BIN_EXE_courier-pipeline")))
        .env("AUTH_KEY_DIR", dir)
        .arg("token")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

// ---- Redis Cluster ----

/// A Redis Cluster of this test alone (3 primaries + 3 replicas), started by `./dev cluster up`
/// on six free consecutive ports (each with its cluster-bus port, +10000) and stopped when
/// dropped. Opt-in: only the tests that need one pay its start-up (about 6 s).
pub struct TestCluster {
    pub first_port: u16,
    /// Seed URLs of every node.
    pub nodes: Vec<String>,
}

/// One node as `CLUSTER NODES` shows it.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    /// A replica's primary.
    pub primary_id: Option<String>,
    /// Slot ranges a primary serves.
    pub slots: Vec<(u16, u16)>,
}

fn ports_free(first: u16) -> bool {
    (first..first + 6)
        .flat_map(|p| [p, p + 10_000])
        .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

impl TestCluster {
    pub fn start() -> TestCluster {
        let first_port = (0..50)
            .map(|_| 20_000 + (rand::random::<u16>() % 1_000) * 6)
            .find(|&p| ports_free(p))
            .expect("no six free ports for a test cluster");
        let out = Command::new(repo_root().join("dev"))
            .args(["cluster", "up"])
            .env("DEV_CLUSTER_PORT", first_port.to_string())
            .stderr(Stdio::inherit())
            .output()
            .expect("running ./dev cluster up");
        assert!(out.status.success(), "./dev cluster up failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let nodes = text
            .lines()
            .find_map(|l| l.strip_prefix("REDIS_CLUSTER_NODES="))
            .expect("./dev cluster up printed no REDIS_CLUSTER_NODES")
            .split(',')
            .map(str::to_string)
            .collect();
        TestCluster { first_port, nodes }
    }

    pub fn target(&self) -> RedisTarget {
        RedisTarget::parse_cluster(&self.nodes).unwrap()
    }

    /// A plain connection to one node (what it alone holds, or a node-local command).
    pub async fn node(&self, port: u16) -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// `CLUSTER NODES` as seen from `port`.
    pub async fn topology(&self, port: u16) -> Vec<ClusterNode> {
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut self.node(port).await)
            .await
            .unwrap();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let port = f.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                let flags = f.get(2)?;
                if flags.contains("fail") && !flags.contains("fail?") {
                    return None;
                }
                let slots = f[8.min(f.len())..]
                    .iter()
                    .filter_map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                Some(ClusterNode {
                    id: f[0].to_string(),
                    port,
                    primary: flags.contains("master"),
                    primary_id: (f[3] != "-").then(|| f[3].to_string()),
                    slots,
                })
            })
            .collect()
    }

    /// The primary serving `slot` and its replica, as a node that is up sees them.
    pub async fn shard_of(&self, slot: u16, ask: u16) -> (ClusterNode, Option<ClusterNode>) {
        let t = self.topology(ask).await;
        let primary = t
            .iter()
            .find(|n| n.primary && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .cloned()
            .unwrap_or_else(|| panic!("no primary serves slot {slot}: {t:?}"));
        let replica = t
            .iter()
            .find(|n| n.primary_id.as_deref() == Some(primary.id.as_str()))
            .cloned();
        (primary, replica)
    }

    /// The port of the primary serving `slot` as `ask` sees it; `None` while no node that is up
    /// serves it (a primary failed, its replica not promoted yet).
    pub async fn primary_port(&self, slot: u16, ask: u16) -> Option<u16> {
        self.topology(ask)
            .await
            .into_iter()
            .find(|n| n.primary && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|n| n.port)
    }

    /// The slot of `key` (CLUSTER KEYSLOT).
    pub async fn slot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut self.node(self.first_port).await)
            .await
            .unwrap()
    }

    /// Every key of every primary that is up: (port, key).
    pub async fn keys_by_node(&self) -> Vec<(u16, String)> {
        let mut all = Vec::new();
        for n in self.topology(self.up_port().await).await {
            if !n.primary {
                continue;
            }
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*")
                .query_async(&mut self.node(n.port).await)
                .await
                .unwrap();
            all.extend(keys.into_iter().map(|k| (n.port, k)));
        }
        all
    }

    /// A node that answers.
    pub async fn up_port(&self) -> u16 {
        for p in self.first_port..self.first_port + 6 {
            if std::net::TcpStream::connect(("127.0.0.1", p)).is_ok() {
                return p;
            }
        }
        panic!("no node of the cluster answers");
    }

    /// The pid of the server on `port` (to kill it as a crash does).
    pub fn pid(&self, port: u16) -> u32 {
        let f = repo_root()
            .join(".dev")
            .join(format!("cluster-{}", self.first_port))
            .join(format!("{port}.pid"));
        std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("dev"))
            .args(["cluster", "down"])
            .env("DEV_CLUSTER_PORT", self.first_port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
