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
use std::time::{Duration, Instant};

use base64::Engine as _;
use mio::net::TcpStream;
use mio::{Events, Poll, Token, Waker};
use serde::{Deserialize, Serialize};

use clarion_proto::http1::{parse_response_head, ResponseBody};
use clarion_proto::ws::frame::encode_client_frame;
use clarion_proto::ws::OpCode;

use crate::check::{SeqChecker, Verdict};
use crate::proc_stat::own_cpu_seconds;
use crate::source_ports::SourcePorts;
use crate::stats::{unix_micros, Buckets, Clumps, Latency};
use crate::wire::{self, find, rand16, Step, MAX_HEAD, MAX_HEADERS};

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
    /// A text message each WebSocket sends once open (a peer's protocol greeting).
    #[serde(default)]
    pub hello: Option<String>,
    /// Connect over TLS, trusting this CA.
    #[serde(default)]
    pub tls: Option<TlsJob>,
    /// Sign each connection a token of its own identity with this HS256 secret.
    #[serde(default)]
    pub jwt_secret: Option<String>,
}

pub use crate::tls_client::TlsJob;
use crate::tls_client::{TlsClient, TlsSetup};

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
    /// Each connection's mean publish-to-receive latency (one sample per connection that
    /// received anything): how evenly a fan-out treats its subscribers.
    #[serde(default)]
    pub connection_means: Buckets,
    /// Seconds to open all connections.
    pub connect_seconds: f64,
    /// This process's CPU time (user + system), seconds.
    pub cpu_seconds: f64,
}

/// How often a worker reports progress: often enough that a run of a few seconds plots its
/// connections and deliveries.
pub use crate::peer_formats::{centrifuge_unwrapped, socketio_unwrapped};

const PROGRESS_EVERY: Duration = Duration::from_millis(250);

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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Head,
    Open,
    Dead,
}

impl Phase {
    /// Connecting, or waiting for the handshake's answer.
    fn handshaking(self) -> bool {
        matches!(self, Phase::Connecting | Phase::Head)
    }
}

struct Conn {
    stream: TcpStream,
    /// The TLS client state, when the job is over TLS.
    tls: Option<TlsClient>,
    topic: u32,
    phase: Phase,
    /// Bytes of a head, frame or event split across reads: empty (no allocation) otherwise,
    /// since input is parsed in the worker's shared read buffer.
    buf: Vec<u8>,
    check: SeqChecker,
    clumps: Clumps,
    /// Latencies of the messages counted, summed (µs): the connection's mean at the end.
    latency_sum: u64,
}

const STDIN: Token = Token(usize::MAX - 1);

/// Largest frame payload accepted from the server: far above any benchmark message, low
/// enough that a broken length cannot make a connection buffer without bound.
const MAX_FRAME: u64 = 64 * 1024 * 1024;

/// Most handshakes one worker has in flight at once.
const MAX_IN_FLIGHT: usize = 256;

