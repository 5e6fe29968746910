//! Minting a token: the compact JWS form of a JWT signed with HS256, RS256 or ES256, carrying
//! the claims [`super::token`] reads. It is what `clarion token` prints, so that trying
//! authentication, presence or a client needs no JWT library; an application's backend mints
//! its own tokens with whatever library it likes.
//!
//! Sans-IO like the verifier: the times (`iat`, `exp`) and a source of randomness (ECDSA
//! signatures need one) are passed in; nothing here reads a clock or a file.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::SecureRandom;
use ring::signature::{
    EcdsaKeyPair, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
};

use super::keys::{pem_block, KeyError};
use super::pattern::Pattern;
use super::token::MAX_PATTERNS;
use super::Algorithm;

/// A key tokens are signed with.
#[derive(Debug)]
pub enum SigningKey {
    /// An HS256 shared secret (the server's `auth_secret`).
    Secret(Vec<u8>),
    /// An RSA private key, for RS256.
    Rsa(RsaKeyPair),
    /// An EC P-256 private key, for ES256.
    Ec(EcdsaKeyPair),
}

/// Why a token could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The private key could not be read.
    #[error("{0}")]
    Key(String),
    /// A claim would make a token the server refuses (a bad pattern, `info` not an object).
    #[error("{0}")]
    Claims(String),
    /// The signature could not be made (the randomness source failed).
    #[error("signing failed")]
    Crypto,
}

impl From<KeyError> for SignError {
    fn from(e: KeyError) -> Self {
        SignError::Key(e.to_string())
    }
}

impl SigningKey {
    /// Reads the first private key of a PEM file: PKCS#8 (`PRIVATE KEY`, what `openssl
    /// genpkey` writes) holding RSA or EC P-256, or PKCS#1 (`RSA PRIVATE KEY`).
    pub fn from_pem(text: &str, rng: &dyn SecureRandom) -> Result<SigningKey, SignError> {
        if let Some(der) = pem_block(text, "PRIVATE KEY")? {
            if let Ok(k) = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, rng) {
                return Ok(SigningKey::Ec(k));
            }
            return RsaKeyPair::from_pkcs8(&der)
                .map(SigningKey::Rsa)
                .map_err(|e| SignError::Key(format!("not an RSA or EC P-256 key: {e}")));
        }
        if let Some(der) = pem_block(text, "RSA PRIVATE KEY")? {
            return RsaKeyPair::from_der(&der)
                .map(SigningKey::Rsa)
                .map_err(|e| SignError::Key(format!("not a usable RSA key: {e}")));
        }
        if pem_block(text, "EC PRIVATE KEY")?.is_some() {
            return Err(SignError::Key(
                "an EC key in SEC1 form; convert it to PKCS#8 with \
                 `openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8`"
                    .into(),
            ));
        }
        Err(SignError::Key(
            "no PEM \"PRIVATE KEY\" or \"RSA PRIVATE KEY\" block".into(),
        ))
    }

    /// The algorithm tokens signed with this key name.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            SigningKey::Secret(_) => Algorithm::Hs256,
            SigningKey::Rsa(_) => Algorithm::Rs256,
            SigningKey::Ec(_) => Algorithm::Es256,
        }
    }
}

/// What a token says. Times are Unix seconds.
#[derive(Debug, Default)]
pub struct TokenClaims {
    /// `sub`: who it is for.
    pub sub: Option<String>,
    /// `iat`: when it was made.
    pub iat: u64,
    /// `exp`: when it stops being accepted.
    pub exp: u64,
    /// `aud`, when the server checks one (`auth_audience`).
    pub aud: Option<String>,
    /// `iss`, when the server checks one (`auth_issuer`).
    pub iss: Option<String>,
    /// Topic patterns the holder may subscribe to.
    pub subscribe: Vec<String>,
    /// Topic patterns the holder may publish to.
    pub publish: Vec<String>,
    /// Whether the holder may open the dashboard and publish anywhere through the API.
    pub admin: bool,
    /// What presence shows of the holder: a JSON object.
    pub info: Option<serde_json::Value>,
}

