//! Customer tracking end to end: real broker, real Redis, the orders API over HTTP and real
//! WebSocket viewers (rumqttc as MQTT 3.1.1 and as MQTT 5) over sockets. Each test has its own
//! broker, ports and key prefix.

use crate::support;

use courier_auth::Claims;
use courier_wire::{loc_topic, track_topic, Keys};
use futures_util::{SinkExt, StreamExt};
use rumqttc::QoS;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use support::*;

const SEC: Duration = Duration::from_secs(1);

fn now() -> f64 {
    courier_wire::clock::unix_now()
}

fn track(payload: &bytes::Bytes) -> (f64, f64) {
    let v: serde_json::Value = serde_json::from_slice(payload).unwrap();
    (v["lat"].as_f64().unwrap(), v["lon"].as_f64().unwrap())
}

/// Waits for the next publish, skipping nothing else silently: anything but a point fails.
async fn next_point(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>) -> (String, bytes::Bytes) {
    match next_seen(rx, 5 * SEC).await {
        Some(Seen::Point { topic, payload }) => (topic, payload),
        other => panic!("expected a point, got {other:?}"),
    }
}

async fn expect(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>, want: Seen) {
    let got = next_seen(rx, 5 * SEC).await;
    assert_eq!(got.as_ref(), Some(&want));
}

/// MQTT 3.1.1 viewer: the initial position comes from Redis (the gateway started after the
/// courier's last point), then the live points of its order and of no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v4_viewer_gets_the_last_position_from_redis_then_live_points() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let ing = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let (phone, _h) = client(&broker.endpoint, None).await;
    let first = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let token = assign_and_token(&first, "o-1", "c-1").await;
    assign_and_token(&first, "o-2", "c-2").await;
    first.stop().await;

    publish(
        &phone,
        &loc_topic("c-1"),
        point("c-1", 24.71, 46.67, now(), 1),
    )
    .await;
    let st = ing.stats.clone();
    assert!(wait_until(5 * SEC, || st.accepted.load(Relaxed) >= 1).await);
    // A gateway that never saw a track of o-1.
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let (viewer, mut rx) = viewer_v4(f.ws, &token).await;
    expect(&mut rx, Seen::Connected).await;
    viewer
        .subscribe("track/o-1", QoS::AtMostOnce)
        .await
        .unwrap();
    expect(&mut rx, Seen::SubAck(vec![true])).await;
    let (topic, initial) = next_point(&mut rx).await;
    assert_eq!(topic, "track/o-1");
    assert!(near(track(&initial), (24.71, 46.67)), "initial {initial:?}");

    publish(
        &phone,
        &loc_topic("c-2"),
        point("c-2", 21.5, 39.2, now(), 1),
    )
    .await;
    publish(
        &phone,
        &loc_topic("c-1"),
        point("c-1", 24.72, 46.68, now(), 2),
    )
    .await;
    let (topic, live) = next_point(&mut rx).await;
    assert_eq!(
        (topic.as_str(), track(&live)),
        ("track/o-1", (24.72, 46.68))
    );
    // Nothing of o-2 arrives.
    assert_eq!(next_seen(&mut rx, SEC / 2).await, None);
    assert!(f.stats.points_sent.load(Relaxed) >= 2);
    f.stop().await;
    ing.stop().await;
    cleanup_all(&keys).await;
}

/// MQTT 5 viewer: the initial position is the gateway's last track of the order, then every
/// point in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_viewer_gets_the_last_track_then_every_point() {
    v5_viewer_gets_the_last_track_then_every_point_on(BrokerKind::Embedded).await
}

/// The same through Mosquitto as an external broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_viewer_gets_the_last_track_then_every_point_through_mosquitto() {
    v5_viewer_gets_the_last_track_then_every_point_on(BrokerKind::Mosquitto).await
}

