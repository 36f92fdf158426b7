//! Issue 17 against real PostgreSQL (a fresh schema per test) and real Redis (a fresh key
//! prefix per test), over real sockets: the anonymous aggregates on data with known answers,
//! the partition drop that waits for them, erasure and a courier's own trail tried as an
//! attacker would (valid tokens of the wrong audience or the wrong courier), audit retention.

use crate::support;

use courier_auth::{Audience, Claims};
use courier_wire::Keys;
use history_writer::aggregates::{self, RunSettings};
use history_writer::partitions::{self, day_of};
use history_writer::rows::Row;
use history_writer::sink::PgSink;
use history_writer::{geohash, AggregateApi, Erasure, HistoryConfig, Trail};
use std::time::Duration;
use support::*;

/// 2026-11-30 00:00:00Z
const NOV30: f64 = 1_795_996_800.0;
const DAY: f64 = 86_400.0;

fn now() -> f64 {
    courier_wire::clock::unix_now()
}

async fn migrated(url: &str) -> tokio_postgres::Client {
    let mut c = pg_connect(url).await;
    history_writer::migrate(&mut c).await.unwrap();
    c
}

async fn count(c: &tokio_postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

fn token(aud: Audience, sub: &str, exp_in: i64) -> String {
    let t = now() as i64;
    sign(&Claims {
        aud,
        sub: sub.into(),
        order: None,
        iat: t as u64,
        exp: (t + exp_in).max(0) as u64,
    })
}

async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

fn settings() -> RunSettings {
    RunSettings {
        min_couriers: 5,
        delay: Duration::from_secs(600),
        retention_days: 730,
        max_hours: 100_000,
    }
}

/// The south-west corner of the geohash-6 cell holding (lat, lon), plus a margin, so that a
/// courier moving 120 m north stays inside it.
fn inside_cell(lat: f64, lon: f64) -> (f64, f64) {
    let size_lat = 180.0 / geohash::CELLS_PER_AXIS as f64;
    let size_lon = 360.0 / geohash::CELLS_PER_AXIS as f64;
    let y = geohash::axis_index(lat, 180.0) as f64;
    let x = geohash::axis_index(lon, 360.0) as f64;
    (
        y * size_lat - 90.0 + 0.0005,
        x * size_lon - 180.0 + size_lon / 2.0,
    )
}

/// A courier moving due north at `speed` m/s: 11 points 2 s apart (10 segments). Along a
/// meridian the haversine distance is exactly R * dlat, so each segment's speed is `speed`.
fn walk(courier: &str, start: (f64, f64), t0: f64, speed: f64) -> Vec<Row> {
    let dlat = (speed * 2.0 / aggregates::EARTH_RADIUS_M).to_degrees();
    (0..11)
        .map(|i| Row {
            courier_id: courier.into(),
            seq: i + 1,
            phone_ts: t0 + 2.0 * i as f64,
            received_at: t0 + 2.0 * i as f64 + 0.3,
            order_id: Some(format!("order-{courier}").into()),
            lat: start.0 + dlat * i as f64,
            lon: start.1,
        })
        .collect()
}

/// Six couriers at 1..6 m/s in one cell, four in another: one row, for the first cell, with
/// the exact counts, median and p90; nothing anywhere names a courier or an order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_keep_only_cells_of_k_couriers_with_exact_speeds_and_no_identifier() {
    let s = pg_schema().await;
    let admin = migrated(&s.url).await;
    let mut admin = admin;
    partitions::ensure_days(&mut admin, &[day_of(NOV30)])
        .await
        .unwrap();
    let hour = NOV30 + 10.0 * 3600.0;
    let a = inside_cell(24.7136, 46.6753); // Riyadh
    let b = inside_cell(24.7136, 46.7253);
    let mut rows = Vec::new();
    for (i, v) in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0].iter().enumerate() {
        rows.extend(walk(&format!("ca{i}"), a, hour + 100.0 + i as f64, *v));
    }
    for i in 0..4 {
        rows.extend(walk(&format!("cb{i}"), b, hour + 100.0, 3.0));
    }
    // A point delivered twice counts once; a point of another hour is not in this one.
    rows.push(rows[0].clone());
    let mut late = walk("ca0", a, hour + 3700.0, 1.0);
    late.truncate(1);
    rows.extend(late);
    PgSink::new(&s.url).copy(&rows).await.unwrap();

    // Closed at 11:00, aggregated from 11:10.
    let out = aggregates::run_pending(&mut admin, hour + 3600.0 + 599.0, &settings())
        .await
        .unwrap();
    assert_eq!(out.done_until, hour as i64, "10:00 not yet past its delay");
    assert_eq!(out.cells, 0);
    let out = aggregates::run_pending(&mut admin, hour + 3600.0 + 600.0, &settings())
        .await
        .unwrap();
    assert_eq!(out.hours, 1);
    assert_eq!(out.done_until, hour as i64 + 3600);
    assert_eq!(out.cells, 1, "the cell of four couriers is not written");
    const READ: &str = "SELECT extract(epoch FROM hour)::float8, cell, couriers, points, segments, median_speed_mps, p90_speed_mps FROM courier_aggregates";
    let got = admin.query(READ, &[]).await.unwrap();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.get::<_, f64>(0), hour);
    assert_eq!(r.get::<_, String>(1), geohash::encode(a.0, a.1));
    assert_eq!(r.get::<_, i32>(2), 6);
    assert_eq!(r.get::<_, i32>(3), 66, "each delivered point once");
    assert_eq!(r.get::<_, i32>(4), 60);
    // 60 samples, ten each of 1..6 m/s: the median lies between the 30th (3) and 31st (4);
    // p90 at rank 53.1 of 0..59 is among the sixes.
    let (median, p90): (f64, f64) = (r.get(5), r.get(6));
    assert!((median - 3.5).abs() < 1e-6, "median {median}");
    assert!((p90 - 6.0).abs() < 1e-6, "p90 {p90}");

    // No identifier anywhere: the table's columns, and no value holding an id.
    let cols: Vec<String> = admin
        .query(
            "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'courier_aggregates' ORDER BY ordinal_position",
            &[&s.name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        cols,
        [
            "hour",
            "cell",
            "couriers",
            "points",
            "segments",
            "median_speed_mps",
            "p90_speed_mps"
        ]
    );
    let text: String = admin
        .query_one(
            "SELECT coalesce(string_agg(t::text, ' '), '') FROM courier_aggregates t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        !text.contains("ca") && !text.contains("cb") && !text.contains("order"),
        "{text}"
    );

    // Idempotent: again, nothing changes; and with the watermark moved back, the hour is
    // replaced, not added.
    let again = aggregates::run_pending(&mut admin, hour + 3600.0 + 900.0, &settings())
        .await
        .unwrap();
    assert_eq!(again.hours, 0);
    admin
        .execute(
            "UPDATE aggregate_watermark SET done_until = to_timestamp($1)",
            &[&hour],
        )
        .await
        .unwrap();
    aggregates::run_pending(&mut admin, hour + 3600.0 + 900.0, &settings())
        .await
        .unwrap();
    assert_eq!(admin.query(READ, &[]).await.unwrap().len(), 1);

    // The query API: a trail (operations) token reads it; a courier's device token does not.
    let clock = history_writer::system_clock();
    let addr =
        serve(AggregateApi::new(&s.url, test_verifier(Audience::Trail), clock).router()).await;
    let q = format!("/aggregates?from={}&to={}", hour, hour + 3600.0);
    let r = http_get(addr, &q, Some(&token(Audience::Trail, "ops", 600))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let cells = r.json()["cells"].as_array().unwrap().clone();
    assert_eq!(cells.len(), 1);
    assert_eq!(cells[0]["couriers"], 6);
    assert_eq!(cells[0]["cell"], geohash::encode(a.0, a.1));
    let other = format!("{q}&cell={}", &geohash::encode(b.0, b.1));
    let r = http_get(addr, &other, Some(&token(Audience::Trail, "ops", 600))).await;
    assert_eq!(r.json()["cells"].as_array().unwrap().len(), 0);
    for bad in [
        Some(token(Audience::Courier, "ca0", 600)),
        Some(token(Audience::Trail, "ops", -5)),
        None,
    ] {
        let r = http_get(addr, &q, bad.as_deref()).await;
        assert_eq!(r.status, 401, "{}", r.body);
        assert!(!r.body.contains("couriers"), "{}", r.body);
    }
    s.drop().await;
}

/// With aggregates on, a day past retention is dropped only once the aggregates have passed
/// its end; before that it is held (its points would be lost to them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partition_drop_keeps_a_day_not_yet_aggregated() {
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    let today = day_of(NOV30);
    partitions::ensure_days(&mut admin, &[today - 33, today - 32, today - 31, today])
        .await
        .unwrap();
    let at = NOV30 + 12.0 * 3600.0;
    // Nothing aggregated yet: the three days past 30 days are all held.
    let out = partitions::upkeep(&mut admin, at, 0, 30, true)
        .await
        .unwrap();
    assert!(out.dropped.is_empty(), "{out:?}");
    assert_eq!(
        out.held,
        [
            partitions::name(today - 33),
            partitions::name(today - 32),
            partitions::name(today - 31)
        ]
    );
    // Aggregate through the end of today-32 (hours close at 00:00 of today-31, + delay).
    let out = aggregates::run_pending(&mut admin, (today - 31) as f64 * DAY + 600.0, &settings())
        .await
        .unwrap();
    assert_eq!(out.done_until, (today - 31) * 86_400);
    assert_eq!(out.hours, 48, "from the oldest partition's start");
    let out = partitions::upkeep(&mut admin, at, 0, 30, true)
        .await
        .unwrap();
    assert_eq!(
        out.dropped,
        [partitions::name(today - 33), partitions::name(today - 32)]
    );
    assert_eq!(out.held, [partitions::name(today - 31)]);
    // Without aggregates the plain retention applies.
    let out = partitions::upkeep(&mut admin, at, 0, 30, false)
        .await
        .unwrap();
    assert_eq!(out.dropped, [partitions::name(today - 31)]);
    s.drop().await;
}

