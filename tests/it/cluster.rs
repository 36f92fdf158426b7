//! Two cities on one Redis Cluster (3 primaries + 3 replicas, started for this test by `./dev
//! cluster up`): each a `courier-pipeline run` with its own key prefix (`{riyadh}:`,
//! `{jeddah}:`), bus, edge and history schema, both on the same cluster through
//! `REDIS_CLUSTER_NODES`. Ingest, fanout, dispatch and history work in each, with the same
//! courier and order ids in both and nothing of one city seen by the other; every key of a
//! city is in its one slot; and the scripts survive a SCRIPT FLUSH (NOSCRIPT, as on a node
//! that restarted empty).

use crate::common;
use crate::support;

use common::Proc;
use courier_wire::{Keys, MqttEndpoint};
use rumqttc::QoS;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");

/// One city's deployment: a `run` process on the shared cluster.
struct City {
    prefix: &'static str,
    at: (f64, f64),
    keys: Keys,
    edge: SocketAddr,
    metrics: SocketAddr,
    http: SocketAddr,
    ws: SocketAddr,
    schema: PgSchema,
    dir: std::path::PathBuf,
    run: Proc,
}

impl City {
    async fn start(cluster: &TestCluster, prefix: &'static str, at: (f64, f64)) -> City {
        let dir = std::env::temp_dir().join(format!("city-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("run.toml");
        std::fs::write(
            &conf,
            format!(
                "[redis]\nkey_prefix = \"{prefix}\"\n[history]\nbatch_max_age = \"100ms\"\norder_refresh = \"200ms\"\n"
            ),
        )
        .unwrap();
        let schema = pg_schema().await;
        // The bus is rumqttd, which cannot report a port 0: chosen here; `run` binds the rest on
        // port 0 and reports them.
        let bus = free_addr();
        let mut cmd = Command::new(BIN);
        with_test_keys(&mut cmd)
            .args(["--config", conf.to_str().unwrap(), "run"])
            .env_remove("MQTT_URL")
            .env("MQTT_LISTEN", bus.to_string())
            .env("EDGE_LISTEN", "127.0.0.1:0")
            .env("METRICS_LISTEN", "127.0.0.1:0")
            .env("HTTP_LISTEN", "127.0.0.1:0")
            .env("WS_LISTEN", "127.0.0.1:0")
            // Not used beside the cluster's nodes: pointed at nothing to show it.
            .env("REDIS_URL", "redis://127.0.0.1:1/")
            .env("REDIS_CLUSTER_NODES", cluster.nodes.join(","))
            .env("DATABASE_URL", &schema.url)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let report = ListenReport::on(&mut cmd);
        let mut run = Proc {
            name: "run",
            child: cmd.spawn().unwrap(),
        };
        let bound = report.wait(&mut run.child, "run");
        let (edge, metrics, http, ws) = (
            bound.get("edge.tcp"),
            bound.get("metrics"),
            bound.get("http"),
            bound.get("ws"),
        );
        let ready = wait_until_async(Duration::from_secs(30), || async move {
            http_get(metrics, "/readyz", None).await.status == 200
        })
        .await;
        assert!(ready, "{prefix}: run never got ready on the cluster");
        City {
            prefix,
            at,
            keys: Keys::with_prefix(prefix),
            edge,
            metrics,
            http,
            ws,
            schema,
            dir,
            run,
        }
    }

    async fn api(&self, path: &str, body: &str) -> HttpAnswer {
        http_post(
            self.http,
            path,
            &[("Authorization", &format!("Bearer {TEST_SERVICE_KEY}"))],
            body,
        )
        .await
    }

    /// `courier`'s phone at this city's edge.
    async fn phone(&self, courier: &str) -> rumqttc::AsyncClient {
        let now = courier_wire::clock::unix_now() as u64;
        let login = MqttEndpoint {
            username: Some(courier.into()),
            password: Some(sign(&courier_auth::Claims::courier(courier, now, 600))),
            ..MqttEndpoint::new("127.0.0.1", self.edge.port())
        };
        client(&login, None).await.0
    }

    /// (rows, rows of `order`, min lat, max lat) of this city's history.
    async fn history(&self, order: &str) -> (i64, i64, Option<f64>, Option<f64>) {
        let row = pg_connect(&self.schema.url)
            .await
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE order_id = $1), min(lat), max(lat) FROM courier_points",
                &[&order],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3))
    }
}