async fn v5_viewer_gets_the_last_track_then_every_point_on(kind: BrokerKind) {
    let broker = start_broker(kind);
    let keys = Keys::with_prefix(&prefix());
    let ing = start_ingest(&broker, test_ingest_config(), keys.clone()).await;
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let (phone, _h) = client(&broker.endpoint, None).await;
    let token = assign_and_token(&f, "o-5", "c-5").await;
    publish(
        &phone,
        &loc_topic("c-5"),
        point("c-5", 24.5, 46.5, now(), 1),
    )
    .await;
    let st = f.stats.clone();
    assert!(
        wait_until(5 * SEC, || st.tracks_received.load(Relaxed) >= 1).await,
        "no track reached the gateway"
    );

    let (viewer, mut rx) = viewer_v5(f.ws, &token).await;
    expect(&mut rx, Seen::Connected).await;
    viewer
        .subscribe("track/o-5", rumqttc::v5::mqttbytes::QoS::AtMostOnce)
        .await
        .unwrap();
    expect(&mut rx, Seen::SubAck(vec![true])).await;
    let (_, initial) = next_point(&mut rx).await;
    assert_eq!(track(&initial), (24.5, 46.5));
    for seq in 2..=6u64 {
        publish(
            &phone,
            &loc_topic("c-5"),
            point("c-5", 24.5 + seq as f64 * 0.001, 46.5, now(), seq),
        )
        .await;
    }
    for seq in 2..=6u64 {
        let (topic, p) = next_point(&mut rx).await;
        assert_eq!(topic, "track/o-5");
        assert!(near(track(&p), (24.5 + seq as f64 * 0.001, 46.5)));
    }
    f.stop().await;
    ing.stop().await;
    cleanup_all(&keys).await;
}

/// `track/#`, another order and `$SYS/#` get failure codes (3.1.1: 0x80, MQTT 5: 0x87) in
/// SUBACK; the viewer's own order is still granted afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_filters_are_refused_in_suback_on_both_versions() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let token = assign_and_token(&f, "o-1", "c-1").await;
    assign_and_token(&f, "o-2", "c-2").await;

    let (v4, mut rx4) = viewer_v4(f.ws, &token).await;
    expect(&mut rx4, Seen::Connected).await;
    for bad in ["track/#", "track/o-2", "$SYS/#", "track/+", "#"] {
        v4.subscribe(bad, QoS::AtMostOnce).await.unwrap();
        expect(&mut rx4, Seen::SubAck(vec![false])).await;
    }
    v4.subscribe_many([
        rumqttc::SubscribeFilter::new("track/o-2".into(), QoS::AtMostOnce),
        rumqttc::SubscribeFilter::new("track/o-1".into(), QoS::AtMostOnce),
    ])
    .await
    .unwrap();
    expect(&mut rx4, Seen::SubAck(vec![false, true])).await;

    let (v5, mut rx5) = viewer_v5(f.ws, &token).await;
    expect(&mut rx5, Seen::Connected).await;
    use rumqttc::v5::mqttbytes::QoS as Q5;
    for bad in ["track/#", "track/o-2", "$SYS/#"] {
        v5.subscribe(bad, Q5::AtMostOnce).await.unwrap();
        expect(&mut rx5, Seen::SubAck(vec![false])).await;
    }
    v5.subscribe("track/o-1", Q5::AtMostOnce).await.unwrap();
    expect(&mut rx5, Seen::SubAck(vec![true])).await;

    // Points of o-2 reach neither.
    let (pubc, _h) = client(&broker.endpoint, None).await;
    publish(
        &pubc,
        &track_topic("o-2"),
        courier_wire::encode_track(21.0, 39.0, now()),
    )
    .await;
    publish(
        &pubc,
        &track_topic("o-1"),
        courier_wire::encode_track(24.0, 46.0, now()),
    )
    .await;
    assert_eq!(next_point(&mut rx4).await.0, "track/o-1");
    assert_eq!(next_point(&mut rx5).await.0, "track/o-1");
    assert_eq!(f.stats.refused(fanout::ViewerRefusal::Filter), 5 + 1 + 3);
    f.stop().await;
    cleanup_all(&keys).await;
}

fn signed(order: &str, exp: u64) -> String {
    sign(&Claims {
        exp,
        ..Claims::viewer("customer", order, exp.saturating_sub(60), 0)
    })
}

