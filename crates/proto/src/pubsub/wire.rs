//! How a message travels between Clarion nodes through a broker (Redis, NATS).
//!
//! A body is one flags byte, then the optional SSE event name (one length byte), the optional
//! attachment (GRIP content, four length bytes, big-endian), and the payload as the rest:
//!
//! ```text
//! flags(1) [event_len(1) event] [attachment_len(4) attachment] payload
//! ```
//!
//! A live message from the Redis broker is `EPOCH SEQ BODY` (space-separated; the Redis
//! script that allocates `SEQ` writes the prefix), see [`split_live`].

use thiserror::Error;

use super::topic::validate_event_name;
use crate::event_id;
use crate::ws::DataKind;

const VERSION: u8 = 0x10;
const VERSION_MASK: u8 = 0xF0;
const BINARY: u8 = 1;
const HAS_EVENT: u8 = 2;
const HAS_ATTACHMENT: u8 = 4;

/// One message body as nodes exchange it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Body<'a> {
    /// Text or binary.
    pub kind: DataKind,
    /// The SSE event name given by the publisher.
    pub event: Option<&'a str>,
    /// Content for another protocol's connections, in that protocol's own encoding.
    pub attachment: Option<&'a [u8]>,
    /// The message.
    pub payload: &'a [u8],
}

/// Why bytes from the broker are not a message body. Another program wrote to Clarion's keys
/// or channels, or a node of an incompatible version did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    /// Shorter than its own lengths say.
    #[error("message body truncated")]
    Truncated,
    /// A version or flag this node does not know.
    #[error("message body of an unknown version")]
    Version,
    /// The event name breaks the event rules, or the text payload is not UTF-8.
    #[error("message body with an invalid event name or text")]
    Invalid,
    /// Not `EPOCH SEQ BODY`.
    #[error("live message without a valid EPOCH SEQ prefix")]
    Prefix,
}

impl Body<'_> {
    /// Appends the encoding to `out`. The attachment must be under 4 GiB.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut flags = VERSION;
        if self.kind == DataKind::Binary {
            flags |= BINARY;
        }
        if self.event.is_some() {
            flags |= HAS_EVENT;
        }
        if self.attachment.is_some() {
            flags |= HAS_ATTACHMENT;
        }
        out.push(flags);
        if let Some(e) = self.event {
            // Event names are at most 64 bytes (validate_event_name).
            out.push(e.len().min(255) as u8);
            out.extend_from_slice(e.as_bytes().get(..e.len().min(255)).unwrap_or_default());
        }
        if let Some(a) = self.attachment {
            out.extend_from_slice(&(a.len() as u32).to_be_bytes());
            out.extend_from_slice(a);
        }
        out.extend_from_slice(self.payload);
    }
}

/// Decodes a body, checking the event name and that text is UTF-8.
pub fn decode(buf: &[u8]) -> Result<Body<'_>, WireError> {
    let (&flags, mut rest) = buf.split_first().ok_or(WireError::Truncated)?;
    if flags & VERSION_MASK != VERSION || flags & !(VERSION_MASK | 7) != 0 {
        return Err(WireError::Version);
    }
    let event = if flags & HAS_EVENT != 0 {
        let (&n, tail) = rest.split_first().ok_or(WireError::Truncated)?;
        let (name, tail) = split(tail, usize::from(n))?;
        rest = tail;
        let name = std::str::from_utf8(name).map_err(|_| WireError::Invalid)?;
        validate_event_name(name).map_err(|_| WireError::Invalid)?;
        Some(name)
    } else {
        None
    };
    let attachment = if flags & HAS_ATTACHMENT != 0 {
        let (len, tail) = split(rest, 4)?;
        let mut n = [0; 4];
        n.copy_from_slice(len);
        let (a, tail) = split(tail, u32::from_be_bytes(n) as usize)?;
        rest = tail;
        Some(a)
    } else {
        None
    };
    let kind = if flags & BINARY != 0 {
        DataKind::Binary
    } else {
        std::str::from_utf8(rest).map_err(|_| WireError::Invalid)?;
        DataKind::Text
    };
    Ok(Body {
        kind,
        event,
        attachment,
        payload: rest,
    })
}

fn split(buf: &[u8], n: usize) -> Result<(&[u8], &[u8]), WireError> {
    if buf.len() < n {
        return Err(WireError::Truncated);
    }
    Ok(buf.split_at(n))
}

/// Splits a live message `EPOCH SEQ BODY` into its epoch, sequence number and body.
pub fn split_live(buf: &[u8]) -> Result<(&str, u64, &[u8]), WireError> {
    let mut parts = buf.splitn(3, |&b| b == b' ');
    let epoch = parts.next().ok_or(WireError::Prefix)?;
    let seq = parts.next().ok_or(WireError::Prefix)?;
    let body = parts.next().ok_or(WireError::Prefix)?;
    let epoch = std::str::from_utf8(epoch).map_err(|_| WireError::Prefix)?;
    if !event_id::is_epoch(epoch) {
        return Err(WireError::Prefix);
    }
    let seq = std::str::from_utf8(seq)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(WireError::Prefix)?;
    Ok((epoch, seq, body))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn round_trip(b: Body<'_>) {
        let mut out = Vec::new();
        b.encode(&mut out);
        assert_eq!(decode(&out), Ok(b));
    }

    #[test]
    fn bodies_round_trip() {
        round_trip(Body {
            kind: DataKind::Text,
            event: None,
            attachment: None,
            payload: b"hello",
        });
        round_trip(Body {
            kind: DataKind::Binary,
            event: Some("tick"),
            attachment: Some(b"\x00\xff"),
            payload: &[0xff, 0, 1],
        });
        round_trip(Body {
            kind: DataKind::Text,
            event: None,
            attachment: Some(b""),
            payload: b"",
        });
    }

    #[test]
    fn broken_bodies_are_refused() {
        assert_eq!(decode(b""), Err(WireError::Truncated));
        assert_eq!(decode(b"\x20x"), Err(WireError::Version));
        assert_eq!(decode(b"\x18x"), Err(WireError::Version));
        assert_eq!(decode(b"\x12\x05ab"), Err(WireError::Truncated));
        assert_eq!(decode(b"\x12\x02a b"), Err(WireError::Invalid));
        assert_eq!(decode(b"\x14\x00\x00\x01"), Err(WireError::Truncated));
        assert_eq!(decode(b"\x10\xff"), Err(WireError::Invalid));
        assert!(decode(b"\x11\xff").is_ok());
    }

    #[test]
    fn live_messages_carry_epoch_and_seq() {
        assert_eq!(
            split_live(b"k3x9 42 \x10hi there"),
            Ok(("k3x9", 42, &b"\x10hi there"[..]))
        );
        assert_eq!(split_live(b"k3x9 42"), Err(WireError::Prefix));
        assert_eq!(split_live(b"K3 1 x"), Err(WireError::Prefix));
        assert_eq!(split_live(b"k3 -1 x"), Err(WireError::Prefix));
    }
}
