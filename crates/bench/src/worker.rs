//! One load-generating process: opens its share of the connections from one source address,
//! reads everything they receive, checks every delivery and measures latency.
//!
//! It talks to the coordinator over stdin/stdout, one JSON object per line: a [`Job`] in, then
//! progress lines and a final [`Report`] out; a [`Finish`] on stdin says how many messages each
//! topic got, and the worker reports once every connection has them (or a deadline passes).

use std::collections::HashMap;
use std::io::{self, BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use serde::{Deserialize, Serialize};

use crate::check::{SeqChecker, Verdict};
use crate::stats::{Buckets, Clumps, Latency};

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

/// What one worker does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// The server's client listener.
    pub target: SocketAddr,
    /// Local address to connect from.
    pub source: IpAddr,
    /// Transport.
    pub transport: Transport,
    /// The topic of each connection.
    pub topics: Vec<String>,
    /// New connections per second for this worker (0: as fast as they complete).
    pub connect_rate: u32,
    /// Interval of a steady feed in microseconds, for clump detection (0: none).
    pub interval_us: u64,
    /// Connect over TLS, trusting this CA.
    #[serde(default)]
    pub tls: Option<TlsJob>,
}

/// TLS for every connection of a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TlsJob {
    /// PEM certificates to trust.
    pub ca_pem: String,
    /// The name to ask for (SNI) and verify.
    pub server_name: String,
}

impl TlsJob {
    fn client_config(&self) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert?)?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(std::sync::Arc::new(config))
    }
}

/// The coordinator's last word: messages published per topic, and how long to wait for them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finish {
    /// Messages published to each topic.
    pub published: HashMap<String, u64>,
    /// Milliseconds to wait for stragglers.
    pub deadline_ms: u64,
}

/// What a worker measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Connections that completed their handshake.
    pub opened: u64,
    /// Failed connection attempts and lost connections, by kind.
    pub errors: HashMap<String, u64>,
    /// Delivery verdicts summed over connections.
    pub verdict: Verdict,
    /// Publish-to-receive latency.
    pub latency: Buckets,
    /// Messages that arrived bunched behind another (steady feeds only).
    pub clumped: u64,
    /// Seconds to open all connections.
    pub connect_seconds: f64,
    /// This process's CPU time (user + system), seconds.
    pub cpu_seconds: f64,
}

/// A progress line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    /// Connections open.
    pub opened: u64,
    /// Messages received and checked.
    pub received: u64,
    /// All connections attempted.
    pub ready: bool,
}

enum Phase {
    Connecting,
    Head,
    Open,
    Dead,
}

struct Conn {
    stream: TcpStream,
    /// The TLS client state, when the job is over TLS.
    tls: Option<Box<rustls::ClientConnection>>,
    topic: u32,
    phase: Phase,
    buf: Vec<u8>,
    check: SeqChecker,
    clumps: Clumps,
}

const STDIN: Token = Token(usize::MAX - 1);

/// Most handshakes one worker has in flight at once.
const MAX_IN_FLIGHT: usize = 256;

