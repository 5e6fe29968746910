//! Pushpin's WebSocket-over-HTTP body format, `application/websocket-events`.
//!
//! A body is a sequence of events. Each event is a line naming it, `NAME` or `NAME SIZE` with the
//! content size in hexadecimal, ended by CRLF; when a size is given, that many content bytes and
//! another CRLF follow. `TEXT`, `BINARY` and `CLOSE` carry content (a `CLOSE` carries a two-byte
//! big-endian close code, then an optional UTF-8 reason); `OPEN`, `PING`, `PONG` and `DISCONNECT`
//! need none, and content sent with `OPEN` or `DISCONNECT` is ignored as the protocol says.
//! `PING` and `PONG` keep theirs, so an application payload survives the round trip.
//!
//! The decoder is a pure function over a buffer: it returns the next event and how many bytes it
//! used, `Ok(None)` when the buffer holds only part of one, and refuses an event whose announced
//! size is over the limit as soon as its first line is read. Blank lines before an event are
//! skipped (Pushpin's own examples show one after `OPEN`), within the same bound as the line.

use crate::ws::close::{parse_close, CloseError};
use crate::ws::CloseCode;

/// The longest first line accepted, blank lines before it included: `DISCONNECT` plus a space and
/// sixteen hex digits fit with room to spare, so anything longer is not this format.
const MAX_LINE: usize = 40;

/// What a decoder accepts. There is no default: the caller owns these limits (the server's
/// come from its configuration), so this crate cannot disagree with them.
///
/// `max_events` bounds the list a hostile body of empty events could make a decoder build;
/// `max_content` the bytes of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventLimits {
    /// Largest content of one event, in bytes.
    pub max_content: usize,
    /// Most events in one body ([`decode_body`] only).
    pub max_events: usize,
}

