//! The life of one load connection, without I/O: the subscribing request once the socket is
//! connected, the answer head, then WebSocket frames, SSE events or long-poll answers until the
//! server ends it; every benchmark message checked against its stream's sequence, the server's
//! Pings answered, Pongs handed back for timing.
//!
//! Both workers ([`crate::worker`] and [`crate::million_worker`]) drive one [`Life`] per
//! connection and keep only process plumbing (sockets, TLS, the poll loop, timers and the
//! measurements they sum). Nothing here reads a clock or touches a socket: bytes read come in
//! through [`Life::handle_input`] (plaintext, after any TLS), and what the life writes, the
//! randomness it needs and what the workers measure go through a [`Host`] the worker passes
//! in, so the whole life runs in memory in the tests below.
//!
//! Call order: [`Life::handle_connected`] once the socket is connected, then
//! [`Life::handle_input`] for each read, [`Life::handle_end`] when the server ends the stream;
//! [`Life::fail`] when something outside the protocol (a read, TLS) ends it. An error from any
//! of them leaves the life dead, and a dead life ignores what still comes in.
//!
//! A [`Life`] is part of a record kept for each of up to ~19,000 connections per process (the
//! million scenario): it holds no more than its phase, the bytes of a head, frame or event
//! split across reads (empty, without allocation, otherwise) and one [`SeqChecker`] per stream.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use clarion_proto::http1::{parse_response_head, ResponseBody};
use clarion_proto::ws::frame::encode_client_frame;
use clarion_proto::ws::OpCode;

use crate::check::{Seen, SeqChecker};
use crate::peer_formats::{centrifuge_unwrapped, socketio_unwrapped};
use crate::wire::{self, find, Step, MAX_HEAD, MAX_HEADERS};

/// How clients subscribe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// WebSocket, `/ws?topic=`.
    Ws,
    /// Server-Sent Events, `/sse?topic=`.
    Sse,
    /// Long-polling, `/poll?topic=&since=` in a loop on one keep-alive connection.
    Poll,
}

/// How a connection's messages carry their sequence number and publish time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Payloads {
    /// `SEQ PUBLISH_UNIX_MICROS ...`, stream 0, possibly inside a peer's envelope (a Socket.IO
    /// event frame, a Centrifuge push); Centrifuge's JSON pings (`{}`) are answered and its
    /// frames of several lines read line by line. Anything else (a peer's protocol replies)
    /// is ignored.
    Peers,
    /// `b SEQ PUBLISH_UNIX_MICROS ...` (stream 0, the topic every connection follows) or
    /// `c SEQ PUBLISH_UNIX_MICROS ...` (stream 1, the connection's room).
    Tagged,
}

/// What every connection of one worker shares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup<'a> {
    /// How the connections subscribe.
    pub(crate) transport: Transport,
    /// The server (the `Host` header).
    pub(crate) target: SocketAddr,
    /// How messages are read.
    pub(crate) payloads: Payloads,
    /// Largest frame payload accepted: a broken length must not make a connection buffer
    /// without bound.
    pub(crate) max_frame: u64,
    /// A text message each WebSocket sends once open (a peer's protocol greeting).
    pub(crate) hello: Option<&'a str>,
}

/// What a life asks of the worker around it.
pub(crate) trait Host {
    /// Sixteen random bytes, for WebSocket keys and masks (they need only differ).
    fn random(&mut self) -> [u8; 16];
    /// Writes `bytes` to the server. Requests, pongs and greetings are small and the socket's
    /// send buffer idle, so a write either completes or fails.
    fn transmit(&mut self, bytes: &[u8]) -> Result<(), io::ErrorKind>;
    /// Something the worker measures.
    fn event(&mut self, event: Event);
}

/// What a life reports to its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// The subscribing request was answered (WebSocket or SSE): a TLS client may now leave the
    /// handshake's machinery behind.
    Answered,
    /// A benchmark message arrived on `stream` (see [`Payloads`]).
    Delivered {
        /// The stream it belongs to.
        stream: usize,
        /// Its sequence number.
        seq: u64,
        /// When it was published, Unix microseconds.
        published_us: u64,
        /// What its stream's check made of it: a gap or a duplicate shows here.
        seen: Seen,
    },
    /// A Pong arrived, answering one of [`Life::ping`]'s Pings (sent then, Unix microseconds),
    /// or a Ping of unknown payload (`None`).
    Pong {
        /// The send time the Ping carried.
        sent_us: Option<u64>,
    },
}

