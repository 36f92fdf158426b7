//! Test support: real services started through `./dev` (the same helper the dev script uses),
//! brokers on free ports, isolated key prefixes, MQTT clients. This file: the services and the
//! brokers; one file per part beside it (keys, phones at the edge, the live path, TLS,
//! PostgreSQL, HTTP, viewers, the Redis Cluster).
// Each test binary uses a part of this: what it leaves unused is not a defect.
#![allow(dead_code, unused_imports)]

mod browser;
mod cluster;
mod http;
mod keys;
mod live;
mod maps;
mod pg;
mod phones;
mod tls;
mod viewers;
pub use browser::*;
pub use cluster::*;
pub use http::*;
pub use keys::*;
pub use live::*;
pub use maps::*;
pub use pg::*;
pub use phones::*;
pub use tls::*;
pub use viewers::*;

use courier_wire::{Keys, MqttEndpoint, RedisTarget};
use ingest::{Ingest, IngestConfig, Stats};
use rumqttc::{AsyncClient, Event, LastWill, Packet, Publish, QoS};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub struct Services {
    pub redis_url: String,
    pub database_url: String,
}

impl Services {
    /// The shared single Redis, as the roles take it.
    pub fn redis(&self) -> RedisTarget {
        RedisTarget::single(self.redis_url.as_str())
    }
}

/// REDIS_URL / DATABASE_URL from the environment (`./dev test` sets them), else `./dev
/// services env` starts them.
pub fn services() -> &'static Services {
    static S: OnceLock<Services> = OnceLock::new();
    S.get_or_init(|| {
        if let (Ok(r), Ok(d)) = (std::env::var("REDIS_URL"), std::env::var("DATABASE_URL")) {
            return Services {
                redis_url: r,
                database_url: d,
            };
        }
        let out = Command::new(repo_root().join("dev"))
            .args(["services", "env"])
            .stderr(Stdio::inherit())
            .output()
            .expect("running ./dev services env");
        assert!(out.status.success(), "./dev services env failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
                .unwrap_or_else(|| panic!("./dev services env printed no {k}"))
        };
        Services {
            redis_url: get("REDIS_URL"),
            database_url: get("DATABASE_URL"),
        }
    })
}

pub use crate::common::{free_addr, ListenReport, Listeners};

/// An address that refuses connections and that nobody else can take meanwhile: a socket bound
/// to it but not listening, held by the returned guard (a broker or server that is not there).
pub fn refused_addr() -> (socket2::Socket, SocketAddr) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    (s, addr)
}

/// A key prefix no other test uses.
pub fn prefix() -> String {
    format!("t{:016x}:", rand::random::<u64>())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    Embedded,
    Mosquitto,
}

pub struct TestBroker {
    pub endpoint: MqttEndpoint,
    child: Option<Child>,
    _dir: Option<PathBuf>,
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(d) = &self._dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

impl TestBroker {
    /// A broker some test started itself (a child process, files in `dir`).
    pub fn external(endpoint: MqttEndpoint, child: Child, dir: PathBuf) -> Self {
        TestBroker {
            endpoint,
            child: Some(child),
            _dir: Some(dir),
        }
    }

    /// Another way into a running broker (other credentials); owns nothing.
    pub fn external_view(endpoint: MqttEndpoint) -> Self {
        TestBroker {
            endpoint,
            child: None,
            _dir: None,
        }
    }
}

pub fn mosquitto_bin() -> PathBuf {
    for p in [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("mosquitto not installed: run ./dev test (it installs it)");
}

/// Starts a broker on a free port: rumqttd in this process, or a Mosquitto child process.
pub fn start_broker(kind: BrokerKind) -> TestBroker {
    // Neither rumqttd nor Mosquitto can report a port 0 it got: the port is chosen here.
    let addr = free_addr();
    match kind {
        BrokerKind::Embedded => {
            courier_pipeline::broker::start(embedded_config(addr), addr).unwrap();
            TestBroker {
                endpoint: MqttEndpoint::new("127.0.0.1", addr.port()),
                child: None,
                _dir: None,
            }
        }
        BrokerKind::Mosquitto => start_mosquitto(addr),
    }
}

/// The shipped rumqttd configuration, listening on `addr`, anonymous.
fn embedded_config(addr: SocketAddr) -> rumqttd::Config {
    courier_pipeline::broker::load_config(None, addr).unwrap()
}

/// Starts an anonymous Mosquitto on `addr` (its configuration in `dir`) and waits until it
/// accepts connections; the caller owns the process (kill it to inject a broker fault).
pub fn mosquitto_child(addr: SocketAddr, dir: &std::path::Path) -> Child {
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {} 127.0.0.1\nallow_anonymous true\npersistence false\nqueue_qos0_messages true\nmax_queued_messages 1000000\nlog_dest stderr\nlog_type error\n",
            addr.port()
        ),
    )
    .unwrap();
    let child = Command::new(mosquitto_bin())
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting mosquitto");
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "mosquitto did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// An anonymous Mosquitto child process on `addr`, once it accepts connections.
fn start_mosquitto(addr: SocketAddr) -> TestBroker {
    let dir = std::env::temp_dir().join(format!("mosq-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = mosquitto_child(addr, &dir);
    TestBroker {
        endpoint: MqttEndpoint::new("127.0.0.1", addr.port()),
        child: Some(child),
        _dir: Some(dir),
    }
}