/// Runs a worker: the job comes as the first line of stdin.
pub fn main() -> anyhow::Result<()> {
    let stdin = io::stdin();
    let mut first = String::new();
    stdin.lock().read_line(&mut first)?;
    let job: Job = serde_json::from_str(&first)?;
    let tls = match &job.tls {
        Some(t) => Some((
            t.client_config()?,
            rustls::pki_types::ServerName::try_from(t.server_name.clone())?,
        )),
        None => None,
    };
    let mut poll = Poll::new()?;
    let waker = std::sync::Arc::new(Waker::new(poll.registry(), STDIN)?);
    let (tx, rx) = mpsc::channel::<Finish>();
    {
        let waker = std::sync::Arc::clone(&waker);
        std::thread::spawn(move || {
            for line in io::stdin().lock().lines().map_while(Result::ok) {
                if let Ok(f) = serde_json::from_str::<Finish>(&line) {
                    let _ = tx.send(f);
                    let _ = waker.wake();
                }
            }
        });
    }
    let mut topic_ids: HashMap<String, u32> = HashMap::new();
    let mut topic_names: Vec<String> = Vec::new();
    let plan: Vec<u32> = job
        .topics
        .iter()
        .map(|t| {
            let next = topic_names.len() as u32;
            *topic_ids.entry(t.clone()).or_insert_with(|| {
                topic_names.push(t.clone());
                next
            })
        })
        .collect();
    let mut conns: Vec<Conn> = Vec::with_capacity(plan.len());
    let mut report = Report::default();
    let mut latency = Latency::default();
    let mut events = Events::with_capacity(4096);
    let mut read_buf = vec![0u8; 64 * 1024];
    let started = Instant::now();
    let mut next_progress = Instant::now();
    let mut finish: Option<(Finish, Instant)> = None;
    let mut ready_sent = false;
    // Plan entries tried so far, and the topics of those that could not even get a socket.
    let mut planned = 0usize;
    let mut never_opened: Vec<u32> = Vec::new();
    let out = io::stdout();
    loop {
        // Open more connections, at the configured rate.
        let allowed = if job.connect_rate == 0 {
            plan.len()
        } else {
            ((started.elapsed().as_secs_f64() * f64::from(job.connect_rate)) as usize + 1)
                .min(plan.len())
        };
        // Handshakes in flight are capped, as a real client fleet's would be spread out: a
        // server is entitled to refuse a storm of simultaneous handshakes (Clarion's
        // `max_handshakes`).
        let mut in_flight = conns
            .iter()
            .filter(|c| matches!(c.phase, Phase::Connecting | Phase::Head))
            .count();
        while planned < allowed && in_flight < MAX_IN_FLIGHT {
            in_flight += 1;
            let topic = plan.get(planned).copied().unwrap_or(0);
            planned += 1;
            match open(&job, &poll, conns.len(), topic, tls.as_ref()) {
                Ok(c) => conns.push(c),
                Err(e) => {
                    *report
                        .errors
                        .entry(format!("connect: {}", e.kind()))
                        .or_default() += 1;
                    never_opened.push(topic);
                }
            }
            if job.connect_rate != 0 {
                break;
            }
        }
        poll.poll(&mut events, Some(Duration::from_millis(100)))?;
        let now_us = unix_micros();
        for ev in events.iter() {
            if ev.token() == STDIN {
                if let Ok(f) = rx.try_recv() {
                    let deadline = Instant::now() + Duration::from_millis(f.deadline_ms);
                    finish = Some((f, deadline));
                }
                continue;
            }
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            if let Err(kind) = drive(c, &job, &topic_names, &mut read_buf, now_us, &mut latency) {
                *report.errors.entry(kind).or_default() += 1;
                c.phase = Phase::Dead;
                let _ = poll.registry().deregister(&mut c.stream);
            }
        }
        let opened = conns
            .iter()
            .filter(|c| matches!(c.phase, Phase::Open))
            .count() as u64;
        let attempted = planned == plan.len()
            && !conns
                .iter()
                .any(|c| matches!(c.phase, Phase::Connecting | Phase::Head));
        if attempted && !ready_sent {
            ready_sent = true;
            report.opened = opened;
            report.connect_seconds = started.elapsed().as_secs_f64();
        }
        if Instant::now() >= next_progress || (attempted && !ready_sent) {
            next_progress = Instant::now() + Duration::from_secs(1);
            let received = conns.iter().map(|c| c.check.received()).sum();
            let p = Progress {
                opened,
                received,
                ready: ready_sent,
            };
            let mut o = out.lock();
            writeln!(o, "{}", serde_json::to_string(&p)?)?;
            o.flush()?;
        }
        if let Some((f, deadline)) = &finish {
            let all = conns.iter().all(|c| {
                !matches!(c.phase, Phase::Open)
                    || c.check.received()
                        >= topic_names
                            .get(c.topic as usize)
                            .and_then(|t| f.published.get(t))
                            .copied()
                            .unwrap_or(0)
            });
            if all || Instant::now() >= *deadline {
                for c in &conns {
                    let expected = topic_names
                        .get(c.topic as usize)
                        .and_then(|t| f.published.get(t))
                        .copied()
                        .unwrap_or(0);
                    if !matches!(c.phase, Phase::Dead) || c.check.received() > 0 {
                        report.verdict.add(&c.check.finish(expected));
                    } else {
                        report.verdict.missing += expected;
                    }
                    report.clumped += c.clumps.clumped;
                }
                for t in &never_opened {
                    report.verdict.missing += topic_names
                        .get(*t as usize)
                        .and_then(|t| f.published.get(t))
                        .copied()
                        .unwrap_or(0);
                }
                report.opened = report.opened.max(opened);
                report.latency = latency.buckets();
                report.cpu_seconds = own_cpu_seconds();
                let mut o = out.lock();
                writeln!(o, "{}", serde_json::to_string(&report)?)?;
                o.flush()?;
                return Ok(());
            }
        }
    }
}

