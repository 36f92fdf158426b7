//! Token keys of the tests (made once per test process) and the CLI's token commands.

use super::*;

/// A key directory (`AUTH_KEY_DIR`) with a fresh key pair of every audience, written once per
/// test binary; child processes get it through [`with_test_keys`].
pub fn test_key_dir() -> &'static std::path::Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!(
            "courier-test-keys-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&d).unwrap();
        for aud in courier_auth::Audience::ALL {
            let k = courier_auth::SigningKey::generate(aud).unwrap();
            std::fs::write(d.join(format!("{aud}.key")), k.to_pem()).unwrap();
            std::fs::write(d.join(format!("{aud}.pub")), k.public().to_pem()).unwrap();
        }
        d
    })
}

/// The test key directory, every private key read.
pub fn test_keys() -> &'static courier_auth::KeySet {
    static KEYS: OnceLock<courier_auth::KeySet> = OnceLock::new();
    KEYS.get_or_init(|| {
        courier_auth::KeySet::load(test_key_dir(), &courier_auth::Audience::ALL).unwrap()
    })
}

/// A token of `claims`, signed with its audience's test key.
pub fn sign(claims: &courier_auth::Claims) -> String {
    test_keys().signer(claims.aud).unwrap().sign(claims)
}

/// The public keys of `aud` that the test processes accept.
pub fn test_verifier(aud: courier_auth::Audience) -> courier_auth::Verifier {
    test_keys().verifier(aud).unwrap().clone()
}

/// `courier-pipeline` with the test key directory (and the test service key) in its
/// environment, and no AUTH_KEY_DIR / SERVICE_KEY inherited from `./dev`.
pub fn with_test_keys(cmd: &mut Command) -> &mut Command {
    cmd.env("AUTH_KEY_DIR", test_key_dir())
        .env("SERVICE_KEY", TEST_SERVICE_KEY)
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}
