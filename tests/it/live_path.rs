//! The live path end to end: phones log in at the MQTT edge (one connection per courier, a
//! device token each), the edge forwards to the bus (embedded rumqttd through the in-process
//! link, as `courier-pipeline run`; Mosquitto over MQTT, as `courier-pipeline edge`), ingest
//! workers read the bus over real sockets into real Redis. Each test has its own bus, edge,
//! ports and key prefix.

use crate::support;

use courier_wire::{loc_topic, status_topic, Invalid, Keys};
use edge::Refusal;
use rand::seq::SliceRandom;
use rumqttc::{LastWill, QoS};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use support::*;

/// Runs one scenario against both brokers.
macro_rules! on_both_brokers {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::BrokerKind::Embedded).await } )*
        }
        mod mosquitto {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::BrokerKind::Mosquitto).await } )*
        }
    };
}

on_both_brokers!(
    shuffled_points_over_two_workers_end_at_the_highest_seq,
    bad_payloads_are_counted_by_reason_and_good_ones_pass,
    seq_reset_is_tracked_again_but_replays_never_win,
    silent_couriers_are_evicted_and_last_will_removes_at_once,
    tracks_go_only_to_the_order_of_the_courier,
    duplicate_deliveries_change_nothing,
    without_groups_one_worker_takes_every_point_and_status,
);

const NOW_SLACK: f64 = 5.0;

fn now() -> f64 {
    courier_wire::clock::unix_now()
}

fn coord(courier: usize, seq: u64) -> (f64, f64) {
    (
        24.6 + courier as f64 * 0.001 + seq as f64 * 0.0001,
        46.6 + seq as f64 * 0.0002,
    )
}

async fn shuffled_points_over_two_workers_end_at_the_highest_seq(kind: BrokerKind) {
    let (broker, edge) = start_bus_with_edge(kind).await;
    let keys = Keys::with_prefix(&prefix());
    let ing = start_ingest(&broker, IngestConfigExt::workers(2), keys.clone()).await;

    let (couriers, seqs) = (40usize, 25u64);
    let ids: Vec<String> = (0..couriers).map(|c| format!("k{c}")).collect();
    let phones = phones(&edge, &ids).await;
    let t0 = now() - 100.0;
    let mut points: Vec<(usize, u64)> = (0..couriers)
        .flat_map(|c| (1..=seqs).map(move |s| (c, s)))
        .collect();
    points.shuffle(&mut rand::rng());
    for &(c, s) in &points {
        let (lat, lon) = coord(c, s);
        publish(
            &phones[c],
            &loc_topic(&format!("k{c}")),
            point(&format!("k{c}"), lat, lon, t0 + s as f64, s),
        )
        .await;
    }
    let total = points.len() as u64;
    let st = ing.stats.clone();
    assert!(
        wait_until(Duration::from_secs(15), || st.accepted.load(Relaxed)
            + st.stale.load(Relaxed)
            >= total)
        .await,
        "only {} of {total} points settled",
        st.settled()
    );
    let mut r = redis().await;
    for c in 0..couriers {
        let got = geopos(&mut r, &keys, &format!("k{c}"))
            .await
            .expect("courier missing from live");
        assert!(
            near(got, coord(c, seqs)),
            "courier k{c} at {got:?}, not at its highest seq"
        );
    }
    let live: u64 = redis::cmd("ZCARD")
        .arg(&keys.live)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(live, couriers as u64);
    // Both workers took part (round robin hands them out in turn).
    assert!(st.batches.load(Relaxed) >= 2);
    assert_eq!(st.invalid.load(Relaxed), 0);
    ing.stop().await;
    edge.stop().await;
    cleanup(&keys).await;
}

