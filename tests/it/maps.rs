//! The live maps in a real browser (headless Chromium over CDP, tests/it/support/browser.rs)
//! against real Redis, PostgreSQL, the embedded bus, ingest and the fanout gateway: the
//! operations map (`/ops`) and the customer's tracking page (`/track/<order>`), plus the ops
//! API refusing every other credential, as an attacker would try.
//!
//! `MAPS_SCREENSHOTS=1` also writes docs/ops-map.png and docs/track-page.png.

use crate::support;

use courier_auth::Audience;
use courier_wire::Keys;
use serde_json::Value;
use std::time::Duration;
use support::*;

const RIYADH: (f64, f64) = (24.7136, 46.6753);

fn now() -> f64 {
    courier_wire::clock::unix_now()
}

fn shoot(tab_name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("MAPS_SCREENSHOTS").map(|_| repo_root().join("docs").join(tab_name))
}

/// The live path a phone's point takes to the map: bus, ingest (with a fresh key prefix).
struct Live {
    keys: Keys,
    broker: TestBroker,
    ingest: Option<RunningIngest>,
    phone: rumqttc::AsyncClient,
}

impl Live {
    async fn start() -> Live {
        let keys = Keys::with_prefix(&prefix());
        let broker = start_broker(BrokerKind::Embedded);
        let ingest = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
        let (phone, _) = client(&broker.endpoint, None).await;
        Live {
            keys,
            broker,
            ingest: Some(ingest),
            phone,
        }
    }

    async fn point(&self, id: &str, (lat, lon): (f64, f64), seq: u64) {
        publish(
            &self.phone,
            &format!("couriers/{id}/loc"),
            point(id, lat, lon, now(), seq),
        )
        .await;
    }

    /// Waits until the live index holds `id` at `at`.
    async fn wait_live(&self, id: &str, at: (f64, f64)) {
        let mut r = redis().await;
        let end = std::time::Instant::now() + Duration::from_secs(10);
        let mut ok = false;
        while std::time::Instant::now() < end {
            if geopos(&mut r, &self.keys, id)
                .await
                .is_some_and(|p| (p.0 - at.0).abs() < 1e-4 && (p.1 - at.1).abs() < 1e-4)
            {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ok, "{id} did not reach the live index");
    }

    async fn stop(mut self) {
        if let Some(i) = self.ingest.take() {
            i.stop().await;
        }
        cleanup(&self.keys).await;
        drop(self.broker);
    }
}

fn marker_at(tab_state: &Value) -> Option<(f64, f64)> {
    Some((tab_state[0].as_f64()?, tab_state[1].as_f64()?))
}

/// Markers appear for the couriers in the view (not for one outside it), carry their order and
/// freshness, move when a new point arrives, and the search opens a courier's card.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_map_shows_the_couriers_in_view_and_moves_them_when_points_arrive() {
    let live = Live::start().await;
    let (a, b) = ((24.70, 46.67), (24.72, 46.69));
    let far = (21.54, 39.17);
    live.point("mc-a", a, 1).await;
    live.point("mc-b", b, 1).await;
    live.point("mc-far", far, 1).await;
    live.wait_live("mc-a", a).await;
    live.wait_live("mc-b", b).await;
    live.wait_live("mc-far", far).await;
    // mc-b carries an order (what the orders API writes at assignment).
    let mut r = redis().await;
    let _: () = redis::cmd("HSET")
        .arg(&live.keys.order)
        .arg("mc-b")
        .arg("o-77")
        .query_async(&mut r)
        .await
        .unwrap();
    let maps = start_maps(
        live.keys.clone(),
        web::WebConfig::default(),
        "ws://127.0.0.1:9/mqtt".into(),
        None,
    )
    .await;

