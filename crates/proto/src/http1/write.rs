//! Writing HTTP/1.x message heads: request heads for a proxy's upstream requests, and response
//! heads for everything Clarion answers.
//!
//! A request head is built from bytes that came from elsewhere (a client's request, a backend's
//! answer, a routes file), so every piece is checked before it is written: a name that is not a
//! token, or a value holding CR, LF, NUL or another control character, is refused with a
//! [`HeadWriteError`] and nothing of it reaches the output. That is what stops a header from
//! smuggling a second header or a second request into the upstream connection.
//!
//! Response heads are written from fields Clarion itself chose or that were validated when they
//! were parsed (backend heads by the response parser, published JSON headers by the GRIP publish
//! decoder), so [`write_status_head`] does not check them again.

use std::io::Write as _;

use super::response::reason;

/// The HTTP/1.x version written in a start line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `HTTP/1.0`: answered to 1.0 clients, which do not know chunked bodies.
    Http10,
    /// `HTTP/1.1`.
    Http11,
}

impl Version {
    /// The version as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }

    /// The version of a parsed message whose minor version is `minor` (`0` or `1`).
    pub fn from_minor(minor: u8) -> Version {
        if minor == 0 {
            Version::Http10
        } else {
            Version::Http11
        }
    }
}

/// Why part of a request head was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadWriteError {
    /// The method is empty or holds a character that is not a token character.
    #[error("invalid request method")]
    Method,
    /// The request target is empty or holds whitespace or a control character.
    #[error("invalid request target")]
    Target,
    /// A header name is empty or holds a character that is not a token character
    /// (RFC 9110 section 5.1).
    #[error("invalid header name")]
    Name,
    /// A header value holds CR, LF, NUL or another control character other than tab
    /// (RFC 9110 section 5.5).
    #[error("invalid header value")]
    Value,
}