/// Expired and forged tokens, tokens of other audiences and a token of an unknown order are
/// refused at CONNECT with the protocol's not-authorized code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_at_connect_on_both_versions() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    assign_and_token(&f, "o-1", "c-1").await;
    let t = now() as u64;
    let expired = signed("o-1", t - 1);
    let forged = courier_auth::SigningKey::generate(courier_auth::Audience::Viewer)
        .unwrap()
        .sign(&Claims::viewer("customer", "o-1", t, 600));
    // Valid tokens of other audiences, even carrying the order: a trail token, the courier's
    // own device token.
    let trail_token = sign(&Claims {
        order: Some("o-1".into()),
        ..Claims::trail("x", t, 600)
    });
    let device = sign(&Claims {
        order: Some("o-1".into()),
        ..Claims::courier("c-1", t, 600)
    });
    let unknown_order = signed("o-unknown", t + 600);
    for token in [
        &expired,
        &forged,
        &trail_token,
        &device,
        &unknown_order,
        &"garbage".to_string(),
    ] {
        let (_c, mut rx) = viewer_v4(f.ws, token).await;
        match next_seen(&mut rx, 5 * SEC).await {
            Some(Seen::Closed(e)) => assert!(e.contains("ConnectionRefused(NotAuthorized)"), "{e}"),
            other => panic!("v4 with a bad token: {other:?}"),
        }
        let (_c, mut rx) = viewer_v5(f.ws, token).await;
        match next_seen(&mut rx, 5 * SEC).await {
            Some(Seen::Closed(e)) => assert!(e.contains("ConnectionRefused(NotAuthorized)"), "{e}"),
            other => panic!("v5 with a bad token: {other:?}"),
        }
    }
    assert_eq!(f.stats.refused(fanout::ViewerRefusal::ExpiredToken), 2);
    // forged, trail token, device token, garbage: on both versions
    assert_eq!(f.stats.refused(fanout::ViewerRefusal::BadToken), 8);
    assert_eq!(f.stats.refused(fanout::ViewerRefusal::OrderEnded), 2);
    assert_eq!(f.stats.viewers.load(Relaxed), 0);
    f.stop().await;
    cleanup_all(&keys).await;
}

/// A token that expires while connected: disconnected within a second of its expiry (MQTT 5
/// is told "maximum connect time").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_token_disconnects_within_a_second() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    assign_and_token(&f, "o-1", "c-1").await;
    let exp = now().ceil() as u64 + 2;
    let (_c, mut rx) = viewer_v5(f.ws, &signed("o-1", exp)).await;
    expect(&mut rx, Seen::Connected).await;
    let seen = next_seen(&mut rx, 5 * SEC).await;
    let late = now() - exp as f64;
    assert_eq!(seen, Some(Seen::Disconnect(0xA0)));
    assert!(late < 1.0, "disconnected {late:.3}s after expiry");
    f.stop().await;
    cleanup_all(&keys).await;
}

/// `delivered` ends the order: its viewers are disconnected within a second, in this gateway
/// process and in another one (announced through Redis), and its tokens stop working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_disconnects_viewers_in_every_gateway() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let a = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let b = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let token = assign_and_token(&a, "o-1", "c-1").await;
    let other = assign_and_token(&a, "o-2", "c-2").await;

    let (v4, mut on_a) = viewer_v4(a.ws, &token).await;
    expect(&mut on_a, Seen::Connected).await;
    v4.subscribe("track/o-1", QoS::AtMostOnce).await.unwrap();
    expect(&mut on_a, Seen::SubAck(vec![true])).await;
    let (v5, mut on_b) = viewer_v5(b.ws, &token).await;
    expect(&mut on_b, Seen::Connected).await;
    v5.subscribe("track/o-1", rumqttc::v5::mqttbytes::QoS::AtMostOnce)
        .await
        .unwrap();
    expect(&mut on_b, Seen::SubAck(vec![true])).await;
    let (_o2, mut of_o2) = viewer_v4(b.ws, &other).await;
    expect(&mut of_o2, Seen::Connected).await;

    let t0 = Instant::now();
    let r = http_post(
        a.http,
        "/orders/o-1/events",
        &[
            ("Authorization", &format!("Bearer {TEST_SERVICE_KEY}")),
            ("Idempotency-Key", "k-delivered"),
        ],
        r#"{"event":"delivered"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(matches!(
        next_seen(&mut on_a, 2 * SEC).await,
        Some(Seen::Closed(_))
    ));
    assert_eq!(
        next_seen(&mut on_b, 2 * SEC).await,
        Some(Seen::Disconnect(0x87))
    );
    assert!(
        t0.elapsed() < SEC,
        "viewers closed after {:?}",
        t0.elapsed()
    );
    // The viewer of another order stays.
    assert_eq!(next_seen(&mut of_o2, SEC / 2).await, None);
    // The token no longer works, on either gateway; no new token is issued.
    for ws in [a.ws, b.ws] {
        let (_c, mut rx) = viewer_v4(ws, &token).await;
        assert!(
            matches!(next_seen(&mut rx, 5 * SEC).await, Some(Seen::Closed(e)) if e.contains("NotAuthorized"))
        );
    }
    assert_eq!(
        api(&a, "/orders/o-1/tracking-token", r#"{"viewer":"customer"}"#)
            .await
            .status,
        404
    );
    // The courier's points no longer go to o-1.
    let mut r = redis().await;
    let bound: Option<String> = redis::cmd("HGET")
        .arg(&keys.order)
        .arg("c-1")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(bound, None);
    a.stop().await;
    b.stop().await;
    cleanup_all(&keys).await;
}

