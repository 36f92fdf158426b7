//! The edge as an attacker with a real courier's device token would try it, with real rumqttc
//! clients (MQTT 3.1.1 and 5) over real sockets, against the edge + embedded bus + ingest of
//! `courier-pipeline run` (the in-process link) or a separate edge forwarding over MQTT. Each
//! refusal is checked for what leaked or moved: a spy with a service login subscribed to `#` on
//! the bus sees everything that got through, and Redis shows who moved.

use crate::support;

use courier_auth::{Audience, Claims, KeySet, SigningKey};
use courier_pipeline::broker;
use courier_wire::{loc_topic, status_topic, Keys, MqttEndpoint};
use edge::{Edge, EdgeConfig, Refusal, Via};
use rumqttc::v5::mqttbytes::v5 as m5;
use rumqttc::{AsyncClient, ConnectReturnCode, Event, LastWill, Packet, QoS};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio_util::sync::CancellationToken;

fn now() -> u64 {
    courier_wire::clock::unix_now() as u64
}

fn device_token(id: &str, ttl: u64) -> String {
    sign(&Claims::courier(id, now(), ttl))
}

fn login(e: &MqttEndpoint, user: &str, pass: &str) -> MqttEndpoint {
    MqttEndpoint {
        username: Some(user.into()),
        password: Some(pass.into()),
        ..e.clone()
    }
}

/// The embedded bus (service logins only), ingest on it, an edge in front, and a spy on `#`.
struct Rig {
    bus: MqttEndpoint,
    phones: MqttEndpoint,
    tls: Option<std::net::SocketAddr>,
    ws: Option<std::net::SocketAddr>,
    edge: Arc<edge::Stats>,
    ingest: RunningIngest,
    spy: tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), edge::EdgeError>>,
    _dir: std::path::PathBuf,
}

struct RigOptions {
    /// Through the in-process link (as `run`), or over MQTT (as `courier-pipeline edge`).
    in_process: bool,
    edge: EdgeConfig,
    tls: bool,
}

impl Default for RigOptions {
    fn default() -> Self {
        RigOptions {
            in_process: true,
            edge: EdgeConfig {
                listen: "127.0.0.1:0".into(),
                reuse_port: false,
                ..EdgeConfig::default()
            },
            tls: false,
        }
    }
}