/// One WebSocket-over-HTTP event, borrowing its content from the buffer it was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// `OPEN`: the gateway asks to open the connection, or the server accepts it.
    Open,
    /// `TEXT`: a text message.
    Text(&'a str),
    /// `BINARY`: a binary message.
    Binary(&'a [u8]),
    /// `PING`, with its (usually empty) payload.
    Ping(&'a [u8]),
    /// `PONG`, with its (usually empty) payload.
    Pong(&'a [u8]),
    /// `CLOSE`: a close message; `None` when it carries no code.
    Close(Option<(CloseCode, &'a str)>),
    /// `DISCONNECT`: the connection closed uncleanly, or the server no longer knows it.
    Disconnect,
}

impl Event<'_> {
    /// The event's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Open => "OPEN",
            Event::Text(_) => "TEXT",
            Event::Binary(_) => "BINARY",
            Event::Ping(_) => "PING",
            Event::Pong(_) => "PONG",
            Event::Close(_) => "CLOSE",
            Event::Disconnect => "DISCONNECT",
        }
    }
}

/// Why a WebSocket-over-HTTP body was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The first line of an event is not `NAME` or `NAME HEXSIZE` ended by CRLF.
    #[error("malformed websocket-events line")]
    MalformedLine,
    /// The event name is not one the protocol defines.
    #[error("unknown websocket event")]
    UnknownEvent,
    /// An event's content is larger than the limit.
    #[error("websocket event too large")]
    TooLarge,
    /// A body holds more events than the limit.
    #[error("too many websocket events")]
    TooManyEvents,
    /// The content is not followed by CRLF.
    #[error("websocket event content not followed by CRLF")]
    MissingTerminator,
    /// A `TEXT` event's content is not UTF-8.
    #[error("websocket TEXT event is not UTF-8")]
    InvalidUtf8,
    /// A `CLOSE` event's content is not a valid close code and reason.
    #[error("invalid websocket CLOSE event: {0}")]
    InvalidClose(#[from] CloseError),
    /// A complete body ends in the middle of an event.
    #[error("websocket-events body ends mid-event")]
    Truncated,
}

/// Decodes the event at the start of `input`: `Ok(Some((event, used)))` with the number of bytes
/// it took, or `Ok(None)` if `input` holds only part of it.
pub fn decode_event<'a>(
    input: &'a [u8],
    limits: &EventLimits,
) -> Result<Option<(Event<'a>, usize)>, EventError> {
    // Blank lines before the event count towards the line bound.
    let mut start = 0;
    while input.get(start..start + 2) == Some(b"\r\n") {
        start += 2;
    }
    let window = input.get(..input.len().min(MAX_LINE)).unwrap_or_default();
    let Some(lf) = window.iter().skip(start).position(|&b| b == b'\n') else {
        return if input.len() >= MAX_LINE {
            Err(EventError::MalformedLine)
        } else {
            Ok(None)
        };
    };
    let lf = start + lf;
    let line = input.get(start..lf).unwrap_or_default();
    let line = line.strip_suffix(b"\r").ok_or(EventError::MalformedLine)?;
    let (name, size) = match line.iter().position(|&b| b == b' ') {
        None => (line, None),
        Some(sp) => {
            let name = line.get(..sp).unwrap_or_default();
            let hex = line.get(sp + 1..).unwrap_or_default();
            (name, Some(parse_hex(hex)?))
        }
    };
    let kind = Kind::from_name(name).ok_or(EventError::UnknownEvent)?;
    let body_start = lf + 1;
    let Some(size) = size else {
        return Ok(Some((kind.event(&[])?, body_start)));
    };
    if size > limits.max_content as u64 {
        return Err(EventError::TooLarge);
    }
    // `size` fits in usize: it is at most `max_content`.
    let end = body_start
        .checked_add(size as usize)
        .filter(|end| end.checked_add(2).is_some())
        .ok_or(EventError::TooLarge)?;
    let Some(trailer) = input.get(end..end + 2) else {
        // Even a partial terminator can be checked now.
        if let Some(&b) = input.get(end) {
            if b != b'\r' {
                return Err(EventError::MissingTerminator);
            }
        }
        return Ok(None);
    };
    if trailer != b"\r\n" {
        return Err(EventError::MissingTerminator);
    }
    let content = input.get(body_start..end).unwrap_or_default();
    Ok(Some((kind.event(content)?, end + 2)))
}

/// Decodes a complete body (one HTTP request or response) into its events. Blank lines at the
/// end are allowed; anything else left over is [`EventError::Truncated`].
pub fn decode_body<'a>(
    mut body: &'a [u8],
    limits: &EventLimits,
) -> Result<Vec<Event<'a>>, EventError> {
    let mut events = Vec::new();
    while !body.iter().all(|&b| b == b'\r' || b == b'\n') {
        let Some((event, used)) = decode_event(body, limits)? else {
            return Err(EventError::Truncated);
        };
        if events.len() == limits.max_events {
            return Err(EventError::TooManyEvents);
        }
        events.push(event);
        body = body.get(used..).unwrap_or_default();
    }
    Ok(events)
}

/// Appends `event` in wire form. Events without content are written as a bare name; `TEXT` and
/// `BINARY` always carry a size, even when empty.
pub fn write_event(out: &mut Vec<u8>, event: &Event<'_>) {
    match event {
        Event::Open | Event::Disconnect => bare(out, event.name()),
        Event::Text(text) => with_content(out, "TEXT", &[text.as_bytes()]),
        Event::Binary(data) => with_content(out, "BINARY", &[data]),
        Event::Ping(data) | Event::Pong(data) if data.is_empty() => bare(out, event.name()),
        Event::Ping(data) | Event::Pong(data) => with_content(out, event.name(), &[data]),
        Event::Close(None) => bare(out, "CLOSE"),
        Event::Close(Some((code, reason))) => {
            let code = code.as_u16().to_be_bytes();
            with_content(out, "CLOSE", &[&code, reason.as_bytes()]);
        }
    }
}

