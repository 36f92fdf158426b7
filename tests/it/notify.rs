//! Order events out of the pipeline, on real engines: the orders API (fanout) writes events to
//! Redis, the notify role relays them into the PostgreSQL outbox and delivers them as signed
//! webhooks to a real local HTTP receiver that fails on purpose. Signatures are checked with
//! the Standard Webhooks specification's own library, as a consumer would.

use crate::common;
use crate::support;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use common::Proc;
use courier_wire::Keys;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");

/// What the receiver does with one request.
#[derive(Debug, Clone)]
enum Act {
    Answer(u16),
    /// 429 with `Retry-After: <s>`.
    TooMany(u64),
    /// Answers nothing for this long (past the sender's timeout).
    Hang(Duration),
}

#[derive(Debug, Clone)]
struct Hit {
    at: Instant,
    id: String,
    body: serde_json::Value,
    verified: bool,
    /// 0: no answer given.
    answered: u16,
}

#[derive(Clone, Default)]
struct Receiver {
    script: Arc<Mutex<VecDeque<Act>>>,
    /// What to do once the script is spent.
    after: Arc<Mutex<Option<Act>>>,
    secret: Arc<Mutex<Option<String>>>,
    hits: Arc<Mutex<Vec<Hit>>>,
}

async fn receive(
    State(r): State<Receiver>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let act = r
        .script
        .lock()
        .unwrap()
        .pop_front()
        .or_else(|| r.after.lock().unwrap().clone())
        .unwrap_or(Act::Answer(204));
    let secret = r.secret.lock().unwrap().clone().unwrap_or_default();
    let verified = standardwebhooks::Webhook::new(&secret)
        .map(|w| w.verify(&body, &headers).is_ok())
        .unwrap_or(false);
    let answered = match act {
        Act::Answer(c) => c,
        Act::TooMany(_) => 429,
        Act::Hang(_) => 0,
    };
    r.hits.lock().unwrap().push(Hit {
        at: Instant::now(),
        id: headers
            .get("webhook-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        body: serde_json::from_slice(&body).unwrap_or_default(),
        verified,
        answered,
    });
    match act {
        Act::Answer(c) => StatusCode::from_u16(c).unwrap().into_response(),
        Act::TooMany(s) => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", s.to_string())],
        )
            .into_response(),
        Act::Hang(d) => {
            tokio::time::sleep(d).await;
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

async fn start_receiver() -> (Receiver, SocketAddr) {
    let r = Receiver::default();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(r.clone());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (r, addr)
}

impl Receiver {
    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
    /// The webhook ids answered 2xx, with how often.
    fn delivered(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for h in self
            .hits()
            .iter()
            .filter(|h| (200..300).contains(&h.answered))
        {
            *m.entry(h.id.clone()).or_default() += 1;
        }
        m
    }
}

/// Fast retry settings, so a test sees several attempts in a few seconds.
fn fast() -> notify::NotifyConfig {
    notify::NotifyConfig {
        poll_interval: Duration::from_millis(50),
        timeout: Duration::from_millis(500),
        lease: Duration::from_secs(2),
        retry_base: Duration::from_millis(200),
        retry_max_delay: Duration::from_secs(2),
        relay_claim_after: Duration::from_secs(1),
        ..Default::default()
    }
}

struct RunningNotify {
    http: SocketAddr,
    stats: Arc<notify::Stats>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), notify::NotifyError>>,
}

async fn start_notify(
    keys: &Keys,
    database_url: &str,
    config: notify::NotifyConfig,
) -> RunningNotify {
    let stats = Arc::new(notify::Stats::default());
    let n = notify::Notify {
        config,
        redis: courier_wire::RedisTarget::single(services().redis_url.clone()),
        database_url: database_url.to_string(),
        keys: keys.clone(),
        stats: stats.clone(),
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = l.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let (router, stop) = (n.router(TEST_SERVICE_KEY.into()), shutdown.clone());
    tokio::spawn(async move {
        axum::serve(l, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    let task = tokio::spawn(n.run(shutdown.clone()));
    RunningNotify {
        http,
        stats,
        shutdown,
        task,
    }
}

impl RunningNotify {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("notify stops within its deadline")
            .unwrap()
            .unwrap();
    }
}

fn bearer() -> String {
    format!("Bearer {TEST_SERVICE_KEY}")
}

/// Registers an endpoint of `tenant` for every kind; returns (id, secret).
async fn register(notify: SocketAddr, tenant: &str, url: &str) -> (i64, String) {
    let r = http_post(
        notify,
        "/webhooks/endpoints",
        &[("Authorization", &bearer())],
        &format!(
            r#"{{"tenant":"{tenant}","url":"{url}","kinds":["order.assigned","order.picked_up","order.delivered"]}}"#
        ),
    )
    .await;
    assert_eq!(r.status, 201, "{r:?}");
    (
        r.body["id"].as_i64().unwrap(),
        r.body["secret"].as_str().unwrap().to_string(),
    )
}

async fn order_event(f: &RunningFanout, order: &str, event: &str) {
    let r = http_post(
        f.http,
        &format!("/orders/{order}/events"),
        &[
            ("Authorization", &bearer()),
            ("Idempotency-Key", &format!("{order}-{event}")),
        ],
        &format!(r#"{{"event":"{event}"}}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
}

async fn assign(f: &RunningFanout, order: &str, courier: &str, tenant: &str) {
    let r = api(
        f,
        &format!("/orders/{order}/assign"),
        &format!(r#"{{"courier_id":"{courier}","tenant":"{tenant}"}}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
}

/// What every test here runs on: a fresh schema and key prefix, a bus, the orders API.
struct Env {
    schema: PgSchema,
    keys: Keys,
    broker: TestBroker,
    f: RunningFanout,
}

async fn env() -> Env {
    let schema = pg_schema().await;
    let keys = Keys::with_prefix(&prefix());
    let broker = start_broker(BrokerKind::Embedded);
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    Env {
        schema,
        keys,
        broker,
        f,
    }
}

async fn finish(f: RunningFanout, keys: Keys, schema: PgSchema) {
    f.stop().await;
    cleanup(&keys).await;
    schema.drop().await;
}

#[tokio::test]
async fn every_event_arrives_signed_through_a_500_a_timeout_and_a_429() {
    let Env {
        schema,
        keys,
        broker: _bus,
        f,
    } = env().await;
    let n = start_notify(&keys, &schema.url, fast()).await;
    let (rx, rx_addr) = start_receiver().await;
    let (_, secret) = register(n.http, "acme", &format!("http://{rx_addr}/hook")).await;
    *rx.secret.lock().unwrap() = Some(secret);
    rx.script.lock().unwrap().extend([
        Act::Answer(500),
        Act::Hang(Duration::from_millis(1500)),
        Act::TooMany(1),
    ]);

    assign(&f, "o-1", "c-1", "acme").await;
    // Another tenant's order: none of its events may reach acme's endpoint.
    assign(&f, "o-2", "c-2", "globex").await;
    order_event(&f, "o-1", "picked_up").await;
    order_event(&f, "o-1", "delivered").await;
    // Assigning the same courier again is no new event; a replayed event key changes nothing.
    assign(&f, "o-3", "c-3", "acme").await;
    assign(&f, "o-3", "c-3", "acme").await;

    let done = wait_until(Duration::from_secs(20), || rx.delivered().len() >= 4).await;
    let hits = rx.hits();
    assert!(done, "not every event arrived: {hits:#?}");
    // Exactly the four events of acme, each delivered once, every attempt signed.
    let mut kinds: Vec<(String, String)> = hits
        .iter()
        .filter(|h| h.answered == 204)
        .map(|h| {
            (
                h.body["data"]["order_id"].as_str().unwrap().to_string(),
                h.body["type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("o-1", "order.assigned"),
            ("o-1", "order.delivered"),
            ("o-1", "order.picked_up"),
            ("o-3", "order.assigned")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert!(
        rx.delivered().values().all(|n| *n == 1),
        "{:?}",
        rx.delivered()
    );
    assert!(
        hits.iter().all(|h| h.verified),
        "an attempt failed verification"
    );
    assert!(hits.iter().all(|h| h.body["data"]["tenant"] == "acme"));

    // The failed attempts were tried again with the same webhook-id: after the 429, not before
    // its Retry-After; after the 500 and the timeout, within the first backoff ceiling (0.2 s)
    // plus the poll interval and the attempt's own timeout.
    let next_of = |i: usize| {
        hits[i + 1..]
            .iter()
            .find(|h| h.id == hits[i].id)
            .unwrap_or_else(|| panic!("attempt {i} never retried: {hits:#?}"))
            .at
            .duration_since(hits[i].at)
    };
    let first = |answered: u16| hits.iter().position(|h| h.answered == answered).unwrap();
    let after_429 = next_of(first(429));
    assert!(
        after_429 >= Duration::from_secs(1),
        "retried {after_429:?} after a Retry-After: 1"
    );
    assert!(after_429 < Duration::from_secs(3), "{after_429:?}");
    let after_500 = next_of(first(500));
    assert!(after_500 < Duration::from_millis(1500), "{after_500:?}");
    let after_hang = next_of(first(0));
    assert!(after_hang >= Duration::from_millis(500), "{after_hang:?}");
    assert!(after_hang < Duration::from_millis(2500), "{after_hang:?}");
    // Outcomes are stored just after the receiver answered.
    let s = n.stats.clone();
    assert!(wait_until(Duration::from_secs(5), || s.delivered.load(Relaxed) == 4).await);
    assert_eq!(n.stats.retried.load(Relaxed), 3);
    assert_eq!(n.stats.recorded.load(Relaxed), 5, "o-1 x3, o-2, o-3 once");

    // The outbox holds one row per event, none twice.
    let db = pg_connect(&schema.url).await;
    let rows: i64 = db
        .query_one("SELECT count(*) FROM order_events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 5);
    let stream_left: u64 = redis::cmd("XLEN")
        .arg(&keys.events)
        .query_async(&mut redis().await)
        .await
        .unwrap();
    assert_eq!(
        stream_left, 0,
        "recorded entries are deleted from the stream"
    );
    n.stop().await;
    finish(f, keys, schema).await;
}

#[tokio::test]
async fn dead_letters_are_listed_and_replayed_per_tenant_and_wrong_keys_move_nothing() {
    let Env {
        schema,
        keys,
        broker: _bus,
        f,
    } = env().await;
    let n = start_notify(
        &keys,
        &schema.url,
        notify::NotifyConfig {
            max_attempts: 2,
            ..fast()
        },
    )
    .await;
    let (rx, rx_addr) = start_receiver().await;
    *rx.after.lock().unwrap() = Some(Act::Answer(503));

    // Registration needs the service key: without it, or with a valid token of another kind
    // (a tracking token the orders API minted), nothing is registered.
    let body =
        format!(r#"{{"tenant":"acme","url":"http://{rx_addr}/hook","kinds":["order.assigned"]}}"#);
    let r = http_post(n.http, "/webhooks/endpoints", &[], &body).await;
    assert_eq!(r.status, 401);
    assign(&f, "o-t", "c-t", "acme").await;
    let tracking = api(&f, "/orders/o-t/tracking-token", r#"{"viewer":"customer"}"#).await;
    let token = tracking.body["token"].as_str().unwrap();
    let r = http_post(
        n.http,
        "/webhooks/endpoints",
        &[("Authorization", &format!("Bearer {token}"))],
        &body,
    )
    .await;
    assert_eq!(r.status, 401, "{r:?}");
    let mut db = pg_connect(&schema.url).await;
    history_writer::migrate(&mut db).await.unwrap();
    let count = |sql: &'static str| {
        let db = &db;
        async move { db.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(count("SELECT count(*) FROM webhook_endpoints").await, 0);
    // Bad registrations: 400.
    for bad in [
        r#"{"tenant":"acme","url":"ftp://x/","kinds":["order.assigned"]}"#,
        r#"{"tenant":"acme","url":"http://u:p@x/","kinds":["order.assigned"]}"#,
        r#"{"tenant":"acme","url":"http://x/","kinds":["order.teleported"]}"#,
        r#"{"tenant":"a b","url":"http://x/","kinds":["order.assigned"]}"#,
        r#"{"tenant":"acme","url":"http://x/","kinds":[]}"#,
    ] {
        let r = http_post(
            n.http,
            "/webhooks/endpoints",
            &[("Authorization", &bearer())],
            bad,
        )
        .await;
        assert_eq!(r.status, 400, "{bad}: {r:?}");
    }

    let (endpoint, secret) = register(n.http, "acme", &format!("http://{rx_addr}/hook")).await;
    *rx.secret.lock().unwrap() = Some(secret);
    assign(&f, "o-d", "c-d", "acme").await;
    // Two attempts (max_attempts), both 503: dead.
    assert!(wait_until(Duration::from_secs(10), || n.stats.dead.load(Relaxed) == 1).await);
    let r = http_get(
        n.http,
        "/webhooks/dead-letters?tenant=acme",
        Some(TEST_SERVICE_KEY),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let list: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let dead = &list["dead_letters"];
    assert_eq!(dead.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(dead[0]["endpoint_id"], endpoint);
    assert_eq!(dead[0]["attempts"], 2);
    assert_eq!(dead[0]["last_status"], 503);
    let delivery = dead[0]["delivery_id"].as_i64().unwrap();
    let webhook_id = dead[0]["webhook_id"].as_str().unwrap().to_string();

    // Another tenant sees no dead letter of acme's and cannot replay it; a wrong key cannot.
    let r = http_get(
        n.http,
        "/webhooks/dead-letters?tenant=globex",
        Some(TEST_SERVICE_KEY),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["dead_letters"],
        serde_json::json!([])
    );
    let replay = format!("/webhooks/dead-letters/{delivery}/replay");
    let r = http_post(
        n.http,
        &format!("{replay}?tenant=globex"),
        &[("Authorization", &bearer())],
        "",
    )
    .await;
    assert_eq!(r.status, 404);
    let r = http_post(
        n.http,
        &format!("{replay}?tenant=acme"),
        &[("Authorization", "Bearer wrong-key-0123456789")],
        "",
    )
    .await;
    assert_eq!(r.status, 401);
    let r = http_get(
        n.http,
        "/webhooks/dead-letters?tenant=acme",
        Some("wrong-key-0123456789"),
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(
        count("SELECT count(*) FROM webhook_deliveries WHERE state = 'dead'").await,
        1
    );
    // A negative: time for an attempt on a dead delivery to arrive, were one made.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attempts_while_dead = rx.hits().len();
    assert_eq!(
        attempts_while_dead, 2,
        "a dead letter is not attempted again"
    );

    // Replayed by acme once the receiver works again: delivered, under the same webhook-id.
    *rx.after.lock().unwrap() = Some(Act::Answer(200));
    let r = http_post(
        n.http,
        &format!("{replay}?tenant=acme"),
        &[("Authorization", &bearer())],
        "",
    )
    .await;
    assert_eq!(r.status, 202, "{r:?}");
    assert!(
        wait_until(Duration::from_secs(10), || rx
            .delivered()
            .contains_key(&webhook_id))
        .await
    );
    assert!(rx.hits().iter().all(|h| h.verified && h.id == webhook_id));
    let stored = wait_until_async(Duration::from_secs(30), || async {
        count("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'").await == 1
    })
    .await;
    assert!(stored, "the delivery's outcome was never stored");
    n.stop().await;
    finish(f, keys, schema).await;
}

#[tokio::test]
async fn a_breaker_holds_a_failing_endpoints_deliveries_and_probes_once() {
    let Env {
        schema,
        keys,
        broker: _bus,
        f,
    } = env().await;
    let config = notify::NotifyConfig {
        breaker_failures: 3,
        breaker_open: Duration::from_secs(2),
        retry_base: Duration::from_millis(50),
        retry_max_delay: Duration::from_millis(100),
        ..fast()
    };
    let n = start_notify(&keys, &schema.url, config).await;
    let (rx, rx_addr) = start_receiver().await;
    *rx.after.lock().unwrap() = Some(Act::Answer(500));
    let (_, secret) = register(n.http, "acme", &format!("http://{rx_addr}/hook")).await;
    *rx.secret.lock().unwrap() = Some(secret);
    for i in 0..10 {
        assign(&f, &format!("o-{i}"), &format!("c-{i}"), "acme").await;
    }
    // Retries come every 0-100 ms, so without a breaker 10 deliveries would make ~100 attempts
    // in 1.5 s. With it: about 3 (then open), and nothing more until it half-opens.
    assert!(wait_until(Duration::from_secs(10), || rx.hits().len() >= 3).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let while_open = rx.hits().len();
    assert!(
        while_open <= 3 + 10,
        "the open breaker let {while_open} attempts through"
    );
    // Half-open after 2 s: one probe per 2 s while it keeps failing.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let probes = rx.hits().len() - while_open;
    assert!(
        (1..=2).contains(&probes),
        "{probes} attempts in one half-open period"
    );
    // The receiver recovers: the next probe succeeds, the breaker closes, all ten arrive.
    *rx.after.lock().unwrap() = Some(Act::Answer(200));
    assert!(
        wait_until(Duration::from_secs(15), || rx.delivered().len() == 10).await,
        "{:?}",
        rx.delivered()
    );
    n.stop().await;
    finish(f, keys, schema).await;
}

/// `courier-pipeline notify` as a process of its own, killed with SIGKILL while an attempt is
/// in flight: a second process delivers the event after the claim's lease, and the relay's
/// unacknowledged stream entries are recorded by the survivor.
#[tokio::test]
async fn a_dispatcher_killed_mid_delivery_loses_nothing() {
    let schema = pg_schema().await;
    let prefix = prefix();
    let keys = Keys::with_prefix(&prefix);
    let broker = start_broker(BrokerKind::Embedded);
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let (rx, rx_addr) = start_receiver().await;
    // The first attempt hangs (the victim dies meanwhile); the rest succeed.
    rx.script
        .lock()
        .unwrap()
        .push_back(Act::Hang(Duration::from_secs(4)));
    let dir = std::env::temp_dir().join(format!("notify-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("notify.toml");
    std::fs::write(
        &conf,
        format!(
            "[redis]\nkey_prefix = \"{prefix}\"\n[notify]\npoll_interval = \"50ms\"\ntimeout = \"5s\"\nlease = \"6s\"\nrelay_claim_after = \"1s\"\n"
        ),
    )
    .unwrap();
    // A notify process on port 0, once its webhooks API listens: the process and its address.
    let process = || {
        let mut cmd = Command::new(BIN);
        with_test_keys(&mut cmd)
            .args(["--config", conf.to_str().unwrap(), "notify"])
            .env("HTTP_LISTEN", "127.0.0.1:0")
            .env("METRICS_LISTEN", "off")
            .env("REDIS_URL", &services().redis_url)
            .env("DATABASE_URL", &schema.url)
            .env("SERVICE_KEY", TEST_SERVICE_KEY)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let report = ListenReport::on(&mut cmd);
        let mut p = Proc {
            name: "notify",
            child: cmd.spawn().unwrap(),
        };
        let http = report.wait(&mut p.child, "notify").get("http");
        (p, http)
    };
    let (victim, victim_http) = process();
    let (_, secret) = register(victim_http, "acme", &format!("http://{rx_addr}/hook")).await;
    *rx.secret.lock().unwrap() = Some(secret);
    assign(&f, "o-k", "c-k", "acme").await;
    assert!(wait_until(Duration::from_secs(10), || !rx.hits().is_empty()).await);
    let killed_at = Instant::now();
    Command::new("kill")
        .args(["-KILL", &victim.pid().to_string()])
        .status()
        .unwrap();
    drop(victim);
    // Events written while no relay runs wait in the stream.
    assign(&f, "o-k2", "c-k2", "acme").await;

    let _survivor = process();
    let first_id = rx.hits()[0].id.clone();
    assert!(
        wait_until(Duration::from_secs(20), || rx.delivered().len() == 2).await,
        "{:#?}",
        rx.hits()
    );
    let redelivered = rx
        .hits()
        .into_iter()
        .find(|h| h.id == first_id && h.answered == 204)
        .unwrap();
    assert!(
        redelivered.at.duration_since(killed_at) >= Duration::from_secs(3),
        "tried again before the lease ran out"
    );
    assert!(rx.hits().iter().all(|h| h.verified));
    f.stop().await;
    cleanup(&keys).await;
    schema.drop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A point `m` metres north and `e` metres east of `p`.
fn offset(p: (f64, f64), m: f64, e: f64) -> (f64, f64) {
    let r = 6_371_008.8f64;
    (
        p.0 + (m / r).to_degrees(),
        p.1 + (e / (r * p.0.to_radians().cos())).to_degrees(),
    )
}

/// The whole path on real engines: orders with places through the orders API, couriers' points
/// through the bus into ingest, arrival decided after the batch script, events relayed and
/// delivered. A courier driving to his places arrives once at each; one whose fixes wander
/// around the radius of his drop-off never does; a courier carrying two orders (stacked) has
/// his points on both tracks, keeps the second running when the first is delivered, and going
/// offline reports it for each order he still carries.
#[tokio::test]
async fn arrivals_once_per_order_none_for_jitter_and_stacked_orders() {
    let Env {
        schema,
        keys,
        broker,
        f,
    } = env().await;
    let ingest = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let n = start_notify(&keys, &schema.url, fast()).await;
    let (rx, rx_addr) = start_receiver().await;
    let r = http_post(
        n.http,
        "/webhooks/endpoints",
        &[("Authorization", &bearer())],
        &format!(r#"{{"tenant":"acme","url":"http://{rx_addr}/hook","kinds":["courier.arriving_pickup","courier.arriving_dropoff","courier.offline_during_order","order.delivered"]}}"#),
    )
    .await;
    assert_eq!(r.status, 201, "{r:?}");
    *rx.secret.lock().unwrap() = Some(r.body["secret"].as_str().unwrap().to_string());

    let shop = (24.7136, 46.6753);
    let home = offset(shop, 2000.0, 1000.0);
    let place = |p: (f64, f64)| format!(r#"{{"lat":{},"lon":{}}}"#, p.0, p.1);
    let assign_with = |order: &'static str, courier: &'static str, places: String| {
        let f = &f;
        async move {
            let r = api(
                f,
                &format!("/orders/{order}/assign"),
                &format!(r#"{{"courier_id":"{courier}","tenant":"acme"{places}}}"#),
            )
            .await;
            assert_eq!(r.status, 200, "{r:?}");
        }
    };
    assign_with(
        "o-a",
        "c-a",
        format!(r#","pickup":{},"dropoff":{}"#, place(shop), place(home)),
    )
    .await;
    assign_with("o-b", "c-a", String::new()).await; // stacked, no places
    assign_with("o-j", "c-j", format!(r#","dropoff":{}"#, place(home))).await;
    // A bad place is refused, and so is a fifth order for one courier.
    let r = api(
        &f,
        "/orders/o-x/assign",
        r#"{"courier_id":"c-x","pickup":{"lat":95,"lon":1}}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    for o in ["o-c", "o-d"] {
        assign(&f, o, "c-a", "acme").await;
    }
    let r = api(&f, "/orders/o-e/assign", r#"{"courier_id":"c-a"}"#).await;
    assert_eq!(r.status, 409, "{r:?}");
    for o in ["o-c", "o-d"] {
        order_event(&f, o, "delivered").await;
    }

    let mut tracks = subscriber(&broker.endpoint, "track/+").await;
    let (bus, _h) = client(&broker.endpoint, None).await;
    let t0 = courier_wire::clock::unix_now();
    let mut seq = 0;
    let mut send = |id: &'static str, p: (f64, f64)| {
        seq += 1;
        let (bus, s) = (bus.clone(), seq);
        async move {
            publish(
                &bus,
                &format!("couriers/{id}/loc"),
                point(id, p.0, p.1, t0 + s as f64 * 0.01, s),
            )
            .await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // c-a drives from 1 km south of the shop to it, waits there, then drives home; c-j waits
    // 150 m (± 25 m of GPS jitter) from his drop-off.
    for m in [
        -1000.0, -600.0, -300.0, -160.0, -100.0, -40.0, 0.0, 5.0, -3.0,
    ] {
        send("c-a", offset(shop, m, 0.0)).await;
    }
    for k in 0..=10 {
        let x = k as f64 / 10.0;
        send(
            "c-a",
            (
                shop.0 + (home.0 - shop.0) * x,
                shop.1 + (home.1 - shop.1) * x,
            ),
        )
        .await;
    }
    send("c-a", offset(home, 3.0, -2.0)).await;
    let mut jitter = StdRng::seed_from_u64(9);
    for i in 0..30 {
        let d = 150.0 + jitter.random_range(-25.0..25.0);
        let b = (i as f64 * 37.0).to_radians();
        send("c-j", offset(home, d * b.cos(), d * b.sin())).await;
    }
    let s = ingest.stats.clone();
    assert!(wait_until(Duration::from_secs(10), || s.accepted.load(Relaxed) >= 51).await);

    // Stacked: c-a's points went to both of his running orders' tracks, none to delivered ones.
    let mut per_order = std::collections::BTreeMap::<String, usize>::new();
    while let Ok(p) = tracks.try_recv() {
        *per_order.entry(p.topic.to_string()).or_default() += 1;
    }
    assert_eq!(per_order.get("track/o-a"), Some(&21), "{per_order:?}");
    assert_eq!(per_order.get("track/o-b"), Some(&21), "{per_order:?}");
    assert_eq!(per_order.get("track/o-c"), None);
    // Delivering o-a leaves o-b running.
    order_event(&f, "o-a", "delivered").await;
    let carried: Option<String> = redis::cmd("HGET")
        .arg(&keys.order)
        .arg("c-a")
        .query_async(&mut redis().await)
        .await
        .unwrap();
    assert_eq!(carried.as_deref(), Some("o-b"));
    send("c-a", home).await;
    let p = tokio::time::timeout(Duration::from_secs(5), tracks.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.topic, "track/o-b");
    // c-a ends his shift while still carrying o-b.
    publish(&bus, "couriers/c-a/status", b"offline".to_vec()).await;

    // Sorted as `got` sorts.
    let want = [
        ("o-a", "courier.arriving_dropoff"),
        ("o-a", "courier.arriving_pickup"),
        ("o-a", "order.delivered"),
        ("o-b", "courier.offline_during_order"),
        ("o-c", "order.delivered"),
        ("o-d", "order.delivered"),
    ];
    let got = || {
        let mut v: Vec<(String, String)> = rx
            .hits()
            .iter()
            .filter(|h| h.answered == 204)
            .map(|h| {
                (
                    h.body["data"]["order_id"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                    h.body["type"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let arrived = wait_until(Duration::from_secs(15), || got().len() >= want.len()).await;
    // Give a duplicate or a jitter arrival time to show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(arrived, "{:?}", got());
    assert_eq!(
        got(),
        want.map(|(o, k)| (o.to_string(), k.to_string())),
        "one event per order and kind; none for c-j's jitter, none for o-b's missing places"
    );
    assert_eq!(ingest.stats.arrivals.load(Relaxed), 2);
    assert!(rx.hits().iter().all(|h| h.verified));
    n.stop().await;
    ingest.stop().await;
    f.stop().await;
    cleanup(&keys).await;
    schema.drop().await;
}

/// A fake push provider: answers by device token (`tok-dead` is unregistered, `tok-flaky`
/// fails its first request), and records every request.
#[derive(Clone, Default)]
struct Provider {
    seen: Arc<Mutex<Vec<(String, String, String)>>>, // token, notice_id, kind
    flaked: Arc<std::sync::atomic::AtomicBool>,
}

async fn provide(
    State(p): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    assert_eq!(
        headers.get("authorization").and_then(|v| v.to_str().ok()),
        Some("Bearer provider-key"),
        "the provider key is sent"
    );
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let token = v["to"].as_str().unwrap().to_string();
    p.seen.lock().unwrap().push((
        token.clone(),
        v["notice_id"].as_str().unwrap().to_string(),
        v["data"]["kind"].as_str().unwrap().to_string(),
    ));
    match token.as_str() {
        "tok-dead" => StatusCode::GONE.into_response(),
        "tok-flaky" if !p.flaked.swap(true, Relaxed) => StatusCode::BAD_GATEWAY.into_response(),
        _ => StatusCode::OK.into_response(),
    }
}

/// Notices to a closed app: one per (device, kind) whatever the retries, a dead device token
/// retired at the provider's first "gone" and never tried again, and the unique index that
/// makes "once" hold even against a second writer.
#[tokio::test]
async fn push_notices_go_once_per_device_and_kind_and_dead_tokens_are_retired() {
    let Env {
        schema,
        keys,
        broker: _bus,
        f,
    } = env().await;
    let provider = Provider::default();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let paddr = l.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/push", axum::routing::post(provide))
        .with_state(provider.clone());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    let n = start_notify(
        &keys,
        &schema.url,
        notify::NotifyConfig {
            push_url: Some(format!("http://{paddr}/push")),
            push_key: Some("provider-key".into()),
            ..fast()
        },
    )
    .await;
    // Registering needs the service key.
    let dev = |token: &str| format!(r#"{{"tenant":"acme","order_id":"o-p","token":"{token}"}}"#);
    let r = http_post(n.http, "/notices/devices", &[], &dev("tok-x")).await;
    assert_eq!(r.status, 401);
    for t in ["tok-ok", "tok-flaky", "tok-dead"] {
        let r = http_post(
            n.http,
            "/notices/devices",
            &[("Authorization", &bearer())],
            &dev(t),
        )
        .await;
        assert_eq!(r.status, 201, "{r:?}");
    }
    let r = http_post(
        n.http,
        "/notices/devices",
        &[("Authorization", &bearer())],
        &dev("bad token"),
    )
    .await;
    assert_eq!(r.status, 400);

    assign(&f, "o-p", "c-p", "acme").await; // order.assigned is not a customer notice by default
    order_event(&f, "o-p", "picked_up").await;
    let seen = |token: &str| {
        provider
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _, _)| t == token)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(10), || seen("tok-flaky").len() == 2
            && seen("tok-dead").len() == 1)
        .await
    );
    // The flaky device got the same notice twice (a retry after 502), under one notice id.
    let flaky = seen("tok-flaky");
    assert_eq!(flaky[0].1, flaky[1].1);
    let mut db = pg_connect(&schema.url).await;
    history_writer::migrate(&mut db).await.unwrap();
    let retired = wait_until_async(Duration::from_secs(30), || async {
        db.query_one(
            "SELECT count(*) FROM push_devices WHERE token = 'tok-dead' AND retired_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            == 1
    })
    .await;
    assert!(retired, "the dead token was not retired");

    // Delivered after the retirement: tok-dead hears nothing more; the others once each.
    order_event(&f, "o-p", "delivered").await;
    assert!(
        wait_until(Duration::from_secs(10), || seen("tok-ok").len() == 2
            && seen("tok-flaky").len() == 3)
        .await
    );
    // A negative: time for a duplicate notice to show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kinds = |t: &str| seen(t).into_iter().map(|(_, _, k)| k).collect::<Vec<_>>();
    assert_eq!(kinds("tok-ok"), ["order.picked_up", "order.delivered"]);
    assert_eq!(
        kinds("tok-dead"),
        ["order.picked_up"],
        "a retired token is never tried again"
    );
    let r = http_get(
        n.http,
        "/notices?tenant=acme&order_id=o-p",
        Some(TEST_SERVICE_KEY),
    )
    .await;
    let list: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let states: Vec<String> = list["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            format!(
                "{} {}",
                n["kind"].as_str().unwrap(),
                n["state"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(states.len(), 5, "{states:?}: 3 picked_up + 2 delivered");
    assert_eq!(
        states.iter().filter(|s| s.ends_with("sent")).count(),
        4,
        "{states:?}"
    );
    // Once per (device, kind) is the unique index: a second writer of the same notice fails.
    let dup = db
        .execute(
            "INSERT INTO push_notices (event_id, device_id, kind)
             SELECT event_id, device_id, kind FROM push_notices LIMIT 1",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        dup.code(),
        Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
    );
    n.stop().await;
    finish(f, keys, schema).await;
}

/// The events stream deleted under the relay's blocked read (an operator's DEL, a flushed
/// Redis): the relay makes it again and carries on; nothing stops.
#[tokio::test]
async fn the_relay_survives_its_stream_being_deleted() {
    let Env {
        schema,
        keys,
        broker: _bus,
        f,
    } = env().await;
    let n = start_notify(&keys, &schema.url, fast()).await;
    let (rx, rx_addr) = start_receiver().await;
    let (_, secret) = register(n.http, "acme", &format!("http://{rx_addr}/hook")).await;
    *rx.secret.lock().unwrap() = Some(secret);
    assign(&f, "o-1", "c-1", "acme").await;
    assert!(wait_until(Duration::from_secs(10), || rx.delivered().len() == 1).await);
    let _: () = redis::cmd("DEL")
        .arg(&keys.events)
        .query_async(&mut redis().await)
        .await
        .unwrap();
    // A negative: time for the relay to trip over the missing stream (it reads every 50 ms).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!n.task.is_finished(), "the notify role stopped");
    assign(&f, "o-2", "c-2", "acme").await;
    assert!(
        wait_until(Duration::from_secs(10), || rx.delivered().len() == 2).await,
        "the event after the DEL was not delivered"
    );
    n.stop().await;
    finish(f, keys, schema).await;
}
