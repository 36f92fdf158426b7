//! Signed, expiring bearer tokens, with no I/O.
//!
//! Used at every edge that admits someone: support staff reading trails (`trail:read`),
//! customers and restaurants watching one order (`track`, bound to that order), couriers
//! connecting to the broker (`courier`, bound to their id). A token is
//! `v1.<key id>.<claims, base64url JSON>.<HMAC-SHA256, base64url>`; the key id lets a
//! deployment rotate secrets: sign with the newest key, accept every key still listed.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::BTreeMap;

type HmacSha256 = Hmac<Sha256>;

/// What a token says about its bearer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Who: a support actor's name, a courier id, or `customer` / `restaurant`.
    pub sub: String,
    /// What it allows, e.g. `trail:read`, `track`, `courier`.
    pub scope: String,
    /// The order a `track` token is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    /// Issued at, unix seconds.
    pub iat: u64,
    /// Expires at, unix seconds.
    pub exp: u64,
}

impl Claims {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scope.split(' ').any(|s| s == scope)
    }
}

/// Why a token was refused. The message never repeats the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is malformed")]
    Malformed,
    #[error("token was signed with an unknown key")]
    UnknownKey,
    #[error("token signature does not match")]
    BadSignature,
    #[error("token has expired")]
    Expired,
}

/// Why a keyring could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    #[error("no signing keys")]
    Empty,
    #[error("key id {0:?} must be 1-32 characters of [A-Za-z0-9_-]")]
    BadKeyId(String),
    #[error("key {0:?} is shorter than 16 bytes")]
    ShortSecret(String),
    #[error("expected kid:secret[,kid:secret...], got an entry without ':'")]
    Syntax,
    #[error("key id {0:?} is listed twice")]
    DuplicateKeyId(String),
}

/// Signing keys by id; the first one given signs, all of them verify.
#[derive(Clone)]
pub struct Keyring {
    current: String,
    keys: BTreeMap<String, Vec<u8>>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach logs.
        f.debug_struct("Keyring")
            .field("current", &self.current)
            .field("key_ids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Keyring {
    /// Builds a keyring from `(id, secret)` pairs; the first pair signs.
    pub fn new<I, K, S>(pairs: I) -> Result<Self, KeyringError>
    where
        I: IntoIterator<Item = (K, S)>,
        K: Into<String>,
        S: AsRef<[u8]>,
    {
        let mut current = None;
        let mut keys = BTreeMap::new();
        for (kid, secret) in pairs {
            let kid = kid.into();
            if kid.is_empty()
                || kid.len() > 32
                || !kid
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(KeyringError::BadKeyId(kid));
            }
            if secret.as_ref().len() < 16 {
                return Err(KeyringError::ShortSecret(kid));
            }
            current.get_or_insert_with(|| kid.clone());
            // A second secret under one id would silently replace the first: `k1:new,k1:old`
            // would sign with `old`.
            if keys.insert(kid.clone(), secret.as_ref().to_vec()).is_some() {
                return Err(KeyringError::DuplicateKeyId(kid));
            }
        }
        Ok(Keyring {
            current: current.ok_or(KeyringError::Empty)?,
            keys,
        })
    }

