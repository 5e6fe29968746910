//! permessage-deflate for the load generator's browser-like WebSockets (the soak's and the
//! streams scenario's), without I/O: the offer a browser makes, the check of the server's
//! answer, the compressed in-band `subscribe` that Clarion's own clients send (the message
//! that, before issue 46, kept a connection from moving), and the reading and inflating of the
//! server's compressed frames (`clarion_proto::ws::deflate`, the server's inflater).

use clarion_proto::ws::deflate::{Compressor, Inflater};
use clarion_proto::ws::frame::{encode_header, parse_header_with, OpCode};

/// What Chromium and Firefox offer.
pub(crate) const OFFER: &str = "permessage-deflate; client_max_window_bits";

/// The window this side inflates with: the largest, which decodes any smaller one.
const SERVER_WINDOW_BITS: u8 = 15;

/// A deflate WebSocket's compression state: the inflater lives as long as the connection (the
/// server may keep its context between messages).
pub(crate) struct Deflate {
    inflater: Inflater,
}

impl std::fmt::Debug for Deflate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deflate")
    }
}

impl Deflate {
    /// The state of a connection whose answer agreed to permessage-deflate.
    pub(crate) fn new() -> Deflate {
        Deflate {
            inflater: Inflater::new(SERVER_WINDOW_BITS),
        }
    }

    /// The compressed frame at the start of `input`, if that is what it is (frames of at most
    /// `max` bytes).
    pub(crate) fn read(&mut self, input: &[u8], max: u64) -> Result<Compressed, FrameError> {
        let Some(h) = parse_header_with(input, false, true, max)
            .map_err(|e| FrameError::Frame(format!("bad frame: {e}")))?
        else {
            return Ok(Compressed::Wait);
        };
        if h.rsv & 0b100 == 0 {
            return Ok(Compressed::Plain);
        }
        if !h.fin || h.opcode != OpCode::Text || h.mask.is_some() {
            return Err(FrameError::Frame(
                "a compressed frame that is not one unmasked text message".into(),
            ));
        }
        let total = usize::try_from(h.payload_len)
            .ok()
            .and_then(|n| n.checked_add(h.header_len))
            .ok_or_else(|| FrameError::Frame("bad frame: too long".into()))?;
        let Some(payload) = input.get(h.header_len..total) else {
            return Ok(Compressed::Wait);
        };
        let text = self
            .inflate(payload, usize::try_from(max).unwrap_or(usize::MAX))
            .map_err(FrameError::Message)?;
        Ok(Compressed::Text(text, total))
    }

    /// Inflates one compressed message (its payload, without the tail), at most `max` bytes.
    pub(crate) fn inflate(&mut self, payload: &[u8], max: usize) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        self.inflater
            .inflate(payload, max, &mut out)
            .map_err(|e| format!("inflate: {e:?}"))?;
        Ok(out)
    }
}

/// What starts a deflate WebSocket's input ([`Deflate::read`]).
pub(crate) enum Compressed {
    /// An incomplete frame: read more.
    Wait,
    /// A frame sent uncompressed: read it as usual.
    Plain,
    /// A compressed message, inflated, and the bytes its frame took.
    Text(Vec<u8>, usize),
}

/// Why a compressed frame could not be read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// A frame the server must not send.
    Frame(String),
    /// Its message does not inflate.
    Message(String),
}

impl From<FrameError> for String {
    fn from(e: FrameError) -> String {
        match e {
            FrameError::Frame(why) | FrameError::Message(why) => why,
        }
    }
}

/// The client window the server's `Sec-WebSocket-Extensions` answer lets this side use;
/// an error when the server did not agree to permessage-deflate.
pub(crate) fn accepted(answer: Option<&[u8]>) -> Result<u8, String> {
    let text = answer
        .and_then(|v| std::str::from_utf8(v).ok())
        .ok_or("the server declined permessage-deflate")?;
    let mut parts = text.split(';').map(str::trim);
    if !parts
        .next()
        .is_some_and(|p| p.eq_ignore_ascii_case("permessage-deflate"))
    {
        return Err(format!("unexpected extension answer {text:?}"));
    }
    let mut bits = 15;
    for p in parts {
        if let Some(v) = p.strip_prefix("client_max_window_bits=") {
            bits = v
                .trim_matches('"')
                .parse::<u8>()
                .ok()
                .filter(|b| (8..=15).contains(b))
                .ok_or_else(|| format!("bad client_max_window_bits in {text:?}"))?;
        }
    }
    Ok(bits)
}

