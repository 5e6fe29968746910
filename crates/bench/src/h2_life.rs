//! The life of one HTTP/2 load connection, without I/O: many SSE streams, or many WebSockets
//! (RFC 8441: an extended CONNECT per stream, the WebSocket frames in DATA frames), on one
//! connection, each checked as one HTTP/1.1 connection is in [`crate::conn_life`] (sequence
//! numbers, gaps, duplicates, latency per message).
//!
//! Over TLS the connection is the one ALPN chose `h2` for ([`crate::tls_client`] refuses any
//! other); in clear text it starts with the connection preface (prior knowledge, RFC 9113
//! §3.3). Frames are read and written with `clarion_proto::h2`, the codec the server uses.
//!
//! Call order, as for [`crate::conn_life::Life`]: [`H2Life::handle_connected`] once the socket
//! is connected (the preface, this side's SETTINGS and a connection WINDOW_UPDATE go out),
//! then [`H2Life::handle_input`] for each read (plaintext, after any TLS); the subscribing
//! requests go out as soon as the server's SETTINGS frame has said how many streams it allows;
//! [`H2Life::handle_end`] when the server ends the connection, [`H2Life::fail`] when something
//! outside the protocol does. An error from any of them leaves the life dead. A stream that
//! ends (a refusal, a reset, its end) is told to the host and the connection goes on.
//!
//! Flow control: this side advertises the largest window for every stream and the connection,
//! and gives back what it consumed every [`TOP_UP`] bytes, so the server never waits for
//! window on the bench's account.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use clarion_proto::h2::frame::{
    self, Frame, FrameError, Setting, DEFAULT_MAX_FRAME, HEADER_LEN, MAX_WINDOW, PREFACE,
};
use clarion_proto::h2::hpack::{Decoder, Encoder, HpackError, DEFAULT_TABLE_SIZE};

use crate::check::SeqChecker;
use crate::conn_life::{report, seq_and_time, Event, Host, Phase};
use crate::wire::{self, find, Step};

/// What every HTTP/2 connection of a worker shares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct H2Setup {
    /// The server (`:authority`).
    pub(crate) target: SocketAddr,
    /// Over TLS (`:scheme https`) or clear text (`http`).
    pub(crate) tls: bool,
    /// Each stream a WebSocket (`/ws`, RFC 8441) rather than an SSE stream (`/sse`).
    pub(crate) websocket: bool,
}

/// What an HTTP/2 life asks of its worker, beyond what any life does.
pub(crate) trait H2Host: Host {
    /// The query of the request subscribing to `topic` (the worker's number for it):
    /// `topic=NAME` and what else the worker adds.
    fn query(&mut self, topic: u32) -> String;
    /// Stream `stream` (its index on the connection) ended for `why`; the others go on.
    fn stream_ended(&mut self, stream: usize, why: StreamError);
}

/// Why a stream ended while its connection goes on. Its `Display` is the kind counted in the
/// bench's errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamError {
    /// The server answered the subscribing request with this status.
    Refused(u16),
    /// A `200` whose content type is not `text/event-stream`.
    NotEventStream,
    /// The server reset the stream with this error code.
    Reset(u32),
    /// The server ended the stream (END_STREAM).
    Ended,
    /// The server allows fewer concurrent streams than this connection was given.
    OverLimit(u32),
    /// WebSockets were asked for, but the server's SETTINGS do not enable the extended
    /// CONNECT of RFC 8441.
    NoConnectProtocol,
    /// A WebSocket stream's frame the server must not send (masked, reserved, too long).
    BadWsFrame,
    /// The server closed a WebSocket stream (a Close frame).
    WsClosed,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Refused(status) => write!(f, "h2 stream refused: HTTP {status}"),
            StreamError::NotEventStream => f.write_str("h2 stream is not text/event-stream"),
            StreamError::Reset(code) => write!(f, "h2 stream reset by server: code {code}"),
            StreamError::Ended => f.write_str("h2 stream ended by server"),
            StreamError::OverLimit(max) => {
                write!(
                    f,
                    "h2 stream over the server's MAX_CONCURRENT_STREAMS {max}"
                )
            }
            StreamError::NoConnectProtocol => {
                f.write_str("h2 server does not enable extended CONNECT (RFC 8441)")
            }
            StreamError::BadWsFrame => f.write_str("h2 WebSocket stream: bad frame from server"),
            StreamError::WsClosed => f.write_str("h2 WebSocket stream closed by server"),
        }
    }
}

/// Why an HTTP/2 connection's life ended. Its `Display` is the kind counted in the bench's
/// errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum H2Error {
    /// The server answered the preface in HTTP/1.1: it does not speak h2c on this port.
    Http1Answer,
    /// The server's first frame was not SETTINGS (RFC 9113 §3.4).
    NoServerSettings,
    /// A frame that breaks RFC 9113's rules.
    Frame(FrameError),
    /// A header block that cannot be decoded.
    Hpack(HpackError),
    /// Something the server must not do on this connection.
    Protocol(&'static str),
    /// The server sent GOAWAY with this error code.
    GoAway(u32),
    /// The server closed the connection once it was open.
    ClosedByServer,
    /// The server closed the connection before its SETTINGS.
    ClosedDuringHandshake,
    /// Writing the preface, a request or a frame of flow control failed.
    Send(io::ErrorKind),
}

impl fmt::Display for H2Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            H2Error::Http1Answer => {
                f.write_str("h2: the server answered in HTTP/1.1 (no h2c prior knowledge)")
            }
            H2Error::NoServerSettings => {
                f.write_str("h2: the server's first frame is not SETTINGS")
            }
            H2Error::Frame(e) => write!(f, "h2: bad frame: {e}"),
            H2Error::Hpack(e) => write!(f, "h2: {e}"),
            H2Error::Protocol(why) => write!(f, "h2: {why}"),
            H2Error::GoAway(code) => write!(f, "h2: GOAWAY from server, code {code}"),
            H2Error::ClosedByServer => f.write_str("closed by server"),
            H2Error::ClosedDuringHandshake => f.write_str("closed during handshake"),
            H2Error::Send(kind) => write!(f, "send h2: {kind}"),
        }
    }
}

impl std::error::Error for H2Error {}

/// Consumed bytes given back to the server's window (stream or connection) once this many have
/// been read: far below the 2^31-1 advertised, so the server never waits, and rare enough to
/// cost nothing (one 13-byte frame per MiB).
pub(crate) const TOP_UP: u32 = 1 << 20;

/// Largest header block accepted (HEADERS and its CONTINUATIONs) and largest decoded header
/// list: a response head is a few dozen bytes; a broken server cannot make a connection
/// buffer more.
const MAX_BLOCK: usize = 64 * 1024;

/// Largest SSE event buffered across DATA frames: far above any benchmark message.
const MAX_EVENT: usize = 16 * 1024 * 1024;

