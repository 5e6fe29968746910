//! One connection of a soak client, without I/O: the subscribing request that resumes from the
//! client's last id, the answer head, then `clarion.v1` WebSocket envelopes or SSE events,
//! each read into what the soak checks (a message with its id and payload number, a gap
//! notice) and the Pongs the server's Pings need.
//!
//! A soak client ([`crate::soak_worker`]) makes many of these in turn, one per TCP connection:
//! the id and the checks live in the client, not here. Call order: [`request`] for the bytes
//! to send once connected, then [`SoakLife::handle_input`] for each read (plaintext) and
//! [`SoakLife::handle_end`] when the server ends the stream. An error leaves the life dead.

use std::fmt;
use std::net::SocketAddr;

use base64::Engine as _;
use serde::Deserialize;

use clarion_proto::http1::{parse_response_head, ResponseBody};

use crate::soak_deflate::{self, Compressed, Deflate, FrameError};
use crate::wire::{self, find, Step, MAX_HEAD, MAX_HEADERS};

/// How a soak connection subscribes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum SoakTransport {
    /// WebSocket with the `clarion.v1` subprotocol (envelopes carry ids), resuming with
    /// `since=` in the URL.
    Ws,
    /// Server-Sent Events, resuming with the `Last-Event-ID` header, as a browser does.
    Sse,
    /// A browser-like WebSocket: offers permessage-deflate as browsers do, then subscribes
    /// in-band with a compressed `{"type":"subscribe","topic":..,"since":..}`, as Clarion's own
    /// clients do; inflates what the server compresses.
    WsDeflate,
    /// HTTP/2 in clear text (h2c, prior knowledge), several SSE streams on one connection,
    /// each resuming with its own `last-event-id`.
    H2Sse,
    /// [`SoakTransport::WsDeflate`] over TLS 1.3.
    TlsWsDeflate,
    /// [`SoakTransport::H2Sse`] over TLS 1.3, `h2` chosen by ALPN as a browser's is.
    TlsH2Sse,
}

impl SoakTransport {
    /// Every kind, in the order reports list them.
    pub const ALL: [SoakTransport; 6] = [
        SoakTransport::Ws,
        SoakTransport::Sse,
        SoakTransport::WsDeflate,
        SoakTransport::H2Sse,
        SoakTransport::TlsWsDeflate,
        SoakTransport::TlsH2Sse,
    ];

    /// Its name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SoakTransport::Ws => "ws",
            SoakTransport::Sse => "sse",
            SoakTransport::WsDeflate => "ws-deflate",
            SoakTransport::H2Sse => "h2-sse",
            SoakTransport::TlsWsDeflate => "tls-ws-deflate",
            SoakTransport::TlsH2Sse => "tls-h2-sse",
        }
    }

    /// Over TLS.
    pub fn tls(self) -> bool {
        match self {
            SoakTransport::TlsWsDeflate | SoakTransport::TlsH2Sse => true,
            SoakTransport::Ws
            | SoakTransport::Sse
            | SoakTransport::WsDeflate
            | SoakTransport::H2Sse => false,
        }
    }

    /// HTTP/2 (a [`crate::soak_h2::SoakH2`] connection) rather than HTTP/1.1.
    pub fn h2(self) -> bool {
        match self {
            SoakTransport::H2Sse | SoakTransport::TlsH2Sse => true,
            SoakTransport::Ws
            | SoakTransport::Sse
            | SoakTransport::WsDeflate
            | SoakTransport::TlsWsDeflate => false,
        }
    }

    /// A WebSocket that negotiates permessage-deflate and subscribes in-band.
    fn deflate(self) -> bool {
        match self {
            SoakTransport::WsDeflate | SoakTransport::TlsWsDeflate => true,
            SoakTransport::Ws
            | SoakTransport::Sse
            | SoakTransport::H2Sse
            | SoakTransport::TlsH2Sse => false,
        }
    }

    /// A WebSocket (upgrade answered `101`).
    fn websocket(self) -> bool {
        match self {
            SoakTransport::Ws | SoakTransport::WsDeflate | SoakTransport::TlsWsDeflate => true,
            SoakTransport::Sse | SoakTransport::H2Sse | SoakTransport::TlsH2Sse => false,
        }
    }
}