/// Why a connection's life ended. Its `Display` is the kind counted in the bench's errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LifeError {
    /// The answer head is not a valid HTTP/1.1 response head.
    BadAnswer(String),
    /// The server answered the subscribing request with this status.
    Refused(u16),
    /// An SSE answer whose body is not delimited by the end of the connection.
    NotCloseDelimited,
    /// A frame the server must not send (masked, a reserved opcode, over the size limit).
    BadFrame(String),
    /// A long-poll answer longer than memory can address.
    PollTooLong,
    /// A long-poll answer without a `Content-Length`.
    PollWithoutLength,
    /// A long-poll answer whose body is not the expected JSON.
    BadPoll(String),
    /// The server closed the connection (a Close frame, or the end of the stream once open).
    ClosedByServer,
    /// The server ended the stream before answering the subscribing request.
    ClosedDuringHandshake,
    /// Writing the request, the greeting or the next poll failed.
    Send(&'static str, io::ErrorKind),
}

impl fmt::Display for LifeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LifeError::BadAnswer(e) => write!(f, "bad answer: {e}"),
            LifeError::Refused(status) => write!(f, "refused: HTTP {status}"),
            LifeError::NotCloseDelimited => f.write_str("event stream is not close-delimited"),
            // The frame reader's message already says "bad frame: ...".
            LifeError::BadFrame(e) => f.write_str(e),
            LifeError::PollTooLong => f.write_str("poll answer too long"),
            LifeError::PollWithoutLength => f.write_str("poll answer without Content-Length"),
            LifeError::BadPoll(e) => write!(f, "bad poll answer: {e}"),
            LifeError::ClosedByServer => f.write_str("closed by server"),
            LifeError::ClosedDuringHandshake => f.write_str("closed during handshake"),
            LifeError::Send(what, kind) => write!(f, "send {what}: {kind}"),
        }
    }
}

impl std::error::Error for LifeError {}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The socket is not connected yet.
    Connecting,
    /// The request is sent; its answer's head is awaited.
    Head,
    /// Subscribed: messages flow.
    Open,
    /// Ended, by an error or by the server.
    Dead,
}

/// One load connection's protocol state, with `N` checked streams (the regular worker's one
/// topic, the million worker's topic and room).
#[derive(Debug)]
pub(crate) struct Life<const N: usize> {
    /// One checker per stream.
    streams: [SeqChecker; N],
    /// Bytes of a head, frame or event split across reads: empty (no allocation) otherwise,
    /// since input is parsed where the worker read it.
    buf: Vec<u8>,
    /// The worker's number for what this connection follows (a topic's index, a room). Kept
    /// here, beside the phase, where it costs no padding in the connection's record.
    topic: u32,
    phase: Phase,
    /// Pings sent and not yet answered.
    pings_out: u8,
}

impl<const N: usize> Life<N> {
    /// A connection about to connect, following the worker's `topic`.
    pub(crate) fn new(topic: u32) -> Self {
        Life {
            streams: std::array::from_fn(|_| SeqChecker::default()),
            buf: Vec::new(),
            topic,
            phase: Phase::Connecting,
            pings_out: 0,
        }
    }

    /// The worker's number for what this connection follows.
    pub(crate) fn topic(&self) -> u32 {
        self.topic
    }

    /// Where the connection is.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// Connecting, or waiting for the answer to the subscribing request.
    pub(crate) fn handshaking(&self) -> bool {
        matches!(self.phase, Phase::Connecting | Phase::Head)
    }

    /// The checks of each stream.
    pub(crate) fn streams(&self) -> &[SeqChecker; N] {
        &self.streams
    }

    /// Pings sent and not yet answered.
    pub(crate) fn pings_out(&self) -> u8 {
        self.pings_out
    }

    /// The socket is connected: sends the subscribing request for `topic` (the first `topic=`
    /// of the query) and `extra` (appended to the query as it is: `&topic=..`, `&token=..`).
    pub(crate) fn handle_connected(
        &mut self,
        setup: &Setup<'_>,
        topic: &str,
        extra: &str,
        host: &mut impl Host,
    ) -> Result<(), LifeError> {
        if self.phase != Phase::Connecting {
            return Ok(());
        }
        let target = setup.target;
        let request = match setup.transport {
            Transport::Ws => {
                let key = base64::engine::general_purpose::STANDARD.encode(host.random());
                format!(
                    "GET /ws?topic={topic}{extra} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
                     Sec-WebSocket-Key: {key}\r\n\r\n"
                )
            }
            Transport::Sse => format!(
                "GET /sse?topic={topic}{extra} HTTP/1.1\r\nHost: {target}\r\nAccept: text/event-stream\r\n\r\n"
            ),
            // The first poll returns at once with a cursor; every later one resumes from the
            // last cursor, so nothing published between polls is missed.
            Transport::Poll => poll_request(topic, None, target),
        };
        self.phase = Phase::Head;
        host.transmit(request.as_bytes())
            .map_err(|kind| self.dies(LifeError::Send("request", kind)))
    }

