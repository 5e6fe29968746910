//! Verification keys from their text forms: an HS256 secret is bytes as configured; an RS256 or
//! ES256 public key comes from a PEM `PUBLIC KEY` block (an X.509 SubjectPublicKeyInfo, what
//! `openssl pkey -pubout` writes) or from a JSON Web Key Set (RFC 7517), where each key may carry
//! a `kid` that tokens name in their header.
//!
//! Only what verification needs is kept: an RSA modulus and exponent, or a P-256 point. Reading
//! the files is the server's job; this module parses their bytes.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde::Deserialize;

use super::Algorithm;

/// OID 1.2.840.113549.1.1.1, rsaEncryption.
const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
/// OID 1.2.840.10045.2.1, id-ecPublicKey.
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// OID 1.2.840.10045.3.1.7, the P-256 curve.
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];

/// Smallest RSA modulus accepted, in bytes (2048 bits, as ring requires for RS256).
const MIN_RSA_BYTES: usize = 256;

/// A public key, ready to verify signatures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// An RSA key: big-endian modulus and exponent, without leading zeros.
    Rsa {
        /// The modulus.
        n: Vec<u8>,
        /// The public exponent.
        e: Vec<u8>,
    },
    /// A P-256 key: the uncompressed point (`04 || x || y`, 65 bytes).
    P256(Vec<u8>),
}

impl PublicKey {
    /// The algorithm this key verifies.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            PublicKey::Rsa { .. } => Algorithm::Rs256,
            PublicKey::P256(_) => Algorithm::Es256,
        }
    }
}

/// A public key and the `kid` it is known by, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedKey {
    /// The key id tokens name in their header.
    pub kid: Option<String>,
    /// The key.
    pub key: PublicKey,
}

/// Why a key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// No `-----BEGIN PUBLIC KEY-----` block (a private key or a certificate is not accepted).
    #[error("no PEM \"PUBLIC KEY\" block")]
    NoPem,
    /// The PEM body is not base64.
    #[error("the PEM block is not valid base64")]
    PemBase64,
    /// The DER inside is not a SubjectPublicKeyInfo this module can read.
    #[error("not a DER SubjectPublicKeyInfo")]
    Der,
    /// A key type or curve other than RSA and P-256.
    #[error("unsupported key type (RSA and EC P-256 are supported)")]
    Unsupported,
    /// An RSA modulus under 2048 bits.
    #[error("RSA key shorter than 2048 bits")]
    WeakRsa,
    /// The JWKS is not JSON with a `keys` array, or a key lacks a field.
    #[error("invalid JWKS: {0}")]
    Jwks(String),
    /// The key is for another algorithm than the configured one.
    #[error("key is for {found}, but the configured algorithm is {configured}")]
    WrongAlgorithm {
        /// The key's algorithm.
        found: Algorithm,
        /// The configured algorithm.
        configured: Algorithm,
    },
    /// No usable key at all.
    #[error("no key of the configured algorithm")]
    Empty,
}

/// Parses the first PEM `PUBLIC KEY` block of `text`.
pub fn parse_pem_public_key(text: &str) -> Result<PublicKey, KeyError> {
    let der = pem_block(text, "PUBLIC KEY")?.ok_or(KeyError::NoPem)?;
    parse_spki(&der)
}

/// The DER bytes of the first PEM block labelled `label` in `text` (`None` when there is none).
pub(super) fn pem_block(text: &str, label: &str) -> Result<Option<Vec<u8>>, KeyError> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let Some(start) = text.find(&begin) else {
        return Ok(None);
    };
    let rest = text.get(start + begin.len()..).unwrap_or_default();
    let stop = rest.find(&end).ok_or(KeyError::NoPem)?;
    let body: String = rest
        .get(..stop)
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    STANDARD
        .decode(body)
        .map(Some)
        .map_err(|_| KeyError::PemBase64)
}

/// Parses a DER SubjectPublicKeyInfo (RFC 5280 §4.1.2.7) holding an RSA or P-256 key.
pub fn parse_spki(der: &[u8]) -> Result<PublicKey, KeyError> {
    let (spki, _) = der_take(der, 0x30)?;
    let (alg, rest) = der_take(spki, 0x30)?;
    let (bits, _) = der_take(rest, 0x03)?;
    let (oid, params) = der_take(alg, 0x06)?;
    // A BIT STRING starts with its count of unused bits, 0 for keys.
    let key = match bits.split_first() {
        Some((0, key)) => key,
        _ => return Err(KeyError::Der),
    };
    if oid == OID_RSA {
        let (seq, _) = der_take(key, 0x30)?;
        let (n, rest) = der_take(seq, 0x02)?;
        let (e, _) = der_take(rest, 0x02)?;
        rsa(n, e)
    } else if oid == OID_EC {
        let (curve, _) = der_take(params, 0x06)?;
        if curve != OID_P256 {
            return Err(KeyError::Unsupported);
        }
        p256(key.to_vec())
    } else {
        Err(KeyError::Unsupported)
    }
}

