//! One load-generating process of the million scenario ([`crate::million`]): a lean WebSocket
//! client for up to ~19,000 connections (under the 20,000 open-files limit of one process).
//!
//! Each connection follows two topics, the one every connection follows and its chat room, and
//! sends one WebSocket Ping per interval once told to start (the keep-alive load of the published
//! million-socket runs: every socket sends one message a minute and gets its answer). The Ping
//! carries its send time, so the Pong that echoes it gives the round trip without any state per
//! ping. Every delivery is checked per topic (missing, duplicated, reordered).
//!
//! Each connection's protocol is a [`Life`] with two streams (the topic all follow, the room);
//! this file is the process around them: sockets, TLS, the poll loop, the ping schedule and the
//! sums.
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

use mio::net::TcpStream;
use mio::{Events, Poll, Token, Waker};
use serde::{Deserialize, Serialize};

use crate::check::Verdict;
use crate::conn_life::{Event, Host, Life, LifeError, Payloads, Phase, Setup, Transport};
use crate::proc_stat::own_cpu_seconds;
use crate::source_ports::{self, SourcePorts};
use crate::stats::unix_micros;
use crate::stats::{Buckets, Latency};
use crate::tls_client::{TlsClient, TlsJob, TlsSetup};
use crate::wire::rand16;

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

/// One connection: a fixed-size record (the test below keeps it small); heap memory only for a
/// frame split across reads.
struct Conn {
    stream: TcpStream,
    /// The TLS client state, when the run is over TLS.
    tls: Option<TlsClient>,
    /// The protocol: stream 0 is the topic all follow, stream 1 the room (its topic number).
    life: Life<2>,
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
    let setup = Setup {
        transport: Transport::Ws,
        target: s.target,
        payloads: Payloads::Tagged,
        max_frame: MAX_FRAME,
        hello: None,
    };
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
            let before = c.life.phase();
            let result = drive(c, &s, &setup, (&mut read_buf, &mut plain), now_us, &mut m);
            if let Err(kind) = result {
                bump(&mut report.errors, kind);
                c.life.fail();
                let _ = poll.registry().deregister(&mut c.stream);
            }
            match (before, c.life.phase()) {
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
                if c.life.phase() != Phase::Open {
                    continue;
                }
                if c.life.pings_out() > 0 {
                    report.pongs_late += 1;
                }
                let frame = Life::<2>::ping(now_us, rand16());
                let written = match c.tls.as_mut() {
                    None => (&c.stream).write(&frame),
                    Some(t) => t.send(&c.stream, &frame).map(|()| frame.len()),
                };
                match written {
                    Ok(w) if w == frame.len() => {
                        c.life.ping_sent();
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
                    .map(|c| {
                        let [all, chat] = c.life.streams();
                        all.received() + chat.received()
                    })
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
                let [all, chat] = c.life.streams();
                c.life.phase() != Phase::Open
                    || (all.received() >= broadcasts
                        && chat.received() >= room_messages
                        && c.life.pings_out() == 0)
            });
            if done || Instant::now() >= deadline {
                for c in &conns {
                    let [all, chat] = c.life.streams();
                    report.broadcast.add(&all.finish(broadcasts));
                    report.chat.add(&chat.finish(room_messages));
                    report.pongs_missing += u64::from(c.life.pings_out());
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
        life: Life::new(room),
    })
}

/// Advances one connection; `Err(kind)` when it failed. `bufs`: the worker's read buffer, and
/// its buffer for the plaintext of a TLS read.
fn drive(
    c: &mut Conn,
    s: &Shape,
    setup: &Setup<'_>,
    (read_buf, plain): (&mut [u8], &mut Vec<u8>),
    now_us: u64,
    m: &mut Meters,
) -> Result<(), String> {
    let Conn { stream, tls, life } = c;
    let mut io = Io {
        stream,
        tls,
        now_us,
        m,
    };
    if life.phase() == Phase::Connecting {
        if !source_ports::connected(io.stream)? {
            return Ok(());
        }
        let room = format!("&topic={}{}", s.room_prefix, life.topic());
        life.handle_connected(setup, &s.all_topic, &room, &mut io)
            .map_err(|e| e.to_string())?;
    }
    // TLS records rustls could not write yet (the handshake, or a request behind it).
    if let Some(t) = io.tls.as_mut() {
        t.flush(io.stream)
            .map_err(|e| format!("write: {}", e.kind()))?;
    }
    loop {
        let n = match io.stream.read(read_buf) {
            Ok(0) => return Err(life.handle_end(setup).to_string()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read: {}", e.kind())),
        };
        let fresh = read_buf.get(..n).unwrap_or_default();
        let Some(t) = io.tls.as_mut() else {
            life.handle_input(setup, "", fresh, &mut io)
                .map_err(|e| e.to_string())?;
            continue;
        };
        plain.clear();
        let closed = t.receive(io.stream, fresh, plain)?;
        life.handle_input(setup, "", plain, &mut io)
            .map_err(|e| e.to_string())?;
        if closed {
            life.fail();
            return Err(LifeError::ClosedByServer.to_string());
        }
    }
}

/// What a connection's [`Life`] writes through and reports to: its socket, and the worker's
/// measurements.
struct Io<'a> {
    stream: &'a TcpStream,
    tls: &'a mut Option<TlsClient>,
    now_us: u64,
    m: &'a mut Meters,
}

impl Host for Io<'_> {
    fn random(&mut self) -> [u8; 16] {
        rand16()
    }

