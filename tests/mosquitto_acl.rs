//! The Mosquitto configuration of `broker-config/mosquitto/` as shipped (only paths and ports
//! changed): couriers may publish only their own topics, anonymous and wrong passwords are
//! refused, and a worker group of two shares the points.

mod support;

use courier_wire::{loc_topic, Keys, MqttEndpoint};
use rumqttc::{AsyncClient, ConnectReturnCode, Event, Packet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use support::*;

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts Mosquitto with the repository's mosquitto.conf and acl; returns the broker and the
/// endpoint of its plain loopback listener (no credentials).
fn start_configured_mosquitto() -> (TestBroker, MqttEndpoint) {
    let repo = repo_root().join("broker-config/mosquitto");
    let dir = std::env::temp_dir().join(format!("mosq-acl-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(dir.join("certs")).unwrap();
    let passwd = dir.join("passwd");
    for (i, (user, pass)) in [
        ("ingest", "ingest-secret"),
        ("c-a", "a-secret"),
        ("c-b", "b-secret"),
    ]
    .iter()
    .enumerate()
    {
        let mut c = Command::new("mosquitto_passwd");
        if i == 0 {
            c.arg("-c");
        }
        run(c.arg("-b").arg(&passwd).arg(user).arg(pass));
    }
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(dir.join("certs/server.key"))
        .arg("-out")
        .arg(dir.join("certs/server.crt")));
    std::fs::copy(repo.join("acl"), dir.join("acl")).unwrap();
    let (plain, tls, ws) = (free_addr(), free_addr(), free_addr());
    let conf = std::fs::read_to_string(repo.join("mosquitto.conf"))
        .unwrap()
        .replace("/etc/mosquitto/", &format!("{}/", dir.display()))
        .replace(
            "listener 1883 127.0.0.1",
            &format!("listener {} 127.0.0.1", plain.port()),
        )
        .replace(
            "listener 8883",
            &format!("listener {} 127.0.0.1", tls.port()),
        )
        .replace(
            "listener 8084",
            &format!("listener {} 127.0.0.1", ws.port()),
        );
    // Run as the current user (root in CI): Mosquitto would otherwise switch to its own user,
    // which cannot read a temporary directory's files.
    let conf = format!("user {}\n{conf}", whoami());
    std::fs::write(dir.join("mosquitto.conf"), conf).unwrap();
    let child = Command::new(mosquitto_bin())
        .arg("-c")
        .arg(dir.join("mosquitto.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    for addr in [plain, tls, ws] {
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let endpoint = MqttEndpoint::new("127.0.0.1", plain.port());
    (TestBroker::external(endpoint.clone(), child, dir), endpoint)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn couriers_publish_only_their_own_topics_and_workers_share_the_load() {
    assert!(
        Path::new("/usr/bin/mosquitto_passwd").exists() || which("mosquitto_passwd"),
        "mosquitto_passwd missing"
    );
    let (broker, plain) = start_configured_mosquitto();

    // Nobody without a password; no wrong password.
    assert_ne!(connack(&plain).await, ConnectReturnCode::Success);
    assert_ne!(
        connack(&with_user(&plain, "c-a", "wrong")).await,
        ConnectReturnCode::Success
    );
    assert_eq!(
        connack(&with_user(&plain, "c-a", "a-secret")).await,
        ConnectReturnCode::Success
    );

    // Two ingest workers, each its own process-like instance, with the service account.
    let keys = Keys::with_prefix(&prefix());
    let worker_broker = TestBroker::external_view(with_user(&plain, "ingest", "ingest-secret"));
    let w1 = start_ingest(&worker_broker, test_ingest_config(), keys.clone()).await;
    let w2 = start_ingest(&worker_broker, test_ingest_config(), keys.clone()).await;

    let (a, _ha) = client(&with_user(&plain, "c-a", "a-secret"), None).await;
    let t = courier_wire::clock::unix_now() - 30.0;
    // Courier A tries to move courier B: the broker drops it (ACL), B never appears.
    publish(&a, &loc_topic("c-b"), point("c-b", 24.7, 46.7, t, 1)).await;
    // His own points go through, to both workers in turn.
    let n = 200u64;
    for i in 1..=n {
        publish(
            &a,
            &loc_topic("c-a"),
            point("c-a", 24.7, 46.7 + i as f64 * 1e-4, t + i as f64 * 0.01, i),
        )
        .await;
    }
    let (s1, s2) = (w1.stats.clone(), w2.stats.clone());
    assert!(
        wait_until(Duration::from_secs(10), || s1.settled() + s2.settled() >= n).await,
        "workers settled {} of {n}",
        s1.settled() + s2.settled()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut r = redis().await;
    assert!(
        geopos(&mut r, &keys, "c-b").await.is_none(),
        "courier A moved courier B"
    );
    assert!(geopos(&mut r, &keys, "c-a").await.is_some());
    let (p1, p2) = (s1.received.load(Relaxed), s2.received.load(Relaxed));
    assert_eq!(
        p1 + p2,
        n,
        "each point reaches exactly one worker of the group"
    );
    assert!(p1 > n / 4 && p2 > n / 4, "load not shared: {p1} / {p2}");
    w1.stop().await;
    w2.stop().await;
    cleanup(&keys).await;
    drop(broker);
}

fn which(bin: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {bin}"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}