/// The in-band `clarion.v1` subscribe for `topic`, resuming after `since`, compressed with a
/// window of `2^client_bits` bytes and sent as one masked text frame with RSV1 set.
pub(crate) fn subscribe_frame(
    topic: &str,
    since: Option<&str>,
    client_bits: u8,
    mask: [u8; 4],
) -> Vec<u8> {
    let json = match since {
        Some(id) => serde_json::json!({"type": "subscribe", "topic": topic, "since": id}),
        None => serde_json::json!({"type": "subscribe", "topic": topic}),
    }
    .to_string();
    // One message per connection: context or not makes no difference to its bytes.
    let compressed = Compressor::new(6, client_bits.max(9), 8).compress(json.as_bytes());
    let mut head = [0u8; 10];
    let n = encode_header(&mut head, true, true, OpCode::Text, compressed.len() as u64);
    let mut out = head.get(..n).unwrap_or_default().to_vec();
    if let Some(b1) = out.get_mut(1) {
        *b1 |= 0x80;
    }
    out.extend_from_slice(&mask);
    out.extend(
        compressed
            .iter()
            .zip(mask.iter().cycle())
            .map(|(b, m)| b ^ m),
    );
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use clarion_proto::ws::deflate::{compress_message, inflate_message};
    use clarion_proto::ws::frame::parse_header_with;

    #[test]
    fn the_answer_must_agree_to_deflate_and_may_narrow_the_client_window() {
        assert_eq!(
            accepted(Some(
                b"permessage-deflate; server_no_context_takeover; client_no_context_takeover"
            )),
            Ok(15)
        );
        assert_eq!(
            accepted(Some(b"permessage-deflate; client_max_window_bits=10")),
            Ok(10)
        );
        assert!(accepted(None).is_err());
        assert!(accepted(Some(b"x-webkit-deflate-frame")).is_err());
        assert!(accepted(Some(b"permessage-deflate; client_max_window_bits=99")).is_err());
    }

    #[test]
    fn the_subscribe_is_a_masked_compressed_text_frame_the_server_inflates() {
        let frame = subscribe_frame("bench7", Some("ab-12"), 15, [1, 2, 3, 4]);
        let h = parse_header_with(&frame, true, true, 1 << 20)
            .unwrap()
            .unwrap();
        assert_eq!((h.fin, h.rsv, h.opcode), (true, 0b100, OpCode::Text));
        let mask = h.mask.unwrap();
        let payload: Vec<u8> = frame[h.header_len..]
            .iter()
            .zip(mask.iter().cycle())
            .map(|(b, m)| b ^ m)
            .collect();
        let json = inflate_message(&payload, 15, 4096).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&json).unwrap(),
            serde_json::json!({"type": "subscribe", "topic": "bench7", "since": "ab-12"})
        );
    }

    #[test]
    fn one_inflater_reads_messages_with_or_without_server_context() {
        let m = |n: u32| format!("{{\"type\":\"message\",\"id\":\"a-{n}\",\"data\":\"{n} 5 xx\"}}");
        // Dedicated mode: the server's compressor keeps context.
        let mut d = Deflate::new();
        let mut c = Compressor::new(6, 15, 8);
        for n in 0..5 {
            assert_eq!(
                d.inflate(&c.compress(m(n).as_bytes()), 1 << 20).unwrap(),
                m(n).as_bytes()
            );
        }
        // Shared mode: each message compressed on its own.
        let mut d = Deflate::new();
        for n in 0..5 {
            let alone = compress_message(m(n).as_bytes(), 15, 6);
            assert_eq!(d.inflate(&alone, 1 << 20).unwrap(), m(n).as_bytes());
        }
        assert!(d.inflate(&[0xff, 0xff, 0xff], 1 << 20).is_err());
    }
}