    fn transmit(&mut self, bytes: &[u8]) -> Result<(), io::ErrorKind> {
        crate::tls_client::send(self.stream, self.tls.as_mut(), bytes).map_err(|e| e.kind())
    }

    fn event(&mut self, event: Event) {
        match event {
            // Answered: the session tickets have been read, the lean record layer can take over.
            Event::Answered => {
                if let Some(t) = self.tls.as_mut() {
                    t.settle();
                }
            }
            Event::Delivered {
                stream,
                published_us,
                ..
            } => {
                let latency = self.now_us.saturating_sub(published_us);
                match stream {
                    0 => self.m.broadcast.record(latency),
                    _ => self.m.chat.record(latency),
                }
            }
            Event::Pong { sent_us } => {
                if let Some(sent) = sent_us {
                    self.m.rtt.record(self.now_us.saturating_sub(sent));
                }
                self.m.pongs += 1;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::ws::frame::encode_frame;
    use clarion_proto::ws::OpCode;

    #[test]
    fn a_connection_record_stays_small() {
        // A million connections on one machine: the client side must stay well under 1 KB of
        // user space per connection; the record is most of it (the epoll entry is kernel memory).
        // 184 bytes in a debug build (mio's stream carries a selector id there), 176 in release.
        let size = std::mem::size_of::<Conn>();
        println!("size_of::<million_worker::Conn>() = {size}");
        assert!(size <= 184, "{size}");
    }

    fn shape() -> Shape {
        Shape {
            target: "127.0.0.1:1".parse().unwrap(),
            source: "127.0.0.1".parse().unwrap(),
            first: 0,
            stride: 1,
            count: 1,
            rooms: 4,
            all_topic: "all".into(),
            room_prefix: "room".into(),
            connect_rate: 0,
            ping_interval_ms: 60_000,
            tls: None,
        }
    }

    #[test]
    fn both_topics_are_checked_apart_and_pongs_are_timed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.set_nonblocking(true).unwrap();
        let mut c = Conn {
            stream: TcpStream::from_std(client),
            tls: None,
            life: Life::new(3),
        };
        c.life.ping_sent();
        let s = shape();
        let setup = Setup {
            transport: Transport::Ws,
            target: s.target,
            payloads: Payloads::Tagged,
            max_frame: MAX_FRAME,
            hello: None,
        };
        let mut m = Meters::default();
        let mut input = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec();
        input.extend(encode_frame(OpCode::Text, b"b 0 5 xx"));
        input.extend(encode_frame(OpCode::Text, b"c 0 5 xx"));
        input.extend(encode_frame(OpCode::Text, b"c 2 5 xx"));
        input.extend(encode_frame(OpCode::Text, b"b 0 5 xx"));
        input.extend(encode_frame(OpCode::Pong, &7u64.to_be_bytes()));
        input.extend(encode_frame(OpCode::Ping, b"p"));
        server.write_all(&input).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let (mut buf, mut plain) = (vec![0u8; 4096], Vec::new());
        drive(&mut c, &s, &setup, (&mut buf, &mut plain), 10, &mut m).unwrap();
        assert_eq!(c.life.phase(), Phase::Open);
        let [all, chat] = c.life.streams();
        let b = all.finish(1);
        assert_eq!((b.in_order, b.duplicated, b.missing), (1, 1, 0));
        let ch = chat.finish(3);
        assert_eq!((ch.in_order, ch.missing), (2, 1));
        assert_eq!((m.pongs, c.life.pings_out()), (1, 0));
        assert_eq!(m.rtt.summary().max, 3);
        assert_eq!(m.broadcast.summary().count, 2);
        assert_eq!(m.chat.summary().count, 2);
        // The request followed both topics; the server's ping got a masked pong.
        let mut request = [0u8; 38];
        server.read_exact(&mut request).unwrap();
        assert_eq!(&request, b"GET /ws?topic=all&topic=room3 HTTP/1.1");
        let mut rest = vec![0u8; 4096];
        std::thread::sleep(Duration::from_millis(20));
        let n = server.read(&mut rest).unwrap();
        assert_eq!(rest[n - 7..n - 5], [0x8a, 0x81]);
        server
            .write_all(&encode_frame(OpCode::Close, &[3, 232]))
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let e = drive(&mut c, &s, &setup, (&mut buf, &mut plain), 10, &mut m).unwrap_err();
        assert_eq!(e, "closed by server");
    }

    #[test]
    fn commands_parse() {
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
