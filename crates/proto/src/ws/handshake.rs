//! The opening handshake (RFC 6455 section 4.2): validating a client's upgrade request and
//! writing the `101 Switching Protocols` answer.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use crate::http1::{write_response_head, RequestHead};

const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// What a valid upgrade request asked for.
#[derive(Debug)]
pub struct Upgrade<'a> {
    /// The `Sec-WebSocket-Key` value, as sent.
    pub key: &'a [u8],
    /// Offered subprotocols, in the client's order of preference.
    pub protocols: Vec<&'a str>,
    /// Offered extensions, one element of `Sec-WebSocket-Extensions` each, parameters
    /// included (`permessage-deflate; client_max_window_bits`), in the client's order.
    pub extensions: Vec<&'a str>,
}

/// Why an upgrade request is refused. [`HandshakeError::status`] gives the HTTP answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The method is not GET.
    #[error("WebSocket upgrade requires GET")]
    MethodNotAllowed,
    /// The request is not HTTP/1.1.
    #[error("WebSocket upgrade requires HTTP/1.1")]
    BadVersion,
    /// No `Upgrade: websocket` header.
    #[error("this endpoint requires a WebSocket upgrade")]
    NotUpgrade,
    /// `Connection` does not contain `upgrade`.
    #[error("missing Connection: Upgrade")]
    MissingConnectionUpgrade,
    /// `Sec-WebSocket-Version` is missing or not 13.
    #[error("unsupported WebSocket version (only 13)")]
    UnsupportedVersion,
    /// `Sec-WebSocket-Key` is missing, repeated, or not 16 base64-encoded bytes.
    #[error("invalid Sec-WebSocket-Key")]
    BadKey,
}

impl HandshakeError {
    /// The HTTP status that answers this error. For 426 the caller adds `Upgrade: websocket`
    /// and `Sec-WebSocket-Version: 13`.
    pub fn status(&self) -> u16 {
        match self {
            HandshakeError::MethodNotAllowed => 405,
            HandshakeError::NotUpgrade | HandshakeError::UnsupportedVersion => 426,
            HandshakeError::BadVersion
            | HandshakeError::MissingConnectionUpgrade
            | HandshakeError::BadKey => 400,
        }
    }
}

/// Validates an opening handshake request (RFC 6455 section 4.2.1).
pub fn validate<'a>(head: &RequestHead<'a>) -> Result<Upgrade<'a>, HandshakeError> {
    if head.method != "GET" {
        return Err(HandshakeError::MethodNotAllowed);
    }
    if head.minor_version != 1 {
        return Err(HandshakeError::BadVersion);
    }
    if !head.has_token("upgrade", "websocket") {
        return Err(HandshakeError::NotUpgrade);
    }
    if !head.has_token("connection", "upgrade") {
        return Err(HandshakeError::MissingConnectionUpgrade);
    }
    if head.header("sec-websocket-version") != Some(b"13") {
        return Err(HandshakeError::UnsupportedVersion);
    }
    let mut keys = head
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-key"));
    let key = match (keys.next(), keys.next()) {
        (Some(&(_, key)), None) => key,
        _ => return Err(HandshakeError::BadKey),
    };
    let mut decoded = [0u8; 18];
    match STANDARD.decode_slice(key, &mut decoded) {
        Ok(16) => {}
        _ => return Err(HandshakeError::BadKey),
    }
    Ok(Upgrade {
        key,
        protocols: list(head, "sec-websocket-protocol"),
        extensions: list(head, "sec-websocket-extensions"),
    })
}

fn list<'a>(head: &RequestHead<'a>, name: &str) -> Vec<&'a str> {
    head.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .filter_map(|&(_, v)| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// `Sec-WebSocket-Accept` for `key`: base64(SHA-1(key ++ GUID)).
pub fn accept_key(key: &[u8]) -> [u8; 28] {
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key);
    sha.update(GUID);
    let mut out = [0u8; 28];
    // 20 bytes always encode to exactly 28 base64 characters.
    let _ = STANDARD.encode_slice(sha.digest().bytes(), &mut out);
    out
}

