//! The simulator against real brokers, ingest and Redis: per-courier connections with their
//! Last Will, watchers measuring the phone-to-viewer delay (on the broker, and through the
//! orders API and the viewer gateway as customers do), faults reaching the pipeline.

use crate::support;

use courier_wire::{Invalid, Keys};
use simulator::watchers::{Assigner, Viewer};
use simulator::{Faults, Profile, SimConfig, SimStats, Simulator, Watchers};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio_util::sync::CancellationToken;

fn sim(broker: &TestBroker, keys: &Keys, config: SimConfig) -> Simulator {
    Simulator {
        config,
        mqtt: broker.endpoint.clone(),
        also: vec![],
        assigner: Assigner::Redis {
            redis: services().redis(),
            keys: Box::new(keys.clone()),
        },
        viewer: Viewer::Broker {
            endpoint: broker.endpoint.clone(),
        },
        stats: Arc::new(SimStats::default()),
        courier_login: None,
    }
}

fn every(secs: f64) -> Profile {
    Profile::Fixed {
        interval: Duration::from_secs_f64(secs),
    }
}

fn unique_prefix() -> String {
    format!("s{:06x}x", rand::random::<u32>() & 0xff_ffff)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_courier_connection_says_online_and_its_will_says_offline_when_the_network_drops() {
    for kind in [BrokerKind::Embedded, BrokerKind::Mosquitto] {
        let broker = start_broker(kind);
        let keys = Keys::with_prefix(&prefix());
        let mut status = subscriber(&broker.endpoint, "couriers/+/status").await;
        let id_prefix = unique_prefix();
        let config = SimConfig {
            couriers: 4,
            profile: every(0.2),
            connections: None,
            duration: Some(Duration::from_secs(4)),
            id_prefix: id_prefix.clone(),
            faults: Faults {
                outage: 1.0,
                outage_for: Duration::from_secs(1),
                window: Some(Duration::from_secs(2)),
                ..Default::default()
            },
            ..Default::default()
        };
        let report = sim(&broker, &keys, config)
            .run(CancellationToken::new(), |_| {})
            .await
            .unwrap();
        assert_eq!(report.connections, "per_courier");
        assert_eq!(report.faults.outages, 4);
        assert!(
            report.connects >= 8,
            "{kind:?}: each courier connected twice: {}",
            report.connects
        );
        assert!(report.faults.flushed > 0);
        // The last offlines may still be on their way: received until each courier has four.
        let mut seq: HashMap<String, Vec<String>> = HashMap::new();
        recv_until(&mut status, Duration::from_secs(5), |p| {
            let id = p.topic.split('/').nth(1).unwrap().to_string();
            if id.starts_with(&id_prefix) {
                seq.entry(id)
                    .or_default()
                    .push(String::from_utf8_lossy(&p.payload).into_owned());
            }
            seq.len() == 4 && seq.values().all(|s| s.len() >= 4)
        })
        .await;
        assert_eq!(seq.len(), 4, "{kind:?}: {seq:?}");
        for (id, s) in &seq {
            // online at shift start, the Will when the network dropped, online again, and
            // offline at the clean shift end.
            assert_eq!(
                s,
                &["online", "offline", "online", "offline"],
                "{kind:?} {id}"
            );
        }
    }
}

/// Two separate brokers, one as `mqtt` and one as `also`: each sees only the couriers whose
/// connection went to it. A courier's own connection goes to address `i % 2` (seen by his
/// status); a shared connection, shard `k`'s, to address `k % 2`, carrying couriers `k`,
/// `k + 3`, ... of three shards (seen by their points).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn courier_connections_spread_over_every_broker_address() {
    let brokers = [
        start_broker(BrokerKind::Embedded),
        start_broker(BrokerKind::Embedded),
    ];
    let keys = Keys::with_prefix(&prefix());
    let couriers = 8;
    for (connections, filter) in [(None, "couriers/+/status"), (Some(3), "couriers/+/loc")] {
        let mut subs = Vec::new();
        for b in &brokers {
            subs.push(subscriber(&b.endpoint, filter).await);
        }
        let id_prefix = unique_prefix();
        let config = SimConfig {
            couriers,
            profile: every(0.25),
            connections,
            duration: Some(Duration::from_secs(2)),
            id_prefix: id_prefix.clone(),
            ..Default::default()
        };
        let mut s = sim(&brokers[0], &keys, config);
        s.also = vec![brokers[1].endpoint.clone()];
        let report = s.run(CancellationToken::new(), |_| {}).await.unwrap();
        assert_eq!(
            report.connects,
            connections.unwrap_or(couriers) as u64,
            "{connections:?}"
        );
        for (k, rx) in subs.iter_mut().enumerate() {
            let want: std::collections::BTreeSet<usize> = (0..couriers)
                .filter(|i| match connections {
                    None => i % 2 == k,
                    Some(shards) => (i % shards) % 2 == k,
                })
                .collect();
            // Received until every courier this broker should see has been seen (the last
            // messages may still be on their way); one it should not see fails below.
            let mut seen = std::collections::BTreeSet::new();
            recv_until(rx, Duration::from_secs(5), |p| {
                let id = p.topic.split('/').nth(1).unwrap();
                if let Some(n) = id.strip_prefix(&id_prefix) {
                    seen.insert(n.parse::<usize>().unwrap());
                }
                seen == want
            })
            .await;
            while let Ok(p) = rx.try_recv() {
                let id = p.topic.split('/').nth(1).unwrap();
                if let Some(n) = id.strip_prefix(&id_prefix) {
                    seen.insert(n.parse::<usize>().unwrap());
                }
            }
            assert_eq!(seen, want, "{connections:?}: broker {k}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_measure_the_phone_to_viewer_delay_through_ingest() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let ingest = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let config = SimConfig {
        couriers: 60,
        profile: every(0.25),
        connections: Some(2),
        duration: Some(Duration::from_secs(3)),
        id_prefix: unique_prefix(),
        watchers: Watchers { orders: 3 },
        ..Default::default()
    };
    let mut seconds = 0;
    let report = sim(&broker, &keys, config)
        .run(CancellationToken::new(), |_| seconds += 1)
        .await
        .unwrap();
    assert!(seconds >= 2, "a progress line each second");
    assert_eq!(report.orders, 3);
    assert!(
        report.watcher_updates >= 3 * 6,
        "updates {}",
        report.watcher_updates
    );
    assert_eq!(report.watcher_bad, 0);
    let p50 = report.delay.p50_ms.unwrap();
    assert!((0.0..1000.0).contains(&p50), "p50 {p50}");
    assert!(
        report.sent > 0 && report.sent <= 60 * 13,
        "sent {}",
        report.sent
    );
    assert!(ingest.stats.accepted.load(Relaxed) > 0);
    // The run removes its orders.
    let mut r = redis().await;
    let left: usize = redis::cmd("HLEN")
        .arg(&keys.order)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(left, 0);
    ingest.stop().await;
    cleanup(&keys).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_backlog_arrives_stale_and_bad_gps_is_refused_by_ingest() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let ingest = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let config = SimConfig {
        couriers: 20,
        profile: every(0.2),
        connections: Some(2),
        duration: Some(Duration::from_secs(4)),
        id_prefix: unique_prefix(),
        faults: Faults {
            outage: 1.0,
            outage_for: Duration::from_secs(1),
            window: Some(Duration::from_secs(2)),
            null_island: 0.2,
            ..Default::default()
        },
        ..Default::default()
    };
    let report = sim(&broker, &keys, config)
        .run(CancellationToken::new(), |_| {})
        .await
        .unwrap();
    assert!(
        report.faults.flushed >= 20 * 3,
        "flushed {}",
        report.faults.flushed
    );
    assert!(report.faults.null_island > 0);
    let s = ingest.stats.clone();
    assert!(
        wait_until(Duration::from_secs(5), || s.settled() >= report.sent).await,
        "ingest settled {} of {}",
        s.settled(),
        report.sent
    );
    // Flushed points are older than the live point sent before them: stale, kept for history
    // (a fifth of them are (0, 0) and refused before the seq check).
    assert!(
        s.stale.load(Relaxed) >= report.faults.flushed * 6 / 10,
        "stale {} of {}",
        s.stale.load(Relaxed),
        report.faults.flushed
    );
    assert!(s.invalid_for(Invalid::NullIsland) > 0);
    ingest.stop().await;
    cleanup(&keys).await;
}

/// Bindings of a run's orders left in Redis: `courier:order` and `order:courier` entries.
async fn bindings(keys: &Keys) -> (usize, usize) {
    let mut r = redis().await;
    let by_courier: usize = redis::cmd("HLEN")
        .arg(&keys.order)
        .query_async(&mut r)
        .await
        .unwrap();
    let by_order: usize = redis::cmd("HLEN")
        .arg(&keys.order_courier)
        .query_async(&mut r)
        .await
        .unwrap();
    (by_courier, by_order)
}

async fn ended_orders(keys: &Keys) -> usize {
    let mut r = redis().await;
    redis::cmd("ZCARD")
        .arg(&keys.orders_ended)
        .query_async(&mut r)
        .await
        .unwrap()
}

/// The customer path: orders assigned through the orders API (service key), each watched
/// through the viewer gateway with its tracking token over WebSocket, delays measured from
/// the points' ts; the run delivers its orders, so no binding is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_go_through_the_orders_api_and_the_viewer_gateway() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let ingest = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let config = SimConfig {
        couriers: 30,
        profile: every(0.25),
        connections: Some(2),
        duration: Some(Duration::from_secs(3)),
        id_prefix: unique_prefix(),
        watchers: Watchers { orders: 3 },
        ..Default::default()
    };
    let mut sim = sim(&broker, &keys, config);
    sim.assigner = Assigner::Api {
        base_url: format!("http://{}", f.http),
        service_key: TEST_SERVICE_KEY.into(),
    };
    sim.viewer = Viewer::Gateway;
    let mut lines = Vec::new();
    let report = sim
        .run(CancellationToken::new(), |s| lines.push(s.line()))
        .await
        .unwrap();
    assert!(
        lines.iter().all(|l| l.ends_with("(via gateway)")),
        "{lines:?}"
    );
    assert_eq!(
        (report.assigned_via.as_str(), report.watched_via.as_str()),
        ("orders_api", "gateway")
    );
    assert_eq!(report.orders, 3);
    assert!(
        report.watcher_updates >= 3 * 6,
        "updates {}",
        report.watcher_updates
    );
    assert_eq!(report.delay.count, report.watcher_updates);
    assert_eq!(report.watcher_bad, 0);
    let p50 = report.delay.p50_ms.unwrap();
    assert!((0.0..1000.0).contains(&p50), "p50 {p50}");
    // Every update came through the gateway: it sent at least as many points to viewers.
    assert!(
        f.stats.points_sent.load(Relaxed) >= report.watcher_updates,
        "gateway sent {} < updates {}",
        f.stats.points_sent.load(Relaxed),
        report.watcher_updates
    );
    // Delivered at the end: both bindings gone, the orders remembered as ended.
    assert_eq!(report.orders_ended, 3);
    assert_eq!(bindings(&keys).await, (0, 0));
    assert_eq!(ended_orders(&keys).await, 3);
    f.stop().await;
    ingest.stop().await;
    cleanup_all(&keys).await;
}