    /// Bytes read from the server (plaintext). `topic` is the one given to
    /// [`Life::handle_connected`] (a long-poll asks again for it).
    pub(crate) fn handle_input(
        &mut self,
        setup: &Setup<'_>,
        topic: &str,
        input: &[u8],
        host: &mut impl Host,
    ) -> Result<(), LifeError> {
        if self.phase == Phase::Dead {
            return Ok(());
        }
        let result = if self.buf.is_empty() {
            // The usual case: parse where the worker read, keep only an incomplete tail.
            self.consume(setup, topic, input, host).map(|used| {
                if let Some(tail) = input.get(used..).filter(|t| !t.is_empty()) {
                    self.buf = tail.to_vec();
                }
            })
        } else {
            let mut buf = std::mem::take(&mut self.buf);
            buf.extend_from_slice(input);
            self.consume(setup, topic, &buf, host).map(|used| {
                buf.drain(..used.min(buf.len()));
                if !buf.is_empty() {
                    self.buf = buf;
                }
            })
        };
        result.map_err(|e| self.dies(e))
    }

    /// The server ended the stream: the error it counts as.
    pub(crate) fn handle_end(&mut self, setup: &Setup<'_>) -> LifeError {
        let handshake = self.phase == Phase::Head && setup.transport != Transport::Poll;
        self.dies(if handshake {
            LifeError::ClosedDuringHandshake
        } else {
            LifeError::ClosedByServer
        })
    }

    /// Something outside the protocol (connecting, reading, TLS) ended the connection.
    pub(crate) fn fail(&mut self) {
        self.phase = Phase::Dead;
        self.buf = Vec::new();
    }

    /// A masked Ping carrying `now_us` (its Pong gives the round trip without any state per
    /// Ping); once written, tell [`Life::ping_sent`].
    pub(crate) fn ping(now_us: u64, random: [u8; 16]) -> Vec<u8> {
        encode_client_frame(OpCode::Ping, &now_us.to_be_bytes(), mask(random))
    }

    /// A Ping from [`Life::ping`] was written.
    pub(crate) fn ping_sent(&mut self) {
        self.pings_out = self.pings_out.saturating_add(1);
    }

    fn dies(&mut self, e: LifeError) -> LifeError {
        self.fail();
        e
    }

    /// Handles every complete answer head, frame, event or poll answer at the start of
    /// `input`; returns the bytes used.
    fn consume(
        &mut self,
        setup: &Setup<'_>,
        topic: &str,
        input: &[u8],
        host: &mut impl Host,
    ) -> Result<usize, LifeError> {
        let mut at = 0;
        loop {
            let rest = input.get(at..).unwrap_or_default();
            let used = match (setup.transport, self.phase) {
                (Transport::Poll, _) => self.poll_answer(setup, topic, rest, host)?,
                (_, Phase::Head) => self.handshake_answer(setup, rest, host)?,
                (Transport::Ws, _) => self.ws_frame(setup, rest, host)?,
                (Transport::Sse, _) => self.sse_event(setup, rest, host),
            };
            match used {
                Some(n) => at += n,
                None => return Ok(at),
            }
        }
    }

    /// The answer to the subscribing request: `101` for WebSocket, `200` and a close-delimited
    /// stream for SSE. `None` until the head is complete.
    fn handshake_answer(
        &mut self,
        setup: &Setup<'_>,
        input: &[u8],
        host: &mut impl Host,
    ) -> Result<Option<usize>, LifeError> {
        let Some(head) = parse_response_head(input, MAX_HEADERS, MAX_HEAD)
            .map_err(|e| LifeError::BadAnswer(e.to_string()))?
        else {
            return Ok(None);
        };
        let ok = match setup.transport {
            Transport::Ws => 101,
            Transport::Sse | Transport::Poll => 200,
        };
        if head.status != ok {
            return Err(LifeError::Refused(head.status));
        }
        if setup.transport == Transport::Sse && head.body("GET") != Ok(ResponseBody::UntilClose) {
            return Err(LifeError::NotCloseDelimited);
        }
        self.phase = Phase::Open;
        host.event(Event::Answered);
        if let (Transport::Ws, Some(hello)) = (setup.transport, setup.hello) {
            let frame = masked(OpCode::Text, hello.as_bytes(), host.random());
            host.transmit(&frame)
                .map_err(|kind| LifeError::Send("hello", kind))?;
        }
        Ok(Some(head.head_len))
    }

