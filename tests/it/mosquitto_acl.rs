//! The Mosquitto configuration of `broker-config/mosquitto/` as shipped (only paths and ports
//! changed), as the pipeline's internal bus: only the service users log in (ingest, history,
//! fanout, edge), each with exactly its rights, and nobody can join a worker's `$share` group he
//! is not listed for. Couriers and customers never reach this broker (they connect to the edge);
//! these tests play an attacker holding a valid-but-wrong service credential.

use crate::support;

use courier_wire::topic::{loc_filter, status_filter};
use courier_wire::{loc_topic, status_topic, track_topic, Keys, MqttEndpoint};
use history_writer::HistoryConfig;
use ingest::IngestConfig;
use rumqttc::{AsyncClient, ConnectReturnCode, Event, Packet, Publish, QoS, SubscribeReasonCode};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use support::*;
use tokio::sync::mpsc;

const SERVICE_USERS: [&str; 4] = ["ingest", "history", "fanout", "edge"];

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn shipped(file: &str) -> PathBuf {
    repo_root().join("broker-config/mosquitto").join(file)
}

/// A Mosquitto started with the repository's mosquitto.conf and dynamic-security.json, a
/// password file with the four service users (random secrets) and a throwaway certificate.
struct Bus {
    _broker: TestBroker,
    plain: MqttEndpoint,
    dynsec: PathBuf,
    secrets: Vec<(&'static str, String)>,
}

impl Bus {
    fn start() -> Bus {
        let dir = std::env::temp_dir().join(format!("mosq-bus-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(dir.join("certs")).unwrap();
        let passwd = dir.join("passwd");
        let mut secrets = Vec::new();
        for (i, user) in SERVICE_USERS.into_iter().enumerate() {
            let secret = format!("{user}-{:016x}", rand::random::<u64>());
            let mut c = Command::new("mosquitto_passwd");
            if i == 0 {
                c.arg("-c");
            }
            run(c.arg("-b").arg(&passwd).arg(user).arg(&secret));
            secrets.push((user, secret));
        }
        // certs/server.crt and certs/server.key, as the shipped config names them.
        throwaway_tls(&dir.join("certs"));
        let dynsec = dir.join("dynamic-security.json");
        std::fs::copy(shipped("dynamic-security.json"), &dynsec).unwrap();
        // Mosquitto cannot report a port 0 it got: the ports are chosen here.
        let (plain, tls) = (free_addr(), free_addr());
        let conf = std::fs::read_to_string(shipped("mosquitto.conf"))
            .unwrap()
            .replace("/etc/mosquitto/", &format!("{}/", dir.display()))
            .replace(
                "listener 1884 127.0.0.1",
                &format!("listener {} 127.0.0.1", plain.port()),
            )
            .replace(
                "listener 8883",
                &format!("listener {} 127.0.0.1", tls.port()),
            );
        // Run as the current user (root in CI): Mosquitto would otherwise switch to its own
        // user, which cannot read a temporary directory's files.
        let conf = format!("user {}\n{conf}", whoami());
        std::fs::write(dir.join("mosquitto.conf"), conf).unwrap();
        let mut child = Command::new(mosquitto_bin())
            .arg("-c")
            .arg(dir.join("mosquitto.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        for addr in [plain, tls] {
            while std::net::TcpStream::connect(addr).is_err() {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!(
                        "mosquitto exited ({status}): is mosquitto_dynamic_security.so installed?"
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "mosquitto did not listen on {addr}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let endpoint = MqttEndpoint::new("127.0.0.1", plain.port());
        Bus {
            _broker: TestBroker::external(endpoint.clone(), child, dir),
            plain: endpoint,
            dynsec,
            secrets,
        }
    }

    /// The plain listener with `user`'s real password.
    fn login(&self, user: &str) -> MqttEndpoint {
        let (_, secret) = self.secrets.iter().find(|(u, _)| *u == user).unwrap();
        with_user(&self.plain, user, secret)
    }
}

fn whoami() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn with_user(e: &MqttEndpoint, user: &str, pass: &str) -> MqttEndpoint {
    MqttEndpoint {
        username: Some(user.into()),
        password: Some(pass.into()),
        ..e.clone()
    }
}

/// The CONNACK code a client gets.
async fn connack(e: &MqttEndpoint) -> ConnectReturnCode {
    let o = courier_wire::mqtt::options(e, &courier_wire::mqtt::client_id("acl", 0), 10);
    let (_c, mut el) = AsyncClient::new(o, 10);
    loop {
        match tokio::time::timeout(Duration::from_secs(5), el.poll())
            .await
            .expect("no CONNACK")
        {
            Ok(Event::Incoming(Packet::ConnAck(a))) => return a.code,
            Ok(_) => {}
            Err(rumqttc::ConnectionError::ConnectionRefused(code)) => return code,
            Err(e) => panic!("{e}"),
        }
    }
}

/// One MQTT connection that subscribes filter by filter (reporting each SUBACK code), records
/// every message it is handed, and publishes at QoS 1 so the test knows when the broker has
/// processed a publish (Mosquitto acknowledges a refused QoS 1 publish too, and drops it).
struct Probe {
    client: AsyncClient,
    acks: mpsc::UnboundedReceiver<SubscribeReasonCode>,
    puback: mpsc::UnboundedReceiver<()>,
    msgs: mpsc::UnboundedReceiver<Publish>,
    closed: mpsc::UnboundedReceiver<String>,
}

impl Probe {
    async fn connect(e: &MqttEndpoint) -> Probe {
        let o = courier_wire::mqtt::options(e, &courier_wire::mqtt::client_id("probe", 0), 1000);
        let (client, mut el) = AsyncClient::new(o, 1000);
        let (ack_tx, acks) = mpsc::unbounded_channel();
        let (puback_tx, puback) = mpsc::unbounded_channel();
        let (msg_tx, msgs) = mpsc::unbounded_channel();
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let (ready_tx, mut ready) = mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = ready_tx.try_send(());
                    }
                    Ok(Event::Incoming(Packet::SubAck(a))) => {
                        for c in a.return_codes {
                            let _ = ack_tx.send(c);
                        }
                    }
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        let _ = puback_tx.send(());
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = msg_tx.send(p);
                    }
                    Ok(_) => {}
                    // The broker closed the connection: report it and stop (no reconnect).
                    Err(e) => {
                        let _ = closed_tx.send(e.to_string());
                        return;
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(5), ready.recv())
            .await
            .expect("probe did not connect");
        Probe {
            client,
            acks,
            puback,
            msgs,
            closed,
        }
    }

    /// SUBSCRIBE one filter; the broker's answer.
    async fn subscribe(&mut self, filter: &str) -> SubscribeReasonCode {
        self.client
            .subscribe(filter, QoS::AtMostOnce)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), self.acks.recv())
            .await
            .unwrap_or_else(|_| panic!("no SUBACK for {filter}"))
            .unwrap()
    }

    /// Subscribes a filter the broker must refuse.
    async fn refused(&mut self, who: &str, filter: &str) {
        assert_eq!(
            self.subscribe(filter).await,
            SubscribeReasonCode::Failure,
            "{who} was allowed to subscribe {filter}"
        );
    }

    /// Publishes at QoS 1 and waits for the broker's PUBACK (allowed or not).
    async fn publish_processed(&mut self, topic: &str, payload: Vec<u8>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), self.puback.recv())
            .await
            .unwrap_or_else(|_| panic!("no PUBACK for {topic}"))
            .unwrap();
    }

