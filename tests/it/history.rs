//! The history path against real PostgreSQL (each test in a fresh schema of its own, through
//! the connection's search_path; the outage test on a throwaway cluster it starts and stops),
//! real Redis and a real broker over real sockets.

use crate::support;

use courier_auth::{Audience, Claims};
use courier_wire::{loc_topic, Keys, Validation};
use history_writer::partitions::{self, day_of};
use history_writer::rows::Row;
use history_writer::sink::PgSink;
use history_writer::{DropReason, HistoryConfig, HistoryWriter, Stats, Trail};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio_util::sync::CancellationToken;

/// 2026-11-30 00:00:00Z
const NOV30: f64 = 1_795_996_800.0;
const DAY: f64 = 86_400.0;

fn now() -> f64 {
    courier_wire::clock::unix_now()
}

fn row(courier: &str, seq: i64, phone_ts: f64, received_at: f64, order: Option<&str>) -> Row {
    Row {
        courier_id: courier.into(),
        seq,
        phone_ts,
        received_at,
        order_id: order.map(Into::into),
        lat: 24.6 + seq as f64 * 0.001,
        lon: 46.6 + seq as f64 * 0.002,
    }
}

async fn migrated(url: &str) -> tokio_postgres::Client {
    let mut c = pg_connect(url).await;
    history_writer::migrate(&mut c).await.unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_even_twice_in_a_row_and_concurrently() {
    let s = pg_schema().await;
    let mut c = pg_connect(&s.url).await;
    let all: Vec<i32> = history_writer::migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(history_writer::migrate(&mut c).await.unwrap(), all);
    assert_eq!(
        history_writer::migrate(&mut c).await.unwrap(),
        Vec::<i32>::new(),
        "second run applies nothing"
    );
    let n: i64 = c
        .query_one("SELECT count(*) FROM schema_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, all.len() as i64);
    s.drop().await;

    // Two writers starting together on an empty schema: one applies, the other waits and
    // finds everything applied.
    let s = pg_schema().await;
    let (mut a, mut b) = (pg_connect(&s.url).await, pg_connect(&s.url).await);
    let (ra, rb) = tokio::join!(
        history_writer::migrate(&mut a),
        history_writer::migrate(&mut b)
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let mut applied = [ra.clone(), rb.clone()].concat();
    applied.sort();
    assert_eq!(
        applied, all,
        "each migration applied exactly once: {ra:?} {rb:?}"
    );
    let kind: String = a
        .query_one("SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = 'courier_points' AND n.nspname = $1", &[&s.name])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        kind, "p",
        "courier_points is a partitioned table in the test's schema"
    );
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_lands_each_row_in_its_utc_day_and_a_missing_day_is_reported() {
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    let out = partitions::upkeep(&mut admin, NOV30 + 12.0 * 3600.0, 3, 30, false)
        .await
        .unwrap();
    assert_eq!(
        out.created,
        [
            "courier_points_p20261130",
            "courier_points_p20261201",
            "courier_points_p20261202",
            "courier_points_p20261203"
        ]
    );

    let mut sink = PgSink::new(&s.url);
    let last_micro = NOV30 + DAY - 0.000_001;
    let rows = vec![
        row("c1", 1, NOV30 - 5.0, NOV30, Some("o1")), // first instant of Nov 30
        row("c1", 2, NOV30 + 10.0, last_micro, None), // last microsecond of Nov 30
        row("c1", 3, NOV30 + DAY - 2.0, NOV30 + DAY, None), // first instant of Dec 1
        row("c1", 4, NOV30 + 1.5 * DAY, NOV30 + 1.5 * DAY, Some("o2")),
    ];
    sink.copy(&rows).await.unwrap();
    let got = admin
        .query(
            "SELECT seq, tableoid::regclass::text, extract(epoch FROM received_at)::float8, extract(epoch FROM phone_ts)::float8, order_id, lat, lon \
             FROM courier_points ORDER BY seq",
            &[],
        )
        .await
        .unwrap();
    let parts: Vec<(i64, String)> = got.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        parts,
        [
            (1, "courier_points_p20261130".to_string()),
            (2, "courier_points_p20261130".to_string()),
            (3, "courier_points_p20261201".to_string()),
            (4, "courier_points_p20261201".to_string()),
        ]
    );
    for (r, want) in got.iter().zip(&rows) {
        assert!((r.get::<_, f64>(2) - want.received_at).abs() < 1e-6);
        assert!((r.get::<_, f64>(3) - want.phone_ts).abs() < 1e-6);
        assert_eq!(
            r.get::<_, Option<String>>(4).as_deref(),
            want.order_id.as_deref()
        );
        assert_eq!(
            (r.get::<_, f64>(5), r.get::<_, f64>(6)),
            (want.lat, want.lon)
        );
    }

    // A day without a partition refuses the whole COPY (nothing of it is written), and the
    // error says so precisely; creating the day's partition mends it.
    let far = NOV30 + 10.0 * DAY;
    let e = sink
        .copy(&[
            row("c1", 5, far, NOV30 + DAY, None),
            row("c1", 6, far, far, None),
        ])
        .await
        .unwrap_err();
    assert!(e.is_no_partition(), "{e}");
    assert!(
        !e.to_string().contains("24.6"),
        "no coordinates in errors: {e}"
    );
    let n: i64 = admin
        .query_one("SELECT count(*) FROM courier_points", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 4);
    let created = partitions::ensure_days(&mut admin, &[day_of(far)])
        .await
        .unwrap();
    assert_eq!(created, ["courier_points_p20261210"]);
    sink.copy(&[
        row("c1", 5, far, NOV30 + DAY, None),
        row("c1", 6, far, far, None),
    ])
    .await
    .unwrap();
    let n: i64 = admin
        .query_one("SELECT count(*) FROM courier_points", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 6);
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upkeep_creates_ahead_and_drops_whole_days_past_retention() {
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    let nov1 = NOV30 - 29.0 * DAY;
    let out = partitions::upkeep(&mut admin, nov1 + 3600.0, 3, 30, false)
        .await
        .unwrap();
    assert_eq!(out.created.len(), 4);
    assert!(out.dropped.is_empty());
    let mut sink = PgSink::new(&s.url);
    sink.copy(&[
        row("c1", 1, nov1, nov1 + 60.0, None),
        row("c1", 2, nov1 + DAY, nov1 + DAY + 60.0, None),
    ])
    .await
    .unwrap();

    // Days later, with the clock moved: the days ahead appear, nothing is young enough to go.
    let out = partitions::upkeep(&mut admin, NOV30, 3, 30, false)
        .await
        .unwrap();
    assert_eq!(
        out.created.first().map(String::as_str),
        Some("courier_points_p20261130")
    );
    assert_eq!(out.created.len(), 4);
    assert!(out.dropped.is_empty());
    // Nov 1 ended Nov 2 00:00; 30 days later is Dec 2 00:00. A second before: kept.
    let dec2 = NOV30 + 2.0 * DAY;
    let out = partitions::upkeep(&mut admin, dec2 - 1.0, 3, 30, false)
        .await
        .unwrap();
    assert!(out.dropped.is_empty(), "{out:?}");
    // Two writers doing upkeep at the same moment: one drops, neither fails.
    let mut other = pg_connect(&s.url).await;
    let (a, b) = tokio::join!(
        partitions::upkeep(&mut admin, dec2, 3, 30, false),
        partitions::upkeep(&mut other, dec2, 3, 30, false)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let dropped = [a.dropped.clone(), b.dropped.clone()].concat();
    assert_eq!(dropped, ["courier_points_p20261101"], "{a:?} {b:?}");
    let have = partitions::existing(&admin).await.unwrap();
    assert!(!have.contains(&"courier_points_p20261101".to_string()));
    assert!(have.contains(&"courier_points_p20261102".to_string()));
    assert!(
        have.contains(&"courier_points_p20261205".to_string()),
        "{have:?}"
    );
    // The rows of the dropped day are gone with it; the next day's stay.
    let seqs: Vec<i64> = admin
        .query("SELECT seq FROM courier_points", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(seqs, [2]);
    s.drop().await;
}

/// `history.partition_upkeep = false` (pg_partman or an operator keeps the partitions): the
/// running writer neither creates days ahead nor drops a day past retention, and a point of a
/// day without a partition still gets one (created for its batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_partition_upkeep_off_the_writer_creates_only_the_days_its_rows_need() {
    let broker = start_broker(BrokerKind::Embedded);
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    // A day well past a 30-day retention, as an operator's tool would have left it.
    let old = now() - 60.0 * DAY;
    partitions::upkeep(&mut admin, old, 0, 30, false)
        .await
        .unwrap();
    let before = partitions::existing(&admin).await.unwrap();
    assert_eq!(before, [partitions::name(day_of(old))]);
    let config = HistoryConfig {
        partition_upkeep: false,
        retention_days: 30,
        upkeep_every: Duration::from_millis(300),
        ..writer_config()
    };
    let w = writer_now(&broker, &s.url, config).await;
    let (pubc, _h) = client(&broker.endpoint, None).await;
    publish_points(&pubc, "pu1", 1..=1, 1.0).await;
    let st = w.stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || st.written.load(Relaxed) == 1).await,
        "the point was not written"
    );
    // A negative: several upkeep periods pass and must change nothing more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut after = partitions::existing(&admin).await.unwrap();
    after.sort();
    let today = partitions::name(day_of(now()));
    assert_eq!(
        after,
        [before[0].clone(), today],
        "upkeep ran although it is off"
    );
    w.stop().await;
    s.drop().await;
}

fn writer_config() -> HistoryConfig {
    HistoryConfig {
        batch_max_age: Duration::from_millis(100),
        order_refresh: Duration::from_millis(200),
        ..Default::default()
    }
}

/// A writer with a key prefix of its own and the system clock, the usual test setup.
async fn writer_now(broker: &TestBroker, url: &str, config: HistoryConfig) -> RunningWriter {
    let clock = history_writer::system_clock();
    start_writer(broker, url, Keys::with_prefix(&prefix()), config, clock).await
}

/// A phone's points `seqs` of `courier` at one place, each sent `age` seconds old.
async fn publish_points(
    pubc: &rumqttc::AsyncClient,
    courier: &str,
    seqs: std::ops::RangeInclusive<u64>,
    age: f64,
) {
    for seq in seqs {
        let payload = point(courier, 24.7, 46.6, now() - age, seq);
        publish(pubc, &loc_topic(courier), payload).await;
    }
}

struct RunningWriter {
    stats: Arc<Stats>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), history_writer::HistoryError>>,
}

impl RunningWriter {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("writer did not stop")
            .unwrap()
            .unwrap();
    }
}

