//! The dispatch query against real Redis: rings widen until enough couriers are found, nearest
//! first, silent couriers skipped, ANY for hot spots. Each test has its own key prefix.

use crate::support;

use courier_wire::Keys;
use dispatch::{bench, Dispatch, Query};
use std::time::Duration;
use support::{prefix, services};

const AT: (f64, f64) = (24.7114, 46.6744);

/// A point `km` east of AT.
fn east(km: f64) -> (f64, f64) {
    (AT.0, AT.1 + km / (111.32 * AT.0.to_radians().cos()))
}

async fn setup(couriers: &[(&str, f64, f64)]) -> (Dispatch, Keys, f64) {
    let keys = Keys::with_prefix(&prefix());
    let now = courier_wire::clock::unix_now();
    let list: Vec<(String, f64, f64)> = couriers
        .iter()
        .map(|(id, km, age)| {
            let (lat, lon) = east(*km);
            let _ = age;
            (id.to_string(), lat, lon)
        })
        .collect();
    bench::seed(&services().redis_url, &keys, &list, now)
        .await
        .unwrap();
    // Ages other than 0: rewrite their last-seen time.
    let mut r = support::redis().await;
    for (id, _, age) in couriers {
        if *age > 0.0 {
            let _: () = redis::cmd("ZADD")
                .arg(&keys.seen)
                .arg(now - age)
                .arg(*id)
                .query_async(&mut r)
                .await
                .unwrap();
        }
    }
    (
        Dispatch::connect(&services().redis(), keys.clone())
            .await
            .unwrap(),
        keys,
        now,
    )
}

fn query(count: usize) -> Query {
    Query {
        count,
        max_age: Duration::from_secs(30),
        ..Query::at(AT.0, AT.1)
    }
}

fn ids(n: &dispatch::Nearest) -> Vec<&str> {
    n.couriers.iter().map(|c| c.id.as_str()).collect()
}

#[tokio::test]
async fn rings_widen_until_enough_and_answers_are_nearest_first() {
    let (d, keys, now) = setup(&[
        ("a", 0.3, 0.0),
        ("b", 0.1, 0.0),
        ("c", 0.45, 0.0),
        ("d", 0.8, 0.0),
        ("e", 0.7, 0.0),
        ("f", 0.9, 0.0),
        ("g", 1.5, 0.0),
        ("h", 4.0, 0.0),
    ])
    .await;
    let n = d.nearest(&query(3), now).await.unwrap();
    assert_eq!(n.ring, Some(0), "three within 0.5 km");
    assert_eq!(ids(&n), ["b", "a", "c"]);
    let n = d.nearest(&query(5), now).await.unwrap();
    assert_eq!(n.ring, Some(1), "the 1 km ring holds five");
    assert_eq!(ids(&n), ["b", "a", "c", "e", "d"]);
    assert!(n.couriers.windows(2).all(|w| w[0].dist_km <= w[1].dist_km));
    assert!((n.couriers[0].dist_km - 0.1).abs() < 0.005);
    let n = d.nearest(&query(8), now).await.unwrap();
    assert_eq!(n.ring, Some(3));
    assert_eq!(n.couriers.len(), 8);
    let n = d.nearest(&query(9), now).await.unwrap();
    assert_eq!(n.ring, None, "not enough even in 5 km");
    assert_eq!(n.couriers.len(), 8, "then what the widest ring had");
    support::cleanup(&keys).await;
}

#[tokio::test]
async fn couriers_silent_longer_than_max_age_are_skipped() {
    let (d, keys, now) = setup(&[
        ("near-silent", 0.05, 120.0),
        ("near-ok", 0.2, 5.0),
        ("missing-seen", 0.1, 0.0),
        ("mid", 0.8, 0.0),
        ("mid-silent", 0.6, 31.0),
    ])
    .await;
    let mut r = support::redis().await;
    let _: () = redis::cmd("ZREM")
        .arg(&keys.seen)
        .arg("missing-seen")
        .query_async(&mut r)
        .await
        .unwrap();
    let n = d.nearest(&query(2), now).await.unwrap();
    assert_eq!(ids(&n), ["near-ok", "mid"]);
    assert_eq!(n.ring, Some(1));
    assert!(now - n.couriers[0].seen >= 4.9 && now - n.couriers[0].seen < 6.0);
    support::cleanup(&keys).await;
}

#[tokio::test]
async fn stale_couriers_crowding_a_ring_do_not_hide_fresh_ones_in_it() {
    let mut list: Vec<(String, f64, f64)> = (0..200)
        .map(|i| (format!("old{i:03}"), 0.01 + i as f64 * 0.001, 300.0))
        .collect();
    list.push(("fresh1".into(), 0.4, 0.0));
    list.push(("fresh2".into(), 0.45, 0.0));
    let refs: Vec<(&str, f64, f64)> = list.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
    let (d, keys, now) = setup(&refs).await;
    let n = d.nearest(&query(2), now).await.unwrap();
    assert_eq!(ids(&n), ["fresh1", "fresh2"]);
    assert_eq!(n.ring, Some(0));
    support::cleanup(&keys).await;
}

#[tokio::test]
async fn any_mode_answers_a_hot_spot_with_count_couriers_on_it() {
    let hot: Vec<(String, f64, f64)> = (0..3000).map(|i| (format!("h{i:04}"), 0.0, 0.0)).collect();
    let refs: Vec<(&str, f64, f64)> = hot.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
    let (d, keys, now) = setup(&refs).await;
    for any in [false, true] {
        let n = d.nearest(&Query { any, ..query(10) }, now).await.unwrap();
        assert_eq!(n.ring, Some(0));
        assert_eq!(n.couriers.len(), 10);
        assert!(n.couriers.iter().all(|c| c.dist_km < 0.001));
    }
    support::cleanup(&keys).await;
}

#[tokio::test]
async fn empty_index_and_bad_queries() {
    let (d, keys, now) = setup(&[]).await;
    let n = d.nearest(&query(5), now).await.unwrap();
    assert_eq!(n.ring, None);
    assert!(n.couriers.is_empty());
    let err = d
        .nearest(
            &Query {
                radii_km: vec![2.0, 1.0],
                ..query(5)
            },
            now,
        )
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("ascending"));
    support::cleanup(&keys).await;
}

/// `couriers:seen` is written once per `ingest.seen_every` bucket, so the last-seen time comes
/// from the courier's seq state when he has one: a courier whose `seen` score lags past
/// max_age but whose state is fresh is found, with the state's time; one whose state is older
/// than max_age is skipped even though `seen` looks fresh; without state `seen` decides.
#[tokio::test]
async fn the_last_seen_time_comes_from_the_seq_state() {
    let (d, keys, now) = setup(&[
        ("lagged", 0.5, 40.0),
        ("old", 1.0, 0.0),
        ("plain", 1.5, 0.0),
    ])
    .await;
    let state = |server_ts: f64| {
        courier_wire::SeqState {
            seq: 1.0,
            phone_ts: server_ts,
            epoch_ts: server_ts,
            server_ts,
        }
        .encode()
    };
    let mut r = support::redis().await;
    let _: () = redis::cmd("HSET")
        .arg(&keys.seq)
        .arg("lagged")
        .arg(state(now - 3.0))
        .arg("old")
        .arg(state(now - 45.0))
        .query_async(&mut r)
        .await
        .unwrap();
    let n = d.nearest(&query(3), now).await.unwrap();
    assert_eq!(ids(&n), ["lagged", "plain"]);
    assert_eq!(n.couriers[0].seen, now - 3.0);
    support::cleanup(&keys).await;
}