/// The TLS setup shared by a worker's connections.
type TlsSetup = (
    std::sync::Arc<rustls::ClientConfig>,
    rustls::pki_types::ServerName<'static>,
);

fn open(
    job: &Job,
    poll: &Poll,
    index: usize,
    topic: u32,
    tls: Option<&TlsSetup>,
) -> io::Result<Conn> {
    let tls = match tls {
        Some((config, name)) => Some(Box::new(
            rustls::ClientConnection::new(std::sync::Arc::clone(config), name.clone())
                .map_err(io::Error::other)?,
        )),
        None => None,
    };
    let domain = socket2::Domain::for_address(job.target);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::new(job.source, 0).into())?;
    match s.connect(&job.target.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(115) => {} // EINPROGRESS
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    let _ = s.set_nodelay(true);
    let mut stream = TcpStream::from_std(s.into());
    poll.registry().register(
        &mut stream,
        Token(index),
        Interest::READABLE | Interest::WRITABLE,
    )?;
    Ok(Conn {
        stream,
        tls,
        topic,
        phase: Phase::Connecting,
        buf: Vec::new(),
        check: SeqChecker::default(),
        clumps: Clumps::default(),
    })
}

/// Advances one connection; `Err(kind)` when it failed.
fn drive(
    c: &mut Conn,
    job: &Job,
    topics: &[String],
    read_buf: &mut [u8],
    now_us: u64,
    latency: &mut Latency,
) -> Result<(), String> {
    if matches!(c.phase, Phase::Connecting) {
        match c.stream.take_error() {
            Ok(Some(e)) | Err(e) => return Err(format!("connect: {}", e.kind())),
            Ok(None) => {}
        }
        if c.stream.peer_addr().is_err() {
            return Ok(()); // not connected yet
        }
        let topic = topics.get(c.topic as usize).map_or("", String::as_str);
        let request = match job.transport {
            Transport::Ws => {
                let key = base64::engine::general_purpose::STANDARD.encode(rand16());
                format!(
                    "GET /ws?topic={topic} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
                     Sec-WebSocket-Key: {key}\r\n\r\n",
                    job.target
                )
            }
            Transport::Sse => format!(
                "GET /sse?topic={topic} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
                job.target
            ),
            // The first poll returns at once with a cursor; every later one resumes from the
            // last cursor, so nothing published between polls is missed.
            Transport::Poll => poll_request(topic, None, job.target),
        };
        send(c, request.as_bytes()).map_err(|e| format!("send request: {}", e.kind()))?;
        c.phase = Phase::Head;
    }
    // TLS records rustls could not write yet (the handshake, or a request behind it).
    flush_tls(c).map_err(|e| format!("write: {}", e.kind()))?;
    let mut eof = false;
    loop {
        match (&c.stream).read(read_buf) {
            Ok(0) => {
                eof = true;
                break;
            }
            Ok(n) => {
                let fresh = read_buf.get(..n).unwrap_or_default();
                match c.tls.as_mut() {
                    None => c.buf.extend_from_slice(fresh),
                    Some(t) => {
                        let mut rest = fresh;
                        while !rest.is_empty() {
                            t.read_tls(&mut rest)
                                .map_err(|e| format!("tls read: {}", e.kind()))?;
                            t.process_new_packets().map_err(|e| format!("tls: {e}"))?;
                            match t.reader().read_to_end(&mut c.buf) {
                                Ok(_) => {}
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                                    eof = true;
                                }
                                Err(e) => return Err(format!("tls read: {}", e.kind())),
                            }
                        }
                        flush_tls(c).map_err(|e| format!("write: {}", e.kind()))?;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read: {}", e.kind())),
        }
    }
    if job.transport == Transport::Poll {
        let topic = topics.get(c.topic as usize).map_or("", String::as_str);
        poll_responses(c, topic, job.target, now_us, latency, job.interval_us)?;
        if eof {
            return Err("closed by server".into());
        }
        return Ok(());
    }
    if matches!(c.phase, Phase::Head) {
        let Some(end) = find(&c.buf, b"\r\n\r\n") else {
            return if eof {
                Err("closed during handshake".into())
            } else {
                Ok(())
            };
        };
        let ok: &[u8] = match job.transport {
            Transport::Ws => b"HTTP/1.1 101",
            Transport::Sse | Transport::Poll => b"HTTP/1.1 200",
        };
        if !c.buf.starts_with(ok) {
            let status = String::from_utf8_lossy(c.buf.get(9..12).unwrap_or_default()).into_owned();
            return Err(format!("refused: HTTP {status}"));
        }
        c.buf.drain(..end + 4);
        c.phase = Phase::Open;
    }
    match job.transport {
        Transport::Ws => ws_messages(c, now_us, latency, job.interval_us)?,
        Transport::Sse | Transport::Poll => sse_messages(c, now_us, latency, job.interval_us),
    }
    if eof {
        return Err("closed by server".into());
    }
    Ok(())
}

fn ws_messages(
    c: &mut Conn,
    now_us: u64,
    latency: &mut Latency,
    interval: u64,
) -> Result<(), String> {
    let mut buf = std::mem::take(&mut c.buf);
    let mut at = 0;
    let mut closed = false;
    loop {
        let rest = buf.get(at..).unwrap_or_default();
        let (b0, b1) = match rest {
            [b0, b1, ..] => (*b0, *b1),
            _ => break,
        };
        let tail = rest.get(2..).unwrap_or_default();
        let (len, hdr) = match b1 & 0x7f {
            126 => match tail.get(..2) {
                Some(&[a, b]) => (u64::from(u16::from_be_bytes([a, b])), 4),
                _ => break,
            },
            127 => match tail.get(..8).and_then(|s| <[u8; 8]>::try_from(s).ok()) {
                Some(b) => (u64::from_be_bytes(b), 10),
                None => break,
            },
            n => (u64::from(n), 2),
        };
        let total = hdr + len as usize;
        let Some(payload) = rest.get(hdr..total) else {
            break;
        };
        match b0 & 0x0f {
            1 | 2 => note(c, payload, now_us, latency, interval),
            8 => {
                closed = true;
                break;
            }
            9 => {
                // Answer pings, or the server's idle timeout closes us.
                let pong = masked(10, payload);
                let _ = send(c, &pong);
            }
            _ => {}
        }
        at += total;
    }
    buf.drain(..at.min(buf.len()));
    c.buf = buf;
    if closed {
        return Err("closed by server".into());
    }
    Ok(())
}

fn sse_messages(c: &mut Conn, now_us: u64, latency: &mut Latency, interval: u64) {
    let mut at = 0;
    while let Some(end) = find(c.buf.get(at..).unwrap_or_default(), b"\n\n") {
        let block = c.buf.get(at..at + end).unwrap_or_default().to_vec();
        for line in block.split(|&b| b == b'\n') {
            if let Some(data) = line.strip_prefix(b"data: ") {
                note(c, data, now_us, latency, interval);
            }
        }
        at += end + 2;
    }
    c.buf.drain(..at.min(c.buf.len()));
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

/// Handles every complete long-poll answer in the buffer, sending the next poll after each.
fn poll_responses(
    c: &mut Conn,
    topic: &str,
    target: SocketAddr,
    now_us: u64,
    latency: &mut Latency,
    interval: u64,
) -> Result<(), String> {
    loop {
        let Some(end) = find(&c.buf, b"\r\n\r\n") else {
            return Ok(());
        };
        let head = String::from_utf8_lossy(c.buf.get(..end).unwrap_or_default()).into_owned();
        if !head.starts_with("HTTP/1.1 200") {
            let status = head.get(9..12).unwrap_or_default().to_owned();
            return Err(format!("refused: HTTP {status}"));
        }
        let len = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())
                    .flatten()
            })
            .ok_or("poll answer without Content-Length")?;
        let Some(body) = c.buf.get(end + 4..end + 4 + len) else {
            return Ok(());
        };
        let parsed: PollBody =
            serde_json::from_slice(body).map_err(|e| format!("bad poll answer: {e}"))?;
        c.buf.drain(..end + 4 + len);
        for m in &parsed.messages {
            note(c, m.data.as_bytes(), now_us, latency, interval);
        }
        c.phase = Phase::Open;
        send(
            c,
            poll_request(topic, Some(&parsed.cursor), target).as_bytes(),
        )
        .map_err(|e| format!("send poll: {}", e.kind()))?;
    }
}

