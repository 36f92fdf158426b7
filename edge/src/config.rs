//! Settings of the MQTT edge (`[edge]` in the config file, `EDGE_*` in the environment),
//! validated once at start-up into [`EdgeSettings`]; an error names the setting.

use crate::policy::Rate;
use courier_wire::ConfigError;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Edge settings as read from the file, with defaults for everything.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    /// Plain MQTT listener(s) for phones (`EDGE_LISTEN`): one address or several separated by
    /// commas (several loopback or interface addresses take more than one address's ~28,000
    /// source ports of a single client host); `off` for none.
    pub listen: String,
    /// MQTT over TLS listener(s) (`EDGE_TLS_LISTEN`), e.g. `0.0.0.0:8883`; needs `tls_cert`
    /// and `tls_key`.
    pub tls_listen: Option<String>,
    /// PEM certificate chain of the TLS listener (`EDGE_TLS_CERT`).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the TLS listener (`EDGE_TLS_KEY`).
    pub tls_key: Option<PathBuf>,
    /// MQTT over WebSocket listener(s) for phones (`EDGE_WS_LISTEN`, path `/mqtt`), e.g.
    /// behind a TLS-terminating proxy on 443.
    pub ws_listen: Option<String>,
    /// Bind with SO_REUSEPORT, so that several edge processes share one port on a host (the
    /// kernel spreads connections over them).
    pub reuse_port: bool,
    /// Phones one edge process holds; more get CONNACK "server unavailable" (`reason="full"`).
    pub max_connections: usize,
    /// Connections that have not logged in yet (TCP accepted, TLS or WebSocket handshake or
    /// CONNECT pending); more are closed at once (`reason="full"`). After an edge restart
    /// every phone reconnects at once: they retry.
    pub max_pending: usize,
    /// Time from accept to an authorized CONNECT (TLS and WebSocket handshakes included).
    #[serde(with = "courier_wire::duration")]
    pub connect_timeout: Duration,
    /// Largest MQTT packet accepted from a phone, bytes; checked from the packet's header
    /// before its body is buffered (before CONNECT too).
    pub max_packet_bytes: usize,
    /// Points (and statuses) one courier may send per second, sustained.
    pub rate_per_second: f32,
    /// Points one courier may send at once: an offline backlog replayed after a tunnel.
    pub rate_burst: f32,
    /// Messages waiting for the bus. When full, new ones are dropped and counted
    /// (`edge_messages_total{result="queue_full"}`).
    pub queue_capacity: usize,
    /// MQTT connections to the bus of a separate edge process (`courier-pipeline edge`).
    pub bus_connections: usize,
    /// Threads of a separate edge process (`courier-pipeline edge`); `0`: one per core. One
    /// thread spares the cross-thread wake-ups of a multi-thread scheduler (7.7 against 8.2-8.6 µs
    /// per point here); run one edge process per core on the same port instead.
    pub threads: usize,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            listen: "127.0.0.1:1883".into(),
            tls_listen: None,
            tls_cert: None,
            tls_key: None,
            ws_listen: None,
            reuse_port: true,
            max_connections: 100_000,
            max_pending: 4096,
            connect_timeout: Duration::from_secs(10),
            max_packet_bytes: 4096,
            rate_per_second: 20.0,
            rate_burst: 2000.0,
            queue_capacity: 65_536,
            bus_connections: 2,
            threads: 1,
        }
    }
}

fn err(setting: &'static str, reason: impl ToString) -> ConfigError {
    ConfigError::new(setting, reason.to_string())
}

/// TLS files of the TLS listener.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The validated settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeSettings {
    pub tcp: Vec<SocketAddr>,
    pub tls: Vec<SocketAddr>,
    pub tls_files: Option<TlsFiles>,
    pub ws: Vec<SocketAddr>,
    pub reuse_port: bool,
    pub max_connections: usize,
    pub max_pending: usize,
    pub connect_timeout: Duration,
    pub max_packet_bytes: usize,
    pub rate: Rate,
    pub queue_capacity: usize,
    pub bus_connections: usize,
    pub threads: usize,
}

fn addrs(setting: &'static str, v: Option<&str>) -> Result<Vec<SocketAddr>, ConfigError> {
    match v.map(str::trim) {
        None | Some("") | Some("off") => Ok(Vec::new()),
        Some(list) => list
            .split(',')
            .map(|a| {
                a.trim()
                    .parse()
                    .map_err(|e| err(setting, format!("{a:?}: {e}")))
            })
            .collect(),
    }
}

