//! The `Authorization` request header (RFC 9110 §11.6.2) in the two schemes Clarion's publish
//! API accepts: `Bearer` (RFC 6750) and `Basic` (RFC 7617). Parsing only: which token or
//! password is the right one (an API key, a signed JWT) is the server's decision.

use base64::Engine as _;

/// Credentials from an `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials<'a> {
    /// `Bearer TOKEN`: the token, surrounding whitespace removed.
    Bearer(&'a str),
    /// `Basic BASE64(user:password)`: the password, decoded (the user is not used).
    Basic {
        /// The bytes after the first `:` of the decoded value.
        password: Vec<u8>,
    },
}

/// Why an `Authorization` header gave no credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthorizationError {
    /// A scheme other than `Bearer` or `Basic` (schemes are matched as sent, case included).
    #[error("unsupported authorization scheme")]
    Scheme,
    /// `Basic` credentials that are not base64.
    #[error("basic credentials are not base64")]
    Base64,
    /// `Basic` credentials without the `:` between user and password.
    #[error("basic credentials have no password")]
    NoPassword,
}

/// Parses an `Authorization` header value.
pub fn parse_authorization(value: &str) -> Result<Credentials<'_>, AuthorizationError> {
    let value = value.trim();
    if let Some(token) = value.strip_prefix("Bearer ") {
        return Ok(Credentials::Bearer(token.trim()));
    }
    let Some(encoded) = value.strip_prefix("Basic ") else {
        return Err(AuthorizationError::Scheme);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| AuthorizationError::Base64)?;
    let colon = decoded
        .iter()
        .position(|&c| c == b':')
        .ok_or(AuthorizationError::NoPassword)?;
    let password = decoded.get(colon + 1..).unwrap_or_default().to_vec();
    Ok(Credentials::Basic { password })
}

/// Compares secrets without an early exit, so response timing does not reveal how much of a
/// guess was right (only whether its length was).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        assert_eq!(
            parse_authorization("Bearer abc"),
            Ok(Credentials::Bearer("abc"))
        );
        assert_eq!(
            parse_authorization("  Bearer   abc  "),
            Ok(Credentials::Bearer("abc"))
        );
        // The value is trimmed first, so a bare scheme has no token and no space after it.
        assert_eq!(
            parse_authorization("Bearer "),
            Err(AuthorizationError::Scheme)
        );
        assert_eq!(
            parse_authorization("bearer abc"),
            Err(AuthorizationError::Scheme)
        );
        assert_eq!(parse_authorization(""), Err(AuthorizationError::Scheme));
        assert_eq!(
            parse_authorization("Digest x"),
            Err(AuthorizationError::Scheme)
        );
    }

    #[test]
    fn basic_passwords() {
        // "user:pa:ss": the password is everything after the first colon.
        assert_eq!(
            parse_authorization("Basic dXNlcjpwYTpzcw=="),
            Ok(Credentials::Basic {
                password: b"pa:ss".to_vec()
            })
        );
        // ":key", an empty user.
        assert_eq!(
            parse_authorization("Basic  OmtleQ== "),
            Ok(Credentials::Basic {
                password: b"key".to_vec()
            })
        );
        assert_eq!(
            parse_authorization("Basic ***"),
            Err(AuthorizationError::Base64)
        );
        // "user", no colon.
        assert_eq!(
            parse_authorization("Basic dXNlcg=="),
            Err(AuthorizationError::NoPassword)
        );
    }

    #[test]
    fn secrets_compare_fully() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }
}