/// `ingest.group = ""` (a single node): plain subscriptions. Two such ingests (each with its own
/// key prefix) BOTH get every point and status, which a shared group would split between them.
async fn without_groups_one_worker_takes_every_point_and_status(kind: BrokerKind) {
    let (broker, edge) = start_bus_with_edge(kind).await;
    let mut cfg = test_ingest_config();
    cfg.group = String::new();
    cfg.status_group = String::new();
    let (keys_a, keys_b) = (Keys::with_prefix(&prefix()), Keys::with_prefix(&prefix()));
    let a = start_ingest(&broker, cfg.clone(), keys_a.clone()).await;
    let b = start_ingest(&broker, cfg, keys_b.clone()).await;
    let (couriers, seqs) = (30usize, 20u64);
    let ids: Vec<String> = (0..couriers).map(|c| format!("p{c}")).collect();
    let phones = phones(&edge, &ids).await;
    let t0 = now() - 50.0;
    for s in 1..=seqs {
        for (c, id) in ids.iter().enumerate() {
            let (lat, lon) = coord(c, s);
            publish(
                &phones[c],
                &loc_topic(id),
                point(id, lat, lon, t0 + s as f64, s),
            )
            .await;
        }
    }
    let total = couriers as u64 * seqs;
    // p0 goes off shift, on his own connection, once his points are settled: an ingest worker
    // runs up to max_in_flight batches at once, and a batch holding one of his last points that
    // reaches Redis after the batch holding his `offline` makes him live again (seen 6 times in
    // 30 runs on rumqttd with the status right behind the points; never with max_in_flight 1).
    // That race is ingest's, not what this test is about.
    for ing in [&a, &b] {
        let st = ing.stats.clone();
        assert!(
            wait_until(Duration::from_secs(15), || st.settled() >= total).await,
            "only {} of {total} points settled before the status (received {}, queue drops {})",
            st.settled(),
            st.received.load(Relaxed),
            st.queue_dropped.load(Relaxed),
        );
    }
    publish(&phones[0], &status_topic("p0"), b"offline".to_vec()).await;
    let mut r = redis().await;
    for (ing, keys) in [(&a, &keys_a), (&b, &keys_b)] {
        let st = ing.stats.clone();
        // Concurrent batches may reach Redis out of order: an older point is then stale,
        // correctly. `received` (points and the status) is counted every 200 ms.
        assert!(
            wait_until(Duration::from_secs(15), || st.settled() >= total
                && st.evicted_offline.load(Relaxed) == 1
                && st.received.load(Relaxed) > total)
            .await,
            "only {} of {total} points settled (received {}, queue drops {}, offline {})",
            st.settled(),
            st.received.load(Relaxed),
            st.queue_dropped.load(Relaxed),
            st.evicted_offline.load(Relaxed),
        );
        // Every point once: nothing shared out, nothing lost, nothing twice.
        assert_eq!(st.received.load(Relaxed), total + 1);
        assert_eq!(st.accepted.load(Relaxed) + st.stale.load(Relaxed), total);
        assert!(geopos(&mut r, keys, "p0").await.is_none());
        for c in 1..couriers {
            let got = geopos(&mut r, keys, &format!("p{c}"))
                .await
                .expect("courier live");
            assert!(near(got, coord(c, seqs)), "p{c} not at its highest seq");
        }
    }
    a.stop().await;
    b.stop().await;
    edge.stop().await;
    cleanup(&keys_a).await;
    cleanup(&keys_b).await;
}

