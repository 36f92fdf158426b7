//! Who may watch what, with no I/O: the CONNECT token and the SUBSCRIBE filters.

use crate::events::ViewerRefusal;
use courier_auth::{TokenError, Verifier};

/// What a valid tracking token grants: one order, until `exp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub order: String,
    /// `customer` or `restaurant`.
    pub viewer: String,
    /// Expiry, unix seconds.
    pub exp: u64,
}

/// Checks the CONNECT password as a tracking token at `now` (unix seconds). `keys` are the
/// viewer audience's: a courier's device token or a trail token is refused as an unknown key.
pub(crate) fn check_token(
    keys: &Verifier,
    password: Option<&str>,
    now: u64,
) -> Result<Grant, ViewerRefusal> {
    let token = password
        .filter(|p| !p.is_empty())
        .ok_or(ViewerRefusal::BadToken)?;
    let claims = keys.verify(token, now).map_err(|e| match e {
        TokenError::Expired => ViewerRefusal::ExpiredToken,
        TokenError::Malformed
        | TokenError::UnknownKey
        | TokenError::BadSignature
        | TokenError::WrongAudience => ViewerRefusal::BadToken,
    })?;
    match claims.order {
        Some(order) if courier_wire::topic::valid_id(&order) => Ok(Grant {
            order,
            viewer: claims.sub,
            exp: claims.exp,
        }),
        _ => Err(ViewerRefusal::BadToken),
    }
}

/// The only filter a viewer of `order` may subscribe: exactly `track/<order>`. Wildcards,
/// other orders, `$SYS`, shared subscriptions: all refused.
pub(crate) fn filter_allowed(order: &str, filter: &str) -> bool {
    filter.strip_prefix("track/") == Some(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_auth::{Audience, Claims, SigningKey};

    fn signer() -> &'static SigningKey {
        static KEY: std::sync::OnceLock<SigningKey> = std::sync::OnceLock::new();
        KEY.get_or_init(|| SigningKey::generate(Audience::Viewer).unwrap())
    }

    fn ring() -> Verifier {
        Verifier::new(Audience::Viewer, [signer().public().clone()]).unwrap()
    }

    fn token(aud: Audience, order: Option<&str>, exp: u64) -> String {
        signer().sign(&Claims {
            aud,
            sub: "customer".into(),
            order: order.map(Into::into),
            iat: 100,
            exp,
        })
    }

    #[test]
    fn a_track_token_grants_its_order() {
        let g = check_token(
            &ring(),
            Some(&token(Audience::Viewer, Some("o1"), 200)),
            150,
        )
        .unwrap();
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
        assert_eq!(check_token(&r, None, 150), Err(ViewerRefusal::BadToken));
        assert_eq!(check_token(&r, Some(""), 150), Err(ViewerRefusal::BadToken));
        assert_eq!(
            check_token(&r, Some("e30.e30.e30"), 150),
            Err(ViewerRefusal::BadToken)
        );
        assert_eq!(
            check_token(&r, Some(&token(Audience::Viewer, Some("o1"), 200)), 200),
            Err(ViewerRefusal::ExpiredToken)
        );
        assert_eq!(
            check_token(&r, Some(&token(Audience::Trail, Some("o1"), 200)), 150),
            Err(ViewerRefusal::BadToken)
        );
        assert_eq!(
            check_token(&r, Some(&token(Audience::Viewer, None, 200)), 150),
            Err(ViewerRefusal::BadToken)
        );
        assert_eq!(
            check_token(&r, Some(&token(Audience::Viewer, Some("o/#"), 200)), 150),
            Err(ViewerRefusal::BadToken)
        );
        let forger = SigningKey::generate(Audience::Viewer).unwrap();
        let forged = forger.sign(&Claims::viewer("x", "o1", 1, 999));
        assert_eq!(
            check_token(&r, Some(&forged), 150),
            Err(ViewerRefusal::BadToken)
        );
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
