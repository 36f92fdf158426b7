//! The fanout role: orders API, viewer gateway, viewers, CLI tokens.

use super::*;

/// Development-only service key of the orders API in tests.
pub const TEST_SERVICE_KEY: &str = "fanout-test-service-key-0123";

pub struct RunningFanout {
    pub stats: Arc<fanout::Stats>,
    /// Orders API.
    pub http: SocketAddr,
    /// Viewer gateway.
    pub ws: SocketAddr,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), fanout::FanoutError>>,
}

impl RunningFanout {
    pub async fn stop(self) {
        stop_role("fanout", self.shutdown, self.task).await;
    }
}

/// Fanout settings for tests: the defaults with the test service key.
pub fn test_fanout_config() -> fanout::FanoutConfig {
    fanout::FanoutConfig {
        service_key: Some(TEST_SERVICE_KEY.into()),
        ..Default::default()
    }
}

/// Starts a fanout role (orders API + gateway, each on a port of its own) and waits until its
/// `track/+` subscription is acknowledged.
pub async fn start_fanout(
    broker: &TestBroker,
    keys: Keys,
    config: fanout::FanoutConfig,
) -> RunningFanout {
    start_fanout_on(broker, &services().redis(), keys, config).await
}

/// [`start_fanout`] on another Redis.
pub async fn start_fanout_on(
    broker: &TestBroker,
    redis: &RedisTarget,
    keys: Keys,
    config: fanout::FanoutConfig,
) -> RunningFanout {
    let http_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ws_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http, ws) = (http_l.local_addr().unwrap(), ws_l.local_addr().unwrap());
    let stats = Arc::new(fanout::Stats::default());
    let prepared = fanout::Fanout {
        config,
        mqtt: broker.endpoint.clone(),
        redis: redis.clone(),
        keys,
        signer: test_keys()
            .signer(courier_auth::Audience::Viewer)
            .unwrap()
            .clone(),
        verifier: test_verifier(courier_auth::Audience::Viewer),
        ws_listen: ws,
        stats: stats.clone(),
    }
    .prepare()
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    let (router, stop) = (prepared.router(), shutdown.clone());
    tokio::spawn(async move {
        axum::serve(http_l, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    let task = tokio::spawn(prepared.run(ws_l, shutdown.clone()));
    let s = stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || s
            .source_subscribed
            .load(Relaxed)
            >= 1)
        .await,
        "fanout source did not subscribe"
    );
    RunningFanout {
        stats,
        http,
        ws,
        shutdown,
        task,
    }
}

/// POST with the test service key.
pub async fn api(f: &RunningFanout, path: &str, body: &str) -> HttpAnswer {
    http_post(
        f.http,
        path,
        &[("Authorization", &format!("Bearer {TEST_SERVICE_KEY}"))],
        body,
    )
    .await
}

/// Assigns `courier` to `order` and returns a customer token for it.
pub async fn assign_and_token(f: &RunningFanout, order: &str, courier: &str) -> String {
    let a = api(
        f,
        &format!("/orders/{order}/assign"),
        &format!(r#"{{"courier_id":"{courier}"}}"#),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    let t = api(
        f,
        &format!("/orders/{order}/tracking-token"),
        r#"{"viewer":"customer"}"#,
    )
    .await;
    assert_eq!(t.status, 200, "{t:?}");
    t.body["token"].as_str().unwrap().to_string()
}

/// What a test viewer saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    Connected,
    /// One entry per filter: granted or not.
    SubAck(Vec<bool>),
    Point {
        topic: String,
        payload: bytes::Bytes,
    },
    /// MQTT 5: the DISCONNECT reason code the gateway sent.
    Disconnect(u8),
    /// The connection ended (refused CONNECT included): the error, as text.
    Closed(String),
}