fn bare(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn with_content(out: &mut Vec<u8>, name: &str, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.reserve(len + name.len() + 20);
    out.extend_from_slice(format!("{name} {len:X}\r\n").as_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(b"\r\n");
}

/// Event names, before their content is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Open,
    Text,
    Binary,
    Ping,
    Pong,
    Close,
    Disconnect,
}

impl Kind {
    fn from_name(name: &[u8]) -> Option<Kind> {
        Some(match name {
            b"OPEN" => Kind::Open,
            b"TEXT" => Kind::Text,
            b"BINARY" => Kind::Binary,
            b"PING" => Kind::Ping,
            b"PONG" => Kind::Pong,
            b"CLOSE" => Kind::Close,
            b"DISCONNECT" => Kind::Disconnect,
            _ => return None,
        })
    }

    fn event(self, content: &[u8]) -> Result<Event<'_>, EventError> {
        Ok(match self {
            Kind::Open => Event::Open,
            Kind::Disconnect => Event::Disconnect,
            Kind::Text => {
                Event::Text(std::str::from_utf8(content).map_err(|_| EventError::InvalidUtf8)?)
            }
            Kind::Binary => Event::Binary(content),
            Kind::Ping => Event::Ping(content),
            Kind::Pong => Event::Pong(content),
            Kind::Close => Event::Close(parse_close(content)?),
        })
    }
}

