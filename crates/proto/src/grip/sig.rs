//! `Grip-Sig`: the token a GRIP proxy adds to each request it forwards, so a backend can tell
//! that the request came through a proxy that knows the shared key.
//!
//! It is a JSON Web Token (RFC 7519) signed with HMAC-SHA256 (`HS256`): base64url, without
//! padding, of a JOSE header, of the claims, and of the signature over the first two joined by a
//! dot. The claims hold `exp` (seconds since the Unix epoch; required) and `iss` (which key,
//! when a backend knows several). There is no clock here: the caller passes the expiry to sign
//! and the current time to verify. Only `HS256` is accepted, so a token cannot pick a weaker
//! algorithm (or `none`) for itself, and the signature is compared in constant time.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// base64url of `{"alg":"HS256","typ":"JWT"}`, the header of every token signed here.
const HEADER_B64: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9";

/// Longest token accepted: a GRIP token is about 150 bytes; this leaves room for other claims
/// without letting a client make the server decode kilobytes of base64 per request.
pub const MAX_TOKEN_LEN: usize = 4096;

/// base64url, accepting (though never producing) padding.
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The claims of a verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// `iss`: who signed it (a hint to which key), if given.
    pub iss: Option<String>,
    /// `exp`: when it expires, in seconds since the Unix epoch.
    pub exp: u64,
}

/// Why a token was not accepted. Whatever the reason, the request is treated as if it carried
/// no `Grip-Sig` at all, as the protocol asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SigError {
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("token too long")]
    TooLong,
    /// Not three base64url parts, or a part is not the JSON it should be.
    #[error("malformed token")]
    Malformed,
    /// The header names an algorithm other than `HS256`.
    #[error("unsupported algorithm")]
    UnsupportedAlgorithm,
    /// The signature does not match the key.
    #[error("bad signature")]
    BadSignature,
    /// The claims have no numeric `exp`.
    #[error("token has no expiry")]
    MissingExpiry,
    /// `exp` is not after `now`.
    #[error("token expired")]
    Expired,
}

#[derive(Serialize)]
struct ClaimsOut<'a> {
    iss: &'a str,
    exp: u64,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

#[derive(Deserialize)]
struct ClaimsIn {
    iss: Option<String>,
    exp: Option<serde_json::Number>,
}

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length (long ones are hashed first): this never fails.
    HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length")
}

/// Signs a token for `issuer` that expires at `exp` (seconds since the Unix epoch).
pub fn sign(key: &[u8], issuer: &str, exp: u64) -> String {
    let claims = ClaimsOut { iss: issuer, exp };
    // Serialising a struct of a string and a number cannot fail.
    let claims = serde_json::to_vec(&claims).unwrap_or_default();
    let mut token = format!("{HEADER_B64}.{}", URL_SAFE_NO_PAD.encode(claims));
    let mut mac = mac(key);
    mac.update(token.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    token.push('.');
    token.push_str(&sig);
    token
}

/// Verifies `token` against `key` at time `now` (seconds since the Unix epoch) and returns its
/// claims. The signature is checked before anything in the claims is believed.
pub fn verify(token: &str, key: &[u8], now: u64) -> Result<Claims, SigError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(SigError::TooLong);
    }
    let token = token.trim();
    let (signed, sig) = token.rsplit_once('.').ok_or(SigError::Malformed)?;
    let (header, claims) = signed.split_once('.').ok_or(SigError::Malformed)?;
    if claims.contains('.') {
        return Err(SigError::Malformed);
    }
    let header: Header = decode_json(header)?;
    if header.alg != "HS256" {
        return Err(SigError::UnsupportedAlgorithm);
    }
    let sig = URL_SAFE_LENIENT
        .decode(sig)
        .map_err(|_| SigError::Malformed)?;
    let mut mac = mac(key);
    mac.update(signed.as_bytes());
    mac.verify_slice(&sig).map_err(|_| SigError::BadSignature)?;

    let claims: ClaimsIn = decode_json(claims)?;
    // A NumericDate may have a fraction; an expiry only needs whole seconds, rounded down.
    let exp = claims
        .exp
        .and_then(|n| {
            n.as_u64()
                .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
        })
        .ok_or(SigError::MissingExpiry)?;
    if now >= exp {
        return Err(SigError::Expired);
    }
    Ok(Claims {
        iss: claims.iss,
        exp,
    })
}