async fn bad_payloads_are_counted_by_reason_and_good_ones_pass(kind: BrokerKind) {
    let (broker, edge) = start_bus_with_edge(kind).await;
    let keys = Keys::with_prefix(&prefix());
    // Plain subscriptions: rumqttd's shared groups now and then deliver a message twice, and a
    // bad payload delivered twice is counted twice (111 of 110 in one run), which is not what
    // this test is about.
    let mut cfg = test_ingest_config();
    cfg.group = String::new();
    cfg.status_group = String::new();
    let ing = start_ingest(&broker, cfg, keys.clone()).await;
    let t = now();
    // Publishing on another courier's topic is the edge's to refuse (3.1.1: it closes the
    // connection); it never reaches ingest, whose own topic/id check is tested below with a
    // forged payload id on the courier's own topic.
    let (b3, b3_driver) = phone(&edge, "b3", None).await;
    publish(&b3, &loc_topic("b1"), point("b1", 24.7, 46.7, t, 1)).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(5), b3_driver)
            .await
            .is_ok(),
        "the edge kept a connection that published on another courier's topic"
    );
    assert_eq!(edge.stats.refused(Refusal::Topic), 1);
    let corpus: Vec<(&str, Vec<u8>, Invalid)> = vec![
        ("b1", b"not json".to_vec(), Invalid::NotJson),
        ("b1", b"".to_vec(), Invalid::NotJson),
        (
            "b1",
            br#"{"id":"b1","lat":24.7,"lon":46.7,"ts":1}"#.to_vec(),
            Invalid::MissingField,
        ),
        (
            "b1",
            format!(r#"{{"id":"b1","lat":"x","lon":46.7,"ts":{t},"seq":1}}"#).into_bytes(),
            Invalid::BadType,
        ),
        ("b1", point("b1", 95.0, 46.7, t, 1), Invalid::OutOfRange),
        ("b1", point("b1", 24.7, 200.0, t, 1), Invalid::OutOfRange),
        ("b1", point("b1", 0.0, 0.0, t, 1), Invalid::NullIsland),
        (
            "b1",
            point("someone-else", 24.7, 46.7, t, 1),
            Invalid::IdMismatch,
        ),
        (
            "b1",
            point("b1", 24.7, 46.7, t + 3600.0, 1),
            Invalid::FutureTs,
        ),
        ("b1", vec![b'{'; 600], Invalid::Oversize),
    ];
    let mut rng = rand::rng();
    let random: Vec<Vec<u8>> = (0..100)
        .map(|_| {
            (0..rand::Rng::random_range(&mut rng, 0..200))
                .map(|_| rand::random::<u8>())
                .collect()
        })
        .collect();
    // Every payload on its courier's own topic, from his own phone: the edge looks at topics,
    // not payloads, so all of it reaches ingest, which judges it.
    let good_ids: Vec<String> = (1..=random.len() + 1).map(|i| format!("g{i}")).collect();
    let good_phones = phones(&edge, &good_ids).await;
    let bad_phones = phones(&edge, &["b1", "b2"]).await;
    let mut good = 0u64;
    for (i, (id, payload, _)) in corpus.iter().enumerate() {
        assert_eq!(*id, "b1");
        publish(&bad_phones[0], &loc_topic(id), payload.clone()).await;
        publish(
            &good_phones[0],
            &loc_topic("g1"),
            point("g1", 24.7, 46.7, t - 50.0 + i as f64, i as u64 + 1),
        )
        .await;
        good += 1;
    }
    for (i, junk) in random.iter().enumerate() {
        publish(&bad_phones[1], &loc_topic("b2"), junk.clone()).await;
        publish(
            &good_phones[i + 1],
            &loc_topic(&good_ids[i + 1]),
            point(&good_ids[i + 1], 24.7, 46.7, t - 1.0, 1),
        )
        .await;
        good += 1;
    }
    let bad = (corpus.len() + random.len()) as u64;
    let st = ing.stats.clone();
    assert!(
        wait_until(Duration::from_secs(15), || st.settled() >= good + bad).await,
        "settled {} of {}",
        st.settled(),
        good + bad
    );
    assert_eq!(
        st.accepted.load(Relaxed),
        good,
        "every good point beside a bad one is accepted (stale {})",
        st.stale.load(Relaxed)
    );
    assert_eq!(st.invalid.load(Relaxed), bad);
    for (_, _, reason) in &corpus {
        assert!(st.invalid_for(*reason) >= 1, "no {reason:?} counted");
    }
    assert_eq!(st.invalid_for(Invalid::IdMismatch), 1);
    assert_eq!(edge.stats.forwarded.load(Relaxed), good + bad);
    assert_eq!(edge.stats.refused_total(), 1);
    ing.stop().await;
    edge.stop().await;
    cleanup(&keys).await;
}