    /// Every message received so far.
    fn drain(&mut self) -> Vec<Publish> {
        let mut v = Vec::new();
        while let Ok(p) = self.msgs.try_recv() {
            v.push(p);
        }
        v
    }

    /// Waits until `n` messages have arrived (5 s at most); all of them.
    async fn take(&mut self, n: usize) -> Vec<Publish> {
        let mut v = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while v.len() < n {
            match tokio::time::timeout_at(deadline, self.msgs.recv()).await {
                Ok(Some(p)) => v.push(p),
                _ => break,
            }
        }
        v
    }
}

/// What a refused publish or subscription might still deliver arrives within this.
const GRACE: Duration = Duration::from_millis(300);

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The `acltype` entries (allowed topics) of one role of the shipped dynamic-security.json.
fn role_topics(j: &serde_json::Value, role: &str, acltype: &str) -> BTreeSet<String> {
    let r = j["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rolename"] == role)
        .unwrap_or_else(|| panic!("no role {role}"));
    r["acls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["acltype"] == acltype)
        .map(|a| {
            assert_eq!(a["allow"], true, "{role}: a deny entry");
            a["topic"].as_str().unwrap().to_string()
        })
        .collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The shipped rights are exactly the filters the workers' code subscribes with (their default
/// group names), and nothing else: no default access, no secrets, no acl_file next to the
/// plugin, no $CONTROL rights.
#[test]
fn shipped_rights_are_exactly_the_worker_filters() {
    let j = json(&shipped("dynamic-security.json"));
    let d = &j["defaultACLAccess"];
    for k in ["publishClientSend", "publishClientReceive", "subscribe"] {
        assert_eq!(d[k], false, "defaultACLAccess.{k}");
    }
    let users: BTreeSet<String> = j["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert!(
                c.get("password").is_none() && c.get("salt").is_none(),
                "a secret in the repository"
            );
            assert_eq!(c["roles"].as_array().unwrap().len(), 1);
            assert_eq!(c["roles"][0]["rolename"], c["username"]);
            c["username"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(users, set(&SERVICE_USERS));
    assert!(j["groups"].as_array().unwrap().is_empty());

    let ingest = IngestConfig::default();
    let history = HistoryConfig::default();
    let expect: [(&str, &str, BTreeSet<String>); 12] = [
        (
            "ingest",
            "subscribeLiteral",
            [
                loc_filter(&ingest.group),
                status_filter(&ingest.status_group),
                loc_filter(""),
                status_filter(""),
            ]
            .into(),
        ),
        (
            "ingest",
            "publishClientReceive",
            set(&["couriers/+/loc", "couriers/+/status"]),
        ),
        ("ingest", "publishClientSend", set(&["track/+"])),
        (
            "history",
            "subscribeLiteral",
            [loc_filter(&history.group), loc_filter("")].into(),
        ),
        ("history", "publishClientReceive", set(&["couriers/+/loc"])),
        ("history", "publishClientSend", set(&[])),
        ("fanout", "subscribeLiteral", set(&["track/+"])),
        ("fanout", "publishClientReceive", set(&["track/+"])),
        ("fanout", "publishClientSend", set(&[])),
        ("edge", "subscribeLiteral", set(&[])),
        ("edge", "publishClientReceive", set(&[])),
        (
            "edge",
            "publishClientSend",
            set(&["couriers/+/loc", "couriers/+/status"]),
        ),
    ];
    for (role, acltype, topics) in expect {
        assert_eq!(role_topics(&j, role, acltype), topics, "{role} {acltype}");
        // Patterns would let a role match group names it does not own.
        assert!(
            role_topics(&j, role, "subscribePattern").is_empty(),
            "{role}"
        );
    }
    assert!(!j.to_string().contains("$CONTROL"));

    let conf = std::fs::read_to_string(shipped("mosquitto.conf")).unwrap();
    let lines: Vec<&str> = conf
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    for needed in [
        "per_listener_settings false",
        "allow_anonymous false",
        "password_file /etc/mosquitto/passwd",
        "plugin mosquitto_dynamic_security.so",
        "plugin_opt_config_file /etc/mosquitto/dynamic-security.json",
        "retain_available false",
        "set_tcp_nodelay true",
        "listener 1884 127.0.0.1",
    ] {
        assert!(lines.contains(&needed), "mosquitto.conf lacks {needed:?}");
    }
    // Its SUBSCRIBE check always says yes and is asked before the plugin.
    assert!(!lines.iter().any(|l| l.starts_with("acl_file")));
}

/// Only the four service users, with their own password, get in. A courier-style login (his id
/// as username, any password) is refused at CONNECT: couriers log in at the edge, not here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_service_users_log_in() {
    let bus = Bus::start();
    assert_ne!(
        connack(&bus.plain).await,
        ConnectReturnCode::Success,
        "anonymous"
    );
    for (user, pass) in [
        ("c-a", "a-secret"),
        ("c-a", ""),
        ("c-a", "anything at all"),
        ("edge", "wrong"),
        ("ingest", ""),
        ("admin", "admin"),
    ] {
        assert_ne!(
            connack(&with_user(&bus.plain, user, pass)).await,
            ConnectReturnCode::Success,
            "{user} / {pass:?}"
        );
    }
    for user in SERVICE_USERS {
        assert_eq!(
            connack(&bus.login(user)).await,
            ConnectReturnCode::Success,
            "{user}"
        );
    }
}

/// Mosquitto 2.0's acl_file let any logged-in client join `$share/ingest/...` with no read right,
/// take about half the points and have them dropped at the read check. With the shipped
/// dynamic-security rights the SUBSCRIBE itself is refused: a wrong service credential (edge,
/// fanout; history in the ingest group; ingest in the history group) gets a SUBACK failure and
/// nothing, and the real members (two ingest workers, one history reader) get ALL the points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_joins_a_worker_group_he_is_not_listed_for() {
    let bus = Bus::start();
    let ingest_cfg = IngestConfig {
        workers: 2,
        ..test_ingest_config()
    };
    let ingest_loc = loc_filter(&ingest_cfg.group);
    let ingest_status = status_filter(&ingest_cfg.status_group);
    let history_loc = loc_filter(&HistoryConfig::default().group);

    // The intruders first, so that a joined intruder would be in the group from the first point.
    let mut intruders = Vec::new();
    for (user, filters) in [
        ("edge", vec![&ingest_loc, &ingest_status, &history_loc]),
        ("fanout", vec![&ingest_loc, &ingest_status, &history_loc]),
        ("history", vec![&ingest_loc, &ingest_status]),
        ("ingest", vec![&history_loc]),
    ] {
        let mut p = Probe::connect(&bus.login(user)).await;
        for f in filters {
            p.refused(user, f).await;
        }
        // A group name of its own is no way in either.
        p.refused(user, "$share/mine/couriers/+/loc").await;
        intruders.push((user, p));
    }

    // The real members: the ingest role (its own filters, both granted, or it would not start)
    // and a history reader.
    let keys = Keys::with_prefix(&prefix());
    let ingest = start_ingest(
        &TestBroker::external_view(bus.login("ingest")),
        ingest_cfg,
        keys.clone(),
    )
    .await;
    let mut history = Probe::connect(&bus.login("history")).await;
    assert!(matches!(
        history.subscribe(&history_loc).await,
        SubscribeReasonCode::Success(_)
    ));

    let (edge, _h) = client(&bus.login("edge"), None).await;
    let t = courier_wire::clock::unix_now() - 30.0;
    let n = 200u64;
    for i in 1..=n {
        publish(
            &edge,
            &loc_topic("c-a"),
            point("c-a", 24.7, 46.7 + i as f64 * 1e-4, t + i as f64 * 0.01, i),
        )
        .await;
    }
    let s = ingest.stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || s.settled() >= n).await,
        "ingest settled {} of {n}",
        s.settled()
    );
    let got = history.take(n as usize).await;
    assert_eq!(
        got.len() as u64,
        n,
        "history reader got {} of {n}",
        got.len()
    );
    tokio::time::sleep(GRACE).await;
    assert_eq!(
        s.received.load(Relaxed),
        n,
        "ingest received every point, once"
    );
    assert!(history.drain().is_empty(), "history got a point twice");
    for (user, p) in &mut intruders {
        assert!(p.drain().is_empty(), "{user} received points");
    }
    let mut r = redis().await;
    assert!(geopos(&mut r, &keys, "c-a").await.is_some());
    ingest.stop().await;
    cleanup(&keys).await;
}