impl EdgeConfig {
    pub fn validate(&self) -> Result<EdgeSettings, ConfigError> {
        let tcp = addrs("EDGE_LISTEN", Some(&self.listen))?;
        let tls = addrs("EDGE_TLS_LISTEN", self.tls_listen.as_deref())?;
        let ws = addrs("EDGE_WS_LISTEN", self.ws_listen.as_deref())?;
        let tls_files = match (&self.tls_cert, &self.tls_key) {
            _ if tls.is_empty() => None,
            (Some(cert), Some(key)) => {
                for (setting, f) in [("EDGE_TLS_CERT", cert), ("EDGE_TLS_KEY", key)] {
                    if !f.is_file() {
                        return Err(err(setting, format!("{}: no such file", f.display())));
                    }
                }
                Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                })
            }
            _ => {
                return Err(err(
                    "EDGE_TLS_LISTEN",
                    "needs EDGE_TLS_CERT and EDGE_TLS_KEY",
                ))
            }
        };
        let positive = |setting, v: usize| {
            if v == 0 {
                Err(err(setting, "must be at least 1"))
            } else {
                Ok(v)
            }
        };
        positive("edge.max_connections", self.max_connections)?;
        positive("edge.max_pending", self.max_pending)?;
        positive("edge.queue_capacity", self.queue_capacity)?;
        positive("edge.bus_connections", self.bus_connections)?;
        if self.max_packet_bytes < 256 {
            return Err(err(
                "edge.max_packet_bytes",
                "at least 256 (a CONNECT carries a token)",
            ));
        }
        if !(self.rate_per_second > 0.0 && self.rate_per_second.is_finite()) {
            return Err(err("edge.rate_per_second", "must be a positive number"));
        }
        if !(self.rate_burst >= 1.0 && self.rate_burst.is_finite()) {
            return Err(err("edge.rate_burst", "must be at least 1"));
        }
        if self.connect_timeout.is_zero() {
            return Err(err("edge.connect_timeout", "must be above 0s"));
        }
        Ok(EdgeSettings {
            tcp,
            tls,
            tls_files,
            ws,
            reuse_port: self.reuse_port,
            max_connections: self.max_connections,
            max_pending: self.max_pending,
            connect_timeout: self.connect_timeout,
            max_packet_bytes: self.max_packet_bytes,
            rate: Rate {
                per_second: self.rate_per_second,
                burst: self.rate_burst,
            },
            queue_capacity: self.queue_capacity,
            bus_connections: self.bus_connections,
            threads: self.threads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_listen_on_loopback_tcp_only() {
        let s = EdgeConfig::default().validate().unwrap();
        assert_eq!(s.tcp, ["127.0.0.1:1883".parse().unwrap()]);
        assert!(s.tls.is_empty() && s.ws.is_empty() && s.tls_files.is_none());
    }

    #[test]
    fn several_addresses_and_bad_settings_named() {
        let c = EdgeConfig {
            listen: "127.0.0.1:1883, 127.0.0.2:1883".into(),
            ws_listen: Some("off".into()),
            ..EdgeConfig::default()
        };
        assert_eq!(c.validate().unwrap().tcp.len(), 2);
        let bad = |c: EdgeConfig| c.validate().unwrap_err().setting;
        assert_eq!(
            bad(EdgeConfig {
                listen: "nope".into(),
                ..EdgeConfig::default()
            }),
            "EDGE_LISTEN"
        );
        assert_eq!(
            bad(EdgeConfig {
                tls_listen: Some("127.0.0.1:8883".into()),
                ..EdgeConfig::default()
            }),
            "EDGE_TLS_LISTEN"
        );
        assert_eq!(
            bad(EdgeConfig {
                tls_listen: Some("127.0.0.1:8883".into()),
                tls_cert: Some("/nonexistent/cert.pem".into()),
                tls_key: Some("/nonexistent/key.pem".into()),
                ..EdgeConfig::default()
            }),
            "EDGE_TLS_CERT"
        );
        assert_eq!(
            bad(EdgeConfig {
                rate_per_second: 0.0,
                ..EdgeConfig::default()
            }),
            "edge.rate_per_second"
        );
        assert_eq!(
            bad(EdgeConfig {
                max_packet_bytes: 10,
                ..EdgeConfig::default()
            }),
            "edge.max_packet_bytes"
        );
    }
}
