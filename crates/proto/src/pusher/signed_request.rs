//! The HTTP API's request signature: the query carries `auth_key`, `auth_timestamp`,
//! `auth_version`, `body_md5` (for a body) and `auth_signature`, the lowercase hex
//! HMAC-SHA256, under the application's secret, of
//!
//! ```text
//! METHOD\nPATH\nkey=value&key=value...   (every other parameter, keys lowercased, sorted)
//! ```
//!
//! Parsing is separate from checking: [`SignedQuery::parse`] reads the query (bounded), the
//! server finds the application, and [`SignedQuery::verify`] checks key, clock, body and
//! signature against the `now` it is given.

use md5::{Digest, Md5};

use super::signature::{hex, hex_matches, sign_hex};
use crate::http1::query_pairs;

/// Seconds `auth_timestamp` may be away from the server's clock, either way (Pusher's window).
pub const MAX_SKEW_SECS: u64 = 600;

/// Most query parameters a signed request may carry: the API's requests use fewer than ten.
pub const MAX_PARAMS: usize = 32;

/// Why a request's signature was refused. Each is a `401` except where said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The query is not `key=value&...` with valid escapes (`400`).
    #[error("invalid query string")]
    BadQuery,
    /// More than [`MAX_PARAMS`] parameters (`400`).
    #[error("too many query parameters")]
    TooManyParams,
    /// A parameter given twice: which one is signed would be ambiguous (`400`).
    #[error("query parameter {0} given twice")]
    Repeated(String),
    /// A required authentication parameter is missing.
    #[error("missing {0}")]
    Missing(&'static str),
    /// `auth_key` is not the application's.
    #[error("unknown auth_key")]
    WrongKey,
    /// `auth_version` is not `1.0`.
    #[error("unsupported auth_version (1.0 expected)")]
    BadVersion,
    /// `auth_timestamp` is not a number of seconds.
    #[error("auth_timestamp is not a number of seconds")]
    BadTimestamp,
    /// `auth_timestamp` is more than [`MAX_SKEW_SECS`] from the server's clock.
    #[error("timestamp expired: {given} is not within 600 s of the server's time {now}")]
    Stale {
        /// What the request said.
        given: u64,
        /// The server's clock.
        now: u64,
    },
    /// The request has a body and no `body_md5`.
    #[error("missing body_md5 for a request with a body")]
    MissingBodyMd5,
    /// `body_md5` is not the MD5 of the body.
    #[error("body_md5 does not match the body")]
    BodyMd5Mismatch,
    /// The signature does not match. Carries the string that was expected to be signed (no
    /// secret in it), as Pusher's answer shows it, so a library author can compare.
    #[error("invalid signature: expected HMAC-SHA256 hex digest of {0:?}")]
    BadSignature(String),
}

impl RequestError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::BadQuery | RequestError::TooManyParams | RequestError::Repeated(_) => 400,
            RequestError::Missing(_)
            | RequestError::WrongKey
            | RequestError::BadVersion
            | RequestError::BadTimestamp
            | RequestError::Stale { .. }
            | RequestError::MissingBodyMd5
            | RequestError::BodyMd5Mismatch
            | RequestError::BadSignature(_) => 401,
        }
    }

    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            RequestError::BadQuery | RequestError::TooManyParams | RequestError::Repeated(_) => {
                "query"
            }
            RequestError::Missing(_) => "missing",
            RequestError::WrongKey => "key",
            RequestError::BadVersion => "version",
            RequestError::BadTimestamp | RequestError::Stale { .. } => "timestamp",
            RequestError::MissingBodyMd5 | RequestError::BodyMd5Mismatch => "body_md5",
            RequestError::BadSignature(_) => "signature",
        }
    }
}

/// A request's query, decoded: every parameter (keys lowercased), in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedQuery {
    params: Vec<(String, String)>,
}

impl SignedQuery {
    /// Reads a raw query string (without `?`).
    pub fn parse(query: &str) -> Result<SignedQuery, RequestError> {
        let mut params: Vec<(String, String)> = Vec::new();
        for pair in query_pairs(query) {
            let (k, v) = pair.map_err(|_| RequestError::BadQuery)?;
            if params.len() == MAX_PARAMS {
                return Err(RequestError::TooManyParams);
            }
            params.push((k.to_ascii_lowercase(), v.into_owned()));
        }
        params.sort();
        if let Some(w) = params
            .windows(2)
            .find(|w| w.first().map(|p| &p.0) == w.get(1).map(|p| &p.0))
        {
            let name = w.first().map(|p| p.0.clone()).unwrap_or_default();
            return Err(RequestError::Repeated(name));
        }
        Ok(SignedQuery { params })
    }