/// Events under an Idempotency-Key: a replay returns the first answer and changes nothing;
/// the key with another body is 422. JSON errors: 401, 400, 404, 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_events_are_idempotent_and_errors_are_json() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let auth = format!("Bearer {TEST_SERVICE_KEY}");
    let event = |key: &'static str, body: &'static str| {
        let auth = auth.clone();
        let http = f.http;
        async move {
            http_post(
                http,
                "/orders/o-1/events",
                &[("Authorization", &auth), ("Idempotency-Key", key)],
                body,
            )
            .await
        }
    };

    // No or a wrong service key: 401 with a JSON error.
    let r = http_post(f.http, "/orders/o-1/assign", &[], r#"{"courier_id":"c-1"}"#).await;
    assert_eq!(r.status, 401);
    assert!(r.body["error"].is_string(), "{r:?}");
    let r = http_post(
        f.http,
        "/orders/o-1/assign",
        &[("Authorization", "Bearer wrong-key-0123456789")],
        r#"{"courier_id":"c-1"}"#,
    )
    .await;
    assert_eq!(r.status, 401);
    // Unknown order: 404.
    assert_eq!(event("k1", r#"{"event":"picked_up"}"#).await.status, 404);
    assert_eq!(
        api(&f, "/orders/o-1/tracking-token", r#"{"viewer":"customer"}"#)
            .await
            .status,
        404
    );
    // Bad bodies: 400.
    assert_eq!(api(&f, "/orders/o-1/assign", "not json").await.status, 400);
    assert_eq!(
        api(&f, "/orders/o-1/tracking-token", r#"{"viewer":"courier"}"#)
            .await
            .status,
        400
    );
    assert_eq!(
        api(&f, "/orders/o+1/assign", r#"{"courier_id":"c-1"}"#)
            .await
            .status,
        400
    );
    let r = http_post(
        f.http,
        "/orders/o-1/events",
        &[("Authorization", &auth)],
        r#"{"event":"picked_up"}"#,
    )
    .await;
    assert_eq!(r.status, 400, "missing Idempotency-Key");

    assert_eq!(
        api(&f, "/orders/o-1/assign", r#"{"courier_id":"c-1"}"#)
            .await
            .status,
        200
    );
    let t = api(
        &f,
        "/orders/o-1/tracking-token",
        r#"{"viewer":"restaurant"}"#,
    )
    .await;
    assert_eq!(t.body["topic"], "track/o-1");
    assert_eq!(t.body["ws_url"], format!("ws://{}/mqtt", f.ws));

    let first = event("k1", r#"{"event":"picked_up"}"#).await;
    assert_eq!(first.status, 200, "{first:?}");
    // The same request (spacing and field order do not matter): the first answer, verbatim.
    let again = event("k1", r#"{ "event" : "picked_up" }"#).await;
    assert_eq!((again.status, &again.raw_body), (200, &first.raw_body));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    // The same key with another body: 422, and nothing happens.
    let changed = event("k1", r#"{"event":"delivered"}"#).await;
    assert_eq!(changed.status, 422, "{changed:?}");
    assert!(changed.body["error"].is_string());
    assert_eq!(
        api(&f, "/orders/o-1/tracking-token", r#"{"viewer":"customer"}"#)
            .await
            .status,
        200
    );

    // Watch the announcements of ended orders: a replay must not announce again.
    let mut ps = redis::Client::open(services().redis_url.as_str())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    ps.subscribe(&keys.orders_ended_channel).await.unwrap();
    let done = event("k2", r#"{"event":"delivered"}"#).await;
    assert_eq!(done.status, 200);
    let mut r = redis().await;
    let ended_at: Option<f64> = redis::cmd("ZSCORE")
        .arg(&keys.orders_ended)
        .arg("o-1")
        .query_async(&mut r)
        .await
        .unwrap();
    for _ in 0..2 {
        let replay = event("k2", r#"{"event":"delivered"}"#).await;
        assert_eq!((replay.status, &replay.raw_body), (200, &done.raw_body));
    }
    let mut announced = 0;
    {
        let mut msgs = ps.on_message();
        while tokio::time::timeout(SEC / 2, msgs.next())
            .await
            .ok()
            .flatten()
            .is_some()
        {
            announced += 1;
        }
    }
    assert_eq!(announced, 1, "a replay announced the end again");
    let again: Option<f64> = redis::cmd("ZSCORE")
        .arg(&keys.orders_ended)
        .arg("o-1")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(again, ended_at);
    assert!(wait_until(SEC, || f.stats.orders_ended.load(Relaxed) == 1).await);
    // A new event on an ended order, or assigning it again: 409.
    assert_eq!(event("k3", r#"{"event":"picked_up"}"#).await.status, 409);
    assert_eq!(
        api(&f, "/orders/o-1/assign", r#"{"courier_id":"c-9"}"#)
            .await
            .status,
        409
    );
    f.stop().await;
    cleanup_all(&keys).await;
}

/// A viewer that publishes is disconnected (and its point goes nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_that_publishes_is_disconnected() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let f = start_fanout(&broker, keys.clone(), test_fanout_config()).await;
    let token = assign_and_token(&f, "o-1", "c-1").await;
    let mut spy = subscriber(&broker.endpoint, "track/#").await;
    let (v, mut rx) = viewer_v4(f.ws, &token).await;
    expect(&mut rx, Seen::Connected).await;
    v.publish("track/o-1", QoS::AtMostOnce, false, b"{}".to_vec())
        .await
        .unwrap();
    assert!(matches!(
        next_seen(&mut rx, 2 * SEC).await,
        Some(Seen::Closed(_))
    ));
    assert_eq!(f.stats.refused(fanout::ViewerRefusal::Publish), 1);
    assert!(tokio::time::timeout(SEC / 2, spy.recv()).await.is_err());
    f.stop().await;
    cleanup_all(&keys).await;
}

/// A raw WebSocket MQTT viewer with a tiny receive buffer that subscribes and then never
/// reads: the slowest possible viewer.
async fn stalled_viewer(
    ws: std::net::SocketAddr,
    token: &str,
    order: &str,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    use rumqttc::mqttbytes::v4;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(2048).unwrap();
    let stream = sock.connect(ws).await.unwrap();
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        format!("ws://{ws}/mqtt"),
    )
    .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", "mqtt".parse().unwrap());
    let (mut c, _) = tokio_tungstenite::client_async(req, stream).await.unwrap();
    let mut connect = v4::Connect::new("stalled");
    connect.set_login("customer", token);
    let mut b = bytes::BytesMut::new();
    v4::Packet::Connect(connect).write(&mut b, 1 << 16).unwrap();
    v4::Packet::Subscribe(v4::Subscribe::new(track_topic(order), QoS::AtMostOnce))
        .write(&mut b, 1 << 16)
        .unwrap();
    c.send(tokio_tungstenite::tungstenite::Message::Binary(b.freeze()))
        .await
        .unwrap();
    // CONNACK and SUBACK.
    let mut got = bytes::BytesMut::new();
    while got.len() < 4 + 5 {
        match tokio::time::timeout(5 * SEC, c.next()).await.unwrap() {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(m))) => {
                got.extend_from_slice(&m)
            }
            other => panic!("stalled viewer: {other:?}"),
        }
    }
    assert_eq!(&got[..4], &[0x20, 2, 0, 0], "CONNACK accepted");
    assert_eq!(got[8], 0, "SUBACK granted");
    c
}

/// One viewer that never reads and one that does, on the same order: the fast one receives
/// every point, the slow one loses its oldest (counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_viewer_does_not_delay_a_fast_one() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let config = fanout::FanoutConfig {
        queue_capacity: 4096,
        ..test_fanout_config()
    };
    let f = start_fanout(&broker, keys.clone(), config).await;
    let token = assign_and_token(&f, "o-1", "c-1").await;
    let _slow = stalled_viewer(f.ws, &token, "o-1").await;
    let (fast, mut rx) = viewer_v4(f.ws, &token).await;
    expect(&mut rx, Seen::Connected).await;
    fast.subscribe("track/o-1", QoS::AtMostOnce).await.unwrap();
    expect(&mut rx, Seen::SubAck(vec![true])).await;

    let (pubc, _h) = client(&broker.endpoint, None).await;
    let n = 20_000u32;
    let pad = "x".repeat(200);
    for i in 0..n {
        let payload = format!(r#"{{"lat":24.5,"lon":46.5,"ts":{i},"pad":"{pad}"}}"#);
        publish(&pubc, &track_topic("o-1"), payload.into_bytes()).await;
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut last_ts = -1.0;
    let mut received = 0;
    while received < n {
        let Some(Seen::Point { payload: p, .. }) = next_seen(&mut rx, 5 * SEC).await else {
            panic!("fast viewer got {received} of {n}; gateway {:?}", f.stats);
        };
        let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
        let ts = v["ts"].as_f64().unwrap();
        assert!(ts > last_ts, "out of order");
        last_ts = ts;
        received += 1;
    }
    let st = f.stats.clone();
    assert!(
        wait_until(5 * SEC, || st.dropped_queue_full.load(Relaxed) > 0).await,
        "the stalled viewer lost nothing: {:?}",
        st
    );
    assert!(
        wait_until(5 * SEC, || st.tracks_received.load(Relaxed) == n as u64).await,
        "{st:?}"
    );
    f.stop().await;
    cleanup_all(&keys).await;
}

/// With a send interval, a viewer gets at most one point per interval, the newest; the ones
/// in between are counted as superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_interval_sends_the_newest_point_once_per_interval() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let config = fanout::FanoutConfig {
        send_interval: Duration::from_secs(1),
        ..test_fanout_config()
    };
    let f = start_fanout(&broker, keys.clone(), config).await;
    let token = assign_and_token(&f, "o-1", "c-1").await;
    let (v, mut rx) = viewer_v4(f.ws, &token).await;
    expect(&mut rx, Seen::Connected).await;
    v.subscribe("track/o-1", QoS::AtMostOnce).await.unwrap();
    expect(&mut rx, Seen::SubAck(vec![true])).await;
    let (pubc, _h) = client(&broker.endpoint, None).await;
    for i in 1..=20 {
        publish(
            &pubc,
            &track_topic("o-1"),
            courier_wire::encode_track(24.0 + i as f64 * 0.001, 46.0, now()),
        )
        .await;
    }
    let (_, first) = next_point(&mut rx).await;
    let (_, second) = next_point(&mut rx).await;
    assert_eq!(
        track(&second),
        (24.02, 46.0),
        "the newest point after the interval"
    );
    assert_ne!(track(&first), track(&second));
    assert_eq!(
        next_seen(&mut rx, 1500 * Duration::from_millis(1)).await,
        None
    );
    let st = f.stats.clone();
    assert!(
        wait_until(SEC, || st.dropped_interval.load(Relaxed) + 2 >= 20).await,
        "{st:?}"
    );
    f.stop().await;
    cleanup_all(&keys).await;
}

/// One tracking token holds at most `max_sessions_per_token` sessions: a link shared widely
/// (or a client reconnecting in a loop) cannot take a gateway's connections. A session that
/// leaves frees its place; another token of the same order has places of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_holds_at_most_its_sessions() {
    let broker = start_broker(BrokerKind::Embedded);
    let keys = Keys::with_prefix(&prefix());
    let config = fanout::FanoutConfig {
        max_sessions_per_token: 2,
        ..test_fanout_config()
    };
    let f = start_fanout(&broker, keys.clone(), config).await;
    let token = assign_and_token(&f, "o-cap", "c-cap").await;
    let (c1, mut rx1) = viewer_v4(f.ws, &token).await;
    expect(&mut rx1, Seen::Connected).await;
    let (_c2, mut rx2) = viewer_v5(f.ws, &token).await;
    expect(&mut rx2, Seen::Connected).await;
    let (_c3, mut rx3) = viewer_v4(f.ws, &token).await;
    match next_seen(&mut rx3, 5 * SEC).await {
        Some(Seen::Closed(e)) => {
            assert!(e.contains("ConnectionRefused(ServiceUnavailable)"), "{e}")
        }
        other => panic!("a third session of the token: {other:?}"),
    }
    assert_eq!(f.stats.refused(fanout::ViewerRefusal::TokenSessions), 1);
    // Another token of the same order is not held to the first one's count.
    let other = signed("o-cap", now() as u64 + 601);
    assert_ne!(other, token);
    let (_c4, mut rx4) = viewer_v4(f.ws, &other).await;
    expect(&mut rx4, Seen::Connected).await;
    // One leaves: its place is free again.
    c1.disconnect().await.unwrap();
    let s = f.stats.clone();
    assert!(wait_until(5 * SEC, || s.viewers.load(Relaxed) == 2).await);
    let (_c5, mut rx5) = viewer_v4(f.ws, &token).await;
    expect(&mut rx5, Seen::Connected).await;
    assert_eq!(f.stats.refused(fanout::ViewerRefusal::TokenSessions), 1);
    f.stop().await;
    cleanup_all(&keys).await;
}