    /// One WebSocket frame from the server; `None` until it is complete.
    fn ws_frame(
        &mut self,
        setup: &Setup<'_>,
        input: &[u8],
        host: &mut impl Host,
    ) -> Result<Option<usize>, LifeError> {
        let Some((step, total)) =
            wire::step(input, setup.max_frame).map_err(LifeError::BadFrame)?
        else {
            return Ok(None);
        };
        match step {
            // Centrifuge's JSON protocol pings with an empty object and wants one back.
            Step::Text(b"{}") if setup.payloads == Payloads::Peers => {
                let reply = masked(OpCode::Text, b"{}", host.random());
                let _ = host.transmit(&reply);
            }
            // Centrifuge sends several replies and pushes in one frame, one per line.
            Step::Text(payload)
                if setup.payloads == Payloads::Peers && payload.starts_with(b"{") =>
            {
                for line in payload.split(|&b| b == b'\n') {
                    self.note(setup, line, host);
                }
            }
            Step::Text(payload) | Step::Binary(payload) => self.note(setup, payload, host),
            Step::Closed => return Err(LifeError::ClosedByServer),
            // Unanswered, the server's idle timeout would close the connection. A pong that
            // cannot be written is not the end: the read that follows finds out.
            Step::Ping(payload) => {
                let pong = wire::pong(payload, mask(host.random()));
                let _ = host.transmit(&pong);
            }
            Step::Pong(payload) => {
                let sent_us = <[u8; 8]>::try_from(payload).ok().map(u64::from_be_bytes);
                self.pings_out = self.pings_out.saturating_sub(1);
                host.event(Event::Pong { sent_us });
            }
            Step::Nothing => {}
        }
        Ok(Some(total))
    }

    /// One event of an SSE stream (its `data:` lines); `None` until it is complete.
    fn sse_event(
        &mut self,
        setup: &Setup<'_>,
        input: &[u8],
        host: &mut impl Host,
    ) -> Option<usize> {
        let end = find(input, b"\n\n")?;
        for line in input.get(..end).unwrap_or_default().split(|&b| b == b'\n') {
            if let Some(data) = line.strip_prefix(b"data: ") {
                self.note(setup, data, host);
            }
        }
        Some(end + 2)
    }

    /// One complete long-poll answer, after which the next poll is sent; `None` until it is
    /// complete.
    fn poll_answer(
        &mut self,
        setup: &Setup<'_>,
        topic: &str,
        input: &[u8],
        host: &mut impl Host,
    ) -> Result<Option<usize>, LifeError> {
        let Some(head) = parse_response_head(input, MAX_HEADERS, MAX_HEAD)
            .map_err(|e| LifeError::BadAnswer(e.to_string()))?
        else {
            return Ok(None);
        };
        if head.status != 200 {
            return Err(LifeError::Refused(head.status));
        }
        let len = match head.body("GET") {
            Ok(ResponseBody::Length(n)) => {
                usize::try_from(n).map_err(|_| LifeError::PollTooLong)?
            }
            _ => return Err(LifeError::PollWithoutLength),
        };
        let total = head.head_len.saturating_add(len);
        let Some(body) = input.get(head.head_len..total) else {
            return Ok(None);
        };
        let parsed: PollBody =
            serde_json::from_slice(body).map_err(|e| LifeError::BadPoll(e.to_string()))?;
        for m in &parsed.messages {
            self.note(setup, m.data.as_bytes(), host);
        }
        self.phase = Phase::Open;
        host.transmit(poll_request(topic, Some(&parsed.cursor), setup.target).as_bytes())
            .map_err(|kind| LifeError::Send("poll", kind))?;
        Ok(Some(total))
    }

    /// Checks one benchmark payload (see [`Payloads`]); anything else is ignored.
    fn note(&mut self, setup: &Setup<'_>, payload: &[u8], host: &mut impl Host) {
        let parsed = match setup.payloads {
            Payloads::Peers => {
                let payload = centrifuge_unwrapped(socketio_unwrapped(payload));
                seq_and_time(payload.splitn(3, |&b| b == b' ')).map(|(seq, at)| (0, seq, at))
            }
            Payloads::Tagged => {
                let mut parts = payload.splitn(4, |&b| b == b' ');
                let stream = match parts.next() {
                    Some(b"b") => 0,
                    Some(b"c") => 1,
                    _ => return,
                };
                seq_and_time(parts).map(|(seq, at)| (stream, seq, at))
            }
        };
        let Some((stream, seq, published_us)) = parsed else {
            return;
        };
        if let Some(check) = self.streams.get_mut(stream) {
            report(check, stream, seq, published_us, host);
        }
    }
}