/// Where a stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamPhase {
    /// Not requested yet: the server's SETTINGS have not arrived.
    Waiting,
    /// The request is sent; the answer's HEADERS are awaited.
    Requested,
    /// Answered `200` (`text/event-stream` for SSE): events or WebSocket frames flow.
    Open,
    /// Refused, reset or ended.
    Ended,
}

/// One subscriber: a stream of the connection.
#[derive(Debug)]
struct Stream {
    check: SeqChecker,
    /// Bytes of an event or a WebSocket frame split across DATA frames (empty, without
    /// allocation, otherwise).
    partial: Vec<u8>,
    /// The worker's number for the topic it follows.
    topic: u32,
    /// Bytes received since the last WINDOW_UPDATE for this stream.
    consumed: u32,
    phase: StreamPhase,
}

/// A header block split over CONTINUATION frames.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    bytes: Vec<u8>,
}

/// One HTTP/2 load connection's protocol state: a stream per subscriber.
#[derive(Debug)]
pub(crate) struct H2Life {
    /// Stream `i` has id `2i + 1`.
    streams: Vec<Stream>,
    /// Bytes of a frame split across reads: empty (no allocation) otherwise.
    buf: Vec<u8>,
    decoder: Decoder,
    block: Option<Block>,
    /// Bytes received since the last connection WINDOW_UPDATE.
    consumed: u32,
    phase: Phase,
    /// The server's SETTINGS have arrived (and the requests gone out).
    settled: bool,
}

impl H2Life {
    /// A connection about to connect, with one stream for each of `topics`.
    pub(crate) fn new(topics: impl IntoIterator<Item = u32>) -> Self {
        H2Life {
            streams: topics
                .into_iter()
                .map(|topic| Stream {
                    check: SeqChecker::default(),
                    partial: Vec::new(),
                    topic,
                    consumed: 0,
                    phase: StreamPhase::Waiting,
                })
                .collect(),
            buf: Vec::new(),
            decoder: Decoder::new(DEFAULT_TABLE_SIZE),
            block: None,
            consumed: 0,
            phase: Phase::Connecting,
            settled: false,
        }
    }

    /// Where the connection is: `Head` until the server's SETTINGS, then `Open`.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// Connecting, or some stream still waits for its answer.
    pub(crate) fn handshaking(&self) -> bool {
        match self.phase {
            Phase::Connecting | Phase::Head => true,
            Phase::Dead => false,
            Phase::Open => self
                .streams
                .iter()
                .any(|s| s.phase == StreamPhase::Requested),
        }
    }