/// The edge only writes: it can subscribe to nothing (`#`, the courier topics, the tracks) and
/// receives nothing of what is published. Fanout only reads tracks: what it publishes on courier
/// or track topics goes nowhere. Ingest gets the points the edge publishes; fanout gets the
/// tracks ingest publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_reads_nothing_and_fanout_publishes_nothing() {
    let bus = Bus::start();
    let mut edge = Probe::connect(&bus.login("edge")).await;
    for f in [
        "#",
        "couriers/+/loc",
        "couriers/+/status",
        "couriers/#",
        "couriers/c-a/loc",
        "track/#",
        "track/+",
        "$SYS/#",
    ] {
        edge.refused("edge", f).await;
    }
    let mut fanout = Probe::connect(&bus.login("fanout")).await;
    fanout.refused("fanout", "couriers/+/loc").await;
    fanout.refused("fanout", "#").await;
    assert!(matches!(
        fanout.subscribe("track/+").await,
        SubscribeReasonCode::Success(_)
    ));
    let mut ingest = Probe::connect(&bus.login("ingest")).await;
    for f in ["couriers/+/loc", "couriers/+/status"] {
        assert!(matches!(
            ingest.subscribe(f).await,
            SubscribeReasonCode::Success(_)
        ));
    }

    // Allowed: the edge's points and status reach ingest, ingest's track reaches fanout.
    let t = courier_wire::clock::unix_now();
    let p = point("c-a", 24.7, 46.7, t, 1);
    edge.publish_processed(&loc_topic("c-a"), p.clone()).await;
    edge.publish_processed(&status_topic("c-a"), b"online".to_vec())
        .await;
    let got = ingest.take(2).await;
    assert_eq!(got.len(), 2, "ingest got {} of the edge's 2", got.len());
    assert_eq!(got[0].payload, p);
    ingest
        .publish_processed(
            &track_topic("o1"),
            br#"{"lat":24.7,"lon":46.7,"ts":1}"#.to_vec(),
        )
        .await;
    assert_eq!(fanout.take(1).await.len(), 1, "fanout got no track");

    // Refused: the edge writes no track; fanout writes no courier topic, no track; ingest writes
    // no courier topic.
    edge.publish_processed(&track_topic("o1"), b"{}".to_vec())
        .await;
    fanout
        .publish_processed(&loc_topic("c-b"), point("c-b", 24.7, 46.7, t, 1))
        .await;
    fanout
        .publish_processed(&status_topic("c-b"), b"offline".to_vec())
        .await;
    fanout
        .publish_processed(&track_topic("o1"), b"{}".to_vec())
        .await;
    ingest
        .publish_processed(&loc_topic("c-b"), point("c-b", 24.7, 46.7, t, 1))
        .await;
    tokio::time::sleep(GRACE).await;
    assert!(edge.drain().is_empty(), "the edge read something");
    assert!(
        ingest.drain().is_empty(),
        "a refused courier publish went through"
    );
    assert!(
        fanout.drain().is_empty(),
        "a refused track publish went through"
    );
}

