//! How a message travels between Clarion nodes through a broker (Redis, NATS).
//!
//! A body is one flags byte, then the optional SSE event name (one length byte), the optional
//! attachment (GRIP content, four length bytes, big-endian), and the payload as the rest:
//!
//! ```text
//! flags(1) [event_len(1) event] [tags_len(2) tags] [attachment_len(4) attachment] payload
//! ```
//!
//! Tags (a publication's filter tags, `docs/filters.md`) are `count(1)` then, per tag,
//! `key_len(1) key value_len(2) value` (lengths big-endian), checked with
//! [`crate::filter::validate_tags`] when read. A body without tags has no `HAS_TAGS` flag and
//! is byte for byte what nodes wrote before tags existed, so either reads the other's untagged
//! messages.
//!
//! A publisher-given conflation key (`docs/conflation.md`) follows the tags as `key_len(2) key`
//! under the `HAS_KEY` flag (0x20, a bit of the version nibble that version 1 never sets): a
//! body without a key is unchanged, and a node that predates keys refuses a keyed body as of an
//! unknown version rather than misreading it.
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
const HAS_TAGS: u8 = 8;
const HAS_KEY: u8 = 0x20;

/// One message body as nodes exchange it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Body<'a> {
    /// Text or binary.
    pub kind: DataKind,
    /// The SSE event name given by the publisher.
    pub event: Option<&'a str>,
    /// Content for another protocol's connections, in that protocol's own encoding.
    pub attachment: Option<&'a [u8]>,
    /// The publication's tags, encoded with [`encode_tags`] (read them with [`decode_tags`]).
    pub tags: Option<&'a [u8]>,
    /// The publisher's conflation key, valid by [`crate::conflate::validate_publish_key`].
    pub conflation_key: Option<&'a str>,
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
        if self.tags.is_some() {
            flags |= HAS_TAGS;
        }
        if self.conflation_key.is_some() {
            flags |= HAS_KEY;
        }
        out.push(flags);
        if let Some(e) = self.event {
            // Event names are at most 64 bytes (validate_event_name).
            out.push(e.len().min(255) as u8);
            out.extend_from_slice(e.as_bytes().get(..e.len().min(255)).unwrap_or_default());
        }
        if let Some(t) = self.tags {
            // Bounded tags encode to at most 10,336 bytes (32 × (1 + 64 + 2 + 256) + 1).
            out.extend_from_slice(&(t.len().min(0xffff) as u16).to_be_bytes());
            out.extend_from_slice(t.get(..t.len().min(0xffff)).unwrap_or_default());
        }
        if let Some(k) = self.conflation_key {
            // Valid keys are at most 256 bytes.
            let k = k.as_bytes();
            out.extend_from_slice(&(k.len().min(0xffff) as u16).to_be_bytes());
            out.extend_from_slice(k.get(..k.len().min(0xffff)).unwrap_or_default());
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
    // The four low bits are all flags now (binary, event, attachment, tags), and so is
    // `HAS_KEY` in the version nibble: only the rest of that nibble can be unknown.
    if flags & VERSION_MASK & !HAS_KEY != VERSION {
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
    let tags = if flags & HAS_TAGS != 0 {
        let (t, tail) = split_u16_prefixed(rest)?;
        decode_tags(t)?;
        rest = tail;
        Some(t)
    } else {
        None
    };
    let conflation_key = if flags & HAS_KEY != 0 {
        let (k, tail) = split_u16_prefixed(rest)?;
        let k = std::str::from_utf8(k).map_err(|_| WireError::Invalid)?;
        crate::conflate::validate_publish_key(k).map_err(|_| WireError::Invalid)?;
        rest = tail;
        Some(k)
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
        tags,
        conflation_key,
        payload: rest,
    })
}

/// Appends `tags` (valid by [`crate::filter::validate_tags`], so their lengths fit) in the
/// body's tag encoding.
pub fn encode_tags(tags: &[(String, String)], out: &mut Vec<u8>) {
    out.push(tags.len().min(255) as u8);
    for (k, v) in tags.iter().take(255) {
        let k = k.as_bytes().get(..k.len().min(255)).unwrap_or_default();
        let v = v.as_bytes().get(..v.len().min(0xffff)).unwrap_or_default();
        out.push(k.len() as u8);
        out.extend_from_slice(k);
        out.extend_from_slice(&(v.len() as u16).to_be_bytes());
        out.extend_from_slice(v);
    }
}

