//! The embedded bus broker with logins and TLS: workers log in with a bus token under their
//! own role, nobody else, not even a courier with his valid device token (couriers log in at the edge:
//! tests/it/edge_security.rs); the TLS listener carries the same traffic, checked against a
//! throwaway certificate.

use crate::support;

use courier_auth::{Audience, Claims, SigningKey};
use courier_pipeline::broker::{self, TlsListener};
use courier_wire::{loc_topic, Keys, MqttEndpoint};
use rumqttc::{AsyncClient, Event, Packet};
use std::time::Duration;
use support::*;

fn now() -> u64 {
    courier_wire::clock::unix_now() as u64
}

/// Whether a client with these credentials gets a CONNACK (rumqttd closes refused connections
/// without one).
async fn admitted(e: &MqttEndpoint) -> bool {
    let o = courier_wire::mqtt::options(e, &courier_wire::mqtt::client_id("sec", 0), 10);
    let (_c, mut el) = AsyncClient::new(o, 10);
    loop {
        match tokio::time::timeout(Duration::from_secs(5), el.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(a)))) => {
                return a.code == rumqttc::ConnectReturnCode::Success
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                eprintln!("connection refused or failed: {e}");
                return false;
            }
            Err(_) => return false,
        }
    }
}

fn login(e: &MqttEndpoint, user: &str, pass: &str) -> MqttEndpoint {
    MqttEndpoint {
        username: Some(user.into()),
        password: Some(pass.into()),
        ..e.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_are_checked_and_tls_carries_points() {
    let dir = std::env::temp_dir().join(format!("tls-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = throwaway_tls(&dir);

    // rumqttd binds its own listeners and cannot report a port 0: chosen here.
    let (plain, tls) = (free_addr(), free_addr());
    let mut config = broker::load_config(None, plain).unwrap();
    let tls_listener = TlsListener {
        listen: tls,
        cert: cert.clone(),
        key,
    };
    broker::secure(
        &mut config,
        Some(&tls_listener),
        Some(test_verifier(Audience::Bus)),
    )
    .unwrap();
    broker::start(config, plain).unwrap();

    let plain_ep = MqttEndpoint::new("127.0.0.1", plain.port());
    let courier = sign(&Claims::courier("c7", now(), 600));
    assert!(!admitted(&plain_ep).await, "anonymous client admitted");
    assert!(
        !admitted(&login(&plain_ep, "c7", "not-a-token")).await,
        "garbage token admitted"
    );
    assert!(
        !admitted(&login(&plain_ep, "c8", &courier)).await,
        "c7's token admitted as c8"
    );
    let expired = sign(&Claims::bus("edge", now() - 7200, 600));
    assert!(
        !admitted(&login(&plain_ep, "edge", &expired)).await,
        "expired token admitted"
    );
    let forged = SigningKey::generate(Audience::Bus)
        .unwrap()
        .sign(&Claims::bus("edge", now(), 600));
    assert!(
        !admitted(&login(&plain_ep, "edge", &forged)).await,
        "forged token admitted"
    );
    assert!(
        !admitted(&login(&plain_ep, "c7", &courier)).await,
        "a courier's valid token admitted to the bus"
    );
    for (user, token, what) in [
        (
            "c7",
            sign(&Claims::viewer("c7", "o1", now(), 600)),
            "a tracking token",
        ),
        (
            "alice",
            sign(&Claims::trail("alice", now(), 600)),
            "a trail token",
        ),
    ] {
        assert!(
            !admitted(&login(&plain_ep, user, &token)).await,
            "{what} admitted"
        );
    }
    let edge_svc = sign(&Claims::bus("edge", now(), 600));
    assert!(
        !admitted(&login(&plain_ep, "ingest", &edge_svc)).await,
        "the edge's bus token admitted under another role"
    );
    assert!(
        admitted(&login(&plain_ep, "edge", &edge_svc)).await,
        "a bus token refused"
    );

    // Over TLS: the courier publishes, an ingest worker with a bus token (also over TLS)
    // takes the point into Redis.
    let tls_ep = MqttEndpoint {
        tls: true,
        ca_pem: Some(std::fs::read(&ca).unwrap()),
        ..MqttEndpoint::new("127.0.0.1", tls.port())
    };
    assert!(
        admitted(&login(&tls_ep, "edge", &edge_svc)).await,
        "service refused over TLS"
    );
    let prefix_keys = Keys::with_prefix(&prefix());
    let service = sign(&Claims::bus("ingest", now(), 600));
    let worker = TestBroker::external_view(login(&tls_ep, "ingest", &service));
    let ing = start_ingest(&worker, test_ingest_config(), prefix_keys.clone()).await;
    // The edge's own bus connection carries the courier's point.
    let (phone, _h) = client(&login(&tls_ep, "edge", &edge_svc), None).await;
    publish(
        &phone,
        &loc_topic("c7"),
        point("c7", 24.71, 46.71, now() as f64 - 1.0, 1),
    )
    .await;
    let st = ing.stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || st
            .accepted
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1)
        .await,
        "point over TLS not accepted"
    );
    let mut r = redis().await;
    assert!(near(
        geopos(&mut r, &prefix_keys, "c7").await.unwrap(),
        (24.71, 46.71)
    ));
    // A client that trusts another CA does not connect.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (other_ca, _, _) = throwaway_tls(&other);
    let untrusting = MqttEndpoint {
        ca_pem: Some(std::fs::read(other_ca).unwrap()),
        ..tls_ep.clone()
    };
    assert!(!admitted(&login(&untrusting, "edge", &edge_svc)).await);
    ing.stop().await;
    cleanup(&prefix_keys).await;
    let _ = std::fs::remove_dir_all(dir);
}