impl TokenClaims {
    /// The claims as JSON, or why the server would refuse them: the checks the verifier makes
    /// on patterns and `info`, made before signing so that a typo is told here, not by a 401.
    fn to_json(&self) -> Result<String, SignError> {
        for (list, name) in [(&self.subscribe, "subscribe"), (&self.publish, "publish")] {
            if list.len() > MAX_PATTERNS {
                return Err(SignError::Claims(format!(
                    "{name}: at most {MAX_PATTERNS} patterns"
                )));
            }
            for p in list {
                Pattern::parse(p)
                    .map_err(|e| SignError::Claims(format!("{name} pattern {p:?}: {e}")))?;
            }
        }
        if self.info.as_ref().is_some_and(|i| !i.is_object()) {
            return Err(SignError::Claims("info must be a JSON object".into()));
        }
        if self.exp <= self.iat {
            return Err(SignError::Claims("exp must come after iat".into()));
        }
        let mut clarion = serde_json::Map::new();
        clarion.insert("subscribe".into(), self.subscribe.clone().into());
        clarion.insert("publish".into(), self.publish.clone().into());
        if self.admin {
            clarion.insert("admin".into(), true.into());
        }
        if let Some(info) = &self.info {
            clarion.insert("info".into(), info.clone());
        }
        let mut claims = serde_json::Map::new();
        if let Some(sub) = &self.sub {
            claims.insert("sub".into(), sub.clone().into());
        }
        claims.insert("iat".into(), self.iat.into());
        claims.insert("exp".into(), self.exp.into());
        if let Some(aud) = &self.aud {
            claims.insert("aud".into(), aud.clone().into());
        }
        if let Some(iss) = &self.iss {
            claims.insert("iss".into(), iss.clone().into());
        }
        claims.insert("clarion".into(), clarion.into());
        Ok(serde_json::Value::Object(claims).to_string())
    }
}

