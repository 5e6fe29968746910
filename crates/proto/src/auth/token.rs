//! Verifying a token: the compact JWS form (RFC 7515 §7.1) of a JWT (RFC 7519), checked with
//! keys chosen by configuration and a time passed in.
//!
//! The order matters and is fixed: size, shape, header (its `alg` must be the configured one,
//! so `none` and algorithm confusion are refused before any key is touched), signature, and
//! only then the claims, which are not believed before the signature is.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;

use super::keys::{NamedKey, PublicKey};
use super::pattern::{Grants, Pattern};
use super::{Algorithm, Claims, TokenError};

/// Longest token accepted, in bytes: a token with a few dozen grants is under 2 KiB; more is
/// not a token this server issued, and decoding it would only cost time.
pub const MAX_TOKEN_LEN: usize = 8192;

/// Most patterns in each of a token's `subscribe` and `publish` lists: grants are checked by a
/// linear scan, so a token cannot make every subscribe slow.
pub const MAX_PATTERNS: usize = 64;

/// The keys a [`Verifier`] checks signatures with.
#[derive(Debug, Clone)]
pub enum Keys {
    /// HS256 secrets, current first; more than one during a rotation.
    Secrets(Vec<Vec<u8>>),
    /// RS256 or ES256 public keys; chosen by the token's `kid` when they have one.
    Public(Vec<NamedKey>),
}

/// Everything verification needs besides the token and the time. Built once at startup.
#[derive(Debug, Clone)]
pub struct Verifier {
    /// The one algorithm accepted.
    pub algorithm: Algorithm,
    /// The keys.
    pub keys: Keys,
    /// When set, the token's `aud` must name it.
    pub audience: Option<String>,
    /// When set, the token's `iss` must equal it.
    pub issuer: Option<String>,
    /// Seconds of clock skew allowed for `exp`, `nbf` and `iat`.
    pub leeway: u64,
}

#[derive(Deserialize)]
struct Header<'a> {
    alg: &'a str,
    #[serde(default)]
    kid: Option<String>,
    /// Whether the header names `crit` at all: `"crit": null` is refused like any other value
    /// (an `Option` would read it as absent).
    #[serde(default, deserialize_with = "present")]
    crit: bool,
}

/// True for a field that is present, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// A NumericDate: RFC 7519 allows fractions; they are truncated.
#[derive(Deserialize)]
#[serde(untagged)]
enum Time {
    Int(u64),
    Float(f64),
}