fn point_rows(courier: &str, days: &[f64], order: Option<&str>) -> Vec<Row> {
    days.iter()
        .enumerate()
        .map(|(i, t)| Row {
            courier_id: courier.into(),
            seq: i as i64 + 1,
            phone_ts: *t,
            received_at: *t + 0.5,
            order_id: order.map(Into::into),
            lat: 24.71 + i as f64 * 0.0001,
            lon: 46.67,
        })
        .collect()
}

async fn redis_state(
    keys: &Keys,
    courier: &str,
) -> (Option<f64>, Option<f64>, Option<String>, Option<String>) {
    let mut r = redis().await;
    let live: Option<f64> = redis::cmd("ZSCORE")
        .arg(&keys.live)
        .arg(courier)
        .query_async(&mut r)
        .await
        .unwrap();
    let seen: Option<f64> = redis::cmd("ZSCORE")
        .arg(&keys.seen)
        .arg(courier)
        .query_async(&mut r)
        .await
        .unwrap();
    let seq: Option<String> = redis::cmd("HGET")
        .arg(&keys.seq)
        .arg(courier)
        .query_async(&mut r)
        .await
        .unwrap();
    let order: Option<String> = redis::cmd("HGET")
        .arg(&keys.order)
        .arg(courier)
        .query_async(&mut r)
        .await
        .unwrap();
    (live, seen, seq, order)
}