/// An RFC 9110 token: header names and methods.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A field value that cannot end its line early: no control characters but tab.
fn is_field_value(v: &[u8]) -> bool {
    v.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// Appends a request line, `METHOD target VERSION` and CRLF.
pub fn write_request_line(
    out: &mut Vec<u8>,
    method: &str,
    target: &str,
    version: Version,
) -> Result<(), HeadWriteError> {
    if !is_token(method) {
        return Err(HeadWriteError::Method);
    }
    if target.is_empty() || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(HeadWriteError::Target);
    }
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.push(b' ');
    out.extend_from_slice(version.as_str().as_bytes());
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends one header line, `name: value` and CRLF, or nothing when either is invalid.
pub fn write_header(out: &mut Vec<u8>, name: &str, value: &[u8]) -> Result<(), HeadWriteError> {
    if !is_token(name) {
        return Err(HeadWriteError::Name);
    }
    if !is_field_value(value) {
        return Err(HeadWriteError::Value);
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends `Content-Length: n` and CRLF.
pub fn write_content_length(out: &mut Vec<u8>, n: usize) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "Content-Length: {n}\r\n");
}

/// Appends the empty line that ends a head.
pub fn end_head(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\r\n");
}

/// Appends a whole request head: request line, `headers`, `Content-Length` when given, empty
/// line. On error `out` is left as it was.
pub fn write_request_head(
    out: &mut Vec<u8>,
    method: &str,
    target: &str,
    headers: &[(&str, &[u8])],
    content_length: Option<usize>,
) -> Result<(), HeadWriteError> {
    let start = out.len();
    let written = (|| {
        write_request_line(out, method, target, Version::Http11)?;
        for (name, value) in headers {
            write_header(out, name, value)?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        out.truncate(start);
        return Err(e);
    }
    if let Some(n) = content_length {
        write_content_length(out, n);
    }
    end_head(out);
    Ok(())
}

/// Appends a response head: status line (`reason`, or the standard phrase when it is absent
/// or empty), `headers`, `Content-Length` when given, empty line.
pub fn write_status_head(
    out: &mut Vec<u8>,
    version: Version,
    status: u16,
    reason_phrase: Option<&str>,
    headers: &[(&str, &str)],
    content_length: Option<usize>,
) {
    let phrase = reason_phrase
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| reason(status));
    let _ = write!(out, "{} {status} {phrase}\r\n", version.as_str());
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(n) = content_length {
        write_content_length(out, n);
    }
    end_head(out);
}

/// Appends an HTTP/1.1 response head with the standard reason phrase (see
/// [`write_status_head`]).
pub fn write_response_head(
    out: &mut Vec<u8>,
    status: u16,
    headers: &[(&str, &str)],
    content_length: Option<usize>,
) {
    write_status_head(out, Version::Http11, status, None, headers, content_length);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::http1::{parse_head, parse_response_head, HeadLimits};

    #[test]
    fn writes_a_request_head_the_parser_reads_back() {
        let mut out = b"kept".to_vec();
        write_request_head(
            &mut out,
            "POST",
            "/a/b?c=d",
            &[("Host", b"example.com"), ("X-Tab", b"a\tb")],
            Some(3),
        )
        .unwrap();
        let head = &out[4..];
        assert_eq!(
            head,
            b"POST /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nX-Tab: a\tb\r\n\
              Content-Length: 3\r\n\r\n"
        );
        let parsed = parse_head(head, &HeadLimits::default()).unwrap().unwrap();
        assert_eq!((parsed.method, parsed.target), ("POST", "/a/b?c=d"));
        assert_eq!(parsed.header_str("x-tab"), Some("a\tb"));
    }

    #[test]
    fn refuses_header_injection() {
        let mut out = b"GET / HTTP/1.1\r\n".to_vec();
        let before = out.clone();
        for value in [
            &b"a\r\nX-Injected: 1"[..],
            b"a\nX-Injected: 1",
            b"a\rb",
            b"a\0b",
            b"\x7f",
        ] {
            assert_eq!(
                write_header(&mut out, "X-A", value),
                Err(HeadWriteError::Value)
            );
        }
        for name in ["", "X A", "X:A", "X\r\nY", "X\0", "Ü"] {
            assert_eq!(
                write_header(&mut out, name, b"v"),
                Err(HeadWriteError::Name)
            );
        }
        assert_eq!(out, before, "nothing of a refused header is written");
        // A whole head with one bad field leaves the buffer untouched.
        let mut whole = b"x".to_vec();
        let bad: &[(&str, &[u8])] = &[("A", b"1"), ("B", b"2\r\n\r\nGET /evil HTTP/1.1")];
        assert_eq!(
            write_request_head(&mut whole, "GET", "/", bad, None),
            Err(HeadWriteError::Value)
        );
        assert_eq!(whole, b"x");
    }

    #[test]
    fn refuses_bad_request_lines() {
        let mut out = Vec::new();
        for method in ["", "G T", "GET\r\n", "GE/T"] {
            assert_eq!(
                write_request_line(&mut out, method, "/", Version::Http11),
                Err(HeadWriteError::Method)
            );
        }
        for target in ["", "/a b", "/a\r\nHost: x", "/\0", "/\t"] {
            assert_eq!(
                write_request_line(&mut out, "GET", target, Version::Http11),
                Err(HeadWriteError::Target)
            );
        }
        assert!(out.is_empty());
        write_request_line(&mut out, "OPTIONS", "*", Version::Http10).unwrap();
        assert_eq!(out, b"OPTIONS * HTTP/1.0\r\n");
    }

    #[test]
    fn writes_response_heads() {
        let mut out = Vec::new();
        write_response_head(&mut out, 404, &[("Content-Type", "text/plain")], Some(10));
        assert_eq!(
            out,
            b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n"
        );
        out.clear();
        write_response_head(&mut out, 799, &[], None);
        assert_eq!(out, b"HTTP/1.1 799 Unknown\r\n\r\n");
        out.clear();
        write_status_head(
            &mut out,
            Version::Http10,
            200,
            Some("Fine"),
            &[("A", "b")],
            None,
        );
        assert_eq!(out, b"HTTP/1.0 200 Fine\r\nA: b\r\n\r\n");
        out.clear();
        // An empty reason is replaced by the standard one.
        write_status_head(&mut out, Version::Http11, 502, Some(""), &[], Some(0));
        assert_eq!(
            out,
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"
        );
        let h = parse_response_head(&out, 4, 256).unwrap().unwrap();
        assert_eq!(
            (h.status, h.reason, h.minor_version),
            (502, "Bad Gateway", 1)
        );
    }

    #[test]
    fn versions() {
        assert_eq!(Version::from_minor(0), Version::Http10);
        assert_eq!(Version::from_minor(1), Version::Http11);
        assert_eq!(Version::Http10.as_str(), "HTTP/1.0");
    }
}
