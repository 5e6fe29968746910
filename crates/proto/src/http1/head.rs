//! Request heads: the request line and header fields, up to the empty line.
//!
//! [`parse_head`] is called on whatever bytes have arrived so far. It answers "not yet" until the
//! head is complete, but enforces every limit on the partial input, so a client that trickles an
//! endless request line or header block is refused as soon as it crosses the limit rather than
//! after the server has buffered it. Parsing itself is delegated to `httparse`; this module adds
//! the limits, the status each failure maps to, and the header queries the server needs.

/// Size limits for one request head.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// Longest accepted request line (method, target, version), in bytes.
    pub max_request_line: usize,
    /// Most header fields accepted.
    pub max_headers: usize,
    /// Longest accepted head, request line and headers included, in bytes.
    pub max_head_bytes: usize,
}

impl Default for HeadLimits {
    fn default() -> Self {
        HeadLimits {
            max_request_line: 8192,
            max_headers: 64,
            max_head_bytes: 16384,
        }
    }
}

/// A parsed request head, borrowing from the input buffer.
#[derive(Debug)]
pub struct RequestHead<'a> {
    /// Request method, e.g. `GET`.
    pub method: &'a str,
    /// Raw request-target, e.g. `/ws?topic=a`.
    pub target: &'a str,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Header fields in arrival order.
    pub headers: Vec<(&'a str, &'a [u8])>,
    /// Bytes consumed, including the final empty line.
    pub head_len: usize,
}

/// How the request body is delimited (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body.
    None,
    /// Exactly this many bytes follow the head.
    Length(u64),
    /// A chunked body follows the head.
    Chunked,
}

/// Why a request head was refused. [`HeadError::status`] gives the HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// Not a syntactically valid HTTP/1.x request head.
    #[error("malformed request")]
    Malformed,
    /// The request line is longer than the limit.
    #[error("request line too long")]
    RequestLineTooLong,
    /// The head is larger than the limit.
    #[error("request head too large")]
    HeadTooLarge,
    /// More header fields than the limit.
    #[error("too many header fields")]
    TooManyHeaders,
    /// An HTTP version other than 1.0 or 1.1.
    #[error("unsupported HTTP version")]
    UnsupportedVersion,
    /// Content-Length is invalid, repeated with different values, or combined with
    /// Transfer-Encoding.
    #[error("invalid Content-Length")]
    BadContentLength,
    /// A transfer coding other than `chunked`.
    #[error("unsupported transfer coding")]
    UnsupportedTransferEncoding,
    /// More than one `Host` field (RFC 9112 section 3.2: answered 400), which two servers on
    /// the path could read differently.
    #[error("more than one Host header field")]
    DuplicateHost,
}

impl HeadError {
    /// The HTTP status that answers this error.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::Malformed | HeadError::BadContentLength | HeadError::DuplicateHost => 400,
            HeadError::RequestLineTooLong => 414,
            HeadError::HeadTooLarge | HeadError::TooManyHeaders => 431,
            HeadError::UnsupportedVersion => 505,
            HeadError::UnsupportedTransferEncoding => 501,
        }
    }
}

