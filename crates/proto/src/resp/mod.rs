//! RESP2, the Redis serialization protocol (<https://redis.io/docs/latest/develop/reference/protocol-spec/>),
//! as far as a client needs it: commands out, replies and pub/sub pushes in.
//!
//! A command is an array of bulk strings ([`encode_command`]). A reply is one [`Value`], parsed
//! incrementally by [`parse`]: `Ok(None)` means the buffer holds only part of it. Sizes are
//! checked before anything is allocated, so a broken or hostile server cannot make the client
//! buffer more than [`Limits`] allow.

use thiserror::Error;

/// One RESP2 value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`: the server refused the command.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nabc`; `$-1` is `Nil`.
    Bulk(Vec<u8>),
    /// `*2\r\n...`; `*-1` is `Nil`.
    Array(Vec<Value>),
    /// The null bulk string or null array.
    Nil,
}

impl Value {
    /// The bytes of a bulk or simple string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bulk(b) => Some(b),
            Value::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// A bulk or simple string as UTF-8 text.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(self.as_bytes()?).ok()
    }

    /// An integer, or a string that spells one (scripts return either).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Integer(i) => Some(*i),
            _ => self.as_str()?.parse().ok(),
        }
    }
}

/// How much one reply may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string, in bytes.
    pub max_bulk: usize,
    /// Most elements in one array.
    pub max_array: usize,
    /// Deepest nesting of arrays.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 64 << 20,
            max_array: 1 << 20,
            max_depth: 8,
        }
    }
}

/// Why the bytes from the server are not RESP2 within the limits. The connection cannot be
/// trusted after any of these and must be closed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RespError {
    /// A type byte RESP2 does not define.
    #[error("unknown RESP type byte {0:#04x}")]
    UnknownType(u8),
    /// A length or integer line that is not a decimal number.
    #[error("malformed RESP number")]
    BadNumber,
    /// A line longer than any valid header.
    #[error("RESP line too long")]
    LineTooLong,
    /// A bulk string not followed by CRLF.
    #[error("RESP bulk string without its CRLF")]
    BadTerminator,
    /// A bulk string or array over [`Limits`].
    #[error("RESP reply over the size limit")]
    TooLarge,
    /// Arrays nested deeper than [`Limits::max_depth`].
    #[error("RESP reply nested too deeply")]
    TooDeep,
}

/// Longest `+`, `-` or `:` line accepted (error texts included).
const MAX_LINE: usize = 64 * 1024;

/// Appends `args` as one command: `*N` then each argument as a bulk string.
pub fn encode_command<A: AsRef<[u8]>>(out: &mut Vec<u8>, args: &[A]) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        let a = a.as_ref();
        out.push(b'$');
        out.extend_from_slice(a.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses one value from the start of `buf`: `Ok(Some((value, bytes used)))`, or `Ok(None)` if
/// `buf` ends before the value does.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(Value, usize)>, RespError> {
    let mut at = 0;
    match value(buf, &mut at, limits, 0)? {
        Some(v) => Ok(Some((v, at))),
        None => Ok(None),
    }
}

fn value(
    buf: &[u8],
    at: &mut usize,
    limits: &Limits,
    depth: usize,
) -> Result<Option<Value>, RespError> {
    let Some(line) = line(buf, *at)? else {
        return Ok(None);
    };
    let Some((&kind, rest)) = line.split_first() else {
        return Err(RespError::UnknownType(b'\r'));
    };
    let after_line = *at + line.len() + 2;
    let text = || String::from_utf8_lossy(rest).into_owned();
    let v = match kind {
        b'+' => Value::Simple(text()),
        b'-' => Value::Error(text()),
        b':' => Value::Integer(number(rest)?),
        b'$' => {
            let n = number(rest)?;
            if n < 0 {
                Value::Nil
            } else {
                let n = usize::try_from(n).map_err(|_| RespError::TooLarge)?;
                if n > limits.max_bulk {
                    return Err(RespError::TooLarge);
                }
                let end = after_line + n;
                let Some(tail) = buf.get(end..end + 2) else {
                    return Ok(None);
                };
                if tail != b"\r\n" {
                    return Err(RespError::BadTerminator);
                }
                let data = buf.get(after_line..end).unwrap_or_default().to_vec();
                *at = end + 2;
                return Ok(Some(Value::Bulk(data)));
            }
        }
        b'*' => {
            let n = number(rest)?;
            if n < 0 {
                Value::Nil
            } else {
                let n = usize::try_from(n).map_err(|_| RespError::TooLarge)?;
                if n > limits.max_array {
                    return Err(RespError::TooLarge);
                }
                if depth >= limits.max_depth {
                    return Err(RespError::TooDeep);
                }
                let mut pos = after_line;
                // Every element takes at least 3 bytes; never reserve more than the buffer
                // could hold.
                let mut items = Vec::with_capacity(n.min(buf.len() / 3));
                for _ in 0..n {
                    match value(buf, &mut pos, limits, depth + 1)? {
                        Some(v) => items.push(v),
                        None => return Ok(None),
                    }
                }
                *at = pos;
                return Ok(Some(Value::Array(items)));
            }
        }
        other => return Err(RespError::UnknownType(other)),
    };
    *at = after_line;
    Ok(Some(v))
}

