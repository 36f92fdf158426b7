//! Ed25519 keys: reading them, signing and verifying with them, and the key directory.
//!
//! Formats read (what `openssl genpkey -algorithm ed25519` / `openssl pkey -pubout` write, and
//! what identity providers publish):
//! - private: PEM `PRIVATE KEY` (PKCS#8 v1 or v2, parsed by ring), or a JWK with `d`;
//! - public: PEM `PUBLIC KEY` (SPKI, RFC 8410: a fixed 12-byte prefix and the 32-byte key,
//!   compared by hand here, which is all an Ed25519 SPKI can be), a JWK, or a JWKS.
//!
//! A key's id (`kid`) is its JWK's `kid` when it has one, else its RFC 7638 thumbprint, so a
//! PEM file needs no name for rotation to work.

use crate::{Audience, Claims, TokenError};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// RFC 8410 section 4: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING (32 bytes) }.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// RFC 8410 section 7, PKCS#8 v1 around a 32-byte seed (used for JWK private keys).
const PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Why keys could not be loaded. Never carries key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("{file}: {reason}")]
    File { file: String, reason: String },
    #[error("{file} is missing: {why}")]
    Missing { file: String, why: String },
    #[error("key id {kid:?} names two different {aud} keys")]
    DuplicateKid { aud: Audience, kid: String },
    #[error(
        "key {kid:?} serves both the {a} and the {b} audience: each audience needs its own key"
    )]
    SharedKey {
        kid: String,
        a: Audience,
        b: Audience,
    },
    #[error("cannot generate a key: {0}")]
    Generate(String),
}

fn file_err(file: &Path, reason: impl ToString) -> KeyError {
    KeyError::File {
        file: file.display().to_string(),
        reason: reason.to_string(),
    }
}

/// An Ed25519 public key and its id.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    kid: String,
    x: [u8; 32],
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublicKey({})", self.kid)
    }
}

impl PublicKey {
    /// A key from its 32 bytes; `kid` defaults to the RFC 7638 thumbprint.
    pub(crate) fn from_bytes(x: [u8; 32], kid: Option<String>) -> Result<Self, String> {
        let kid = match kid {
            Some(k) => {
                if k.is_empty() || k.len() > 128 || k.chars().any(|c| c.is_control()) {
                    return Err("kid must be 1-128 printable characters".into());
                }
                k
            }
            None => thumbprint(&x),
        };
        Ok(PublicKey { kid, x })
    }

    #[cfg(test)]
    pub(crate) fn kid(&self) -> &str {
        &self.kid
    }

    /// The key as a JWK (RFC 8037), as served in the JWKS document.
    pub(crate) fn jwk(&self) -> Value {
        json!({"kty": "OKP", "crv": "Ed25519", "x": B64.encode(self.x), "kid": self.kid,
               "alg": "EdDSA", "use": "sig"})
    }

    /// SPKI PEM, as `openssl pkey -pubout` writes it.
    pub fn to_pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.x);
        pem::encode(&pem::Pem::new("PUBLIC KEY", der))
    }

    /// Reads a PEM public key, a JWK or a JWKS.
    pub(crate) fn parse_all(text: &str) -> Result<Vec<PublicKey>, String> {
        let text = text.trim_start();
        if !text.starts_with('{') {
            let p = pem::parse(text).map_err(|e| format!("not a PEM or JWK file ({e})"))?;
            if p.tag() == "PRIVATE KEY" {
                return Err("holds a private key; a public key file must not".into());
            }
            if p.tag() != "PUBLIC KEY" {
                return Err(format!("PEM {:?}: expected PUBLIC KEY", p.tag()));
            }
            let x = p
                .contents()
                .strip_prefix(&SPKI_PREFIX)
                .and_then(|x| <[u8; 32]>::try_from(x).ok())
                .ok_or("not an Ed25519 public key (only Ed25519 is accepted)")?;
            return Ok(vec![PublicKey::from_bytes(x, None)?]);
        }
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        match v.get("keys") {
            Some(Value::Array(keys)) => keys.iter().map(jwk_public).collect(),
            Some(_) => Err("a JWKS's \"keys\" must be an array".into()),
            None => Ok(vec![jwk_public(&v)?]),
        }
    }
}