/// Parses a request head from the start of `buf`.
///
/// `Ok(None)` means the head is not complete yet and no limit has been exceeded. Leading empty
/// lines before the request line are skipped, as RFC 9112 section 2.2 allows.
pub fn parse_head<'a>(
    buf: &'a [u8],
    limits: &HeadLimits,
) -> Result<Option<RequestHead<'a>>, HeadError> {
    // The request line limit applies to the first non-empty line.
    let mut start = 0;
    while buf
        .get(start..)
        .is_some_and(|rest| rest.starts_with(b"\r\n"))
    {
        start += 2;
    }
    let line = buf.get(start..).unwrap_or_default();
    if start > 0 && start == buf.len() {
        return Ok(None);
    }
    let line_end = line.iter().position(|&b| b == b'\n');
    match line_end {
        None if buf.len() - start > limits.max_request_line => {
            return Err(HeadError::RequestLineTooLong)
        }
        Some(n) if n > limits.max_request_line => return Err(HeadError::RequestLineTooLong),
        _ => {}
    }
    if let Some(version) = version_token(line) {
        if version.starts_with(b"HTTP/") && version != b"HTTP/1.1" && version != b"HTTP/1.0" {
            return Err(HeadError::UnsupportedVersion);
        }
    }

    let mut storage = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut req = httparse::Request::new(&mut storage);
    let status = match req.parse(buf) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(_) => return Err(HeadError::Malformed),
    };
    let head_len = match status {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => {
            if buf.len() > limits.max_head_bytes {
                return Err(HeadError::HeadTooLarge);
            }
            return Ok(None);
        }
    };
    if head_len > limits.max_head_bytes {
        return Err(HeadError::HeadTooLarge);
    }
    let (Some(method), Some(target), Some(minor_version)) = (req.method, req.path, req.version)
    else {
        return Err(HeadError::Malformed);
    };
    let hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    if hosts.count() > 1 {
        return Err(HeadError::DuplicateHost);
    }
    let headers = req.headers.iter().map(|h| (h.name, h.value)).collect();
    Ok(Some(RequestHead {
        method,
        target,
        minor_version,
        headers,
        head_len,
    }))
}

/// The last word of a complete request line, which is its HTTP version if it is a request
/// line at all. httparse reports `HTTP/2.0` and `NOT HTTP` alike as a version error; this lets
/// us answer 505 to the first and 400 to the second.
fn version_token(line: &[u8]) -> Option<&[u8]> {
    let end = line.iter().position(|&b| b == b'\r' || b == b'\n')?;
    let line = line.get(..end)?;
    let at = line.iter().rposition(|&b| b == b' ')?;
    line.get(at + 1..)
}