    let browser = Browser::start().await;
    let tab = browser.tab(1000, 700).await;
    let token = token_for(Audience::Ops, "olga", 600);
    tab.goto(&maps.url(&format!("/ops?token={token}"))).await;
    // The token leaves the address bar at once.
    assert_eq!(tab.eval("location.search").await, "");
    assert!(
        tab.wait_for(
            "window.opsMap && opsMap.refreshes >= 1",
            Duration::from_secs(10)
        )
        .await
    );
    tab.eval("opsMap.map.fitBounds([[24.65, 46.62], [24.76, 46.74]], {animate: false}); true")
        .await;
    assert!(
        tab.wait_for(
            "opsMap.markers.has('mc-a') && opsMap.markers.has('mc-b') && !opsMap.markers.has('mc-far')",
            Duration::from_secs(10)
        )
        .await,
        "not exactly the couriers in view are drawn: {}",
        tab.eval("JSON.stringify([...opsMap.markers.keys()])").await
    );
    let state = tab
        .eval("(() => { const a = opsMap.markers.get('mc-a'), b = opsMap.markers.get('mc-b'); \
               return { far: opsMap.markers.has('mc-far'), a: [a.lat, a.lon, a.freshness, a.order], \
               b: [b.lat, b.lon, b.freshness, b.order], drawn: a.layer.getLatLng().lat }; })()")
        .await;
    assert_eq!(state["far"], false, "a courier outside the view was drawn");
    assert!(near(marker_at(&state["a"]).unwrap(), a));
    assert_eq!(state["a"][2], "fresh");
    assert_eq!(state["a"][3], Value::Null);
    assert_eq!(state["b"][3], "o-77", "the order is not marked");

    // A new point moves the marker within a refresh or two.
    let moved = (24.705, 46.68);
    live.point("mc-a", moved, 2).await;
    assert!(
        tab.wait_for(
            &format!(
                "Math.abs(opsMap.markers.get('mc-a').layer.getLatLng().lat - {}) < 1e-4 && \
                 Math.abs(opsMap.markers.get('mc-a').layer.getLatLng().lng - {}) < 1e-4",
                moved.0, moved.1
            ),
            Duration::from_secs(10)
        )
        .await,
        "the marker did not move to the new point"
    );

    // Search by id opens the card: seq state, order, phone lag.
    tab.eval(
        "document.getElementById('search-id').value = 'mc-b'; \
              document.getElementById('search').requestSubmit(); true",
    )
    .await;
    assert!(
        tab.wait_for(
            "document.getElementById('c-id').textContent === 'mc-b' && \
             document.getElementById('c-body').textContent.includes('o-77')",
            Duration::from_secs(10)
        )
        .await,
        "the card of mc-b did not open"
    );
    let card = tab
        .eval("document.getElementById('c-body').textContent")
        .await;
    assert!(card.as_str().unwrap().contains("phone lag"), "{card}");
    if let Some(p) = shoot("ops-map.png") {
        // For the picture only: more couriers, some of them silent for a while (their seen
        // times set back, as if their last point were older) and some carrying orders.
        let t = now();
        for i in 0..60u64 {
            let id = format!("mc-{i:02}");
            let at = (
                24.66 + (i % 10) as f64 * 0.009,
                46.63 + (i / 10) as f64 * 0.017,
            );
            live.point(&id, at, 1).await;
            live.wait_live(&id, at).await;
            let back = match i % 7 {
                0 => 50.0,
                1 | 2 => 20.0,
                _ => 0.0,
            };
            let _: () = redis::cmd("ZADD")
                .arg(&live.keys.seen)
                .arg(t - back)
                .arg(&id)
                .query_async(&mut r)
                .await
                .unwrap();
            if i % 6 == 0 {
                let _: () = redis::cmd("HSET")
                    .arg(&live.keys.order)
                    .arg(&id)
                    .arg(format!("o-{i}"))
                    .query_async(&mut r)
                    .await
                    .unwrap();
            }
        }
        tab.call("Emulation.setDeviceMetricsOverride", serde_json::json!({ "width": 820, "height": 520, "deviceScaleFactor": 1, "mobile": false })).await;
        tab.eval("opsMap.map.invalidateSize(); opsMap.map.fitBounds([[24.655, 46.62], [24.75, 46.75]], {animate: false}); true").await;
        // For the picture only (the docs' screenshot): time for the next refresh to draw the
        // markers set up above and for the map to paint.
        tokio::time::sleep(Duration::from_secs(3)).await;
        tab.screenshot(&p).await;
    }
    maps.stop();
    live.stop().await;
}

