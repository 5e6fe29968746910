//! Tokens that say who may subscribe and publish: JSON Web Tokens (RFC 7519) minted by an
//! application's backend and verified here, sans-IO: the token's bytes, the keys and the
//! current time go in; typed claims or a typed error come out.
//!
//! - [`token`]: the compact JWS form, signature verification (HS256 with one or more secrets,
//!   RS256, ES256) and the registered claims (`exp` required; `nbf`, `iat`, `aud`, `iss`).
//! - [`keys`]: public keys from PEM (SubjectPublicKeyInfo) and JSON Web Key Sets.
//! - [`pattern`]: the topic patterns of the `clarion` claim and the grants they make up.
//! - [`cookie_value`]: a token from a `Cookie` header.
//! - [`sign`]: minting a token (`clarion token`), the verifier's inverse.
//!
//! Verification is a small verifier over ring (already the workspace's crypto for TLS) rather
//! than a JWT crate: the common crates validate `exp` against the system clock, which a sans-IO
//! crate must not read, and would add a second crypto stack. The algorithm is never taken from
//! the token: it is fixed by configuration and a token naming another one (`none` included) is
//! refused before any key is used.

pub mod keys;
pub mod pattern;
pub mod sign;
pub mod token;

pub use keys::{parse_jwks, parse_pem_public_key, KeyError, NamedKey, PublicKey};
pub use pattern::{Grants, Pattern, PatternError};
pub use token::{Keys, Verifier, MAX_TOKEN_LEN};

/// A signature algorithm (RFC 7518 §3.1 names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// HMAC with SHA-256 over a shared secret.
    Hs256,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// ECDSA on P-256 with SHA-256.
    Es256,
}

impl Algorithm {
    /// The name as it appears in a JOSE header's `alg`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Hs256 => "HS256",
            Algorithm::Rs256 => "RS256",
            Algorithm::Es256 => "ES256",
        }
    }

    /// Parses a configured name (case-insensitive).
    pub fn parse(name: &str) -> Option<Algorithm> {
        match name.to_ascii_uppercase().as_str() {
            "HS256" => Some(Algorithm::Hs256),
            "RS256" => Some(Algorithm::Rs256),
            "ES256" => Some(Algorithm::Es256),
            _ => None,
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The claims of a verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// `sub`: who the token is for, if given.
    pub sub: Option<String>,
    /// `exp`: when it expires, seconds since the Unix epoch.
    pub exp: u64,
    /// `nbf`: not valid before, if given.
    pub nbf: Option<u64>,
    /// `iat`: when it was issued, if given.
    pub iat: Option<u64>,
    /// The `clarion` claim's topic lists (empty lists when absent).
    pub grants: Grants,
    /// The `clarion` claim's `admin` flag: the holder may open the dashboard (false when absent).
    pub admin: bool,
    /// The `clarion` claim's `info` object as compact JSON: what presence shows of this member
    /// (`None` when absent or `null`).
    pub info: Option<String>,
}

/// Why a token was refused. [`TokenError::reason`] is the metrics label and the short reason
/// clients see; none of them echoes the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("token too long")]
    TooLong,
    /// Not three base64url parts of JSON, or a header with unknown critical extensions.
    #[error("malformed token")]
    Malformed,
    /// The header's `alg` is not the configured algorithm (`none` included).
    #[error("token algorithm not accepted")]
    Algorithm,
    /// The header's `kid` names no configured key.
    #[error("unknown signing key")]
    UnknownKey,
    /// The signature does not verify with any configured key.
    #[error("bad token signature")]
    Signature,
    /// No `exp` claim: tokens that never expire are not accepted.
    #[error("token has no exp")]
    MissingExpiry,
    /// `exp` is not after now.
    #[error("token expired")]
    Expired,
    /// `nbf` (or `iat`) is after now.
    #[error("token not yet valid")]
    NotYetValid,
    /// `aud` does not name the configured audience.
    #[error("token audience not accepted")]
    Audience,
    /// `iss` is not the configured issuer.
    #[error("token issuer not accepted")]
    Issuer,
    /// A claim has the wrong type or the `clarion` claim is invalid.
    #[error("invalid token claims: {0}")]
    Claims(&'static str),
}

impl TokenError {
    /// A short label: the `reason` of `clarion_auth_failures_total`.
    pub fn reason(self) -> &'static str {
        match self {
            TokenError::TooLong | TokenError::Malformed => "malformed",
            TokenError::Algorithm => "algorithm",
            TokenError::UnknownKey => "unknown_key",
            TokenError::Signature => "signature",
            TokenError::MissingExpiry | TokenError::Claims(_) => "claims",
            TokenError::Expired => "expired",
            TokenError::NotYetValid => "not_yet_valid",
            TokenError::Audience => "audience",
            TokenError::Issuer => "issuer",
        }
    }
}

/// The value of cookie `name` in a `Cookie` header (RFC 6265 §5.4: `name=value` pairs
/// separated by `; `), without surrounding quotes.
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests;
