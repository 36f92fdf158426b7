//! Configuration: defaults, then `--config FILE` (TOML), then environment, then flags;
//! validated once at start-up into real types. A bad setting is one error naming it.

use courier_wire::{Keys, MqttEndpoint, RedisTarget};
use edge::{EdgeConfig, EdgeSettings};
use fanout::FanoutConfig;
use history_writer::HistoryConfig;
use ingest::IngestConfig;
use notify::NotifyConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use web::WebConfig;

/// The file as written. Every field has a default.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub mqtt: MqttSection,
    pub redis: RedisSection,
    pub metrics: MetricsSection,
    pub database: DatabaseSection,
    pub http: HttpSection,
    pub auth: AuthSection,
    pub ingest: IngestConfig,
    pub history: HistoryConfig,
    pub fanout: FanoutConfig,
    /// The MQTT edge phones connect to (`[edge]`).
    pub edge: EdgeConfig,
    /// Order events and their webhooks (`[notify]`, docs/events.md).
    pub notify: NotifyConfig,
    /// The live maps: `/ops` and `/track/<order>` on HTTP_LISTEN (`[web]`, docs/maps.md).
    pub web: WebConfig,
    /// How long shutdown may take (drain queues, flush the last batch) before the process exits.
    #[serde(with = "courier_wire::duration")]
    pub shutdown_grace: Duration,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            mqtt: MqttSection::default(),
            redis: RedisSection::default(),
            metrics: MetricsSection::default(),
            database: DatabaseSection::default(),
            http: HttpSection::default(),
            auth: AuthSection::default(),
            ingest: IngestConfig::default(),
            history: HistoryConfig::default(),
            fanout: FanoutConfig::default(),
            edge: EdgeConfig::default(),
            notify: NotifyConfig::default(),
            web: WebConfig::default(),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MqttSection {
    /// External bus broker (`MQTT_URL`), e.g. `mqtt://127.0.0.1:1884`. Unset: `run` embeds one.
    /// Only the pipeline's own workers (and edges) connect to the bus; phones connect to the edge.
    pub url: Option<String>,
    /// TCP address of the embedded bus broker (`MQTT_LISTEN`); loopback unless workers on other
    /// hosts need it (it admits service logins only).
    pub listen: String,
    /// rumqttd configuration of the embedded broker; unset: the built-in copy of
    /// `broker-config/rumqttd.toml`.
    pub broker_config: Option<PathBuf>,
    /// TLS listener of the embedded broker (`MQTT_TLS_LISTEN`), e.g. `0.0.0.0:8883`; needs
    /// `tls_cert` and `tls_key`.
    pub tls_listen: Option<String>,
    /// PEM certificate chain of the TLS listener.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the TLS listener.
    pub tls_key: Option<PathBuf>,
    /// PEM certificates the workers trust for an `mqtts://` MQTT_URL (`MQTT_CA_FILE`); unset:
    /// the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Let the embedded broker admit clients without credentials (`MQTT_ALLOW_ANONYMOUS`).
    /// Development only: with it, anyone who reaches the port can publish any courier's points.
    pub allow_anonymous: bool,
}