/// Without a token, with an expired ops token, or with another audience's valid token the page
/// shows a refusal, draws nothing, and every data request it made was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_map_without_a_valid_ops_token_shows_a_refusal_and_gets_no_data() {
    let live = Live::start().await;
    live.point("mr-a", RIYADH, 1).await;
    live.wait_live("mr-a", RIYADH).await;
    let maps = start_maps(
        live.keys.clone(),
        web::WebConfig::default(),
        "ws://127.0.0.1:9/mqtt".into(),
        None,
    )
    .await;
    let browser = Browser::start().await;
    for (what, query) in [
        ("no token", String::new()),
        (
            "an expired ops token",
            format!("?token={}", token_for(Audience::Ops, "olga", -10)),
        ),
        (
            "a valid trail token",
            format!("?token={}", token_for(Audience::Trail, "sam", 600)),
        ),
    ] {
        let tab = browser.tab(800, 600).await;
        tab.goto(&maps.url(&format!("/ops{query}"))).await;
        assert!(
            tab.wait_for(
                "!document.getElementById('refusal').hidden && window.opsMap.refused",
                Duration::from_secs(10)
            )
            .await,
            "{what}: no refusal shown"
        );
        // A negative: time for a refresh that should not happen to draw markers.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(tab.eval("opsMap.markers.size").await, 0, "{what}");
        let api: Vec<_> = tab
            .responses()
            .into_iter()
            .filter(|r| r.url.contains("/ops/api/"))
            .collect();
        assert!(
            api.iter().all(|r| r.status == 401),
            "{what}: a data request was answered: {api:?}"
        );
        if query.is_empty() {
            assert!(api.is_empty(), "no token, yet the page asked for data");
        } else {
            assert!(!api.is_empty(), "{what}: the page never tried");
        }
        let text = tab.eval("document.body.innerText").await;
        assert!(!text.as_str().unwrap().contains("mr-a"), "{what}: {text}");
    }
    maps.stop();
    live.stop().await;
}

/// The ops API as an attacker holding other valid credentials sees it: courier, viewer, trail,
/// bus and privacy tokens, an expired ops token and an ops token signed with another key all
/// get the same 401 and no data; a valid ops token gets the courier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_api_refuses_other_audiences_and_expired_tokens() {
    let live = Live::start().await;
    live.point("ma-a", RIYADH, 1).await;
    live.wait_live("ma-a", RIYADH).await;
    let maps = start_maps(
        live.keys.clone(),
        web::WebConfig::default(),
        "ws://127.0.0.1:9/mqtt".into(),
        None,
    )
    .await;
    let forged = courier_auth::SigningKey::generate(Audience::Ops)
        .unwrap()
        .sign(&courier_auth::Claims::ops("olga", now() as u64, 600));
    let mut viewer = courier_auth::Claims::viewer("customer", "o-1", now() as u64, 600);
    viewer.exp = now() as u64 + 600;
    let wrong = [
        ("courier", token_for(Audience::Courier, "ma-a", 600)),
        ("viewer", sign(&viewer)),
        ("trail", token_for(Audience::Trail, "sam", 600)),
        ("bus", token_for(Audience::Bus, "ingest", 600)),
        ("privacy", token_for(Audience::Privacy, "dpo", 600)),
        ("expired ops", token_for(Audience::Ops, "olga", -1)),
        ("forged ops", forged),
        ("garbage", "not.a.token".into()),
    ];
    let paths = [
        "/ops/api/live?bbox=46.6,24.6,46.8,24.8",
        "/ops/api/couriers/ma-a",
        "/ops/api/totals",
    ];
    for path in paths {
        let none = http_get(maps.http, path, None).await;
        assert_eq!(none.status, 401, "{path} without a token: {}", none.body);
        for (what, t) in &wrong {
            let r = http_get(maps.http, path, Some(t)).await;
            assert_eq!(r.status, 401, "{what} on {path}: {}", r.body);
            assert!(
                !r.body.contains("ma-a") && !r.body.contains("24.71"),
                "{what} leaked: {}",
                r.body
            );
            assert!(r
                .head
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer"));
        }
    }
    let ops = token_for(Audience::Ops, "olga", 600);
    let r = http_get(maps.http, paths[0], Some(&ops)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["in_view"], 1);
    assert_eq!(v["markers"][0][0], "ma-a");
    let card = http_get(maps.http, paths[1], Some(&ops)).await.json();
    assert_eq!(card["seq"], 1.0);
    assert!(card["phone_lag"].as_f64().unwrap().abs() < 5.0);
    let bad = http_get(maps.http, "/ops/api/live?bbox=1,2,3", Some(&ops)).await;
    assert_eq!(bad.status, 400);

    // The pages and bundles: types, cache headers, ETag revalidation.
    let page = http_get(maps.http, "/ops", None).await;
    assert_eq!(page.status, 200);
    let head = page.head.to_ascii_lowercase();
    assert!(head.contains("content-type: text/html"));
    assert!(head.contains("cache-control: no-cache"));
    assert!(head.contains("referrer-policy: no-referrer"));
    assert!(head.contains("content-security-policy: default-src 'self'"));
    let js = http_get(maps.http, "/maps/assets/ops.js", None).await;
    assert_eq!(js.status, 200);
    let jhead = js.head.to_ascii_lowercase();
    assert!(jhead.contains("content-type: text/javascript"));
    assert!(jhead.contains("cache-control: public, max-age=3600"));
    let etag = js
        .head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("etag: ")
                .map(|_| l[6..].trim().to_string())
        })
        .expect("no ETag");
    let again = http_get_with(
        maps.http,
        "/maps/assets/ops.js",
        &[("If-None-Match", &etag)],
    )
    .await;
    assert_eq!(again.status, 304);
    assert_eq!(
        http_get(maps.http, "/maps/assets/nope.js", None)
            .await
            .status,
        404
    );
    maps.stop();
    live.stop().await;
}