/// Checks message `seq` of stream `stream` (sent at `published_us`) and tells `host`.
pub(crate) fn report(
    check: &mut SeqChecker,
    stream: usize,
    seq: u64,
    published_us: u64,
    host: &mut impl Host,
) {
    let seen = check.see(seq);
    host.event(Event::Delivered {
        stream,
        seq,
        published_us,
        seen,
    });
}

/// The sequence number and publish time at the start of a payload's space-separated parts.
pub(crate) fn seq_and_time<'a>(mut parts: impl Iterator<Item = &'a [u8]>) -> Option<(u64, u64)> {
    let mut num = || {
        parts
            .next()
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u64>().ok())
    };
    Some((num()?, num()?))
}

fn poll_request(topic: &str, since: Option<&str>, target: SocketAddr) -> String {
    match since {
        None => format!("GET /poll?topic={topic}&timeout=0 HTTP/1.1\r\nHost: {target}\r\n\r\n"),
        Some(c) => format!(
            "GET /poll?topic={topic}&since={c}&timeout=30 HTTP/1.1\r\nHost: {target}\r\n\r\n"
        ),
    }
}

/// A long-poll answer: `{"messages":[{"data":..},..],"cursor":..}`.
#[derive(Deserialize)]
struct PollBody {
    messages: Vec<PollMessage>,
    cursor: String,
}

#[derive(Deserialize)]
struct PollMessage {
    data: String,
}

fn mask(random: [u8; 16]) -> [u8; 4] {
    [random[0], random[1], random[2], random[3]]
}