impl<'a> RequestHead<'a> {
    /// The request-target without its query string.
    pub fn path(&self) -> &'a str {
        match self.target.find('?') {
            Some(i) => &self.target[..i],
            None => self.target,
        }
    }

    /// The query string after `?`, or `""`.
    pub fn query(&self) -> &'a str {
        match self.target.find('?') {
            Some(i) => &self.target[i + 1..],
            None => "",
        }
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, v)| v)
    }

    /// The first value of header `name` as UTF-8, `None` if absent or not UTF-8.
    pub fn header_str(&self, name: &str) -> Option<&'a str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Whether any `name` header, read as a comma-separated list, contains `token`
    /// (case-insensitive, surrounding whitespace ignored).
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.values(name).any(|v| {
            v.split(|&b| b == b',')
                .any(|item| trim(item).eq_ignore_ascii_case(token.as_bytes()))
        })
    }

    /// Whether the connection may carry another request after this one.
    pub fn keep_alive(&self) -> bool {
        if self.minor_version >= 1 {
            !self.has_token("connection", "close")
        } else {
            self.has_token("connection", "keep-alive")
        }
    }

    /// How the body is framed (RFC 9112 section 6.3). A request with both Transfer-Encoding
    /// and Content-Length is refused rather than guessed at, as it is the classic smuggling
    /// vector.
    pub fn body(&self) -> Result<Body, HeadError> {
        let mut te = self.values("transfer-encoding").peekable();
        let has_te = te.peek().is_some();
        let mut length: Option<u64> = None;
        for v in self.values("content-length") {
            // A list of identical values is allowed by RFC 9110 8.6; anything else is not.
            for item in v.split(|&b| b == b',') {
                let n = parse_decimal(trim(item)).ok_or(HeadError::BadContentLength)?;
                match length {
                    Some(prev) if prev != n => return Err(HeadError::BadContentLength),
                    _ => length = Some(n),
                }
            }
        }
        if has_te {
            if length.is_some() {
                return Err(HeadError::BadContentLength);
            }
            let codings: Vec<&[u8]> = te
                .flat_map(|v| v.split(|&b| b == b','))
                .map(trim)
                .filter(|c| !c.is_empty())
                .collect();
            return match codings.as_slice() {
                [only] if only.eq_ignore_ascii_case(b"chunked") => Ok(Body::Chunked),
                _ => Err(HeadError::UnsupportedTransferEncoding),
            };
        }
        Ok(match length {
            None | Some(0) => Body::None,
            Some(n) => Body::Length(n),
        })
    }

    fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a [u8]> + 's {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, v)| v)
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// A non-empty run of ASCII digits that fits in a u64.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<RequestHead<'_>>, HeadError> {
        parse_head(s.as_bytes(), &HeadLimits::default())
    }

    fn complete(s: &str) -> RequestHead<'_> {
        match parse(s) {
            Ok(Some(h)) => h,
            other => panic!("expected a complete head, got {other:?}"),
        }
    }

    const GET: &str = "GET /ws?topic=a&topic=b HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n";

    #[test]
    fn parses_a_complete_head() {
        let h = complete(GET);
        assert_eq!(h.method, "GET");
        assert_eq!(h.target, "/ws?topic=a&topic=b");
        assert_eq!(h.path(), "/ws");
        assert_eq!(h.query(), "topic=a&topic=b");
        assert_eq!(h.minor_version, 1);
        assert_eq!(h.head_len, GET.len());
        assert_eq!(h.header("HOST"), Some(&b"x"[..]));
        assert_eq!(h.header_str("upgrade"), Some("websocket"));
        assert!(h.has_token("connection", "upgrade"));
        assert!(h.has_token("Connection", "KEEP-ALIVE"));
        assert!(!h.has_token("connection", "close"));
        assert!(h.keep_alive());
        assert_eq!(h.body(), Ok(Body::None));
    }

    #[test]
    fn two_host_fields_are_refused() {
        for s in [
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nhOST: a\r\n\r\n",
        ] {
            assert_eq!(parse(s).err(), Some(HeadError::DuplicateHost), "{s:?}");
        }
        assert_eq!(HeadError::DuplicateHost.status(), 400);
        assert!(parse("GET / HTTP/1.1\r\nHost: a\r\nX-Host: b\r\n\r\n").is_ok());
    }

    #[test]
    fn every_prefix_is_incomplete() {
        for n in 0..GET.len() {
            assert!(matches!(parse(&GET[..n]), Ok(None)), "prefix {n}");
        }
    }

    #[test]
    fn bytes_after_the_head_are_not_consumed() {
        let s = format!("{GET}\u{1}\u{2}");
        assert_eq!(complete(&s).head_len, GET.len());
    }

    #[test]
    fn path_without_query() {
        let h = complete("GET /healthz HTTP/1.1\r\n\r\n");
        assert_eq!(h.path(), "/healthz");
        assert_eq!(h.query(), "");
    }

    #[test]
    fn leading_empty_lines_are_tolerated() {
        let h = complete("\r\n\r\nGET / HTTP/1.1\r\n\r\n");
        assert_eq!(h.method, "GET");
        assert!(matches!(parse("\r\n"), Ok(None)));
    }

    #[test]
    fn keep_alive_rules() {
        assert!(!complete("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive());
        assert!(!complete("GET / HTTP/1.0\r\n\r\n").keep_alive());
        assert!(complete("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive());
    }

    #[test]
    fn has_token_checks_every_occurrence() {
        let h =
            complete("GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection:  upgrade \r\n\r\n");
        assert!(h.has_token("connection", "upgrade"));
        assert!(!h.has_token("connection", "upgr"));
    }

    #[test]
    fn malformed_heads() {
        for s in [
            "GET\r\n\r\n",
            "GET / HTTP/1.1\r\nNo colon\r\n\r\n",
            "G\0T / HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(parse(s).err(), Some(HeadError::Malformed), "{s:?}");
        }
    }

    #[test]
    fn other_versions_get_505() {
        let e = parse("GET / HTTP/2.0\r\n\r\n").err();
        assert_eq!(e, Some(HeadError::UnsupportedVersion));
        assert_eq!(HeadError::UnsupportedVersion.status(), 505);
        assert_eq!(
            parse("GET / HTTP/1.2\r\n\r\n").err(),
            Some(HeadError::UnsupportedVersion)
        );
    }

    #[test]
    fn request_line_limit_applies_to_partial_input() {
        let limits = HeadLimits {
            max_request_line: 32,
            ..HeadLimits::default()
        };
        let long = format!("GET /{} HTTP/1.1", "a".repeat(40));
        assert_eq!(
            parse_head(long.as_bytes(), &limits).err(),
            Some(HeadError::RequestLineTooLong)
        );
        let done = format!("{long}\r\n\r\n");
        assert_eq!(
            parse_head(done.as_bytes(), &limits).err(),
            Some(HeadError::RequestLineTooLong)
        );
        assert_eq!(HeadError::RequestLineTooLong.status(), 414);
        assert!(matches!(parse_head(b"GET / HTTP/1.1", &limits), Ok(None)));
    }

    #[test]
    fn head_size_limit_applies_to_partial_input() {
        let limits = HeadLimits {
            max_head_bytes: 64,
            ..HeadLimits::default()
        };
        let s = format!("GET / HTTP/1.1\r\nX-Long: {}", "v".repeat(80));
        assert_eq!(
            parse_head(s.as_bytes(), &limits).err(),
            Some(HeadError::HeadTooLarge)
        );
        let done = format!("{s}\r\n\r\n");
        assert_eq!(
            parse_head(done.as_bytes(), &limits).err(),
            Some(HeadError::HeadTooLarge)
        );
        assert_eq!(HeadError::HeadTooLarge.status(), 431);
    }

    #[test]
    fn header_count_limit() {
        let limits = HeadLimits {
            max_headers: 3,
            ..HeadLimits::default()
        };
        let ok = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
        assert!(matches!(parse_head(ok.as_bytes(), &limits), Ok(Some(_))));
        let bad = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n";
        assert_eq!(
            parse_head(bad.as_bytes(), &limits).err(),
            Some(HeadError::TooManyHeaders)
        );
        assert_eq!(HeadError::TooManyHeaders.status(), 431);
    }

    #[test]
    fn body_framing() {
        let h = complete("POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n");
        assert_eq!(h.body(), Ok(Body::Length(12)));
        let h = complete("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(h.body(), Ok(Body::None));
        let h = complete("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n");
        assert_eq!(h.body(), Ok(Body::Length(5)));
        let h = complete("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n");
        assert_eq!(h.body(), Ok(Body::Chunked));
    }

    #[test]
    fn bad_body_framing() {
        for (s, e) in [
            (
                "Content-Length: 5\r\nContent-Length: 6",
                HeadError::BadContentLength,
            ),
            ("Content-Length: 5, 6", HeadError::BadContentLength),
            ("Content-Length: -1", HeadError::BadContentLength),
            ("Content-Length: +1", HeadError::BadContentLength),
            ("Content-Length: ", HeadError::BadContentLength),
            (
                "Content-Length: 99999999999999999999",
                HeadError::BadContentLength,
            ),
            (
                "Content-Length: 5\r\nTransfer-Encoding: chunked",
                HeadError::BadContentLength,
            ),
            (
                "Transfer-Encoding: gzip, chunked",
                HeadError::UnsupportedTransferEncoding,
            ),
            (
                "Transfer-Encoding: identity",
                HeadError::UnsupportedTransferEncoding,
            ),
        ] {
            let req = format!("POST / HTTP/1.1\r\n{s}\r\n\r\n");
            assert_eq!(complete(&req).body(), Err(e.clone()), "{s}");
        }
        assert_eq!(HeadError::UnsupportedTransferEncoding.status(), 501);
        assert_eq!(HeadError::BadContentLength.status(), 400);
    }

    #[test]
    fn non_utf8_header_value() {
        let h = parse_head(b"GET / HTTP/1.1\r\nX: \xff\r\n\r\n", &HeadLimits::default());
        if let Ok(Some(h)) = h {
            assert_eq!(h.header_str("x"), None);
            assert_eq!(h.header("x"), Some(&b"\xff"[..]));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let alphabet = b"GET / HTTP/1.1\r\n:abc \t\0\xff?=&%";
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 48) as usize;
            let buf: Vec<u8> = (0..len)
                .map(|i| alphabet[((x >> (i % 56)) as usize + i) % alphabet.len()])
                .collect();
            if let Ok(Some(h)) = parse_head(&buf, &HeadLimits::default()) {
                let _ = (h.path(), h.query(), h.keep_alive(), h.body());
            }
        }
    }
}