/// Writes `bytes` to the connection (through TLS when it has it). Requests are small and the
/// socket is fresh, so a plain write completes; TLS records rustls cannot write yet are kept by
/// it and flushed on the next event.
fn send(c: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    match c.tls.as_mut() {
        None => (&c.stream).write_all(bytes),
        Some(t) => {
            t.writer().write_all(bytes)?;
            flush_tls(c)
        }
    }
}

/// Writes whatever TLS records are waiting, as far as the socket takes them.
fn flush_tls(c: &mut Conn) -> io::Result<()> {
    let Some(t) = c.tls.as_mut() else {
        return Ok(());
    };
    while t.wants_write() {
        match t.write_tls(&mut &c.stream) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The payload inside a Socket.IO event frame (`42["NAME","PAYLOAD"]`, what a Socket.IO server
/// sends for `emit(NAME, PAYLOAD)` over its websocket transport); any other payload as it is.
/// Benchmark payloads need no JSON escapes, so none are undone.
pub fn socketio_unwrapped(payload: &[u8]) -> &[u8] {
    let Some(rest) = payload.strip_prefix(b"42[\"") else {
        return payload;
    };
    let Some(start) = rest.windows(3).position(|w| w == b"\",\"") else {
        return payload;
    };
    rest.get(start + 3..)
        .and_then(|r| r.strip_suffix(b"\"]"))
        .unwrap_or(payload)
}

/// A benchmark payload starts with `SEQ PUBLISH_UNIX_MICROS ` (possibly inside a Socket.IO
/// event frame).
fn note(c: &mut Conn, payload: &[u8], now_us: u64, latency: &mut Latency, interval: u64) {
    let payload = socketio_unwrapped(payload);
    let mut parts = payload.splitn(3, |&b| b == b' ');
    let num = |p: Option<&[u8]>| {
        p.and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u64>().ok())
    };
    if let (Some(seq), Some(ts)) = (num(parts.next()), num(parts.next())) {
        c.check.see(seq);
        latency.record(now_us.saturating_sub(ts));
        c.clumps.see(now_us, interval);
    }
}

fn masked(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = rand16();
    let mut out = vec![0x80 | opcode, 0x80 | payload.len().min(125) as u8];
    out.extend_from_slice(mask.get(..4).unwrap_or_default());
    out.extend(
        payload
            .iter()
            .take(125)
            .zip(mask.iter().cycle())
            .map(|(b, m)| b ^ m),
    );
    out
}

fn rand16() -> [u8; 16] {
    let mut x = unix_micros() ^ u64::from(std::process::id()).rotate_left(32);
    let mut out = [0u8; 16];
    for b in &mut out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Microseconds since the Unix epoch (publisher and clients share the machine's clock).
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// CPU time (user + system) of this process, from /proc.
pub fn own_cpu_seconds() -> f64 {
    crate::proc_stat::cpu_seconds(std::process::id()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socketio_event_frames_are_unwrapped_and_others_kept() {
        assert_eq!(socketio_unwrapped(br#"42["m","7 123 xx"]"#), b"7 123 xx");
        assert_eq!(socketio_unwrapped(b"7 123 xx"), b"7 123 xx");
        assert_eq!(socketio_unwrapped(br#"42["m"]"#), br#"42["m"]"#);
        assert_eq!(socketio_unwrapped(b"0{\"sid\":\"a\"}"), b"0{\"sid\":\"a\"}");
    }
}
