//! The MQTT edge in front of a test bus, and phones logging in there.

use super::*;

/// Edge settings for tests: a free port, no SO_REUSEPORT, and a rate bucket that no test's
/// burst empties (the rate limit has a test of its own in edge_security).
pub fn test_edge_config() -> edge::EdgeConfig {
    edge::EdgeConfig {
        listen: "127.0.0.1:0".into(),
        reuse_port: false,
        rate_burst: 100_000.0,
        ..Default::default()
    }
}

/// A running edge: where phones connect, what it counted, how to stop it.
pub struct TestEdge {
    /// The edge's TCP listener, without a login (see [`TestEdge::login`]).
    pub phones: MqttEndpoint,
    pub stats: Arc<edge::Stats>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), edge::EdgeError>>,
}

impl TestEdge {
    /// A fresh device token of `courier` (10 minutes).
    pub fn device_token(&self, courier: &str) -> String {
        let now = courier_wire::clock::unix_now() as u64;
        sign(&courier_auth::Claims::courier(courier, now, 600))
    }

    /// The edge as `courier`'s phone logs in: username = his id, password = his token.
    pub fn login(&self, courier: &str) -> MqttEndpoint {
        MqttEndpoint {
            username: Some(courier.into()),
            password: Some(self.device_token(courier)),
            ..self.phones.clone()
        }
    }

    /// Cancels the edge and waits for `run` to return (its queue drained to the bus).
    pub async fn stop(self) {
        stop_role("edge", self.shutdown, self.task).await;
    }
}

/// A test bus with an edge in front, wired as in production: embedded rumqttd fed by the
/// edge through the in-process link (`courier-pipeline run`), or Mosquitto with the edge
/// forwarding over MQTT (`courier-pipeline edge`). The bus stays anonymous for the workers;
/// only the edge checks tokens. Returns once the edge's bus side is up.
pub async fn start_bus_with_edge(kind: BrokerKind) -> (TestBroker, TestEdge) {
    let stats = Arc::new(edge::Stats::default());
    let mut bound = edge::Edge {
        settings: test_edge_config().validate().unwrap(),
        keys: test_verifier(courier_auth::Audience::Courier),
        stats: stats.clone(),
    }
    .bind()
    .unwrap();
    let tcp = bound
        .local_addrs()
        .into_iter()
        .find(|(via, _)| *via == edge::Via::Tcp)
        .map(|(_, a)| a)
        .expect("edge TCP listener");
    let (broker, bus) = match kind {
        BrokerKind::Embedded => {
            // rumqttd binds its own listener and cannot report a port 0: chosen here.
            let addr = free_addr();
            let queue = bound.take_queue().unwrap();
            courier_pipeline::broker::start_with_edge(embedded_config(addr), addr, queue).unwrap();
            let broker = TestBroker {
                endpoint: MqttEndpoint::new("127.0.0.1", addr.port()),
                child: None,
                _dir: None,
            };
            (broker, None)
        }
        BrokerKind::Mosquitto => {
            // Mosquitto cannot report a port 0 either.
            let broker = start_mosquitto(free_addr());
            let bus = broker.endpoint.clone();
            (broker, Some(bus))
        }
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(bound.run(bus, shutdown.clone()));
    let s = stats.clone();
    assert!(
        wait_until(Duration::from_secs(10), || s.bus_up.get()).await,
        "the edge did not reach the bus"
    );
    let edge = TestEdge {
        phones: MqttEndpoint::new("127.0.0.1", tcp.port()),
        stats,
        shutdown,
        task,
    };
    (broker, edge)
}

/// A courier's phone: its own connection to the edge, logged in as `courier` with a fresh
/// device token, optionally with a Will; its event loop runs in the background (abort the
/// handle to drop the socket without DISCONNECT). Panics unless the edge accepts the login.
pub async fn phone(
    edge: &TestEdge,
    courier: &str,
    will: Option<LastWill>,
) -> (AsyncClient, tokio::task::JoinHandle<()>) {
    let mut o = courier_wire::mqtt::options(
        &edge.login(courier),
        &courier_wire::mqtt::client_id("phone", 0),
        10_000,
    );
    if let Some(w) = will {
        o.set_last_will(w);
    }
    let (c, mut el) = AsyncClient::new(o, 10_000);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let h = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(Ok(()));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(Err(format!("{e:?}")));
                    }
                    return;
                }
            }
        }
    });
    match tokio::time::timeout(Duration::from_secs(5), ready_rx).await {
        Ok(Ok(Ok(()))) => (c, h),
        other => panic!("phone {courier} not logged in at the edge: {other:?}"),
    }
}

/// One phone per courier, logged in concurrently, no Will: `phones[i]` is `couriers[i]`'s.
/// Dropping a client ends its connection.
pub async fn phones<S: AsRef<str>>(edge: &TestEdge, couriers: &[S]) -> Vec<AsyncClient> {
    futures_util::future::join_all(couriers.iter().map(|c| phone(edge, c.as_ref(), None)))
        .await
        .into_iter()
        .map(|(c, _driver)| c)
        .collect()
}