    /// A parameter's value (keys are lowercase).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .and_then(|i| self.params.get(i))
            .map(|(_, v)| v.as_str())
    }

    /// The `auth_key` the request names (to find the application before [`Self::verify`]).
    pub fn auth_key(&self) -> Result<&str, RequestError> {
        self.get("auth_key")
            .ok_or(RequestError::Missing("auth_key"))
    }

    /// The string the signature covers.
    pub fn string_to_sign(&self, method: &str, path: &str) -> String {
        let mut s = format!("{}\n{path}\n", method.to_ascii_uppercase());
        let mut first = true;
        for (k, v) in self.params.iter().filter(|(k, _)| k != "auth_signature") {
            if !first {
                s.push('&');
            }
            first = false;
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s
    }

    /// Checks the request: the key is `key`, the version `1.0`, the timestamp within
    /// [`MAX_SKEW_SECS`] of `now` (Unix seconds), `body_md5` the body's (required when there is
    /// a body) and the signature right under `secret`.
    pub fn verify(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        key: &str,
        secret: &[u8],
        now: u64,
    ) -> Result<(), RequestError> {
        if self.auth_key()? != key {
            return Err(RequestError::WrongKey);
        }
        let stamp = self
            .get("auth_timestamp")
            .ok_or(RequestError::Missing("auth_timestamp"))?;
        let version = self
            .get("auth_version")
            .ok_or(RequestError::Missing("auth_version"))?;
        let given = self
            .get("auth_signature")
            .ok_or(RequestError::Missing("auth_signature"))?;
        if version != "1.0" {
            return Err(RequestError::BadVersion);
        }
        let stamp: u64 = stamp.parse().map_err(|_| RequestError::BadTimestamp)?;
        if stamp.abs_diff(now) > MAX_SKEW_SECS {
            return Err(RequestError::Stale { given: stamp, now });
        }
        match self.get("body_md5") {
            Some(md5) if !hex_matches(md5, &body_md5(body)) => {
                return Err(RequestError::BodyMd5Mismatch)
            }
            Some(_) => {}
            None if !body.is_empty() => return Err(RequestError::MissingBodyMd5),
            None => {}
        }
        let signed = self.string_to_sign(method, path);
        let expected = sign_hex(secret, &[signed.as_bytes()]);
        if hex_matches(given, &expected) {
            Ok(())
        } else {
            Err(RequestError::BadSignature(signed))
        }
    }
}

/// Lowercase hex MD5 of a body (`body_md5`).
pub fn body_md5(body: &[u8]) -> String {
    hex(&Md5::digest(body))
}