fn thumbprint(x: &[u8; 32]) -> String {
    // RFC 7638 3.2: the required members, sorted, no whitespace.
    let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#, B64.encode(x));
    B64.encode(ring::digest::digest(
        &ring::digest::SHA256,
        canonical.as_bytes(),
    ))
}

fn jwk_field<'a>(jwk: &'a Value, name: &str) -> Option<&'a str> {
    jwk.get(name).and_then(Value::as_str)
}

fn jwk_bytes(jwk: &Value, name: &str) -> Result<[u8; 32], String> {
    let s = jwk_field(jwk, name).ok_or_else(|| format!("JWK has no {name:?}"))?;
    B64.decode(s)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| format!("JWK {name:?} is not 32 bytes of base64url"))
}

/// The public part of a JWK, refusing what is not an Ed25519 signing key.
fn jwk_public(jwk: &Value) -> Result<PublicKey, String> {
    if jwk_field(jwk, "kty") != Some("OKP") || jwk_field(jwk, "crv") != Some("Ed25519") {
        return Err(
            "JWK is not an Ed25519 key (kty OKP, crv Ed25519); only EdDSA is accepted".into(),
        );
    }
    if jwk_field(jwk, "alg").is_some_and(|a| a != "EdDSA") {
        return Err("JWK alg is not EdDSA".into());
    }
    if jwk_field(jwk, "use").is_some_and(|u| u != "sig") {
        return Err("JWK use is not sig".into());
    }
    let kid = jwk_field(jwk, "kid").map(str::to_string);
    PublicKey::from_bytes(jwk_bytes(jwk, "x")?, kid)
}

/// A private key that mints tokens of one audience.
#[derive(Clone)]
pub struct SigningKey {
    aud: Audience,
    public: PublicKey,
    encoding: EncodingKey,
    pkcs8: Vec<u8>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key material never reaches logs.
        write!(f, "SigningKey({}, {})", self.aud, self.public.kid)
    }
}

impl SigningKey {
    /// A fresh key (development keys, tests).
    pub fn generate(aud: Audience) -> Result<Self, KeyError> {
        let rng = ring::rand::SystemRandom::new();
        let doc =
            Ed25519KeyPair::generate_pkcs8(&rng).map_err(|e| KeyError::Generate(e.to_string()))?;
        Self::from_pkcs8(aud, doc.as_ref(), None).map_err(KeyError::Generate)
    }

    fn from_pkcs8(aud: Audience, der: &[u8], kid: Option<String>) -> Result<Self, String> {
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .map_err(|_| "not an Ed25519 PKCS#8 private key (only Ed25519 is accepted)")?;
        let x: [u8; 32] = pair
            .public_key()
            .as_ref()
            .try_into()
            .map_err(|_| "unexpected public key length")?;
        Ok(SigningKey {
            aud,
            public: PublicKey::from_bytes(x, kid)?,
            encoding: EncodingKey::from_ed_der(der),
            pkcs8: der.to_vec(),
        })
    }

    /// Reads a PEM `PRIVATE KEY` (PKCS#8) or a JWK with `d`.
    pub fn parse(aud: Audience, text: &str) -> Result<Self, String> {
        let text = text.trim_start();
        if text.starts_with('{') {
            let jwk: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
            let public = jwk_public(&jwk)?;
            let mut der = PKCS8_PREFIX.to_vec();
            der.extend_from_slice(&jwk_bytes(&jwk, "d")?);
            let key = Self::from_pkcs8(aud, &der, jwk_field(&jwk, "kid").map(str::to_string))?;
            if key.public.x != public.x {
                return Err("JWK \"x\" is not the public key of its \"d\"".into());
            }
            return Ok(key);
        }
        let p = pem::parse(text).map_err(|e| format!("not a PEM or JWK file ({e})"))?;
        if p.tag() != "PRIVATE KEY" {
            return Err(format!("PEM {:?}: expected PRIVATE KEY (PKCS#8)", p.tag()));
        }
        Self::from_pkcs8(aud, p.contents(), None)
    }