/// Erasure removes every point of one courier in every partition, his live and seq state and
/// his order bindings, reports it, leaves an audit row and the aggregates; a support (trail)
/// token, a device token, an expired privacy token, or no reason move nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_removes_a_courier_everywhere_and_only_with_a_privacy_token() {
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    let t = now();
    let today = day_of(t);
    partitions::ensure_days(&mut admin, &[today - 20, today - 1, today])
        .await
        .unwrap();
    let times = [
        t - 20.0 * DAY,
        t - 20.0 * DAY + 4.0,
        t - DAY,
        t - 60.0,
        t - 56.0,
    ];
    let mut rows = point_rows("gone", &times, Some("o-gone"));
    rows.extend(point_rows("kept", &times, Some("o-kept")));
    PgSink::new(&s.url).copy(&rows).await.unwrap();
    admin
        .batch_execute(
            "INSERT INTO courier_aggregates VALUES (now(), 'th3n3e', 6, 60, 50, 3.0, 5.0)",
        )
        .await
        .unwrap();
    let keys = Keys::with_prefix(&prefix());
    let mut r = redis().await;
    for c in ["gone", "kept"] {
        let _: () = redis::pipe()
            .cmd("GEOADD")
            .arg(&keys.live)
            .arg(46.67)
            .arg(24.71)
            .arg(c)
            .ignore()
            .cmd("ZADD")
            .arg(&keys.seen)
            .arg(t)
            .arg(c)
            .ignore()
            .cmd("HSET")
            .arg(&keys.seq)
            .arg(c)
            .arg("packed-state")
            .ignore()
            .cmd("HSET")
            .arg(&keys.order)
            .arg(c)
            .arg(format!("o-{c}"))
            .ignore()
            .cmd("HSET")
            .arg(&keys.order_courier)
            .arg(format!("o-{c}"))
            .arg(c)
            .ignore()
            .query_async(&mut r)
            .await
            .unwrap();
    }
    // A stale reverse binding of an earlier order goes too.
    let _: () = redis::cmd("HSET")
        .arg(&keys.order_courier)
        .arg("o-old")
        .arg("gone")
        .query_async(&mut r)
        .await
        .unwrap();

    let api = Erasure::new(
        &s.url,
        &services().redis(),
        keys.clone(),
        test_verifier(Audience::Privacy),
        history_writer::system_clock(),
    )
    .unwrap();
    let addr = serve(api.router()).await;
    let path = "/couriers/gone/erasure";
    let body = r#"{"reason":"request #88 under article 18"}"#;
    let auth = |t: &str| format!("Bearer {t}");

    // Valid tokens of other audiences (support staff's trail token, the courier's own device
    // token), an expired privacy token, a forged one: 401, nothing moved.
    let forged = courier_auth::SigningKey::generate(Audience::Privacy)
        .unwrap()
        .sign(&Claims::privacy("mallory", now() as u64, 600));
    for bad in [
        token(Audience::Trail, "alice", 600),
        token(Audience::Courier, "gone", 600),
        token(Audience::Privacy, "dpo", -5),
        forged,
    ] {
        let a = http_post(addr, path, &[("Authorization", &auth(&bad))], body).await;
        assert_eq!(a.status, 401, "{}", a.raw_body);
        assert_eq!(a.body["error"], "a valid bearer token is required");
    }
    let a = http_post(addr, path, &[], body).await;
    assert_eq!(a.status, 401);
    // A valid privacy token without a reason: 400, nothing moved.
    let dpo = token(Audience::Privacy, "dpo", 600);
    for b in [r#"{"reason":"  "}"#, "{}", "not json"] {
        let a = http_post(addr, path, &[("Authorization", &auth(&dpo))], b).await;
        assert_eq!(a.status, 400, "{b}: {}", a.raw_body);
    }
    assert_eq!(
        count(
            &admin,
            "SELECT count(*) FROM courier_points WHERE courier_id = 'gone'"
        )
        .await,
        5
    );
    assert_eq!(count(&admin, "SELECT count(*) FROM erasure_log").await, 0);
    let (live, seen, seq, order) = redis_state(&keys, "gone").await;
    assert!(live.is_some() && seen.is_some() && seq.is_some() && order.is_some());

    // An arrival event of his in the outbox says where he was and when.
    admin
        .execute(
            "INSERT INTO order_events (dedupe_key, kind, tenant, order_id, courier_id, occurred_at)
             VALUES ('courier.arriving_dropoff:o-g', 'courier.arriving_dropoff', 't', 'o-g', 'gone', now())",
            &[],
        )
        .await
        .unwrap();

    // The privacy officer erases.
    let a = http_post(addr, path, &[("Authorization", &auth(&dpo))], body).await;
    assert_eq!(a.status, 200, "{}", a.raw_body);
    assert_eq!(
        a.body["removed"],
        serde_json::json!({"postgres_points": 5, "redis_live": 2, "redis_seq": 1, "order_bindings": 3, "order_events": 1})
    );
    assert_eq!(
        count(
            &admin,
            "SELECT count(*) FROM order_events WHERE courier_id = 'gone'"
        )
        .await,
        0
    );
    // No row of his in any partition (each one asked on its own, not only through the parent).
    for p in partitions::existing(&admin).await.unwrap() {
        let n = count(
            &admin,
            &format!("SELECT count(*) FROM \"{p}\" WHERE courier_id = 'gone'"),
        )
        .await;
        assert_eq!(n, 0, "{p}");
    }
    assert_eq!(
        count(
            &admin,
            "SELECT count(*) FROM courier_points WHERE courier_id = 'kept'"
        )
        .await,
        5
    );
    assert_eq!(redis_state(&keys, "gone").await, (None, None, None, None));
    let mut r = redis().await;
    let reverse: Vec<String> = redis::cmd("HVALS")
        .arg(&keys.order_courier)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(reverse, ["kept"]);
    let k = redis_state(&keys, "kept").await;
    assert!(
        k.0.is_some() && k.1.is_some() && k.2.is_some() && k.3.is_some(),
        "another courier untouched"
    );
    // The audit row; the aggregates stay.
    let row = admin
        .query_one("SELECT id, actor, courier_id, reason, points, redis_live, redis_seq, order_bindings FROM erasure_log", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), a.body["audit_id"].as_i64().unwrap());
    assert_eq!(row.get::<_, String>(1), "dpo");
    assert_eq!(row.get::<_, String>(2), "gone");
    assert_eq!(row.get::<_, String>(3), "request #88 under article 18");
    assert_eq!(
        (
            row.get::<_, i64>(4),
            row.get::<_, i32>(5),
            row.get::<_, i32>(6),
            row.get::<_, i32>(7)
        ),
        (5, 2, 1, 3)
    );
    assert_eq!(
        count(&admin, "SELECT count(*) FROM courier_aggregates").await,
        1
    );
    // Again: nothing left to remove, and that is recorded too.
    let a = http_post(addr, path, &[("Authorization", &auth(&dpo))], body).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["removed"]["postgres_points"], 0);
    let _: () = redis::cmd("DEL")
        .arg(&keys.order_courier)
        .query_async(&mut r)
        .await
        .unwrap();
    cleanup(&keys).await;
    s.drop().await;
}

