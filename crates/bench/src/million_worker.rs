//! One load-generating process of the million scenario ([`crate::million`]): a lean WebSocket
//! client for up to ~19,000 connections (under the 20,000 open-files limit of one process).
//!
//! Each connection follows two topics, the one every connection follows and its chat room, and
//! sends one WebSocket Ping per interval once told to start (the keep-alive load of the published
//! million-socket runs: every socket sends one message a minute and gets its answer). The Ping
//! carries its send time, so the Pong that echoes it gives the round trip without any state per
//! ping. Every delivery is checked per topic (missing, duplicated, reordered).
//!
//! Protocol with the coordinator, one JSON object per line: a [`Job`] in; [`Progress`] lines
//! out; [`Command::Start`] (begin pinging) and [`Command::Finish`] (how many messages were
//! published) in; a final [`Report`] out. The worker exits when its stdin closes, so a
//! coordinator that dies takes its workers with it.

use std::collections::HashMap;
use std::io::{self, BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use mio::net::TcpStream;
use mio::{Events, Poll, Token, Waker};
use serde::{Deserialize, Serialize};

use clarion_proto::http1::parse_response_head;
use clarion_proto::ws::frame::encode_client_frame;
use clarion_proto::ws::OpCode;

use crate::check::{SeqChecker, Verdict};
use crate::proc_stat::own_cpu_seconds;
use crate::source_ports::SourcePorts;
use crate::stats::unix_micros;
use crate::stats::{Buckets, Latency};
use crate::tls_client::{TlsClient, TlsJob, TlsSetup};
use crate::wire::{self, rand16, Step, MAX_HEAD, MAX_HEADERS};

/// The job line: a single `million` key tells it apart from an ordinary worker's job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// What this worker opens.
    pub million: Shape,
}

/// The connections of one worker: global indices `first + k * stride` for `k < count`;
/// connection `i` follows `all_topic` and room `i % rooms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shape {
    /// The server's client listener.
    pub target: SocketAddr,
    /// Local address to connect from (its own ephemeral ports).
    pub source: IpAddr,
    /// First global connection index.
    pub first: u64,
    /// Distance between this worker's global indices.
    pub stride: u64,
    /// Connections to open.
    pub count: u64,
    /// Chat rooms in all.
    pub rooms: u64,
    /// The topic every connection follows.
    pub all_topic: String,
    /// Room topics are this prefix and the room number.
    pub room_prefix: String,
    /// New connections per second for this worker (0: as fast as they complete).
    pub connect_rate: u32,
    /// Each connection sends one Ping per this many milliseconds once started.
    pub ping_interval_ms: u64,
    /// Connect over TLS, trusting this CA.
    #[serde(default)]
    pub tls: Option<TlsJob>,
}

/// A coordinator command.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Command {
    /// Begin the keep-alive pings.
    Start,
    /// Publishing is over: stop pinging, wait for the last deliveries and pongs, report.
    Finish {
        /// Messages published to the topic every connection follows.
        broadcasts: u64,
        /// Messages published to each room.
        room_messages: u64,
        /// Milliseconds to wait for stragglers.
        deadline_ms: u64,
    },
}

/// A progress line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Progress {
    /// Connections open.
    pub opened: u64,
    /// Messages received and checked (both topics).
    pub received: u64,
    /// Pongs received.
    pub pongs: u64,
    /// All connections attempted.
    pub ready: bool,
    /// This process's RSS before its first connection, bytes.
    pub rss_before: u64,
    /// This process's RSS now, bytes.
    pub rss: u64,
}

/// What a worker measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Connections that completed their handshake.
    pub opened: u64,
    /// Failed attempts and lost connections, by kind ("closed by server" among them).
    pub errors: HashMap<String, u64>,
    /// Verdicts of the topic every connection follows.
    pub broadcast: Verdict,
    /// Verdicts of the rooms.
    pub chat: Verdict,
    /// Publish-to-receive latency of broadcasts, microseconds.
    pub broadcast_latency: Buckets,
    /// Publish-to-receive latency of room messages, microseconds.
    pub chat_latency: Buckets,
    /// Ping-to-Pong round trips, microseconds.
    pub ping_rtt: Buckets,
    /// Pings sent.
    pub pings: u64,
    /// Pongs received for them.
    pub pongs: u64,
    /// Pings never answered by the end.
    pub pongs_missing: u64,
    /// Pings sent while the connection's previous one was still unanswered.
    pub pongs_late: u64,
    /// This process's CPU seconds.
    pub cpu_seconds: f64,
    /// RSS before the first connection and with all open, bytes.
    pub rss_before: u64,
    /// RSS once every connection was attempted.
    pub rss_open: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Head,
    Open,
    Dead,
}