/// Signs `claims` with `key`: `header.payload.signature`, each part base64url without padding.
/// `kid` names the key for a server that reads a key set (`auth_jwks`).
pub fn sign(
    key: &SigningKey,
    kid: Option<&str>,
    claims: &TokenClaims,
    rng: &dyn SecureRandom,
) -> Result<String, SignError> {
    let mut header = serde_json::Map::new();
    header.insert("alg".into(), key.algorithm().name().into());
    header.insert("typ".into(), "JWT".into());
    if let Some(kid) = kid {
        header.insert("kid".into(), kid.into());
    }
    let mut token = URL_SAFE_NO_PAD.encode(serde_json::Value::Object(header).to_string());
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(claims.to_json()?));
    let signature = match key {
        SigningKey::Secret(secret) => {
            let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
            ring::hmac::sign(&k, token.as_bytes()).as_ref().to_vec()
        }
        SigningKey::Rsa(pair) => {
            let mut out = vec![0; pair.public().modulus_len()];
            pair.sign(&RSA_PKCS1_SHA256, rng, token.as_bytes(), &mut out)
                .map_err(|_| SignError::Crypto)?;
            out
        }
        SigningKey::Ec(pair) => pair
            .sign(rng, token.as_bytes())
            .map_err(|_| SignError::Crypto)?
            .as_ref()
            .to_vec(),
    };
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(signature));
    Ok(token)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ring::rand::SystemRandom;
    use ring::signature::KeyPair as _;

    use super::*;
    use crate::auth::keys::{parse_spki, NamedKey};
    use crate::auth::token::{Keys, Verifier};

    fn claims() -> TokenClaims {
        TokenClaims {
            sub: Some("alice".into()),
            iat: 1_000,
            exp: 4_600,
            subscribe: vec!["chat.*".into(), "user.alice".into()],
            publish: vec!["chat.lobby".into()],
            info: Some(serde_json::json!({"name": "Alice"})),
            ..TokenClaims::default()
        }
    }

    fn verifier(algorithm: Algorithm, keys: Keys) -> Verifier {
        Verifier {
            algorithm,
            keys,
            audience: None,
            issuer: None,
            leeway: 0,
        }
    }

    #[test]
    fn an_hs256_token_is_what_the_verifier_accepts() {
        let rng = SystemRandom::new();
        let key = SigningKey::Secret(b"a-long-enough-shared-secret".to_vec());
        let token = sign(&key, None, &claims(), &rng).unwrap();
        let v = verifier(
            Algorithm::Hs256,
            Keys::Secrets(vec![b"a-long-enough-shared-secret".to_vec()]),
        );
        let c = v.verify(token.as_bytes(), 2_000).unwrap();
        assert_eq!(c.sub.as_deref(), Some("alice"));
        assert_eq!(c.exp, 4_600);
        assert!(c.grants.may_subscribe("chat.lobby"));
        assert!(!c.grants.may_subscribe("user.bob"));
        assert!(c.grants.may_publish("chat.lobby"));
        assert_eq!(c.info.as_deref(), Some(r#"{"name":"Alice"}"#));
        assert!(!c.admin);
        // Expired at its exp, and a wrong secret is refused.
        assert!(v.verify(token.as_bytes(), 4_601).is_err());
        let other = verifier(Algorithm::Hs256, Keys::Secrets(vec![b"another".to_vec()]));
        assert!(other.verify(token.as_bytes(), 2_000).is_err());
    }

    #[test]
    fn an_es256_token_from_a_pkcs8_pem_is_accepted_with_its_kid() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        let key = SigningKey::from_pem(&pem, &rng).unwrap();
        assert_eq!(key.algorithm(), Algorithm::Es256);
        let SigningKey::Ec(pair) = &key else {
            panic!("not an EC key")
        };
        // The public half as a SubjectPublicKeyInfo: the fixed P-256 prefix, then the point.
        let mut spki = vec![
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06,
            0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
        ];
        spki.extend_from_slice(pair.public_key().as_ref());
        let public = parse_spki(&spki).unwrap();
        let token = sign(&key, Some("k1"), &claims(), &rng).unwrap();
        let named = |kid: &str| NamedKey {
            kid: Some(kid.into()),
            key: public.clone(),
        };
        let v = verifier(Algorithm::Es256, Keys::Public(vec![named("k1")]));
        assert_eq!(
            v.verify(token.as_bytes(), 2_000).unwrap().sub.as_deref(),
            Some("alice")
        );
        let wrong_kid = verifier(Algorithm::Es256, Keys::Public(vec![named("k2")]));
        assert!(wrong_kid.verify(token.as_bytes(), 2_000).is_err());
    }

    #[test]
    fn claims_the_server_would_refuse_are_refused_before_signing() {
        let rng = SystemRandom::new();
        let key = SigningKey::Secret(b"s".to_vec());
        let bad = [
            TokenClaims {
                subscribe: vec!["a*b".into()],
                ..claims()
            },
            TokenClaims {
                info: Some(serde_json::json!("not an object")),
                ..claims()
            },
            TokenClaims {
                exp: 1_000,
                ..claims()
            },
            TokenClaims {
                publish: vec!["x".into(); MAX_PATTERNS + 1],
                ..claims()
            },
        ];
        for c in bad {
            assert!(matches!(
                sign(&key, None, &c, &rng),
                Err(SignError::Claims(_))
            ));
        }
    }

    #[test]
    fn keys_that_are_not_private_keys_are_told_apart() {
        let rng = SystemRandom::new();
        let sec1 = "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n";
        let e = SigningKey::from_pem(sec1, &rng).unwrap_err().to_string();
        assert!(e.contains("openssl pkcs8"), "{e}");
        let public = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        let e = SigningKey::from_pem(public, &rng).unwrap_err().to_string();
        assert!(e.contains("no PEM"), "{e}");
        let junk = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(SigningKey::from_pem(junk, &rng).is_err());
    }
}