    /// The key as PKCS#8 PEM, as `openssl genpkey` writes it (development keys, tests).
    pub fn to_pem(&self) -> String {
        pem::encode(&pem::Pem::new("PRIVATE KEY", self.pkcs8.clone()))
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// A compact JWT: header `{"typ":"JWT","alg":"EdDSA","kid":...}`, the claims with
    /// `iss` = [`crate::ISSUER`].
    pub fn sign(&self, claims: &Claims) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            iss: &'a str,
            sub: &'a str,
            aud: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            order: Option<&'a str>,
            iat: u64,
            exp: u64,
        }
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.public.kid.clone());
        let out = Out {
            iss: crate::ISSUER,
            sub: &claims.sub,
            aud: claims.aud.as_str(),
            order: claims.order.as_deref(),
            iat: claims.iat,
            exp: claims.exp,
        };
        jsonwebtoken::encode(&header, &out, &self.encoding)
            .expect("an Ed25519 key read by ring signs")
    }
}

/// Checks tokens of one audience against its public keys.
#[derive(Clone)]
pub struct Verifier {
    aud: Audience,
    keys: BTreeMap<String, (PublicKey, DecodingKey)>,
    validation: Validation,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Verifier({}, {:?})", self.aud, self.kids())
    }
}

impl Verifier {
    /// The same key given twice (a signing key's public part and its `.pub` file) counts once;
    /// two different keys under one kid are refused.
    pub fn new(aud: Audience, keys: impl IntoIterator<Item = PublicKey>) -> Result<Self, KeyError> {
        let mut map: BTreeMap<String, (PublicKey, DecodingKey)> = BTreeMap::new();
        for k in keys {
            if let Some((old, _)) = map.get(&k.kid) {
                if old.x != k.x {
                    return Err(KeyError::DuplicateKid { aud, kid: k.kid });
                }
                continue;
            }
            let decoding = DecodingKey::from_ed_der(&k.x);
            map.insert(k.kid.clone(), (k, decoding));
        }
        let mut validation = Validation::new(Algorithm::EdDSA);
        // Expiry is checked against the caller's clock (testable, no leeway); `aud` by
        // jsonwebtoken, after the signature.
        validation.validate_exp = false;
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        validation.set_audience(&[aud.as_str()]);
        Ok(Verifier {
            aud,
            keys: map,
            validation,
        })
    }