async fn rig(o: RigOptions) -> Rig {
    let dir = std::env::temp_dir().join(format!("edge-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ec = o.edge;
    if o.tls {
        let (_ca, cert, key) = throwaway_tls(&dir);
        ec.tls_listen = Some("127.0.0.1:0".into());
        ec.tls_cert = Some(cert);
        ec.tls_key = Some(key);
        ec.ws_listen = Some("127.0.0.1:0".into());
    }
    let stats = Arc::new(edge::Stats::default());
    let mut bound = Edge {
        settings: ec.validate().unwrap(),
        keys: test_verifier(Audience::Courier),
        stats: stats.clone(),
    }
    .bind()
    .unwrap();
    // rumqttd binds its own listener and cannot report a port 0: chosen here.
    let addr = free_addr();
    let mut config = broker::load_config(None, addr).unwrap();
    broker::secure(&mut config, None, Some(test_verifier(Audience::Bus))).unwrap();
    let service = |role: &str| {
        login(
            &MqttEndpoint::new("127.0.0.1", addr.port()),
            role,
            &sign(&Claims::bus(role, now(), 600)),
        )
    };
    let bus_link = if o.in_process {
        broker::start_with_edge(config, addr, bound.take_queue().unwrap()).unwrap();
        None
    } else {
        broker::start(config, addr).unwrap();
        Some(service("edge"))
    };
    let find = |via| {
        bound
            .local_addrs()
            .into_iter()
            .find(|(v, _)| *v == via)
            .map(|(_, a)| a)
    };
    let tcp = find(Via::Tcp).unwrap();
    let (tls, ws) = (find(Via::Tls), find(Via::Ws));
    let stop = CancellationToken::new();
    let task = tokio::spawn(bound.run(bus_link, stop.clone()));
    let keys_ = Keys::with_prefix(&prefix());
    let ingest = start_ingest(
        &TestBroker::external_view(service("ingest")),
        test_ingest_config(),
        keys_,
    )
    .await;
    let spy = subscriber(&service("spy"), "#").await;
    let st = stats.clone();
    assert!(wait_until(Duration::from_secs(10), || st.bus_up.get()).await);
    Rig {
        bus: MqttEndpoint::new("127.0.0.1", addr.port()),
        phones: MqttEndpoint::new("127.0.0.1", tcp.port()),
        tls,
        ws,
        edge: stats,
        ingest,
        spy,
        stop,
        task,
        _dir: dir,
    }
}

impl Rig {
    fn phone(&self, id: &str) -> MqttEndpoint {
        login(&self.phones, id, &device_token(id, 600))
    }

    /// Everything the spy saw on the bus so far, as (topic, payload).
    fn drain_spy(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Ok(p) = self.spy.try_recv() {
            out.push((p.topic, String::from_utf8_lossy(&p.payload).into_owned()));
        }
        out
    }

    async fn stop(self) {
        let keys = self.ingest.keys.clone();
        self.ingest.stop().await;
        stop_role("edge", self.stop, self.task).await;
        cleanup(&keys).await;
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

/// What a v4 client's CONNECT got: `Ok(())` accepted, `Err(code)` refused, `Err(None)`-ish as
/// `None` when the connection failed without a CONNACK.
async fn connect_v4(e: &MqttEndpoint, will: Option<LastWill>) -> Option<ConnectReturnCode> {
    let mut o = courier_wire::mqtt::options(e, &courier_wire::mqtt::client_id("atk", 0), 10);
    if let Some(w) = will {
        o.set_last_will(w);
    }
    let (_c, mut el) = AsyncClient::new(o, 10);
    loop {
        match tokio::time::timeout(Duration::from_secs(5), el.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(a)))) => return Some(a.code),
            Ok(Ok(_)) => {}
            Ok(Err(rumqttc::ConnectionError::ConnectionRefused(code))) => return Some(code),
            Ok(Err(_)) | Err(_) => return None,
        }
    }
}

/// The same with an MQTT 5 client.
async fn connect_v5(e: &MqttEndpoint) -> Option<m5::ConnectReturnCode> {
    let mut o = rumqttc::v5::MqttOptions::new(
        courier_wire::mqtt::client_id("atk5", 0),
        e.host.clone(),
        e.port,
    );
    if let (Some(u), Some(p)) = (&e.username, &e.password) {
        o.set_credentials(u.clone(), p.clone());
    }
    let (_c, mut el) = rumqttc::v5::AsyncClient::new(o, 10);
    loop {
        match tokio::time::timeout(Duration::from_secs(5), el.poll()).await {
            Ok(Ok(rumqttc::v5::Event::Incoming(rumqttc::v5::Incoming::ConnAck(a)))) => {
                return Some(a.code)
            }
            Ok(Ok(_)) => {}
            Ok(Err(rumqttc::v5::ConnectionError::ConnectionRefused(code))) => return Some(code),
            Ok(Err(_)) | Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_are_refused_with_the_proper_codes_and_counted() {
    let r = rig(RigOptions::default()).await;
    let a = device_token("ca", 600);
    let expired = sign(&Claims::courier("ca", now() - 7200, 600));
    // Another key under the real key's id: the signature does not match.
    let kid = test_verifier(Audience::Courier).kids()[0].to_string();
    let forger = SigningKey::parse(
        Audience::Courier,
        &format!(
            r#"{{"kty":"OKP","crv":"Ed25519","kid":"{kid}","x":"{}","d":"{}"}}"#,
            "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",
            "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"
        ),
    )
    .unwrap();
    let forged = forger.sign(&Claims::courier("ca", now(), 600));
    // Valid tokens of the other audiences, signed with their real keys: a worker's bus token,
    // a customer's tracking token, a support actor's trail token.
    let service = sign(&Claims::bus("ingest", now(), 600));
    let viewer = sign(&Claims::viewer("ca", "o1", now(), 600));
    let trail = sign(&Claims::trail("ca", now(), 600));
    use ConnectReturnCode::{BadUserNamePassword as Bad, NotAuthorized as Denied};
    for (ep, want, why) in [
        (r.phones.clone(), Bad, "anonymous"),
        (login(&r.phones, "ca", "not-a-token"), Bad, "garbage"),
        (login(&r.phones, "ca", &expired), Bad, "expired"),
        (login(&r.phones, "ca", &forged), Bad, "forged"),
        (login(&r.phones, "cb", &a), Denied, "A's token as B"),
        (
            login(&r.phones, "ingest", &service),
            Bad,
            "a worker's bus token",
        ),
        (login(&r.phones, "ca", &viewer), Bad, "a tracking token"),
        (login(&r.phones, "ca", &trail), Bad, "a trail token"),
    ] {
        assert_eq!(connect_v4(&ep, None).await, Some(want), "{why}");
    }
    // A Will on another courier's status (to evict him when A drops) or retained.
    for w in [
        LastWill::new(status_topic("cb"), "offline", QoS::AtMostOnce, false),
        LastWill::new(status_topic("ca"), "offline", QoS::AtMostOnce, true),
        LastWill::new("track/o1", "x", QoS::AtMostOnce, false),
    ] {
        assert_eq!(
            connect_v4(&login(&r.phones, "ca", &a), Some(w.clone())).await,
            Some(Denied),
            "{w:?}"
        );
    }
    use m5::ConnectReturnCode as C5;
    assert_eq!(
        connect_v5(&login(&r.phones, "ca", "nope")).await,
        Some(C5::BadUserNamePassword)
    );
    assert_eq!(
        connect_v5(&login(&r.phones, "cb", &a)).await,
        Some(C5::NotAuthorized)
    );
    assert_eq!(
        connect_v5(&login(&r.phones, "ca", &a)).await,
        Some(C5::Success)
    );
    assert_eq!(
        connect_v4(&login(&r.phones, "ca", &a), None).await,
        Some(ConnectReturnCode::Success)
    );
    let e = &r.edge;
    // anonymous, garbage, forged, bus, tracking and trail tokens (3.1.1), garbage (5)
    assert_eq!(e.refused(Refusal::BadToken), 7);
    assert_eq!(e.refused(Refusal::ExpiredToken), 1);
    // A's token as B (3.1.1 and 5)
    assert_eq!(e.refused(Refusal::WrongCourier), 2);
    assert_eq!(e.refused(Refusal::Will), 3);
    // The bus itself admits workers only: a courier's valid token is refused there.
    let bus_as_courier = login(&r.bus, "ca", &a);
    assert_ne!(
        connect_v4(&bus_as_courier, None).await,
        Some(ConnectReturnCode::Success)
    );
    r.stop().await;
}

/// A logged-in courier A: reads nothing, cannot move, forge or evict B, cannot publish tracks,
/// retained messages or QoS 2; B's points all reach ingest (none taken away by A).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_token_reads_nothing_and_moves_no_one() {
    let mut r = rig(RigOptions::default()).await;
    let (b, _hb) = client(&r.phone("cb"), None).await;
    // A subscribes to everything an attacker would want.
    let o =
        courier_wire::mqtt::options(&r.phone("ca"), &courier_wire::mqtt::client_id("a", 0), 100);
    let (a, mut el) = AsyncClient::new(o, 100);
    let filters = [
        "#",
        "couriers/+/loc",
        "track/#",
        "$share/ingest/couriers/+/loc",
        "$share/history/couriers/+/loc",
        "$SYS/#",
    ];
    for f in filters {
        a.subscribe(f, QoS::AtMostOnce).await.unwrap();
    }
    let (tx, mut a_got) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(ev) = el.poll().await {
            let _ = tx.send(ev);
        }
    });
    let mut refused = 0;
    let mut received = 0;
    let t0 = std::time::Instant::now();
    while refused < filters.len() && t0.elapsed() < Duration::from_secs(5) {
        match tokio::time::timeout(Duration::from_millis(200), a_got.recv()).await {
            Ok(Some(Event::Incoming(Packet::SubAck(s)))) => {
                refused += s
                    .return_codes
                    .iter()
                    .filter(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure))
                    .count()
            }
            Ok(Some(Event::Incoming(Packet::Publish(_)))) => received += 1,
            _ => {}
        }
    }
    assert_eq!(refused, filters.len(), "every filter refused in SUBACK");
    // B sends 20 points; ingest gets all of them (a shared-group thief would halve this).
    let t = courier_wire::clock::unix_now() - 1.0;
    for seq in 1..=20u64 {
        publish(
            &b,
            &loc_topic("cb"),
            point("cb", 24.7, 46.7, t + seq as f64 * 0.01, seq),
        )
        .await;
    }
    let st = r.ingest.stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || st.accepted.load(Relaxed)
            + st.stale.load(Relaxed)
            >= 20)
        .await,
        "B's points did not all reach ingest"
    );
    // A negative: time for a leak to A to show up (nothing to wait for when nothing comes).
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(ev) = a_got.try_recv() {
        if matches!(ev, Event::Incoming(Packet::Publish(_))) {
            received += 1;
        }
    }
    assert_eq!(received, 0, "A received messages");
    let mut redis = redis().await;
    let b_at = geopos(&mut redis, &r.ingest.keys, "cb").await.unwrap();
    let before = r.drain_spy();
    assert!(
        before.iter().all(|(t, _)| t.starts_with("couriers/cb/")),
        "{before:?}"
    );

    // Each forbidden publish, on its own connection of A (3.1.1 closes on the first).
    let forge = |topic: &str, payload: Vec<u8>, retain: bool, qos: QoS| {
        let ep = r.phone("ca");
        let topic = topic.to_string();
        async move {
            let (c, h) = client(&ep, None).await;
            c.publish(topic, qos, retain, payload).await.unwrap();
            // The edge closes the connection: the event loop ends.
            tokio::time::timeout(Duration::from_secs(5), h)
                .await
                .is_ok()
        }
    };
    let far = point("cb", 21.5, 39.2, t + 5.0, 1000);
    assert!(
        forge(&loc_topic("cb"), far.clone(), false, QoS::AtMostOnce).await,
        "B's loc"
    );
    assert!(
        forge(
            &status_topic("cb"),
            b"offline".to_vec(),
            false,
            QoS::AtMostOnce
        )
        .await,
        "B's status"
    );
    assert!(
        forge(
            "track/o1",
            b"{\"lat\":1,\"lon\":1,\"ts\":1}".to_vec(),
            false,
            QoS::AtMostOnce
        )
        .await,
        "a track"
    );
    assert!(
        forge(
            &loc_topic("ca"),
            point("ca", 24.7, 46.7, t, 1),
            true,
            QoS::AtMostOnce
        )
        .await,
        "retained"
    );
    assert!(
        forge(
            &loc_topic("ca"),
            point("ca", 24.7, 46.7, t, 2),
            false,
            QoS::ExactlyOnce
        )
        .await,
        "QoS 2"
    );
    // A negative: time for a refused publish to reach the bus if it were let through.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leaked = r.drain_spy();
    assert!(leaked.is_empty(), "reached the bus: {leaked:?}");
    assert_eq!(
        geopos(&mut redis, &r.ingest.keys, "cb").await.unwrap(),
        b_at,
        "B moved"
    );
    let e = &r.edge;
    assert_eq!(e.refused(Refusal::Topic), 3);
    assert_eq!(e.refused(Refusal::Retain), 1);
    assert_eq!(e.refused(Refusal::Qos), 1);
    assert_eq!(e.refused(Refusal::Subscribe), filters.len() as u64);
    // MQTT 5: a QoS 1 publish on B's topic gets PUBACK 0x87 and the connection stays.
    let ep = r.phone("ca");
    let mut o = rumqttc::v5::MqttOptions::new("a5", ep.host.clone(), ep.port);
    o.set_credentials("ca", ep.password.clone().unwrap());
    let (c5, mut el5) = rumqttc::v5::AsyncClient::new(o, 10);
    c5.publish(
        loc_topic("cb"),
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        false,
        far,
    )
    .await
    .unwrap();
    c5.publish(
        loc_topic("ca"),
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        false,
        point("ca", 24.71, 46.71, t + 1.0, 3),
    )
    .await
    .unwrap();
    let mut acks = Vec::new();
    while acks.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(5), el5.poll()).await {
            Ok(Ok(rumqttc::v5::Event::Incoming(rumqttc::v5::Incoming::PubAck(a)))) => {
                acks.push(a.reason)
            }
            Ok(Ok(_)) => {}
            other => panic!("v5 connection ended: {other:?}"),
        }
    }
    assert_eq!(
        acks,
        [m5::PubAckReason::NotAuthorized, m5::PubAckReason::Success]
    );
    // Exactly one through: time for the refused one to arrive too, were it let through.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let through = r.drain_spy();
    assert_eq!(through.len(), 1, "{through:?}");
    assert_eq!(through[0].0, loc_topic("ca"));
    assert_eq!(
        geopos(&mut redis, &r.ingest.keys, "cb").await.unwrap(),
        b_at
    );
    r.stop().await;
}

