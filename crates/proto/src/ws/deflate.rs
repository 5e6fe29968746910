//! permessage-deflate (RFC 7692): negotiating the extension, and compressing and inflating
//! single messages.
//!
//! Clarion's model: the server compresses a published message **once**, without context
//! takeover, and sends the same bytes to every subscriber that negotiated the extension
//! (`server_no_context_takeover` is always in the answer in that mode). Clients are told not to
//! keep context either: every answer carries `client_no_context_takeover`, offered or not (RFC
//! 7692 7.1.1.2 lets a server add it), so no inflate window outlives a message and a connection
//! between messages holds no compression state that a hand-over would have to carry. In
//! `dedicated` mode the server's own compressor keeps context; it remembers the last window of
//! what it compressed ([`Compressor::window`]) so that another process can continue the stream
//! ([`Compressor::resume`]) with the client none the wiser. An [`Inflater`] that keeps context
//! (a client that agreed to keep it, with an older server) does the same.

use flate2::{Decompress, FlushDecompress, Status};
use zlib_rs::{DeflateConfig, DeflateFlush};

/// The empty stored block a sync flush ends with; RFC 7692 7.2.1 strips it from every message
/// and the receiver puts it back.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// What the server is willing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Let the server keep compression context across messages (dedicated mode). When false,
    /// every answer carries `server_no_context_takeover`.
    pub server_context_takeover: bool,
    /// The window the server asks clients to compress with, when they let it choose (8..=15).
    /// Smaller means less memory for the inflater of a client that keeps context.
    pub client_max_window_bits: u8,
}

/// The parameters both sides agreed on for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// The server compresses each message on its own.
    pub server_no_context_takeover: bool,
    /// The client compresses each message on its own: no inflate state between messages.
    pub client_no_context_takeover: bool,
    /// Largest LZ77 window the server may use, 9..=15.
    pub server_max_window_bits: u8,
    /// Largest window the client uses, 8..=15: what the inflater needs.
    pub client_max_window_bits: u8,
}

/// One `permessage-deflate` offer, parsed.
#[derive(Debug, Default, PartialEq, Eq)]
struct Offer {
    server_no_context_takeover: bool,
    client_no_context_takeover: bool,
    server_max_window_bits: Option<u8>,
    /// `Some(None)`: offered without a value (the server may choose).
    client_max_window_bits: Option<Option<u8>>,
}

/// Parses one element of `Sec-WebSocket-Extensions`. `None` when it is not permessage-deflate
/// or breaks RFC 7692 7.1 (unknown or repeated parameter, bad value): such offers are declined.
fn parse_offer(element: &str) -> Option<Offer> {
    let mut parts = element.split(';').map(str::trim);
    if !parts.next()?.eq_ignore_ascii_case("permessage-deflate") {
        return None;
    }
    let mut o = Offer::default();
    let mut seen = [false; 4];
    for p in parts {
        let (name, value) = match p.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (p, None),
        };
        let i = match name.to_ascii_lowercase().as_str() {
            "server_no_context_takeover" if value.is_none() => {
                o.server_no_context_takeover = true;
                0
            }
            "client_no_context_takeover" if value.is_none() => {
                o.client_no_context_takeover = true;
                1
            }
            "server_max_window_bits" => {
                o.server_max_window_bits = Some(window_bits(value?)?);
                2
            }
            "client_max_window_bits" => {
                o.client_max_window_bits = Some(match value {
                    None => None,
                    Some(v) => Some(window_bits(v)?),
                });
                3
            }
            _ => return None,
        };
        if std::mem::replace(seen.get_mut(i)?, true) {
            return None;
        }
    }
    Some(o)
}

/// `8`..=`15`, digits only (RFC 7692 7.1.2.1).
fn window_bits(v: &str) -> Option<u8> {
    if v.is_empty() || v.len() > 2 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().filter(|b| (8..=15).contains(b))
}