/// An MQTT 3.1.1 viewer over ws:// (rumqttc v4 client).
pub async fn viewer_v4(
    ws: SocketAddr,
    token: &str,
) -> (AsyncClient, mpsc::UnboundedReceiver<Seen>) {
    let id = courier_wire::mqtt::client_id("viewer4", 0);
    let mut o = rumqttc::MqttOptions::new(id, format!("ws://{ws}/mqtt"), ws.port());
    o.set_transport(rumqttc::Transport::Ws)
        .set_keep_alive(Duration::from_secs(30))
        .set_credentials("customer", token);
    let (c, mut el) = AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let seen = match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => Seen::Connected,
                Ok(Event::Incoming(Packet::SubAck(a))) => Seen::SubAck(
                    a.return_codes
                        .iter()
                        .map(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_)))
                        .collect(),
                ),
                Ok(Event::Incoming(Packet::Publish(p))) => Seen::Point {
                    topic: p.topic,
                    payload: p.payload,
                },
                Ok(_) => continue,
                Err(e) => {
                    let _ = tx.send(Seen::Closed(format!("{e:?}")));
                    return;
                }
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    (c, rx)
}

/// An MQTT 5 viewer over ws:// (rumqttc v5 client).
pub async fn viewer_v5(
    ws: SocketAddr,
    token: &str,
) -> (rumqttc::v5::AsyncClient, mpsc::UnboundedReceiver<Seen>) {
    use rumqttc::v5::mqttbytes::v5::Packet as P5;
    use rumqttc::v5::Event as E5;
    let id = courier_wire::mqtt::client_id("viewer5", 0);
    let mut o = rumqttc::v5::MqttOptions::new(id, format!("ws://{ws}/mqtt"), ws.port());
    o.set_transport(rumqttc::Transport::Ws)
        .set_keep_alive(Duration::from_secs(30))
        .set_credentials("customer", token);
    let (c, mut el) = rumqttc::v5::AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let seen = match el.poll().await {
                Ok(E5::Incoming(P5::ConnAck(_))) => Seen::Connected,
                Ok(E5::Incoming(P5::SubAck(a))) => Seen::SubAck(
                    a.return_codes
                        .iter()
                        .map(|c| {
                            matches!(
                                c,
                                rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                            )
                        })
                        .collect(),
                ),
                Ok(E5::Incoming(P5::Publish(p))) => Seen::Point {
                    topic: String::from_utf8_lossy(&p.topic).to_string(),
                    payload: p.payload,
                },
                Ok(E5::Incoming(P5::Disconnect(d))) => Seen::Disconnect(d.reason_code as u8),
                Ok(_) => continue,
                // rumqttc reports the server's DISCONNECT as an error of the event loop.
                Err(rumqttc::v5::ConnectionError::MqttState(
                    rumqttc::v5::StateError::ServerDisconnect { reason_code, .. },
                )) => {
                    let _ = tx.send(Seen::Disconnect(reason_code as u8));
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Seen::Closed(format!("{e:?}")));
                    return;
                }
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    (c, rx)
}

/// The next thing a viewer saw, within `within`.
pub async fn next_seen(rx: &mut mpsc::UnboundedReceiver<Seen>, within: Duration) -> Option<Seen> {
    tokio::time::timeout(within, rx.recv()).await.ok().flatten()
}

/// Removes every key of a test prefix, fanout's included.
pub async fn cleanup_all(keys: &Keys) {
    cleanup(keys).await;
    let mut r = redis().await;
    let mut doomed: Vec<String> = vec![keys.order_courier.clone(), keys.orders_ended.clone()];
    let mut cursor = 0u64;
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}*", keys.order_event_idem))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut r)
            .await
            .unwrap();
        doomed.extend(found);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let _: () = redis::cmd("DEL")
        .arg(&doomed)
        .query_async(&mut r)
        .await
        .unwrap();
}

/// Runs `courier-pipeline token <args>` with the test key directory and returns the token it
/// prints (the test fails, with the command's stderr, if it does not succeed).
pub fn cli_token(args: &[&str]) -> String {
    cli_token_with(test_key_dir(), args)
}

/// [`cli_token`] with another key directory.
pub fn cli_token_with(dir: &std::path::Path, args: &[&str]) -> String {
    let out = with_test_keys(&mut Command::new(env!("CARGO_BIN_EXE_courier-pipeline")))
        .env("AUTH_KEY_DIR", dir)
        .arg("token")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