/// The edge enforces the token's expiry inside the session and publishes the Will; an abrupt
/// drop publishes the Will; a DISCONNECT does not; a second login takes over without a Will.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_drops_and_takeovers_handle_the_will() {
    let mut r = rig(RigOptions::default()).await;
    let will = |id: &str| LastWill::new(status_topic(id), "offline", QoS::AtMostOnce, false);
    // Expires in 2 s while connected.
    let short = login(&r.phones, "cx", &device_token("cx", 2));
    let (_c, h) = client(&short, Some(will("cx"))).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(6), h)
            .await
            .is_ok(),
        "an expired token kept its connection"
    );
    assert_eq!(r.edge.refused(Refusal::ExpiredToken), 1);
    // Abrupt drop: the event loop task is aborted, the socket closes without DISCONNECT.
    let (_c2, h2) = client(&r.phone("cy"), Some(will("cy"))).await;
    h2.abort();
    // Clean DISCONNECT: no Will.
    let (c3, _h3) = client(&r.phone("cz"), Some(will("cz"))).await;
    c3.disconnect().await.unwrap();
    // Takeover: the second login of cw closes the first, without its Will.
    let (_c4, h4) = client(&r.phone("cw"), Some(will("cw"))).await;
    let (_c5, _h5) = client(&r.phone("cw"), Some(will("cw"))).await;
    assert!(tokio::time::timeout(Duration::from_secs(5), h4)
        .await
        .is_ok());
    // cx's and cy's Wills must arrive, and a wrongly published one (cz, cw) would meanwhile:
    // a negative has no state to wait for.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let seen = r.drain_spy();
    let offline: Vec<&str> = seen
        .iter()
        .filter(|(_, p)| p == "offline")
        .map(|(t, _)| t.as_str())
        .collect();
    assert_eq!(
        offline,
        [status_topic("cx"), status_topic("cy")],
        "{seen:?}"
    );
    assert_eq!(r.edge.wills.load(Relaxed), 2);
    assert_eq!(r.edge.takeovers.load(Relaxed), 1);
    r.stop().await;
}