async fn seq_reset_is_tracked_again_but_replays_never_win(kind: BrokerKind) {
    let (broker, edge) = start_bus_with_edge(kind).await;
    let keys = Keys::with_prefix(&prefix());
    let mut cfg = test_ingest_config();
    cfg.seq_reset_after = Duration::from_secs(1);
    let ing = start_ingest(&broker, cfg, keys.clone()).await;
    let (r1, _driver) = phone(&edge, "r1", None).await;
    let mut r = redis().await;
    let st = ing.stats.clone();
    let topic = loc_topic("r1");
    let t = now() - 60.0;
    let settle = |n: u64| {
        let st = st.clone();
        async move {
            assert!(
                wait_until(Duration::from_secs(10), || st.settled() >= n).await,
                "not settled"
            )
        }
    };

    // The old install: seq up to 500.
    publish(&r1, &topic, point("r1", 24.70, 46.70, t, 500)).await;
    settle(1).await;
    // Reinstall: seq restarts at 1 with a newer phone time. Within seq_reset_after of the last
    // accepted point it is stale (a second stream must not flip-flop the location)...
    publish(&r1, &topic, point("r1", 24.71, 46.71, t + 10.0, 1)).await;
    settle(2).await;
    assert!(near(
        geopos(&mut r, &keys, "r1").await.unwrap(),
        (24.70, 46.70)
    ));
    // ...and once the courier has been silent that long, the new stream takes over.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    publish(&r1, &topic, point("r1", 24.72, 46.72, t + 12.0, 2)).await;
    settle(3).await;
    assert!(
        near(geopos(&mut r, &keys, "r1").await.unwrap(), (24.72, 46.72)),
        "reset not taken"
    );
    assert_eq!(st.seq_resets.load(Relaxed), 1);
    publish(&r1, &topic, point("r1", 24.73, 46.73, t + 14.0, 3)).await;
    settle(4).await;
    assert!(near(
        geopos(&mut r, &keys, "r1").await.unwrap(),
        (24.73, 46.73)
    ));

    // Replays of the old install, flushed late from the offline buffer, never win: neither
    // lower seqs with older phone times, nor higher seqs from before the reset. Pacing: past
    // seq_reset_after again, where a reset would be allowed if the replays could trigger one.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    publish(&r1, &topic, point("r1", 24.60, 46.60, t - 5.0, 499)).await;
    publish(&r1, &topic, point("r1", 24.61, 46.61, t + 1.0, 501)).await;
    publish(&r1, &topic, point("r1", 24.62, 46.62, t + 13.0, 2)).await;
    settle(7).await;
    assert!(
        near(geopos(&mut r, &keys, "r1").await.unwrap(), (24.73, 46.73)),
        "a replay became the location"
    );
    assert_eq!(st.accepted.load(Relaxed), 3);
    assert_eq!(st.stale.load(Relaxed), 4);
    ing.stop().await;
    edge.stop().await;
    cleanup(&keys).await;
}