/// A content size: one to sixteen hex digits, either case.
fn parse_hex(digits: &[u8]) -> Result<u64, EventError> {
    if digits.is_empty() || digits.len() > 16 {
        return Err(EventError::MalformedLine);
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        let d = (b as char).to_digit(16).ok_or(EventError::MalformedLine)?;
        Ok(acc << 4 | u64::from(d))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits(max_content: usize) -> EventLimits {
        EventLimits {
            max_content,
            max_events: 16,
        }
    }

    fn encode(events: &[Event<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in events {
            write_event(&mut out, e);
        }
        out
    }

    #[test]
    fn the_documented_examples_decode() {
        let l = limits(1 << 20);
        assert_eq!(
            decode_body(b"TEXT B\r\nhello world\r\n", &l),
            Ok(vec![Event::Text("hello world")])
        );
        assert_eq!(
            decode_body(
                // The protocol document gives this message's size as 1B; it is 28 bytes.
                b"TEXT 5\r\nworld\r\nTEXT 1C\r\nhere is another nice message\r\n",
                &l
            ),
            Ok(vec![
                Event::Text("world"),
                Event::Text("here is another nice message")
            ])
        );
        // Content on an event that needs none is legal and ignored; so is the blank line the
        // documentation's OPEN example shows.
        assert_eq!(decode_body(b"OPEN 0\r\n\r\n", &l), Ok(vec![Event::Open]));
        assert_eq!(decode_body(b"OPEN\r\n\r\n", &l), Ok(vec![Event::Open]));
        assert_eq!(decode_body(b"OPEN 3\r\nabc\r\n", &l), Ok(vec![Event::Open]));
        assert_eq!(decode_body(b"", &l), Ok(vec![]));
    }

    #[test]
    fn every_event_round_trips() {
        let events = [
            Event::Open,
            Event::Text(""),
            Event::Text("héllo\r\nworld"),
            Event::Binary(&[0, 255, b'\r', b'\n', 7]),
            Event::Ping(b""),
            Event::Ping(b"p"),
            Event::Pong(b""),
            Event::Pong(b"\r\n"),
            Event::Close(None),
            Event::Close(Some((CloseCode::Normal, ""))),
            Event::Close(Some((CloseCode::Other(4000), "bye now"))),
            Event::Disconnect,
        ];
        let wire = encode(&events);
        assert_eq!(decode_body(&wire, &limits(64)), Ok(events.to_vec()));
    }

    #[test]
    fn wire_form_matches_the_protocol() {
        assert_eq!(encode(&[Event::Open]), b"OPEN\r\n");
        assert_eq!(
            encode(&[Event::Text("here is another nice message")]),
            b"TEXT 1C\r\nhere is another nice message\r\n"
        );
        assert_eq!(encode(&[Event::Binary(b"")]), b"BINARY 0\r\n\r\n");
        assert_eq!(
            encode(&[Event::Close(Some((CloseCode::GoingAway, "x")))]),
            b"CLOSE 3\r\n\x03\xe9x\r\n"
        );
        assert_eq!(encode(&[Event::Disconnect]), b"DISCONNECT\r\n");
    }

    #[test]
    fn decodes_at_every_split() {
        let events = [
            Event::Open,
            Event::Text("hello"),
            Event::Close(Some((CloseCode::Normal, "done"))),
        ];
        let wire = encode(&events);
        let l = limits(64);
        for split in 0..=wire.len() {
            let mut buf = wire[..split].to_vec();
            let mut got = Vec::new();
            let mut used_total = 0;
            loop {
                match decode_event(&buf[used_total..], &l).unwrap() {
                    Some((e, used)) => {
                        got.push(format!("{e:?}"));
                        used_total += used;
                    }
                    None if buf.len() < wire.len() => buf.extend_from_slice(&wire[split..]),
                    None => break,
                }
            }
            let want: Vec<String> = events.iter().map(|e| format!("{e:?}")).collect();
            assert_eq!(got, want, "split {split}");
            assert_eq!(used_total, wire.len());
        }
    }

    #[test]
    fn short_input_needs_more() {
        let l = limits(64);
        for partial in [
            &b""[..],
            b"TE",
            b"TEXT 5",
            b"TEXT 5\r",
            b"TEXT 5\r\nhel",
            b"TEXT 5\r\nhello",
            b"TEXT 5\r\nhello\r",
            b"\r\n",
        ] {
            assert_eq!(decode_event(partial, &l), Ok(None), "{partial:?}");
        }
        assert_eq!(
            decode_body(b"TEXT 5\r\nhel", &l),
            Err(EventError::Truncated)
        );
    }

    #[test]
    fn size_limit_is_enforced_from_the_first_line() {
        let l = limits(4);
        assert_eq!(decode_event(b"TEXT 5\r\n", &l), Err(EventError::TooLarge));
        assert_eq!(
            decode_event(b"BINARY FFFFFFFFFFFFFFFF\r\n", &l),
            Err(EventError::TooLarge)
        );
        assert!(decode_event(b"TEXT 4\r\nabcd\r\n", &l).unwrap().is_some());
        let many = encode(&[Event::Open; 17]);
        assert_eq!(decode_body(&many, &l), Err(EventError::TooManyEvents));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let l = limits(64);
        let cases: [(&[u8], EventError); 13] = [
            (b"text 1\r\nx\r\n", EventError::UnknownEvent),
            (b"FOO\r\n", EventError::UnknownEvent),
            (b"OPEN\n", EventError::MalformedLine),
            (b"TEXT \r\n", EventError::MalformedLine),
            (b"TEXT 1 \r\nx\r\n", EventError::MalformedLine),
            (b"TEXT -1\r\n", EventError::MalformedLine),
            (b"TEXT 00000000000000001\r\n", EventError::MalformedLine),
            (b"TEXT 1\r\nxy\r\n", EventError::MissingTerminator),
            (b"TEXT 1\r\nx\n\r", EventError::MissingTerminator),
            (b"TEXT 1\r\n\xff\r\n", EventError::InvalidUtf8),
            (
                b"CLOSE 1\r\n\x03\r\n",
                EventError::InvalidClose(CloseError::Truncated),
            ),
            (
                b"CLOSE 2\r\n\x03\xed\r\n",
                EventError::InvalidClose(CloseError::InvalidCode(1005)),
            ),
            (&[b'A'; MAX_LINE], EventError::MalformedLine),
        ];
        for (input, want) in cases {
            assert_eq!(decode_event(input, &l), Err(want), "{input:?}");
        }
        // Too many blank lines count against the line bound too.
        assert_eq!(
            decode_event(&b"\r\n".repeat(MAX_LINE / 2), &l),
            Err(EventError::MalformedLine)
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet = b"OPENTXBIARYCLSDG 0123456789aF\r\n\xff\x03";
        let l = limits(16);
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let buf: Vec<u8> = (0..(x % 48) as usize)
                .map(|i| alphabet[((x >> (i % 59)) as usize ^ i) % alphabet.len()])
                .collect();
            if let Ok(Some((_, used))) = decode_event(&buf, &l) {
                assert!(used <= buf.len());
            }
            let _ = decode_body(&buf, &l);
        }
    }
}