/// The customer side: broker, ingest, the fanout (orders API, gateway) and the maps, with the
/// fanout handing out `tracking_url`s that point at the maps.
struct Customer {
    live: Live,
    fanout: RunningFanout,
    maps: RunningMaps,
}

impl Customer {
    async fn start() -> Customer {
        let live = Live::start().await;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let page = format!("http://{}", l.local_addr().unwrap());
        let config = fanout::FanoutConfig {
            tracking_page_url: Some(page),
            ..test_fanout_config()
        };
        let fanout = start_fanout(&live.broker, live.keys.clone(), config).await;
        let ws = format!("ws://{}/mqtt", fanout.ws);
        let maps = start_maps_on(l, live.keys.clone(), web::WebConfig::default(), ws, None).await;
        Customer { live, fanout, maps }
    }

    /// Assigns `courier` to `order` and returns the `tracking_url` of a customer token.
    async fn tracking_url(&self, order: &str, courier: &str) -> String {
        let a = api(
            &self.fanout,
            &format!("/orders/{order}/assign"),
            &format!(r#"{{"courier_id":"{courier}"}}"#),
        )
        .await;
        assert_eq!(a.status, 200, "{a:?}");
        let t = api(
            &self.fanout,
            &format!("/orders/{order}/tracking-token"),
            r#"{"viewer":"customer"}"#,
        )
        .await;
        assert_eq!(t.status, 200, "{t:?}");
        let url = t.body["tracking_url"]
            .as_str()
            .expect("no tracking_url")
            .to_string();
        let token = t.body["token"].as_str().unwrap();
        assert_eq!(url, self.maps.url(&format!("/track/{order}?token={token}")));
        url
    }

    async fn stop(self) {
        self.maps.stop();
        self.fanout.stop().await;
        self.live.stop().await;
    }
}

async fn open_track<'a>(browser: &'a Browser, url: &str) -> Tab<'a> {
    let tab = browser.tab(480, 640).await;
    tab.goto(url).await;
    assert!(
        tab.wait_for(
            "window.trackPage && trackPage.connection === 'live'",
            Duration::from_secs(15)
        )
        .await,
        "the tracking page did not connect: {}",
        tab.eval("JSON.stringify(window.trackPage)").await
    );
    tab
}