impl Default for MqttSection {
    fn default() -> Self {
        MqttSection {
            url: None,
            listen: "127.0.0.1:1884".into(),
            broker_config: None,
            tls_listen: None,
            tls_cert: None,
            tls_key: None,
            ca_file: None,
            allow_anonymous: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSection {
    /// `REDIS_URL`: one Redis server. Not used when `cluster_nodes` is set.
    pub url: String,
    /// Seed nodes of a Redis Cluster (`REDIS_CLUSTER_NODES`, comma-separated), e.g.
    /// `["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]`; any one that answers is enough.
    /// Set: every role uses the cluster client and `key_prefix` must carry a hash tag.
    pub cluster_nodes: Vec<String>,
    /// Prepended to every key name: `{riyadh}:` for a Redis Cluster hash tag (required on a
    /// cluster: every key of one script call must be in one slot).
    pub key_prefix: String,
}

impl Default for RedisSection {
    fn default() -> Self {
        RedisSection {
            url: "redis://127.0.0.1:6379/".into(),
            cluster_nodes: Vec::new(),
            key_prefix: String::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Prometheus `/metrics` address (`METRICS_LISTEN`); `off` disables it.
    pub listen: String,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            listen: "127.0.0.1:9464".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSection {
    /// PostgreSQL of the history (`DATABASE_URL`).
    pub url: String,
}

impl Default for DatabaseSection {
    fn default() -> Self {
        DatabaseSection {
            url: "postgres://postgres@127.0.0.1:5432/courier".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSection {
    /// HTTP APIs (trail, orders) address (`HTTP_LISTEN`).
    pub listen: String,
    /// Viewer gateway (MQTT over WebSocket) address (`WS_LISTEN`).
    pub ws_listen: String,
}

impl Default for HttpSection {
    fn default() -> Self {
        HttpSection {
            listen: "127.0.0.1:8080".into(),
            ws_listen: "127.0.0.1:8083".into(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    /// Key directory (`AUTH_KEY_DIR`): `<aud>.key` signs the tokens of an audience this process
    /// mints, `<aud>.pub` / `<aud>.<label>.pub` / `.json` (PEM, JWK or JWKS) are the keys it
    /// accepts; audiences `courier`, `viewer`, `trail`, `bus`, `privacy`, `ops`
    /// (docs/security.md). Unset: roles that check tokens refuse to start.
    pub key_dir: Option<PathBuf>,
}

/// Values from the environment or flags, applied over the file: the one list of settings the
/// command line takes (each flag also reads its environment variable).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// External broker, e.g. mqtt://127.0.0.1:1883. Unset: `run` embeds rumqttd.
    #[arg(long, global = true, env = "MQTT_URL")]
    pub mqtt_url: Option<String>,
    /// TCP address of the embedded broker.
    #[arg(long, global = true, env = "MQTT_LISTEN")]
    pub mqtt_listen: Option<String>,
    #[arg(long, global = true, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Redis Cluster seed nodes, comma-separated (then REDIS_URL is not used).
    #[arg(long, global = true, env = "REDIS_CLUSTER_NODES")]
    pub redis_cluster_nodes: Option<String>,
    /// Prometheus /metrics address, or `off`.
    #[arg(long, global = true, env = "METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    #[arg(long, global = true, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// HTTP APIs address.
    #[arg(long, global = true, env = "HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// Viewer gateway (MQTT over WebSocket) address.
    #[arg(long, global = true, env = "WS_LISTEN")]
    pub ws_listen: Option<String>,
    /// Key directory: <aud>.key signs, <aud>.pub / .json verify (courier, viewer, trail, bus).
    #[arg(long, global = true, env = "AUTH_KEY_DIR")]
    pub key_dir: Option<String>,
    /// The audiences whose private keys this command reads (what it mints).
    #[arg(skip)]
    pub mint: Vec<courier_auth::Audience>,
    /// A bus token to log in with instead of minting one with bus.key (e.g. for the edge).
    #[arg(long, global = true, env = "MQTT_TOKEN", hide_env_values = true)]
    pub mqtt_token: Option<String>,
    /// TLS listener of the embedded broker (needs mqtt.tls_cert and mqtt.tls_key).
    #[arg(long, global = true, env = "MQTT_TLS_LISTEN")]
    pub mqtt_tls_listen: Option<String>,
    /// PEM certificates to trust for an mqtts:// MQTT_URL.
    #[arg(long, global = true, env = "MQTT_CA_FILE")]
    pub mqtt_ca_file: Option<String>,
    /// Let the embedded broker admit clients without credentials (development only).
    #[arg(long, global = true, env = "MQTT_ALLOW_ANONYMOUS")]
    pub mqtt_allow_anonymous: Option<bool>,
    /// Bearer key of the orders API (the order service presents it).
    #[arg(long, global = true, env = "SERVICE_KEY", hide_env_values = true)]
    pub service_key: Option<String>,
    /// The MQTT edge phones connect to: address(es), comma-separated, or `off`.
    #[arg(long, global = true, env = "EDGE_LISTEN")]
    pub edge_listen: Option<String>,
    /// MQTT over TLS listener(s) of the edge (needs EDGE_TLS_CERT and EDGE_TLS_KEY).
    #[arg(long, global = true, env = "EDGE_TLS_LISTEN")]
    pub edge_tls_listen: Option<String>,
    /// PEM certificate chain of the edge's TLS listener.
    #[arg(long, global = true, env = "EDGE_TLS_CERT")]
    pub edge_tls_cert: Option<String>,
    /// PEM private key of the edge's TLS listener.
    #[arg(long, global = true, env = "EDGE_TLS_KEY")]
    pub edge_tls_key: Option<String>,
    /// MQTT over WebSocket listener(s) of the edge (path /mqtt).
    #[arg(long, global = true, env = "EDGE_WS_LISTEN")]
    pub edge_ws_listen: Option<String>,
    /// A file this process writes `name=address` lines to once all its listeners are bound
    /// (what a starter that gave it port 0 reads back).
    #[arg(long, global = true, env = "LISTEN_REPORT")]
    pub listen_report: Option<String>,
}

/// Where the roles find their broker.
#[derive(Debug, Clone, PartialEq)]
pub enum Broker {
    /// Start rumqttd in this process, listening here (and on `tls`); with `auth`, every client
    /// must log in with a token.
    Embedded {
        listen: SocketAddr,
        config: Option<PathBuf>,
        tls: Option<crate::broker::TlsListener>,
        auth: bool,
    },
    External(MqttEndpoint),
}

impl Broker {
    /// The address clients of this process connect to.
    pub fn endpoint(&self) -> MqttEndpoint {
        match self {
            Broker::Embedded { listen, .. } => {
                MqttEndpoint::new(listen.ip().to_string(), listen.port())
            }
            Broker::External(e) => e.clone(),
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub broker: Broker,
    /// One Redis server or a cluster (`redis.url` / `redis.cluster_nodes`).
    pub redis: RedisTarget,
    pub keys: Keys,
    pub metrics_listen: Option<SocketAddr>,
    pub database_url: String,
    pub http_listen: SocketAddr,
    pub ws_listen: SocketAddr,
    /// Token keys (read from `auth.key_dir`); `None` when not configured.
    pub auth: Option<Arc<courier_auth::KeySet>>,
    /// A bus token given to this process (`MQTT_TOKEN`), and the role it names.
    pub mqtt_token: Option<String>,
    pub mqtt_token_sub: Option<String>,
    pub ingest: IngestConfig,
    pub history: HistoryConfig,
    pub fanout: FanoutConfig,
    pub edge: EdgeSettings,
    pub notify: NotifyConfig,
    pub web: WebConfig,
    pub shutdown_grace: Duration,
    /// Where to write the addresses really bound (`LISTEN_REPORT`), e.g. after port 0.
    pub listen_report: Option<PathBuf>,
}

impl Config {
    /// The broker endpoint a worker role of this process uses, and its bus login: credentials
    /// in MQTT_URL, else `MQTT_TOKEN` (username: its `sub`), else a bus token minted with
    /// `bus.key` (what the embedded broker, here or in a `courier-pipeline broker` process,
    /// expects; minted at start-up, valid a year), else none.
    pub fn worker_endpoint(&self, role: &str) -> MqttEndpoint {
        let mut e = self.broker.endpoint();
        if e.username.is_some() {
            return e;
        }
        if let Some(token) = &self.mqtt_token {
            e.username = Some(self.mqtt_token_sub.clone().unwrap_or_default());
            e.password = Some(token.clone());
        } else if let Some(key) = self
            .auth
            .as_ref()
            .and_then(|k| k.signer(courier_auth::Audience::Bus))
        {
            let now = courier_wire::clock::unix_now() as u64;
            e.username = Some(role.to_string());
            e.password = Some(key.sign(&courier_auth::Claims::bus(role, now, 365 * 24 * 3600)));
        }
        e
    }

    /// The keys of `aud` this process accepts, or an error naming the setting.
    pub fn verifier(
        &self,
        aud: courier_auth::Audience,
        why: &str,
    ) -> Result<&courier_auth::Verifier, ConfigError> {
        match &self.auth {
            None => Err(err("AUTH_KEY_DIR", format!("is not set: {why}"))),
            Some(k) => k.verifier(aud).ok_or_else(|| {
                err(
                    "AUTH_KEY_DIR",
                    format!("has no {aud}.pub (or {aud}.*.pub / .json): {why}"),
                )
            }),
        }
    }

    /// The key this process mints `aud` tokens with, or an error naming the setting.
    pub fn signer(
        &self,
        aud: courier_auth::Audience,
        why: &str,
    ) -> Result<&courier_auth::SigningKey, ConfigError> {
        match &self.auth {
            None => Err(err("AUTH_KEY_DIR", format!("is not set: {why}"))),
            Some(k) => k
                .signer(aud)
                .ok_or_else(|| err("AUTH_KEY_DIR", format!("has no {aud}.key: {why}"))),
        }
    }
}

pub use courier_wire::ConfigError;

fn err(setting: &str, reason: impl ToString) -> ConfigError {
    ConfigError {
        setting: setting.to_string(),
        reason: reason.to_string(),
    }
}

impl FileConfig {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err("--config", format!("{}: {e}", path.display())))?;
        Self::from_toml(&text)
            .map_err(|e| err("--config", format!("{}: {}", path.display(), e.reason)))
    }

    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| err("config file", e.to_string().trim()))
    }

    /// Applies overrides (environment, then flags: the caller merges them) and validates.
    pub fn resolve(mut self, o: Overrides) -> Result<Config, ConfigError> {
        if let Some(v) = o.mqtt_url.filter(|v| !v.is_empty()) {
            self.mqtt.url = Some(v);
        }
        if let Some(v) = o.mqtt_listen {
            self.mqtt.listen = v;
        }
        if let Some(v) = o.redis_url {
            self.redis.url = v;
        }
        if let Some(v) = o.redis_cluster_nodes.filter(|v| !v.trim().is_empty()) {
            self.redis.cluster_nodes = v.split(',').map(|n| n.trim().to_string()).collect();
        }
        if let Some(v) = o.metrics_listen {
            self.metrics.listen = v;
        }
        if let Some(v) = o.database_url {
            self.database.url = v;
        }
        if let Some(v) = o.http_listen {
            self.http.listen = v;
        }
        if let Some(v) = o.ws_listen {
            self.http.ws_listen = v;
        }
        if let Some(v) = o.key_dir.filter(|v| !v.is_empty()) {
            self.auth.key_dir = Some(v.into());
        }
        if let Some(v) = o.service_key.filter(|v| !v.is_empty()) {
            self.fanout.service_key = Some(v);
        }
        if let Some(v) = o.mqtt_tls_listen.filter(|v| !v.is_empty()) {
            self.mqtt.tls_listen = Some(v);
        }
        if let Some(v) = o.mqtt_ca_file.filter(|v| !v.is_empty()) {
            self.mqtt.ca_file = Some(v.into());
        }
        if let Some(v) = o.mqtt_allow_anonymous {
            self.mqtt.allow_anonymous = v;
        }
        if let Some(v) = o.edge_listen {
            self.edge.listen = v;
        }
        if let Some(v) = o.edge_tls_listen.filter(|v| !v.is_empty()) {
            self.edge.tls_listen = Some(v);
        }
        if let Some(v) = o.edge_tls_cert.filter(|v| !v.is_empty()) {
            self.edge.tls_cert = Some(v.into());
        }
        if let Some(v) = o.edge_tls_key.filter(|v| !v.is_empty()) {
            self.edge.tls_key = Some(v.into());
        }
        if let Some(v) = o.edge_ws_listen.filter(|v| !v.is_empty()) {
            self.edge.ws_listen = Some(v);
        }
        let auth = match &self.auth.key_dir {
            Some(dir) => Some(Arc::new(
                courier_auth::KeySet::load(dir, &o.mint).map_err(|e| err("AUTH_KEY_DIR", e))?,
            )),
            None => None,
        };
        let mqtt_token = o.mqtt_token.filter(|v| !v.is_empty());
        // The username a given bus token must be presented with is its own `sub`; read without
        // verifying (the broker verifies), only to fill in the username.
        let mqtt_token_sub = match &mqtt_token {
            Some(t) => Some(
                courier_auth::unverified_subject(t)
                    .ok_or_else(|| err("MQTT_TOKEN", "is not a JWT with a sub claim"))?,
            ),
            None => None,
        };
        let broker = match &self.mqtt.url {
            Some(url) => {
                let mut e = MqttEndpoint::parse(url).map_err(|e| err("MQTT_URL", e))?;
                if let Some(ca) = &self.mqtt.ca_file {
                    let pem = std::fs::read(ca)
                        .map_err(|x| err("MQTT_CA_FILE", format!("{}: {x}", ca.display())))?;
                    e.ca_pem = Some(pem);
                }
                Broker::External(e)
            }
            None => {
                let tls = match (
                    &self.mqtt.tls_listen,
                    &self.mqtt.tls_cert,
                    &self.mqtt.tls_key,
                ) {
                    (None, _, _) => None,
                    (Some(l), Some(cert), Some(key)) => Some(crate::broker::TlsListener {
                        listen: l
                            .parse()
                            .map_err(|e| err("MQTT_TLS_LISTEN", format!("{l:?}: {e}")))?,
                        cert: cert.clone(),
                        key: key.clone(),
                    }),
                    (Some(_), _, _) => {
                        return Err(err(
                            "mqtt.tls_listen",
                            "needs mqtt.tls_cert and mqtt.tls_key",
                        ))
                    }
                };
                let listen: SocketAddr = self
                    .mqtt
                    .listen
                    .parse()
                    .map_err(|e| err("MQTT_LISTEN", format!("{:?}: {e}", self.mqtt.listen)))?;
                // rumqttd binds its listener itself and tells nobody the port it got, so
                // this process's own workers (and LISTEN_REPORT) would not know it.
                if listen.port() == 0 {
                    return Err(err(
                            "MQTT_LISTEN",
                            format!("{listen}: port 0 is not supported for the embedded broker (it cannot report the port it gets)"),
                        ));
                }
                Broker::Embedded {
                    listen,
                    config: self.mqtt.broker_config.clone(),
                    tls,
                    auth: !self.mqtt.allow_anonymous,
                }
            }
        };
        let redis = if self.redis.cluster_nodes.is_empty() {
            RedisTarget::parse_single(&self.redis.url).map_err(|e| err("REDIS_URL", e))?
        } else {
            RedisTarget::parse_cluster(&self.redis.cluster_nodes)
                .map_err(|e| err("redis.cluster_nodes", e))?
        };
        redis
            .check_prefix(&self.redis.key_prefix)
            .map_err(|e| err("redis.key_prefix", e))?;
        let metrics_listen = match self.metrics.listen.as_str() {
            "off" | "" => None,
            v => Some(
                v.parse()
                    .map_err(|e| err("METRICS_LISTEN", format!("{v:?}: {e}")))?,
            ),
        };
        if !(self.database.url.starts_with("postgres://")
            || self.database.url.starts_with("postgresql://"))
        {
            return Err(err("DATABASE_URL", "expected a postgres:// URL"));
        }
        let addr = |name: &str, v: &str| {
            v.parse::<SocketAddr>()
                .map_err(|e| err(name, format!("{v:?}: {e}")))
        };
        let http_listen = addr("HTTP_LISTEN", &self.http.listen)?;
        let ws_listen = addr("WS_LISTEN", &self.http.ws_listen)?;
        self.ingest
            .validate()
            .map_err(|e| err(&e.setting, e.reason))?;
        self.history
            .validate(&self.ingest.group)
            .map_err(|e| err(&e.setting, e.reason))?;
        self.fanout
            .validate()
            .map_err(|e| err(&e.setting, e.reason))?;
        let edge = self.edge.validate()?;
        // One setting, read by every script that emits order events.
        self.fanout.events_stream_max = self.notify.stream_max;
        self.ingest.events_stream_max = self.notify.stream_max;
        self.notify
            .validate()
            .map_err(|e| err(&e.setting, e.reason))?;
        self.web.validate().map_err(|e| err(&e.setting, e.reason))?;
        Ok(Config {
            broker,
            redis,
            keys: Keys::with_prefix(&self.redis.key_prefix),
            metrics_listen,
            database_url: self.database.url,
            http_listen,
            ws_listen,
            auth,
            mqtt_token,
            mqtt_token_sub,
            ingest: self.ingest,
            history: self.history,
            fanout: self.fanout,
            edge,
            notify: self.notify,
            web: self.web,
            shutdown_grace: self.shutdown_grace,
            listen_report: o.listen_report.filter(|v| !v.is_empty()).map(PathBuf::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key directory with every audience's keys, written once per test process.
    fn key_dir() -> String {
        static DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        DIR.get_or_init(|| {
            let d =
                std::env::temp_dir().join(format!("courier-config-keys-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            for aud in courier_auth::Audience::ALL {
                let k = courier_auth::SigningKey::generate(aud).unwrap();
                std::fs::write(d.join(format!("{aud}.key")), k.to_pem()).unwrap();
                std::fs::write(d.join(format!("{aud}.pub")), k.public().to_pem()).unwrap();
            }
            d.display().to_string()
        })
        .clone()
    }

    fn keys() -> Overrides {
        Overrides {
            key_dir: Some(key_dir()),
            ..Default::default()
        }
    }

    #[test]
    fn workers_log_in_with_a_bus_token_they_mint_or_are_given() {
        use courier_auth::Audience::Bus;
        let minting = FileConfig::default()
            .resolve(Overrides {
                mint: vec![Bus],
                ..keys()
            })
            .unwrap();
        let e = minting.worker_endpoint("ingest");
        assert_eq!(e.username.as_deref(), Some("ingest"));
        let bus = minting.verifier(Bus, "test").unwrap();
        let now = courier_wire::clock::unix_now() as u64;
        assert_eq!(
            courier_auth::bus_login(bus, "ingest", e.password.as_deref().unwrap(), now),
            Ok("ingest".into())
        );
        // Without bus.key read (the edge), nothing is minted; a given token is presented under
        // its own subject.
        let edge = FileConfig::default().resolve(keys()).unwrap();
        assert!(edge.auth.as_ref().unwrap().signer(Bus).is_none());
        assert_eq!(edge.worker_endpoint("edge").password, None);
        let given = FileConfig::default()
            .resolve(Overrides {
                mqtt_token: Some(e.password.clone().unwrap()),
                ..keys()
            })
            .unwrap()
            .worker_endpoint("edge");
        assert_eq!(given.username.as_deref(), Some("ingest"));
        assert_eq!(given.password, e.password);
        // Credentials in MQTT_URL win.
        let url = FileConfig::default()
            .resolve(Overrides {
                mint: vec![Bus],
                mqtt_url: Some("mqtt://u:p@127.0.0.1:1884".into()),
                ..keys()
            })
            .unwrap()
            .worker_endpoint("ingest");
        assert_eq!(url.password.as_deref(), Some("p"));
    }

    #[test]
    fn defaults_embed_the_broker_with_logins() {
        let c = FileConfig::default().resolve(keys()).unwrap();
        assert_eq!(
            c.broker,
            Broker::Embedded {
                listen: "127.0.0.1:1884".parse().unwrap(),
                config: None,
                tls: None,
                auth: true,
            }
        );
        let open = FileConfig::default()
            .resolve(Overrides {
                mqtt_allow_anonymous: Some(true),
                ..Default::default()
            })
            .unwrap();
        assert!(matches!(open.broker, Broker::Embedded { auth: false, .. }));
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.keys, Keys::default());
        assert_eq!(c.edge.tcp, ["127.0.0.1:1883".parse().unwrap()]);
    }

    #[test]
    fn a_cluster_comes_from_the_file_or_the_environment_and_needs_a_hash_tag() {
        let f = FileConfig::from_toml(
            "[redis]\ncluster_nodes = [\"redis://10.0.0.1:7000\", \"redis://10.0.0.2:7000\"]\nkey_prefix = \"{riyadh}:\"\n",
        )
        .unwrap();
        let c = f.clone().resolve(Overrides::default()).unwrap();
        assert_eq!(
            c.redis,
            RedisTarget::Cluster(vec![
                "redis://10.0.0.1:7000".into(),
                "redis://10.0.0.2:7000".into()
            ])
        );
        // The environment's list replaces the file's; REDIS_URL is not used beside it.
        let c = f
            .resolve(Overrides {
                redis_url: Some("redis://127.0.0.1:6379/".into()),
                redis_cluster_nodes: Some("redis://127.0.0.1:7100, redis://127.0.0.1:7101".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            c.redis.urls(),
            ["redis://127.0.0.1:7100", "redis://127.0.0.1:7101"]
        );
        // No hash tag: refused at start-up, naming the setting.
        let e = FileConfig::from_toml("[redis]\nkey_prefix = \"riyadh:\"\n")
            .unwrap()
            .resolve(Overrides {
                redis_cluster_nodes: Some("redis://127.0.0.1:7100".into()),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(e.setting, "redis.key_prefix");
        assert!(e.reason.contains("hash tag"), "{}", e.reason);
        // One server takes any prefix.
        assert!(FileConfig::from_toml("[redis]\nkey_prefix = \"riyadh:\"\n")
            .unwrap()
            .resolve(Overrides::default())
            .is_ok());
    }

    #[test]
    fn file_then_overrides() {
        let f = FileConfig::from_toml(
            "[redis]\nurl = \"redis://10.0.0.1:6379/\"\nkey_prefix = \"{riyadh}:\"\n[ingest]\nbatch_max = 100\nevict_after = \"2m\"\n",
        )
        .unwrap();
        assert_eq!(f.ingest.batch_max, 100);
        let c = f
            .resolve(Overrides {
                redis_url: Some("redis://127.0.0.1:7000/".into()),
                mqtt_url: Some("mqtt://127.0.0.1:1884".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(c.redis, RedisTarget::single("redis://127.0.0.1:7000/"));
        assert_eq!(c.keys.live, "{riyadh}:couriers:live");
        assert_eq!(c.ingest.evict_after, Duration::from_secs(120));
        assert_eq!(
            c.broker,
            Broker::External(MqttEndpoint::new("127.0.0.1", 1884))
        );
    }

    #[test]
    fn bad_settings_name_themselves() {
        let bad = |o: Overrides| {
            FileConfig::default()
                .resolve(Overrides {
                    key_dir: o.key_dir.or(keys().key_dir),
                    ..o
                })
                .unwrap_err()
                .setting
        };
        assert_eq!(
            bad(Overrides {
                mqtt_tls_listen: Some("127.0.0.1:8883".into()),
                ..Default::default()
            }),
            "mqtt.tls_listen"
        );
        assert_eq!(
            bad(Overrides {
                mqtt_ca_file: Some("/nonexistent/ca.pem".into()),
                mqtt_url: Some("mqtts://x".into()),
                ..Default::default()
            }),
            "MQTT_CA_FILE"
        );
        assert_eq!(
            bad(Overrides {
                mqtt_url: Some("http://x".into()),
                ..Default::default()
            }),
            "MQTT_URL"
        );
        assert_eq!(
            bad(Overrides {
                mqtt_listen: Some("nope".into()),
                ..Default::default()
            }),
            "MQTT_LISTEN"
        );
        assert_eq!(
            bad(Overrides {
                mqtt_listen: Some("127.0.0.1:0".into()),
                ..Default::default()
            }),
            "MQTT_LISTEN"
        );
        assert_eq!(
            bad(Overrides {
                redis_url: Some("localhost".into()),
                ..Default::default()
            }),
            "REDIS_URL"
        );
        assert_eq!(
            bad(Overrides {
                redis_cluster_nodes: Some("redis://127.0.0.1:7000,localhost:7001".into()),
                ..Default::default()
            }),
            "redis.cluster_nodes"
        );
        assert_eq!(
            bad(Overrides {
                metrics_listen: Some(":x".into()),
                ..Default::default()
            }),
            "METRICS_LISTEN"
        );
        assert_eq!(
            bad(Overrides {
                database_url: Some("mysql://x".into()),
                ..Default::default()
            }),
            "DATABASE_URL"
        );
        assert_eq!(
            bad(Overrides {
                http_listen: Some("x".into()),
                ..Default::default()
            }),
            "HTTP_LISTEN"
        );
        assert_eq!(
            bad(Overrides {
                ws_listen: Some("x".into()),
                ..Default::default()
            }),
            "WS_LISTEN"
        );
        assert_eq!(
            bad(Overrides {
                edge_listen: Some("x".into()),
                ..Default::default()
            }),
            "EDGE_LISTEN"
        );
        assert_eq!(
            bad(Overrides {
                edge_tls_listen: Some("127.0.0.1:8883".into()),
                ..Default::default()
            }),
            "EDGE_TLS_LISTEN"
        );
        assert_eq!(
            bad(Overrides {
                key_dir: Some("/nonexistent/keys".into()),
                ..Default::default()
            }),
            "AUTH_KEY_DIR"
        );
        assert_eq!(
            bad(Overrides {
                mqtt_token: Some("not-a-jwt".into()),
                ..Default::default()
            }),
            "MQTT_TOKEN"
        );
        assert_eq!(
            bad(Overrides {
                service_key: Some("short".into()),
                ..Default::default()
            }),
            "SERVICE_KEY"
        );
        let e = FileConfig::from_toml("[fanout]\nqueue_capacity = 0\n")
            .unwrap()
            .resolve(keys())
            .unwrap_err();
        assert_eq!(e.setting, "fanout.queue_capacity");
        let e = FileConfig::from_toml("[ingest]\nbatch_size = 3\n").unwrap_err();
        assert!(e.reason.contains("batch_size"), "{e}");
        let e = FileConfig::from_toml("[ingest]\nworkers = 0\n")
            .unwrap()
            .resolve(keys())
            .unwrap_err();
        assert_eq!(e.setting, "ingest.workers");
        let e = FileConfig::from_toml("[history]\ngroup = \"ingest\"\n")
            .unwrap()
            .resolve(Overrides::default())
            .unwrap_err();
        assert_eq!(e.setting, "history.group");
        let c = FileConfig::from_toml(
            "[history]\nretention_days = 7\nbuffer_rows = 1000\nbatch_max = 100\n",
        )
        .unwrap();
        assert_eq!(
            c.resolve(Overrides::default())
                .unwrap()
                .history
                .retention_days,
            7
        );
    }

    /// `courier-pipeline.example.toml` parses to the defaults, and names every setting of every
    /// section (as `key = ...` or, for a setting unset by default, `# key = ...`). The list of
    /// settings is the one serde reports for an unknown key, so a new setting fails this test
    /// until the example has it.
    #[test]
    fn the_example_file_holds_every_setting_at_its_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("courier-pipeline.example.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(FileConfig::from_file(&path).unwrap(), FileConfig::default());
        let named = |section: &str, key: &str| {
            let mut in_section = section.is_empty();
            text.lines().any(|line| {
                let line = line.trim();
                if line.starts_with('[') {
                    in_section = line == format!("[{section}]");
                    return false;
                }
                let line = line.trim_start_matches("# ");
                in_section && line.split_once(" = ").is_some_and(|(k, _)| k == key)
            })
        };
        let fields = |probe: &str| -> Vec<String> {
            let e = FileConfig::from_toml(probe).unwrap_err().reason;
            // serde: "unknown field `x`, expected `a`" or "..., expected one of `a`, `b`".
            let (_, list) = e.split_once(", expected").unwrap_or_else(|| panic!("{e}"));
            list.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let sections = fields("no_such_setting = 1\n");
        assert!(sections.len() > 10, "{sections:?}");
        for section in &sections {
            let probe = format!("[{section}]\nno_such_setting = 1\n");
            let keys = match FileConfig::from_toml(&probe) {
                Ok(_) => panic!("[{section}] took an unknown key"),
                Err(e) if e.reason.contains("unknown field") => fields(&probe),
                // Not a table: a top-level setting.
                Err(_) => {
                    assert!(named("", section), "the example lacks {section}");
                    continue;
                }
            };
            for key in keys {
                assert!(named(section, &key), "the example lacks {section}.{key}");
            }
        }
    }
}
