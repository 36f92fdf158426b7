//! The embedded MQTT broker (rumqttd) of `courier-pipeline run` and `courier-pipeline broker`.
//! It runs on its own threads; its alerts are turned into counters, since rumqttd reports the
//! loss of QoS 0 messages to slow subscribers only as `CursorJump` alerts.

use courier_wire::metrics as m;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The broker configuration shipped in `broker-config/rumqttd.toml`.
pub const DEFAULT_CONFIG: &str = include_str!("../broker-config/rumqttd.toml");

/// Cursor jumps seen since start (for the status line).
pub static CURSOR_JUMPS: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("broker config {path}: {reason}")]
    Config { path: String, reason: String },
    #[error("embedded broker cannot listen on {addr}: {reason}")]
    Listen { addr: SocketAddr, reason: String },
    #[error("embedded broker: {0}")]
    Start(String),
}

/// Reads a rumqttd configuration (the shipped one when `path` is `None`) and sets the address
/// of its first v4 listener.
pub fn load_config(path: Option<&Path>, listen: SocketAddr) -> Result<rumqttd::Config, BrokerError> {
    let (name, text) = match path {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).map_err(|e| BrokerError::Config {
                path: p.display().to_string(),
                reason: e.to_string(),
            })?,
        ),
        None => ("(built-in)".to_string(), DEFAULT_CONFIG.to_string()),
    };
    let mut config: rumqttd::Config = toml::from_str(&text).map_err(|e| BrokerError::Config {
        path: name.clone(),
        reason: e.to_string(),
    })?;
    let v4 = config.v4.as_mut().and_then(|v4| {
        let mut keys: Vec<_> = v4.keys().cloned().collect();
        keys.sort();
        keys.first().cloned().and_then(|k| v4.get_mut(&k))
    });
    match v4 {
        Some(server) => server.listen = listen,
        None => {
            return Err(BrokerError::Config {
                path: name,
                reason: "no [v4.*] listener".into(),
            })
        }
    }
    Ok(config)
}

/// Starts the broker and waits until it accepts connections on `listen`.
pub fn start(config: rumqttd::Config, listen: SocketAddr) -> Result<(), BrokerError> {
    // rumqttd only logs a failed bind from its own thread; find out here, with a clear error.
    TcpListener::bind(listen).map_err(|e| BrokerError::Listen {
        addr: listen,
        reason: e.to_string(),
    })?;
    let mut broker = rumqttd::Broker::new(config);
    let alerts = broker.alerts().map_err(|e| BrokerError::Start(e.to_string()))?;
    std::thread::Builder::new()
        .name("broker-alerts".into())
        .spawn(move || {
            let jumps = metrics::counter!(m::BROKER_CURSOR_JUMPS);
            let other = metrics::counter!(m::BROKER_ALERTS_OTHER);
            while let Ok(batch) = alerts.router_rx.recv() {
                for alert in batch {
                    if alert.kind.name() == "cursor_jump" {
                        jumps.increment(1);
                        CURSOR_JUMPS.fetch_add(1, Relaxed);
                    } else {
                        other.increment(1);
                    }
                }
            }
        })
        .map_err(|e| BrokerError::Start(e.to_string()))?;
    std::thread::Builder::new()
        .name("broker".into())
        .spawn(move || {
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "embedded broker stopped");
            }
        })
        .map_err(|e| BrokerError::Start(e.to_string()))?;
    // Ready once the address is taken. Probing by binding (not connecting) keeps rumqttd from
    // logging an aborted connection at every start.
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpListener::bind(listen).is_ok() {
        if Instant::now() > deadline {
            return Err(BrokerError::Listen {
                addr: listen,
                reason: "not accepting connections after 5s".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_config_loads_with_the_listen_override() {
        let addr: SocketAddr = "127.0.0.1:28883".parse().unwrap();
        let c = load_config(None, addr).unwrap();
        let v4 = c.v4.unwrap();
        assert_eq!(v4.values().next().unwrap().listen, addr);
    }
}