/// Picks the first acceptable offer among `offers` (elements of `Sec-WebSocket-Extensions`, in
/// the client's order) and returns what was agreed with the header value to answer. `None`:
/// no compression on this connection.
///
/// An offer limiting the server's window to 8 bits is declined: raw deflate encoders cannot
/// guarantee a 256-byte window, and RFC 7692 lets a server decline what it cannot honour.
pub fn negotiate(offers: &[&str], policy: &Policy) -> Option<(Agreed, String)> {
    for element in offers {
        let Some(offer) = parse_offer(element) else {
            continue;
        };
        let server_bits = offer.server_max_window_bits.unwrap_or(15);
        if server_bits < 9 {
            continue;
        }
        let mut answer = String::from("permessage-deflate");
        let server_no_context_takeover =
            offer.server_no_context_takeover || !policy.server_context_takeover;
        if server_no_context_takeover {
            answer.push_str("; server_no_context_takeover");
        }
        // Always, offered or not (RFC 7692 7.1.1.2): the client compresses each message on its
        // own, so nothing of a client's stream lives in the server between messages. The cost
        // is on client-to-server traffic only, where messages are small and rare (subscribe,
        // publish, acks): measured in docs/protocol.md.
        answer.push_str("; client_no_context_takeover");
        if let Some(bits) = offer.server_max_window_bits {
            answer.push_str(&format!("; server_max_window_bits={bits}"));
        }
        let client_bits = match offer.client_max_window_bits {
            // The client did not say it can limit its window: it uses 15.
            None => 15,
            Some(limit) => {
                let bits = policy
                    .client_max_window_bits
                    .clamp(8, 15)
                    .min(limit.unwrap_or(15));
                if bits < limit.unwrap_or(15) || limit.is_some() {
                    answer.push_str(&format!("; client_max_window_bits={bits}"));
                }
                bits
            }
        };
        let agreed = Agreed {
            server_no_context_takeover,
            client_no_context_takeover: true,
            server_max_window_bits: server_bits,
            client_max_window_bits: client_bits,
        };
        return Some((agreed, answer));
    }
    None
}

/// The largest LZ77 window (15 bits): the most history a deflate stream can refer back to, so
/// the most a carried window holds.
pub const MAX_WINDOW: usize = 1 << 15;

/// The last bytes a deflate stream has seen, at most its window: all that a later message can
/// refer back to, so all that another process needs to continue the stream (as a preset
/// dictionary).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Window {
    cap: usize,
    bytes: Vec<u8>,
}

impl Window {
    fn new(window_bits: u8) -> Window {
        Window {
            cap: 1 << window_bits.clamp(8, 15),
            bytes: Vec::new(),
        }
    }

    fn push(&mut self, data: &[u8]) {
        if data.len() >= self.cap {
            self.bytes.clear();
            self.bytes
                .extend_from_slice(data.get(data.len() - self.cap..).unwrap_or_default());
            return;
        }
        let over = (self.bytes.len() + data.len()).saturating_sub(self.cap);
        self.bytes.drain(..over.min(self.bytes.len()));
        self.bytes.extend_from_slice(data);
    }

    /// Takes a carried window, keeping its last `cap` bytes.
    fn set(&mut self, window: &[u8]) {
        self.bytes.clear();
        self.push(window);
    }
}

/// A raw-deflate compressor (RFC 7692 7.2.1): each message ends with a sync flush whose 4-byte
/// tail is removed. Keeps context between messages until [`Compressor::reset`].
pub struct Compressor {
    z: zlib_rs::Deflate,
    /// For a compressor that keeps context (a connection's own): the window its next message
    /// may refer to. zlib-rs does not hand its own window out without `unsafe`, so a copy is
    /// kept: `2^window_bits` bytes beside a compressor of about 200 KiB.
    window: Option<Window>,
    window_bits: u8,
}

impl Compressor {
    /// `level` 1..=9, an LZ77 window of `2^window_bits` bytes (9..=15), and zlib's `mem_level`
    /// (1..=9), which sizes the hash table and the block buffer: together they fix the memory,
    /// about `4 * 2^window_bits + 6 * 2^(mem_level + 6)` bytes plus a few KiB.
    pub fn new(level: u32, window_bits: u8, mem_level: u8) -> Compressor {
        let config = DeflateConfig {
            level: level.clamp(1, 9) as i32,
            window_bits: -i32::from(window_bits.clamp(9, 15)),
            mem_level: i32::from(mem_level.clamp(1, 9)),
            ..DeflateConfig::default()
        };
        Compressor {
            z: zlib_rs::Deflate::new_with_config(config),
            window: None,
            window_bits: window_bits.clamp(9, 15),
        }
    }

    /// A compressor that keeps context between messages and remembers its window, so that
    /// [`Compressor::window`] can hand the stream to another process.
    pub fn keeping_context(level: u32, window_bits: u8, mem_level: u8) -> Compressor {
        let mut c = Compressor::new(level, window_bits, mem_level);
        c.window = Some(Window::new(c.window_bits));
        c
    }