    /// Each stream: its topic, where it is, and its checks.
    pub(crate) fn streams(&self) -> impl Iterator<Item = (u32, StreamPhase, &SeqChecker)> + '_ {
        self.streams.iter().map(|s| (s.topic, s.phase, &s.check))
    }

    /// Streams answered and not ended, on a live connection.
    pub(crate) fn open_streams(&self) -> usize {
        if self.phase == Phase::Dead {
            return 0;
        }
        self.streams
            .iter()
            .filter(|s| s.phase == StreamPhase::Open)
            .count()
    }

    /// The socket is connected: the preface, this side's SETTINGS (no push, the largest
    /// stream window) and the connection window raised to the largest.
    pub(crate) fn handle_connected(&mut self, host: &mut impl H2Host) -> Result<(), H2Error> {
        if self.phase != Phase::Connecting {
            return Ok(());
        }
        let mut out = PREFACE.to_vec();
        frame::write_settings(
            &mut out,
            &[
                Setting::EnablePush(0),
                Setting::InitialWindowSize(MAX_WINDOW),
            ],
        );
        frame::write_window_update(&mut out, 0, MAX_WINDOW - 65_535);
        self.phase = Phase::Head;
        host.transmit(&out)
            .map_err(|kind| self.dies(H2Error::Send(kind)))
    }

    /// Bytes read from the server (plaintext).
    pub(crate) fn handle_input(
        &mut self,
        setup: &H2Setup,
        input: &[u8],
        host: &mut impl H2Host,
    ) -> Result<(), H2Error> {
        if self.phase == Phase::Dead {
            return Ok(());
        }
        let mut out = Vec::new();
        let result = if self.buf.is_empty() {
            self.consume(setup, input, host, &mut out).map(|used| {
                if let Some(tail) = input.get(used..).filter(|t| !t.is_empty()) {
                    self.buf = tail.to_vec();
                }
            })
        } else {
            let mut buf = std::mem::take(&mut self.buf);
            buf.extend_from_slice(input);
            self.consume(setup, &buf, host, &mut out).map(|used| {
                buf.drain(..used.min(buf.len()));
                if !buf.is_empty() {
                    self.buf = buf;
                }
            })
        };
        // What the frames before an error asked for is still written (a SETTINGS ack, say):
        // harmless, and the connection is closed anyway.
        let sent = if out.is_empty() {
            Ok(())
        } else {
            host.transmit(&out).map_err(H2Error::Send)
        };
        result.and(sent).map_err(|e| self.dies(e))
    }

    /// The server ended the connection: the error it counts as.
    pub(crate) fn handle_end(&mut self) -> H2Error {
        self.dies(if self.settled {
            H2Error::ClosedByServer
        } else {
            H2Error::ClosedDuringHandshake
        })
    }

    /// Something outside the protocol (connecting, reading, TLS) ended the connection.
    pub(crate) fn fail(&mut self) {
        self.phase = Phase::Dead;
        self.buf = Vec::new();
        self.block = None;
        for s in &mut self.streams {
            s.partial = Vec::new();
        }
    }

    fn dies(&mut self, e: H2Error) -> H2Error {
        self.fail();
        e
    }

    /// Handles every complete frame at the start of `input`; returns the bytes used.
    fn consume(
        &mut self,
        setup: &H2Setup,
        input: &[u8],
        host: &mut impl H2Host,
        out: &mut Vec<u8>,
    ) -> Result<usize, H2Error> {
        let mut at = 0;
        loop {
            let rest = input.get(at..).unwrap_or_default();
            if !self.settled && rest.starts_with(b"HTTP/") {
                return Err(H2Error::Http1Answer);
            }
            // proto's reader refuses PUSH_PROMISE as a server would; say it from this side.
            if rest.len() >= HEADER_LEN && rest.get(3) == Some(&0x5) {
                return Err(H2Error::Protocol("PUSH_PROMISE, though push is disabled"));
            }
            let Some((f, used)) = frame::parse(rest, DEFAULT_MAX_FRAME).map_err(H2Error::Frame)?
            else {
                return Ok(at);
            };
            self.frame(setup, f, host, out)?;
            at += used;
            if self.phase == Phase::Dead {
                return Ok(at);
            }
        }
    }

    fn frame(
        &mut self,
        setup: &H2Setup,
        f: Frame<'_>,
        host: &mut impl H2Host,
        out: &mut Vec<u8>,
    ) -> Result<(), H2Error> {
        if !self.settled && !matches!(f, Frame::Settings { ack: false, .. }) {
            return Err(H2Error::NoServerSettings);
        }
        if let Some(b) = &self.block {
            // Nothing may come between a HEADERS and the CONTINUATION that ends it (§6.10).
            if !matches!(f, Frame::Continuation { stream, .. } if stream == b.stream) {
                return Err(H2Error::Protocol("frame inside a header block"));
            }
        }
        match f {
            Frame::Settings { ack: true, .. } => {}
            Frame::Settings {
                ack: false,
                payload,
            } => {
                let (mut max_streams, mut connect) = (None, false);
                for s in Frame::settings(payload) {
                    match s.map_err(H2Error::Frame)? {
                        Setting::MaxConcurrentStreams(n) => max_streams = Some(n),
                        Setting::EnableConnectProtocol(v) => connect = v == 1,
                        Setting::HeaderTableSize(_)
                        | Setting::EnablePush(_)
                        | Setting::InitialWindowSize(_)
                        | Setting::MaxFrameSize(_)
                        | Setting::MaxHeaderListSize(_)
                        | Setting::Unknown(..) => {}
                    }
                }
                frame::write_settings_ack(out);
                if !self.settled {
                    self.settled = true;
                    self.phase = Phase::Open;
                    if setup.websocket && !connect {
                        for i in 0..self.streams.len() {
                            self.end_stream(i, StreamError::NoConnectProtocol, host);
                        }
                    } else {
                        self.request(setup, max_streams, host, out);
                    }
                }
            }
            Frame::Headers {
                stream,
                block,
                end_stream,
                end_headers,
                ..
            } => {
                if end_headers {
                    self.answer(setup, stream, block, end_stream, host)?;
                } else {
                    self.block = Some(Block {
                        stream,
                        end_stream,
                        bytes: bounded(Vec::new(), block)?,
                    });
                }
            }
            Frame::Continuation {
                block, end_headers, ..
            } => {
                let Some(mut b) = self.block.take() else {
                    return Err(H2Error::Protocol("CONTINUATION without HEADERS"));
                };
                b.bytes = bounded(b.bytes, block)?;
                if end_headers {
                    self.answer(setup, b.stream, &b.bytes, b.end_stream, host)?;
                } else {
                    self.block = Some(b);
                }
            }
            Frame::Data {
                stream,
                data,
                end_stream,
                flow_len,
            } => self.data(setup, stream, data, end_stream, flow_len, host, out)?,
            Frame::RstStream { stream, code } => {
                let i = self.index(stream)?;
                self.end_stream(i, StreamError::Reset(code), host);
            }
            Frame::Ping { ack: false, data } => frame::write_ping(out, data, true),
            Frame::GoAway { code, .. } => return Err(H2Error::GoAway(code)),
            // This side sends little and never waits for window; priorities and unknown frame
            // types are ignored (§5.3.2, §4.1).
            Frame::Ping { ack: true, .. }
            | Frame::WindowUpdate { .. }
            | Frame::Priority { .. }
            | Frame::Unknown { .. } => {}
            Frame::PushPromise { .. } => {
                return Err(H2Error::Protocol("PUSH_PROMISE, though push is disabled"))
            }
        }
        Ok(())
    }

    /// The subscribing requests, one stream each, as many as the server allows.
    fn request(
        &mut self,
        setup: &H2Setup,
        max_streams: Option<u32>,
        host: &mut impl H2Host,
        out: &mut Vec<u8>,
    ) {
        let authority = setup.target.to_string();
        let scheme = if setup.tls { "https" } else { "http" };
        let limit = max_streams.map_or(usize::MAX, |n| n as usize);
        let mut encoder = Encoder::new();
        let mut block = Vec::new();
        for (i, s) in self.streams.iter_mut().enumerate() {
            if i >= limit {
                s.phase = StreamPhase::Ended;
                host.stream_ended(i, StreamError::OverLimit(max_streams.unwrap_or(0)));
                continue;
            }
            let query = host.query(s.topic);
            block.clear();
            if setup.websocket {
                // RFC 8441 §4: the stream stays open both ways for the WebSocket's frames.
                let path = format!("/ws?{query}");
                encoder.encode(
                    [
                        (":method", "CONNECT"),
                        (":protocol", "websocket"),
                        (":scheme", scheme),
                        (":authority", authority.as_str()),
                        (":path", path.as_str()),
                        ("sec-websocket-version", "13"),
                    ],
                    &mut block,
                );
                frame::write_headers(out, stream_id(i), &block, false, DEFAULT_MAX_FRAME);
            } else {
                let path = format!("/sse?{query}");
                encoder.encode(
                    [
                        (":method", "GET"),
                        (":scheme", scheme),
                        (":authority", authority.as_str()),
                        (":path", path.as_str()),
                        ("accept", "text/event-stream"),
                    ],
                    &mut block,
                );
                frame::write_headers(out, stream_id(i), &block, true, DEFAULT_MAX_FRAME);
            }
            s.phase = StreamPhase::Requested;
        }
    }

    /// The index of stream `id`, which this side must have opened.
    fn index(&self, id: u32) -> Result<usize, H2Error> {
        let i = (id.saturating_sub(1) / 2) as usize;
        match self.streams.get(i) {
            Some(s) if id % 2 == 1 && s.phase != StreamPhase::Waiting => Ok(i),
            _ => Err(H2Error::Protocol(
                "frame on a stream the client never opened",
            )),
        }
    }

    /// A complete header block on stream `id`: the answer to its request (or trailers).
    fn answer(
        &mut self,
        setup: &H2Setup,
        id: u32,
        block: &[u8],
        end_stream: bool,
        host: &mut impl H2Host,
    ) -> Result<(), H2Error> {
        let i = self.index(id)?;
        let (mut status, mut event_stream) = (None, false);
        // Decoded whatever the stream's state: the dynamic table must follow the server's.
        self.decoder
            .decode(block, MAX_BLOCK, |(name, value, _)| match name {
                b":status" => {
                    status = std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.parse::<u16>().ok());
                }
                b"content-type" => event_stream = value.starts_with(b"text/event-stream"),
                _ => {}
            })
            .map_err(H2Error::Hpack)?;
        let Some(s) = self.streams.get_mut(i) else {
            return Ok(());
        };
        match s.phase {
            StreamPhase::Requested => match status {
                // Informational answers (1xx) come before the real one.
                Some(100..=199) => {}
                Some(200) if event_stream || setup.websocket => {
                    s.phase = StreamPhase::Open;
                    host.event(Event::Answered);
                }
                Some(200) => self.end_stream(i, StreamError::NotEventStream, host),
                Some(other) => self.end_stream(i, StreamError::Refused(other), host),
                None => return Err(H2Error::Protocol("response without :status")),
            },
            StreamPhase::Open if !end_stream => {
                return Err(H2Error::Protocol(
                    "a second header block without END_STREAM",
                ))
            }
            StreamPhase::Open | StreamPhase::Ended | StreamPhase::Waiting => {}
        }
        if end_stream {
            self.end_stream(i, StreamError::Ended, host);
        }
        Ok(())
    }

    /// Ends stream `i` (once) and tells the host.
    fn end_stream(&mut self, i: usize, why: StreamError, host: &mut impl H2Host) {
        if let Some(s) = self.streams.get_mut(i) {
            if s.phase != StreamPhase::Ended {
                s.phase = StreamPhase::Ended;
                s.partial = Vec::new();
                host.stream_ended(i, why);
            }
        }
    }

    /// A DATA frame: SSE events or WebSocket frames for an open stream; its bytes counted for
    /// flow control whatever the stream's state.
    #[allow(clippy::too_many_arguments)]
    fn data(
        &mut self,
        setup: &H2Setup,
        id: u32,
        data: &[u8],
        end_stream: bool,
        flow_len: u32,
        host: &mut impl H2Host,
        out: &mut Vec<u8>,
    ) -> Result<(), H2Error> {
        let i = self.index(id)?;
        self.consumed = self.consumed.saturating_add(flow_len);
        if self.consumed >= TOP_UP {
            frame::write_window_update(out, 0, self.consumed);
            self.consumed = 0;
        }
        let Some(s) = self.streams.get_mut(i) else {
            return Ok(());
        };
        match s.phase {
            StreamPhase::Requested => return Err(H2Error::Protocol("DATA before the answer")),
            StreamPhase::Open => {}
            // A stream this side gave up on: its remaining DATA is dropped.
            StreamPhase::Ended | StreamPhase::Waiting => return Ok(()),
        }
        s.consumed = s.consumed.saturating_add(flow_len);
        if s.consumed >= TOP_UP && !end_stream {
            frame::write_window_update(out, id, s.consumed);
            s.consumed = 0;
        }
        let mut ws = WsOut {
            id,
            out,
            ended: None,
        };
        let mut take = |input: &[u8], check: &mut SeqChecker| {
            if setup.websocket {
                ws_frames(input, i, check, host, &mut ws)
            } else {
                events(input, i, check, host)
            }
        };
        if s.partial.is_empty() {
            let used = take(data, &mut s.check);
            if let Some(tail) = data.get(used..).filter(|t| !t.is_empty()) {
                s.partial = tail.to_vec();
            }
        } else {
            let mut buf = std::mem::take(&mut s.partial);
            buf.extend_from_slice(data);
            let used = take(&buf, &mut s.check);
            buf.drain(..used.min(buf.len()));
            if !buf.is_empty() {
                s.partial = buf;
            }
        }
        if s.partial.len() > MAX_EVENT {
            return Err(H2Error::Protocol(
                "SSE event or WebSocket frame longer than 16 MiB",
            ));
        }
        if let Some(why) = ws.ended {
            self.end_stream(i, why, host);
        } else if end_stream {
            self.end_stream(i, StreamError::Ended, host);
        }
        Ok(())
    }
}