async fn silent_couriers_are_evicted_and_last_will_removes_at_once(kind: BrokerKind) {
    let (broker, edge) = start_bus_with_edge(kind).await;
    let keys = Keys::with_prefix(&prefix());
    let mut cfg = test_ingest_config();
    cfg.evict_after = Duration::from_secs(1);
    cfg.seen_every = Duration::from_millis(500);
    let ing = start_ingest(&broker, cfg, keys.clone()).await;
    let mut r = redis().await;
    let (quiet, _quiet_driver) = phone(&edge, "quiet", None).await;
    let (talker, _talker_driver) = phone(&edge, "talker", None).await;
    let t = now();
    publish(
        &quiet,
        &loc_topic("quiet"),
        point("quiet", 24.7, 46.7, t, 1),
    )
    .await;
    let st = ing.stats.clone();
    assert!(wait_until(Duration::from_secs(5), || st.accepted.load(Relaxed) == 1).await);
    assert!(geopos(&mut r, &keys, "quiet").await.is_some());
    // Keep another courier talking: only the silent one leaves.
    for i in 0..12u64 {
        publish(
            &talker,
            &loc_topic("talker"),
            point("talker", 24.71, 46.71, t + i as f64 * 0.2, i + 1),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        geopos(&mut r, &keys, "quiet").await.is_none(),
        "silent courier still live"
    );
    assert!(
        geopos(&mut r, &keys, "talker").await.is_some(),
        "talking courier evicted"
    );
    let seen: Option<f64> = redis::cmd("ZSCORE")
        .arg(&keys.seen)
        .arg("quiet")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(seen, None);
    assert!(st.evicted_silent.load(Relaxed) >= 1);
    ing.stop().await;
    cleanup(&keys).await;

    // Last Will: a courier whose app dies is removed at once, long before evict_after.
    let keys = Keys::with_prefix(&prefix());
    let ing = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let will = LastWill::new(status_topic("lw1"), "offline", QoS::AtLeastOnce, false);
    let (lw1, driver) = phone(&edge, "lw1", Some(will)).await;
    publish(&lw1, &loc_topic("lw1"), point("lw1", 24.7, 46.7, now(), 1)).await;
    let st = ing.stats.clone();
    assert!(wait_until(Duration::from_secs(5), || st.accepted.load(Relaxed) == 1).await);
    assert!(geopos(&mut r, &keys, "lw1").await.is_some());
    assert_eq!(edge.stats.wills.load(Relaxed), 0);
    // Killing the event loop drops the TCP connection without DISCONNECT: the edge publishes
    // the Will it kept from the phone's CONNECT.
    driver.abort();
    drop(lw1);
    assert!(
        wait_until(Duration::from_secs(5), || st.evicted_offline.load(Relaxed)
            == 1)
        .await,
        "will not handled"
    );
    assert!(geopos(&mut r, &keys, "lw1").await.is_none());
    assert_eq!(edge.stats.wills.load(Relaxed), 1);
    ing.stop().await;
    edge.stop().await;
    cleanup(&keys).await;
}

async fn tracks_go_only_to_the_order_of_the_courier(kind: BrokerKind) {
    let (broker, edge) = start_bus_with_edge(kind).await;
    let keys = Keys::with_prefix(&prefix());
    let ing = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let mut r = redis().await;
    let _: () = redis::cmd("HSET")
        .arg(&keys.order)
        .arg("w1")
        .arg("o-77")
        .query_async(&mut r)
        .await
        .unwrap();
    // On the bus, as fanout reads it.
    let mut tracks = subscriber(&broker.endpoint, "track/#").await;
    let (w1, _w1_driver) = phone(&edge, "w1", None).await;
    let (w2, _w2_driver) = phone(&edge, "w2", None).await;
    let t = now() - 10.0;
    publish(&w1, &loc_topic("w1"), point("w1", 24.7001, 46.7001, t, 10)).await;
    publish(&w2, &loc_topic("w2"), point("w2", 24.7002, 46.7002, t, 10)).await; // no order
    publish(
        &w1,
        &loc_topic("w1"),
        point("w1", 24.7003, 46.7003, t - 1.0, 9),
    )
    .await; // stale
    publish(
        &w1,
        &loc_topic("w1"),
        point("w1", 24.7004, 46.7004, t + 1.0, 11),
    )
    .await;
    let st = ing.stats.clone();
    assert!(wait_until(Duration::from_secs(5), || st.settled() >= 4).await);
    let mut got = Vec::new();
    while let Ok(Some(p)) = tokio::time::timeout(Duration::from_millis(700), tracks.recv()).await {
        got.push(p);
    }
    assert_eq!(
        got.len(),
        2,
        "one track per accepted point of w1, none for w2 or the stale point"
    );
    for (p, (lat, lon, ts)) in got
        .iter()
        .zip([(24.7001, 46.7001, t), (24.7004, 46.7004, t + 1.0)])
    {
        assert_eq!(p.topic, "track/o-77");
        let v: serde_json::Value = serde_json::from_slice(&p.payload).unwrap();
        assert_eq!(v, serde_json::json!({"lat": lat, "lon": lon, "ts": ts}));
    }
    assert_eq!(st.tracks_published.load(Relaxed), 2);
    ing.stop().await;
    edge.stop().await;
    cleanup(&keys).await;
}

async fn duplicate_deliveries_change_nothing(kind: BrokerKind) {
    let (broker, edge) = start_bus_with_edge(kind).await;
    let keys = Keys::with_prefix(&prefix());
    let ing = start_ingest(&broker, IngestConfigExt::workers(2), keys.clone()).await;
    let (d1, _driver) = phone(&edge, "d1", None).await;
    let mut r = redis().await;
    let t = now() - 5.0;
    let p = point("d1", 24.75, 46.75, t, 3);
    for _ in 0..5 {
        publish(&d1, &loc_topic("d1"), p.clone()).await;
    }
    let st = ing.stats.clone();
    assert!(wait_until(Duration::from_secs(5), || st.settled() >= 5).await);
    assert_eq!(st.accepted.load(Relaxed), 1);
    assert_eq!(st.stale.load(Relaxed), 4);
    let state: Vec<u8> = redis::cmd("HGET")
        .arg(&keys.seq)
        .arg("d1")
        .query_async(&mut r)
        .await
        .unwrap();
    let state = ingest::batch::SeqState::decode(&state).expect("seq state readable");
    assert_eq!(state.seq, 3.0, "{state:?}");
    assert!(near(
        geopos(&mut r, &keys, "d1").await.unwrap(),
        (24.75, 46.75)
    ));
    let _ = NOW_SLACK;
    ing.stop().await;
    edge.stop().await;
    cleanup(&keys).await;
}

struct IngestConfigExt;
impl IngestConfigExt {
    fn workers(n: usize) -> ingest::IngestConfig {
        ingest::IngestConfig {
            workers: n,
            ..test_ingest_config()
        }
    }
}

/// The last batch is written on shutdown: everything received before the signal is settled
/// when `run` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_what_was_received() {
    let (broker, edge) = start_bus_with_edge(BrokerKind::Embedded).await;
    let keys = Keys::with_prefix(&prefix());
    let ing = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let ids: Vec<String> = (0..300).map(|c| format!("s{c}")).collect();
    let phones = phones(&edge, &ids).await;
    let t = now() - 5.0;
    let n = 3000u64;
    for i in 0..n {
        let c = i as usize % ids.len();
        publish(
            &phones[c],
            &loc_topic(&ids[c]),
            point(&ids[c], 24.7, 46.7, t + i as f64 * 1e-3, i + 1),
        )
        .await;
    }
    let st = ing.stats.clone();
    assert!(wait_until(Duration::from_secs(10), || st.received.load(Relaxed) >= n).await);
    ing.stop().await;
    assert_eq!(
        st.settled() + st.queue_dropped.load(Relaxed),
        st.received.load(Relaxed)
    );
    // Batches run concurrently, so an earlier point may reach Redis after a later one of the
    // same courier and be stale; rumqttd may also deliver a message twice. None is lost or failed.
    assert_eq!(
        st.accepted.load(Relaxed) + st.stale.load(Relaxed),
        st.received.load(Relaxed)
    );
    assert_eq!(st.errors.load(Relaxed) + st.queue_dropped.load(Relaxed), 0);
    edge.stop().await;
    cleanup(&keys).await;
}

