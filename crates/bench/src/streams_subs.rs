//! The streams scenario's subscribers: every `clarion.v1` WebSocket of one phase on one poll in
//! one thread, each following one topic, every event checked by its [`Follower`]; the chosen
//! ones close at their fragment and resume from the last id they saw.

use std::io::{self, Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use clarion_proto::http1::parse_response_head;
use mio::net::TcpStream;
use mio::{Events, Poll};
use serde::Deserialize;

use crate::proc_stat;
use crate::soak_deflate::{self, Compressed, Deflate};
use crate::source_ports::{connected, SourcePorts};
use crate::streams_check::{Event, Follower, Resumed};
use crate::wire::{self, Step, MAX_HEAD, MAX_HEADERS};

/// What the subscriber thread of one phase is given.
pub(crate) struct SubsJob {
    pub(crate) target: SocketAddr,
    pub(crate) source: IpAddr,
    /// The topic names, one per stream.
    pub(crate) topics: Vec<String>,
    /// Each stream's fragments.
    pub(crate) scripts: Arc<Vec<Vec<String>>>,
    pub(crate) per_topic: usize,
    /// The stream phase (appends, folded resumes) or the plain one (one message per fragment).
    pub(crate) stream: bool,
    /// Subscriber index, the fragment count after which it closes, and the count the
    /// publishers must have had accepted before it comes back and resumes.
    pub(crate) resumers: Vec<(usize, usize, usize)>,
    /// Fragments the publishers have had accepted, per stream.
    pub(crate) acked: Arc<Vec<AtomicUsize>>,
    /// Set by the coordinator once every publisher is done.
    pub(crate) published: Arc<AtomicBool>,
    /// Seconds to wait for the last deliveries once published.
    pub(crate) drain: u64,
    /// Seconds the whole phase may take.
    pub(crate) bound: u64,
    pub(crate) server_pids: Vec<u32>,
    /// Offer permessage-deflate and inflate compressed frames.
    pub(crate) deflate: bool,
}

/// What the subscribers of one phase received.
#[derive(Debug, Default)]
pub(crate) struct SubsOutcome {
    pub(crate) subscribers: usize,
    /// Subscribers that received every fragment (or the text, then the rest), exactly.
    pub(crate) complete: usize,
    /// Frames that carried a message or an append.
    pub(crate) deliveries: u64,
    /// The server's CPU seconds when the last subscriber completed (or the wait ended).
    pub(crate) server_cpu_end: Option<f64>,
    pub(crate) ended: Option<Instant>,
    /// Each resume's figures, for the resumers that completed it.
    pub(crate) resumes: Vec<Resumed>,
    /// The first failures (what, for which subscriber), and how many there were.
    pub(crate) failures: Vec<String>,
    pub(crate) failure_count: usize,
}

/// One subscriber.
struct Sub {
    topic: usize,
    conn: Option<TcpStream>,
    sent: bool,
    open: bool,
    buf: Vec<u8>,
    follower: Follower,
    resume_at: Option<usize>,
    back_at: usize,
    failed: bool,
    /// Counted once in the loop's tallies: opened, and finished (complete or failed).
    counted_open: bool,
    finished: bool,
    /// The connection's inflater, when the server agreed to permessage-deflate.
    deflate: Option<Deflate>,
}

/// Largest frame accepted: a folded 400-fragment text is a few KiB.
const MAX_FRAME: u64 = 1 << 20;
/// Subscribing requests awaiting their answer at once.
const HANDSHAKES: usize = 256;
/// Most bytes a subscriber buffers before its frames are read.
const MAX_BUF: usize = 4 << 20;

/// Opens every subscriber, says so on `ready`, then reads until each has everything, the drain
/// after publishing ends, or the phase's bound passes.
pub(crate) fn run(job: &SubsJob, ready: &Sender<Result<(), String>>) -> SubsOutcome {
    let mut out = SubsOutcome::default();
    let mut poll = match Poll::new() {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send(Err(format!("poll: {e}")));
            return out;
        }
    };
    let mut ports = SourcePorts::new();
    let mut subs: Vec<Sub> = (0..job.topics.len() * job.per_topic)
        .map(|i| Sub {
            topic: i % job.topics.len().max(1),
            conn: None,
            sent: false,
            open: false,
            buf: Vec::new(),
            follower: Follower::default(),
            resume_at: None,
            back_at: 0,
            failed: false,
            counted_open: false,
            finished: false,
            deflate: None,
        })
        .collect();
    for &(i, at, back) in &job.resumers {
        if let Some(s) = subs.get_mut(i) {
            s.resume_at = Some(at);
            s.back_at = back;
        }
    }
    // Resumers away: closed, waiting for the fragment they come back at.
    let mut away: Vec<usize> = Vec::new();
    out.subscribers = subs.len();
    let started = Instant::now();
    let mut events = Events::with_capacity(1024);
    let mut read_buf = vec![0u8; 64 * 1024];
    let mut said_ready = false;
    let mut published_at: Option<Instant> = None;
    let (mut opened, mut finished) = (0usize, 0usize);
    // Subscribers are connected in order, at most HANDSHAKES answers awaited at a time.
    let mut next = 0;
    loop {
        while next < subs.len() && next - opened < HANDSHAKES {
            let Some(s) = subs.get_mut(next) else { break };
            match ports.connect(job.source, job.target, &poll, next) {
                Ok(c) => s.conn = Some(c),
                Err(e) => {
                    let _ = ready.send(Err(format!("cannot connect subscriber {next}: {e}")));
                    return out;
                }
            }
            next += 1;
        }
        if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(100))) {
            if e.kind() != io::ErrorKind::Interrupted {
                fail(&mut out, format!("poll: {e}"));
                break;
            }
        }
        for ev in &events {
            let i = ev.token().0;
            let Some(s) = subs.get_mut(i) else { continue };
            match drive(s, job, &poll, &mut read_buf, &mut out) {
                Ok(true) => away.push(i),
                Ok(false) => {}
                Err(e) => {
                    s.failed = true;
                    s.conn = None;
                    fail(&mut out, format!("subscriber {i} (topic {}): {e}", s.topic));
                }
            }
            if !s.counted_open && (s.open || s.failed) {
                s.counted_open = true;
                opened += 1;
            }
            let complete = job
                .scripts
                .get(s.topic)
                .is_some_and(|sc| s.follower.complete(sc));
            if !s.finished && (s.failed || complete) {
                s.finished = true;
                finished += 1;
            }
        }
        let mut k = 0;
        while let Some(&i) = away.get(k) {
            let Some(s) = subs.get_mut(i) else { break };
            let acked = job
                .acked
                .get(s.topic)
                .map_or(0, |a| a.load(Ordering::Acquire));
            if acked < s.back_at {
                k += 1;
                continue;
            }
            away.swap_remove(k);
            s.follower.resume(acked);
            match ports.connect(job.source, job.target, &poll, i) {
                Ok(c) => s.conn = Some(c),
                Err(e) => {
                    s.failed = true;
                    fail(&mut out, format!("subscriber {i}: reconnect: {e}"));
                }
            }
        }
        if !said_ready && opened == subs.len() {
            said_ready = true;
            let _ = ready.send(Ok(()));
        }
        if said_ready && finished == subs.len() {
            break;
        }
        if published_at.is_none() && job.published.load(Ordering::Relaxed) {
            published_at = Some(Instant::now());
        }
        if published_at.is_some_and(|t| t.elapsed() > Duration::from_secs(job.drain))
            || started.elapsed() > Duration::from_secs(job.bound)
        {
            fail(
                &mut out,
                "the wait ended before every subscriber had every fragment".into(),
            );
            break;
        }
    }
    if !said_ready {
        let _ = ready.send(Err("the subscribers did not all open".into()));
    }
    out.server_cpu_end = proc_stat::sum_over(&job.server_pids, proc_stat::cpu_seconds);
    out.ended = Some(Instant::now());
    for (i, s) in subs.iter().enumerate() {
        let Some(script) = job.scripts.get(s.topic) else {
            continue;
        };
        if s.follower.complete(script) {
            out.complete += 1;
            if let Some(r) = s.follower.resumed {
                out.resumes.push(r);
            }
        } else if !s.failed {
            fail(
                &mut out,
                format!(
                    "subscriber {i} (topic {}) has {} of {} fragments",
                    s.topic,
                    s.follower.held,
                    script.len()
                ),
            );
        }
        if s.resume_at.is_some() {
            fail(
                &mut out,
                format!("subscriber {i} never reached its resume point"),
            );
        }
    }
    out
}