async fn start_writer(
    broker: &TestBroker,
    url: &str,
    keys: Keys,
    config: HistoryConfig,
    clock: history_writer::Clock,
) -> RunningWriter {
    let stats = Arc::new(Stats::default());
    let shutdown = CancellationToken::new();
    let clients = config.mqtt_clients as u64;
    let w = HistoryWriter {
        config,
        mqtt: broker.endpoint.clone(),
        database_url: url.to_string(),
        redis: services().redis(),
        keys,
        validation: Validation::default(),
        stats: stats.clone(),
        clock,
    };
    let task = tokio::spawn(w.run(shutdown.clone()));
    let st = stats.clone();
    assert!(
        wait_until(Duration::from_secs(15), || st
            .subscriptions_acked
            .load(Relaxed)
            >= clients)
        .await,
        "history writer did not subscribe"
    );
    RunningWriter {
        stats,
        shutdown,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_broker_to_rows_in_postgres() {
    let broker = start_broker(BrokerKind::Embedded);
    let s = pg_schema().await;
    let keys = Keys::with_prefix(&prefix());
    let mut r = redis().await;
    // h2 carries two orders at once (stacked deliveries).
    let _: () = redis::cmd("HSET")
        .arg(&keys.order)
        .arg("h1")
        .arg("ord-1")
        .arg("h2")
        .arg("ord-2,ord-3")
        .query_async(&mut r)
        .await
        .unwrap();
    // A clock stuck in 2020: upkeep makes only 2020's partitions, so today's rows find no
    // partition and the writer must create it on demand rather than lose the batch.
    let clock: history_writer::Clock = Arc::new(|| 1_577_880_000.0);
    let w = start_writer(&broker, &s.url, keys.clone(), writer_config(), clock).await;
    tokio::time::sleep(Duration::from_millis(600)).await; // the order snapshot is read
    let (pubc, _h) = client(&broker.endpoint, None).await;
    let t0 = now() - 60.0;
    // Out of order on purpose: history keeps older points too.
    for seq in [3u64, 1, 2, 5, 4] {
        for c in ["h1", "h2"] {
            publish(
                &pubc,
                &loc_topic(c),
                point(c, 24.7 + seq as f64 * 1e-3, 46.6, t0 + seq as f64, seq),
            )
            .await;
        }
    }
    // A duplicate delivery (the same message twice) is stored twice; the trail read shows it once.
    publish(
        &pubc,
        &loc_topic("h1"),
        point("h1", 24.7 + 3e-3, 46.6, t0 + 3.0, 3),
    )
    .await;
    publish(&pubc, &loc_topic("h1"), b"not json".to_vec()).await;
    publish(&pubc, &loc_topic("h1"), point("h2", 24.7, 46.6, t0, 9)).await; // id mismatch
    publish(&pubc, &loc_topic("h1"), point("h1", 0.0, 0.0, t0, 9)).await; // null island

    let st = w.stats.clone();
    assert!(
        wait_until(Duration::from_secs(20), || st.written.load(Relaxed) >= 11
            && st.invalid.load(Relaxed) >= 3)
        .await,
        "written {} invalid {}",
        st.written.load(Relaxed),
        st.invalid.load(Relaxed)
    );
    assert!(
        st.partitions_created.load(Relaxed) >= 5,
        "4 of 2020 at start, today's on demand"
    );
    assert_eq!(
        st.invalid_for(history_writer::rows::Refused::Invalid(
            courier_wire::Invalid::NotJson
        )),
        1
    );
    assert_eq!(
        st.invalid_for(history_writer::rows::Refused::Invalid(
            courier_wire::Invalid::IdMismatch
        )),
        1
    );
    assert_eq!(
        st.invalid_for(history_writer::rows::Refused::Invalid(
            courier_wire::Invalid::NullIsland
        )),
        1
    );
    assert_eq!(st.dropped_total(), 0);
    let db = pg_connect(&s.url).await;
    let rows = db
        .query("SELECT courier_id, seq, order_id, tableoid::regclass::text FROM courier_points ORDER BY courier_id, seq", &[])
        .await
        .unwrap();
    let mut got: Vec<(String, i64, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let h1_seq3 = got.iter().filter(|(c, s, _)| c == "h1" && *s == 3).count();
    assert!(
        h1_seq3 >= 2,
        "the duplicate is kept in the table: {h1_seq3}"
    );
    got.dedup(); // rumqttd may deliver a message twice; the trail read removes those
    let want: Vec<(String, i64, Option<String>)> = ["h1", "h2"]
        .iter()
        .flat_map(|c| {
            let first = if *c == "h1" { "ord-1" } else { "ord-2" };
            (1..=5).map(move |s| (c.to_string(), s, Some(first.to_string())))
        })
        .collect();
    assert_eq!(got, want);
    // Every order running is kept, oldest first; order_id is the first of them.
    let stacked: Vec<(String, Vec<String>)> = db
        .query(
            "SELECT DISTINCT courier_id, order_ids FROM courier_points ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        stacked,
        [
            ("h1".to_string(), vec!["ord-1".to_string()]),
            (
                "h2".to_string(),
                vec!["ord-2".to_string(), "ord-3".to_string()]
            )
        ]
    );
    let today = partitions::name(day_of(now()));
    assert!(rows.iter().all(|r| r.get::<_, String>(3) == today));
    w.stop().await;
    let _: () = redis::cmd("DEL")
        .arg(&keys.order)
        .query_async(&mut r)
        .await
        .unwrap();
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_and_back_every_row_is_written_or_counted_as_dropped() {
    let broker = start_broker(BrokerKind::Embedded);
    let pg = TempPostgres::start();
    let keys = Keys::with_prefix(&prefix());
    let config = HistoryConfig {
        buffer_rows: 1_500,
        batch_max: 200,
        retry_max_backoff: Duration::from_millis(300),
        flush_deadline: Duration::from_secs(1),
        ..writer_config()
    };
    let w = start_writer(
        &broker,
        &pg.url,
        keys,
        config,
        history_writer::system_clock(),
    )
    .await;
    let (pubc, _h) = client(&broker.endpoint, None).await;
    let t0 = now() - 100.0;
    let mut seq = 0u64;
    let mut send = |n: usize| {
        let from = seq;
        seq += n as u64;
        (from + 1..=seq).collect::<Vec<u64>>()
    };
    let st = w.stats.clone();

    // Up: written.
    for s in send(500) {
        publish(
            &pubc,
            &loc_topic("p1"),
            point("p1", 24.7, 46.6, t0 + s as f64 * 0.01, s),
        )
        .await;
    }
    assert!(
        wait_until(Duration::from_secs(15), || st.written.load(Relaxed) >= 500).await,
        "written {}",
        st.written.load(Relaxed)
    );

    // Down: 2,500 more points into a buffer of 1,500. The oldest 1,000 must be dropped and
    // counted, and memory stays bounded.
    pg.stop();
    for s in send(2_500) {
        publish(
            &pubc,
            &loc_topic("p1"),
            point("p1", 24.7, 46.6, t0 + s as f64 * 0.01, s),
        )
        .await;
        if s % 500 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(
        wait_until(Duration::from_secs(15), || st.received.load(Relaxed)
            >= 3_000)
        .await,
        "received {}",
        st.received.load(Relaxed)
    );
    assert!(
        wait_until(Duration::from_secs(10), || st.copy_failures.load(Relaxed)
            >= 1)
        .await,
        "the writer did not notice the outage"
    );
    assert!(st.buffer_depth.load(Relaxed) <= 1_500);

    // Back: the buffer drains by itself.
    pg.start_again();
    let received = st.received.load(Relaxed);
    assert!(
        wait_until(Duration::from_secs(30), || st.written.load(Relaxed)
            + st.dropped_total()
            >= received)
        .await,
        "written {} dropped {} of {received}",
        st.written.load(Relaxed),
        st.dropped_total()
    );
    let written = st.written.load(Relaxed);
    let dropped = st.dropped(DropReason::BufferFull);
    eprintln!(
        "outage: received {received}, written {written}, dropped {dropped} (buffer_full), copy failures {}",
        st.copy_failures.load(Relaxed)
    );
    assert_eq!(
        written + st.dropped_total(),
        received,
        "every row is written or counted"
    );
    assert!(dropped >= 1_000, "the bound held: {dropped} dropped");
    let db = pg_connect(&pg.url).await;
    let (count, distinct, max_seq): (i64, i64, i64) = {
        let r = db
            .query_one(
                "SELECT count(*), count(DISTINCT seq), max(seq) FROM courier_points",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        count as u64, written,
        "what was counted as written is in the table"
    );
    assert_eq!(max_seq, 3_000, "the newest rows were kept");
    assert!(
        distinct as u64 + dropped >= 3_000,
        "none vanished: {distinct} in the table, {dropped} dropped"
    );
    // What was dropped is the oldest of the outage: the table has a gap, then everything newer.
    let first_after_gap: i64 = db
        .query_one("SELECT min(seq) FROM courier_points WHERE seq > 500", &[])
        .await
        .unwrap()
        .get(0);
    let after: i64 = db
        .query_one(
            "SELECT count(DISTINCT seq) FROM courier_points WHERE seq >= $1",
            &[&first_after_gap],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        after,
        3_000 - first_after_gap + 1,
        "no hole after the dropped oldest rows"
    );

    // Down again at shutdown: the flush gives up at its deadline and counts what it could not write.
    pg.stop();
    for s in send(100) {
        publish(
            &pubc,
            &loc_topic("p1"),
            point("p1", 24.7, 46.6, t0 + s as f64 * 0.01, s),
        )
        .await;
    }
    let target = st.received.load(Relaxed) + 100;
    assert!(
        wait_until(Duration::from_secs(10), || st.received.load(Relaxed)
            >= target)
        .await
    );
    let t = std::time::Instant::now();
    w.stop().await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "flush_deadline (1s) bounds the shutdown: {:?}",
        t.elapsed()
    );
    assert!(
        st.dropped(DropReason::Shutdown) >= 100,
        "counted as dropped at shutdown: {}",
        st.dropped(DropReason::Shutdown)
    );
    assert_eq!(
        st.written.load(Relaxed) + st.dropped_total(),
        st.received.load(Relaxed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_the_buffer() {
    let broker = start_broker(BrokerKind::Embedded);
    let s = pg_schema().await;
    // Batches wait up to a second: at shutdown the points are still buffered.
    let config = HistoryConfig {
        batch_max_age: Duration::from_secs(1),
        ..writer_config()
    };
    let w = writer_now(&broker, &s.url, config).await;
    let (pubc, _h) = client(&broker.endpoint, None).await;
    publish_points(&pubc, "f1", 1..=50, 5.0).await;
    let st = w.stats.clone();
    assert!(wait_until(Duration::from_secs(10), || st.received.load(Relaxed) >= 50).await);
    w.stop().await;
    assert_eq!(
        st.written.load(Relaxed) + st.dropped_total(),
        st.received.load(Relaxed)
    );
    assert_eq!(st.dropped_total(), 0);
    let n: i64 = pg_connect(&s.url)
        .await
        .query_one("SELECT count(DISTINCT seq) FROM courier_points", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 50);
    s.drop().await;
}

/// A token of `aud` for alice, expiring `exp_in` seconds from now, signed with the test key.
fn token(aud: Audience, exp_in: i64) -> String {
    let now = now() as i64;
    sign(&Claims {
        aud,
        exp: (now + exp_in).max(0) as u64,
        ..Claims::trail("alice", now as u64, 0)
    })
}

async fn serve_trail(url: &str) -> std::net::SocketAddr {
    serve_trail_with(url, &HistoryConfig::default()).await
}

async fn serve_trail_with(url: &str, config: &HistoryConfig) -> std::net::SocketAddr {
    let keys = test_verifier(Audience::Trail);
    let app = Trail::new(url, keys, config, history_writer::system_clock())
        .unwrap()
        .router();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

fn rfc(t: f64) -> String {
    humantime::format_rfc3339_seconds(history_writer::rows::system_time(t)).to_string()
}

/// A window with more points than `trail_max_points` gets 413 and nothing else: no points, no
/// audit row (four such requests at once must not hold whole days in memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trail_with_too_many_points_is_refused_not_loaded() {
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    let t = now();
    partitions::upkeep(&mut admin, t, 1, 30, false)
        .await
        .unwrap();
    // Whole seconds: the query's times are written to the second (`rfc`).
    let base = (t - 600.0).floor();
    let rows: Vec<_> = (1..=6)
        .map(|i| row("k1", i, base + i as f64, base + i as f64 + 0.5, None))
        .collect();
    PgSink::new(&s.url).copy(&rows).await.unwrap();
    let config = HistoryConfig {
        trail_max_points: 5,
        ..HistoryConfig::default()
    };
    let addr = serve_trail_with(&s.url, &config).await;
    let good = token(Audience::Trail, 3600);
    let q = |to: f64| {
        format!(
            "/couriers/k1/trail?from={}&to={}&reason=dispute",
            rfc(base),
            rfc(to)
        )
    };
    let r = http_get(addr, &q(base + 3600.0), Some(&good)).await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("more than 5 points"));
    let audited: i64 = admin
        .query_one("SELECT count(*) FROM trail_access_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(audited, 0, "a refused read left an audit row");
    // Five points fit (received at base + 1.5 ... base + 5.5).
    let r = http_get(addr, &q(base + 6.0), Some(&good)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["properties"]["count"], 5);
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trail_needs_a_trail_token_and_reason_is_audited_and_is_geojson() {
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    let t = now();
    partitions::upkeep(&mut admin, t, 1, 30, false)
        .await
        .unwrap();
    partitions::ensure_days(&mut admin, &[day_of(t) - 1])
        .await
        .unwrap();
    let base = t - 600.0;
    let mut sink = PgSink::new(&s.url);
    sink.copy(&[
        row("k1", 3, base + 30.0, base + 31.0, Some("o1")),
        row("k1", 1, base + 10.0, base + 40.0, None), // arrived late: phone-time order puts it first
        row("k1", 2, base + 20.0, base + 21.0, Some("o1")),
        row("k1", 2, base + 20.0, base + 22.0, Some("o1")), // delivered twice
        row("k1", 4, base + 40.0, base + 41.0, Some("o1")),
        row("k1", 9, base - 5000.0, base - 4000.0, None), // outside the window
        row("k2", 1, base + 10.0, base + 11.0, None),     // another courier
    ])
    .await
    .unwrap();

    let addr = serve_trail(&s.url).await;
    let good = token(Audience::Trail, 3600);
    let window = format!("from={}&to={}", rfc(base), rfc(base + 3600.0));
    let path = |q: &str| format!("/couriers/k1/trail?{q}");
    let ok_path = path(&format!("{window}&reason=dispute%20%23123"));

    // 401: no token, garbage, a forged one, an expired one, and valid tokens of the other
    // audiences (a customer's tracking token, a courier's device token, a worker's bus token).
    for bearer in [
        None,
        Some("e30.e30.AAAA".to_string()),
        Some(
            courier_auth::SigningKey::generate(Audience::Trail)
                .unwrap()
                .sign(&Claims::trail("x", 0, u64::MAX / 4)),
        ),
        Some(token(Audience::Trail, -10)),
        Some(token(Audience::Viewer, 3600)),
        Some(token(Audience::Courier, 3600)),
        Some(token(Audience::Bus, 3600)),
    ] {
        let r = http_get(addr, &ok_path, bearer.as_deref()).await;
        assert_eq!(r.status, 401, "{}", r.body);
        // One answer for every failure: the body says nothing of why (expired, forged, ...).
        assert_eq!(
            r.json()["error"],
            "a valid bearer token is required",
            "{}",
            r.body
        );
        assert!(r
            .head
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"));
    }
    // 400: no reason, a blank reason, bad times, a window past 24 h, to before from, a bad id.
    for p in [
        path(&window),
        path(&format!("{window}&reason=%20%20")),
        path(&format!("from=yesterday&to={}&reason=x", rfc(base))),
        path(&format!("from={}&reason=x", rfc(base))),
        path(&format!(
            "from={}&to={}&reason=x",
            rfc(base),
            rfc(base + 86_401.0)
        )),
        path(&format!(
            "from={}&to={}&reason=x",
            rfc(base + 10.0),
            rfc(base)
        )),
        format!("/couriers/a%2Bb/trail?{window}&reason=x"),
    ] {
        let r = http_get(addr, &p, Some(&good)).await;
        assert_eq!(r.status, 400, "{p}: {}", r.body);
        assert!(r.json()["error"].is_string(), "{p}");
    }
    let n: i64 = admin
        .query_one("SELECT count(*) FROM trail_access_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "refused requests read nothing and leave no audit row");

    // 200: a GeoJSON Feature in phone-time order, each point once.
    let r = http_get(addr, &ok_path, Some(&good)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let f = r.json();
    assert_eq!(f["type"], "Feature");
    assert_eq!(f["geometry"]["type"], "LineString");
    let coords = f["geometry"]["coordinates"].as_array().unwrap();
    let points = f["properties"]["points"].as_array().unwrap();
    assert_eq!(coords.len(), 4);
    assert_eq!(points.len(), 4);
    let seqs: Vec<i64> = points.iter().map(|p| p["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    let r1 = row("k1", 1, 0.0, 0.0, None);
    assert_eq!(coords[0], serde_json::json!([r1.lon, r1.lat]), "[lon, lat]");
    assert_eq!(points[0]["order_id"], serde_json::Value::Null);
    assert_eq!(points[1]["order_id"], "o1");
    assert_eq!(
        points[0]["phone_ts"],
        humantime::format_rfc3339_micros(history_writer::rows::system_time(base + 10.0))
            .to_string()
    );
    assert_eq!(
        points[0]["received_at"],
        humantime::format_rfc3339_micros(history_writer::rows::system_time(base + 40.0))
            .to_string()
    );
    assert_eq!(f["properties"]["courier_id"], "k1");

    // The audit row: who, whose, the window, why, how many.
    let a = admin
        .query_one(
            "SELECT actor, courier_id, reason, row_count, extract(epoch FROM window_from)::float8, extract(epoch FROM window_to)::float8, accessed_at > now() - interval '1 minute' FROM trail_access_log",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(a.get::<_, String>(0), "alice");
    assert_eq!(a.get::<_, String>(1), "k1");
    assert_eq!(a.get::<_, String>(2), "dispute #123");
    assert_eq!(a.get::<_, i32>(3), 4);
    assert_eq!(a.get::<_, f64>(4), base.floor());
    assert_eq!(a.get::<_, f64>(5), (base + 3600.0).floor());
    assert!(a.get::<_, bool>(6));

    // No audit row, no data: when the audit insert fails, nothing is returned.
    admin
        .batch_execute("DROP TABLE trail_access_log")
        .await
        .unwrap();
    let r = http_get(addr, &ok_path, Some(&good)).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        !r.body.contains("coordinates") && !r.body.contains("46."),
        "{}",
        r.body
    );
    s.drop().await;
}

#[test]
fn token_trail_mints_a_trail_token_and_needs_trail_key() {
    let bin = env!("CARGO_BIN_EXE_courier-pipeline");
    // `support` is the old name of the command, kept as an alias.
    let token = cli_token(&["support", "--actor", "alice", "--ttl", "1h"]);
    let claims = test_verifier(Audience::Trail)
        .verify(token.trim(), now() as u64)
        .unwrap();
    assert_eq!(claims.sub, "alice");
    assert_eq!(claims.aud, Audience::Trail);
    assert!(
        (claims.exp as i64 - now() as i64 - 3600).abs() <= 5,
        "expires in an hour"
    );

    let out = std::process::Command::new(bin)
        .args(["token", "trail", "--actor", "alice", "--ttl", "1h"])
        .env_remove("AUTH_KEY_DIR")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("AUTH_KEY_DIR: is not set"));
    // A key directory without trail.key (a verifier's directory) mints nothing.
    let dir = std::env::temp_dir().join(format!("trail-pub-only-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(test_key_dir().join("trail.pub"), dir.join("trail.pub")).unwrap();
    let out = std::process::Command::new(bin)
        .args(["token", "trail", "--actor", "alice"])
        .env("AUTH_KEY_DIR", &dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trail.key is missing"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_postgres_refuses_is_dropped_alone_not_its_batch() {
    let broker = start_broker(BrokerKind::Embedded);
    let s = pg_schema().await;
    let admin = migrated(&s.url).await;
    // A rule the rows cannot know about: PostgreSQL refuses seq 13 (SQLSTATE 23514).
    admin
        .batch_execute("ALTER TABLE courier_points ADD CONSTRAINT no_thirteen CHECK (seq <> 13)")
        .await
        .unwrap();
    let config = HistoryConfig {
        batch_max_age: Duration::from_millis(500),
        ..writer_config()
    };
    let w = writer_now(&broker, &s.url, config).await;
    let (pubc, _h) = client(&broker.endpoint, None).await;
    publish_points(&pubc, "r1", 1..=40, 5.0).await;
    let st = w.stats.clone();
    assert!(
        wait_until(Duration::from_secs(15), || st.written.load(Relaxed)
            + st.dropped_total()
            >= st.received.load(Relaxed)
            && st.received.load(Relaxed) >= 40)
        .await
    );
    assert!(
        st.dropped(DropReason::Rejected) >= 1,
        "the refused row is counted"
    );
    let seqs: Vec<i64> = admin
        .query("SELECT DISTINCT seq FROM courier_points ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        seqs,
        (1..=40).filter(|s| *s != 13).collect::<Vec<i64>>(),
        "its 39 neighbours are written"
    );
    assert_eq!(
        st.written.load(Relaxed) + st.dropped_total(),
        st.received.load(Relaxed)
    );
    w.stop().await;
    s.drop().await;
}

/// What reaches a subscriber while it disconnects (sent before the broker took its unsubscribe)
/// is handed back to its role, which writes or counts it; it used to be polled and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_hands_over_what_arrives_while_it_disconnects() {
    use courier_wire::mqtt::{Polled, Subscriber};
    let broker = start_broker(BrokerKind::Embedded);
    let o = courier_wire::mqtt::options(
        &broker.endpoint,
        &courier_wire::mqtt::client_id("late", 0),
        16,
    );
    let (c, mut el) = rumqttc::AsyncClient::new(o, 16);
    let sub = Subscriber::new("test", c, vec!["couriers/+/loc".into()]);
    let up = courier_wire::health::Up::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        assert!(std::time::Instant::now() < deadline, "no SUBACK");
        if matches!(sub.handle(el.poll().await, &up), Polled::Subscribed) {
            break;
        }
    }
    // 20 points arrive while the role is no longer polling (it is stopping).
    let (pubc, _h) = client(&broker.endpoint, None).await;
    publish_points(&pubc, "late1", 1..=20, 0.0).await;
    // Time for them to reach the client's socket: nothing polls it, so there is no state to
    // watch (polling it is what the test must not do).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = sub.disconnect(&mut el, Duration::from_secs(2)).await;
    assert_eq!(
        late.len(),
        20,
        "messages polled while disconnecting were lost"
    );
}

/// A database that refuses every write for a reason of its own (here read-only, as after a
/// failover: SQLSTATE 25006) costs no row: the batch is kept and retried (it used to be halved
/// down to single rows and every row dropped as `rejected`), and everything is written once the
/// database takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_keeps_the_rows_until_it_takes_writes_again() {
    let broker = start_broker(BrokerKind::Embedded);
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    partitions::upkeep(&mut admin, now(), 1, 30, false)
        .await
        .unwrap();
    // A role of this test only; superuser, so privileges are not the point.
    let role = format!("ro{:012x}", rand::random::<u64>() >> 16);
    admin
        .batch_execute(&format!("CREATE ROLE {role} SUPERUSER LOGIN"))
        .await
        .unwrap();
    let url = s.url.replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(url, s.url, "the test URL names its user");
    let config = HistoryConfig {
        partition_upkeep: false,
        retry_max_backoff: Duration::from_millis(300),
        ..writer_config()
    };
    let w = writer_now(&broker, &url, config).await;
    // The failover: the writer's sessions end, and the new ones are read-only.
    admin
        .batch_execute(&format!(
            "ALTER ROLE {role} SET default_transaction_read_only = on; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
        ))
        .await
        .unwrap();
    let (pubc, _h) = client(&broker.endpoint, None).await;
    publish_points(&pubc, "ro1", 1..=10, 1.0).await;
    let st = w.stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || st.received.load(Relaxed) == 10
            && st.copy_failures.load(Relaxed) >= 3)
        .await,
        "the writer never tried the read-only database"
    );
    assert_eq!(st.written.load(Relaxed), 0);
    assert_eq!(
        st.dropped_total(),
        0,
        "rows dropped for the database's state"
    );
    admin
        .batch_execute(&format!(
            "ALTER ROLE {role} RESET default_transaction_read_only"
        ))
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || st.written.load(Relaxed) == 10).await,
        "rows not written once the database took writes again: {} written, {} dropped",
        st.written.load(Relaxed),
        st.dropped_total()
    );
    assert_eq!(st.dropped_total(), 0);
    w.stop().await;
    let _ = admin.batch_execute(&format!("DROP ROLE {role}")).await;
    s.drop().await;
}

/// The running writer aggregates closed hours on its own timer (the clock injected at 11:15 of
/// a day, so 10:00 is closed and past its delay), and its upkeep holds the partitions past
/// retention until the aggregator has passed them, then drops them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_writer_aggregates_closed_hours_then_drops_old_days() {
    let s = pg_schema().await;
    let mut admin = migrated(&s.url).await;
    let today = day_of(NOV30);
    partitions::ensure_days(&mut admin, &[today - 31, today])
        .await
        .unwrap();
    // Five couriers in one cell (just north of its south edge) during 10:00, a point each 4 s
    // for a minute.
    let hour = NOV30 + 10.0 * 3600.0;
    let cells = history_writer::geohash::CELLS_PER_AXIS as f64;
    let lat0 =
        history_writer::geohash::axis_index(24.7136, 180.0) as f64 * 180.0 / cells - 90.0 + 0.0005;
    let rows: Vec<Row> = (0..5)
        .flat_map(|c| {
            (0..15).map(move |i| Row {
                courier_id: format!("k{c}").into(),
                seq: i + 1,
                phone_ts: hour + 60.0 + 4.0 * i as f64,
                received_at: hour + 60.5 + 4.0 * i as f64,
                order_id: None,
                lat: lat0 + 0.00002 * i as f64,
                lon: 46.6753 + 0.00001 * c as f64,
            })
        })
        .collect();
    PgSink::new(&s.url).copy(&rows).await.unwrap();
    let broker = start_broker(BrokerKind::Embedded);
    let config = HistoryConfig {
        aggregate_every: Duration::from_secs(1),
        upkeep_every: Duration::from_secs(1),
        ..writer_config()
    };
    let at = hour + 3600.0 + 900.0;
    let w = start_writer(
        &broker,
        &s.url,
        Keys::with_prefix(&prefix()),
        config,
        Arc::new(move || at),
    )
    .await;
    let mut done = None;
    for _ in 0..100 {
        let r = admin
            .query_opt(
                "SELECT extract(epoch FROM done_until)::float8 FROM aggregate_watermark",
                &[],
            )
            .await
            .unwrap();
        done = r.map(|r| r.get::<_, f64>(0));
        if done == Some(hour + 3600.0) && partitions::existing(&admin).await.unwrap().len() < 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        done,
        Some(hour + 3600.0),
        "the watermark stops at the open hour"
    );
    let cell: (i32, i32) = {
        let r = admin
            .query_one("SELECT couriers, points FROM courier_aggregates", &[])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(cell, (5, 75));
    let left = partitions::existing(&admin).await.unwrap();
    assert!(
        !left.contains(&partitions::name(today - 31)),
        "dropped once aggregated: {left:?}"
    );
    w.stop().await;
    s.drop().await;
}

/// A writer whose aggregator waits for another writer's lock on the watermark (or works
/// through a long catch-up) still stops at once: the open hour is rolled back, not finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stops_at_once_while_its_aggregator_waits_for_the_watermark() {
    let s = pg_schema().await;
    let mut other = migrated(&s.url).await;
    // Another writer's aggregation: the watermark row locked, the transaction left open.
    other
        .batch_execute(
            "INSERT INTO aggregate_watermark (done_until) VALUES (now() - interval '2 days') ON CONFLICT DO NOTHING",
        )
        .await
        .unwrap();
    let tx = other.transaction().await.unwrap();
    tx.batch_execute("SELECT done_until FROM aggregate_watermark FOR UPDATE")
        .await
        .unwrap();
    let holder: i32 = tx
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let broker = start_broker(BrokerKind::Embedded);
    let config = HistoryConfig {
        aggregate_every: Duration::from_millis(100),
        ..writer_config()
    };
    let w = writer_now(&broker, &s.url, config).await;
    // Once the aggregator waits on the lock (lock_timeout is 10 s), a backend is blocked by
    // the holder's.
    let watch = pg_connect(&s.url).await;
    let waiting = wait_until_async(Duration::from_secs(8), || {
        let watch = &watch;
        async move {
            let n: i64 = watch
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    &[&holder],
                )
                .await
                .unwrap()
                .get(0);
            n > 0
        }
    })
    .await;
    assert!(
        waiting,
        "the aggregator never waited for the watermark lock"
    );
    let t = std::time::Instant::now();
    w.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), w.task)
        .await
        .expect("the writer waited for the watermark lock instead of stopping")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    tx.rollback().await.unwrap();
    s.drop().await;
}
