//! How an appendable message's event travels between nodes through a cluster broker: a live
//! fragment (`append`) or a stream's folded entry in history (the text so far).
//!
//! The Redis script that checks and folds a stream writes these bodies itself (it alone knows
//! the fragment's `seq` and the text so far), so the format is one a Lua script can build with
//! string concatenation:
//!
//! ```text
//! 0x00 KIND ' ' STREAM ' ' SEQ ' ' CLOSED '\n' DATA
//! ```
//!
//! `KIND` is `a` (a live fragment: `DATA` is the fragment) or `f` (folded: `DATA` is the text
//! so far); `STREAM` the stream's id (`EPOCH-SEQ`); `SEQ` decimal; `CLOSED` is `-` (open),
//! `d` (done), `t` (timed out) or `r` (closed by a restart). The leading zero byte is never
//! the first byte of a [`super::wire`] body (whose version nibble is not zero), so a node reads
//! either kind from the same place, and a node that predates streams refuses these as of an
//! unknown version rather than misreading them.

use super::append::CloseReason;
use super::wire::WireError;

/// The first byte of a stream event's body.
pub const MARK: u8 = 0;

/// One stream event as nodes exchange it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamBody<'a> {
    /// A folded entry (the text so far) rather than a live fragment.
    pub folded: bool,
    /// The stream's id.
    pub stream: &'a str,
    /// The fragment's number (folded: fragments included).
    pub seq: u32,
    /// Set when the event closes the stream (or the folded stream is closed).
    pub closed: Option<CloseReason>,
    /// The fragment, or the text so far.
    pub data: &'a str,
}

fn closed_char(c: Option<CloseReason>) -> char {
    match c {
        None => '-',
        Some(CloseReason::Done) => 'd',
        Some(CloseReason::Timeout) => 't',
        Some(CloseReason::Restart) => 'r',
    }
}

impl StreamBody<'_> {
    /// Appends the encoding to `out` (what the Redis script writes).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(MARK);
        let head = format!(
            "{} {} {} {}\n",
            if self.folded { 'f' } else { 'a' },
            self.stream,
            self.seq,
            closed_char(self.closed)
        );
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(self.data.as_bytes());
    }
}

/// Whether `body` is a stream event's (else it is a [`super::wire`] body).
pub fn is_stream_body(body: &[u8]) -> bool {
    body.first() == Some(&MARK)
}

/// Reads a stream event's body. Never panics on any bytes.
pub fn decode(body: &[u8]) -> Result<StreamBody<'_>, WireError> {
    let rest = match body.split_first() {
        Some((&MARK, rest)) => rest,
        Some(_) => return Err(WireError::Version),
        None => return Err(WireError::Truncated),
    };
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or(WireError::Truncated)?;
    let (head, data) = rest.split_at(nl);
    let data = data.get(1..).unwrap_or_default();
    let head = std::str::from_utf8(head).map_err(|_| WireError::Invalid)?;
    let data = std::str::from_utf8(data).map_err(|_| WireError::Invalid)?;
    let mut parts = head.split(' ');
    let (Some(kind), Some(stream), Some(seq), Some(closed), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(WireError::Invalid);
    };
    let folded = match kind {
        "a" => false,
        "f" => true,
        _ => return Err(WireError::Invalid),
    };
    let closed = match closed {
        "-" => None,
        "d" => Some(CloseReason::Done),
        "t" => Some(CloseReason::Timeout),
        "r" => Some(CloseReason::Restart),
        _ => return Err(WireError::Invalid),
    };
    let seq = seq.parse::<u32>().map_err(|_| WireError::Invalid)?;
    if crate::event_id::parse(stream).is_err() {
        return Err(WireError::Invalid);
    }
    Ok(StreamBody {
        folded,
        stream,
        seq,
        closed,
        data,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_bytes_are_the_ones_the_redis_script_builds() {
        // crates/server/src/broker/redis/stream.lua concatenates exactly these.
        let b = StreamBody {
            folded: false,
            stream: "ab12-7",
            seq: 3,
            closed: Some(CloseReason::Timeout),
            data: "x y\nz",
        };
        let mut out = Vec::new();
        b.encode(&mut out);
        assert_eq!(out, b"\0a ab12-7 3 t\nx y\nz");
        assert!(is_stream_body(&out));
        assert_eq!(decode(&out), Ok(b));
        let folded = b"\0f ab12-7 12 -\nHello";
        let d = decode(folded).unwrap();
        assert_eq!(
            (d.folded, d.seq, d.closed, d.data),
            (true, 12, None, "Hello")
        );
    }

    #[test]
    fn bad_bodies_are_refused_not_misread() {
        for bad in [
            &b""[..],
            b"\x10payload",
            b"\0a ab-1 3 -",
            b"\0x ab-1 3 -\n",
            b"\0a ab-1 three -\n",
            b"\0a ab-1 3 q\n",
            b"\0a notanid 3 -\n",
            b"\0a ab-1 3 - extra\n",
            b"\0a ab-1 3 -\n\xff",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
        assert!(!is_stream_body(b"\x10payload"));
    }
}