/// Over the courier's rate: dropped and counted, the connection kept. Through a separate
/// edge forwarding over MQTT this time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_drops_and_counts_and_keeps_the_connection() {
    let r = rig(RigOptions {
        in_process: false,
        edge: EdgeConfig {
            listen: "127.0.0.1:0".into(),
            reuse_port: false,
            rate_per_second: 2.0,
            rate_burst: 5.0,
            ..EdgeConfig::default()
        },
        tls: false,
    })
    .await;
    let (c, h) = client(&r.phone("cr"), None).await;
    let t = courier_wire::clock::unix_now() - 1.0;
    for seq in 1..=20u64 {
        publish(
            &c,
            &loc_topic("cr"),
            point("cr", 24.7, 46.7, t + seq as f64 * 0.01, seq),
        )
        .await;
    }
    let e = r.edge.clone();
    assert!(
        wait_until(Duration::from_secs(5), || e.forwarded.load(Relaxed)
            + e.rate_limited.load(Relaxed)
            >= 20)
        .await
    );
    assert_eq!(e.forwarded.load(Relaxed), 5);
    assert_eq!(e.rate_limited.load(Relaxed), 15);
    // Points of one courier in one batch: the newest is accepted, the others stale.
    let st = r.ingest.stats.clone();
    let judged = move || st.accepted.load(Relaxed) + st.stale.load(Relaxed);
    assert!(wait_until(Duration::from_secs(5), || judged() == 5).await);
    // A second later the bucket has room again, on the same connection.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    publish(&c, &loc_topic("cr"), point("cr", 24.7, 46.7, t + 1.0, 100)).await;
    assert!(wait_until(Duration::from_secs(5), || judged() == 6).await);
    assert!(!h.is_finished());
    r.stop().await;
}