fn decode_json<T: serde::de::DeserializeOwned>(part: &str) -> Result<T, SigError> {
    let bytes = URL_SAFE_LENIENT
        .decode(part)
        .map_err(|_| SigError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| SigError::Malformed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"changeme";

    #[test]
    fn signed_tokens_verify() {
        let token = sign(KEY, "pushpin", 1_700_000_100);
        assert_eq!(
            verify(&token, KEY, 1_700_000_000),
            Ok(Claims {
                iss: Some("pushpin".into()),
                exp: 1_700_000_100
            })
        );
        // The same token computed independently (Python's hmac and base64 modules).
        assert_eq!(
            token,
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.\
             eyJpc3MiOiJwdXNocGluIiwiZXhwIjoxNzAwMDAwMTAwfQ.\
             Ssrz4erX8hq3tdOGAc7s-mUGRCPs2QoCQhF9uBBuXLI"
        );
    }

    #[test]
    fn a_token_signed_elsewhere_verifies() {
        // The example HS256 token of RFC 7515 appendix A.1, whose `exp` (1300819380) is long past.
        let key = URL_SAFE_NO_PAD
            .decode(
                "AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow",
            )
            .unwrap();
        let token = "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9.\
                     eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.\
                     dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert_eq!(
            verify(token, &key, 1_300_819_379),
            Ok(Claims {
                iss: Some("joe".into()),
                exp: 1_300_819_380
            })
        );
        assert_eq!(verify(token, &key, 1_300_819_380), Err(SigError::Expired));
        assert_eq!(verify(token, b"other", 0), Err(SigError::BadSignature));
    }

    #[test]
    fn expiry_is_checked_against_now() {
        let token = sign(KEY, "i", 100);
        assert!(verify(&token, KEY, 99).is_ok());
        assert_eq!(verify(&token, KEY, 100), Err(SigError::Expired));
        assert_eq!(verify(&token, KEY, u64::MAX), Err(SigError::Expired));
    }

    #[test]
    fn tampering_is_detected() {
        let token = sign(KEY, "pushpin", 200);
        assert_eq!(verify(&token, b"changemf", 0), Err(SigError::BadSignature));
        // A longer expiry with the old signature.
        let forged_claims = URL_SAFE_NO_PAD.encode(br#"{"iss":"pushpin","exp":999999}"#);
        let sig = token.rsplit('.').next().unwrap();
        let forged = format!("{HEADER_B64}.{forged_claims}.{sig}");
        assert_eq!(verify(&forged, KEY, 0), Err(SigError::BadSignature));
        // Dropping the signature or switching the algorithm off.
        let none_header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        let claims = token.split('.').nth(1).unwrap();
        assert_eq!(
            verify(&format!("{none_header}.{claims}."), KEY, 0),
            Err(SigError::UnsupportedAlgorithm)
        );
        assert_eq!(
            verify(&format!("{HEADER_B64}.{claims}."), KEY, 0),
            Err(SigError::BadSignature)
        );
    }

    #[test]
    fn claims_without_expiry_are_refused() {
        let claims = URL_SAFE_NO_PAD.encode(br#"{"iss":"x"}"#);
        let signed = format!("{HEADER_B64}.{claims}");
        let mut m = mac(KEY);
        m.update(signed.as_bytes());
        let token = format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(m.finalize().into_bytes())
        );
        assert_eq!(verify(&token, KEY, 0), Err(SigError::MissingExpiry));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        for bad in [
            "",
            "a.b",
            "a.b.c.d",
            "!!.e30.",
            "e30.e30.",
            "bm90IGpzb24.e30.",
        ] {
            assert_eq!(verify(bad, KEY, 0), Err(SigError::Malformed), "{bad}");
        }
        let long = "a".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(verify(&long, KEY, 0), Err(SigError::TooLong));
    }
}