/// The page of order A shows A's courier moving smoothly and never receives a point of order B
/// (published in between, through the same gateway).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customer_page_of_one_order_follows_its_courier_and_never_receives_another_order() {
    let c = Customer::start().await;
    let url_a = c.tracking_url("o-A", "tc-a").await;
    let _url_b = c.tracking_url("o-B", "tc-b").await;
    let browser = Browser::start().await;
    let tab = open_track(&browser, &url_a).await;
    assert_eq!(tab.eval("location.search").await, "");
    let mut last_a = (0.0, 0.0);
    for seq in 1..=6u64 {
        last_a = (24.70 + seq as f64 * 0.0008, 46.67 + seq as f64 * 0.0011);
        c.live.point("tc-a", last_a, seq).await;
        c.live
            .point("tc-b", (21.5 + seq as f64 * 0.001, 39.17), seq)
            .await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(
        tab.wait_for("trackPage.received.length >= 4", Duration::from_secs(10))
            .await,
        "the page received too few points: {}",
        tab.eval("JSON.stringify(trackPage.received)").await
    );
    // The marker glides: a point arriving now is reached through positions in between.
    let from = tab.eval("trackPage.position").await;
    let next = (last_a.0 + 0.002, last_a.1 + 0.002);
    c.live.point("tc-a", next, 7).await;
    let path = tab
        .eval("new Promise((done) => { const seen = []; const t0 = performance.now(); \
               const f = () => { seen.push(trackPage.position); \
               if (performance.now() - t0 < 2500) requestAnimationFrame(f); else done(seen); }; f(); })")
        .await;
    let steps: Vec<(f64, f64)> = path
        .as_array()
        .unwrap()
        .iter()
        .filter_map(marker_at)
        .collect();
    let end = *steps.last().unwrap();
    assert!(
        near(end, next),
        "the marker ended at {end:?}, not at {next:?}"
    );
    let between = steps
        .iter()
        .filter(|p| p.0 > from[0].as_f64().unwrap() + 1e-6 && p.0 < next.0 - 1e-6)
        .count();
    assert!(
        between >= 3,
        "the marker jumped ({between} positions in between)"
    );
    let received = tab.eval("trackPage.received").await;
    for m in received.as_array().unwrap() {
        assert_eq!(m["topic"], "track/o-A", "order A's page received {m}");
        assert!(
            m["lat"].as_f64().unwrap() > 24.0,
            "a point of order B reached A's page: {m}"
        );
    }
    let age = tab.eval("document.getElementById('age').textContent").await;
    assert!(age.as_str().unwrap().starts_with("updated"), "{age}");
    if let Some(p) = shoot("track-page.png") {
        tab.screenshot(&p).await;
    }
    c.stop().await;
}

/// `delivered` ends the page: the banner shows, the connection is closed, and later points of
/// that courier are not received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_ends_the_customer_page() {
    let c = Customer::start().await;
    let url = c.tracking_url("o-D", "tc-d").await;
    let browser = Browser::start().await;
    let tab = open_track(&browser, &url).await;
    c.live.point("tc-d", RIYADH, 1).await;
    assert!(
        tab.wait_for("trackPage.received.length >= 1", Duration::from_secs(10))
            .await
    );
    let r = http_post(
        c.fanout.http,
        "/orders/o-D/events",
        &[
            ("Authorization", &format!("Bearer {TEST_SERVICE_KEY}")),
            ("Idempotency-Key", "k-d"),
        ],
        r#"{"event":"delivered"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        tab.wait_for(
            "trackPage.delivered && !document.getElementById('delivered').hidden",
            Duration::from_secs(10)
        )
        .await,
        "the page did not end: {}",
        tab.eval("JSON.stringify(trackPage)").await
    );
    let before = tab.eval("trackPage.received.length").await;
    c.live.point("tc-d", (RIYADH.0 + 0.001, RIYADH.1), 2).await;
    // A negative: time for the point to reach the page, were it still connected.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(tab.eval("trackPage.received.length").await, before);
    assert_eq!(tab.eval("trackPage.connection").await, "closed");
    // Opened again after delivery: "delivered" at once, no connection.
    let again = browser.tab(480, 640).await;
    again.goto(&url).await;
    assert!(
        again
            .wait_for("trackPage.delivered", Duration::from_secs(10))
            .await
    );
    assert_eq!(again.ws_frames_received(), 0);
    c.stop().await;
}

/// An expired token, a token of another order and no token: a refusal, no WebSocket, no point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customer_page_with_an_expired_missing_or_foreign_token_is_refused_and_gets_no_data() {
    let c = Customer::start().await;
    let _ = c.tracking_url("o-E", "tc-e").await;
    let url_f = c.tracking_url("o-F", "tc-f").await;
    let token_f = url_f.split("token=").nth(1).unwrap().to_string();
    let mut expired = courier_auth::Claims::viewer("customer", "o-E", now() as u64 - 3600, 60);
    expired.exp = now() as u64 - 5;
    let browser = Browser::start().await;
    for (what, query) in [
        ("no token", String::new()),
        ("an expired token", format!("?token={}", sign(&expired))),
        ("order F's token", format!("?token={token_f}")),
        (
            "an ops token",
            format!("?token={}", token_for(Audience::Ops, "olga", 600)),
        ),
    ] {
        let tab = browser.tab(480, 640).await;
        tab.goto(&c.maps.url(&format!("/track/o-E{query}"))).await;
        c.live
            .point("tc-e", RIYADH, 1 + rand::random::<u32>() as u64)
            .await;
        assert!(
            tab.wait_for(
                "trackPage.refused && !document.getElementById('refusal').hidden",
                Duration::from_secs(10)
            )
            .await,
            "{what}: no refusal: {}",
            tab.eval("JSON.stringify(trackPage)").await
        );
        // A negative: time for a point to arrive, were the refused page subscribed.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(tab.eval("trackPage.received.length").await, 0, "{what}");
        assert_eq!(
            tab.ws_frames_received(),
            0,
            "{what}: WebSocket frames reached the page"
        );
        assert!(
            tab.responses().iter().all(|r| r.status != 101),
            "{what}: the page opened a WebSocket"
        );
    }
    c.stop().await;
}