/// TLS and WebSocket carry a phone's points; one idle TCP connection on the TLS port does not
/// delay another phone's login; an oversize packet is refused before CONNECT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_websocket_carry_points_and_idle_handshakes_block_no_one() {
    let r = rig(RigOptions {
        tls: true,
        ..RigOptions::default()
    })
    .await;
    let tls = r.tls.unwrap();
    let _idle = std::net::TcpStream::connect(tls).unwrap();
    let ca = std::fs::read(r._dir.join("ca.crt")).unwrap();
    let ep = MqttEndpoint {
        tls: true,
        ca_pem: Some(ca),
        ..login(
            &MqttEndpoint::new("localhost", tls.port()),
            "ct",
            &device_token("ct", 600),
        )
    };
    let started = std::time::Instant::now();
    let (c, _h) = client(&ep, None).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "TLS login waited for the idle socket"
    );
    let t = courier_wire::clock::unix_now() - 1.0;
    publish(&c, &loc_topic("ct"), point("ct", 24.7, 46.7, t, 1)).await;
    // WebSocket: rumqttc's websocket transport on /mqtt.
    let ws = r.ws.unwrap();
    let mut o = rumqttc::MqttOptions::new(
        "ws-phone",
        format!("ws://127.0.0.1:{}/mqtt", ws.port()),
        ws.port(),
    );
    o.set_transport(rumqttc::Transport::Ws);
    o.set_credentials("cv", device_token("cv", 600));
    let (wc, mut wel) = AsyncClient::new(o, 10);
    wc.publish(
        loc_topic("cv"),
        QoS::AtMostOnce,
        false,
        point("cv", 24.8, 46.8, t, 1),
    )
    .await
    .unwrap();
    tokio::spawn(async move { while wel.poll().await.is_ok() {} });
    let st = r.ingest.stats.clone();
    assert!(wait_until(Duration::from_secs(10), || st.accepted.load(Relaxed) == 2).await);
    // A header announcing a 100 MB packet, before any CONNECT: closed at once, counted.
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect(r.phones.host.clone() + ":" + &r.phones.port.to_string())
            .unwrap();
    s.write_all(&[0x10, 0xFF, 0xFF, 0xFF, 0x7F]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut byte = [0u8; 1];
    assert!(
        matches!(s.read(&mut byte), Ok(0)),
        "oversize CONNECT not closed"
    );
    assert_eq!(r.edge.refused(Refusal::TooLarge), 1);
    assert_eq!(r.edge.logins.load(Relaxed), 2);
    r.stop().await;
}

