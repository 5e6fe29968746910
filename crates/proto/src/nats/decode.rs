//! Reading what a NATS server sends, incrementally.
//!
//! [`decode`] looks at the start of a buffer the caller owns and returns either one complete
//! operation with the number of bytes it took, or `Ok(None)` when more bytes are needed. It
//! enforces its [`Limits`] while reading: a control line that has not ended within `max_line`
//! bytes, or a message whose announced size is over `max_payload`, is an error as soon as it is
//! seen, before its bytes arrive. So a caller that drops decoded bytes never buffers more than
//! `max_line + max_payload + 2` bytes, whatever the server sends.
//!
//! Operation names are matched case-insensitively; arguments are separated by spaces or tabs.
//! Payloads are binary and may contain `\r\n`; they are framed by their length only.

use serde::Deserialize;

/// How much a decoder accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest control line, `\r\n` excluded. The longest a server sends is `INFO`, which
    /// lists the cluster's client URLs: 64 KiB holds hundreds.
    pub max_line: usize,
    /// Largest message payload (headers included), normally the server's own `max_payload`
    /// from `INFO`.
    pub max_payload: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: 64 * 1024,
            // nats-server's default max_payload: a server that announces less lowers it.
            max_payload: 1024 * 1024,
        }
    }
}

/// The fields of the server's `INFO` that a client uses; others are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Info {
    /// The server's unique id.
    pub server_id: String,
    /// The server's configured name.
    pub server_name: String,
    /// The server's version.
    pub version: String,
    /// The protocol version the server speaks.
    pub proto: i64,
    /// Largest payload the server accepts in a `PUB`, in bytes.
    pub max_payload: u64,
    /// Whether the server understands `HPUB`/`HMSG`.
    pub headers: bool,
    /// Whether the server requires credentials in `CONNECT`.
    pub auth_required: bool,
    /// Whether the server requires TLS.
    pub tls_required: bool,
    /// Other servers of the cluster a client may connect to.
    pub connect_urls: Vec<String>,
    /// Lame duck mode: the server is shutting down and clients should move elsewhere.
    pub ldm: bool,
}

/// One operation from the server. Borrowed parts point into the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerOp<'a> {
    /// `INFO {json}`: at connect, and again when the cluster changes.
    Info(Box<Info>),
    /// `MSG`: a message on a subscription.
    Msg {
        /// The subject it was published to.
        subject: &'a str,
        /// The subscription id the client gave in `SUB`.
        sid: &'a str,
        /// The reply subject, if the publisher gave one.
        reply_to: Option<&'a str>,
        /// The payload.
        payload: &'a [u8],
    },
    /// `HMSG`: a message with headers (sent only to clients that asked for them).
    HMsg {
        /// The subject it was published to.
        subject: &'a str,
        /// The subscription id the client gave in `SUB`.
        sid: &'a str,
        /// The reply subject, if the publisher gave one.
        reply_to: Option<&'a str>,
        /// The header block, from `NATS/1.0` to its blank line, unparsed.
        headers: &'a [u8],
        /// The payload after the headers.
        payload: &'a [u8],
    },
    /// `PING`: the client must answer `PONG`.
    Ping,
    /// `PONG`: the answer to the client's `PING`.
    Pong,
    /// `+OK`: acknowledgement in verbose mode.
    Ok,
    /// `-ERR 'text'`: a protocol or permission error; most close the connection.
    Err(&'a str),
}