/// "Show trail" asks for a reason (none: no request), then reads the trail through the trail
/// API with the ops token and draws it; the audit row names the ops user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_request_asks_for_a_reason_and_leaves_an_audit_row() {
    let schema = pg_schema().await;
    let mut admin = pg_connect(&schema.url).await;
    history_writer::migrate(&mut admin).await.unwrap();
    let t = now();
    history_writer::partitions::upkeep(&mut admin, t, 1, 30, false)
        .await
        .unwrap();
    let rows: Vec<history_writer::rows::Row> = (1..=8)
        .map(|i| history_writer::rows::Row {
            courier_id: "mt-a".into(),
            seq: i,
            phone_ts: t - 600.0 + i as f64 * 10.0,
            received_at: t - 600.0 + i as f64 * 10.0 + 0.4,
            order_id: None,
            lat: 24.70 + i as f64 * 0.001,
            lon: 46.67 + i as f64 * 0.0015,
        })
        .collect();
    history_writer::sink::PgSink::new(&schema.url)
        .copy(&rows)
        .await
        .unwrap();
    let live = Live::start().await;
    live.point("mt-a", (24.709, 46.684), 9).await;
    live.wait_live("mt-a", (24.709, 46.684)).await;
    let maps = start_maps(
        live.keys.clone(),
        web::WebConfig::default(),
        "ws://127.0.0.1:9/mqtt".into(),
        Some(&schema.url),
    )
    .await;
    let browser = Browser::start().await;
    let tab = browser.tab(1000, 700).await;
    tab.goto(&maps.url(&format!(
        "/ops?token={}",
        token_for(Audience::Ops, "alice", 600)
    )))
    .await;
    assert!(
        tab.wait_for(
            "window.opsMap && opsMap.refreshes >= 1",
            Duration::from_secs(10)
        )
        .await
    );
    tab.eval(
        "document.getElementById('search-id').value = 'mt-a'; \
              document.getElementById('search').requestSubmit(); true",
    )
    .await;
    assert!(
        tab.wait_for(
            "document.getElementById('c-id').textContent === 'mt-a'",
            Duration::from_secs(10)
        )
        .await
    );
    tab.eval("document.getElementById('show-trail').click(); true")
        .await;
    assert_eq!(
        tab.eval("document.getElementById('trail-form').hidden")
            .await,
        false
    );
    // No reason: refused in the page, nothing asked of the trail API.
    tab.eval("document.getElementById('trail-form').requestSubmit(); true")
        .await;
    assert!(
        tab.wait_for(
            "document.getElementById('trail-status').textContent.includes('reason is required')",
            Duration::from_secs(5)
        )
        .await
    );
    assert!(tab.responses().iter().all(|r| !r.url.contains("/trail")));
    tab.eval(
        "document.getElementById('trail-reason').value = 'dispute 4411: late delivery'; \
              document.getElementById('trail-form').requestSubmit(); true",
    )
    .await;
    assert!(
        tab.wait_for(
            "opsMap.trail && opsMap.trail.points === 8",
            Duration::from_secs(10)
        )
        .await,
        "the trail was not drawn: {}",
        tab.eval("document.getElementById('trail-status').textContent")
            .await
    );
    let row = admin
        .query_one(
            "SELECT actor, courier_id, reason, row_count FROM trail_access_log",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "ops:alice");
    assert_eq!(row.get::<_, String>(1), "mt-a");
    assert_eq!(row.get::<_, String>(2), "dispute 4411: late delivery");
    assert_eq!(row.get::<_, i32>(3), 8);
    maps.stop();
    live.stop().await;
    schema.drop().await;
}