fn fail(out: &mut SubsOutcome, what: String) {
    out.failure_count += 1;
    if out.failures.len() < 20 {
        out.failures.push(what);
    }
}

/// The subscribing request for `topic`, resuming after `since`; offering permessage-deflate
/// as a browser does when `deflate`.
fn request(target: SocketAddr, topic: &str, since: Option<&str>, deflate: bool) -> String {
    let key = base64::engine::general_purpose::STANDARD.encode(wire::rand16());
    let since = since.map(|s| format!("&since={s}")).unwrap_or_default();
    let offer = if deflate {
        format!("Sec-WebSocket-Extensions: {}\r\n", soak_deflate::OFFER)
    } else {
        String::new()
    };
    format!(
        "GET /ws?topic={topic}{since} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\
         Sec-WebSocket-Protocol: clarion.v1\r\n{offer}\r\n"
    )
}

/// A subscriber's socket is ready: send its request once connected, read and check what
/// arrived; answers whether it reached its resume point and closed (it comes back later).
fn drive(
    s: &mut Sub,
    job: &SubsJob,
    poll: &Poll,
    read_buf: &mut [u8],
    out: &mut SubsOutcome,
) -> Result<bool, String> {
    let Some(mut conn) = s.conn.take() else {
        return Ok(false);
    };
    if !read(s, &mut conn, job, read_buf, out)? {
        s.conn = Some(conn);
        return Ok(false);
    }
    // Close; what the connection had buffered beyond the last id is dropped, as a client that
    // lost its connection would.
    let _ = poll.registry().deregister(&mut conn);
    drop(conn);
    s.resume_at = None;
    s.buf.clear();
    s.deflate = None;
    s.open = false;
    s.sent = false;
    Ok(true)
}

