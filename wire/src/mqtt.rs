//! MQTT client options every role uses (feature `mqtt`): the one place that turns an
//! [`MqttEndpoint`] into rumqttc options.

use crate::MqttEndpoint;
use rumqttc::MqttOptions;
use std::time::Duration;

/// Clean session, keep-alive 30 s, a generous incoming packet limit (an oversize payload is
/// then refused by validation and counted, not by dropping the connection), and a request queue
/// sized for the publishes this client makes.
pub fn options(endpoint: &MqttEndpoint, client_id: &str, request_capacity: usize) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, endpoint.host.clone(), endpoint.port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_clean_session(true)
        .set_max_packet_size(1 << 20, 1 << 20)
        .set_request_channel_capacity(request_capacity.max(10));
    if let Some(user) = &endpoint.username {
        o.set_credentials(user.clone(), endpoint.password.clone().unwrap_or_default());
    }
    if endpoint.tls {
        install_crypto_provider();
        let tls = match &endpoint.ca_pem {
            Some(ca) => rumqttc::TlsConfiguration::Simple {
                ca: ca.clone(),
                alpn: None,
                client_auth: None,
            },
            // The system's trust store.
            None => rumqttc::TlsConfiguration::default(),
        };
        o.set_transport(rumqttc::Transport::tls_with_config(tls));
    }
    o
}

/// rustls needs one process-wide crypto provider; ring builds quickly and needs no C toolchain
/// beyond cc.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Points are small packets sent one at a time: without TCP_NODELAY, Nagle's algorithm holds
/// each behind the previous one's ACK and adds milliseconds of delay.
pub fn no_delay(el: &mut rumqttc::EventLoop) {
    let mut n = el.network_options();
    n.set_tcp_nodelay(true);
    el.set_network_options(n);
}

/// A client id unique to this process and call: `<role>-<pid>-<n>-<random>`.
pub fn client_id(role: &str, n: usize) -> String {
    format!("{role}-{}-{n}-{:08x}", std::process::id(), rand_u32())
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded per process and per instance: enough to keep ids apart.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() as u32
}