/// Runs a worker: the job comes as the first line of stdin.
pub fn main() -> anyhow::Result<()> {
    let stdin = io::stdin();
    let mut first = String::new();
    stdin.lock().read_line(&mut first)?;
    if let Ok(job) = serde_json::from_str::<crate::million_worker::Job>(&first) {
        return crate::million_worker::main(job);
    }
    let job: Job = serde_json::from_str(&first)?;
    let tls = job.tls.as_ref().map(TlsJob::setup).transpose()?;
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
    let mut ports = SourcePorts::new();
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
        // `max_handshakes`). Counted only while connections remain to be opened: once they
        // are, an iteration's work is its events alone (a scan of every connection per wake-up
        // would make the client, not the server, the cost of a ticker).
        let mut in_flight = if planned < allowed {
            conns.iter().filter(|c| c.phase.handshaking()).count()
        } else {
            0
        };
        while planned < allowed && in_flight < MAX_IN_FLIGHT {
            in_flight += 1;
            let topic = plan.get(planned).copied().unwrap_or(0);
            planned += 1;
            match open(&job, &poll, &mut ports, conns.len(), topic, tls.as_ref()) {
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
            let closing = ev.is_read_closed() || ev.is_error();
            let step = drive(
                c,
                &job,
                &topic_names,
                &mut read_buf,
                now_us,
                &mut latency,
                closing,
            );
            if let Err(kind) = step {
                *report.errors.entry(kind).or_default() += 1;
                c.phase = Phase::Dead;
                let _ = poll.registry().deregister(&mut c.stream);
            }
        }
        let opened = || conns.iter().filter(|c| c.phase == Phase::Open).count() as u64;
        let became_ready =
            !ready_sent && planned == plan.len() && !conns.iter().any(|c| c.phase.handshaking());
        if became_ready {
            ready_sent = true;
            report.opened = opened();
            report.connect_seconds = started.elapsed().as_secs_f64();
        }
        // Readiness is told at once: the coordinator waits for it before publishing.
        if Instant::now() >= next_progress || became_ready {
            next_progress = Instant::now() + PROGRESS_EVERY;
            let opened = opened();
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
                let mut means = Latency::default();
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
                    if let Some(mean) = c.latency_sum.checked_div(c.check.received()) {
                        means.record(mean);
                    }
                }
                report.connection_means = means.buckets();
                for t in &never_opened {
                    report.verdict.missing += topic_names
                        .get(*t as usize)
                        .and_then(|t| f.published.get(t))
                        .copied()
                        .unwrap_or(0);
                }
                report.opened = report.opened.max(opened());
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

fn open(
    job: &Job,
    poll: &Poll,
    ports: &mut SourcePorts,
    index: usize,
    topic: u32,
    tls: Option<&TlsSetup>,
) -> io::Result<Conn> {
    let tls = tls.map(TlsClient::new).transpose()?;
    let stream = ports.connect(job.source, job.target, poll, index)?;
    Ok(Conn {
        stream,
        tls,
        topic,
        phase: Phase::Connecting,
        buf: Vec::new(),
        check: SeqChecker::default(),
        clumps: Clumps::default(),
        latency_sum: 0,
    })
}

/// Advances one connection; `Err(kind)` when it failed. `closing`: the readiness event also
/// reported the peer's end of stream or an error, so reading goes on to find it.
fn drive(
    c: &mut Conn,
    job: &Job,
    topics: &[String],
    read_buf: &mut [u8],
    now_us: u64,
    latency: &mut Latency,
    closing: bool,
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
        let token = job
            .jwt_secret
            .as_deref()
            .map(|s| format!("&token={}", crate::wire::member_token(s)))
            .unwrap_or_default();
        let request = match job.transport {
            Transport::Ws => {
                let key = base64::engine::general_purpose::STANDARD.encode(rand16());
                format!(
                    "GET /ws?topic={topic}{token} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
                     Sec-WebSocket-Key: {key}\r\n\r\n",
                    job.target
                )
            }
            Transport::Sse => format!(
                "GET /sse?topic={topic}{token} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
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
    if let Some(t) = c.tls.as_mut() {
        t.flush(&c.stream)
            .map_err(|e| format!("write: {}", e.kind()))?;
    }
    let topic = topics.get(c.topic as usize).map_or("", String::as_str);
    let mut cx = Cx {
        job,
        topic,
        now_us,
        latency,
    };
    let mut eof = false;
    loop {
        let n = match (&c.stream).read(read_buf) {
            Ok(0) => {
                eof = true;
                break;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read: {}", e.kind())),
        };
        // A plain read that did not fill the buffer emptied the socket: what arrives later
        // raises a new edge, so the `WouldBlock` read that would confirm it is skipped (half
        // the client's system calls in a ticker). Not over TLS, nor when the event reported
        // the end of stream, which then still has to be read.
        let drained = n < read_buf.len() && c.tls.is_none() && !closing;
        let fresh = read_buf.get(..n).unwrap_or_default();
        let Some(t) = c.tls.as_mut() else {
            if c.buf.is_empty() {
                // The usual case: parse in the shared buffer, keep only an incomplete tail.
                let used = consume(c, fresh, &mut cx)?;
                if let Some(tail) = fresh.get(used..).filter(|t| !t.is_empty()) {
                    c.buf = tail.to_vec();
                }
            } else {
                c.buf.extend_from_slice(fresh);
                consume_buffered(c, &mut cx)?;
            }
            if drained {
                break;
            }
            continue;
        };
        eof |= t.receive(&c.stream, fresh, &mut c.buf)?;
        consume_buffered(c, &mut cx)?;
    }
    if eof {
        let handshake = matches!(c.phase, Phase::Head) && job.transport != Transport::Poll;
        return Err(if handshake {
            "closed during handshake".into()
        } else {
            "closed by server".into()
        });
    }
    Ok(())
}

/// What parsing a connection's input needs besides the connection.
struct Cx<'a> {
    job: &'a Job,
    topic: &'a str,
    now_us: u64,
    latency: &'a mut Latency,
}

/// Parses `c.buf` and keeps only what is still incomplete (nothing, and no allocation, when
/// everything was used).
fn consume_buffered(c: &mut Conn, cx: &mut Cx<'_>) -> Result<(), String> {
    let mut buf = std::mem::take(&mut c.buf);
    let used = consume(c, &buf, cx)?;
    buf.drain(..used.min(buf.len()));
    if !buf.is_empty() {
        c.buf = buf;
    }
    Ok(())
}

/// Handles every complete answer head, frame, event or poll answer at the start of `input`;
/// returns the bytes used.
fn consume(c: &mut Conn, input: &[u8], cx: &mut Cx<'_>) -> Result<usize, String> {
    let mut at = 0;
    loop {
        let rest = input.get(at..).unwrap_or_default();
        let used = match (cx.job.transport, &c.phase) {
            (Transport::Poll, _) => poll_answer(c, rest, cx)?,
            (transport, Phase::Head) => handshake_answer(c, rest, transport, cx.job)?,
            (Transport::Ws, _) => ws_frame(c, rest, cx)?,
            (Transport::Sse, _) => sse_event(c, rest, cx),
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
    c: &mut Conn,
    input: &[u8],
    transport: Transport,
    job: &Job,
) -> Result<Option<usize>, String> {
    let Some(head) = parse_response_head(input, MAX_HEADERS, MAX_HEAD)
        .map_err(|e| format!("bad answer: {e}"))?
    else {
        return Ok(None);
    };
    let ok = match transport {
        Transport::Ws => 101,
        Transport::Sse | Transport::Poll => 200,
    };
    if head.status != ok {
        return Err(format!("refused: HTTP {}", head.status));
    }
    if transport == Transport::Sse && head.body("GET") != Ok(ResponseBody::UntilClose) {
        return Err("event stream is not close-delimited".into());
    }
    c.phase = Phase::Open;
    // Answered: the session tickets have been read, the lean record layer can take over.
    if let Some(t) = c.tls.as_mut() {
        t.settle();
    }
    if let (Transport::Ws, Some(hello)) = (transport, job.hello.as_deref()) {
        send(c, &masked(OpCode::Text, hello.as_bytes()))
            .map_err(|e| format!("send hello: {}", e.kind()))?;
    }
    Ok(Some(head.head_len))
}

/// One WebSocket frame from the server; `None` until it is complete.
fn ws_frame(c: &mut Conn, input: &[u8], cx: &mut Cx<'_>) -> Result<Option<usize>, String> {
    let Some((step, total)) = wire::step(input, MAX_FRAME)? else {
        return Ok(None);
    };
    match step {
        // Centrifuge's JSON protocol pings with an empty object and wants one back.
        Step::Text(b"{}") => {
            let _ = send(c, &masked(OpCode::Text, b"{}"));
        }
        // Centrifuge sends several replies and pushes in one frame, one per line.
        Step::Text(payload) if payload.starts_with(b"{") => {
            for line in payload.split(|&b| b == b'\n') {
                note(c, line, cx);
            }
        }
        Step::Text(payload) | Step::Binary(payload) => note(c, payload, cx),
        Step::Closed => return Err("closed by server".into()),
        Step::Ping(payload) => {
            let r = rand16();
            let _ = send(c, &wire::pong(payload, [r[0], r[1], r[2], r[3]]));
        }
        Step::Pong(_) | Step::Nothing => {}
    }
    Ok(Some(total))
}

/// One event of an SSE stream (its `data:` lines); `None` until it is complete.
fn sse_event(c: &mut Conn, input: &[u8], cx: &mut Cx<'_>) -> Option<usize> {
    let end = find(input, b"\n\n")?;
    for line in input.get(..end).unwrap_or_default().split(|&b| b == b'\n') {
        if let Some(data) = line.strip_prefix(b"data: ") {
            note(c, data, cx);
        }
    }
    Some(end + 2)
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

/// One complete long-poll answer, after which the next poll is sent; `None` until it is
/// complete.
fn poll_answer(c: &mut Conn, input: &[u8], cx: &mut Cx<'_>) -> Result<Option<usize>, String> {
    let Some(head) = parse_response_head(input, MAX_HEADERS, MAX_HEAD)
        .map_err(|e| format!("bad answer: {e}"))?
    else {
        return Ok(None);
    };
    if head.status != 200 {
        return Err(format!("refused: HTTP {}", head.status));
    }
    let len = match head.body("GET") {
        Ok(ResponseBody::Length(n)) => usize::try_from(n).map_err(|_| "poll answer too long")?,
        _ => return Err("poll answer without Content-Length".into()),
    };
    let total = head.head_len.saturating_add(len);
    let Some(body) = input.get(head.head_len..total) else {
        return Ok(None);
    };
    let parsed: PollBody =
        serde_json::from_slice(body).map_err(|e| format!("bad poll answer: {e}"))?;
    for m in &parsed.messages {
        note(c, m.data.as_bytes(), cx);
    }
    c.phase = Phase::Open;
    send(
        c,
        poll_request(cx.topic, Some(&parsed.cursor), cx.job.target).as_bytes(),
    )
    .map_err(|e| format!("send poll: {}", e.kind()))?;
    Ok(Some(total))
}

/// Writes `bytes` to the connection (through TLS when it has it). Requests are small and the
/// socket is fresh, so a plain write completes.
fn send(c: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    match c.tls.as_mut() {
        None => (&c.stream).write_all(bytes),
        Some(t) => t.send(&c.stream, bytes),
    }
}

/// A benchmark payload starts with `SEQ PUBLISH_UNIX_MICROS ` (possibly inside a Socket.IO
/// event frame or a Centrifuge push); anything else (a peer's protocol replies) is ignored.
fn note(c: &mut Conn, payload: &[u8], cx: &mut Cx<'_>) {
    let (now_us, interval) = (cx.now_us, cx.job.interval_us);
    let payload = centrifuge_unwrapped(socketio_unwrapped(payload));
    let mut parts = payload.splitn(3, |&b| b == b' ');
    let num = |p: Option<&[u8]>| {
        p.and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u64>().ok())
    };
    if let (Some(seq), Some(ts)) = (num(parts.next()), num(parts.next())) {
        c.check.see(seq);
        let latency = now_us.saturating_sub(ts);
        cx.latency.record(latency);
        c.latency_sum = c.latency_sum.saturating_add(latency);
        c.clumps.see(now_us, interval);
    }
}

/// A masked client frame (control frames only: at most 125 payload bytes).
fn masked(opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let r = rand16();
    let mask = [r[0], r[1], r[2], r[3]];
    encode_client_frame(opcode, payload.get(..125).unwrap_or(payload), mask)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn centrifuge_pushes_are_unwrapped_and_others_kept() {
        assert_eq!(
            centrifuge_unwrapped(
                br#"{"push":{"channel":"b","pub":{"data":"7 123 xx","offset":2}}}"#
            ),
            b"7 123 xx"
        );
        assert_eq!(
            centrifuge_unwrapped(br#"{"push":{"channel":"b","pub":{"data":"7 1"}}}"#),
            b"7 1"
        );
        let reply: &[u8] = br#"{"id":1,"connect":{"client":"x","subs":{"b":{}}}}"#;
        assert_eq!(centrifuge_unwrapped(reply), reply);
        let cut: &[u8] = br#"{"push":{"channel":"b","pub":{"data":"7 1"#;
        assert_eq!(centrifuge_unwrapped(cut), cut);
    }

    #[test]
    fn socketio_event_frames_are_unwrapped_and_others_kept() {
        assert_eq!(socketio_unwrapped(br#"42["m","7 123 xx"]"#), b"7 123 xx");
        assert_eq!(socketio_unwrapped(b"7 123 xx"), b"7 123 xx");
        assert_eq!(socketio_unwrapped(br#"42["m"]"#), br#"42["m"]"#);
        assert_eq!(socketio_unwrapped(b"0{\"sid\":\"a\"}"), b"0{\"sid\":\"a\"}");
    }

    use clarion_proto::ws::frame::encode_frame;

    /// A connection in `phase` over a real loopback socket (pongs and polls are written to it),
    /// and the server's end.
    fn conn(phase: Phase) -> (Conn, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let c = Conn {
            stream: TcpStream::from_std(client),
            tls: None,
            topic: 0,
            phase,
            buf: Vec::new(),
            check: SeqChecker::default(),
            clumps: Clumps::default(),
            latency_sum: 0,
        };
        (c, server)
    }

    fn job(transport: Transport) -> Job {
        Job {
            target: "127.0.0.1:1".parse().unwrap(),
            source: "127.0.0.1".parse().unwrap(),
            transport,
            topics: vec!["t".into()],
            connect_rate: 0,
            interval_us: 0,
            hello: None,
            tls: None,
            jwt_secret: None,
        }
    }

    /// Feeds `input` to `c` as [`drive`] does for one read, at every split point, and returns
    /// the messages it checked and what it kept.
    fn feed(c: &mut Conn, transport: Transport, input: &[u8]) -> Result<Vec<u8>, String> {
        feed_job(c, &job(transport), input)
    }

    fn feed_job(c: &mut Conn, job: &Job, input: &[u8]) -> Result<Vec<u8>, String> {
        let mut latency = Latency::default();
        let mut cx = Cx {
            job,
            topic: "t",
            now_us: 10,
            latency: &mut latency,
        };
        let used = consume(c, input, &mut cx)?;
        Ok(input.get(used..).unwrap_or_default().to_vec())
    }

    #[test]
    fn websocket_handshake_and_server_frames_parse_in_place() {
        let mut input = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec();
        input.extend(encode_frame(OpCode::Text, b"0 5 a"));
        input.extend(encode_frame(OpCode::Ping, b"p"));
        input.extend(encode_frame(OpCode::Binary, &[b'x'; 300]));
        input.extend(encode_frame(OpCode::Text, b"1 5 b"));
        let split = input.len() - 2;
        let (mut c, mut server) = conn(Phase::Head);
        let tail = feed(&mut c, Transport::Ws, &input[..split]).unwrap();
        assert_eq!(
            tail,
            &input[split - 5..split],
            "an incomplete frame is kept whole"
        );
        assert!(matches!(c.phase, Phase::Open));
        assert_eq!(c.check.received(), 1);
        let mut rest = tail;
        rest.extend_from_slice(&input[split..]);
        assert!(feed(&mut c, Transport::Ws, &rest).unwrap().is_empty());
        assert_eq!(c.check.received(), 2);
        assert!(c.check.finish(2).perfect());
        // The ping was answered with a masked pong.
        let mut pong = [0u8; 7];
        server.read_exact(&mut pong).unwrap();
        assert_eq!(pong[..2], [0x8a, 0x81]);
        assert_eq!(pong[6] ^ pong[2], b'p');
        let close = encode_frame(OpCode::Close, &[3, 232]);
        assert_eq!(
            feed(&mut c, Transport::Ws, &close).unwrap_err(),
            "closed by server"
        );
    }

    #[test]
    fn a_short_read_ends_the_turn_unless_the_stream_is_ending() {
        let (mut c, mut server) = conn(Phase::Open);
        let job = job(Transport::Ws);
        let topics = vec!["t".to_string()];
        let mut buf = vec![0u8; 4096];
        let mut latency = Latency::default();
        server
            .write_all(&encode_frame(OpCode::Text, b"0 5 a"))
            .unwrap();
        server
            .write_all(&encode_frame(OpCode::Close, &[3, 232]))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Both frames came in one short read: the close is seen in the same turn.
        let r = drive(&mut c, &job, &topics, &mut buf, 10, &mut latency, false);
        assert_eq!(r.unwrap_err(), "closed by server");
        assert_eq!(c.check.received(), 1);

        // A frame then the end of stream, read in a buffer that holds only the frame: a short
        // read, but the event said the stream is ending, so reading goes on and finds it.
        let (mut c, mut server) = conn(Phase::Open);
        let frame = encode_frame(OpCode::Text, b"0 5 a");
        server.write_all(&frame).unwrap();
        server.shutdown(std::net::Shutdown::Write).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut small = vec![0u8; frame.len() + 1];
        let r = drive(&mut c, &job, &topics, &mut small, 10, &mut latency, true);
        assert_eq!(r.unwrap_err(), "closed by server");
        // Without that flag the short read ends the turn: the end of stream waits for its
        // own event.
        let (mut c, mut server) = conn(Phase::Open);
        server.write_all(&frame).unwrap();
        server.shutdown(std::net::Shutdown::Write).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(drive(&mut c, &job, &topics, &mut small, 10, &mut latency, false).is_ok());
        assert_eq!(c.check.received(), 1);
    }

    #[test]
    fn a_centrifuge_session_greets_answers_pings_and_counts_pushes() {
        let mut j = job(Transport::Ws);
        j.hello = Some(r#"{"id":1,"connect":{}}"#.into());
        let (mut c, mut server) = conn(Phase::Head);
        let head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";
        assert!(feed_job(&mut c, &j, head).unwrap().is_empty());
        // The greeting went out as one masked text frame.
        let mut hello = [0u8; 6 + 21];
        server.read_exact(&mut hello).unwrap();
        assert_eq!(hello[..2], [0x81, 0x80 | 21]);
        let unmasked: Vec<u8> = (0..21).map(|i| hello[6 + i] ^ hello[2 + i % 4]).collect();
        assert_eq!(unmasked, br#"{"id":1,"connect":{}}"#);
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
        assert!(feed_job(&mut c, &j, &input).unwrap().is_empty());
        assert_eq!(c.check.received(), 2);
        assert!(c.check.finish(2).perfect());
        let mut pong = [0u8; 8];
        server.read_exact(&mut pong).unwrap();
        assert_eq!(pong[..2], [0x81, 0x82]);
        assert_eq!([pong[6] ^ pong[2], pong[7] ^ pong[3]], *b"{}");
    }

    #[test]
    fn broken_or_refused_answers_are_reported() {
        let (mut c, _server) = conn(Phase::Head);
        let refused = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            feed(&mut c, Transport::Ws, refused).unwrap_err(),
            "refused: HTTP 403"
        );
        let (mut c, _server) = conn(Phase::Open);
        // A masked frame and a reserved opcode are not what a server sends.
        assert!(feed(&mut c, Transport::Ws, &[0x81, 0x81, 1, 2, 3, 4, 0])
            .unwrap_err()
            .contains("masked"));
        assert!(feed(&mut c, Transport::Ws, &[0x83, 0x00])
            .unwrap_err()
            .starts_with("bad frame"));
        let (mut c, _server) = conn(Phase::Head);
        assert!(feed(
            &mut c,
            Transport::Sse,
            b"HTTP/1.1 200 OK\r\nNot a header\r\n\r\n"
        )
        .unwrap_err()
        .starts_with("bad answer"));
    }

    #[test]
    fn sse_events_and_poll_answers() {
        let (mut c, _server) = conn(Phase::Head);
        let sse =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n\
                    : hello\n\nid: 1\ndata: 0 5 a\n\ndata: 1 5";
        assert_eq!(feed(&mut c, Transport::Sse, sse).unwrap(), b"data: 1 5");
        assert_eq!(c.check.received(), 1);
        let (mut c, mut server) = conn(Phase::Head);
        let body = br#"{"messages":[{"data":"0 5 a"},{"data":"1 5 b"}],"cursor":"e-2"}"#;
        let mut poll =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        poll.extend_from_slice(body);
        assert_eq!(
            feed(&mut c, Transport::Poll, &poll[..poll.len() - 1]).unwrap(),
            &poll[..poll.len() - 1],
            "nothing is used until the body is complete"
        );
        assert!(feed(&mut c, Transport::Poll, &poll).unwrap().is_empty());
        assert_eq!(c.check.received(), 2);
        let mut next = [0u8; 22];
        server.read_exact(&mut next).unwrap();
        assert_eq!(&next, b"GET /poll?topic=t&sinc");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            feed(&mut c, Transport::Poll, chunked).unwrap_err(),
            "poll answer without Content-Length"
        );
    }

    #[test]
    fn a_connection_record_stays_small() {
        // The million-connection runs need well under 1 KB of user space per connection.
        let size = std::mem::size_of::<Conn>();
        println!("size_of::<Conn>() = {size}");
        assert!(size <= 160, "{size}");
    }
}
