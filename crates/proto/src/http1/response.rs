//! Reason phrases, chunked response bodies, and response heads from upstream servers.

use std::io::Write as _;

/// The standard reason phrase for `status`, or `"Unknown"`.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        412 => "Precondition Failed",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Appends one chunk of a `Transfer-Encoding: chunked` response body (RFC 9112 section 7.1):
/// hexadecimal size, CRLF, the data, CRLF. Empty data writes nothing, since a zero-size chunk
/// would end the body; [`LAST_CHUNK`] does that on purpose.
pub fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The zero-size chunk and empty trailer section that end a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_chunks_the_decoder_reads_back() {
        let mut out = Vec::new();
        write_chunk(&mut out, b"hello\n");
        write_chunk(&mut out, b"");
        write_chunk(&mut out, &[b'x'; 300]);
        assert!(out.starts_with(b"6\r\nhello\n\r\n12c\r\n"));
        out.extend_from_slice(LAST_CHUNK);
        let mut dec = crate::http1::ChunkedDecoder::new(1000);
        let mut body = Vec::new();
        assert_eq!(dec.decode(&out, &mut body), Ok((out.len(), true)));
        assert_eq!(body.len(), 306);
    }

    #[test]
    fn every_status_of_rfc_9110_and_6585_has_its_reason() {
        // RFC 9110 section 15 (less 305 and 306, unused), RFC 6585 (428, 429, 431), RFC 7725 (451).
        for s in [
            100, 101, 200, 201, 202, 203, 204, 205, 206, 300, 301, 302, 303, 304, 307, 308, 400,
            401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417,
            421, 422, 426, 428, 429, 431, 451, 500, 501, 502, 503, 504, 505,
        ] {
            assert_ne!(reason(s), "Unknown", "{s}");
        }
    }
}

/// A response head from an upstream server (a GRIP backend), borrowing from the input.
#[derive(Debug)]
pub struct ResponseHead<'a> {
    /// Status code.
    pub status: u16,
    /// Reason phrase as sent (may be empty).
    pub reason: &'a str,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Header fields in arrival order.
    pub headers: Vec<(&'a str, &'a [u8])>,
    /// Bytes consumed, including the final empty line.
    pub head_len: usize,
}

/// How an upstream response body is delimited (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// No body (1xx, 204, 304, or an answer to HEAD).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked.
    Chunked,
    /// Until the server closes the connection.
    UntilClose,
}

/// Why an upstream response head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// Not a valid HTTP/1.x status line and headers.
    #[error("malformed response head")]
    Malformed,
    /// Larger than the limit, or too many header fields.
    #[error("response head too large")]
    TooLarge,
    /// Content-Length invalid, repeated with different values, or with Transfer-Encoding; or a
    /// transfer coding other than chunked.
    #[error("invalid response body framing")]
    Framing,
}

/// Parses a response head from the start of `buf`; `Ok(None)` until it is complete. At most
/// `max_headers` fields and `max_bytes` bytes.
pub fn parse_response_head(
    buf: &[u8],
    max_headers: usize,
    max_bytes: usize,
) -> Result<Option<ResponseHead<'_>>, ResponseError> {
    let mut slots = vec![httparse::EMPTY_HEADER; max_headers];
    let mut r = httparse::Response::new(&mut slots);
    let used = match r.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() > max_bytes => {
            return Err(ResponseError::TooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(n)) if n > max_bytes => return Err(ResponseError::TooLarge),
        Ok(httparse::Status::Complete(n)) => n,
        Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::TooLarge),
        Err(_) => return Err(ResponseError::Malformed),
    };
    let (Some(status), Some(minor)) = (r.code, r.version) else {
        return Err(ResponseError::Malformed);
    };
    Ok(Some(ResponseHead {
        status,
        reason: r.reason.unwrap_or_default(),
        minor_version: minor,
        headers: r.headers.iter().map(|h| (h.name, h.value)).collect(),
        head_len: used,
    }))
}

impl ResponseHead<'_> {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// How the body is delimited, for a response to a request with method `method`.
    pub fn body(&self, method: &str) -> Result<ResponseBody, ResponseError> {
        if method == "HEAD" || self.status < 200 || self.status == 204 || self.status == 304 {
            return Ok(ResponseBody::None);
        }
        let mut length: Option<u64> = None;
        let mut chunked = false;
        for (name, value) in &self.headers {
            if name.eq_ignore_ascii_case("transfer-encoding") {
                let v = std::str::from_utf8(value).map_err(|_| ResponseError::Framing)?;
                if !v.trim().eq_ignore_ascii_case("chunked") {
                    return Err(ResponseError::Framing);
                }
                chunked = true;
            } else if name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(value)
                    .ok()
                    .map(str::trim)
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or(ResponseError::Framing)?;
                if length.is_some_and(|l| l != n) {
                    return Err(ResponseError::Framing);
                }
                length = Some(n);
            }
        }
        match (chunked, length) {
            (true, Some(_)) => Err(ResponseError::Framing),
            (true, None) => Ok(ResponseBody::Chunked),
            (false, Some(n)) => Ok(ResponseBody::Length(n)),
            (false, None) => Ok(ResponseBody::UntilClose),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod response_head_tests {
    use super::*;

    #[test]
    fn parses_and_frames() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello";
        for cut in 0..raw.len() - 5 {
            assert!(parse_response_head(&raw[..cut], 16, 1024)
                .unwrap()
                .is_none());
        }
        let h = parse_response_head(raw, 16, 1024).unwrap().unwrap();
        assert_eq!((h.status, h.reason, h.minor_version), (200, "OK", 1));
        assert_eq!(h.head_len, raw.len() - 5);
        assert_eq!(h.header("content-type"), Some(&b"text/plain"[..]));
        assert_eq!(h.body("GET"), Ok(ResponseBody::Length(5)));
        assert_eq!(h.body("HEAD"), Ok(ResponseBody::None));
        let c = parse_response_head(
            b"HTTP/1.1 404 \r\nTransfer-Encoding: chunked\r\n\r\n",
            16,
            1024,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.body("GET"), Ok(ResponseBody::Chunked));
        let e = parse_response_head(b"HTTP/1.0 200 OK\r\n\r\n", 16, 1024)
            .unwrap()
            .unwrap();
        assert_eq!(e.body("GET"), Ok(ResponseBody::UntilClose));
        let n = parse_response_head(b"HTTP/1.1 204 No Content\r\n\r\n", 16, 1024)
            .unwrap()
            .unwrap();
        assert_eq!(n.body("GET"), Ok(ResponseBody::None));
    }

    #[test]
    fn refuses_bad_heads() {
        fn bad(raw: &[u8]) -> Result<Option<ResponseHead<'_>>, ResponseError> {
            parse_response_head(raw, 4, 256)
        }
        assert_eq!(
            bad(b"HTTX/1.1 200 OK\r\n\r\n").unwrap_err(),
            ResponseError::Malformed
        );
        assert_eq!(bad(&[b'a'; 300]).unwrap_err(), ResponseError::Malformed);
        let many = b"HTTP/1.1 200 OK\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\ne: 1\r\n\r\n";
        assert_eq!(bad(many).unwrap_err(), ResponseError::TooLarge);
        let mut long = b"HTTP/1.1 200 OK\r\nx: ".to_vec();
        long.extend([b'a'; 300]);
        assert_eq!(bad(&long).unwrap_err(), ResponseError::TooLarge);
        for framing in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
        ] {
            let h = bad(framing).unwrap().unwrap();
            assert_eq!(h.body("GET"), Err(ResponseError::Framing));
        }
    }
}