/// One connection: a fixed-size record (the test below keeps it small); heap memory only for a
/// frame split across reads.
struct Conn {
    stream: TcpStream,
    /// The TLS client state, when the run is over TLS.
    tls: Option<TlsClient>,
    room: u32,
    phase: Phase,
    /// Pings sent and not yet answered.
    pings_out: u8,
    buf: Vec<u8>,
    all: SeqChecker,
    chat: SeqChecker,
}

const STDIN: Token = Token(usize::MAX - 1);
const MAX_IN_FLIGHT: u64 = 256;
const MAX_FRAME: u64 = 1 << 20;

/// Measurements shared by every connection of the worker.
#[derive(Default)]
struct Meters {
    broadcast: Latency,
    chat: Latency,
    rtt: Latency,
    pongs: u64,
}

/// Runs a million-scenario worker.
pub fn main(job: Job) -> anyhow::Result<()> {
    let s = job.million;
    let tls = s.tls.as_ref().map(TlsJob::setup).transpose()?;
    let rss_before = crate::proc_stat::rss_bytes(std::process::id()).unwrap_or(0);
    let mut poll = Poll::new()?;
    let waker = std::sync::Arc::new(Waker::new(poll.registry(), STDIN)?);
    let (tx, rx) = mpsc::channel::<Option<Command>>();
    {
        let waker = std::sync::Arc::clone(&waker);
        std::thread::spawn(move || {
            for line in io::stdin().lock().lines().map_while(Result::ok) {
                if let Ok(c) = serde_json::from_str::<Command>(&line) {
                    let _ = tx.send(Some(c));
                    let _ = waker.wake();
                }
            }
            // The coordinator is gone: so are we.
            let _ = tx.send(None);
            let _ = waker.wake();
        });
    }
    let mut conns: Vec<Conn> = Vec::with_capacity(usize::try_from(s.count)?);
    let mut report = Report {
        rss_before,
        ..Report::default()
    };
    let mut m = Meters::default();
    let mut events = Events::with_capacity(4096);
    let mut read_buf = vec![0u8; 64 * 1024];
    // Plaintext of one read over TLS, before it is parsed.
    let mut plain = Vec::with_capacity(64 * 1024);
    let started = Instant::now();
    let mut next_progress = Instant::now();
    let (mut planned, mut in_flight, mut opened) = (0u64, 0u64, 0u64);
    let mut ready = false;
    let mut pinging: Option<Instant> = None;
    let mut pings_due_sent = 0u64;
    let mut finish: Option<(u64, u64, Instant)> = None;
    let out = io::stdout();
    let mut ports = SourcePorts::new();
    loop {
        let allowed = if s.connect_rate == 0 {
            s.count
        } else {
            ((started.elapsed().as_secs_f64() * f64::from(s.connect_rate)) as u64 + 1).min(s.count)
        };
        while planned < allowed && in_flight < MAX_IN_FLIGHT {
            let i = s.first + planned * s.stride;
            planned += 1;
            let room = u32::try_from(i % s.rooms.max(1))?;
            match open(&s, &poll, &mut ports, conns.len(), room, tls.as_ref()) {
                Ok(c) => {
                    conns.push(c);
                    in_flight += 1;
                }
                Err(e) => bump(&mut report.errors, format!("connect: {}", e.kind())),
            }
        }
        poll.poll(&mut events, Some(Duration::from_millis(10)))?;
        let now_us = unix_micros();
        for ev in events.iter() {
            if ev.token() == STDIN {
                continue;
            }
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            let before = c.phase;
            let result = drive(c, &s, &mut read_buf, &mut plain, now_us, &mut m);
            if let Err(kind) = result {
                bump(&mut report.errors, kind);
                c.phase = Phase::Dead;
                let _ = poll.registry().deregister(&mut c.stream);
            }
            match (before, c.phase) {
                (Phase::Connecting | Phase::Head, Phase::Open) => {
                    in_flight -= 1;
                    opened += 1;
                }
                (Phase::Connecting | Phase::Head, Phase::Dead) => in_flight -= 1,
                (Phase::Open, Phase::Dead) => opened -= 1,
                _ => {}
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                None => return Ok(()),
                Some(Command::Start) => pinging = pinging.or(Some(Instant::now())),
                Some(Command::Finish {
                    broadcasts,
                    room_messages,
                    deadline_ms,
                }) => {
                    pinging = None;
                    let deadline = Instant::now() + Duration::from_millis(deadline_ms);
                    finish = Some((broadcasts, room_messages, deadline));
                }
            }
        }
        if !ready && planned == s.count && in_flight == 0 {
            ready = true;
            report.opened = opened;
            report.rss_open = crate::proc_stat::rss_bytes(std::process::id()).unwrap_or(0);
        }
        // Pings: once a second, the next n/60 connections (for a 60 s interval), so each
        // connection pings once per interval. A burst a second rather than one ping every
        // 60 µs: the server then answers many in one wake-up of each of its processes, as it
        // would for a real fleet whose pings are not spaced out by one clock (measured at a
        // million: pings spread evenly kept ~100 processes runnable on the 2 cores).
        if let Some(t0) = pinging {
            let n = conns.len() as u64;
            let second = t0.elapsed().as_secs() + 1;
            let due = (second * 1000 * n).div_ceil(s.ping_interval_ms.max(1)).min(
                // never more than one interval's worth ahead
                n * (1 + t0.elapsed().as_millis() as u64 / s.ping_interval_ms.max(1)),
            );
            while pings_due_sent < due && n > 0 {
                let k = (pings_due_sent % n) as usize;
                pings_due_sent += 1;
                let Some(c) = conns.get_mut(k) else { continue };
                if c.phase != Phase::Open {
                    continue;
                }
                if c.pings_out > 0 {
                    report.pongs_late += 1;
                }
                let frame = encode_client_frame(OpCode::Ping, &now_us.to_be_bytes(), mask());
                let written = match c.tls.as_mut() {
                    None => (&c.stream).write(&frame),
                    Some(t) => t.send(&c.stream, &frame).map(|()| frame.len()),
                };
                match written {
                    Ok(w) if w == frame.len() => {
                        c.pings_out = c.pings_out.saturating_add(1);
                        report.pings += 1;
                    }
                    // An idle socket's send buffer is empty: a short write means the server
                    // stopped reading, which is worth knowing, not hiding.
                    _ => bump(&mut report.errors, "ping not written".into()),
                }
            }
        }
        if Instant::now() >= next_progress {
            next_progress = Instant::now() + Duration::from_secs(1);
            // Like the server's sweep: keys expanded for a message are dropped a second later.
            for t in conns.iter_mut().filter_map(|c| c.tls.as_mut()) {
                t.compact();
            }
            let p = Progress {
                opened,
                received: conns
                    .iter()
                    .map(|c| c.all.received() + c.chat.received())
                    .sum(),
                pongs: m.pongs,
                ready,
                rss_before,
                rss: crate::proc_stat::rss_bytes(std::process::id()).unwrap_or(0),
            };
            let mut o = out.lock();
            writeln!(o, "{}", serde_json::to_string(&p)?)?;
            o.flush()?;
        }
        if let Some((broadcasts, room_messages, deadline)) = finish {
            let done = conns.iter().all(|c| {
                c.phase != Phase::Open
                    || (c.all.received() >= broadcasts
                        && c.chat.received() >= room_messages
                        && c.pings_out == 0)
            });
            if done || Instant::now() >= deadline {
                for c in &conns {
                    report.broadcast.add(&c.all.finish(broadcasts));
                    report.chat.add(&c.chat.finish(room_messages));
                    report.pongs_missing += u64::from(c.pings_out);
                }
                let never = s.count.saturating_sub(conns.len() as u64);
                report.broadcast.missing += never * broadcasts;
                report.chat.missing += never * room_messages;
                report.opened = report.opened.max(opened);
                report.pongs = m.pongs;
                report.broadcast_latency = m.broadcast.buckets();
                report.chat_latency = m.chat.buckets();
                report.ping_rtt = m.rtt.buckets();
                report.cpu_seconds = own_cpu_seconds();
                let mut o = out.lock();
                writeln!(o, "{}", serde_json::to_string(&report)?)?;
                o.flush()?;
                return Ok(());
            }
        }
    }
}