/// Why the server's bytes could not be read. Every variant means the connection is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// No line end within the line limit.
    #[error("control line longer than {max} bytes")]
    LineTooLong {
        /// The limit.
        max: usize,
    },
    /// A message announces a payload over the payload limit.
    #[error("message payload of {size} bytes is over the {max}-byte limit")]
    PayloadTooLarge {
        /// The announced size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The line does not start with an operation the server may send.
    #[error("unknown operation {0:?}")]
    UnknownOp(String),
    /// A line is not UTF-8, has the wrong number of arguments, a bare `\n`, or a payload not
    /// followed by `\r\n`.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// A byte count that is not a decimal number, or a header size over the total.
    #[error("bad size in {0}")]
    BadSize(&'static str),
    /// The `INFO` JSON could not be read.
    #[error("bad INFO: {0}")]
    BadInfo(String),
}

/// Decodes the operation at the start of `buf`: `Ok(Some((op, bytes_used)))`, or `Ok(None)`
/// when `buf` holds only part of one (within the limits).
pub fn decode<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(ServerOp<'a>, usize)>, DecodeError> {
    let window = buf.get(..limits.max_line.saturating_add(2)).unwrap_or(buf);
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        return if window.len() > limits.max_line.saturating_add(1) {
            Err(DecodeError::LineTooLong {
                max: limits.max_line,
            })
        } else {
            Ok(None)
        };
    };
    let line = match nl.checked_sub(1).and_then(|cr| window.get(..=cr)) {
        Some(with_cr) if with_cr.last() == Some(&b'\r') => {
            with_cr.get(..nl - 1).unwrap_or_default()
        }
        _ => return Err(DecodeError::Malformed("line end (bare \\n)")),
    };
    if line.len() > limits.max_line {
        return Err(DecodeError::LineTooLong {
            max: limits.max_line,
        });
    }
    let line = std::str::from_utf8(line).map_err(|_| DecodeError::Malformed("line (not UTF-8)"))?;
    let after_line = nl + 1;
    let (op, rest) = match line.find([' ', '\t']) {
        Some(i) => (
            line.get(..i).unwrap_or_default(),
            line.get(i..).unwrap_or_default(),
        ),
        None => (line, ""),
    };
    let args = || rest.split([' ', '\t']).filter(|a| !a.is_empty());
    let simple = |op: ServerOp<'a>| Ok(Some((op, after_line)));
    if op.eq_ignore_ascii_case("MSG") {
        let a: Vec<&str> = args().collect();
        let (subject, sid, reply_to, size) = match a.as_slice() {
            [s, i, n] => (*s, *i, None, *n),
            [s, i, r, n] => (*s, *i, Some(*r), *n),
            _ => return Err(DecodeError::Malformed("MSG arguments")),
        };
        let size = parse_size(size, "MSG")?;
        check_payload(size, limits)?;
        let Some(payload) = framed(buf, after_line, size)? else {
            return Ok(None);
        };
        let op = ServerOp::Msg {
            subject,
            sid,
            reply_to,
            payload,
        };
        Ok(Some((op, after_line + size + 2)))
    } else if op.eq_ignore_ascii_case("HMSG") {
        let a: Vec<&str> = args().collect();
        let (subject, sid, reply_to, hsize, size) = match a.as_slice() {
            [s, i, h, n] => (*s, *i, None, *h, *n),
            [s, i, r, h, n] => (*s, *i, Some(*r), *h, *n),
            _ => return Err(DecodeError::Malformed("HMSG arguments")),
        };
        let hsize = parse_size(hsize, "HMSG")?;
        let size = parse_size(size, "HMSG")?;
        if hsize > size {
            return Err(DecodeError::BadSize("HMSG (headers over total)"));
        }
        check_payload(size, limits)?;
        let Some(all) = framed(buf, after_line, size)? else {
            return Ok(None);
        };
        let (headers, payload) = all.split_at(hsize);
        let op = ServerOp::HMsg {
            subject,
            sid,
            reply_to,
            headers,
            payload,
        };
        Ok(Some((op, after_line + size + 2)))
    } else if op.eq_ignore_ascii_case("PING") {
        simple(ServerOp::Ping)
    } else if op.eq_ignore_ascii_case("PONG") {
        simple(ServerOp::Pong)
    } else if op.eq_ignore_ascii_case("+OK") {
        simple(ServerOp::Ok)
    } else if op.eq_ignore_ascii_case("-ERR") {
        let text = rest.trim();
        let text = text
            .strip_prefix('\'')
            .and_then(|t| t.strip_suffix('\''))
            .unwrap_or(text);
        simple(ServerOp::Err(text))
    } else if op.eq_ignore_ascii_case("INFO") {
        let info: Info =
            serde_json::from_str(rest.trim()).map_err(|e| DecodeError::BadInfo(e.to_string()))?;
        simple(ServerOp::Info(Box::new(info)))
    } else {
        let shown: String = op.chars().take(16).collect();
        Err(DecodeError::UnknownOp(shown))
    }
}

