//! A request's header list, checked as RFC 9113 §8.2 and §8.3 require, and rewritten as the
//! HTTP/1.1 request head that the server's routing already reads: one request per stream, so
//! the head always says `connection: close`. An extended CONNECT with `:protocol = websocket`
//! (RFC 8441) becomes the HTTP/1.1 upgrade request it stands for.
//!
//! Anything that could change the meaning of the rewritten head is refused as malformed rather
//! than passed on: CR, LF or NUL in a value, names that are not lowercase tokens, the
//! connection-specific fields HTTP/2 forbids.

/// The `Sec-WebSocket-Key` given to the upgrade a WebSocket stream is rewritten as. HTTP/2
/// has no key (RFC 8441 §5); the answer's accept value is dropped again on the way out.
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// A request that may be served, as the HTTP/1.1 head the router reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The request line and fields, ending with the empty line.
    pub head: Vec<u8>,
    /// The `content-length` the client announced, checked against its DATA.
    pub content_length: Option<u64>,
    /// An extended CONNECT for a WebSocket (RFC 8441): its DATA frames carry WebSocket frames
    /// and the 101 answer becomes a 200.
    pub websocket: bool,
    /// `HEAD`: the answer has no body whatever its fields say.
    pub head_only: bool,
}

/// Collects one header block's fields in order and checks them as they come.
#[derive(Debug, Default)]
pub struct Builder {
    method: Option<String>,
    scheme: Option<String>,
    authority: Option<String>,
    path: Option<String>,
    protocol: Option<String>,
    host: Option<String>,
    cookies: Vec<u8>,
    fields: Vec<u8>,
    content_length: Option<u64>,
    regular_seen: bool,
    bad: Option<&'static str>,
}

impl Builder {
    /// A builder for one request.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Takes the next field. The first problem found is kept; later fields are still taken
    /// (the header block must be decoded whole to keep the HPACK state), but ignored.
    pub fn field(&mut self, name: &[u8], value: &[u8]) {
        if self.bad.is_none() {
            if let Err(why) = self.take(name, value) {
                self.bad = Some(why);
            }
        }
    }

    fn take(&mut self, name: &[u8], value: &[u8]) -> Result<(), &'static str> {
        let value = std::str::from_utf8(value).map_err(|_| "field value is not UTF-8")?;
        if value.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
            return Err("CR, LF or NUL in a field value");
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            if self.regular_seen {
                return Err("pseudo-header after a regular field");
            }
            let slot = match pseudo {
                b"method" => &mut self.method,
                b"scheme" => &mut self.scheme,
                b"authority" => &mut self.authority,
                b"path" => &mut self.path,
                b"protocol" => &mut self.protocol,
                _ => return Err("unknown pseudo-header"),
            };
            if slot.is_some() {
                return Err("repeated pseudo-header");
            }
            *slot = Some(value.to_owned());
            return Ok(());
        }
        self.regular_seen = true;
        if name.is_empty() || !name.iter().all(|&b| is_lower_token(b)) {
            return Err("field name is not a lowercase token");
        }
        if value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']) {
            return Err("field value with leading or trailing whitespace");
        }
        match name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => return Err("connection-specific field"),
            b"te" if value != "trailers" => return Err("te other than trailers"),
            b"host" => {
                self.host = Some(value.to_owned());
                return Ok(());
            }
            b"cookie" => {
                // Cookies may come as separate fields (RFC 9113 §8.2.3); HTTP/1.1 wants one.
                if !self.cookies.is_empty() {
                    self.cookies.extend_from_slice(b"; ");
                }
                self.cookies.extend_from_slice(value.as_bytes());
                return Ok(());
            }
            b"content-length" => {
                let n = value
                    .parse::<u64>()
                    .ok()
                    .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or("bad content-length")?;
                if self.content_length.is_some_and(|l| l != n) {
                    return Err("conflicting content-length");
                }
                self.content_length = Some(n);
            }
            _ => {}
        }
        self.fields.extend_from_slice(name);
        self.fields.extend_from_slice(b": ");
        self.fields.extend_from_slice(value.as_bytes());
        self.fields.extend_from_slice(b"\r\n");
        Ok(())
    }

    /// The request, or why it is malformed (a stream error, `PROTOCOL_ERROR`).
    /// `connect_protocol`: this side advertised `SETTINGS_ENABLE_CONNECT_PROTOCOL`.
    pub fn finish(self, connect_protocol: bool) -> Result<Request, &'static str> {
        if let Some(why) = self.bad {
            return Err(why);
        }
        let method = self.method.ok_or("no :method")?;
        let websocket = match (method.as_str(), self.protocol.as_deref()) {
            ("CONNECT", Some("websocket")) if connect_protocol => true,
            ("CONNECT", Some(_)) => return Err("unsupported :protocol"),
            (_, Some(_)) => return Err(":protocol without CONNECT"),
            ("CONNECT", None) => return Err("CONNECT is not supported"),
            _ => false,
        };
        if self.scheme.is_none() {
            return Err("no :scheme");
        }
        let path = self.path.filter(|p| !p.is_empty()).ok_or("no :path")?;
        if !(path.starts_with('/') || path == "*") || path.contains(' ') {
            return Err("bad :path");
        }
        let host = self.authority.or(self.host);
        let mut head = Vec::with_capacity(64 + path.len() + self.fields.len());
        let line_method = if websocket { "GET" } else { method.as_str() };
        if !line_method.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("bad :method");
        }
        for part in [line_method, " ", &path, " HTTP/1.1\r\n"] {
            head.extend_from_slice(part.as_bytes());
        }
        if let Some(h) = &host {
            head.extend_from_slice(b"host: ");
            head.extend_from_slice(h.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        if !self.cookies.is_empty() {
            head.extend_from_slice(b"cookie: ");
            head.extend_from_slice(&self.cookies);
            head.extend_from_slice(b"\r\n");
        }
        if websocket {
            // The client's own version field (RFC 8441 §5) is in `fields`.
            head.extend_from_slice(b"upgrade: websocket\r\nconnection: upgrade\r\n");
            head.extend_from_slice(b"sec-websocket-key: ");
            head.extend_from_slice(WS_KEY.as_bytes());
            head.extend_from_slice(b"\r\n");
        } else {
            head.extend_from_slice(b"connection: close\r\n");
        }
        head.extend_from_slice(&self.fields);
        head.extend_from_slice(b"\r\n");
        Ok(Request {
            head,
            content_length: self.content_length,
            websocket,
            head_only: method == "HEAD",
        })
    }
}