/// Appends the `101 Switching Protocols` response for `key`, selecting `protocol` if given.
pub fn write_accept(
    out: &mut Vec<u8>,
    key: &[u8],
    protocol: Option<&str>,
    extensions: Option<&str>,
) {
    let accept = accept_key(key);
    let accept = std::str::from_utf8(&accept).unwrap_or_default();
    let mut headers = vec![
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Accept", accept),
    ];
    if let Some(p) = protocol {
        headers.push(("Sec-WebSocket-Protocol", p));
    }
    if let Some(e) = extensions {
        headers.push(("Sec-WebSocket-Extensions", e));
    }
    write_response_head(out, 101, &headers, None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::{parse_head, HeadLimits};

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

    fn request(extra: &str) -> String {
        format!(
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n{extra}\r\n"
        )
    }

    fn check(req: &str) -> Result<(Vec<String>, Vec<String>), HandshakeError> {
        let head = match parse_head(req.as_bytes(), &HeadLimits::default()) {
            Ok(Some(h)) => h,
            other => panic!("bad test request: {other:?}"),
        };
        validate(&head).map(|u| {
            assert_eq!(u.key, KEY.as_bytes());
            (
                u.protocols.iter().map(|s| s.to_string()).collect(),
                u.extensions.iter().map(|s| s.to_string()).collect(),
            )
        })
    }

    #[test]
    fn rfc_accept_key() {
        assert_eq!(&accept_key(KEY.as_bytes()), b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn valid_request() {
        let (p, e) = check(&request(
            "Sec-WebSocket-Protocol: clarion.v1, chat\r\nSec-WebSocket-Protocol: x\r\n\
             Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits, foo\r\n",
        ))
        .expect("valid");
        assert_eq!(p, ["clarion.v1", "chat", "x"]);
        assert_eq!(e, ["permessage-deflate; client_max_window_bits", "foo"]);
    }

    #[test]
    fn invalid_requests() {
        let base = request("");
        let cases = [
            (
                base.replacen("GET", "POST", 1),
                HandshakeError::MethodNotAllowed,
            ),
            (
                base.replacen("HTTP/1.1", "HTTP/1.0", 1),
                HandshakeError::BadVersion,
            ),
            (
                base.replace("Upgrade: websocket\r\n", ""),
                HandshakeError::NotUpgrade,
            ),
            (
                base.replace("Connection: Upgrade", "Connection: keep-alive"),
                HandshakeError::MissingConnectionUpgrade,
            ),
            (
                base.replace("Version: 13", "Version: 8"),
                HandshakeError::UnsupportedVersion,
            ),
            (
                base.replace("Sec-WebSocket-Version: 13\r\n", ""),
                HandshakeError::UnsupportedVersion,
            ),
            (base.replace(KEY, "c2hvcnQ="), HandshakeError::BadKey),
            (
                base.replace(KEY, "not base64!!!!!!!!!!!!=="),
                HandshakeError::BadKey,
            ),
            (
                base.replace(&format!("Sec-WebSocket-Key: {KEY}\r\n"), ""),
                HandshakeError::BadKey,
            ),
            (
                request(&format!("Sec-WebSocket-Key: {KEY}\r\n")),
                HandshakeError::BadKey,
            ),
        ];
        for (req, err) in cases {
            assert_eq!(check(&req).err(), Some(err), "{req}");
        }
        assert_eq!(HandshakeError::NotUpgrade.status(), 426);
        assert_eq!(HandshakeError::UnsupportedVersion.status(), 426);
        assert_eq!(HandshakeError::MethodNotAllowed.status(), 405);
        assert_eq!(HandshakeError::BadKey.status(), 400);
    }

    #[test]
    fn accept_response() {
        let mut out = Vec::new();
        write_accept(&mut out, KEY.as_bytes(), Some("clarion.v1"), None);
        let text = String::from_utf8(out).expect("ascii");
        assert!(text.starts_with("HTTP/1.1 101 Switching Protocols\r\n"));
        assert!(text.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(text.contains("Sec-WebSocket-Protocol: clarion.v1\r\n"));
        assert!(text.ends_with("\r\n\r\n"));
    }
}