/// Stream `i`'s id: client streams are odd, in the order opened.
fn stream_id(i: usize) -> u32 {
    (i as u32).saturating_mul(2).saturating_add(1)
}

/// `buf` with `more` appended, unless the block would pass [`MAX_BLOCK`].
fn bounded(mut buf: Vec<u8>, more: &[u8]) -> Result<Vec<u8>, H2Error> {
    if buf.len().saturating_add(more.len()) > MAX_BLOCK {
        return Err(H2Error::Protocol("header block longer than 64 KiB"));
    }
    buf.extend_from_slice(more);
    Ok(buf)
}

/// Where a WebSocket stream's answers go (a Pong in a DATA frame of stream `id`), and why it
/// ended, if it did.
struct WsOut<'a> {
    id: u32,
    out: &'a mut Vec<u8>,
    ended: Option<StreamError>,
}

/// Checks every complete WebSocket frame at the start of `input` as stream `stream`'s
/// messages, answers Pings, and stops at a Close or a frame the server must not send; returns
/// the bytes used.
fn ws_frames(
    input: &[u8],
    stream: usize,
    check: &mut SeqChecker,
    host: &mut impl Host,
    ws: &mut WsOut<'_>,
) -> usize {
    let mut at = 0;
    while ws.ended.is_none() {
        let rest = input.get(at..).unwrap_or_default();
        let (step, used) = match wire::step(rest, MAX_EVENT as u64) {
            Ok(Some(done)) => done,
            Ok(None) => break,
            Err(_) => {
                ws.ended = Some(StreamError::BadWsFrame);
                return input.len();
            }
        };
        match step {
            Step::Text(payload) | Step::Binary(payload) => deliver(payload, stream, check, host),
            Step::Ping(payload) => {
                let r = host.random();
                let pong = wire::pong(payload, [r[0], r[1], r[2], r[3]]);
                frame::write_data(ws.out, ws.id, &pong, false);
            }
            Step::Closed => ws.ended = Some(StreamError::WsClosed),
            Step::Pong(_) | Step::Nothing => {}
        }
        at += used;
    }
    at
}

/// Checks every complete SSE event at the start of `input` (its `data:` lines) as stream
/// `stream`'s; returns the bytes used.
fn events(input: &[u8], stream: usize, check: &mut SeqChecker, host: &mut impl Host) -> usize {
    let mut at = 0;
    while let Some(end) = find(input.get(at..).unwrap_or_default(), b"\n\n") {
        let event = input.get(at..at + end).unwrap_or_default();
        for line in event.split(|&b| b == b'\n') {
            if let Some(data) = line.strip_prefix(b"data: ") {
                deliver(data, stream, check, host);
            }
        }
        at += end + 2;
    }
    at
}