/// A courier reads his own trail with his device token; courier A's valid token asking for B
/// gets 403 and nothing of B (and no audit row); a support token is not a device token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_courier_reads_his_own_trail_and_never_another() {
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    let t = now();
    partitions::upkeep(&mut admin, t, 1, 30, false)
        .await
        .unwrap();
    let base = (t - 600.0).floor();
    let times = [base + 10.0, base + 20.0, base + 30.0];
    let mut rows = point_rows("ca", &times, None);
    let mut b = point_rows("cb", &times, None);
    for r in &mut b {
        r.lat = 21.4225; // B's points are elsewhere: none may show up in A's answers
        r.lon = 39.8262;
    }
    rows.extend(b);
    PgSink::new(&s.url).copy(&rows).await.unwrap();
    let trail = Trail::new(
        &s.url,
        test_verifier(Audience::Trail),
        &HistoryConfig::default(),
        history_writer::system_clock(),
    )
    .unwrap()
    .with_courier_keys(test_verifier(Audience::Courier));
    let addr = serve(trail.router()).await;
    let w = format!("from={}&to={}", base, base + 3600.0);
    let a_token = token(Audience::Courier, "ca", 600);

    let r = http_get(addr, &format!("/couriers/cb/own-trail?{w}"), Some(&a_token)).await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(
        !r.body.contains("21.42") && !r.body.contains("39.82") && !r.body.contains("coordinates"),
        "{}",
        r.body
    );
    // With a reason, through the support door: his device token is not a trail token.
    let r = http_get(
        addr,
        &format!("/couriers/cb/trail?{w}&reason=x"),
        Some(&a_token),
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.body);
    // A trail token, an expired device token: not at the courier's door.
    for bad in [
        token(Audience::Trail, "alice", 600),
        token(Audience::Courier, "ca", -5),
    ] {
        let r = http_get(addr, &format!("/couriers/ca/own-trail?{w}"), Some(&bad)).await;
        assert_eq!(r.status, 401, "{}", r.body);
    }
    assert_eq!(
        count(&admin, "SELECT count(*) FROM trail_access_log").await,
        0
    );

    let r = http_get(addr, &format!("/couriers/ca/own-trail?{w}"), Some(&a_token)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let f = r.json();
    assert_eq!(f["type"], "Feature");
    assert_eq!(f["properties"]["courier_id"], "ca");
    assert_eq!(f["properties"]["count"], 3);
    assert!(!r.body.contains("21.42"), "{}", r.body);
    let row = admin
        .query_one(
            "SELECT actor, courier_id, reason, row_count FROM trail_access_log",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "courier:ca");
    assert_eq!(row.get::<_, String>(1), "ca");
    assert_eq!(row.get::<_, i32>(3), 3);
    s.drop().await;
}