fn bump(errors: &mut HashMap<String, u64>, kind: String) {
    *errors.entry(kind).or_default() += 1;
}

/// Opens connection `index` from the worker's source address.
fn open(
    s: &Shape,
    poll: &Poll,
    ports: &mut SourcePorts,
    index: usize,
    room: u32,
    tls: Option<&TlsSetup>,
) -> io::Result<Conn> {
    Ok(Conn {
        stream: ports.connect(s.source, s.target, poll, index)?,
        tls: tls.map(TlsClient::new).transpose()?,
        room,
        phase: Phase::Connecting,
        pings_out: 0,
        buf: Vec::new(),
        all: SeqChecker::default(),
        chat: SeqChecker::default(),
    })
}

/// Advances one connection; `Err(kind)` when it failed.
fn drive(
    c: &mut Conn,
    s: &Shape,
    read_buf: &mut [u8],
    plain: &mut Vec<u8>,
    now_us: u64,
    m: &mut Meters,
) -> Result<(), String> {
    if c.phase == Phase::Connecting {
        match c.stream.take_error() {
            Ok(Some(e)) | Err(e) => return Err(format!("connect: {}", e.kind())),
            Ok(None) => {}
        }
        if c.stream.peer_addr().is_err() {
            return Ok(()); // not connected yet
        }
        let key = base64::engine::general_purpose::STANDARD.encode(rand16());
        let request = format!(
            "GET /ws?topic={}&topic={}{} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n",
            s.all_topic, s.room_prefix, c.room, s.target
        );
        send(c, request.as_bytes()).map_err(|e| format!("send request: {}", e.kind()))?;
        c.phase = Phase::Head;
    }
    // TLS records rustls could not write yet (the handshake, or a request behind it).
    if let Some(t) = c.tls.as_mut() {
        t.flush(&c.stream)
            .map_err(|e| format!("write: {}", e.kind()))?;
    }
    loop {
        let n = match (&c.stream).read(read_buf) {
            Ok(0) => {
                return Err(if c.phase == Phase::Head {
                    "closed during handshake".into()
                } else {
                    "closed by server".into()
                })
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read: {}", e.kind())),
        };
        let fresh = read_buf.get(..n).unwrap_or_default();
        match c.tls.as_mut() {
            None => feed(c, fresh, now_us, m)?,
            Some(t) => {
                plain.clear();
                let closed = t.receive(&c.stream, fresh, plain)?;
                feed(c, plain, now_us, m)?;
                if closed {
                    return Err("closed by server".into());
                }
            }
        }
    }
}

/// Parses `fresh` input after whatever an earlier read left incomplete.
fn feed(c: &mut Conn, fresh: &[u8], now_us: u64, m: &mut Meters) -> Result<(), String> {
    if c.buf.is_empty() {
        // The usual case: parse in the shared buffer, keep only an incomplete tail.
        let used = consume(c, fresh, now_us, m)?;
        if let Some(tail) = fresh.get(used..).filter(|t| !t.is_empty()) {
            c.buf = tail.to_vec();
        }
    } else {
        let mut buf = std::mem::take(&mut c.buf);
        buf.extend_from_slice(fresh);
        let used = consume(c, &buf, now_us, m)?;
        buf.drain(..used.min(buf.len()));
        if !buf.is_empty() {
            c.buf = buf;
        }
    }
    Ok(())
}

/// Writes `bytes` (through TLS when the connection has it). Requests, pongs and pings are small
/// and an idle socket's buffer empty, so a plain write completes.
fn send(c: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    match c.tls.as_mut() {
        None => (&c.stream).write_all(bytes),
        Some(t) => t.send(&c.stream, bytes),
    }
}

/// Handles every complete answer head or frame at the start of `input`; returns the bytes used.
fn consume(c: &mut Conn, input: &[u8], now_us: u64, m: &mut Meters) -> Result<usize, String> {
    let mut at = 0;
    loop {
        let rest = input.get(at..).unwrap_or_default();
        let used = if c.phase == Phase::Head {
            let Some(head) = parse_response_head(rest, MAX_HEADERS, MAX_HEAD)
                .map_err(|e| format!("bad answer: {e}"))?
            else {
                return Ok(at);
            };
            if head.status != 101 {
                return Err(format!("refused: HTTP {}", head.status));
            }
            c.phase = Phase::Open;
            // Answered: the session tickets have been read, the lean record layer can take over.
            if let Some(t) = c.tls.as_mut() {
                t.settle();
            }
            head.head_len
        } else {
            match frame(c, rest, now_us, m)? {
                Some(n) => n,
                None => return Ok(at),
            }
        };
        at += used;
    }
}

/// One server frame; `None` until it is complete.
fn frame(c: &mut Conn, input: &[u8], now_us: u64, m: &mut Meters) -> Result<Option<usize>, String> {
    let Some((step, total)) = wire::step(input, MAX_FRAME)? else {
        return Ok(None);
    };
    match step {
        Step::Text(payload) | Step::Binary(payload) => note(c, payload, now_us, m),
        Step::Closed => return Err("closed by server".into()),
        Step::Ping(payload) => {
            let _ = send(c, &wire::pong(payload, mask()));
        }
        Step::Pong(payload) => {
            if let Ok(sent) = <[u8; 8]>::try_from(payload) {
                m.rtt
                    .record(now_us.saturating_sub(u64::from_be_bytes(sent)));
            }
            c.pings_out = c.pings_out.saturating_sub(1);
            m.pongs += 1;
        }
        Step::Nothing => {}
    }
    Ok(Some(total))
}

/// A payload is `b SEQ PUBLISH_MICROS ...` (the topic all follow) or `c SEQ PUBLISH_MICROS ...`
/// (the connection's room).
fn note(c: &mut Conn, payload: &[u8], now_us: u64, m: &mut Meters) {
    let mut parts = payload.splitn(4, |&b| b == b' ');
    let kind = parts.next();
    let num = |p: Option<&[u8]>| {
        p.and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u64>().ok())
    };
    let (Some(seq), Some(ts)) = (num(parts.next()), num(parts.next())) else {
        return;
    };
    let lat = now_us.saturating_sub(ts);
    match kind {
        Some(b"b") => {
            c.all.see(seq);
            m.broadcast.record(lat);
        }
        Some(b"c") => {
            c.chat.see(seq);
            m.chat.record(lat);
        }
        _ => {}
    }
}

