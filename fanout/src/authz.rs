//! Who may watch what, with no I/O: the CONNECT token and the SUBSCRIBE filters.

use crate::events::Refusal;
use courier_auth::{Keyring, TokenError};

/// The scope of a tracking token.
pub const TRACK_SCOPE: &str = "track";

/// What a valid tracking token grants: one order, until `exp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub order: String,
    /// `customer` or `restaurant`.
    pub viewer: String,
    /// Expiry, unix seconds.
    pub exp: u64,
}

/// Checks the CONNECT password as a tracking token at `now` (unix seconds).
pub fn check_token(keys: &Keyring, password: Option<&str>, now: u64) -> Result<Grant, Refusal> {
    let token = password
        .filter(|p| !p.is_empty())
        .ok_or(Refusal::BadToken)?;
    let claims = keys.verify(token, now).map_err(|e| match e {
        TokenError::Expired => Refusal::ExpiredToken,
        TokenError::Malformed | TokenError::UnknownKey | TokenError::BadSignature => {
            Refusal::BadToken
        }
    })?;
    if !claims.has_scope(TRACK_SCOPE) {
        return Err(Refusal::BadToken);
    }
    match claims.order {
        Some(order) if courier_wire::topic::valid_id(&order) => Ok(Grant {
            order,
            viewer: claims.sub,
            exp: claims.exp,
        }),
        _ => Err(Refusal::BadToken),
    }
}

/// The only filter a viewer of `order` may subscribe: exactly `track/<order>`. Wildcards,
/// other orders, `$SYS`, shared subscriptions: all refused.
pub fn filter_allowed(order: &str, filter: &str) -> bool {
    filter.strip_prefix("track/") == Some(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_auth::Claims;

    fn ring() -> Keyring {
        Keyring::parse("k1:0123456789abcdef-one").unwrap()
    }

    fn token(scope: &str, order: Option<&str>, exp: u64) -> String {
        ring().sign(&Claims {
            sub: "customer".into(),
            scope: scope.into(),
            order: order.map(Into::into),
            iat: 100,
            exp,
        })
    }

    #[test]
    fn a_track_token_grants_its_order() {
        let g = check_token(&ring(), Some(&token("track", Some("o1"), 200)), 150).unwrap();
        assert_eq!(
            g,
            Grant {
                order: "o1".into(),
                viewer: "customer".into(),
                exp: 200
            }
        );
    }

    #[test]
    fn bad_tokens_are_refused_with_their_reason() {
        let r = ring();
        assert_eq!(check_token(&r, None, 150), Err(Refusal::BadToken));
        assert_eq!(check_token(&r, Some(""), 150), Err(Refusal::BadToken));
        assert_eq!(
            check_token(&r, Some("v1.k1.x.y"), 150),
            Err(Refusal::BadToken)
        );
        assert_eq!(
            check_token(&r, Some(&token("track", Some("o1"), 200)), 200),
            Err(Refusal::ExpiredToken)
        );
        assert_eq!(
            check_token(&r, Some(&token("trail:read", Some("o1"), 200)), 150),
            Err(Refusal::BadToken)
        );
        assert_eq!(
            check_token(&r, Some(&token("track", None, 200)), 150),
            Err(Refusal::BadToken)
        );
        assert_eq!(
            check_token(&r, Some(&token("track", Some("o/#"), 200)), 150),
            Err(Refusal::BadToken)
        );
        let forger = Keyring::parse("k1:not-the-real-secret-at-all").unwrap();
        let forged = forger.sign(&Claims {
            sub: "x".into(),
            scope: "track".into(),
            order: Some("o1".into()),
            iat: 1,
            exp: 999,
        });
        assert_eq!(check_token(&r, Some(&forged), 150), Err(Refusal::BadToken));
    }

    #[test]
    fn only_the_orders_own_topic_is_allowed() {
        assert!(filter_allowed("o1", "track/o1"));
        for f in [
            "track/#",
            "track/+",
            "#",
            "+/o1",
            "track/o2",
            "track/o1/#",
            "track/o1/x",
            "$SYS/#",
            "$share/g/track/o1",
            "track/",
            "",
            "couriers/+/loc",
            "track/o10",
        ] {
            assert!(!filter_allowed("o1", f), "{f}");
        }
    }
}