/// Sends the request once connected, reads what the socket has and checks it; answers whether
/// the subscriber reached its resume point.
fn read(
    s: &mut Sub,
    conn: &mut TcpStream,
    job: &SubsJob,
    read_buf: &mut [u8],
    out: &mut SubsOutcome,
) -> Result<bool, String> {
    let topic = job.topics.get(s.topic).ok_or("no such topic")?;
    if !s.sent {
        if !connected(conn)? {
            return Ok(false);
        }
        let since = s
            .follower
            .resuming_from
            .is_some()
            .then_some(s.follower.last_id.as_str());
        conn.write_all(request(job.target, topic, since, job.deflate).as_bytes())
            .map_err(|e| format!("send request: {}", e.kind()))?;
        s.sent = true;
    }
    loop {
        let n = match conn.read(read_buf) {
            Ok(0) => return Err("closed by the server".into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read: {}", e.kind())),
        };
        s.buf
            .extend_from_slice(read_buf.get(..n).unwrap_or_default());
        if s.buf.len() > MAX_BUF {
            return Err("more unread bytes than any frame".into());
        }
    }
    let script = job.scripts.get(s.topic).ok_or("no such stream")?;
    let mut at = 0;
    if !s.open {
        let Some(head) = parse_response_head(&s.buf, MAX_HEADERS, MAX_HEAD)
            .map_err(|e| format!("bad answer: {e}"))?
        else {
            return Ok(false);
        };
        if head.status != 101 {
            return Err(format!("subscribing was answered {}", head.status));
        }
        if job.deflate {
            let answer = head
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-extensions"))
                .map(|(_, v)| *v);
            soak_deflate::accepted(answer)?;
            s.deflate = Some(Deflate::new());
        }
        at = head.head_len;
        s.open = true;
    }
    let mut resume = false;
    let mut replies: Vec<Vec<u8>> = Vec::new();
    let buf = std::mem::take(&mut s.buf);
    loop {
        let input = buf.get(at..).unwrap_or_default();
        let read = match s.deflate.as_mut() {
            Some(d) => d.read(input, MAX_FRAME).map_err(String::from)?,
            None => Compressed::Plain,
        };
        match read {
            Compressed::Wait => break,
            Compressed::Text(text, len) => {
                at += len;
                if event(s, script, job.stream, &job.acked, &text, len, out)?
                    && s.resume_at == Some(s.follower.held)
                {
                    resume = true;
                    break;
                }
                continue;
            }
            Compressed::Plain => {}
        }
        let Some((step, len)) = wire::step(input, MAX_FRAME)? else {
            break;
        };
        at += len;
        match step {
            Step::Text(payload) => {
                if event(s, script, job.stream, &job.acked, payload, len, out)?
                    && s.resume_at == Some(s.follower.held)
                {
                    resume = true;
                    break;
                }
            }
            Step::Ping(p) => replies.push(wire::pong(p, [7, 1, 3, 9])),
            Step::Binary(_) => return Err("a binary frame".into()),
            Step::Closed => return Err("a Close frame from the server".into()),
            Step::Pong(_) | Step::Nothing => {}
        }
    }
    s.buf = buf;
    s.buf.drain(..at.min(s.buf.len()));
    for r in replies {
        conn.write_all(&r)
            .map_err(|e| format!("send pong: {}", e.kind()))?;
    }
    Ok(resume)
}

/// A `clarion.v1` envelope, as far as the check reads it.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default, borrow)]
    id: Option<&'a str>,
    #[serde(default)]
    seq: Option<usize>,
    #[serde(default, borrow)]
    data: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    done: bool,
    #[serde(default)]
    error: Option<String>,
}

/// Checks one text frame; answers whether it was a delivery (a message or an append).
fn event(
    s: &mut Sub,
    script: &[String],
    stream: bool,
    acked: &[AtomicUsize],
    payload: &[u8],
    frame_len: usize,
    out: &mut SubsOutcome,
) -> Result<bool, String> {
    let e: Envelope<'_> =
        serde_json::from_slice(payload).map_err(|e| format!("bad envelope: {e}"))?;
    let append = match e.kind {
        "append" => true,
        "message" => false,
        "gap" => return Err("a gap notice".into()),
        "error" => return Err(format!("an error: {}", e.error.unwrap_or_default())),
        _ => return Ok(false),
    };
    let data = e.data.as_deref().ok_or("an event without data")?;
    let ev = Event {
        append,
        seq: e.seq,
        data,
        done: e.done,
        frame_len,
    };
    // Only a resumer needs the id, and only until it resumes.
    if s.resume_at.is_some() {
        s.follower.last_id = e.id.ok_or("an event without id")?.to_string();
    }
    out.deliveries += 1;
    if stream {
        let acked = acked.get(s.topic).map_or(0, |a| a.load(Ordering::Acquire));
        s.follower.on_stream(script, &ev, acked)?;
    } else {
        s.follower.on_plain(script, &ev)?;
    }
    Ok(true)
}