fn is_lower_token(b: u8) -> bool {
    matches!(b,
        b'a'..=b'z' | b'0'..=b'9' | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-'
        | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

/// Checks a trailer section (RFC 9113 §8.1): regular fields only. Trailers are not passed on.
#[derive(Debug, Default)]
pub struct Trailers {
    bad: bool,
}

impl Trailers {
    /// Takes the next trailer field.
    pub fn field(&mut self, name: &[u8]) {
        if name.first() == Some(&b':') || !name.iter().all(|&b| is_lower_token(b)) {
            self.bad = true;
        }
    }

    /// Whether the section may be accepted.
    pub fn ok(&self) -> bool {
        !self.bad
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn build(fields: &[(&str, &str)]) -> Result<Request, &'static str> {
        let mut b = Builder::new();
        for (n, v) in fields {
            b.field(n.as_bytes(), v.as_bytes());
        }
        b.finish(true)
    }

    const GET: [(&str, &str); 4] = [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "example.com"),
        (":path", "/sse?topic=a"),
    ];

    #[test]
    fn a_get_becomes_an_http1_head_that_closes() {
        let mut f = GET.to_vec();
        f.extend([("last-event-id", "3"), ("cookie", "a=1"), ("cookie", "b=2")]);
        let r = build(&f).unwrap();
        assert_eq!(
            String::from_utf8(r.head).unwrap(),
            "GET /sse?topic=a HTTP/1.1\r\nhost: example.com\r\ncookie: a=1; b=2\r\n\
             connection: close\r\nlast-event-id: 3\r\n\r\n"
        );
        assert!(!r.websocket && !r.head_only);
    }

    #[test]
    fn an_extended_connect_becomes_an_upgrade() {
        let f = [
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":scheme", "https"),
            (":authority", "example.com"),
            (":path", "/ws?topic=a"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-extensions", "permessage-deflate"),
        ];
        let r = build(&f).unwrap();
        let head = String::from_utf8(r.head).unwrap();
        assert!(head.starts_with("GET /ws?topic=a HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("upgrade: websocket\r\nconnection: upgrade\r\n"));
        assert!(head.contains("sec-websocket-key: "));
        assert!(head.contains("sec-websocket-extensions: permessage-deflate\r\n"));
        assert!(r.websocket);
        // Not advertised: refused.
        let mut b = Builder::new();
        for (n, v) in f {
            b.field(n.as_bytes(), v.as_bytes());
        }
        assert!(b.finish(false).is_err());
    }

    #[test]
    fn malformed_requests_are_refused() {
        let with = |extra: (&'static str, &'static str)| {
            let mut f = GET.to_vec();
            f.push(extra);
            build(&f)
        };
        for bad in [
            ("Upper", "x"),
            ("connection", "close"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "gzip"),
            ("x", "a\r\nInjected: 1"),
            ("x", "nul\0"),
            ("x", " padded"),
            ("content-length", "12x"),
            (":path", "/again"),
            (":status", "200"),
            ("", "empty name"),
        ] {
            assert!(with(bad).is_err(), "{bad:?}");
        }
        assert!(with(("te", "trailers")).is_ok());
        // A pseudo-header after a regular field.
        assert!(build(&[
            (":method", "GET"),
            (":scheme", "http"),
            ("x", "1"),
            (":path", "/")
        ])
        .is_err());
        // Missing or empty pseudo-headers.
        assert!(build(&[(":method", "GET"), (":scheme", "http")]).is_err());
        assert!(build(&[(":method", "GET"), (":scheme", "http"), (":path", "")]).is_err());
        assert!(build(&[(":method", "GET"), (":path", "/")]).is_err());
        assert!(build(&[(":scheme", "http"), (":path", "/")]).is_err());
        assert!(build(&[(":method", "GET"), (":scheme", "http"), (":path", "/a b")]).is_err());
        assert!(build(&[
            (":method", "GET"),
            (":protocol", "websocket"),
            (":scheme", "http"),
            (":path", "/")
        ])
        .is_err());
        assert_eq!(
            build(&[(":method", "CONNECT"), (":authority", "example.com:443")]),
            Err("CONNECT is not supported")
        );
    }

    #[test]
    fn content_length_is_kept_for_checking() {
        let mut f = GET.to_vec();
        f[0] = (":method", "POST");
        f.push(("content-length", "5"));
        assert_eq!(build(&f).unwrap().content_length, Some(5));
        f.push(("content-length", "6"));
        assert!(build(&f).is_err());
    }
}