/// `courier-pipeline simulate --orders 3 --orders-api URL` takes the customer path; the
/// progress line and the report say so. Without SERVICE_KEY it refuses with one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_with_orders_api_watches_through_the_gateway_and_delivers() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let ingest = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let dir = std::env::temp_dir().join(format!("sim-api-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let report_path = dir.join("report.json");
    let cmd = |service_key: Option<&str>| {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_courier-pipeline"));
        c.args(["simulate", "--couriers", "20", "--interval", "0.25"])
            .args(["--connections", "2", "--seconds", "3", "--orders", "3"])
            .args(["--id-prefix", &unique_prefix()])
            .arg("--orders-api")
            .arg(format!("http://{}", f.http))
            .arg("--report")
            .arg(&report_path)
            .env(
                "MQTT_URL",
                format!("mqtt://127.0.0.1:{}", broker.endpoint.port),
            )
            .env("REDIS_URL", &services().redis_url)
            .env("RUST_LOG", "warn")
            .env_remove("AUTH_KEY_DIR")
            .env_remove("SERVICE_KEY")
            .kill_on_drop(true);
        if let Some(k) = service_key {
            c.env("SERVICE_KEY", k);
        }
        c
    };
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        cmd(Some(TEST_SERVICE_KEY)).output(),
    )
    .await
    .expect("simulate did not finish")
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let progress: Vec<&str> = err.lines().filter(|l| l.starts_with("sim:")).collect();
    assert!(!progress.is_empty(), "{err}");
    assert!(
        progress.iter().all(|l| l.ends_with("(via gateway)")),
        "{err}"
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    assert_eq!(r["assigned_via"], "orders_api");
    assert_eq!(r["watched_via"], "gateway");
    assert_eq!(r["orders_ended"], 3);
    assert!(r["watcher_updates"].as_u64().unwrap() >= 3 * 6, "{r}");
    assert!(r["delay"]["p99_ms"].as_f64().is_some(), "{r}");
    assert_eq!(bindings(&keys).await, (0, 0));
    assert_eq!(ended_orders(&keys).await, 3);

    let out = cmd(None).output().await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.trim().lines().count() == 1 && err.contains("SERVICE_KEY"),
        "{err}"
    );
    f.stop().await;
    ingest.stop().await;
    cleanup_all(&keys).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A refused assignment (wrong service key) ends the run with the API's answer, before any
/// courier connects, and leaves no binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_assignment_fails_the_run_with_the_api_answer() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let config = SimConfig {
        couriers: 4,
        profile: every(0.25),
        connections: Some(1),
        duration: Some(Duration::from_secs(2)),
        id_prefix: unique_prefix(),
        watchers: Watchers { orders: 2 },
        ..Default::default()
    };
    let mut sim = sim(&broker, &keys, config);
    sim.assigner = Assigner::Api {
        base_url: format!("http://{}", f.http),
        service_key: "not-the-service-key-0000".into(),
    };
    sim.viewer = Viewer::Gateway;
    let stats = sim.stats.clone();
    let e = sim.run(CancellationToken::new(), |_| {}).await.unwrap_err();
    assert!(
        matches!(
            e,
            simulator::SimError::Api {
                status: Some(401),
                ..
            }
        ),
        "{e}"
    );
    assert!(!e.is_retryable());
    assert_eq!(stats.sent.load(Relaxed), 0);
    assert_eq!(bindings(&keys).await, (0, 0));
    f.stop().await;
    cleanup_all(&keys).await;
}
