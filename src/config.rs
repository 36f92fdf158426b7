//! Configuration: defaults, then `--config FILE` (TOML), then environment, then flags;
//! validated once at start-up into real types. A bad setting is one error naming it.

use courier_wire::{Keys, MqttEndpoint};
use ingest::IngestConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MqttSection {
    /// External broker (`MQTT_URL`), e.g. `mqtt://127.0.0.1:1883`. Unset: `run` embeds one.
    pub url: Option<String>,
    /// TCP address of the embedded broker (`MQTT_LISTEN`).
    pub listen: String,
    /// rumqttd configuration of the embedded broker; unset: the built-in copy of
    /// `broker-config/rumqttd.toml`.
    pub broker_config: Option<PathBuf>,
}

impl Default for MqttSection {
    fn default() -> Self {
        MqttSection {
            url: None,
            listen: "127.0.0.1:1883".into(),
            broker_config: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSection {
    /// `REDIS_URL`.
    pub url: String,
    /// Prepended to every key name: `{riyadh}:` for a Redis Cluster hash tag.
    pub key_prefix: String,
}

impl Default for RedisSection {
    fn default() -> Self {
        RedisSection {
            url: "redis://127.0.0.1:6379/".into(),
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
    /// Token signing keys (`AUTH_KEYS`): `kid:secret[,kid:secret...]`, the first signs, all
    /// verify (rotation). Secrets of at least 16 bytes. Unset: roles that check tokens refuse
    /// to start.
    pub keys: Option<String>,
}

/// Values from the environment or flags, applied over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub mqtt_url: Option<String>,
    pub mqtt_listen: Option<String>,
    pub redis_url: Option<String>,
    pub metrics_listen: Option<String>,
    pub database_url: Option<String>,
    pub http_listen: Option<String>,
    pub ws_listen: Option<String>,
    pub auth_keys: Option<String>,
}

/// Where the roles find their broker.
#[derive(Debug, Clone, PartialEq)]
pub enum Broker {
    /// Start rumqttd in this process, listening here.
    Embedded { listen: SocketAddr, config: Option<PathBuf> },
    External(MqttEndpoint),
}

impl Broker {
    /// The address clients of this process connect to.
    pub fn endpoint(&self) -> MqttEndpoint {
        match self {
            Broker::Embedded { listen, .. } => MqttEndpoint::new(listen.ip().to_string(), listen.port()),
            Broker::External(e) => e.clone(),
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub broker: Broker,
    pub redis_url: String,
    pub keys: Keys,
    pub metrics_listen: Option<SocketAddr>,
    pub database_url: String,
    pub http_listen: SocketAddr,
    pub ws_listen: SocketAddr,
    /// Token keys; `None` when not configured.
    pub auth: Option<courier_auth::Keyring>,
    pub ingest: IngestConfig,
    pub shutdown_grace: Duration,
}

/// A setting that cannot work, with its name.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {reason}")]
pub struct ConfigError {
    pub setting: String,
    pub reason: String,
}

fn err(setting: &str, reason: impl ToString) -> ConfigError {
    ConfigError {
        setting: setting.to_string(),
        reason: reason.to_string(),
    }
}

impl FileConfig {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| err("--config", format!("{}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| err("--config", format!("{}: {}", path.display(), e.reason)))
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
        if let Some(v) = o.auth_keys.filter(|v| !v.is_empty()) {
            self.auth.keys = Some(v);
        }
        let broker = match &self.mqtt.url {
            Some(url) => Broker::External(MqttEndpoint::parse(url).map_err(|e| err("MQTT_URL", e))?),
            None => Broker::Embedded {
                listen: self.mqtt.listen.parse().map_err(|e| err("MQTT_LISTEN", format!("{:?}: {e}", self.mqtt.listen)))?,
                config: self.mqtt.broker_config.clone(),
            },
        };
        if !(self.redis.url.starts_with("redis://") || self.redis.url.starts_with("rediss://") || self.redis.url.starts_with("unix://")) {
            return Err(err("REDIS_URL", format!("{:?} is not a redis:// URL", self.redis.url)));
        }
        let metrics_listen = match self.metrics.listen.as_str() {
            "off" | "" => None,
            v => Some(v.parse().map_err(|e| err("METRICS_LISTEN", format!("{v:?}: {e}")))?),
        };
        if !(self.database.url.starts_with("postgres://") || self.database.url.starts_with("postgresql://")) {
            return Err(err("DATABASE_URL", "expected a postgres:// URL"));
        }
        let addr = |name: &str, v: &str| v.parse::<SocketAddr>().map_err(|e| err(name, format!("{v:?}: {e}")));
        let http_listen = addr("HTTP_LISTEN", &self.http.listen)?;
        let ws_listen = addr("WS_LISTEN", &self.http.ws_listen)?;
        let auth = match &self.auth.keys {
            Some(spec) => Some(courier_auth::Keyring::parse(spec).map_err(|e| err("AUTH_KEYS", e))?),
            None => None,
        };
        self.ingest.validate().map_err(|e| {
            let (setting, reason) = e.split_once(' ').unwrap_or((e.as_str(), ""));
            err(setting, reason)
        })?;
        Ok(Config {
            broker,
            redis_url: self.redis.url,
            keys: Keys::with_prefix(&self.redis.key_prefix),
            metrics_listen,
            database_url: self.database.url,
            http_listen,
            ws_listen,
            auth,
            ingest: self.ingest,
            shutdown_grace: self.shutdown_grace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_embed_the_broker() {
        let c = FileConfig::default().resolve(Overrides::default()).unwrap();
        assert_eq!(
            c.broker,
            Broker::Embedded { listen: "127.0.0.1:1883".parse().unwrap(), config: None }
        );
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.keys, Keys::default());
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
        assert_eq!(c.redis_url, "redis://127.0.0.1:7000/");
        assert_eq!(c.keys.live, "{riyadh}:couriers:live");
        assert_eq!(c.ingest.evict_after, Duration::from_secs(120));
        assert_eq!(c.broker, Broker::External(MqttEndpoint::new("127.0.0.1", 1884)));
    }

    #[test]
    fn bad_settings_name_themselves() {
        let bad = |o: Overrides| FileConfig::default().resolve(o).unwrap_err().setting;
        assert_eq!(bad(Overrides { mqtt_url: Some("http://x".into()), ..Default::default() }), "MQTT_URL");
        assert_eq!(bad(Overrides { mqtt_listen: Some("nope".into()), ..Default::default() }), "MQTT_LISTEN");
        assert_eq!(bad(Overrides { redis_url: Some("localhost".into()), ..Default::default() }), "REDIS_URL");
        assert_eq!(bad(Overrides { metrics_listen: Some(":x".into()), ..Default::default() }), "METRICS_LISTEN");
        assert_eq!(bad(Overrides { database_url: Some("mysql://x".into()), ..Default::default() }), "DATABASE_URL");
        assert_eq!(bad(Overrides { http_listen: Some("x".into()), ..Default::default() }), "HTTP_LISTEN");
        assert_eq!(bad(Overrides { ws_listen: Some("x".into()), ..Default::default() }), "WS_LISTEN");
        assert_eq!(bad(Overrides { auth_keys: Some("k1:short".into()), ..Default::default() }), "AUTH_KEYS");
        let e = FileConfig::from_toml("[ingest]\nbatch_size = 3\n").unwrap_err();
        assert!(e.reason.contains("batch_size"), "{e}");
        let e = FileConfig::from_toml("[ingest]\nworkers = 0\n").unwrap().resolve(Overrides::default()).unwrap_err();
        assert_eq!(e.setting, "ingest.workers");
    }
}