fn rsa(n: &[u8], e: &[u8]) -> Result<PublicKey, KeyError> {
    let strip = |v: &[u8]| -> Vec<u8> {
        let first = v.iter().position(|&b| b != 0).unwrap_or(v.len());
        v.get(first..).unwrap_or_default().to_vec()
    };
    let (n, e) = (strip(n), strip(e));
    if n.len() < MIN_RSA_BYTES {
        return Err(KeyError::WeakRsa);
    }
    if e.is_empty() {
        return Err(KeyError::Der);
    }
    Ok(PublicKey::Rsa { n, e })
}

fn p256(point: Vec<u8>) -> Result<PublicKey, KeyError> {
    if point.len() != 65 || point.first() != Some(&4) {
        return Err(KeyError::Unsupported);
    }
    Ok(PublicKey::P256(point))
}

/// Reads one DER element with tag `tag` from the start of `der`: its contents and what follows.
fn der_take(der: &[u8], tag: u8) -> Result<(&[u8], &[u8]), KeyError> {
    let (&t, rest) = der.split_first().ok_or(KeyError::Der)?;
    if t != tag {
        return Err(KeyError::Der);
    }
    let (&first, mut rest) = rest.split_first().ok_or(KeyError::Der)?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return Err(KeyError::Der);
        }
        let (bytes, after) = (rest.get(..count), rest.get(count..));
        let (Some(bytes), Some(after)) = (bytes, after) else {
            return Err(KeyError::Der);
        };
        rest = after;
        bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    let body = rest.get(..len).ok_or(KeyError::Der)?;
    Ok((body, rest.get(len..).unwrap_or_default()))
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    alg: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

/// Parses a JSON Web Key Set and keeps the keys for `alg`: RSA keys for RS256, P-256 keys for
/// ES256. Keys marked for another use (`"use": "enc"`) or another algorithm are skipped, so one
/// JWKS may serve several services; a set with no usable key is an error.
pub fn parse_jwks(text: &[u8], alg: Algorithm) -> Result<Vec<NamedKey>, KeyError> {
    let set: Jwks = serde_json::from_slice(text).map_err(|e| KeyError::Jwks(e.to_string()))?;
    let mut out = Vec::new();
    for k in set.keys {
        if k.use_.as_deref().is_some_and(|u| u != "sig")
            || k.alg.as_deref().is_some_and(|a| a != alg.name())
        {
            continue;
        }
        let b64 = |field: &Option<String>, name: &str| -> Result<Vec<u8>, KeyError> {
            let v = field
                .as_deref()
                .ok_or_else(|| KeyError::Jwks(format!("key without \"{name}\"")))?;
            URL_SAFE_NO_PAD
                .decode(v.trim_end_matches('='))
                .map_err(|_| KeyError::Jwks(format!("\"{name}\" is not base64url")))
        };
        let key = match (k.kty.as_str(), alg) {
            ("RSA", Algorithm::Rs256) => rsa(&b64(&k.n, "n")?, &b64(&k.e, "e")?)?,
            ("EC", Algorithm::Es256) if k.crv.as_deref() == Some("P-256") => {
                let (x, y) = (b64(&k.x, "x")?, b64(&k.y, "y")?);
                if x.len() != 32 || y.len() != 32 {
                    return Err(KeyError::Jwks("P-256 coordinates are 32 bytes".into()));
                }
                let mut point = vec![4];
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                p256(point)?
            }
            _ => continue,
        };
        out.push(NamedKey { kid: k.kid, key });
    }
    if out.is_empty() {
        return Err(KeyError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_public_key() {
        assert_eq!(parse_pem_public_key("hello"), Err(KeyError::NoPem));
        let bad = "-----BEGIN PUBLIC KEY-----\n!!!\n-----END PUBLIC KEY-----";
        assert_eq!(parse_pem_public_key(bad), Err(KeyError::PemBase64));
        assert_eq!(parse_spki(&[0x30, 0x82]), Err(KeyError::Der));
        assert_eq!(parse_spki(&[]), Err(KeyError::Der));
        assert_eq!(parse_spki(&[0x30, 0x85, 1, 1, 1, 1, 1]), Err(KeyError::Der));
    }

    #[test]
    fn jwks_skips_keys_for_other_uses_and_algorithms() {
        let jwks = br#"{"keys":[
            {"kty":"EC","crv":"P-256","kid":"enc","use":"enc","x":"AA","y":"AA"},
            {"kty":"oct","k":"c2VjcmV0"}
        ]}"#;
        assert_eq!(parse_jwks(jwks, Algorithm::Es256), Err(KeyError::Empty));
        assert!(matches!(
            parse_jwks(b"[]", Algorithm::Es256),
            Err(KeyError::Jwks(_))
        ));
        let short = br#"{"keys":[{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]}"#;
        assert!(matches!(
            parse_jwks(short, Algorithm::Es256),
            Err(KeyError::Jwks(_))
        ));
    }
}