/// The query a client library would send: `params` with the auth parameters added and signed
/// (for tests and tools; the server only checks).
pub fn sign_query(
    method: &str,
    path: &str,
    params: &[(&str, &str)],
    body: &[u8],
    key: &str,
    secret: &[u8],
    timestamp: u64,
) -> String {
    let stamp = timestamp.to_string();
    let md5 = body_md5(body);
    let mut all: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all.push(("auth_key".into(), key.into()));
    all.push(("auth_timestamp".into(), stamp));
    all.push(("auth_version".into(), "1.0".into()));
    if !body.is_empty() {
        all.push(("body_md5".into(), md5));
    }
    all.sort();
    let q = SignedQuery { params: all };
    let sig = sign_hex(secret, &[q.string_to_sign(method, path).as_bytes()]);
    let joined: Vec<String> = q.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{}&auth_signature={sig}", joined.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "278d425bdf160c739803";
    const SECRET: &[u8] = b"7ad3773142a6692b25b8";
    // Pusher's HTTP API reference example: a trigger to `project-3` at 1353088179.
    const BODY: &str = r#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#;
    const QUERY: &str = "auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0\
                         &body_md5=ec365a775a4cd0599faeb73354201b6f\
                         &auth_signature=da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c";

    fn verify(
        query: &str,
        method: &str,
        path: &str,
        body: &str,
        now: u64,
    ) -> Result<(), RequestError> {
        SignedQuery::parse(query)?.verify(method, path, body.as_bytes(), KEY, SECRET, now)
    }

    #[test]
    fn the_documented_example_request_verifies() {
        assert_eq!(
            body_md5(BODY.as_bytes()),
            "ec365a775a4cd0599faeb73354201b6f"
        );
        assert_eq!(
            verify(QUERY, "POST", "/apps/3/events", BODY, 1353088179),
            Ok(())
        );
        // The signature is the same at the window's edges...
        assert_eq!(
            verify(QUERY, "POST", "/apps/3/events", BODY, 1353088179 + 600),
            Ok(())
        );
        assert_eq!(
            verify(QUERY, "POST", "/apps/3/events", BODY, 1353088179 - 600),
            Ok(())
        );
    }

    #[test]
    fn a_stale_or_future_timestamp_is_refused() {
        assert_eq!(
            verify(QUERY, "POST", "/apps/3/events", BODY, 1353088179 + 601),
            Err(RequestError::Stale {
                given: 1353088179,
                now: 1353088780
            })
        );
        assert!(matches!(
            verify(QUERY, "POST", "/apps/3/events", BODY, 1353088179 - 601),
            Err(RequestError::Stale { .. })
        ));
    }

    #[test]
    fn any_change_to_method_path_body_or_parameters_breaks_the_signature() {
        let now = 1353088179;
        assert!(matches!(
            verify(QUERY, "GET", "/apps/3/events", BODY, now),
            Err(RequestError::BadSignature(_))
        ));
        assert!(matches!(
            verify(QUERY, "POST", "/apps/4/events", BODY, now),
            Err(RequestError::BadSignature(_))
        ));
        assert_eq!(
            verify(QUERY, "POST", "/apps/3/events", "{}", now),
            Err(RequestError::BodyMd5Mismatch)
        );
        let extra = format!("{QUERY}&info=user_count");
        assert!(matches!(
            verify(&extra, "POST", "/apps/3/events", BODY, now),
            Err(RequestError::BadSignature(_))
        ));
        let other_secret = SignedQuery::parse(QUERY)
            .and_then(|q| q.verify("POST", "/apps/3/events", BODY.as_bytes(), KEY, b"nope", now));
        assert!(matches!(other_secret, Err(RequestError::BadSignature(_))));
    }

    #[test]
    fn missing_or_wrong_auth_parameters_are_named() {
        let now = 1353088179;
        assert_eq!(
            verify("auth_timestamp=1", "GET", "/", "", now),
            Err(RequestError::Missing("auth_key"))
        );
        assert_eq!(
            verify("auth_key=other&auth_timestamp=1", "GET", "/", "", now),
            Err(RequestError::WrongKey)
        );
        let no_md5 = "auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&auth_signature=00";
        assert_eq!(
            verify(no_md5, "POST", "/apps/3/events", BODY, now),
            Err(RequestError::MissingBodyMd5)
        );
        let v2 = no_md5.replace("1.0", "2.0");
        assert_eq!(
            verify(&v2, "GET", "/", "", now),
            Err(RequestError::BadVersion)
        );
        let stamp = no_md5.replace("1353088179", "soon");
        assert_eq!(
            verify(&stamp, "GET", "/", "", now),
            Err(RequestError::BadTimestamp)
        );
        assert_eq!(
            SignedQuery::parse("a=1&A=2"),
            Err(RequestError::Repeated("a".into()))
        );
        assert_eq!(SignedQuery::parse("a=%zz"), Err(RequestError::BadQuery));
        let many: Vec<String> = (0..=MAX_PARAMS).map(|i| format!("p{i}=1")).collect();
        assert_eq!(
            SignedQuery::parse(&many.join("&")),
            Err(RequestError::TooManyParams)
        );
    }

    #[test]
    fn signed_query_round_trips_with_escaped_values() {
        let q = sign_query(
            "GET",
            "/apps/3/channels",
            &[("info", "user_count"), ("filter_by_prefix", "presence-")],
            b"",
            KEY,
            SECRET,
            1000,
        );
        assert_eq!(verify(&q, "GET", "/apps/3/channels", "", 1000), Ok(()));
        // A library that percent-encodes the values signed the same decoded values.
        let escaped = q.replace("presence-", "presence%2D");
        assert_eq!(
            verify(&escaped, "GET", "/apps/3/channels", "", 1000),
            Ok(())
        );
        // The string the 1.0 worked example of the reference signs.
        let q = SignedQuery::parse(
            "auth_key=278d425bdf160c739803&auth_timestamp=1272044395&auth_version=1.0\
             &body_md5=7b3d404f5cde4a0b9b8fb4789a0098cb&name=foo",
        )
        .expect("valid");
        let s = q.string_to_sign("post", "/apps/3/channels/test_channel/events");
        assert_eq!(
            sign_hex(SECRET, &[s.as_bytes()]),
            "309fc4be20f04e53e011b00744642d3fe66c2c7c5686f35ed6cd2af6f202e445"
        );
    }
}
