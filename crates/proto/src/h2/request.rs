//! A request's header list, checked as RFC 9113 §8.2 and §8.3 require, and rewritten as the
//! HTTP/1.1 request head that the server's routing already reads: one request per stream, so
//! the head says `connection: close` ([`Builder::finish`]); a caller that serves a
//! connection's streams one after another over one HTTP/1.1 byte stream asks for heads without
//! it ([`Builder::finish_keep_alive`]). An extended CONNECT with `:protocol = websocket`
//! (RFC 8441) becomes the HTTP/1.1 upgrade request it stands for.
//!
//! Anything that could change the meaning of the rewritten head is refused as malformed rather
//! than passed on: CR, LF or NUL in a value, names that are not lowercase tokens, the
//! connection-specific fields HTTP/2 forbids, an `:authority` or `host` that is not an
//! authority (RFC 3986 §3.2: a host name, IPv4 address or bracketed IP literal, and a port;
//! no user information, RFC 9113 §8.3.1), two `host` fields (RFC 9112 §3.2 answers them 400),
//! and a `host` that names another authority than `:authority`: what routing, the `Host`-based
//! checks and a GRIP backend read must be one unambiguous name.

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
            if pseudo == b"authority" && !is_authority(value) {
                return Err("bad :authority");
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
                if self.host.is_some() {
                    return Err("more than one host field");
                }
                if !is_authority(value) {
                    return Err("bad host");
                }
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
        self.build(connect_protocol, true)
    }

    /// As [`Builder::finish`], but the head does not say `connection: close`: for a caller
    /// that hands the requests of a connection to one HTTP/1.1 reader, one after another, and
    /// wants it to go on after each.
    pub fn finish_keep_alive(self, connect_protocol: bool) -> Result<Request, &'static str> {
        self.build(connect_protocol, false)
    }

    fn build(self, connect_protocol: bool, close: bool) -> Result<Request, &'static str> {
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
        let host = match (self.authority, self.host) {
            (Some(a), Some(h)) if !a.eq_ignore_ascii_case(&h) => {
                return Err("host differs from :authority")
            }
            (a, h) => a.or(h),
        };
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
        } else if close {
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

/// Whether `v` is an authority a request may name (RFC 3986 §3.2.2, §3.2.3, without the
/// user information RFC 9113 §8.3.1 forbids): `reg-name` (unreserved, percent-encoded and
/// sub-delims characters), an IPv4 address (a `reg-name` too), or an IP literal in brackets
/// (hex digits, `:` and `.` for IPv6, or `v`-prefixed IPvFuture), then `:` and digits for a
/// port. An empty host is refused: an `http`/`https` request must name one (RFC 9110 §4.2).
pub fn is_authority(v: &str) -> bool {
    let (host, port) = match v.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((literal, after)) if is_ip_literal(literal) => ("x", after),
            _ => return false,
        },
        None => match v.rfind(':') {
            Some(i) => (&v[..i], &v[i..]),
            None => (v, ""),
        },
    };
    let port_ok = match port.strip_prefix(':') {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()),
        None => port.is_empty(),
    };
    !host.is_empty() && port_ok && is_reg_name(host)
}

/// RFC 3986 `reg-name`: unreserved / pct-encoded / sub-delims.
fn is_reg_name(host: &str) -> bool {
    let b = host.as_bytes();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hex = |j: usize| b.get(j).is_some_and(|x| x.is_ascii_hexdigit());
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
            continue;
        }
        let ok = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        if !ok {
            return false;
        }
        i += 1;
    }
    true
}

/// The inside of RFC 3986's `IP-literal` brackets, checked by its characters: an IPv6
/// address (hex digits, `:`, `.` for an embedded IPv4 part) or `IPvFuture`
/// (`v` hex `.` then unreserved, sub-delims or `:`).
fn is_ip_literal(s: &str) -> bool {
    if let Some(rest) = s.strip_prefix(['v', 'V']) {
        let Some((ver, addr)) = rest.split_once('.') else {
            return false;
        };
        return !ver.is_empty()
            && ver.bytes().all(|b| b.is_ascii_hexdigit())
            && !addr.is_empty()
            && addr.split(':').all(is_reg_name_no_pct);
    }
    s.contains(':')
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
}

fn is_reg_name_no_pct(s: &str) -> bool {
    !s.contains('%') && is_reg_name(s)
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
    fn a_keep_alive_head_leaves_the_connection_open() {
        let mut b = Builder::new();
        for (n, v) in GET {
            b.field(n.as_bytes(), v.as_bytes());
        }
        b.field(b"content-length", b"0");
        let r = b.finish_keep_alive(false).unwrap();
        assert_eq!(
            String::from_utf8(r.head).unwrap(),
            "GET /sse?topic=a HTTP/1.1\r\nhost: example.com\r\ncontent-length: 0\r\n\r\n"
        );
        // A client still cannot ask for a close (or anything connection-specific) itself.
        let mut b = Builder::new();
        for (n, v) in GET {
            b.field(n.as_bytes(), v.as_bytes());
        }
        b.field(b"connection", b"close");
        assert!(b.finish_keep_alive(false).is_err());
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
    fn two_host_fields_are_refused() {
        let f = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("host", "a.example"),
            ("host", "b.example"),
        ];
        assert_eq!(build(&f), Err("more than one host field"));
        // One is taken as the Host.
        let r = build(&f[..4]).unwrap();
        assert!(String::from_utf8(r.head)
            .unwrap()
            .contains("host: a.example\r\n"));
    }

    #[test]
    fn a_host_naming_another_authority_is_refused() {
        let mut f = GET.to_vec();
        f.push(("host", "evil.example"));
        assert_eq!(build(&f), Err("host differs from :authority"));
        // The same name, in another case, is the same authority.
        f[4] = ("host", "EXAMPLE.com");
        assert!(build(&f).is_ok());
    }

    #[test]
    fn authorities_that_are_not_host_and_port_are_refused() {
        for bad in [
            "x y",
            "a/b",
            "a?b",
            "a#b",
            "user@example.com",
            "user:pass@example.com",
            "",
            ":80",
            "example.com:8o",
            "example.com:80:80",
            "[::1",
            "[::1]x",
            "[::1]:8o",
            "[]",
            "[zz::1]",
            "a%zz",
            "a\\b",
            "a\"b",
            "a<b>",
            "é.example",
        ] {
            assert!(!is_authority(bad), "{bad:?} accepted");
            let mut f = GET.to_vec();
            f[2] = (":authority", bad);
            assert!(build(&f).is_err(), "{bad:?} as :authority");
            let mut f = GET.to_vec();
            f.remove(2);
            f.push(("host", bad));
            assert!(build(&f).is_err(), "{bad:?} as host");
        }
        for good in [
            "example.com",
            "example.com:443",
            "localhost:8080",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:8443",
            "[::ffff:127.0.0.1]:80",
            "[v1.fe80::a+en1]",
            "my_host.example",
            "a%20b",
            "example.com:",
            "xn--bcher-kva.example",
        ] {
            assert!(is_authority(good), "{good:?} refused");
            let mut f = GET.to_vec();
            f[2] = (":authority", good);
            assert!(build(&f).is_ok(), "{good:?} as :authority");
        }
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