/// Reads tags written by [`encode_tags`], checking them against the tag bounds.
pub fn decode_tags(mut buf: &[u8]) -> Result<Vec<(String, String)>, WireError> {
    let (&n, tail) = buf.split_first().ok_or(WireError::Truncated)?;
    buf = tail;
    let mut tags = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        let (&kl, tail) = buf.split_first().ok_or(WireError::Truncated)?;
        let (k, tail) = split(tail, usize::from(kl))?;
        let (vl, tail) = split(tail, 2)?;
        let vl = u16::from_be_bytes([
            vl.first().copied().unwrap_or(0),
            vl.get(1).copied().unwrap_or(0),
        ]);
        let (v, tail) = split(tail, usize::from(vl))?;
        buf = tail;
        let k = std::str::from_utf8(k).map_err(|_| WireError::Invalid)?;
        let v = std::str::from_utf8(v).map_err(|_| WireError::Invalid)?;
        tags.push((k.to_owned(), v.to_owned()));
    }
    if !buf.is_empty() {
        return Err(WireError::Invalid);
    }
    crate::filter::validate_tags(tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|_| WireError::Invalid)?;
    Ok(tags)
}

fn split(buf: &[u8], n: usize) -> Result<(&[u8], &[u8]), WireError> {
    if buf.len() < n {
        return Err(WireError::Truncated);
    }
    Ok(buf.split_at(n))
}

/// Splits off a field written as a 2-byte big-endian length and its bytes.
fn split_u16_prefixed(buf: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    let (len, tail) = split(buf, 2)?;
    let n = u16::from_be_bytes([
        len.first().copied().unwrap_or(0),
        len.get(1).copied().unwrap_or(0),
    ]);
    split(tail, usize::from(n))
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
            tags: None,
            conflation_key: None,
            payload: b"hello",
        });
        round_trip(Body {
            kind: DataKind::Binary,
            event: Some("tick"),
            attachment: Some(b"\x00\xff"),
            tags: None,
            conflation_key: None,
            payload: &[0xff, 0, 1],
        });
        round_trip(Body {
            kind: DataKind::Text,
            event: None,
            attachment: Some(b""),
            tags: None,
            conflation_key: None,
            payload: b"",
        });
    }

    #[test]
    fn tags_travel_and_untagged_bodies_are_unchanged() {
        let tags = vec![
            ("sport".to_owned(), "football".to_owned()),
            ("p".to_owned(), String::new()),
        ];
        let mut t = Vec::new();
        encode_tags(&tags, &mut t);
        let b = Body {
            kind: DataKind::Text,
            event: Some("tick"),
            attachment: Some(b"a"),
            tags: Some(&t),
            conflation_key: None,
            payload: b"hi",
        };
        round_trip(b);
        let mut out = Vec::new();
        b.encode(&mut out);
        assert_eq!(
            decode_tags(decode(&out).unwrap().tags.unwrap()).unwrap(),
            tags
        );
        // What a node without tags wrote reads the same (and is what an untagged body is).
        assert_eq!(
            decode(b"\x10hi").unwrap(),
            Body {
                kind: DataKind::Text,
                event: None,
                attachment: None,
                tags: None,
                conflation_key: None,
                payload: b"hi"
            }
        );
        // Tags that break the bounds, or are cut short, refuse the body.
        let bad = [("in".to_owned(), "x".to_owned())];
        let mut t = Vec::new();
        encode_tags(&bad, &mut t);
        let mut out = vec![0x18];
        out.extend_from_slice(&(t.len() as u16).to_be_bytes());
        out.extend_from_slice(&t);
        assert_eq!(decode(&out), Err(WireError::Invalid));
        assert_eq!(decode(b"\x18\x00\x05\x01"), Err(WireError::Truncated));
    }

    #[test]
    fn conflation_keys_travel_behind_their_flag_and_keyless_bodies_are_unchanged() {
        let keyed = Body {
            kind: DataKind::Text,
            event: Some("tick"),
            attachment: None,
            tags: None,
            conflation_key: Some("EURUSD"),
            payload: b"1.08",
        };
        round_trip(keyed);
        let mut out = Vec::new();
        keyed.encode(&mut out);
        assert_eq!(out[0], 0x32);
        assert_eq!(&out[out.len() - 12..], b"\x00\x06EURUSD1.08");
        // Without a key, the bytes are what a node before keys wrote.
        let mut plain = Vec::new();
        Body {
            conflation_key: None,
            ..keyed
        }
        .encode(&mut plain);
        assert_eq!(plain, b"\x12\x04tick1.08");
        // A key that breaks the bounds, or is cut short, refuses the body.
        assert_eq!(decode(b"\x30\x00\x00x"), Err(WireError::Invalid));
        assert_eq!(decode(b"\x30\x00\x01\x07x"), Err(WireError::Invalid));
        assert_eq!(decode(b"\x30\x00\x09ab"), Err(WireError::Truncated));
        let long = "k".repeat(crate::conflate::MAX_KEY + 1);
        let mut out = vec![0x30];
        out.extend_from_slice(&(long.len() as u16).to_be_bytes());
        out.extend_from_slice(long.as_bytes());
        assert_eq!(decode(&out), Err(WireError::Invalid));
    }

    #[test]
    fn broken_bodies_are_refused() {
        assert_eq!(decode(b""), Err(WireError::Truncated));
        assert_eq!(decode(b"\x20x"), Err(WireError::Version));
        assert_eq!(decode(b"\x50x"), Err(WireError::Version));
        assert_eq!(decode(b"\x30x"), Err(WireError::Truncated));
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