fn mask() -> [u8; 4] {
    let r = rand16();
    [r[0], r[1], r[2], r[3]]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::ws::frame::encode_frame;

    #[test]
    fn a_connection_record_stays_small() {
        // A million connections on one machine: the client side must stay well under 1 KB of
        // user space per connection; the record is most of it (the epoll entry is kernel memory).
        let size = std::mem::size_of::<Conn>();
        println!("size_of::<million_worker::Conn>() = {size}");
        assert!(size <= 192, "{size}");
    }

    fn conn() -> (Conn, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let c = Conn {
            stream: TcpStream::from_std(client),
            tls: None,
            room: 3,
            phase: Phase::Head,
            pings_out: 1,
            buf: Vec::new(),
            all: SeqChecker::default(),
            chat: SeqChecker::default(),
        };
        (c, server)
    }

    #[test]
    fn both_topics_are_checked_apart_and_pongs_are_timed() {
        let (mut c, mut server) = conn();
        let mut m = Meters::default();
        let mut input = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec();
        input.extend(encode_frame(OpCode::Text, b"b 0 5 xx"));
        input.extend(encode_frame(OpCode::Text, b"c 0 5 xx"));
        input.extend(encode_frame(OpCode::Text, b"c 2 5 xx"));
        input.extend(encode_frame(OpCode::Text, b"b 0 5 xx"));
        input.extend(encode_frame(OpCode::Pong, &7u64.to_be_bytes()));
        input.extend(encode_frame(OpCode::Ping, b"p"));
        let split = input.len() - 1;
        let used = consume(&mut c, &input[..split], 10, &mut m).unwrap();
        assert!(c.phase == Phase::Open);
        let mut rest = input[used..split].to_vec();
        rest.extend_from_slice(&input[split..]);
        assert_eq!(consume(&mut c, &rest, 10, &mut m).unwrap(), rest.len());
        let b = c.all.finish(1);
        assert_eq!((b.in_order, b.duplicated, b.missing), (1, 1, 0));
        let ch = c.chat.finish(3);
        assert_eq!((ch.in_order, ch.missing), (2, 1));
        assert_eq!((m.pongs, c.pings_out), (1, 0));
        assert_eq!(m.rtt.summary().max, 3);
        assert_eq!(m.broadcast.summary().count, 2);
        // The server's ping got a masked pong.
        let mut pong = [0u8; 7];
        server.read_exact(&mut pong).unwrap();
        assert_eq!(pong[..2], [0x8a, 0x81]);
        let close = encode_frame(OpCode::Close, &[3, 232]);
        assert_eq!(
            consume(&mut c, &close, 10, &mut m).unwrap_err(),
            "closed by server"
        );
    }

    #[test]
    fn refused_upgrades_and_commands_parse() {
        let (mut c, _server) = conn();
        let mut m = Meters::default();
        let refused = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            consume(&mut c, refused, 1, &mut m).unwrap_err(),
            "refused: HTTP 503"
        );
        let f: Command = serde_json::from_str(
            r#"{"cmd":"finish","broadcasts":2,"room_messages":3,"deadline_ms":9}"#,
        )
        .unwrap();
        assert!(matches!(
            f,
            Command::Finish {
                room_messages: 3,
                ..
            }
        ));
        assert!(serde_json::from_str::<Job>(r#"{"target":"127.0.0.1:1"}"#).is_err());
    }
}
