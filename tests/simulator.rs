//! The simulator against real brokers, ingest and Redis: per-courier connections with their
//! Last Will, watchers measuring the phone-to-viewer delay, faults reaching the pipeline.

mod support;

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
            url: services().redis_url.clone(),
            keys: keys.clone(),
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
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut seq: HashMap<String, Vec<String>> = HashMap::new();
        while let Ok(p) = status.try_recv() {
            let id = p.topic.split('/').nth(1).unwrap().to_string();
            if id.starts_with(&id_prefix) {
                seq.entry(id)
                    .or_default()
                    .push(String::from_utf8_lossy(&p.payload).into_owned());
            }
        }
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
    assert!(p50 >= 0.0 && p50 < 1000.0, "p50 {p50}");
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