/// The dynamic-security plugin takes commands on `$CONTROL/dynamic-security/v1`; no user may
/// publish there, so a stolen credential cannot grant itself a role, and the file stays as
/// shipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_user_grants_himself_rights_through_control() {
    let bus = Bus::start();
    let before = std::fs::read(&bus.dynsec).unwrap();
    for user in SERVICE_USERS {
        let mut p = Probe::connect(&bus.login(user)).await;
        let cmd = format!(
            r#"{{"commands":[{{"command":"addClientRole","username":"{user}","rolename":"ingest"}},{{"command":"setDefaultACLAccess","acls":[{{"acltype":"subscribe","allow":true}},{{"acltype":"publishClientReceive","allow":true}}]}}]}}"#
        );
        p.publish_processed("$CONTROL/dynamic-security/v1", cmd.into_bytes())
            .await;
        p.refused(user, "$CONTROL/dynamic-security/#").await;
        p.refused(user, "$share/x/couriers/+/loc").await;
    }
    let mut edge = Probe::connect(&bus.login("edge")).await;
    edge.refused("edge", &loc_filter(&IngestConfig::default().group))
        .await;
    edge.refused("edge", "#").await;
    assert_eq!(
        std::fs::read(&bus.dynsec).unwrap(),
        before,
        "the rights changed"
    );
}

/// Nothing on the bus is retained: a retained PUBLISH, even on a topic the user may write, costs
/// him his connection and is not stored, so no later subscriber gets an old point as live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_publishes_are_refused() {
    let bus = Bus::start();
    let mut edge = Probe::connect(&bus.login("edge")).await;
    let t = courier_wire::clock::unix_now();
    edge.client
        .publish(
            loc_topic("c-a"),
            QoS::AtLeastOnce,
            true,
            point("c-a", 24.7, 46.7, t, 1),
        )
        .await
        .unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), edge.closed.recv())
        .await
        .expect("the broker kept a client that sent a retained message");
    assert!(closed.is_some());
    assert!(
        edge.puback.try_recv().is_err(),
        "retained publish acknowledged"
    );
    let mut ingest = Probe::connect(&bus.login("ingest")).await;
    assert!(matches!(
        ingest.subscribe("couriers/+/loc").await,
        SubscribeReasonCode::Success(_)
    ));
    tokio::time::sleep(GRACE).await;
    assert!(ingest.drain().is_empty(), "a retained point was kept");
}