    /// Continues a stream another compressor began: `window` (what [`Compressor::window`] gave
    /// there, cut to this window) becomes the preset dictionary, so the next message may refer
    /// back into it exactly as the first compressor's would have, and the peer's inflater, which
    /// holds the same bytes, follows without noticing the change.
    pub fn resume(level: u32, window_bits: u8, mem_level: u8, window: &[u8]) -> Compressor {
        let mut c = Compressor::keeping_context(level, window_bits, mem_level);
        if let Some(w) = c.window.as_mut() {
            w.set(window);
            if !w.bytes.is_empty() && c.z.set_dictionary(&w.bytes).is_err() {
                // Not expected before the first byte: without the dictionary the stream still
                // decodes (it just does not refer back), so forget the window too.
                w.bytes.clear();
            }
        }
        c
    }

    /// The last bytes compressed (at most the window), for a compressor keeping context; empty
    /// for one that does not.
    pub fn window(&self) -> &[u8] {
        self.window.as_ref().map_or(&[], |w| &w.bytes)
    }

    /// Forgets all context (the next message is compressed on its own).
    pub fn reset(&mut self) {
        self.z.reset();
        if let Some(w) = self.window.as_mut() {
            w.bytes.clear();
        }
    }

    /// Compresses one message, continuing from the context of earlier ones.
    pub fn compress(&mut self, payload: &[u8]) -> Vec<u8> {
        let mut out: Vec<u8> = Vec::with_capacity(payload.len() / 2 + 64);
        let mut input = payload;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let len = out.len();
            out.resize(out.capacity(), 0);
            let before_in = self.z.total_in();
            let before_out = self.z.total_out();
            let res = self.z.compress(
                input,
                out.get_mut(len..).unwrap_or_default(),
                DeflateFlush::SyncFlush,
            );
            let used = (self.z.total_in() - before_in) as usize;
            let produced = (self.z.total_out() - before_out) as usize;
            out.truncate(len + produced);
            input = input.get(used..).unwrap_or_default();
            // A sync flush is complete when all input is taken and output space was left over.
            if res.is_err() || (input.is_empty() && out.capacity() > out.len()) {
                break;
            }
        }
        if out.ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        if let Some(w) = self.window.as_mut() {
            w.push(payload);
        }
        out
    }
}

/// Compresses one whole message on its own (no context carried in or out) with an LZ77 window
/// of `2^window_bits` bytes (9..=15), ready to be the payload of a frame with RSV1 set.
pub fn compress_message(payload: &[u8], window_bits: u8, level: u32) -> Vec<u8> {
    Compressor::new(level, window_bits, 8).compress(payload)
}

/// Why a compressed message could not be inflated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// The inflated message is larger than the limit (close 1009): a zip bomb stops here.
    TooBig,
    /// Not valid deflate data (close 1007).
    Corrupt,
}

/// Inflates client messages. Keep one per connection only when the client keeps context.
pub struct Inflater {
    d: Decompress,
    /// For an inflater keeping context: the client's window, to carry it to another process
    /// (flate2 does not hand out zlib's).
    window: Option<Window>,
}

impl Inflater {
    /// An inflater for a client window of `2^window_bits` bytes (8..=15).
    pub fn new(window_bits: u8) -> Inflater {
        // zlib's raw inflate takes 9..=15; a 9-bit window decodes 8-bit streams too.
        Inflater {
            d: Decompress::new_with_window_bits(false, window_bits.clamp(9, 15)),
            window: None,
        }
    }

    /// An inflater for a client that keeps context, remembering the window so that
    /// [`Inflater::window`] can hand the stream to another process.
    pub fn keeping_context(window_bits: u8) -> Inflater {
        let mut i = Inflater::new(window_bits);
        // zlib's deflate turns an 8-bit window into a 9-bit one, so a client that agreed to 8
        // may still refer back 512 bytes: keep what the inflater itself keeps.
        i.window = Some(Window::new(window_bits.clamp(9, 15)));
        i
    }

    /// Continues a client's stream that another inflater began, `window` being what
    /// [`Inflater::window`] gave there. `None` when zlib refuses the dictionary.
    pub fn resume(window_bits: u8, window: &[u8]) -> Option<Inflater> {
        let mut i = Inflater::keeping_context(window_bits);
        if let Some(w) = i.window.as_mut() {
            w.set(window);
            if !w.bytes.is_empty() {
                i.d.set_dictionary(&w.bytes).ok()?;
            }
        }
        Some(i)
    }