/// What a connection read, for its client.
#[derive(Debug, PartialEq, Eq)]
pub enum Got<'a> {
    /// Subscribed: the WebSocket upgrade or the SSE answer head.
    Answered,
    /// A benchmark message.
    Message {
        /// Its id, to resume from.
        id: &'a str,
        /// The publisher's number for it within its topic.
        seq: u64,
        /// When it was published, Unix microseconds.
        published_us: u64,
    },
    /// A gap notice: the server could not replay some messages.
    Gap,
    /// Bytes to write back (a Pong).
    Reply(Vec<u8>),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SoakEnd {
    /// The answer head is not a valid HTTP/1.1 response head.
    BadAnswer(String),
    /// The subscribing request was answered with this status (503 while the broker is away).
    Refused(u16),
    /// An SSE answer that is not a close-delimited stream.
    NotCloseDelimited,
    /// A frame the server must not send.
    BadFrame(String),
    /// A WebSocket envelope or SSE message that is not what Clarion sends.
    BadMessage(String),
    /// An SSE `unavailable` event: the server cannot subscribe now (its broker is away).
    Unavailable,
    /// The server closed the connection (a Close frame, or the end of the stream once open).
    Closed,
    /// The server ended the stream before answering.
    ClosedDuringHandshake,
    /// HTTP/2: the server reset a stream with this code.
    H2Reset(u32),
    /// HTTP/2: the server ended a stream.
    H2StreamEnded,
    /// HTTP/2: the server sent GOAWAY with this code.
    H2GoAway(u32),
}

impl fmt::Display for SoakEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SoakEnd::BadAnswer(e) => write!(f, "bad answer: {e}"),
            SoakEnd::Refused(s) => write!(f, "refused: HTTP {s}"),
            SoakEnd::NotCloseDelimited => f.write_str("event stream is not close-delimited"),
            SoakEnd::BadFrame(e) => f.write_str(e),
            SoakEnd::BadMessage(e) => write!(f, "bad message: {e}"),
            SoakEnd::Unavailable => f.write_str("unavailable (SSE)"),
            SoakEnd::Closed => f.write_str("closed by server"),
            SoakEnd::ClosedDuringHandshake => f.write_str("closed during handshake"),
            SoakEnd::H2Reset(code) => write!(f, "h2 stream reset by server: code {code}"),
            SoakEnd::H2StreamEnded => f.write_str("h2 stream ended by server"),
            SoakEnd::H2GoAway(code) => write!(f, "h2 GOAWAY from server: code {code}"),
        }
    }
}

/// The subscribing request for `topic`, resuming after `since` when the client has an id.
/// `key`: random bytes for the WebSocket key.
pub fn request(
    transport: SoakTransport,
    target: SocketAddr,
    topic: &str,
    since: Option<&str>,
    key: [u8; 16],
) -> String {
    if transport.deflate() {
        let key = base64::engine::general_purpose::STANDARD.encode(key);
        return format!(
            "GET /ws HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\
             Sec-WebSocket-Protocol: clarion.v1\r\nSec-WebSocket-Extensions: {}\r\n\r\n",
            crate::soak_deflate::OFFER
        );
    }
    match transport {
        SoakTransport::Ws | SoakTransport::WsDeflate | SoakTransport::TlsWsDeflate => {
            let key = base64::engine::general_purpose::STANDARD.encode(key);
            let since = since.map(|s| format!("&since={s}")).unwrap_or_default();
            format!(
                "GET /ws?topic={topic}{since} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\
                 Sec-WebSocket-Protocol: clarion.v1\r\n\r\n"
            )
        }
        // HTTP/2 kinds send their requests as HEADERS frames (`crate::soak_h2`).
        SoakTransport::Sse | SoakTransport::H2Sse | SoakTransport::TlsH2Sse => {
            let since = since
                .map(|s| format!("Last-Event-ID: {s}\r\n"))
                .unwrap_or_default();
            format!(
                "GET /sse?topic={topic} HTTP/1.1\r\nHost: {target}\r\nAccept: text/event-stream\r\n{since}\r\n"
            )
        }
    }
}

/// Largest frame or event accepted: far above a soak message, low enough that a broken length
/// cannot make a connection buffer without bound.
const MAX_FRAME: u64 = 1 << 20;