/// A Redis that lost its scripts (restart, SCRIPT FLUSH, failover) is handled: NOSCRIPT loads
/// the script again and the batch goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_survived() {
    let (broker, edge) = start_bus_with_edge(BrokerKind::Embedded).await;
    let keys = Keys::with_prefix(&prefix());
    let ing = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let (f1, _driver) = phone(&edge, "f1", None).await;
    let mut r = redis().await;
    let t = now() - 5.0;
    publish(&f1, &loc_topic("f1"), point("f1", 24.7, 46.7, t, 1)).await;
    let st = ing.stats.clone();
    assert!(wait_until(Duration::from_secs(5), || st.accepted.load(Relaxed) == 1).await);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut r)
        .await
        .unwrap();
    publish(&f1, &loc_topic("f1"), point("f1", 24.8, 46.8, t + 1.0, 2)).await;
    assert!(
        wait_until(Duration::from_secs(5), || st.accepted.load(Relaxed) == 2).await,
        "batch lost after SCRIPT FLUSH"
    );
    assert_eq!(st.errors.load(Relaxed), 0);
    assert!(near(
        geopos(&mut r, &keys, "f1").await.unwrap(),
        (24.8, 46.8)
    ));
    ing.stop().await;
    edge.stop().await;
    cleanup(&keys).await;
}