    /// The last bytes inflated (at most the window), for an inflater keeping context.
    pub fn window(&self) -> &[u8] {
        self.window.as_ref().map_or(&[], |w| &w.bytes)
    }

    /// Inflates one message (its payloads joined, without the tail) and appends the result to
    /// `out`, never letting `out` grow past `max` bytes.
    pub fn inflate(
        &mut self,
        payload: &[u8],
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), InflateError> {
        let start = out.len();
        let done = self.inflate_parts(payload, max, out);
        if let (Ok(()), Some(w)) = (done, self.window.as_mut()) {
            w.push(out.get(start..).unwrap_or_default());
        }
        done
    }

    fn inflate_parts(
        &mut self,
        payload: &[u8],
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), InflateError> {
        for part in [payload, &TAIL[..]] {
            let mut input = part;
            loop {
                if out.len() >= max.saturating_add(1) {
                    return Err(InflateError::TooBig);
                }
                let room = (max + 1 - out.len()).min(64 * 1024);
                out.reserve(room);
                let spare = out.capacity() - out.len();
                let before_in = self.d.total_in();
                let before_out = out.len();
                let status = self
                    .d
                    .decompress_vec(input, out, FlushDecompress::Sync)
                    .map_err(|_| InflateError::Corrupt)?;
                let used = (self.d.total_in() - before_in) as usize;
                input = input.get(used..).unwrap_or_default();
                if out.len() > max {
                    return Err(InflateError::TooBig);
                }
                let produced = out.len() - before_out;
                let filled = produced == spare;
                if matches!(status, Status::StreamEnd) {
                    // A final block: nothing after it belongs to this message's stream.
                    return Ok(());
                }
                if input.is_empty() && !filled {
                    break;
                }
                if used == 0 && produced == 0 {
                    return Err(InflateError::Corrupt);
                }
            }
        }
        Ok(())
    }
}