/// Sends points of `courier` at `at` until `viewer` receives one of `order` and history has a
/// row of that order; returns the track payload seen.
async fn send_until_tracked(
    city: &City,
    phone: &rumqttc::AsyncClient,
    courier: &str,
    order: &str,
    seq: &mut u64,
    viewer: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut track: Option<serde_json::Value> = None;
    loop {
        *seq += 1;
        let (lat, lon) = (city.at.0 + *seq as f64 * 1e-5, city.at.1);
        publish(
            phone,
            &courier_wire::loc_topic(courier),
            point(courier, lat, lon, courier_wire::clock::unix_now(), *seq),
        )
        .await;
        while let Some(seen) = next_seen(viewer, Duration::from_millis(200)).await {
            if let Seen::Point { topic, payload } = seen {
                assert_eq!(topic, format!("track/{order}"));
                track = Some(serde_json::from_slice(&payload).unwrap());
            }
        }
        if let Some(t) = &track {
            if city.history(order).await.1 > 0 {
                return t.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{}: no track reached the viewer, or no history row of {order}, within 20 s (track {track:?})",
            city.prefix
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cities_on_one_cluster_each_work_in_their_own_slot_and_see_nothing_of_the_other() {
    let cluster = TestCluster::start();
    let riyadh = City::start(&cluster, "{riyadh}:", (24.7136, 46.6753)).await;
    let jeddah = City::start(&cluster, "{jeddah}:", (21.5433, 39.1728)).await;
    let cities = [&riyadh, &jeddah];

    // The same courier and order ids in both cities: each city's orders API, gateway, ingest
    // and history keep to their own.
    let mut phones = Vec::new();
    let mut seqs = [0u64; 2];
    for (i, c) in cities.iter().enumerate() {
        let a = c.api("/orders/o1/assign", r#"{"courier_id":"k1"}"#).await;
        assert_eq!(a.status, 200, "{}: {a:?}", c.prefix);
        let t = c
            .api("/orders/o1/tracking-token", r#"{"viewer":"customer"}"#)
            .await;
        assert_eq!(t.status, 200, "{}: {t:?}", c.prefix);
        let token = t.body["token"].as_str().unwrap().to_string();
        let (viewer, mut rx) = viewer_v4(c.ws, &token).await;
        assert_eq!(
            next_seen(&mut rx, Duration::from_secs(5)).await,
            Some(Seen::Connected)
        );
        viewer.subscribe("track/o1", QoS::AtMostOnce).await.unwrap();
        assert_eq!(
            next_seen(&mut rx, Duration::from_secs(5)).await,
            Some(Seen::SubAck(vec![true]))
        );
        let phone = c.phone("k1").await;
        let track = send_until_tracked(c, &phone, "k1", "o1", &mut seqs[i], &mut rx).await;
        let lat = track["lat"].as_f64().unwrap();
        assert!(
            (lat - c.at.0).abs() < 0.01,
            "{}: the customer saw {lat}, not this city's courier",
            c.prefix
        );
        phones.push((phone, viewer, rx));
    }

    // Dispatch per city: k1 near its own city, nobody near the other city in its index.
    for (c, other) in [(&riyadh, &jeddah), (&jeddah, &riyadh)] {
        let d = dispatch::Dispatch::connect(&cluster.target(), c.keys.clone())
            .await
            .unwrap();
        let now = courier_wire::clock::unix_now();
        let here = d
            .nearest(&dispatch::Query::at(c.at.0, c.at.1), now)
            .await
            .unwrap();
        assert_eq!(
            here.couriers
                .iter()
                .map(|f| f.id.as_str())
                .collect::<Vec<_>>(),
            ["k1"],
            "{}",
            c.prefix
        );
        let there = d
            .nearest(&dispatch::Query::at(other.at.0, other.at.1), now)
            .await
            .unwrap();
        assert!(there.couriers.is_empty(), "{}: {there:?}", c.prefix);
        // History: every row of this city is at this city, with its order.
        let (rows, of_order, min, max) = c.history("o1").await;
        assert!(rows > 0 && of_order > 0, "{}: {rows} rows", c.prefix);
        for lat in [min.unwrap(), max.unwrap()] {
            assert!((lat - c.at.0).abs() < 0.01, "{}: a row at {lat}", c.prefix);
        }
    }

    // Every key in the cluster belongs to one city; each city's keys sit in its one slot, on
    // one primary, and that slot holds nothing else.
    let keys = cluster.keys_by_node().await;
    let mut slots = Vec::new();
    for c in cities {
        let slot = cluster.slot(c.prefix).await;
        let mine: Vec<&(u16, String)> = keys
            .iter()
            .filter(|(_, k)| k.starts_with(c.prefix))
            .collect();
        for key in [
            &c.keys.live,
            &c.keys.seen,
            &c.keys.seq,
            &c.keys.order,
            &c.keys.order_courier,
        ] {
            assert!(
                mine.iter().any(|(_, k)| k == key),
                "{key} is not in the cluster: {mine:?}"
            );
        }
        for (port, k) in &mine {
            assert_eq!(
                cluster.slot(k).await,
                slot,
                "{k} is not in {}'s slot",
                c.prefix
            );
            assert_eq!(*port, mine[0].0, "{k} is on another node");
        }
        let in_slot: usize = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query_async(&mut cluster.node(mine[0].0).await)
            .await
            .unwrap();
        assert_eq!(
            in_slot,
            mine.len(),
            "{}: slot {slot} holds other keys",
            c.prefix
        );
        println!(
            "cluster: {} has {} keys, all in slot {slot} on 127.0.0.1:{}",
            c.prefix,
            mine.len(),
            mine[0].0
        );
        slots.push(slot);
    }
    assert_ne!(slots[0], slots[1]);
    let foreign: Vec<_> = keys
        .iter()
        .filter(|(_, k)| !cities.iter().any(|c| k.starts_with(c.prefix)))
        .collect();
    assert!(foreign.is_empty(), "keys of no city: {foreign:?}");
    let mut conn = courier_wire::RedisConn::connect(&cluster.target(), &Default::default())
        .await
        .unwrap();
    for c in cities {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&c.keys.live)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(members, ["k1"], "{}", c.prefix);
    }

    // The scripts gone from every node (as on a node restarted empty): ingest (EVALSHA, then
    // SCRIPT LOAD on NOSCRIPT), the orders API and dispatch (redis-rs Script: EVAL on NOSCRIPT)
    // go on through the cluster client.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let a = riyadh
        .api("/orders/o2/assign", r#"{"courier_id":"k2"}"#)
        .await;
    assert_eq!(a.status, 200, "orders API after SCRIPT FLUSH: {a:?}");
    let (phone, _viewer, rx) = &mut phones[0];
    send_until_tracked(&riyadh, phone, "k1", "o1", &mut seqs[0], rx).await;
    let d = dispatch::Dispatch::connect(&cluster.target(), riyadh.keys.clone())
        .await
        .unwrap();
    let found = d
        .nearest(
            &dispatch::Query::at(riyadh.at.0, riyadh.at.1),
            courier_wire::clock::unix_now(),
        )
        .await
        .unwrap();
    assert_eq!(found.couriers[0].id, "k1");
    let errors = common::scrape(riyadh.metrics)
        .and_then(|t| common::metric(&t, "ingest_points_total", Some("result=\"error\"")))
        .unwrap_or(0.0);
    assert_eq!(errors, 0.0, "points given up after SCRIPT FLUSH");

    // Riyadh's o1 delivered (the event script, idempotency record and PUBLISH on the
    // cluster): its viewer is closed and no new token is issued; Jeddah's o1 runs on. The
    // other gateways of the city hear of it by classic pub/sub on a plain connection to any
    // node: a listener on the last node (not the slot's primary) hears it too.
    let mut listener = redis::Client::open(cluster.nodes.last().unwrap().as_str())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    listener
        .subscribe(&riyadh.keys.orders_ended_channel)
        .await
        .unwrap();
    let delivered = http_post(
        riyadh.http,
        "/orders/o1/events",
        &[
            ("Authorization", &format!("Bearer {TEST_SERVICE_KEY}")),
            ("Idempotency-Key", "deliver-1"),
        ],
        r#"{"event":"delivered"}"#,
    )
    .await;
    assert_eq!(delivered.status, 200, "{delivered:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut closed = false;
    while !closed && Instant::now() < deadline {
        closed = matches!(
            next_seen(&mut phones[0].2, Duration::from_millis(100)).await,
            Some(Seen::Closed(_))
        );
    }
    assert!(closed, "riyadh's viewer of o1 was not closed at delivery");
    let heard = tokio::time::timeout(Duration::from_secs(5), async {
        use futures_util::StreamExt;
        listener.on_message().next().await
    })
    .await
    .expect("no ended-order announcement on another node")
    .unwrap();
    assert_eq!(heard.get_payload::<String>().unwrap(), "o1");
    let t = riyadh
        .api("/orders/o1/tracking-token", r#"{"viewer":"customer"}"#)
        .await;
    assert_ne!(t.status, 200, "a token for a delivered order: {t:?}");
    let t = jeddah
        .api("/orders/o1/tracking-token", r#"{"viewer":"customer"}"#)
        .await;
    assert_eq!(t.status, 200, "jeddah's o1 ended with riyadh's: {t:?}");

    drop(phones);
    for c in [riyadh, jeddah] {
        let City {
            mut run,
            schema,
            dir,
            ..
        } = c;
        let _ = run.child.kill();
        let _ = run.child.wait();
        schema.drop().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