impl Time {
    fn secs(&self) -> Result<u64, TokenError> {
        match *self {
            Time::Int(v) => Ok(v),
            Time::Float(v) if v.is_finite() && v >= 0.0 => Ok(v as u64),
            Time::Float(_) => Err(TokenError::Claims("a time claim is not a positive number")),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct ClarionClaim {
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    info: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawClaims {
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    exp: Option<Time>,
    #[serde(default)]
    nbf: Option<Time>,
    #[serde(default)]
    iat: Option<Time>,
    #[serde(default)]
    aud: Option<Audience>,
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    clarion: Option<ClarionClaim>,
}

impl Verifier {
    /// Verifies `token` at `now` (seconds since the Unix epoch) and returns its claims.
    pub fn verify(&self, token: &[u8], now: u64) -> Result<Claims, TokenError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong);
        }
        let token = std::str::from_utf8(token).map_err(|_| TokenError::Malformed)?;
        let mut parts = token.split('.');
        let (Some(h64), Some(c64), Some(s64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header = decode(h64)?;
        let header: Header<'_> =
            serde_json::from_slice(&header).map_err(|_| TokenError::Malformed)?;
        if header.alg != self.algorithm.name() {
            return Err(TokenError::Algorithm);
        }
        if header.crit {
            // RFC 7515 §4.1.11: extensions this verifier does not understand.
            return Err(TokenError::Malformed);
        }
        let sig = decode(s64)?;
        let signed = token
            .get(..h64.len() + 1 + c64.len())
            .ok_or(TokenError::Malformed)?
            .as_bytes();
        self.check_signature(header.kid.as_deref(), signed, &sig)?;
        let claims = decode(c64)?;
        let raw: RawClaims = serde_json::from_slice(&claims).map_err(|_| TokenError::Malformed)?;
        self.check_claims(raw, now)
    }

    fn check_signature(
        &self,
        kid: Option<&str>,
        signed: &[u8],
        sig: &[u8],
    ) -> Result<(), TokenError> {
        match &self.keys {
            Keys::Secrets(secrets) => {
                let ok = secrets.iter().any(|s| {
                    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, s);
                    ring::hmac::verify(&key, signed, sig).is_ok()
                });
                ok.then_some(()).ok_or(TokenError::Signature)
            }
            Keys::Public(keys) => {
                // A token naming a key must use that key; one naming none may match any (a
                // single PEM key has no id).
                let mut candidates = keys.iter().filter(|k| match (kid, k.kid.as_deref()) {
                    (Some(want), Some(have)) => want == have,
                    (Some(_), None) => keys.len() == 1,
                    (None, _) => true,
                });
                let mut any = false;
                let ok = candidates.any(|k| {
                    any = true;
                    verify_public(&k.key, signed, sig)
                });
                match (ok, any) {
                    (true, _) => Ok(()),
                    (false, false) => Err(TokenError::UnknownKey),
                    (false, true) => Err(TokenError::Signature),
                }
            }
        }
    }

    fn check_claims(&self, raw: RawClaims, now: u64) -> Result<Claims, TokenError> {
        let exp = raw.exp.as_ref().ok_or(TokenError::MissingExpiry)?.secs()?;
        if now >= exp.saturating_add(self.leeway) {
            return Err(TokenError::Expired);
        }
        let nbf = raw.nbf.as_ref().map(Time::secs).transpose()?;
        if nbf.is_some_and(|nbf| now.saturating_add(self.leeway) < nbf) {
            return Err(TokenError::NotYetValid);
        }
        let iat = raw.iat.as_ref().map(Time::secs).transpose()?;
        if iat.is_some_and(|iat| now.saturating_add(self.leeway) < iat) {
            return Err(TokenError::NotYetValid);
        }
        if let Some(want) = &self.audience {
            let ok = match &raw.aud {
                Some(Audience::One(a)) => a == want,
                Some(Audience::Many(list)) => list.iter().any(|a| a == want),
                None => false,
            };
            if !ok {
                return Err(TokenError::Audience);
            }
        }
        if let Some(want) = &self.issuer {
            if raw.iss.as_deref() != Some(want.as_str()) {
                return Err(TokenError::Issuer);
            }
        }
        let c = raw.clarion.unwrap_or_default();
        if c.subscribe.len() > MAX_PATTERNS || c.publish.len() > MAX_PATTERNS {
            return Err(TokenError::Claims("more than 64 patterns in a list"));
        }
        let parse = |list: &[String]| -> Result<Vec<Pattern>, TokenError> {
            list.iter()
                .map(|p| Pattern::parse(p).map_err(|_| TokenError::Claims("invalid topic pattern")))
                .collect()
        };
        let info = match c.info {
            None | Some(serde_json::Value::Null) => None,
            Some(v @ serde_json::Value::Object(_)) => Some(v.to_string()),
            Some(_) => return Err(TokenError::Claims("clarion.info must be a JSON object")),
        };
        Ok(Claims {
            sub: raw.sub,
            info,
            exp,
            nbf,
            iat,
            admin: c.admin,
            grants: Grants {
                subscribe: parse(&c.subscribe)?,
                publish: parse(&c.publish)?,
            },
        })
    }
}

/// Strict base64url without padding (RFC 7515 §2).
fn decode(part: &str) -> Result<Vec<u8>, TokenError> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| TokenError::Malformed)
}

fn verify_public(key: &PublicKey, signed: &[u8], sig: &[u8]) -> bool {
    match key {
        PublicKey::Rsa { n, e } => RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, signed, sig)
            .is_ok(),
        // JWS ES256 signatures are r || s, 64 bytes (RFC 7518 §3.4), not DER.
        PublicKey::P256(point) => {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(signed, sig)
                .is_ok()
        }
    }
}