/// Inflates one message with a fresh inflater (for clients without context takeover).
pub fn inflate_message(
    payload: &[u8],
    window_bits: u8,
    max: usize,
) -> Result<Vec<u8>, InflateError> {
    let mut out = Vec::new();
    Inflater::new(window_bits).inflate(payload, max, &mut out)?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const SHARED: Policy = Policy {
        server_context_takeover: false,
        client_max_window_bits: 15,
    };

    fn agree(offer: &str, policy: &Policy) -> Option<(Agreed, String)> {
        negotiate(&[offer], policy)
    }

    #[test]
    fn browser_offer_gets_shared_mode() {
        // What Chrome and Firefox send.
        let (a, answer) = agree("permessage-deflate; client_max_window_bits", &SHARED).unwrap();
        assert_eq!(
            answer,
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
        );
        assert!(a.server_no_context_takeover && a.client_no_context_takeover);
        assert_eq!(
            (a.server_max_window_bits, a.client_max_window_bits),
            (15, 15)
        );
    }

    #[test]
    fn small_client_window_is_requested_when_allowed() {
        let p = Policy {
            client_max_window_bits: 10,
            ..SHARED
        };
        let (a, answer) = agree("permessage-deflate; client_max_window_bits", &p).unwrap();
        assert!(answer.ends_with("client_max_window_bits=10"));
        assert_eq!(a.client_max_window_bits, 10);
        // Without the parameter in the offer the server must not send it.
        let (a, answer) = agree("permessage-deflate", &p).unwrap();
        assert!(!answer.contains("client_max_window_bits"));
        assert_eq!(a.client_max_window_bits, 15);
        // Never more than the client offered.
        let (a, _) = agree("permessage-deflate; client_max_window_bits=9", &p).unwrap();
        assert_eq!(a.client_max_window_bits, 9);
    }

    #[test]
    fn all_four_parameters() {
        let (a, answer) = agree(
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
             server_max_window_bits=10; client_max_window_bits=12",
            &SHARED,
        )
        .unwrap();
        assert_eq!(
            answer,
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
             server_max_window_bits=10; client_max_window_bits=12"
        );
        assert_eq!(
            a,
            Agreed {
                server_no_context_takeover: true,
                client_no_context_takeover: true,
                server_max_window_bits: 10,
                client_max_window_bits: 12,
            }
        );
    }

    #[test]
    fn dedicated_policy_keeps_context_unless_the_client_forbids_it() {
        let p = Policy {
            server_context_takeover: true,
            ..SHARED
        };
        let (a, answer) = agree("permessage-deflate", &p).unwrap();
        assert!(!a.server_no_context_takeover);
        assert_eq!(answer, "permessage-deflate; client_no_context_takeover");
        let (a, _) = agree("permessage-deflate; server_no_context_takeover", &p).unwrap();
        assert!(a.server_no_context_takeover);
    }

    #[test]
    fn invalid_offers_are_declined_and_the_next_one_tried() {
        for bad in [
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; server_max_window_bits=07",
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; client_no_context_takeover=1",
            "permessage-deflate; unknown",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; server_max_window_bits=8",
            "x-webkit-deflate-frame",
        ] {
            assert_eq!(agree(bad, &SHARED), None, "{bad}");
        }
        let (a, _) = negotiate(
            &[
                "permessage-deflate; server_max_window_bits=8",
                "permessage-deflate; server_max_window_bits=\"9\"",
            ],
            &SHARED,
        )
        .unwrap();
        assert_eq!(a.server_max_window_bits, 9);
    }

    #[test]
    fn messages_round_trip_at_every_window() {
        let json = br#"{"symbol":"EURUSD","bid":1.08412,"ask":1.08415,"ts":1700000000}"#.repeat(40);
        for bits in 9..=15 {
            let c = compress_message(&json, bits, 6);
            assert!(c.len() < json.len() / 4, "{bits}: {}", c.len());
            assert!(!c.ends_with(&TAIL));
            assert_eq!(inflate_message(&c, bits, 1 << 20).unwrap(), json);
        }
        assert_eq!(
            inflate_message(&compress_message(b"", 15, 6), 15, 10).unwrap(),
            b""
        );
    }

    #[test]
    fn context_takeover_round_trips_across_messages() {
        let mut c = Compressor::new(6, 12, 4);
        let mut inf = Inflater::new(12);
        let msgs: Vec<Vec<u8>> = (0..20)
            .map(|i| format!(r#"{{"seq":{i},"price":"1.0841{i}"}}"#).into_bytes())
            .collect();
        let mut sizes = Vec::new();
        for m in &msgs {
            let z = c.compress(m);
            sizes.push(z.len());
            let mut out = Vec::new();
            inf.inflate(&z, 1 << 16, &mut out).unwrap();
            assert_eq!(&out, m);
        }
        assert!(
            sizes[19] < sizes[0],
            "later messages reuse context: {sizes:?}"
        );
    }

    #[test]
    fn every_answer_tells_the_client_to_keep_no_context() {
        let dedicated = Policy {
            server_context_takeover: true,
            ..SHARED
        };
        for offer in [
            "permessage-deflate",
            "permessage-deflate; client_max_window_bits",
            "permessage-deflate; client_no_context_takeover",
            "permessage-deflate; server_max_window_bits=10; client_max_window_bits=12",
        ] {
            for p in [&SHARED, &dedicated] {
                let (a, answer) = agree(offer, p).unwrap();
                assert!(a.client_no_context_takeover, "{offer}");
                assert_eq!(
                    answer.matches("client_no_context_takeover").count(),
                    1,
                    "{answer}"
                );
            }
        }
    }

    fn ticks(range: std::ops::Range<u32>) -> Vec<Vec<u8>> {
        range
            .map(|i| {
                format!(r#"{{"symbol":"EURUSD","seq":{i},"bid":"1.0841{i}","ask":"1.0842{i}"}}"#)
                    .into_bytes()
            })
            .collect()
    }

    #[test]
    fn a_resumed_compressor_continues_the_stream_its_peer_is_inflating() {
        for bits in [9, 12, 15] {
            let mut first = Compressor::keeping_context(6, bits, 8);
            // The client's inflater: one stream for the whole connection.
            let mut client = Inflater::new(15);
            for m in ticks(0..30) {
                let mut out = Vec::new();
                client
                    .inflate(&first.compress(&m), 1 << 16, &mut out)
                    .unwrap();
                assert_eq!(out, m);
            }
            assert!(first.window().len() <= 1 << bits);
            let mut second = Compressor::resume(6, bits, 8, first.window());
            let mut fresh = Compressor::new(6, bits, 8);
            for (n, m) in ticks(30..60).iter().enumerate() {
                let z = second.compress(m);
                if n == 0 {
                    // It refers back into the carried window, as the first compressor would.
                    assert!(z.len() < fresh.compress(m).len(), "{bits}: {}", z.len());
                }
                let mut out = Vec::new();
                client.inflate(&z, 1 << 16, &mut out).unwrap();
                assert_eq!(&out, m, "{bits}");
            }
        }
    }

    #[test]
    fn a_resumed_inflater_reads_a_stream_that_refers_back_before_it() {
        let mut client = Compressor::new(6, 12, 8);
        let mut first = Inflater::keeping_context(12);
        for m in ticks(0..30) {
            let mut out = Vec::new();
            first
                .inflate(&client.compress(&m), 1 << 16, &mut out)
                .unwrap();
        }
        let next = ticks(30..31).remove(0);
        let z = client.compress(&next);
        // Without the window the message does not decode to itself.
        let mut out = Vec::new();
        let alone = Inflater::new(12).inflate(&z, 1 << 16, &mut out);
        assert!(alone.is_err() || out != next);
        let mut second = Inflater::resume(12, first.window()).unwrap();
        let mut out = Vec::new();
        second.inflate(&z, 1 << 16, &mut out).unwrap();
        assert_eq!(out, next);
    }

    #[test]
    fn a_window_keeps_the_last_bytes_up_to_its_size() {
        let mut w = Window::new(9);
        w.push(b"abc");
        w.push(b"de");
        assert_eq!(w.bytes, b"abcde");
        w.push(&[7u8; 600]);
        assert_eq!((w.bytes.len(), w.bytes[0]), (512, 7));
        w.push(b"xyz");
        assert_eq!(w.bytes.len(), 512);
        assert!(w.bytes.ends_with(&[7, b'x', b'y', b'z']));
        w.set(&[1u8; 2000]);
        assert_eq!(w.bytes, vec![1u8; 512]);
        let mut c = Compressor::keeping_context(6, 10, 8);
        for m in ticks(0..100) {
            c.compress(&m);
        }
        assert_eq!(c.window().len(), 1024);
        assert!(Compressor::new(6, 10, 8).window().is_empty());
    }

    /// What `client_no_context_takeover` costs a client: the compressed size of the messages
    /// a subscriber client sends (an in-band subscribe, a publish, an ack), each compressed on
    /// its own against compressed with the context of the ones before. Printed with
    /// `cargo test -p clarion-proto client_context_cost -- --nocapture` (docs/protocol.md).
    #[test]
    fn client_context_cost_on_small_messages() {
        let msgs: Vec<Vec<u8>> = [
            r#"{"type":"subscribe","topic":"prices"}"#,
            r#"{"type":"subscribe","topic":"chat/room-42","since":"k3x9-41"}"#,
            r#"{"type":"publish","topic":"chat/room-42","data":"hello there"}"#,
            r#"{"type":"subscribe","topic":"news","presence":true}"#,
            r#"{"type":"unsubscribe","topic":"news"}"#,
            r#"{"type":"publish","topic":"chat/room-42","data":"see you at 5"}"#,
        ]
        .iter()
        .map(|m| m.as_bytes().to_vec())
        .collect();
        let raw: usize = msgs.iter().map(Vec::len).sum();
        let alone: usize = msgs.iter().map(|m| compress_message(m, 15, 6).len()).sum();
        let mut c = Compressor::new(6, 15, 8);
        let kept: usize = msgs.iter().map(|m| c.compress(m).len()).sum();
        println!(
            "client messages: {} raw bytes, {alone} compressed each on its own, {kept} with \
             context ({} messages)",
            raw,
            msgs.len()
        );
        // Small messages barely compress on their own; context saves bytes, not round trips.
        assert!(kept < alone && alone <= raw + 6 * msgs.len());
    }

    #[test]
    fn inflate_stops_bombs_and_garbage() {
        let bomb = compress_message(&vec![0u8; 10 << 20], 15, 9);
        assert!(bomb.len() < 20_000);
        assert_eq!(
            inflate_message(&bomb, 15, 1 << 20),
            Err(InflateError::TooBig)
        );
        let exact = compress_message(&[7u8; 1000], 15, 6);
        assert!(inflate_message(&exact, 15, 1000).is_ok());
        assert_eq!(inflate_message(&exact, 15, 999), Err(InflateError::TooBig));
        assert_eq!(
            inflate_message(&[0xff, 0xff, 0xff, 0xff], 15, 1000),
            Err(InflateError::Corrupt)
        );
    }
}
