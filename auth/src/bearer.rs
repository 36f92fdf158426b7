//! Reading a bearer credential from an `Authorization` header, the one way every HTTP API of
//! the pipeline does it (orders, webhooks, trail, aggregates, erasure, maps): before, four
//! parsers disagreed on the scheme's case and on spaces.

/// The credential of an `Authorization` header value in the Bearer scheme (RFC 6750 §2.1; the
/// scheme name is case-insensitive, RFC 9110 §11.1), trimmed; `None` for another scheme or an
/// empty credential.
pub fn bearer_credential(authorization: &str) -> Option<&str> {
    let (scheme, rest) = authorization.trim_start().split_once(' ')?;
    let credential = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !credential.is_empty()).then_some(credential)
}

/// Equality of a presented secret (a service key) and the expected one, in time that does not
/// depend on where they differ.
pub fn same_secret(presented: &[u8], expected: &[u8]) -> bool {
    presented.len() == expected.len()
        && presented
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_read_in_any_case_and_nothing_else_is() {
        for (header, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER  abc ", Some("abc")),
            ("Bearer", None),
            ("Bearer   ", None),
            ("Basic abc", None),
            ("Bearerabc", None),
            ("", None),
        ] {
            assert_eq!(bearer_credential(header), want, "{header:?}");
        }
    }

    #[test]
    fn secrets_are_equal_only_when_every_byte_is() {
        assert!(same_secret(b"key-1", b"key-1"));
        assert!(!same_secret(b"key-1", b"key-2"));
        assert!(!same_secret(b"key-1", b"key-10"));
        assert!(!same_secret(b"", b"k"));
    }
}