    pub fn kids(&self) -> Vec<&str> {
        self.keys.keys().map(String::as_str).collect()
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &PublicKey> {
        self.keys.values().map(|(k, _)| k)
    }

    /// Checks the signature, the audience and the expiry at `now` (unix seconds).
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        #[derive(Deserialize)]
        struct In {
            sub: String,
            #[serde(default)]
            order: Option<String>,
            #[serde(default)]
            iat: u64,
            exp: u64,
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        if header.alg != Algorithm::EdDSA {
            return Err(TokenError::Malformed);
        }
        let kid = header.kid.ok_or(TokenError::UnknownKey)?;
        let (_, key) = self.keys.get(&kid).ok_or(TokenError::UnknownKey)?;
        let data = jsonwebtoken::decode::<In>(token, key, &self.validation).map_err(|e| match e
            .kind()
        {
            ErrorKind::InvalidSignature => TokenError::BadSignature,
            ErrorKind::InvalidAudience => TokenError::WrongAudience,
            _ => TokenError::Malformed,
        })?;
        let c = data.claims;
        if now >= c.exp {
            return Err(TokenError::Expired);
        }
        Ok(Claims {
            aud: self.aud,
            sub: c.sub,
            order: c.order,
            iat: c.iat,
            exp: c.exp,
        })
    }
}

/// The keys one process holds: for each audience, at most one signing key and the public
/// keys it accepts.
#[derive(Debug, Default)]
pub struct KeySet {
    signers: [Option<SigningKey>; Audience::ALL.len()],
    verifiers: [Option<Verifier>; Audience::ALL.len()],
}

impl KeySet {
    /// Builds the set; each signing key's public part is also accepted. One key serving two
    /// audiences is refused: a courier's device token would then open the bus.
    pub(crate) fn new(
        signers: Vec<SigningKey>,
        public: Vec<(Audience, PublicKey)>,
    ) -> Result<Self, KeyError> {
        let mut by_aud: [Vec<PublicKey>; Audience::ALL.len()] = Default::default();
        let mut owner: BTreeMap<[u8; 32], (Audience, String)> = BTreeMap::new();
        let all = signers
            .iter()
            .map(|s| (s.aud, s.public.clone()))
            .chain(public);
        for (aud, key) in all {
            match owner.get(&key.x) {
                Some((a, _)) if *a != aud => {
                    return Err(KeyError::SharedKey {
                        kid: key.kid,
                        a: *a,
                        b: aud,
                    })
                }
                _ => {
                    owner.insert(key.x, (aud, key.kid.clone()));
                }
            }
            by_aud[aud.index()].push(key);
        }
        let mut set = KeySet::default();
        for aud in Audience::ALL {
            let keys = std::mem::take(&mut by_aud[aud.index()]);
            if !keys.is_empty() {
                set.verifiers[aud.index()] = Some(Verifier::new(aud, keys)?);
            }
        }
        for s in signers {
            let i = s.aud.index();
            set.signers[i] = Some(s);
        }
        Ok(set)
    }

    /// Reads a key directory: `<aud>.key` (the signing key, read only for the audiences in
    /// `mint`) and `<aud>.pub` / `<aud>.<label>.pub` / `<aud>[.<label>].json` (public keys:
    /// PEM, JWK or JWKS). Other files are ignored.
    pub fn load(dir: &Path, mint: &[Audience]) -> Result<Self, KeyError> {
        let entries = std::fs::read_dir(dir).map_err(|e| file_err(dir, e))?;
        let mut names: Vec<String> = Vec::new();
        for e in entries {
            let e = e.map_err(|e| file_err(dir, e))?;
            if let Some(n) = e.file_name().to_str() {
                names.push(n.to_string());
            }
        }
        names.sort();
        let mut signers = Vec::new();
        for &aud in mint {
            let path = dir.join(format!("{aud}.key"));
            if !names.iter().any(|n| *n == format!("{aud}.key")) {
                return Err(KeyError::Missing {
                    file: path.display().to_string(),
                    why: format!("this process mints {aud} tokens with it"),
                });
            }
            let text = std::fs::read_to_string(&path).map_err(|e| file_err(&path, e))?;
            signers.push(SigningKey::parse(aud, &text).map_err(|e| file_err(&path, e))?);
        }
        let mut public = Vec::new();
        for name in &names {
            let Some(aud) = Audience::ALL.into_iter().find(|a| {
                name.strip_prefix(a.as_str())
                    .and_then(|r| r.strip_prefix('.'))
                    .is_some_and(|r| r.ends_with("pub") || r.ends_with("json"))
            }) else {
                continue;
            };
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|e| file_err(&path, e))?;
            for k in PublicKey::parse_all(&text).map_err(|e| file_err(&path, e))? {
                public.push((aud, k));
            }
        }
        Self::new(signers, public)
    }

    pub fn signer(&self, aud: Audience) -> Option<&SigningKey> {
        self.signers[aud.index()].as_ref()
    }

    pub fn verifier(&self, aud: Audience) -> Option<&Verifier> {
        self.verifiers[aud.index()].as_ref()
    }