/// Audit rows older than audit_retention_days go; younger ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_are_deleted_after_their_retention() {
    let s = pg_schema().await;
    let admin = migrated(&s.url).await;
    admin
        .batch_execute(
            "INSERT INTO trail_access_log (actor, courier_id, window_from, window_to, reason, row_count, accessed_at) VALUES \
               ('a', 'c1', now(), now(), 'r', 1, now() - interval '400 days'), \
               ('a', 'c1', now(), now(), 'r', 1, now() - interval '300 days'); \
             INSERT INTO erasure_log (actor, courier_id, reason, points, redis_live, redis_seq, order_bindings, erased_at) VALUES \
               ('d', 'c2', 'r', 1, 0, 0, 0, now() - interval '366 days'), \
               ('d', 'c3', 'r', 1, 0, 0, 0, now() - interval '1 day')",
        )
        .await
        .unwrap();
    let e = history_writer::audit::expire(&admin, now(), 365)
        .await
        .unwrap();
    assert_eq!((e.trail_access, e.erasure), (1, 1));
    assert_eq!(
        count(&admin, "SELECT count(*) FROM trail_access_log").await,
        1
    );
    let left: String = admin
        .query_one("SELECT courier_id FROM erasure_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, "c3");
    s.drop().await;
}

/// `token privacy` mints a privacy token (privacy.key), which the trail door refuses.
#[test]
fn token_privacy_mints_a_privacy_token() {
    let t = cli_token(&["privacy", "--actor", "dpo", "--ttl", "10m"]);
    let c = test_verifier(Audience::Privacy)
        .verify(&t, now() as u64)
        .unwrap();
    assert_eq!((c.aud, c.sub.as_str()), (Audience::Privacy, "dpo"));
    assert!(c.exp <= now() as u64 + 600);
    assert!(test_verifier(Audience::Trail)
        .verify(&t, now() as u64)
        .is_err());
}