/// A payload size: decimal digits only, at most 19 of them (no overflow, no sign).
fn parse_size(text: &str, op: &'static str) -> Result<usize, DecodeError> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(DecodeError::BadSize(op));
    }
    text.parse().map_err(|_| DecodeError::BadSize(op))
}

fn check_payload(size: usize, limits: &Limits) -> Result<(), DecodeError> {
    if size > limits.max_payload {
        return Err(DecodeError::PayloadTooLarge {
            size,
            max: limits.max_payload,
        });
    }
    Ok(())
}

/// The `size` payload bytes after the line, once they and their `\r\n` are all in `buf`.
fn framed(buf: &[u8], start: usize, size: usize) -> Result<Option<&[u8]>, DecodeError> {
    let end = start + size;
    let Some(tail) = buf.get(end..end + 2) else {
        return Ok(None);
    };
    if tail != b"\r\n" {
        return Err(DecodeError::Malformed("payload end (no \\r\\n after it)"));
    }
    Ok(buf.get(start..end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8]) -> (ServerOp<'_>, usize) {
        decode(buf, &Limits::default())
            .expect("valid")
            .expect("complete")
    }

    #[test]
    fn info() {
        let line = br#"INFO {"server_id":"NABC","version":"2.9.10","proto":1,"max_payload":1048576,"headers":true,"connect_urls":["10.0.0.1:4222"],"nonce":"x"}"#;
        let mut buf = line.to_vec();
        buf.extend_from_slice(b"\r\nPING\r\n");
        let (op, n) = one(&buf);
        assert_eq!(n, line.len() + 2);
        let ServerOp::Info(info) = op else {
            panic!("{op:?}")
        };
        assert_eq!(info.server_id, "NABC");
        assert_eq!(info.max_payload, 1048576);
        assert!(info.headers && !info.tls_required && !info.ldm);
        assert_eq!(info.connect_urls, vec!["10.0.0.1:4222".to_owned()]);
        assert_eq!(one(&buf[n..]), (ServerOp::Ping, 6));
        assert!(matches!(
            decode(b"INFO {nope\r\n", &Limits::default()),
            Err(DecodeError::BadInfo(_))
        ));
    }

    #[test]
    fn simple_ops_any_case() {
        for (text, op) in [
            (&b"PING\r\n"[..], ServerOp::Ping),
            (b"ping\r\n", ServerOp::Ping),
            (b"PoNg\r\n", ServerOp::Pong),
            (b"+ok\r\n", ServerOp::Ok),
            (
                b"-ERR 'Authorization Violation'\r\n",
                ServerOp::Err("Authorization Violation"),
            ),
            (b"-err\tbare text \r\n", ServerOp::Err("bare text")),
        ] {
            assert_eq!(one(text), (op, text.len()), "{text:?}");
        }
    }

    #[test]
    fn msg_with_binary_payload_split_anywhere() {
        let mut payload: Vec<u8> = (0u8..=255).collect();
        payload.extend_from_slice(b"\r\nMSG x 1 2\r\n");
        let mut wire = format!("msg clarion.t.a  9\tr.1 {}\r\n", payload.len()).into_bytes();
        wire.extend_from_slice(&payload);
        wire.extend_from_slice(b"\r\n");
        for cut in 0..wire.len() {
            assert_eq!(decode(&wire[..cut], &Limits::default()), Ok(None), "{cut}");
        }
        let (op, n) = one(&wire);
        assert_eq!(n, wire.len());
        assert_eq!(
            op,
            ServerOp::Msg {
                subject: "clarion.t.a",
                sid: "9",
                reply_to: Some("r.1"),
                payload: &payload,
            }
        );
        let (op, _) = one(b"MSG a 1 0\r\n\r\n");
        assert!(matches!(
            op,
            ServerOp::Msg {
                payload: b"",
                reply_to: None,
                ..
            }
        ));
    }

    #[test]
    fn hmsg_headers_are_separated() {
        let headers = b"NATS/1.0\r\nA: b\r\n\r\n";
        let mut wire = format!("HMSG s 2 {} {}\r\n", headers.len(), headers.len() + 3).into_bytes();
        wire.extend_from_slice(headers);
        wire.extend_from_slice(b"abc\r\n");
        let (op, n) = one(&wire);
        assert_eq!(n, wire.len());
        assert_eq!(
            op,
            ServerOp::HMsg {
                subject: "s",
                sid: "2",
                reply_to: None,
                headers,
                payload: b"abc",
            }
        );
        assert_eq!(
            decode(b"HMSG s 2 5 4\r\n", &Limits::default()),
            Err(DecodeError::BadSize("HMSG (headers over total)"))
        );
    }

    #[test]
    fn limits_are_enforced_before_the_bytes_arrive() {
        let limits = Limits {
            max_line: 16,
            max_payload: 10,
        };
        assert_eq!(decode(&[b'x'; 17], &limits), Ok(None));
        assert_eq!(
            decode(&[b'x'; 18], &limits),
            Err(DecodeError::LineTooLong { max: 16 })
        );
        assert_eq!(
            decode(b"MSG a 1 11\r\n", &limits),
            Err(DecodeError::PayloadTooLarge { size: 11, max: 10 })
        );
        assert_eq!(
            decode(b"HMSG a 1 2 11\r\n", &limits),
            Err(DecodeError::PayloadTooLarge { size: 11, max: 10 })
        );
        assert_eq!(
            decode(b"MSG a 1 10\r\n", &limits),
            Ok(None),
            "within the limit: wait"
        );
        let long = format!("-ERR '{}'\r\n", "e".repeat(20));
        assert_eq!(
            decode(long.as_bytes(), &limits),
            Err(DecodeError::LineTooLong { max: 16 })
        );
    }

    #[test]
    fn malformed_input() {
        let l = Limits::default();
        for (wire, want) in [
            (
                &b"PING\n"[..],
                DecodeError::Malformed("line end (bare \\n)"),
            ),
            (b"\n", DecodeError::Malformed("line end (bare \\n)")),
            (b"MSG a\r\n", DecodeError::Malformed("MSG arguments")),
            (
                b"MSG a 1 r x 5\r\n",
                DecodeError::Malformed("MSG arguments"),
            ),
            (b"MSG a 1 -5\r\n", DecodeError::BadSize("MSG")),
            (b"MSG a 1 +5\r\n", DecodeError::BadSize("MSG")),
            (
                b"MSG a 1 99999999999999999999\r\n",
                DecodeError::BadSize("MSG"),
            ),
            (
                b"MSG a 1 2\r\nabXY",
                DecodeError::Malformed("payload end (no \\r\\n after it)"),
            ),
            (b"\xff\r\n", DecodeError::Malformed("line (not UTF-8)")),
            (b"PUB a 1\r\n", DecodeError::UnknownOp("PUB".into())),
            (b"\r\n", DecodeError::UnknownOp(String::new())),
        ] {
            assert_eq!(decode(wire, &l), Err(want), "{wire:?}");
        }
    }
}