/// A masked client frame (control frames only: at most 125 payload bytes).
fn masked(opcode: OpCode, payload: &[u8], random: [u8; 16]) -> Vec<u8> {
    encode_client_frame(opcode, payload.get(..125).unwrap_or(payload), mask(random))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::ws::frame::{apply_mask, encode_frame, parse_header};

    /// A host in memory: what the life wrote and reported, with fixed randomness.
    #[derive(Default)]
    struct Recorder {
        sent: Vec<Vec<u8>>,
        events: Vec<Event>,
        /// Writes fail with this, when set.
        broken: Option<io::ErrorKind>,
    }

    impl Host for Recorder {
        fn random(&mut self) -> [u8; 16] {
            std::array::from_fn(|i| i as u8 + 1)
        }
        fn transmit(&mut self, bytes: &[u8]) -> Result<(), io::ErrorKind> {
            if let Some(kind) = self.broken {
                return Err(kind);
            }
            self.sent.push(bytes.to_vec());
            Ok(())
        }
        fn event(&mut self, event: Event) {
            self.events.push(event);
        }
    }

    /// The opcode and unmasked payload of a client frame the life wrote.
    fn client_frame(bytes: &[u8]) -> (OpCode, Vec<u8>) {
        let h = parse_header(bytes, true, 1 << 20).unwrap().unwrap();
        let mut payload = bytes[h.header_len..].to_vec();
        apply_mask(&mut payload, h.mask.unwrap(), 0);
        (h.opcode, payload)
    }

    fn setup(transport: Transport, payloads: Payloads) -> Setup<'static> {
        Setup {
            transport,
            target: "127.0.0.1:9".parse().unwrap(),
            payloads,
            max_frame: 1 << 20,
            hello: None,
        }
    }

    const UPGRADED: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    /// A life that has sent its request, and the host that saw it.
    fn connected<const N: usize>(setup: &Setup<'_>) -> (Life<N>, Recorder) {
        let mut life = Life::new(0);
        let mut host = Recorder::default();
        life.handle_connected(setup, "t", "", &mut host).unwrap();
        assert_eq!(life.phase(), Phase::Head);
        (life, host)
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
    fn the_requests_are_the_ones_the_workers_sent() {
        let mut host = Recorder::default();
        let ws = setup(Transport::Ws, Payloads::Tagged);
        let mut life = Life::<2>::new(3);
        life.handle_connected(&ws, "all", "&topic=room3", &mut host)
            .unwrap();
        let key = base64::engine::general_purpose::STANDARD.encode(host.random());
        assert_eq!(
            String::from_utf8(host.sent.pop().unwrap()).unwrap(),
            format!(
                "GET /ws?topic=all&topic=room3 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
            )
        );
        // Only once: a second readiness event before the answer sends nothing.
        life.handle_connected(&ws, "all", "", &mut host).unwrap();
        assert!(host.sent.is_empty());
        let mut life = Life::<1>::new(0);
        let sse = setup(Transport::Sse, Payloads::Peers);
        life.handle_connected(&sse, "t", "&token=x", &mut host)
            .unwrap();
        assert_eq!(
            host.sent.pop().unwrap(),
            b"GET /sse?topic=t&token=x HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAccept: text/event-stream\r\n\r\n"
        );
        let mut life = Life::<1>::new(0);
        let poll = setup(Transport::Poll, Payloads::Peers);
        life.handle_connected(&poll, "t", "", &mut host).unwrap();
        assert_eq!(
            host.sent.pop().unwrap(),
            b"GET /poll?topic=t&timeout=0 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"
        );
        // A request that cannot be written ends the life.
        let mut life = Life::<1>::new(0);
        host.broken = Some(io::ErrorKind::BrokenPipe);
        let e = life.handle_connected(&ws, "t", "", &mut host).unwrap_err();
        assert_eq!(e.to_string(), "send request: broken pipe");
        assert_eq!(life.phase(), Phase::Dead);
    }

    #[test]
    fn a_websocket_life_is_the_same_split_at_every_byte() {
        let s = setup(Transport::Ws, Payloads::Peers);
        let mut input = UPGRADED.to_vec();
        input.extend(encode_frame(OpCode::Text, b"0 5 a"));
        input.extend(encode_frame(OpCode::Ping, b"p"));
        input.extend(encode_frame(OpCode::Binary, &[b'x'; 300]));
        input.extend(encode_frame(OpCode::Text, b"1 5 b"));
        input.extend(encode_frame(OpCode::Binary, b"2 5 c"));
        let whole = {
            let (mut life, mut host) = connected::<1>(&s);
            life.handle_input(&s, "t", &input, &mut host).unwrap();
            assert_eq!(life.phase(), Phase::Open);
            assert!(life.streams()[0].finish(3).perfect());
            host
        };
        assert_eq!(
            whole.events,
            [
                Event::Answered,
                delivered(0, 0, Seen::InOrder),
                delivered(0, 1, Seen::InOrder),
                delivered(0, 2, Seen::InOrder)
            ]
        );
        // The request and a pong.
        assert_eq!(whole.sent.len(), 2);
        for cut in 0..=input.len() {
            let (mut life, mut host) = connected::<1>(&s);
            life.handle_input(&s, "t", &input[..cut], &mut host)
                .unwrap();
            life.handle_input(&s, "t", &input[cut..], &mut host)
                .unwrap();
            assert_eq!(host.events, whole.events, "cut at {cut}");
            assert_eq!(host.sent.len(), 2, "cut at {cut}");
            assert!(
                life.buf.is_empty() && life.buf.capacity() == 0,
                "cut at {cut}"
            );
        }
        // One byte at a time.
        let (mut life, mut host) = connected::<1>(&s);
        for b in &input {
            life.handle_input(&s, "t", std::slice::from_ref(b), &mut host)
                .unwrap();
        }
        assert_eq!(host.events, whole.events);
    }

    #[test]
    fn a_ping_gets_a_masked_pong_with_its_payload() {
        let s = setup(Transport::Ws, Payloads::Peers);
        let (mut life, mut host) = connected::<1>(&s);
        let mut input = UPGRADED.to_vec();
        input.extend(encode_frame(OpCode::Ping, b"are you there"));
        life.handle_input(&s, "t", &input, &mut host).unwrap();
        assert_eq!(
            client_frame(&host.sent[1]),
            (OpCode::Pong, b"are you there".to_vec())
        );
        // A pong that cannot be written does not end the life: the next read finds out.
        host.broken = Some(io::ErrorKind::BrokenPipe);
        let ping = encode_frame(OpCode::Ping, b"p");
        life.handle_input(&s, "t", &ping, &mut host).unwrap();
        assert_eq!(life.phase(), Phase::Open);
    }

    #[test]
    fn gaps_duplicates_and_late_messages_are_events() {
        let s = setup(Transport::Ws, Payloads::Peers);
        let (mut life, mut host) = connected::<1>(&s);
        let mut input = UPGRADED.to_vec();
        for seq in [0, 3, 3, 1, 4] {
            input.extend(encode_frame(OpCode::Text, format!("{seq} 5 x").as_bytes()));
        }
        life.handle_input(&s, "t", &input, &mut host).unwrap();
        assert_eq!(
            host.events[1..],
            [
                delivered(0, 0, Seen::InOrder),
                delivered(0, 3, Seen::AfterGap(2)),
                delivered(0, 3, Seen::Duplicate),
                delivered(0, 1, Seen::Reordered),
                delivered(0, 4, Seen::InOrder)
            ]
        );
        let v = life.streams()[0].finish(5);
        assert_eq!((v.missing, v.duplicated, v.reordered), (1, 1, 1));
    }

    #[test]
    fn a_close_or_the_end_of_stream_ends_the_life() {
        let s = setup(Transport::Ws, Payloads::Peers);
        let (mut life, mut host) = connected::<1>(&s);
        let mut input = UPGRADED.to_vec();
        input.extend(encode_frame(OpCode::Text, b"0 5 a"));
        input.extend(encode_frame(OpCode::Close, &[3, 232]));
        input.extend(encode_frame(OpCode::Text, b"1 5 a"));
        assert_eq!(
            life.handle_input(&s, "t", &input, &mut host),
            Err(LifeError::ClosedByServer)
        );
        assert_eq!(life.phase(), Phase::Dead);
        // What came before the close was counted, nothing after it.
        assert_eq!(life.streams()[0].received(), 1);
        // A dead life ignores what still comes in.
        let more = encode_frame(OpCode::Text, b"1 5 a");
        assert_eq!(life.handle_input(&s, "t", &more, &mut host), Ok(()));
        assert_eq!(life.streams()[0].received(), 1);
        // The end of the stream: during the handshake, or after it.
        let (mut life, _) = connected::<1>(&s);
        assert_eq!(life.handle_end(&s), LifeError::ClosedDuringHandshake);
        assert_eq!(life.phase(), Phase::Dead);
        let (mut life, mut host) = connected::<1>(&s);
        life.handle_input(&s, "t", UPGRADED, &mut host).unwrap();
        assert_eq!(life.handle_end(&s).to_string(), "closed by server");
    }

    #[test]
    fn refusals_and_garbage_are_clear_errors() {
        let s = setup(Transport::Ws, Payloads::Peers);
        let cases: [(&[u8], &str); 5] = [
            (
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
                "refused: HTTP 403",
            ),
            (b"\x16\x03\x01 not http at all\r\n\r\n", "bad answer"),
            (b"HTTP/1.1 101 OK\r\nNot a header\r\n\r\n", "bad answer"),
            // A masked frame and a reserved opcode are not what a server sends.
            (&[0x81, 0x81, 1, 2, 3, 4, 0], "bad frame: masked"),
            (&[0x83, 0x00], "bad frame"),
        ];
        for (input, error) in cases {
            let (mut life, mut host) = connected::<1>(&s);
            if !input.starts_with(b"HTTP") && !input.starts_with(b"\x16") {
                life.handle_input(&s, "t", UPGRADED, &mut host).unwrap();
            }
            let e = life.handle_input(&s, "t", input, &mut host).unwrap_err();
            assert!(e.to_string().starts_with(error), "{e} for {input:?}");
            assert_eq!(life.phase(), Phase::Dead);
        }
        // A frame longer than the limit is refused from its header, before it is buffered.
        let (mut life, mut host) = connected::<1>(&Setup {
            max_frame: 100,
            ..s
        });
        life.handle_input(&s, "t", UPGRADED, &mut host).unwrap();
        let big = encode_frame(OpCode::Binary, &[0; 200]);
        let small = Setup {
            max_frame: 100,
            ..s
        };
        assert!(life
            .handle_input(&small, "t", &big[..4], &mut host)
            .is_err());
        // An SSE answer must be close-delimited.
        let sse = setup(Transport::Sse, Payloads::Peers);
        let (mut life, mut host) = connected::<1>(&sse);
        let e = life
            .handle_input(
                &sse,
                "t",
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
                &mut host,
            )
            .unwrap_err();
        assert_eq!(e, LifeError::NotCloseDelimited);
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
        for transport in [Transport::Ws, Transport::Sse, Transport::Poll] {
            let s = setup(transport, Payloads::Peers);
            for round in 0..2_000 {
                let (mut life, mut host) = connected::<1>(&s);
                // Half the rounds get past the answer first, so frames and events see garbage.
                if round % 2 == 0 && transport == Transport::Ws {
                    life.handle_input(&s, "t", UPGRADED, &mut host).unwrap();
                }
                let len = (next() % 300) as usize;
                let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                for chunk in bytes.chunks(1 + (next() % 40) as usize) {
                    if life.handle_input(&s, "t", chunk, &mut host).is_err() {
                        assert_eq!(life.phase(), Phase::Dead);
                        break;
                    }
                }
            }
        }
    }

    #[test]
    fn a_centrifuge_session_greets_answers_pings_and_counts_pushes() {
        let s = Setup {
            hello: Some(r#"{"id":1,"connect":{}}"#),
            ..setup(Transport::Ws, Payloads::Peers)
        };
        let (mut life, mut host) = connected::<1>(&s);
        life.handle_input(&s, "t", UPGRADED, &mut host).unwrap();
        assert_eq!(
            client_frame(&host.sent[1]),
            (OpCode::Text, br#"{"id":1,"connect":{}}"#.to_vec())
        );
        // A connect reply and a push in one frame, then a push alone, then a ping.
        let mut input = encode_frame(
            OpCode::Text,
            b"{\"id\":1,\"connect\":{\"client\":\"c\"}}\n{\"push\":{\"channel\":\"t\",\"pub\":{\"data\":\"0 5 a\"}}}",
        );
        input.extend(encode_frame(
            OpCode::Text,
            br#"{"push":{"channel":"t","pub":{"data":"1 5 b","offset":2}}}"#,
        ));
        input.extend(encode_frame(OpCode::Text, b"{}"));
        input.extend(encode_frame(OpCode::Text, br#"42["m","2 5 c"]"#));
        life.handle_input(&s, "t", &input, &mut host).unwrap();
        assert!(life.streams()[0].finish(3).perfect());
        assert_eq!(client_frame(&host.sent[2]), (OpCode::Text, b"{}".to_vec()));
        // A greeting that cannot be written ends the life.
        let (mut life, mut host) = connected::<1>(&s);
        host.broken = Some(io::ErrorKind::ConnectionReset);
        let e = life.handle_input(&s, "t", UPGRADED, &mut host).unwrap_err();
        assert_eq!(e.to_string(), "send hello: connection reset");
    }

    #[test]
    fn sse_events_and_poll_answers() {
        let sse = setup(Transport::Sse, Payloads::Peers);
        let (mut life, mut host) = connected::<1>(&sse);
        let input =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n\
                    : hello\n\nid: 1\ndata: 0 5 a\n\ndata: 1 5";
        life.handle_input(&sse, "t", input, &mut host).unwrap();
        assert_eq!(life.streams()[0].received(), 1);
        assert_eq!(life.buf, b"data: 1 5");
        life.handle_input(&sse, "t", b" b\n\n", &mut host).unwrap();
        assert_eq!(life.streams()[0].received(), 2);
        assert!(life.buf.is_empty());

        let poll = setup(Transport::Poll, Payloads::Peers);
        let (mut life, mut host) = connected::<1>(&poll);
        let body = br#"{"messages":[{"data":"0 5 a"},{"data":"1 5 b"}],"cursor":"e-2"}"#;
        let mut answer =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        answer.extend_from_slice(body);
        let (last, first) = answer.split_last().unwrap();
        life.handle_input(&poll, "t", first, &mut host).unwrap();
        assert_eq!(
            host.sent.len(),
            1,
            "nothing is used until the body is complete"
        );
        life.handle_input(&poll, "t", &[*last], &mut host).unwrap();
        assert_eq!(life.streams()[0].received(), 2);
        assert_eq!(life.phase(), Phase::Open);
        assert_eq!(
            host.sent[1],
            b"GET /poll?topic=t&since=e-2&timeout=30 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"
        );
        let e = life
            .handle_input(
                &poll,
                "t",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                &mut host,
            )
            .unwrap_err();
        assert_eq!(e.to_string(), "poll answer without Content-Length");
        let (mut life, mut host) = connected::<1>(&poll);
        let e = life
            .handle_input(
                &poll,
                "t",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]",
                &mut host,
            )
            .unwrap_err();
        assert!(e.to_string().starts_with("bad poll answer"), "{e}");
    }

    #[test]
    fn tagged_streams_are_checked_apart_and_pongs_are_timed() {
        let s = setup(Transport::Ws, Payloads::Tagged);
        let (mut life, mut host) = connected::<2>(&s);
        life.ping_sent();
        life.ping_sent();
        let ping = Life::<2>::ping(7, host.random());
        assert_eq!(
            client_frame(&ping),
            (OpCode::Ping, 7u64.to_be_bytes().to_vec())
        );
        let mut input = UPGRADED.to_vec();
        for m in [
            "b 0 5 xx", "c 0 5 xx", "c 2 5 xx", "b 0 5 xx", "x 9 5 xx", "b zz 5",
        ] {
            input.extend(encode_frame(OpCode::Text, m.as_bytes()));
        }
        input.extend(encode_frame(OpCode::Pong, &7u64.to_be_bytes()));
        input.extend(encode_frame(OpCode::Pong, b"?"));
        life.handle_input(&s, "", &input, &mut host).unwrap();
        assert_eq!(
            host.events,
            [
                Event::Answered,
                delivered(0, 0, Seen::InOrder),
                delivered(1, 0, Seen::InOrder),
                delivered(1, 2, Seen::AfterGap(1)),
                delivered(0, 0, Seen::Duplicate),
                Event::Pong { sent_us: Some(7) },
                Event::Pong { sent_us: None },
            ]
        );
        assert_eq!(life.pings_out(), 0);
        let [all, chat] = life.streams();
        assert_eq!((all.received(), chat.received()), (1, 2));
    }
}