/// One soak connection's protocol state.
#[derive(Debug)]
pub struct SoakLife {
    transport: SoakTransport,
    /// The answer head has arrived.
    open: bool,
    dead: bool,
    /// Bytes of a head, frame or event split across reads.
    buf: Vec<u8>,
    /// A deflate WebSocket: the subscribe to send once answered, then its compression state.
    subscribe: Option<(String, Option<String>)>,
    deflate: Option<Deflate>,
}

impl SoakLife {
    /// A connection whose request has been sent.
    pub fn new(transport: SoakTransport) -> SoakLife {
        SoakLife {
            transport,
            open: false,
            dead: false,
            buf: Vec::new(),
            subscribe: None,
            deflate: None,
        }
    }

    /// A deflate WebSocket's connection whose upgrade request has been sent: once answered it
    /// subscribes to `topic` in-band, resuming after `since`.
    pub fn in_band(transport: SoakTransport, topic: &str, since: Option<&str>) -> SoakLife {
        let mut life = SoakLife::new(transport);
        life.subscribe = Some((topic.to_string(), since.map(str::to_string)));
        life
    }

    /// Whether the answer head has arrived.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Bytes read from the server; what they mean goes to `got`, in order.
    pub fn handle_input(
        &mut self,
        input: &[u8],
        got: &mut impl FnMut(Got<'_>),
    ) -> Result<(), SoakEnd> {
        if self.dead {
            return Ok(());
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.extend_from_slice(input);
        let result = self.consume(&buf, got);
        match result {
            Ok(used) => {
                buf.drain(..used.min(buf.len()));
                if buf.len() as u64 > MAX_FRAME + MAX_HEAD as u64 {
                    return Err(self.dies(SoakEnd::BadMessage("message too long".into())));
                }
                self.buf = buf;
                Ok(())
            }
            Err(e) => Err(self.dies(e)),
        }
    }

    /// The server ended the stream: what it counts as.
    pub fn handle_end(&mut self) -> SoakEnd {
        let e = if self.open {
            SoakEnd::Closed
        } else {
            SoakEnd::ClosedDuringHandshake
        };
        self.dies(e)
    }

    fn dies(&mut self, e: SoakEnd) -> SoakEnd {
        self.dead = true;
        self.buf = Vec::new();
        e
    }

    fn consume(&mut self, input: &[u8], got: &mut impl FnMut(Got<'_>)) -> Result<usize, SoakEnd> {
        let mut at = 0;
        loop {
            let rest = input.get(at..).unwrap_or_default();
            let used = if !self.open {
                self.answer(rest, got)?
            } else if self.transport.websocket() {
                ws_frame(rest, self.deflate.as_mut(), got)?
            } else {
                sse_event(rest, got)?
            };
            match used {
                Some(n) => at += n,
                None => return Ok(at),
            }
        }
    }

    fn answer(
        &mut self,
        input: &[u8],
        got: &mut impl FnMut(Got<'_>),
    ) -> Result<Option<usize>, SoakEnd> {
        let Some(head) = parse_response_head(input, MAX_HEADERS, MAX_HEAD)
            .map_err(|e| SoakEnd::BadAnswer(e.to_string()))?
        else {
            return Ok(None);
        };
        let ok = if self.transport.websocket() { 101 } else { 200 };
        if head.status != ok {
            return Err(SoakEnd::Refused(head.status));
        }
        if !self.transport.websocket() && head.body("GET") != Ok(ResponseBody::UntilClose) {
            return Err(SoakEnd::NotCloseDelimited);
        }
        let mut reply = None;
        if let Some((topic, since)) = &self.subscribe {
            let extensions = head
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-extensions"))
                .map(|(_, v)| *v);
            let bits = soak_deflate::accepted(extensions).map_err(SoakEnd::BadAnswer)?;
            self.deflate = Some(Deflate::new());
            reply = Some(soak_deflate::subscribe_frame(
                topic,
                since.as_deref(),
                bits,
                mask(),
            ));
        }
        self.open = true;
        got(Got::Answered);
        if let Some(frame) = reply {
            got(Got::Reply(frame));
        }
        Ok(Some(head.head_len))
    }
}

/// A `clarion.v1` envelope: `{"type":"message","topic":..,"id":..,"data":..}`, a gap notice
/// `{"type":"gap",...}`, or a reply the soak does not need.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    data: Option<String>,
}

fn ws_frame(
    input: &[u8],
    deflate: Option<&mut Deflate>,
    got: &mut impl FnMut(Got<'_>),
) -> Result<Option<usize>, SoakEnd> {
    if let Some(d) = deflate {
        let read = d.read(input, MAX_FRAME).map_err(|e| match e {
            FrameError::Frame(why) => SoakEnd::BadFrame(why),
            FrameError::Message(why) => SoakEnd::BadMessage(why),
        })?;
        match read {
            Compressed::Wait => return Ok(None),
            Compressed::Text(text, total) => {
                envelope(&text, got)?;
                return Ok(Some(total));
            }
            Compressed::Plain => {}
        }
    }
    let Some((step, total)) = wire::step(input, MAX_FRAME).map_err(SoakEnd::BadFrame)? else {
        return Ok(None);
    };
    match step {
        Step::Text(payload) => envelope(payload, got)?,
        Step::Binary(_) => return Err(SoakEnd::BadMessage("a binary frame".into())),
        Step::Ping(payload) => got(Got::Reply(wire::pong(payload, mask()))),
        Step::Closed => return Err(SoakEnd::Closed),
        Step::Pong(_) | Step::Nothing => {}
    }
    Ok(Some(total))
}

/// A `clarion.v1` envelope: a message, a gap notice, or a reply the soak does not need.
fn envelope(payload: &[u8], got: &mut impl FnMut(Got<'_>)) -> Result<(), SoakEnd> {
    let e: Envelope =
        serde_json::from_slice(payload).map_err(|e| SoakEnd::BadMessage(e.to_string()))?;
    match (e.kind.as_str(), e.id, e.data) {
        ("message", Some(id), Some(data)) => message(&id, data.as_bytes(), got),
        ("message", ..) => Err(SoakEnd::BadMessage("a message without id or data".into())),
        ("gap", ..) => {
            got(Got::Gap);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// One SSE event: its `id:`, `event:` and `data:` lines up to the blank line.
pub(crate) fn sse_event(
    input: &[u8],
    got: &mut impl FnMut(Got<'_>),
) -> Result<Option<usize>, SoakEnd> {
    let Some(end) = find(input, b"\n\n") else {
        return Ok(None);
    };
    let (mut id, mut event, mut data) = (None, None, None);
    for line in input.get(..end).unwrap_or_default().split(|&b| b == b'\n') {
        if let Some(v) = line.strip_prefix(b"id: ") {
            id = Some(v);
        } else if let Some(v) = line.strip_prefix(b"event: ") {
            event = Some(v);
        } else if let Some(v) = line.strip_prefix(b"data: ") {
            data = Some(v);
        }
    }
    match (event, id, data) {
        (Some(b"gap"), ..) => got(Got::Gap),
        (Some(b"unavailable"), ..) => return Err(SoakEnd::Unavailable),
        (None, Some(id), Some(data)) => {
            let id = std::str::from_utf8(id).map_err(|e| SoakEnd::BadMessage(e.to_string()))?;
            message(id, data, got)?;
        }
        (None, None, Some(_)) => {
            return Err(SoakEnd::BadMessage("an SSE message without an id".into()))
        }
        // `retry:`, comments, keep-alives.
        _ => {}
    }
    Ok(Some(end + 2))
}

/// A benchmark payload, `SEQ PUBLISH_UNIX_MICROS ...`.
fn message(id: &str, data: &[u8], got: &mut impl FnMut(Got<'_>)) -> Result<(), SoakEnd> {
    let mut parts = data.splitn(3, |&b| b == b' ').map(|p| {
        std::str::from_utf8(p)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
    });
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(seq), Some(published_us)) => {
            got(Got::Message {
                id,
                seq,
                published_us,
            });
            Ok(())
        }
        _ => Err(SoakEnd::BadMessage(format!(
            "a payload without its number: {:?}",
            String::from_utf8_lossy(data.get(..40).unwrap_or(data))
        ))),
    }
}

fn mask() -> [u8; 4] {
    let r = wire::rand16();
    [r[0], r[1], r[2], r[3]]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::ws::frame::encode_frame;
    use clarion_proto::ws::OpCode;

    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Answered,
        Message(String, u64),
        Gap,
        Reply,
    }

    fn feed(life: &mut SoakLife, input: &[u8], seen: &mut Vec<Seen>) -> Result<(), SoakEnd> {
        life.handle_input(input, &mut |g| {
            seen.push(match g {
                Got::Answered => Seen::Answered,
                Got::Message { id, seq, .. } => Seen::Message(id.to_string(), seq),
                Got::Gap => Seen::Gap,
                Got::Reply(_) => Seen::Reply,
            })
        })
    }

    const UPGRADED: &[u8] =
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Protocol: clarion.v1\r\n\r\n";
    const SSE_HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";

    #[test]
    fn requests_resume_by_url_or_header() {
        let t: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let ws = request(SoakTransport::Ws, t, "s7", Some("ab-12"), [1; 16]);
        assert!(
            ws.starts_with("GET /ws?topic=s7&since=ab-12 HTTP/1.1\r\n"),
            "{ws}"
        );
        assert!(ws.contains("\r\nSec-WebSocket-Protocol: clarion.v1\r\n"));
        assert!(request(SoakTransport::Ws, t, "s7", None, [1; 16]).starts_with("GET /ws?topic=s7 "));
        let sse = request(SoakTransport::Sse, t, "s7", Some("ab-12"), [1; 16]);
        assert_eq!(
            sse,
            "GET /sse?topic=s7 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAccept: text/event-stream\r\nLast-Event-ID: ab-12\r\n\r\n"
        );
    }

    #[test]
    fn websocket_envelopes_and_gaps_split_at_every_byte() {
        let mut input = UPGRADED.to_vec();
        input.extend(encode_frame(
            OpCode::Text,
            br#"{"type":"gap","topic":"s","since":"a-1","reason":"epoch"}"#,
        ));
        input.extend(encode_frame(
            OpCode::Text,
            br#"{"type":"message","topic":"s","id":"b-4","data":"17 5 xx"}"#,
        ));
        input.extend(encode_frame(OpCode::Ping, b"p"));
        input.extend(encode_frame(
            OpCode::Text,
            br#"{"type":"subscribed","topic":"s"}"#,
        ));
        let want = [
            Seen::Answered,
            Seen::Gap,
            Seen::Message("b-4".into(), 17),
            Seen::Reply,
        ];
        for cut in 0..=input.len() {
            let mut life = SoakLife::new(SoakTransport::Ws);
            let mut seen = Vec::new();
            feed(&mut life, &input[..cut], &mut seen).unwrap();
            feed(&mut life, &input[cut..], &mut seen).unwrap();
            assert_eq!(seen, want, "cut at {cut}");
        }
    }

    #[test]
    fn a_deflate_websocket_subscribes_in_band_compressed_and_inflates_messages() {
        use clarion_proto::ws::deflate::{compress_message, inflate_message};
        use clarion_proto::ws::frame::encode_compressed_frame;
        let t: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let req = request(SoakTransport::WsDeflate, t, "s7", Some("ab-12"), [1; 16]);
        assert!(req.starts_with("GET /ws HTTP/1.1\r\n"), "{req}");
        assert!(req.contains(
            "\r\nSec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
        ));
        let head: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
            Sec-WebSocket-Protocol: clarion.v1\r\nSec-WebSocket-Extensions: permessage-deflate; \
            server_no_context_takeover; client_no_context_takeover\r\n\r\n";
        let mut input = head.to_vec();
        let msg = br#"{"type":"message","topic":"s7","id":"b-4","data":"17 5 xx"}"#;
        input.extend(encode_compressed_frame(
            OpCode::Text,
            &compress_message(msg, 15, 6),
        ));
        input.extend(encode_frame(
            OpCode::Text,
            br#"{"type":"gap","topic":"s7","since":"a-1","reason":"epoch"}"#,
        ));
        for cut in 0..=input.len() {
            let mut life = SoakLife::in_band(SoakTransport::WsDeflate, "s7", Some("ab-12"));
            let mut seen = Vec::new();
            let mut sent = Vec::new();
            for part in [&input[..cut], &input[cut..]] {
                life.handle_input(part, &mut |g| match g {
                    Got::Reply(b) => sent.push(b),
                    Got::Answered => seen.push(Seen::Answered),
                    Got::Message { id, seq, .. } => seen.push(Seen::Message(id.into(), seq)),
                    Got::Gap => seen.push(Seen::Gap),
                })
                .unwrap();
            }
            assert_eq!(
                seen,
                [Seen::Answered, Seen::Message("b-4".into(), 17), Seen::Gap],
                "cut at {cut}"
            );
            // The subscribe went out once, compressed (RSV1) and masked.
            assert_eq!(sent.len(), 1);
            let f = &sent[0];
            assert_eq!(f[0], 0x80 | 0x40 | 0x1);
            let len = usize::from(f[1] & 0x7f);
            let mask = [f[2], f[3], f[4], f[5]];
            let payload: Vec<u8> = f[6..6 + len]
                .iter()
                .zip(mask.iter().cycle())
                .map(|(b, m)| b ^ m)
                .collect();
            let json = inflate_message(&payload, 15, 4096).unwrap();
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&json).unwrap(),
                serde_json::json!({"type": "subscribe", "topic": "s7", "since": "ab-12"})
            );
        }
        // A server that declines deflate is counted, not followed.
        let mut life = SoakLife::in_band(SoakTransport::WsDeflate, "s7", None);
        assert_eq!(
            feed(&mut life, UPGRADED, &mut Vec::new()),
            Err(SoakEnd::BadAnswer(
                "the server declined permessage-deflate".into()
            ))
        );
    }

    #[test]
    fn sse_events_gaps_and_unavailable() {
        let mut life = SoakLife::new(SoakTransport::Sse);
        let mut seen = Vec::new();
        let input = [
            SSE_HEAD,
            b"retry: 3000\n\nevent: gap\ndata: {\"type\":\"gap\"}\n\nid: e-9\ndata: 3 5 x\n\n: keep\n\nid: e-1",
        ]
        .concat();
        feed(&mut life, &input, &mut seen).unwrap();
        assert_eq!(
            seen,
            [Seen::Answered, Seen::Gap, Seen::Message("e-9".into(), 3)]
        );
        feed(&mut life, b"0\ndata: 4 5 x\n\n", &mut seen).unwrap();
        assert_eq!(seen.last(), Some(&Seen::Message("e-10".into(), 4)));
        assert_eq!(life.handle_end(), SoakEnd::Closed);

        let mut life = SoakLife::new(SoakTransport::Sse);
        let input = [
            SSE_HEAD,
            b"retry: 5000\n\nevent: unavailable\ndata: {\"type\":\"error\"}\n\n",
        ]
        .concat();
        assert_eq!(
            feed(&mut life, &input, &mut Vec::new()),
            Err(SoakEnd::Unavailable)
        );
    }

    #[test]
    fn refusals_and_garbage_end_the_connection() {
        let mut life = SoakLife::new(SoakTransport::Ws);
        let e = feed(
            &mut life,
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
            &mut Vec::new(),
        );
        assert_eq!(e, Err(SoakEnd::Refused(503)));
        // A dead life ignores what comes next.
        assert_eq!(feed(&mut life, UPGRADED, &mut Vec::new()), Ok(()));
        let mut life = SoakLife::new(SoakTransport::Ws);
        let mut input = UPGRADED.to_vec();
        input.extend(encode_frame(
            OpCode::Text,
            br#"{"type":"message","id":"a-1","data":"nonumber"}"#,
        ));
        assert!(matches!(
            feed(&mut life, &input, &mut Vec::new()),
            Err(SoakEnd::BadMessage(_))
        ));
        let mut life = SoakLife::new(SoakTransport::Sse);
        assert_eq!(life.handle_end(), SoakEnd::ClosedDuringHandshake);
        // Random bytes: an error or nothing, never a panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..2_000 {
            for transport in [SoakTransport::Ws, SoakTransport::Sse] {
                let mut life = SoakLife::new(transport);
                let mut input = if round % 2 == 0 {
                    if transport == SoakTransport::Ws {
                        UPGRADED.to_vec()
                    } else {
                        SSE_HEAD.to_vec()
                    }
                } else {
                    Vec::new()
                };
                for _ in 0..(x % 200) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    input.push(x as u8);
                }
                let _ = feed(&mut life, &input, &mut Vec::new());
            }
        }
    }
}
