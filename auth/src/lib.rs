//! Tokens of courier-pipeline: JWT (RFC 7519) signed with EdDSA (Ed25519), one key set per
//! audience. No network I/O; [`KeySet::load`] reads key files once at start-up.
//!
//! Every door that admits someone checks a token of its own audience:
//!
//! | audience  | bearer                       | minted by                     | checked by                  |
//! |-----------|------------------------------|-------------------------------|-----------------------------|
//! | `courier` | a courier's phone (device)   | provisioning (`token courier`) | the MQTT edge (CONNECT)     |
//! | `viewer`  | a customer / restaurant app  | the orders API                | the viewer gateway          |
//! | `trail`   | support staff                | the support login (`token trail`) | the trail API           |
//! | `bus`     | the pipeline's own workers   | each worker, or `token bus`   | the embedded bus broker     |
//! | `privacy` | the data-protection officer  | `token privacy`               | the erasure API (history)   |
//! | `ops`     | operations staff             | `token ops`                   | the operations map (web), the trail API |
//!
//! A process reads the private key only of the audiences it mints for and public keys for
//! those it checks, so the internet-facing edge can mint nothing. Tokens carry a `kid` header;
//! rotation is by kid: a new key signs, the old public key stays until its tokens expire.
//!
//! The JWT encoding and the signature are jsonwebtoken's (ring underneath, already in the
//! build for rustls). Written here: reading the key files (PKCS#8 / SPKI PEM as `openssl
//! genpkey -algorithm ed25519` writes them, or JWK), the RFC 7638 thumbprint that names a PEM
//! key, and the JWKS document.

mod bearer;
mod keys;

pub use bearer::{bearer_credential, same_secret};
pub use keys::{KeyError, KeySet, PublicKey, SigningKey, Verifier};

/// Who a token is for: each audience has its own keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Audience {
    /// A courier's device token: MQTT password at the edge, username = the courier id.
    Courier,
    /// A tracking token: watch one order's track at the viewer gateway.
    Viewer,
    /// Support staff reading a courier's trail (audited).
    Trail,
    /// The pipeline's own workers on the bus broker.
    Bus,
    /// The data-protection officer erasing a courier's data (audited). Its own key, so that no
    /// support (trail) token can erase.
    Privacy,
    /// Operations staff on the live map (`/ops`); also admitted by the trail API (audited).
    /// Its own key, so that a support (trail) token cannot watch the whole fleet live.
    Ops,
}

impl Audience {
    pub const ALL: [Audience; 6] = [
        Audience::Courier,
        Audience::Viewer,
        Audience::Trail,
        Audience::Bus,
        Audience::Privacy,
        Audience::Ops,
    ];

    /// The `aud` claim, also the key files' name (`<aud>.key`, `<aud>.pub`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Audience::Courier => "courier",
            Audience::Viewer => "viewer",
            Audience::Trail => "trail",
            Audience::Bus => "bus",
            Audience::Privacy => "privacy",
            Audience::Ops => "ops",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Audience {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a verified token says about its bearer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub aud: Audience,
    /// Who: a courier id, a support actor, `customer` / `restaurant`, or a worker role.
    pub sub: String,
    /// The order a `viewer` token is bound to.
    pub order: Option<String>,
    /// Issued at, unix seconds.
    pub iat: u64,
    /// Expires at, unix seconds.
    pub exp: u64,
}

/// The `iss` of the tokens this project mints (not checked: the key and `aud` decide).
pub(crate) const ISSUER: &str = "courier-pipeline";

impl Claims {
    fn new(aud: Audience, sub: &str, now: u64, ttl_secs: u64) -> Self {
        Claims {
            aud,
            sub: sub.into(),
            order: None,
            iat: now,
            exp: now.saturating_add(ttl_secs),
        }
    }