/// A batch retried after a response timeout (Redis had applied the first run) gets the verdicts
/// of that first run: accepted, with the courier's order for its track. Judged again, every point
/// would be stale (its own seq already stored) and no track would go out. Another batch id is
/// judged afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_gets_the_verdicts_of_its_first_run() {
    let keys = Keys::with_prefix(&prefix());
    let mut r = redis().await;
    let _: () = redis::cmd("HSET")
        .arg(&keys.order)
        .arg("rb1")
        .arg("ord-rb")
        .query_async(&mut r)
        .await
        .unwrap();
    let script = redis::Script::new(&ingest::sink::batch_lua());
    let t = now();
    let msgs = [ingest::batch::Message {
        topic: loc_topic("rb1"),
        payload: point("rb1", 24.7, 46.6, t - 1.0, 7).into(),
        received: t,
    }];
    let plan = ingest::batch::plan(&msgs, &courier_wire::Validation::default(), t);
    let call = ingest::batch::script_call(&plan, t, 30.0, 5.0);
    let run = |record: String| {
        let mut inv = script.prepare_invoke();
        for k in ingest::sink::batch_keys(&keys, &record) {
            inv.key(k);
        }
        for a in &call.args {
            inv.arg(a);
        }
        inv.arg(0);
        inv
    };
    let first: Vec<redis::Value> = run(format!("{}b1", keys.batch_record))
        .invoke_async(&mut r)
        .await
        .unwrap();
    let again: Vec<redis::Value> = run(format!("{}b1", keys.batch_record))
        .invoke_async(&mut r)
        .await
        .unwrap();
    let other: Vec<redis::Value> = run(format!("{}b2", keys.batch_record))
        .invoke_async(&mut r)
        .await
        .unwrap();
    let verdict = |v: &[redis::Value]| ingest::batch::parse_reply(v, &call).unwrap()[0].clone();
    let accepted = ingest::batch::Verdict::Accepted {
        reset: false,
        orders: Some(
            vec![ingest::batch::Carried {
                order: "ord-rb".into(),
                places: None,
            }]
            .into(),
        ),
    };
    assert_eq!(verdict(&first), accepted);
    assert_eq!(verdict(&again), accepted, "the retry was judged again");
    assert_eq!(
        verdict(&other),
        ingest::batch::Verdict::Stale,
        "another batch with the same point is stale"
    );
    let ttl: i64 = redis::cmd("TTL")
        .arg(format!("{}b1", keys.batch_record))
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(
        (1..=60).contains(&ttl),
        "the record is kept a minute: ttl {ttl}"
    );
    cleanup(&keys).await;
    let _: () = redis::cmd("DEL")
        .arg(format!("{}b1", keys.batch_record))
        .arg(format!("{}b2", keys.batch_record))
        .query_async(&mut r)
        .await
        .unwrap();
}
