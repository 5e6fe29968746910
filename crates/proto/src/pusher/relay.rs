//! What a Pusher event carries between cluster nodes besides its payload: its event name, the
//! socket id to leave out (a trigger's `socket_id`, a client event's sender) and, for a
//! presence channel's client event, the sender's `user_id`. The server hands these bytes to the
//! cluster broker as the message's attachment, so the other nodes leave out the same socket and
//! use the same name; a message without a Pusher part carries none and is unchanged.
//!
//! ```text
//! 'P' name_len(2) name [ 'x' high(8) low(8) ] [ 'u' user_len(2) user ]
//! ```
//!
//! Lengths and numbers are big-endian. The leading `P` is a byte GRIP's attachment encoding
//! never starts with, so one decoder tells the two apart. Anything else (a truncated body, an
//! unknown field, text that is not UTF-8, trailing bytes) is refused whole.

use super::socket_id::SocketId;

/// The first byte of an encoded Pusher part.
pub const MARKER: u8 = b'P';
const EXCLUDE: u8 = b'x';
const USER: u8 = b'u';

/// The Pusher part of a message, borrowed from its encoding or from the publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relay<'a> {
    /// The Pusher event name.
    pub name: &'a str,
    /// The connection that must not receive it.
    pub exclude: Option<SocketId>,
    /// The sender of a presence channel's client event.
    pub user_id: Option<&'a str>,
}

impl Relay<'_> {
    /// The bytes of this part. Names and user ids longer than 65,535 bytes are cut (the
    /// decoders that admit them bound both far below that).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(3 + self.name.len() + 17);
        out.push(MARKER);
        text(&mut out, self.name);
        if let Some(x) = self.exclude {
            out.push(EXCLUDE);
            out.extend_from_slice(&x.high.to_be_bytes());
            out.extend_from_slice(&x.low.to_be_bytes());
        }
        if let Some(u) = self.user_id {
            out.push(USER);
            text(&mut out, u);
        }
        out
    }
}

fn text(out: &mut Vec<u8>, s: &str) {
    let mut n = s.len().min(usize::from(u16::MAX));
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    out.extend_from_slice(&(n as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes().get(..n).unwrap_or_default());
}

fn take(buf: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (buf.len() >= n).then(|| buf.split_at(n))
}

fn take_text(buf: &[u8]) -> Option<(&str, &[u8])> {
    let (len, rest) = take(buf, 2)?;
    let n = u16::from_be_bytes([*len.first()?, *len.get(1)?]);
    let (t, rest) = take(rest, usize::from(n))?;
    Some((std::str::from_utf8(t).ok()?, rest))
}

fn number(buf: &[u8]) -> Option<(u64, &[u8])> {
    let (n, rest) = take(buf, 8)?;
    Some((u64::from_be_bytes(n.try_into().ok()?), rest))
}

/// Reads a part written by [`Relay::encode`]; `None` when `buf` is not one.
pub fn decode(buf: &[u8]) -> Option<Relay<'_>> {
    let (&marker, rest) = buf.split_first()?;
    if marker != MARKER {
        return None;
    }
    let (name, mut rest) = take_text(rest)?;
    let mut relay = Relay {
        name,
        exclude: None,
        user_id: None,
    };
    while let Some((&tag, tail)) = rest.split_first() {
        rest = match tag {
            EXCLUDE if relay.exclude.is_none() => {
                let (high, tail) = number(tail)?;
                let (low, tail) = number(tail)?;
                relay.exclude = Some(SocketId { high, low });
                tail
            }
            USER if relay.user_id.is_none() => {
                let (user, tail) = take_text(tail)?;
                relay.user_id = Some(user);
                tail
            }
            _ => return None,
        };
    }
    Some(relay)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_combination_round_trips() {
        let x = SocketId {
            high: u64::MAX,
            low: 7,
        };
        for exclude in [None, Some(x)] {
            for user_id in [None, Some(""), Some("ada ☃")] {
                for name in ["", "client-typing", "App\\Events\\OrderShipped"] {
                    let r = Relay {
                        name,
                        exclude,
                        user_id,
                    };
                    let bytes = r.encode();
                    assert_eq!(bytes.first(), Some(&MARKER));
                    assert_eq!(decode(&bytes), Some(r));
                }
            }
        }
    }

    #[test]
    fn truncated_unknown_repeated_or_foreign_bytes_are_refused() {
        let whole = Relay {
            name: "e",
            exclude: Some(SocketId { high: 1, low: 2 }),
            user_id: Some("u"),
        }
        .encode();
        for n in 0..whole.len() {
            // Every cut but the ones that end between fields is refused.
            let cut = whole.get(..n).unwrap_or_default();
            if n != 4 && n != 21 {
                assert_eq!(decode(cut), None, "cut at {n}");
            }
        }
        let mut unknown = whole.clone();
        unknown.push(b'z');
        assert_eq!(decode(&unknown), None);
        let mut twice = Relay {
            name: "e",
            exclude: None,
            user_id: Some("u"),
        }
        .encode();
        twice.extend_from_slice(&[USER, 0, 1, b'v']);
        assert_eq!(decode(&twice), None);
        assert_eq!(
            decode(b"i\0\0\0\x01a"),
            None,
            "GRIP content is not a Pusher part"
        );
        assert_eq!(decode(b"P\0\x02\xff\xfe"), None, "names are UTF-8");
    }

    #[test]
    fn overlong_text_is_cut_on_a_character_boundary() {
        let long = "☃".repeat(30_000);
        let bytes = Relay {
            name: &long,
            exclude: None,
            user_id: None,
        }
        .encode();
        let back = decode(&bytes).expect("decodes");
        assert!(back.name.len() <= usize::from(u16::MAX));
        assert!(long.starts_with(back.name));
    }
}
