//! Where a role finds its MQTT broker: `mqtt://[user[:password]@]host[:port]`.

/// A parsed `MQTT_URL`. Kept free of any MQTT client type so every role builds its own options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttEndpoint {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// Why an `MQTT_URL` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("expected mqtt://host[:port] or tcp://host[:port], got scheme {0:?}")]
    Scheme(String),
    #[error("missing host")]
    NoHost,
    #[error("bad port {0:?}")]
    Port(String),
}

impl MqttEndpoint {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        MqttEndpoint {
            host: host.into(),
            port,
            username: None,
            password: None,
        }
    }

    /// Parses `mqtt://` or `tcp://` URLs; the port defaults to 1883.
    pub fn parse(url: &str) -> Result<Self, EndpointError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| EndpointError::Scheme(String::new()))?;
        if scheme != "mqtt" && scheme != "tcp" {
            return Err(EndpointError::Scheme(scheme.to_string()));
        }
        let rest = rest.trim_end_matches('/');
        let (auth, hostport) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, p) = v6.split_once(']').ok_or(EndpointError::NoHost)?;
            (h, p.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(EndpointError::NoHost);
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| EndpointError::Port(p.to_string()))?,
            None => 1883,
        };
        let (username, password) = match auth {
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (Some(a.to_string()), None),
            },
            None => (None, None),
        };
        Ok(MqttEndpoint {
            host: host.to_string(),
            port,
            username,
            password,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(
            MqttEndpoint::parse("mqtt://127.0.0.1:1883").unwrap(),
            MqttEndpoint::new("127.0.0.1", 1883)
        );
        assert_eq!(MqttEndpoint::parse("tcp://broker").unwrap().port, 1883);
        let e = MqttEndpoint::parse("mqtt://svc:s3cret@[::1]:2883/").unwrap();
        assert_eq!(e.host, "::1");
        assert_eq!(e.port, 2883);
        assert_eq!(e.username.as_deref(), Some("svc"));
        assert_eq!(e.password.as_deref(), Some("s3cret"));
    }

    #[test]
    fn refuses_bad_urls() {
        assert!(matches!(MqttEndpoint::parse("http://x"), Err(EndpointError::Scheme(_))));
        assert!(matches!(MqttEndpoint::parse("127.0.0.1:1883"), Err(EndpointError::Scheme(_))));
        assert_eq!(MqttEndpoint::parse("mqtt://:1883"), Err(EndpointError::NoHost));
        assert!(matches!(MqttEndpoint::parse("mqtt://h:99999"), Err(EndpointError::Port(_))));
    }
}