    /// The JWKS document (RFC 7517 section 5) of every public key this process accepts.
    pub fn jwks(&self) -> Value {
        let keys: Vec<Value> = self
            .verifiers
            .iter()
            .flatten()
            .flat_map(|v| v.keys().map(PublicKey::jwk))
            .collect();
        json!({ "keys": keys })
    }

    /// `courier: kid1 kid2; bus: kid3 (signs)`: ids only.
    #[cfg(test)]
    pub(crate) fn describe(&self) -> String {
        Audience::ALL
            .into_iter()
            .filter_map(|aud| {
                let v = self.verifier(aud)?;
                let signs = self
                    .signer(aud)
                    .map(|s| format!(" (signs with {})", s.public.kid))
                    .unwrap_or_default();
                Some(format!("{aud}: {}{signs}", v.kids().join(" ")))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Written by `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout`.
    const OPENSSL_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIMqX4v7iF4FA4/FhzAYrgMxMZkgC1EiR/2xNp3Xh9EAN
-----END PRIVATE KEY-----
";
    const OPENSSL_PUB: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAdbY5X3QCto9Q7gekoWZ/GrrFlFfSj8V6fTfA/tRGah0=
-----END PUBLIC KEY-----
";

    fn key(aud: Audience) -> SigningKey {
        SigningKey::generate(aud).unwrap()
    }

    fn verifier(keys: &[&SigningKey]) -> Verifier {
        Verifier::new(keys[0].aud, keys.iter().map(|k| k.public.clone())).unwrap()
    }

    fn claims(exp: u64) -> Claims {
        Claims {
            exp,
            ..Claims::trail("alice", 100, 0)
        }
    }

    #[test]
    fn signs_and_verifies_a_standard_jwt() {
        let k = key(Audience::Trail);
        let t = k.sign(&claims(200));
        let header = jsonwebtoken::decode_header(&t).unwrap();
        assert_eq!(header.alg, Algorithm::EdDSA);
        assert_eq!(header.kid.as_deref(), Some(k.public.kid()));
        let body: Value =
            serde_json::from_slice(&B64.decode(t.split('.').nth(1).unwrap()).unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"iss": "courier-pipeline", "sub": "alice", "aud": "trail", "iat": 100, "exp": 200})
        );
        assert_eq!(verifier(&[&k]).verify(&t, 150), Ok(claims(200)));
    }

    #[test]
    fn expiry_is_enforced_without_leeway() {
        let k = key(Audience::Trail);
        let t = k.sign(&claims(200));
        assert!(verifier(&[&k]).verify(&t, 199).is_ok());
        assert_eq!(verifier(&[&k]).verify(&t, 200), Err(TokenError::Expired));
    }

    #[test]
    fn another_audience_is_refused_even_under_a_known_key() {
        let k = key(Audience::Trail);
        let t = k.sign(&Claims::courier("c1", 100, 100));
        assert_eq!(
            verifier(&[&k]).verify(&t, 150),
            Err(TokenError::WrongAudience)
        );
    }

    #[test]
    fn rotation_accepts_old_keys_still_listed_and_only_those() {
        let (old, new) = (key(Audience::Trail), key(Audience::Trail));
        let both = verifier(&[&new, &old]);
        assert!(both.verify(&old.sign(&claims(200)), 150).is_ok());
        assert!(both.verify(&new.sign(&claims(200)), 150).is_ok());
        assert_eq!(
            verifier(&[&new]).verify(&old.sign(&claims(200)), 150),
            Err(TokenError::UnknownKey)
        );
    }

    #[test]
    fn forgeries_are_refused() {
        let k = key(Audience::Trail);
        let v = verifier(&[&k]);
        // Another key claiming the real key's id.
        let forger = SigningKey {
            public: PublicKey {
                kid: k.public.kid.clone(),
                ..key(Audience::Trail).public
            },
            ..key(Audience::Trail)
        };
        assert_eq!(
            v.verify(&forger.sign(&claims(9_999)), 150),
            Err(TokenError::BadSignature)
        );
        // Claims edited after signing.
        let t = k.sign(&claims(200));
        let parts: Vec<&str> = t.split('.').collect();
        let edited = B64.encode(
            br#"{"iss":"courier-pipeline","sub":"alice","aud":"trail","iat":100,"exp":99999}"#,
        );
        let t2 = format!("{}.{edited}.{}", parts[0], parts[2]);
        assert_eq!(v.verify(&t2, 150), Err(TokenError::BadSignature));
        // alg "none" and HS256 signed with the public key as the secret (the classic confusion).
        let kid = k.public.kid.clone();
        let none_header = B64.encode(format!(r#"{{"alg":"none","kid":"{kid}"}}"#));
        assert_eq!(
            v.verify(&format!("{none_header}.{}.", parts[1]), 150),
            Err(TokenError::Malformed)
        );
        let mut hs = Header::new(Algorithm::HS256);
        hs.kid = Some(kid);
        let hs_token = jsonwebtoken::encode(
            &hs,
            &json!({"sub": "alice", "aud": "trail", "exp": 9999}),
            &EncodingKey::from_secret(&k.public.x),
        )
        .unwrap();
        assert_eq!(v.verify(&hs_token, 150), Err(TokenError::Malformed));
        for bad in ["", "a", "a.b", "a.b.c", "e30.e30.", "....."] {
            assert!(v.verify(bad, 150).is_err(), "{bad}");
        }
    }

    #[test]
    fn openssl_pem_files_are_read_and_match() {
        let k = SigningKey::parse(Audience::Bus, OPENSSL_KEY).unwrap();
        let p = PublicKey::parse_all(OPENSSL_PUB).unwrap();
        assert_eq!(p, vec![k.public.clone()]);
        assert_eq!(k.public.to_pem(), OPENSSL_PUB.replace('\n', "\r\n"));
        let t = k.sign(&Claims::bus("ingest", 100, 100));
        let v = Verifier::new(Audience::Bus, p).unwrap();
        assert_eq!(v.verify(&t, 150).unwrap().sub, "ingest");
        // Our own PEM is read back as the same key.
        let again = SigningKey::parse(Audience::Bus, &k.to_pem()).unwrap();
        assert_eq!(again.public, k.public);
        assert!(PublicKey::parse_all(OPENSSL_KEY)
            .unwrap_err()
            .contains("private key"));
        assert!(SigningKey::parse(Audience::Bus, OPENSSL_PUB).is_err());
    }

    #[test]
    fn jwk_and_jwks_are_read_and_the_thumbprint_is_rfc_8037s() {
        // RFC 8037 appendix A.2 / A.3.
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let d = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A";
        let public =
            PublicKey::parse_all(&format!(r#"{{"kty":"OKP","crv":"Ed25519","x":"{x}"}}"#)).unwrap();
        assert_eq!(
            public[0].kid(),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
        let private = SigningKey::parse(
            Audience::Courier,
            &format!(r#"{{"kty":"OKP","crv":"Ed25519","x":"{x}","d":"{d}","kid":"idp-1"}}"#),
        )
        .unwrap();
        assert_eq!(private.public.kid(), "idp-1");
        assert_eq!(private.public.x, public[0].x);
        let wrong_x = format!(
            r#"{{"kty":"OKP","crv":"Ed25519","x":"{}","d":"{d}"}}"#,
            B64.encode(key(Audience::Bus).public.x)
        );
        assert!(SigningKey::parse(Audience::Courier, &wrong_x).is_err());
        let jwks = format!(
            r#"{{"keys":[{},{}]}}"#,
            key(Audience::Bus).public.jwk(),
            key(Audience::Bus).public.jwk()
        );
        assert_eq!(PublicKey::parse_all(&jwks).unwrap().len(), 2);
        for bad in [
            r#"{"kty":"RSA","n":"AQAB","e":"AQAB"}"#,
            r#"{"kty":"OKP","crv":"X25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}"#,
            r#"{"kty":"OKP","crv":"Ed25519","x":"AAAA"}"#,
            r#"{"keys":{}}"#,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ] {
            assert!(PublicKey::parse_all(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_key_for_two_audiences_is_refused() {
        let k = key(Audience::Bus);
        let err = KeySet::new(vec![k], vec![]).map(|_| ());
        assert!(err.is_ok());
        let k = key(Audience::Bus);
        let p = k.public.clone();
        assert!(matches!(
            KeySet::new(vec![k], vec![(Audience::Courier, p)]),
            Err(KeyError::SharedKey { .. })
        ));
    }

    #[test]
    fn two_keys_under_one_kid_are_refused() {
        let a = key(Audience::Bus).public;
        let b = PublicKey {
            kid: a.kid.clone(),
            ..key(Audience::Bus).public
        };
        assert!(matches!(
            Verifier::new(Audience::Bus, [a.clone(), b]),
            Err(KeyError::DuplicateKid { .. })
        ));
        // The same key twice (a signer and its .pub file) is one key.
        assert_eq!(
            Verifier::new(Audience::Bus, [a.clone(), a])
                .unwrap()
                .kids()
                .len(),
            1
        );
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("courier-auth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_directory_is_read_by_audience_and_private_keys_only_when_minting() {
        let dir = temp_dir("load");
        let bus = key(Audience::Bus);
        let (courier, old_courier) = (key(Audience::Courier), key(Audience::Courier));
        std::fs::write(dir.join("bus.key"), bus.to_pem()).unwrap();
        std::fs::write(dir.join("bus.pub"), bus.public.to_pem()).unwrap();
        // Not a key at all: a process that does not mint courier tokens never opens it.
        std::fs::write(dir.join("courier.key"), "garbage").unwrap();
        std::fs::write(dir.join("courier.pub"), courier.public.to_pem()).unwrap();
        std::fs::write(
            dir.join("courier.2026-11.json"),
            old_courier.public.jwk().to_string(),
        )
        .unwrap();
        std::fs::write(dir.join("README"), "ignored").unwrap();

        let edge = KeySet::load(&dir, &[]).unwrap();
        assert!(edge.signer(Audience::Courier).is_none());
        let v = edge.verifier(Audience::Courier).unwrap();
        assert!(v
            .verify(&old_courier.sign(&Claims::courier("c1", 1, 100)), 50)
            .is_ok());
        assert!(v
            .verify(&courier.sign(&Claims::courier("c1", 1, 100)), 50)
            .is_ok());
        assert!(edge.verifier(Audience::Viewer).is_none());
        assert_eq!(edge.jwks()["keys"].as_array().unwrap().len(), 3);
        assert!(!edge.describe().contains("signs"));

        let worker = KeySet::load(&dir, &[Audience::Bus]).unwrap();
        let s = worker.signer(Audience::Bus).unwrap();
        assert_eq!(s.public, bus.public);
        assert!(worker.describe().contains("bus: "));

        let err = KeySet::load(&dir, &[Audience::Courier]).unwrap_err();
        assert!(err.to_string().contains("courier.key"), "{err}");
        let err = KeySet::load(&dir, &[Audience::Trail]).unwrap_err();
        assert!(matches!(err, KeyError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("trail.key is missing"), "{err}");
        // Nothing secret in any message or debug output.
        assert!(!format!("{worker:?}").contains("PRIVATE"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest! {
        #[test]
        fn random_tokens_never_verify_or_panic(s in "\\PC{0,300}") {
            let k = key(Audience::Viewer);
            prop_assert!(verifier(&[&k]).verify(&s, 150).is_err());
        }

        #[test]
        fn any_claims_round_trip(sub in "[a-z0-9]{1,64}", order in proptest::option::of("[a-z0-9:-]{1,64}"),
                                 iat in 0u64..1 << 40, ttl in 1u64..1 << 30) {
            let k = key(Audience::Viewer);
            let c = Claims { order, ..Claims::viewer(&sub, "", iat, ttl) };
            prop_assert_eq!(verifier(&[&k]).verify(&k.sign(&c), iat), Ok(c));
        }
    }
}