/// Checks one benchmark payload (`SEQ PUBLISHED_US ...`) as stream `stream`'s message;
/// anything else is ignored.
fn deliver(payload: &[u8], stream: usize, check: &mut SeqChecker, host: &mut impl Host) {
    if let Some((seq, published_us)) = seq_and_time(payload.splitn(3, |&b| b == b' ')) {
        report(check, stream, seq, published_us, host);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::check::Seen;
    use clarion_proto::h2::frame::ErrorCode;

    /// A host in memory: what the life wrote and reported.
    #[derive(Default)]
    struct Recorder {
        sent: Vec<u8>,
        events: Vec<Event>,
        ended: Vec<(usize, StreamError)>,
        /// Writes fail with this, when set.
        broken: Option<io::ErrorKind>,
    }

    impl Host for Recorder {
        fn random(&mut self) -> [u8; 16] {
            [7; 16]
        }
        fn transmit(&mut self, bytes: &[u8]) -> Result<(), io::ErrorKind> {
            if let Some(kind) = self.broken {
                return Err(kind);
            }
            self.sent.extend_from_slice(bytes);
            Ok(())
        }
        fn event(&mut self, event: Event) {
            self.events.push(event);
        }
    }

    impl H2Host for Recorder {
        fn query(&mut self, topic: u32) -> String {
            format!("topic=t{topic}&x=1")
        }
        fn stream_ended(&mut self, stream: usize, why: StreamError) {
            self.ended.push((stream, why));
        }
    }

    const SETUP: H2Setup = H2Setup {
        target: std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::LOCALHOST,
            9,
        )),
        tls: false,
        websocket: false,
    };

    const WS: H2Setup = H2Setup {
        websocket: true,
        ..SETUP
    };

    /// The server's side of a connection, as bytes.
    struct Script {
        bytes: Vec<u8>,
        encoder: Encoder,
    }

    impl Script {
        fn new(max_streams: Option<u32>) -> Script {
            let mut bytes = Vec::new();
            let mut settings = vec![
                Setting::InitialWindowSize(65_535),
                Setting::MaxFrameSize(16_384),
                Setting::EnableConnectProtocol(1),
                Setting::HeaderTableSize(0),
            ];
            settings.extend(max_streams.map(Setting::MaxConcurrentStreams));
            frame::write_settings(&mut bytes, &settings);
            frame::write_settings_ack(&mut bytes);
            Script {
                bytes,
                encoder: Encoder::new(),
            }
        }
        fn answer(mut self, stream: u32, status: &str, ctype: &str) -> Script {
            let mut block = Vec::new();
            self.encoder
                .encode([(":status", status), ("content-type", ctype)], &mut block);
            frame::write_headers(&mut self.bytes, stream, &block, false, 16_384);
            self
        }
        fn sse(self, stream: u32) -> Script {
            self.answer(stream, "200", "text/event-stream; charset=utf-8")
        }
        fn data(mut self, stream: u32, data: &str, end: bool) -> Script {
            frame::write_data(&mut self.bytes, stream, data.as_bytes(), end);
            self
        }
        fn raw(mut self, bytes: &[u8]) -> Script {
            self.bytes.extend_from_slice(bytes);
            self
        }
    }

    /// A life of `n` streams (topics 0, 1, ...) that has written its preface.
    fn connected(n: u32) -> (H2Life, Recorder) {
        let mut life = H2Life::new(0..n);
        let mut host = Recorder::default();
        life.handle_connected(&mut host).unwrap();
        host.sent.clear();
        (life, host)
    }

    /// The frames in `bytes`, as (type, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while bytes.len() >= HEADER_LEN {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((
                bytes[3],
                bytes[4],
                stream,
                bytes[HEADER_LEN..HEADER_LEN + len].to_vec(),
            ));
            bytes = &bytes[HEADER_LEN + len..];
        }
        assert!(bytes.is_empty());
        out
    }

    fn delivered(stream: usize, seq: u64, seen: Seen) -> Event {
        Event::Delivered {
            stream,
            seq,
            published_us: 5,
            seen,
        }
    }

    #[test]
    fn the_preface_settings_and_window_go_out_once_connected() {
        let mut life = H2Life::new([3]);
        let mut host = Recorder::default();
        life.handle_connected(&mut host).unwrap();
        assert!(host.sent.starts_with(PREFACE));
        let f = frames(&host.sent[PREFACE.len()..]);
        assert_eq!(f.len(), 2);
        let (kind, flags, stream, payload) = &f[0];
        assert_eq!((*kind, *flags, *stream), (0x4, 0, 0));
        let settings: Vec<Setting> = Frame::settings(payload).map(|s| s.unwrap()).collect();
        assert_eq!(
            settings,
            [
                Setting::EnablePush(0),
                Setting::InitialWindowSize(MAX_WINDOW)
            ]
        );
        assert_eq!(
            f[1],
            (0x8, 0, 0, (MAX_WINDOW - 65_535).to_be_bytes().to_vec())
        );
        assert_eq!(life.phase(), Phase::Head);
        assert!(life.handshaking());
        // Only once.
        host.sent.clear();
        life.handle_connected(&mut host).unwrap();
        assert!(host.sent.is_empty());
        // A preface that cannot be written ends the life.
        let mut life = H2Life::new([3]);
        host.broken = Some(io::ErrorKind::BrokenPipe);
        let e = life.handle_connected(&mut host).unwrap_err();
        assert_eq!(e.to_string(), "send h2: broken pipe");
        assert_eq!(life.phase(), Phase::Dead);
    }

    #[test]
    fn the_requests_wait_for_the_servers_settings_then_all_go_out() {
        let (mut life, mut host) = connected(3);
        let s = Script::new(Some(256));
        life.handle_input(&SETUP, &s.bytes[..5], &mut host).unwrap();
        assert!(host.sent.is_empty());
        life.handle_input(&SETUP, &s.bytes[5..], &mut host).unwrap();
        assert_eq!(life.phase(), Phase::Open);
        let f = frames(&host.sent);
        // The SETTINGS ack, then one HEADERS per stream, ids 1, 3, 5.
        assert_eq!(f[0], (0x4, 0x1, 0, vec![]));
        let mut decoder = Decoder::new(4096);
        for (i, (kind, flags, stream, block)) in f[1..].iter().enumerate() {
            assert_eq!((*kind, *flags, *stream), (0x1, 0x5, 2 * i as u32 + 1));
            assert_eq!(
                fields(&mut decoder, block),
                [
                    ":method: GET".to_string(),
                    ":scheme: http".into(),
                    ":authority: 127.0.0.1:9".into(),
                    format!(":path: /sse?topic=t{i}&x=1"),
                    "accept: text/event-stream".into(),
                ]
            );
        }
        assert_eq!(f.len(), 4);
        assert!(life.handshaking());
        // Over TLS the scheme is https.
        let (mut life, mut host) = connected(1);
        let tls = H2Setup { tls: true, ..SETUP };
        life.handle_input(&tls, &Script::new(None).bytes, &mut host)
            .unwrap();
        let f = frames(&host.sent);
        let mut scheme = String::new();
        Decoder::new(4096)
            .decode(&f[1].3, 4096, |(n, v, _)| {
                if n == b":scheme" {
                    scheme = String::from_utf8_lossy(v).into_owned();
                }
            })
            .unwrap();
        assert_eq!(scheme, "https");
    }

    /// The header fields of a request block, as `name: value` lines.
    fn fields(decoder: &mut Decoder, block: &[u8]) -> Vec<String> {
        let mut fields = Vec::new();
        decoder
            .decode(block, 4096, |(n, v, _)| {
                fields.push(format!(
                    "{}: {}",
                    String::from_utf8_lossy(n),
                    String::from_utf8_lossy(v)
                ))
            })
            .unwrap();
        fields
    }

    #[test]
    fn websockets_are_extended_connects_and_their_frames_are_checked_split_at_every_byte() {
        use clarion_proto::ws::frame::{apply_mask, encode_frame, parse_header};
        use clarion_proto::ws::OpCode;
        // Two WebSocket streams (RFC 8441): the requests are CONNECTs that leave the stream
        // open; each answer is a bare 200; the messages are WebSocket frames in DATA frames,
        // one split across two of them, a Ping answered with a masked Pong on its own stream.
        let (mut life, mut host) = connected(2);
        life.handle_input(&WS, &Script::new(Some(100)).bytes, &mut host)
            .unwrap();
        let f = frames(&host.sent);
        let mut decoder = Decoder::new(4096);
        for (i, (kind, flags, stream, block)) in f[1..].iter().enumerate() {
            // END_HEADERS without END_STREAM.
            assert_eq!((*kind, *flags, *stream), (0x1, 0x4, 2 * i as u32 + 1));
            assert_eq!(
                fields(&mut decoder, block),
                [
                    ":method: CONNECT".to_string(),
                    ":protocol: websocket".into(),
                    ":scheme: http".into(),
                    ":authority: 127.0.0.1:9".into(),
                    format!(":path: /ws?topic=t{i}&x=1"),
                    "sec-websocket-version: 13".into(),
                ]
            );
        }
        let text = |m: &str| encode_frame(OpCode::Text, m.as_bytes());
        let two = text("1 5 b");
        let mut server = Script::new(Some(100))
            .answer(1, "200", "")
            .answer(3, "200", "");
        for (stream, bytes) in [
            (1, text("0 5 a")),
            (3, text("0 5 x")),
            (1, two[..3].to_vec()),
            (1, two[3..].to_vec()),
            (3, encode_frame(OpCode::Ping, b"hi")),
            (3, text("2 5 y")),
        ] {
            frame::write_data(&mut server.bytes, stream, &bytes, false);
        }
        let mut want = None;
        for cut in 0..server.bytes.len() {
            let (mut life, mut host) = connected(2);
            life.handle_input(&WS, &server.bytes[..cut], &mut host)
                .unwrap();
            life.handle_input(&WS, &server.bytes[cut..], &mut host)
                .unwrap();
            assert_eq!(life.open_streams(), 2);
            assert!(host.ended.is_empty(), "{:?}", host.ended);
            let got = (host.events.clone(), host.sent.len());
            match &want {
                None => want = Some(got),
                Some(w) => assert_eq!(&got, w, "cut at {cut}"),
            }
            // The Pong: a DATA frame on stream 3 holding a masked frame with the Ping's bytes.
            let pongs: Vec<_> = frames(&host.sent)
                .into_iter()
                .filter(|f| f.0 == 0x0)
                .collect();
            assert_eq!(pongs.len(), 1);
            assert_eq!((pongs[0].1, pongs[0].2), (0, 3));
            let h = parse_header(&pongs[0].3, true, 125).unwrap().unwrap();
            let mut payload = pongs[0].3[h.header_len..].to_vec();
            apply_mask(&mut payload, h.mask.unwrap(), 0);
            assert_eq!((h.opcode, payload.as_slice()), (OpCode::Pong, &b"hi"[..]));
        }
        let events = want.unwrap().0;
        let got: Vec<_> = events
            .iter()
            .filter(|e| matches!(e, Event::Delivered { .. }))
            .cloned()
            .collect();
        assert_eq!(
            got,
            [
                delivered(0, 0, Seen::InOrder),
                delivered(1, 0, Seen::InOrder),
                delivered(0, 1, Seen::InOrder),
                delivered(1, 2, Seen::AfterGap(1)),
            ]
        );
    }

    #[test]
    fn a_websocket_stream_ends_on_close_or_a_bad_frame_and_without_extended_connect() {
        use clarion_proto::ws::frame::encode_frame;
        use clarion_proto::ws::OpCode;
        let (mut life, mut host) = connected(2);
        let mut server = Script::new(Some(100))
            .answer(1, "200", "")
            .answer(3, "200", "");
        frame::write_data(
            &mut server.bytes,
            1,
            &encode_frame(OpCode::Close, &[3, 232]),
            false,
        );
        // A masked frame from the server (bit 0x80 of the second byte).
        frame::write_data(
            &mut server.bytes,
            3,
            &[0x81, 0x85, 1, 2, 3, 4, 0, 0, 0, 0, 0],
            false,
        );
        life.handle_input(&WS, &server.bytes, &mut host).unwrap();
        assert_eq!(
            host.ended,
            [(0, StreamError::WsClosed), (1, StreamError::BadWsFrame)]
        );
        assert_eq!(life.open_streams(), 0);
        assert_eq!(life.phase(), Phase::Open, "the connection goes on");
        // A server whose SETTINGS lack ENABLE_CONNECT_PROTOCOL gets no request at all.
        let (mut life, mut host) = connected(2);
        let mut bytes = Vec::new();
        frame::write_settings(&mut bytes, &[Setting::MaxConcurrentStreams(100)]);
        life.handle_input(&WS, &bytes, &mut host).unwrap();
        assert_eq!(
            host.ended,
            [
                (0, StreamError::NoConnectProtocol),
                (1, StreamError::NoConnectProtocol)
            ]
        );
        assert_eq!(frames(&host.sent).len(), 1, "the SETTINGS ack only");
    }

    /// Three SSE streams: events interleaved, one split across DATA frames, a comment, a
    /// PING, a gap and a duplicate.
    fn three_streams() -> Script {
        Script::new(Some(100))
            .sse(1)
            .sse(3)
            .sse(5)
            .data(1, ": hello\n\nretry: 1000\n\n", false)
            .data(1, "id: 1\ndata: 0 5 a\n\n", false)
            .data(3, "id: 1\ndata: 0 5 b\n\nid: 2\ndata: 1 5 b\n\n", false)
            .data(5, "id: 7\nda", false)
            .data(5, "ta: 0 5 c\n", false)
            .raw(&{
                let mut p = Vec::new();
                frame::write_ping(&mut p, *b"12345678", false);
                p
            })
            .data(5, "\nid: 8\ndata: 2 5 c\n\ndata: 2 5 c\n\n", false)
            .data(1, "data: 1 5 a\n\n", false)
    }

    #[test]
    fn many_streams_are_checked_apart_and_the_same_split_at_every_byte() {
        let input = three_streams().bytes;
        let whole = {
            let (mut life, mut host) = connected(3);
            life.handle_input(&SETUP, &input, &mut host).unwrap();
            assert_eq!(life.open_streams(), 3);
            assert!(!life.handshaking());
            let checks: Vec<_> = life.streams().map(|(_, _, c)| c.clone()).collect();
            assert!(checks[0].finish(2).perfect());
            assert!(checks[1].finish(2).perfect());
            let c = checks[2].finish(3);
            assert_eq!((c.missing, c.duplicated), (1, 1));
            host
        };
        assert_eq!(
            whole.events,
            [
                Event::Answered,
                Event::Answered,
                Event::Answered,
                delivered(0, 0, Seen::InOrder),
                delivered(1, 0, Seen::InOrder),
                delivered(1, 1, Seen::InOrder),
                delivered(2, 0, Seen::InOrder),
                delivered(2, 2, Seen::AfterGap(1)),
                delivered(2, 2, Seen::Duplicate),
                delivered(0, 1, Seen::InOrder),
            ]
        );
        // The settings ack, three requests, the PING's answer.
        let f = frames(&whole.sent);
        assert_eq!(f.len(), 5);
        assert_eq!(f[4], (0x6, 0x1, 0, b"12345678".to_vec()));
        assert!(whole.ended.is_empty());
        for cut in 0..=input.len() {
            let (mut life, mut host) = connected(3);
            life.handle_input(&SETUP, &input[..cut], &mut host).unwrap();
            life.handle_input(&SETUP, &input[cut..], &mut host).unwrap();
            assert_eq!(host.events, whole.events, "cut at {cut}");
            assert_eq!(host.sent, whole.sent, "cut at {cut}");
            assert!(
                life.buf.is_empty() && life.buf.capacity() == 0,
                "cut at {cut}"
            );
        }
        let (mut life, mut host) = connected(3);
        for b in &input {
            life.handle_input(&SETUP, std::slice::from_ref(b), &mut host)
                .unwrap();
        }
        assert_eq!(host.events, whole.events);
        assert_eq!(host.sent, whole.sent);
    }

    #[test]
    fn a_header_block_may_continue_in_continuation_frames() {
        let mut block = Vec::new();
        Encoder::new().encode(
            [(":status", "200"), ("content-type", "text/event-stream")],
            &mut block,
        );
        let mut raw = Vec::new();
        frame::write_headers(&mut raw, 1, &block, false, 3);
        assert!(frames(&raw).len() > 2, "split into CONTINUATIONs");
        let input = Script::new(None)
            .raw(&raw)
            .data(1, "data: 0 5 a\n\n", false)
            .bytes;
        let (mut life, mut host) = connected(1);
        life.handle_input(&SETUP, &input, &mut host).unwrap();
        assert_eq!(life.open_streams(), 1);
        assert_eq!(host.events.len(), 2);
        // Anything between a HEADERS and its last CONTINUATION ends the connection.
        let mut bad = Vec::new();
        frame::write_headers(&mut bad, 1, &block, false, 3);
        let (head, rest) = bad.split_at(HEADER_LEN + 3);
        let mut input = Script::new(None).raw(head).bytes;
        frame::write_ping(&mut input, [0; 8], false);
        input.extend_from_slice(rest);
        let (mut life, mut host) = connected(1);
        let e = life.handle_input(&SETUP, &input, &mut host).unwrap_err();
        assert_eq!(e, H2Error::Protocol("frame inside a header block"));
    }

    #[test]
    fn stream_refusals_resets_and_ends_leave_the_connection_open() {
        let mut rst = Vec::new();
        frame::write_rst_stream(&mut rst, 5, ErrorCode::Cancel);
        let input = Script::new(Some(4))
            .answer(1, "404", "text/plain")
            .answer(3, "200", "application/json")
            .sse(5)
            .sse(7)
            .data(5, "data: 0 5 a\n\n", false)
            .raw(&rst)
            .data(3, "{}", false)
            .data(7, "data: 0 5 a\n\n", true)
            .bytes;
        let (mut life, mut host) = connected(5);
        life.handle_input(&SETUP, &input, &mut host).unwrap();
        assert_eq!(
            host.ended,
            [
                (4, StreamError::OverLimit(4)),
                (0, StreamError::Refused(404)),
                (1, StreamError::NotEventStream),
                (2, StreamError::Reset(8)),
                (3, StreamError::Ended),
            ]
        );
        assert_eq!(life.phase(), Phase::Open);
        assert_eq!(life.open_streams(), 0);
        let received: Vec<u64> = life.streams().map(|(_, _, c)| c.received()).collect();
        assert_eq!(received, [0, 0, 1, 1, 0]);
        assert_eq!(
            host.ended
                .iter()
                .map(|(_, e)| e.to_string())
                .collect::<Vec<_>>()[..2],
            [
                "h2 stream over the server's MAX_CONCURRENT_STREAMS 4",
                "h2 stream refused: HTTP 404"
            ]
        );
        // Only four requests went out.
        assert_eq!(frames(&host.sent).len(), 5);
        // Trailers end a stream too; a header block on an open stream without END_STREAM
        // is not allowed.
        let mut trailers = Vec::new();
        frame::write_headers(&mut trailers, 1, &[0x88], true, 16_384);
        let (mut life, mut host) = connected(1);
        let input = Script::new(None).sse(1).raw(&trailers).bytes;
        life.handle_input(&SETUP, &input, &mut host).unwrap();
        assert_eq!(host.ended, [(0, StreamError::Ended)]);
        let (mut life, mut host) = connected(1);
        let input = Script::new(None).sse(1).sse(1).bytes;
        assert!(life.handle_input(&SETUP, &input, &mut host).is_err());
    }

    #[test]
    fn what_a_server_must_not_send_ends_the_connection_clearly() {
        let mut goaway = Vec::new();
        frame::write_goaway(&mut goaway, 1, ErrorCode::EnhanceYourCalm, b"calm");
        let mut ping = Vec::new();
        frame::write_ping(&mut ping, [0; 8], false);
        let mut push = Vec::new();
        frame::write_header(&mut push, 4, 0x5, 0x4, 1);
        push.extend_from_slice(&[0, 0, 0, 2]);
        let mut too_long = Vec::new();
        frame::write_header(&mut too_long, 20_000, 0x0, 0, 1);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec(),
                "h2: the server answered in HTTP/1.1 (no h2c prior knowledge)",
            ),
            (ping, "h2: the server's first frame is not SETTINGS"),
            (
                Script::new(None).raw(&goaway).bytes,
                "h2: GOAWAY from server, code 11",
            ),
            (
                Script::new(None).data(1, "data: 0 5 a\n\n", false).bytes,
                "h2: DATA before the answer",
            ),
            (
                Script::new(None).sse(3).bytes,
                "h2: frame on a stream the client never opened",
            ),
            (
                Script::new(None).sse(2).bytes,
                "h2: frame on a stream the client never opened",
            ),
            (
                Script::new(None).raw(&push).bytes,
                "h2: PUSH_PROMISE, though push is disabled",
            ),
            (
                Script::new(None).raw(&too_long).bytes,
                "h2: bad frame: FrameSizeError: frame longer than SETTINGS_MAX_FRAME_SIZE",
            ),
            (
                Script::new(None)
                    .raw(&{
                        let mut h = Vec::new();
                        // An index in neither table.
                        frame::write_headers(&mut h, 1, &[0xff, 0x7f], false, 16_384);
                        h
                    })
                    .bytes,
                "h2: header index",
            ),
            (
                Script::new(None)
                    .raw(&{
                        let mut h = Vec::new();
                        frame::write_headers(&mut h, 1, &[0x0f, 0x1b, 0x00], false, 16_384);
                        h
                    })
                    .bytes,
                "h2: response without :status",
            ),
        ];
        for (input, error) in cases {
            let (mut life, mut host) = connected(1);
            let e = life.handle_input(&SETUP, &input, &mut host).unwrap_err();
            assert!(e.to_string().starts_with(error), "{e} for {error}");
            assert_eq!(life.phase(), Phase::Dead);
            // A dead life ignores what still comes in.
            assert_eq!(life.handle_input(&SETUP, &input, &mut host), Ok(()));
        }
        // The end of the connection, before the server's SETTINGS and after.
        let (mut life, _) = connected(1);
        assert_eq!(life.handle_end(), H2Error::ClosedDuringHandshake);
        let (mut life, mut host) = connected(1);
        life.handle_input(&SETUP, &Script::new(None).bytes, &mut host)
            .unwrap();
        assert_eq!(life.handle_end().to_string(), "closed by server");
        assert_eq!(life.phase(), Phase::Dead);
        // A SETTINGS ack or requests that cannot be written end the life.
        let (mut life, mut host) = connected(1);
        host.broken = Some(io::ErrorKind::ConnectionReset);
        let e = life
            .handle_input(&SETUP, &Script::new(None).bytes, &mut host)
            .unwrap_err();
        assert_eq!(e.to_string(), "send h2: connection reset");
    }

    #[test]
    fn consumed_bytes_go_back_to_the_servers_windows() {
        // Events of 16 KiB: the connection's and the stream's windows are topped up once
        // [`TOP_UP`] bytes have arrived.
        let frames_needed = (TOP_UP as usize).div_ceil(16_384);
        let mut script = Script::new(None).sse(1).sse(3);
        for i in 0..frames_needed {
            let head = format!("data: {i} 5 ");
            let event = format!("{head}{}\n\n", "x".repeat(16_384 - head.len() - 2));
            assert_eq!(event.len(), 16_384);
            script = script.data(1, &event, false);
        }
        let (mut life, mut host) = connected(2);
        life.handle_input(&SETUP, &script.bytes, &mut host).unwrap();
        let updates: Vec<_> = frames(&host.sent)
            .into_iter()
            .filter(|f| f.0 == 0x8)
            .map(|f| (f.2, u32::from_be_bytes(f.3.try_into().unwrap())))
            .collect();
        assert_eq!(updates, [(0, TOP_UP), (1, TOP_UP)]);
        let (_, _, check) = life.streams().next().unwrap();
        assert!(check.finish(frames_needed as u64).perfect());
    }

    #[test]
    fn random_bytes_end_in_an_error_or_nothing_never_a_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let opened = three_streams().bytes;
        for round in 0..3_000 {
            let (mut life, mut host) = connected(3);
            // Most rounds start from open streams, so frames and events see garbage; some
            // flip bytes of a valid script instead.
            let mut bytes: Vec<u8> = Vec::new();
            match round % 3 {
                0 => {}
                1 => bytes.extend_from_slice(&opened[..opened.len() / 2]),
                _ => {
                    bytes = opened.clone();
                    for _ in 0..4 {
                        let at = next() as usize % bytes.len();
                        bytes[at] = next() as u8;
                    }
                }
            }
            let len = (next() % 300) as usize;
            bytes.extend((0..len).map(|_| next() as u8));
            for chunk in bytes.chunks(1 + (next() % 40) as usize) {
                if life.handle_input(&SETUP, chunk, &mut host).is_err() {
                    assert_eq!(life.phase(), Phase::Dead);
                    break;
                }
            }
        }
    }

    #[test]
    fn the_servers_own_connection_state_serves_every_stream_within_its_windows() {
        use clarion_proto::h2::server::{self, Connection, Settings};
        // Client and server state machines in memory: what one writes, the other reads.
        let (mut life, mut host) = {
            let mut life = H2Life::new(0..3);
            let mut host = Recorder::default();
            life.handle_connected(&mut host).unwrap();
            (life, host)
        };
        let mut srv = Connection::new(Settings {
            max_streams: 2,
            ..Settings::default()
        });
        let mut to_client = Vec::new();
        srv.start(&mut to_client);
        let mut requests = Vec::new();
        {
            let sent = std::mem::take(&mut host.sent);
            let mut events = Vec::new();
            assert_eq!(
                srv.receive(&sent, &mut to_client, &mut events).unwrap(),
                sent.len()
            );
            assert!(events.is_empty());
        }
        life.handle_input(&SETUP, &std::mem::take(&mut to_client), &mut host)
            .unwrap();
        // The server allows two streams: the third is not requested.
        assert_eq!(host.ended, [(2, StreamError::OverLimit(2))]);
        {
            let sent = std::mem::take(&mut host.sent);
            let mut events = Vec::new();
            srv.receive(&sent, &mut to_client, &mut events).unwrap();
            for e in events {
                if let server::Event::Request {
                    stream, request, ..
                } = e
                {
                    let line = String::from_utf8_lossy(&request.head).into_owned();
                    requests.push((stream, line.lines().next().unwrap_or("").to_owned()));
                }
            }
        }
        assert_eq!(
            requests,
            [
                (1, "GET /sse?topic=t0&x=1 HTTP/1.1".to_owned()),
                (3, "GET /sse?topic=t1&x=1 HTTP/1.1".to_owned())
            ]
        );
        // The answers as the HTTP/1.1 SSE transport writes them, then 2 MiB of events on
        // stream 1: far past the protocol's default windows of 64 KiB.
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\
                     Cache-Control: no-cache\r\n\r\nretry: 1000\n\n";
        for id in [1, 3] {
            assert_eq!(srv.respond(id, head, &mut to_client), head.len());
        }
        let mut body = Vec::new();
        let mut n = 0u64;
        while body.len() < 2 << 20 {
            body.extend_from_slice(
                format!("id: {n}\ndata: {n} 5 {}\n\n", "y".repeat(500)).as_bytes(),
            );
            n += 1;
        }
        assert_eq!(srv.respond(1, &body, &mut to_client), body.len());
        assert_eq!(srv.respond(3, b"data: 0 5 z\n\n", &mut to_client), 13);
        life.handle_input(&SETUP, &std::mem::take(&mut to_client), &mut host)
            .unwrap();
        let checks: Vec<_> = life.streams().map(|(_, _, c)| c.clone()).collect();
        assert!(checks[0].finish(n).perfect() && checks[0].received() == n);
        assert!(checks[1].finish(1).perfect());
        assert_eq!(life.open_streams(), 2);
        // What the client gave back (its SETTINGS ack, WINDOW_UPDATEs) is what the server
        // expects.
        let sent = std::mem::take(&mut host.sent);
        assert!(frames(&sent).iter().any(|f| f.0 == 0x8 && f.2 == 0));
        let mut events = Vec::new();
        assert_eq!(
            srv.receive(&sent, &mut to_client, &mut events).unwrap(),
            sent.len()
        );
    }
}
