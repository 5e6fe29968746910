//! Response heads and reason phrases.

use std::io::Write as _;

/// The standard reason phrase for `status`, or `"Unknown"`.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Appends a response head: status line, `headers`, `Content-Length` when given, empty line.
pub fn write_response_head(
    out: &mut Vec<u8>,
    status: u16,
    headers: &[(&str, &str)],
    content_length: Option<usize>,
) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    if let Some(n) = content_length {
        let _ = write!(out, "Content-Length: {n}\r\n");
    }
    out.extend_from_slice(b"\r\n");
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
    fn writes_a_head() {
        let mut out = Vec::new();
        write_response_head(&mut out, 404, &[("Content-Type", "text/plain")], Some(10));
        assert_eq!(
            out,
            b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n"
        );
        out.clear();
        write_response_head(&mut out, 799, &[], None);
        assert_eq!(out, b"HTTP/1.1 799 Unknown\r\n\r\n");
    }

    #[test]
    fn known_reasons() {
        for s in [
            101, 200, 204, 400, 401, 403, 404, 405, 408, 411, 413, 414, 426, 429, 431, 500, 501,
            502, 503, 504, 505,
        ] {
            assert_ne!(reason(s), "Unknown", "{s}");
        }
    }
}