    /// Parses `kid:secret[,kid:secret...]` (the first signs), as set in configuration.
    pub fn parse(spec: &str) -> Result<Self, KeyringError> {
        let pairs = spec
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|p| p.split_once(':').ok_or(KeyringError::Syntax))
            .collect::<Result<Vec<_>, _>>()?;
        Keyring::new(pairs)
    }

    /// The id of the key that signs.
    pub fn current_key_id(&self) -> &str {
        &self.current
    }

    fn mac(&self, kid: &str, signed: &str) -> Option<HmacSha256> {
        let key = self.keys.get(kid)?;
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
        mac.update(signed.as_bytes());
        Some(mac)
    }

    /// Signs `claims` with the current key.
    pub fn sign(&self, claims: &Claims) -> String {
        let body = B64.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let signed = format!("v1.{}.{body}", self.current);
        let sig = self
            .mac(&self.current, &signed)
            .expect("current key is in the ring")
            .finalize()
            .into_bytes();
        format!("{signed}.{}", B64.encode(sig))
    }

    /// Checks signature and expiry at `now` (unix seconds) and returns the claims.
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        let (signed, sig) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let mut parts = signed.splitn(3, '.');
        let (Some("v1"), Some(kid), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(TokenError::Malformed);
        };
        let sig = B64.decode(sig).map_err(|_| TokenError::Malformed)?;
        let mac = self.mac(kid, signed).ok_or(TokenError::UnknownKey)?;
        // Constant-time comparison.
        mac.verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        let claims: Claims =
            serde_json::from_slice(&B64.decode(body).map_err(|_| TokenError::Malformed)?)
                .map_err(|_| TokenError::Malformed)?;
        if now >= claims.exp {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ring() -> Keyring {
        Keyring::parse("k2:0123456789abcdef-two,k1:0123456789abcdef-one").unwrap()
    }

    fn claims(exp: u64) -> Claims {
        Claims {
            sub: "alice".into(),
            scope: "trail:read".into(),
            order: None,
            iat: 100,
            exp,
        }
    }

    #[test]
    fn signs_and_verifies() {
        let t = ring().sign(&claims(200));
        assert!(t.starts_with("v1.k2."));
        let c = ring().verify(&t, 150).unwrap();
        assert_eq!(c, claims(200));
        assert!(c.has_scope("trail:read"));
        assert!(!c.has_scope("trail"));
    }

    #[test]
    fn expiry_is_enforced() {
        let t = ring().sign(&claims(200));
        assert_eq!(ring().verify(&t, 200), Err(TokenError::Expired));
    }

    #[test]
    fn rotation_accepts_old_keys_still_listed_and_only_those() {
        let old = Keyring::parse("k1:0123456789abcdef-one").unwrap();
        let t = old.sign(&claims(200));
        assert!(ring().verify(&t, 150).is_ok());
        let retired = Keyring::parse("k3:0123456789abcdef-three").unwrap();
        assert_eq!(retired.verify(&t, 150), Err(TokenError::UnknownKey));
    }

    #[test]
    fn forgeries_are_refused() {
        let t = ring().sign(&claims(200));
        // Same key id, another secret.
        let forger = Keyring::parse("k2:not-the-real-secret-at-all").unwrap();
        assert_eq!(
            ring().verify(&forger.sign(&claims(9_999)), 150),
            Err(TokenError::BadSignature)
        );
        // Claims edited after signing.
        let (head, sig) = t.rsplit_once('.').unwrap();
        let (prefix, _) = head.rsplit_once('.').unwrap();
        let mut c = claims(9_999);
        c.scope = "trail:read admin".into();
        let edited = format!(
            "{prefix}.{}.{sig}",
            B64.encode(serde_json::to_vec(&c).unwrap())
        );
        assert_eq!(ring().verify(&edited, 150), Err(TokenError::BadSignature));
        for bad in ["", "v1", "v1.k2.x", "v2.k2.e30.AAAA", "v1.k2.e30.!!!"] {
            assert!(ring().verify(bad, 150).is_err(), "{bad}");
        }
    }

    #[test]
    fn keyring_rules() {
        assert_eq!(Keyring::parse("").unwrap_err(), KeyringError::Empty);
        assert_eq!(
            Keyring::parse("k1:short").unwrap_err(),
            KeyringError::ShortSecret("k1".into())
        );
        assert_eq!(Keyring::parse("nocolon").unwrap_err(), KeyringError::Syntax);
        assert_eq!(
            Keyring::parse("k1:0123456789abcdef-new,k1:0123456789abcdef-old").unwrap_err(),
            KeyringError::DuplicateKeyId("k1".into())
        );
        assert!(matches!(
            Keyring::parse("a.b:0123456789abcdef"),
            Err(KeyringError::BadKeyId(_))
        ));
        assert!(!format!("{:?}", ring()).contains("0123456789abcdef"));
    }

    proptest! {
        #[test]
        fn random_tokens_never_verify_or_panic(s in "\\PC{0,200}") {
            prop_assert!(ring().verify(&s, 150).is_err());
        }
    }
}

/// Scope of a courier's device token: publishes his own points.
pub const SCOPE_COURIER: &str = "courier";
/// Scope of the pipeline's own workers (ingest, history, fanout) on the broker.
pub const SCOPE_SERVICE: &str = "service";

impl Claims {
    /// A courier's device token: `sub` is the courier id, which must also be the MQTT username.
    pub fn courier(id: &str, now: u64, ttl_secs: u64) -> Self {
        Claims {
            sub: id.into(),
            scope: SCOPE_COURIER.into(),
            order: None,
            iat: now,
            exp: now + ttl_secs,
        }
    }

    /// A worker's broker credential.
    pub fn service(role: &str, now: u64, ttl_secs: u64) -> Self {
        Claims {
            sub: role.into(),
            scope: SCOPE_SERVICE.into(),
            order: None,
            iat: now,
            exp: now + ttl_secs,
        }
    }
}

/// Who a broker login turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerLogin {
    Courier(String),
    Service(String),
}

/// Why a broker login was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("a courier token must be presented with its courier id as username")]
    WrongUser,
    #[error("token scope does not admit a broker login")]
    WrongScope,
}

/// Checks an MQTT CONNECT's username and password (a token). A courier logs in with his id
/// and his device token; a worker with any username and a service token.
pub fn broker_login(
    keys: &Keyring,
    username: &str,
    password: &str,
    now: u64,
) -> Result<BrokerLogin, LoginError> {
    let claims = keys.verify(password, now)?;
    if claims.has_scope(SCOPE_COURIER) {
        return if claims.sub == username {
            Ok(BrokerLogin::Courier(claims.sub))
        } else {
            Err(LoginError::WrongUser)
        };
    }
    if claims.has_scope(SCOPE_SERVICE) {
        return Ok(BrokerLogin::Service(claims.sub));
    }
    Err(LoginError::WrongScope)
}

#[cfg(test)]
mod login_tests {
    use super::*;

    #[test]
    fn couriers_log_in_as_themselves_only() {
        let k = Keyring::parse("k1:0123456789abcdef").unwrap();
        let t = k.sign(&Claims::courier("c42", 100, 3600));
        assert_eq!(
            broker_login(&k, "c42", &t, 200),
            Ok(BrokerLogin::Courier("c42".into()))
        );
        assert_eq!(broker_login(&k, "c43", &t, 200), Err(LoginError::WrongUser));
        assert_eq!(
            broker_login(&k, "c42", &t, 4000),
            Err(LoginError::Token(TokenError::Expired))
        );
        assert!(broker_login(&k, "c42", "c42", 200).is_err());
        let s = k.sign(&Claims::service("ingest", 100, 3600));
        assert_eq!(
            broker_login(&k, "anything", &s, 200),
            Ok(BrokerLogin::Service("ingest".into()))
        );
        let support = k.sign(&Claims {
            sub: "alice".into(),
            scope: "trail:read".into(),
            order: None,
            iat: 100,
            exp: 4000,
        });
        assert_eq!(
            broker_login(&k, "alice", &support, 200),
            Err(LoginError::WrongScope)
        );
    }
}