/// The line starting at `at`, without its CRLF.
fn line(buf: &[u8], at: usize) -> Result<Option<&[u8]>, RespError> {
    let rest = buf.get(at..).unwrap_or_default();
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(end) => Ok(rest.get(..end)),
        None if rest.len() > MAX_LINE => Err(RespError::LineTooLong),
        None => Ok(None),
    }
}

fn number(s: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(RespError::BadNumber)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn one(s: &[u8]) -> Value {
        let (v, used) = parse(s, &Limits::default()).unwrap().unwrap();
        assert_eq!(used, s.len());
        v
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode_command(&mut out, &["SET", "k", ""]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[test]
    fn every_reply_type_parses() {
        assert_eq!(one(b"+OK\r\n"), Value::Simple("OK".into()));
        assert_eq!(one(b"-ERR no\r\n"), Value::Error("ERR no".into()));
        assert_eq!(one(b":-7\r\n"), Value::Integer(-7));
        assert_eq!(one(b"$3\r\na\r\n\r\n"), Value::Bulk(b"a\r\n".to_vec()));
        assert_eq!(one(b"$-1\r\n"), Value::Nil);
        assert_eq!(one(b"*-1\r\n"), Value::Nil);
        assert_eq!(
            one(b"*3\r\n$8\r\nsmessage\r\n$1\r\nc\r\n*1\r\n:1\r\n"),
            Value::Array(vec![
                Value::Bulk(b"smessage".to_vec()),
                Value::Bulk(b"c".to_vec()),
                Value::Array(vec![Value::Integer(1)]),
            ])
        );
    }

    #[test]
    fn a_partial_reply_waits_for_more_at_every_cut() {
        let whole = b"*2\r\n$5\r\nhello\r\n*1\r\n:12\r\n+next\r\n";
        let first = whole.len() - b"+next\r\n".len();
        for cut in 0..first {
            assert_eq!(
                parse(&whole[..cut], &Limits::default()),
                Ok(None),
                "cut {cut}"
            );
        }
        let (_, used) = parse(whole, &Limits::default()).unwrap().unwrap();
        assert_eq!(used, first);
    }

    #[test]
    fn limits_are_checked_before_allocating() {
        let small = Limits {
            max_bulk: 4,
            max_array: 2,
            max_depth: 1,
        };
        assert_eq!(parse(b"$5\r\n", &small), Err(RespError::TooLarge));
        assert_eq!(parse(b"*3\r\n", &small), Err(RespError::TooLarge));
        assert_eq!(
            parse(b"*1\r\n*1\r\n:1\r\n", &small),
            Err(RespError::TooDeep)
        );
        assert_eq!(
            parse(b"*99999999999999999999\r\n", &Limits::default()),
            Err(RespError::BadNumber)
        );
        assert_eq!(
            parse(b"$1\r\nab\r\n", &small),
            Err(RespError::BadTerminator)
        );
        assert_eq!(parse(b"?\r\n", &small), Err(RespError::UnknownType(b'?')));
        assert_eq!(
            parse(&vec![b'+'; MAX_LINE + 1], &small),
            Err(RespError::LineTooLong)
        );
    }

    #[test]
    fn values_read_as_text_and_numbers() {
        assert_eq!(Value::Bulk(b"12".to_vec()).as_int(), Some(12));
        assert_eq!(Value::Integer(3).as_int(), Some(3));
        assert_eq!(Value::Simple("x".into()).as_str(), Some("x"));
        assert_eq!(Value::Nil.as_bytes(), None);
    }
}