/// `courier-pipeline token courier` mints what the edge admits, for that courier only. Key
/// rotation by kid: a new courier.key signs while the old public key is still listed
/// (courier.<label>.pub), so tokens of both log in; once the old file is gone, old tokens
/// are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_minted_courier_tokens_log_in_and_survive_rotation() {
    const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");
    let dir = std::env::temp_dir().join(format!("rotation-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let write_key = |k: &SigningKey| {
        std::fs::write(dir.join("courier.key"), k.to_pem()).unwrap();
        std::fs::write(dir.join("courier.pub"), k.public().to_pem()).unwrap();
    };
    let mint = |id: &str| cli_token_with(&dir, &["courier", "--id", id, "--ttl", "10m"]);
    let first = SigningKey::generate(Audience::Courier).unwrap();
    write_key(&first);
    let old = mint("c9");
    // Rotate: the new key signs, the old public key stays for the old tokens.
    let second = SigningKey::generate(Audience::Courier).unwrap();
    write_key(&second);
    std::fs::write(dir.join("courier.first.pub"), first.public().to_pem()).unwrap();
    let new = mint("c9");
    let signed_by = |t: &str, k: &SigningKey| {
        courier_auth::Verifier::new(Audience::Courier, [k.public().clone()])
            .unwrap()
            .verify(t, now())
            .is_ok()
    };
    assert!(signed_by(&old, &first) && !signed_by(&old, &second));
    assert!(signed_by(&new, &second) && !signed_by(&new, &first));
    let edge_keys = |dir: &std::path::Path| {
        KeySet::load(dir, &[])
            .unwrap()
            .verifier(Audience::Courier)
            .unwrap()
            .clone()
    };
    let (ep, stop, task) = bare_edge(edge_keys(&dir));
    assert_eq!(
        connect_v4(&login(&ep, "c9", &old), None).await,
        Some(ConnectReturnCode::Success)
    );
    assert_eq!(
        connect_v4(&login(&ep, "c9", &new), None).await,
        Some(ConnectReturnCode::Success)
    );
    assert_eq!(
        connect_v4(&login(&ep, "c10", &new), None).await,
        Some(ConnectReturnCode::NotAuthorized)
    );
    stop_role("edge", stop, task).await;
    // The old key retired: its tokens no longer log in, the new ones do.
    std::fs::remove_file(dir.join("courier.first.pub")).unwrap();
    let (ep, stop, task) = bare_edge(edge_keys(&dir));
    assert_eq!(
        connect_v4(&login(&ep, "c9", &old), None).await,
        Some(ConnectReturnCode::BadUserNamePassword)
    );
    assert_eq!(
        connect_v4(&login(&ep, "c9", &new), None).await,
        Some(ConnectReturnCode::Success)
    );
    stop_role("edge", stop, task).await;
    let out = Command::new(BIN)
        .args(["token", "courier", "--id", "c9"])
        .env_remove("AUTH_KEY_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An edge with no bus behind it, checking device tokens with `keys`.
#[allow(clippy::type_complexity)]
fn bare_edge(
    keys: courier_auth::Verifier,
) -> (
    MqttEndpoint,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), edge::EdgeError>>,
) {
    let mut bound = Edge {
        settings: EdgeConfig {
            listen: "127.0.0.1:0".into(),
            reuse_port: false,
            ..EdgeConfig::default()
        }
        .validate()
        .unwrap(),
        keys,
        stats: Default::default(),
    }
    .bind()
    .unwrap();
    let addr = bound.local_addrs()[0].1;
    let queue = bound.take_queue();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let task = tokio::spawn(async move {
        let _queue = queue;
        bound.run(None, s).await
    });
    (MqttEndpoint::new("127.0.0.1", addr.port()), stop, task)
}

/// The deployment split of docs/security.md as separate processes: a bus given `bus.pub` only,
/// an edge given `courier.pub` only and a bus token in MQTT_TOKEN. Neither holds a private key,
/// yet a phone's point reaches a worker on the bus; and the edge's directory mints nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_and_a_bus_without_private_keys_carry_a_phones_point() {
    const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");
    let root = std::env::temp_dir().join(format!("split-{:x}", rand::random::<u64>()));
    let only = |name: &str, files: &[&str]| {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in files {
            std::fs::copy(test_key_dir().join(f), d.join(f)).unwrap();
        }
        d
    };
    let (bus_dir, edge_dir) = (only("bus", &["bus.pub"]), only("edge", &["courier.pub"]));
    // The bus is rumqttd, which cannot report a port 0: chosen here. The edge binds port 0.
    let bus = free_addr();
    let spawn = |args: &[&str], dir: &std::path::Path| {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("AUTH_KEY_DIR", dir)
            .env_remove("MQTT_TOKEN")
            .env("MQTT_LISTEN", bus.to_string())
            .env("EDGE_LISTEN", "127.0.0.1:0")
            .env("METRICS_LISTEN", "off")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c
    };
    // Each reports once it listens.
    let mut cmd = spawn(&["broker"], &bus_dir);
    let bus_report = ListenReport::on(&mut cmd);
    let mut bus_proc = cmd.spawn().unwrap();
    assert_eq!(bus_report.wait(&mut bus_proc, "bus").get("broker"), bus);
    let edge_token = sign(&Claims::bus("edge", now(), 600));
    let mut cmd = spawn(&["edge"], &edge_dir);
    cmd.env("MQTT_URL", format!("mqtt://{bus}"))
        .env("MQTT_TOKEN", &edge_token);
    let edge_report = ListenReport::on(&mut cmd);
    let mut edge_proc = cmd.spawn().unwrap();
    let phones = edge_report.wait(&mut edge_proc, "edge").get("edge.tcp");
    let spy_login = login(
        &MqttEndpoint::new("127.0.0.1", bus.port()),
        "spy",
        &sign(&Claims::bus("spy", now(), 600)),
    );
    let mut spy = subscriber(&spy_login, "couriers/+/loc").await;
    let phone = login(
        &MqttEndpoint::new("127.0.0.1", phones.port()),
        "cs",
        &device_token("cs", 600),
    );
    let (c, _h) = client(&phone, None).await;
    // The edge may still be logging in to the bus: send until the point is seen.
    let mut seen = None;
    for seq in 1..=50 {
        publish(
            &c,
            &loc_topic("cs"),
            point("cs", 24.7, 46.7, now() as f64, seq),
        )
        .await;
        if let Ok(Some(p)) = tokio::time::timeout(Duration::from_millis(200), spy.recv()).await {
            seen = Some(p);
            break;
        }
    }
    assert_eq!(
        seen.expect("the point never reached the bus").topic,
        "couriers/cs/loc"
    );
    for p in [&mut bus_proc, &mut edge_proc] {
        let _ = p.kill();
        let _ = p.wait();
    }
    // What an attacker who owns the edge's key directory can mint: nothing.
    for aud in ["courier --id cs", "trail --actor x", "bus --role ingest"] {
        let out = Command::new(BIN)
            .arg("token")
            .args(aud.split(' '))
            .env("AUTH_KEY_DIR", &edge_dir)
            .output()
            .unwrap();
        assert!(!out.status.success() && out.stdout.is_empty(), "{aud}");
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// Off shift (privacy): after the courier's own `offline`, his points are dropped at the edge
/// (counted `off_shift`): none reaches the bus, ingest or the live index, also after he
/// reconnects, until his next `online`. A Last Will `offline` (lost network) is not the end of a
/// shift: after such a drop his points flow again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_his_own_offline_a_couriers_points_go_nowhere_until_online() {
    let mut r = rig(RigOptions::default()).await;
    let t = || courier_wire::clock::unix_now();
    let mut seq = 0u64;
    let mut next = || {
        seq += 1;
        seq
    };
    let status = |c: &AsyncClient, s: &'static str| {
        let c = c.clone();
        async move {
            c.publish(status_topic("cs"), QoS::AtMostOnce, false, s)
                .await
                .unwrap()
        }
    };
    let (c, h) = client(&r.phone("cs"), None).await;
    publish(&c, &loc_topic("cs"), point("cs", 24.7, 46.7, t(), next())).await;
    let st = r.ingest.stats.clone();
    assert!(wait_until(Duration::from_secs(5), || st.accepted.load(Relaxed) == 1).await);
    // The shift ends; the app keeps publishing (the case this is for), then reconnects.
    status(&c, "offline").await;
    for _ in 0..5 {
        publish(&c, &loc_topic("cs"), point("cs", 24.8, 46.8, t(), next())).await;
    }
    let e = r.edge.clone();
    assert!(
        wait_until(Duration::from_secs(5), || e.off_shift.load(Relaxed) == 5).await,
        "off-shift points counted: {}",
        e.off_shift.load(Relaxed)
    );
    h.abort();
    // Back with a Will this time, as apps connect.
    let will = LastWill::new(status_topic("cs"), "offline", QoS::AtMostOnce, false);
    let (c, h) = client(&r.phone("cs"), Some(will)).await;
    for _ in 0..5 {
        publish(&c, &loc_topic("cs"), point("cs", 24.9, 46.9, t(), next())).await;
    }
    assert!(
        wait_until(Duration::from_secs(5), || e.off_shift.load(Relaxed) == 10).await,
        "off-shift points counted: {}",
        e.off_shift.load(Relaxed)
    );
    // A negative: time for an off-shift point to reach the bus, were it forwarded.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = r.drain_spy();
    let locs = seen
        .iter()
        .filter(|(topic, _)| topic.ends_with("/loc"))
        .count();
    assert_eq!(locs, 1, "an off-shift point reached the bus: {seen:?}");
    assert_eq!(st.accepted.load(Relaxed), 1);
    let mut redis = redis().await;
    assert_eq!(
        geopos(&mut redis, &r.ingest.keys, "cs").await,
        None,
        "still live off shift"
    );
    // A new shift: points flow again.
    status(&c, "online").await;
    publish(&c, &loc_topic("cs"), point("cs", 24.71, 46.71, t(), next())).await;
    assert!(wait_until(Duration::from_secs(5), || st.accepted.load(Relaxed) == 2).await);
    // A lost network (the edge publishes his Will `offline`) does not end the shift.
    let wills = r.edge.wills.load(Relaxed);
    h.abort();
    let e2 = r.edge.clone();
    assert!(wait_until(Duration::from_secs(5), || e2.wills.load(Relaxed) > wills).await);
    let (c, _h) = client(&r.phone("cs"), None).await;
    publish(&c, &loc_topic("cs"), point("cs", 24.72, 46.72, t(), next())).await;
    assert!(
        wait_until(Duration::from_secs(5), || st.accepted.load(Relaxed) == 3).await,
        "a Will ended the shift"
    );
    assert_eq!(e.off_shift.load(Relaxed), 10);
    r.stop().await;
}