    /// A courier's device token: `sub` is the courier id, which must also be the MQTT username.
    pub fn courier(id: &str, now: u64, ttl_secs: u64) -> Self {
        Self::new(Audience::Courier, id, now, ttl_secs)
    }

    /// A tracking token of `viewer` (`customer` / `restaurant`) for one order.
    pub fn viewer(viewer: &str, order: &str, now: u64, ttl_secs: u64) -> Self {
        Claims {
            order: Some(order.into()),
            ..Self::new(Audience::Viewer, viewer, now, ttl_secs)
        }
    }

    /// A support actor's trail token; `sub` is recorded in the trail access log.
    pub fn trail(actor: &str, now: u64, ttl_secs: u64) -> Self {
        Self::new(Audience::Trail, actor, now, ttl_secs)
    }

    /// A data-protection officer's erasure token; `sub` is recorded in the erasure log.
    pub fn privacy(actor: &str, now: u64, ttl_secs: u64) -> Self {
        Self::new(Audience::Privacy, actor, now, ttl_secs)
    }

    /// An operations user's map token; `sub` names him in the trail access log.
    pub fn ops(user: &str, now: u64, ttl_secs: u64) -> Self {
        Self::new(Audience::Ops, user, now, ttl_secs)
    }

    /// A worker's bus login; `sub` is its role.
    pub fn bus(role: &str, now: u64, ttl_secs: u64) -> Self {
        Self::new(Audience::Bus, role, now, ttl_secs)
    }
}

/// Why a token was refused. The message never repeats the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is malformed")]
    Malformed,
    #[error("token was signed with an unknown key")]
    UnknownKey,
    #[error("token signature does not match")]
    BadSignature,
    #[error("token is for another audience")]
    WrongAudience,
    #[error("token has expired")]
    Expired,
}

impl TokenError {
    /// A metric label.
    pub fn label(self) -> &'static str {
        match self {
            TokenError::Malformed => "malformed",
            TokenError::UnknownKey => "unknown_key",
            TokenError::BadSignature => "bad_signature",
            TokenError::WrongAudience => "wrong_audience",
            TokenError::Expired => "expired",
        }
    }
}

/// Why a bus login was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("a bus token must be presented with its role as username")]
    WrongUser,
}

/// Checks an MQTT CONNECT at the bus: username = the worker's role, password = its bus token.
/// Returns the role.
pub fn bus_login(
    keys: &Verifier,
    username: &str,
    password: &str,
    now: u64,
) -> Result<String, LoginError> {
    let claims = keys.verify(password, now)?;
    if claims.sub != username {
        return Err(LoginError::WrongUser);
    }
    Ok(claims.sub)
}

/// The `sub` of a token, read WITHOUT checking anything: only to fill in the username a
/// process presents the bus token it was given under. Never for a decision.
pub fn unverified_subject(token: &str) -> Option<String> {
    use base64::Engine;
    let body = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body)
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("sub")?.as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(aud: Audience) -> SigningKey {
        SigningKey::generate(aud).unwrap()
    }

    #[test]
    fn workers_log_in_under_their_own_role_only() {
        let k = key(Audience::Bus);
        let v = Verifier::new(Audience::Bus, [k.public().clone()]).unwrap();
        let t = k.sign(&Claims::bus("ingest", 100, 3600));
        assert_eq!(bus_login(&v, "ingest", &t, 200), Ok("ingest".into()));
        assert_eq!(
            bus_login(&v, "history", &t, 200),
            Err(LoginError::WrongUser)
        );
        assert_eq!(
            bus_login(&v, "ingest", &t, 3700),
            Err(LoginError::Token(TokenError::Expired))
        );
        // A courier's device token, even one signed with the same key (a misconfiguration
        // KeySet refuses), is not a bus login.
        let courier = k.sign(&Claims::courier("ingest", 100, 3600));
        assert_eq!(
            bus_login(&v, "ingest", &courier, 200),
            Err(LoginError::Token(TokenError::WrongAudience))
        );
    }
}
