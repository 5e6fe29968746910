//! One load-generating process: opens its share of the connections from one source address,
//! reads everything they receive, checks every delivery and measures latency.
//!
//! What a connection does with the bytes it reads (the answer, frames, events, polls, the
//! checks) is its [`Life`], or over HTTP/2 its [`H2Life`] (a stream per subscriber); this file
//! is the process around the lives: sockets, TLS, the poll loop, the connect pace, and the
//! latency and clump sums.
//!
//! It talks to the coordinator over stdin/stdout, one JSON object per line: a [`Job`] in, then
//! progress lines and a final [`Report`] out; a [`Finish`] on stdin says how many messages each
//! topic got, and the worker reports once every connection has them (or a deadline passes).
//! It then holds its connections until its stdin closes: the coordinator reads the server's CPU
//! for the publishing before the server has any closes to handle.

use std::collections::HashMap;
use std::io::{self, BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Poll, Token};
use serde::{Deserialize, Serialize};

use crate::check::{SeqChecker, Verdict};
use crate::conn_life::{Event, Host, Life, Payloads, Phase, Setup};
use crate::h2_life::{H2Host, H2Life, H2Setup, StreamError, StreamPhase};
use crate::proc_stat::own_cpu_seconds;
use crate::source_ports::{self, SourcePorts};
use crate::stats::{unix_micros, Buckets, Clumps, Latency};
use crate::wire::rand16;

pub use crate::conn_life::Transport;

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
    /// Subscribe over HTTP/2 (SSE streams, or WebSockets by RFC 8441's extended CONNECT; h2 by
    /// ALPN over TLS, h2c prior knowledge without).
    #[serde(default)]
    pub http2: bool,
    /// With `http2`, streams per connection: consecutive entries of `topics` share one.
    #[serde(default = "one")]
    pub streams_per_conn: u32,
}

fn one() -> u32 {
    1
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
    /// Subscribers whose request was answered (connections, or HTTP/2 streams).
    pub opened: u64,
    /// TCP connections opened (HTTP/2: past the server's SETTINGS), as `opened` over
    /// HTTP/1.1.
    #[serde(default)]
    pub tcp_connections: u64,
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

/// One connection: the socket and what the worker measures around its life.
struct Conn {
    stream: TcpStream,
    /// The TLS client state, when the job is over TLS.
    tls: Option<TlsClient>,
    proto: Proto,
}

/// What the worker measures of one subscriber.
#[derive(Debug, Clone, Default)]
struct Meter {
    clumps: Clumps,
    /// Latencies of the messages counted, summed (µs): the subscriber's mean at the end.
    latency_sum: u64,
}

/// What a connection speaks; topics are indices into the worker's topic names.
enum Proto {
    /// HTTP/1.1 (WebSocket, SSE, long-poll): one subscriber.
    H1 { life: Life<1>, meter: Meter },
    /// HTTP/2: a stream per subscriber, `meters[i]` for stream `i`. Boxed: the million
    /// worker's record size is not at stake here, but the regular one's HTTP/1.1 record is.
    H2(Box<(H2Life, Vec<Meter>)>),
}

/// One subscriber of a connection, for the final sums.
struct Sub<'a> {
    topic: u32,
    /// Open now (answered, not ended): it should have every message published.
    open: bool,
    check: &'a SeqChecker,
    meter: &'a Meter,
}

impl Conn {
    fn handshaking(&self) -> bool {
        match &self.proto {
            Proto::H1 { life, .. } => life.handshaking(),
            Proto::H2(h) => h.0.handshaking(),
        }
    }

    /// Subscribers answered and not ended.
    fn opened(&self) -> u64 {
        match &self.proto {
            Proto::H1 { life, .. } => u64::from(life.phase() == Phase::Open),
            Proto::H2(h) => h.0.open_streams() as u64,
        }
    }

    /// The connection itself is open (HTTP/1.1: answered; HTTP/2: past the SETTINGS).
    fn connected(&self) -> bool {
        match &self.proto {
            Proto::H1 { life, .. } => life.phase() == Phase::Open,
            Proto::H2(h) => h.0.phase() == Phase::Open,
        }
    }

    /// Messages received and checked, over every subscriber.
    fn received(&self) -> u64 {
        self.subs().map(|s| s.check.received()).sum()
    }

    fn subs(&self) -> Box<dyn Iterator<Item = Sub<'_>> + '_> {
        match &self.proto {
            Proto::H1 { life, meter } => {
                let [check] = life.streams();
                Box::new(std::iter::once(Sub {
                    topic: life.topic(),
                    open: life.phase() == Phase::Open,
                    check,
                    meter,
                }))
            }
            Proto::H2(h) => {
                let alive = h.0.phase() != Phase::Dead;
                Box::new(
                    h.0.streams()
                        .zip(&h.1)
                        .map(move |((topic, phase, check), meter)| Sub {
                            topic,
                            open: alive && phase == StreamPhase::Open,
                            check,
                            meter,
                        }),
                )
            }
        }
    }

    fn fail(&mut self) {
        match &mut self.proto {
            Proto::H1 { life, .. } => life.fail(),
            Proto::H2(h) => h.0.fail(),
        }
    }
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
    if let Ok(job) = serde_json::from_str::<crate::soak_worker::Job>(&first) {
        return crate::soak_worker::main(job);
    }
    let job: Job = serde_json::from_str(&first)?;
    let setup = Setup {
        transport: job.transport,
        target: job.target,
        payloads: Payloads::Peers,
        max_frame: MAX_FRAME,
        hello: job.hello.as_deref(),
    };
    let h2 = H2Setup {
        target: job.target,
        tls: job.tls.is_some(),
        websocket: job.transport == Transport::Ws,
    };
    // Subscribers per connection.
    let per_conn = if job.http2 {
        job.streams_per_conn.max(1) as usize
    } else {
        1
    };
    let tls = job.tls.as_ref().map(TlsJob::setup).transpose()?;
    let mut poll = Poll::new()?;
    let (_waker, rx) = crate::worker_proc::commands::<Finish>(&poll, STDIN)?;
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
    // Connection k carries the subscribers `plan[k * per_conn..]`, `per_conn` of them.
    let planned_conns = plan.len().div_ceil(per_conn);
    let mut conns: Vec<Conn> = Vec::with_capacity(planned_conns);
    let mut ports = SourcePorts::new();
    let mut report = Report::default();
    let mut latency = Latency::default();
    let mut events = Events::with_capacity(4096);
    let mut read_buf = vec![0u8; 64 * 1024];
    // Plaintext of one read over TLS, before it is parsed.
    let mut plain = Vec::new();
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
            planned_conns
        } else {
            ((started.elapsed().as_secs_f64() * f64::from(job.connect_rate)) as usize + 1)
                .min(planned_conns)
        };
        // Handshakes in flight are capped, as a real client fleet's would be spread out: a
        // server is entitled to refuse a storm of simultaneous handshakes (Clarion's
        // `max_handshakes`). Counted only while connections remain to be opened: once they
        // are, an iteration's work is its events alone (a scan of every connection per wake-up
        // would make the client, not the server, the cost of a ticker).
        let mut in_flight = if planned < allowed {
            conns.iter().filter(|c| c.handshaking()).count()
        } else {
            0
        };
        while planned < allowed && in_flight < MAX_IN_FLIGHT {
            in_flight += 1;
            let subs = plan
                .get(planned * per_conn..((planned + 1) * per_conn).min(plan.len()))
                .unwrap_or_default();
            planned += 1;
            match open(&job, &poll, &mut ports, conns.len(), subs, tls.as_ref()) {
                Ok(c) => conns.push(c),
                Err(e) => {
                    *report
                        .errors
                        .entry(format!("connect: {}", e.kind()))
                        .or_default() += 1;
                    never_opened.extend_from_slice(subs);
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
            let shared = Shared {
                job: &job,
                setup: &setup,
                h2: &h2,
                topics: &topic_names,
            };
            let step = drive(
                c,
                &shared,
                (&mut read_buf, &mut plain),
                now_us,
                (&mut latency, &mut report.errors),
                closing,
            );
            if let Err(kind) = step {
                *report.errors.entry(kind).or_default() += 1;
                c.fail();
                let _ = poll.registry().deregister(&mut c.stream);
            }
        }
        let opened = || conns.iter().map(Conn::opened).sum::<u64>();
        let became_ready =
            !ready_sent && planned == planned_conns && !conns.iter().any(Conn::handshaking);
        if became_ready {
            ready_sent = true;
            report.opened = opened();
            report.tcp_connections = conns.iter().filter(|c| c.connected()).count() as u64;
            report.connect_seconds = started.elapsed().as_secs_f64();
        }
        // Readiness is told at once: the coordinator waits for it before publishing.
        if Instant::now() >= next_progress || became_ready {
            next_progress = Instant::now() + PROGRESS_EVERY;
            let opened = opened();
            let received = conns.iter().map(Conn::received).sum();
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
            let expected = |topic: u32| {
                topic_names
                    .get(topic as usize)
                    .and_then(|t| f.published.get(t))
                    .copied()
                    .unwrap_or(0)
            };
            let all = conns
                .iter()
                .flat_map(Conn::subs)
                .all(|s| !s.open || s.check.received() >= expected(s.topic));
            if all || Instant::now() >= *deadline {
                let mut means = Latency::default();
                for s in conns.iter().flat_map(Conn::subs) {
                    // A subscriber that never received anything is all missing (its checker
                    // says so too).
                    report.verdict.add(&s.check.finish(expected(s.topic)));
                    report.clumped += s.meter.clumps.clumped;
                    if let Some(mean) = s.meter.latency_sum.checked_div(s.check.received()) {
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
                drop(o);
                // The reader thread ends, and drops its sender, when stdin closes.
                while rx.recv().is_ok() {}
                return Ok(());
            }
        }
    }
}

/// Opens connection `index`, for the subscribers following `topics` (one, or a stream each
/// over HTTP/2).
fn open(
    job: &Job,
    poll: &Poll,
    ports: &mut SourcePorts,
    index: usize,
    topics: &[u32],
    tls: Option<&TlsSetup>,
) -> io::Result<Conn> {
    let tls = tls.map(TlsClient::new).transpose()?;
    let stream = ports.connect(job.source, job.target, poll, index)?;
    let proto = if job.http2 {
        Proto::H2(Box::new((
            H2Life::new(topics.iter().copied()),
            vec![Meter::default(); topics.len()],
        )))
    } else {
        Proto::H1 {
            life: Life::new(topics.first().copied().unwrap_or(0)),
            meter: Meter::default(),
        }
    };
    Ok(Conn { stream, tls, proto })
}

/// What every connection of the worker shares.
struct Shared<'a> {
    job: &'a Job,
    setup: &'a Setup<'a>,
    h2: &'a H2Setup,
    /// The worker's topic names, by number.
    topics: &'a [String],
}

/// A connection's life, whichever protocol, borrowed apart from its meters.
enum LifeMut<'a> {
    H1(&'a mut Life<1>),
    H2(&'a mut H2Life),
}

/// Advances one connection; `Err(kind)` when it failed. `closing`: the readiness event also
/// reported the peer's end of stream or an error, so reading goes on to find it. `bufs`: the
/// worker's read buffer, and its buffer for the plaintext of a TLS read. `sums`: the worker's
/// latency histogram and error counts (an HTTP/2 stream ends without its connection).
fn drive(
    c: &mut Conn,
    shared: &Shared<'_>,
    (read_buf, plain): (&mut [u8], &mut Vec<u8>),
    now_us: u64,
    (latency, errors): (&mut Latency, &mut HashMap<String, u64>),
    closing: bool,
) -> Result<(), String> {
    let Conn { stream, tls, proto } = c;
    let (mut life, meters) = match proto {
        Proto::H1 { life, meter } => (LifeMut::H1(life), std::slice::from_mut(meter)),
        Proto::H2(h) => {
            let (life, meters) = &mut **h;
            (LifeMut::H2(life), meters.as_mut_slice())
        }
    };
    let (setup, job) = (shared.setup, shared.job);
    let topic = match &life {
        LifeMut::H1(l) => shared
            .topics
            .get(l.topic() as usize)
            .map_or("", String::as_str),
        LifeMut::H2(_) => "",
    };
    let mut io = Io {
        stream,
        tls,
        now_us,
        interval_us: job.interval_us,
        latency,
        meters,
        errors,
        topics: shared.topics,
        jwt_secret: job.jwt_secret.as_deref(),
    };
    let connecting = match &life {
        LifeMut::H1(l) => l.phase() == Phase::Connecting,
        LifeMut::H2(l) => l.phase() == Phase::Connecting,
    };
    if connecting {
        if !source_ports::connected(io.stream)? {
            return Ok(());
        }
        match &mut life {
            LifeMut::H1(l) => {
                let token = job
                    .jwt_secret
                    .as_deref()
                    .map(|s| format!("&token={}", crate::wire::member_token(s)))
                    .unwrap_or_default();
                l.handle_connected(setup, topic, &token, &mut io)
                    .map_err(|e| e.to_string())?;
            }
            LifeMut::H2(l) => l.handle_connected(&mut io).map_err(|e| e.to_string())?,
        }
    }
    // TLS records rustls could not write yet (the handshake, or a request behind it).
    if let Some(t) = io.tls.as_mut() {
        t.flush(io.stream)
            .map_err(|e| format!("write: {}", e.kind()))?;
    }
    let input = |life: &mut LifeMut<'_>, io: &mut Io<'_>, bytes: &[u8]| match life {
        LifeMut::H1(l) => l
            .handle_input(setup, topic, bytes, io)
            .map_err(|e| e.to_string()),
        LifeMut::H2(l) => l
            .handle_input(shared.h2, bytes, io)
            .map_err(|e| e.to_string()),
    };
    let mut eof = false;
    loop {
        let n = match io.stream.read(read_buf) {
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
        let drained = n < read_buf.len() && io.tls.is_none() && !closing;
        let fresh = read_buf.get(..n).unwrap_or_default();
        let Some(t) = io.tls.as_mut() else {
            // The usual case: parsed in the shared buffer.
            input(&mut life, &mut io, fresh)?;
            if drained {
                break;
            }
            continue;
        };
        plain.clear();
        eof |= t.receive(io.stream, fresh, plain)?;
        input(&mut life, &mut io, plain)?;
    }
    if eof {
        return Err(match &mut life {
            LifeMut::H1(l) => l.handle_end(setup).to_string(),
            LifeMut::H2(l) => l.handle_end().to_string(),
        });
    }
    Ok(())
}

/// What a connection's [`Life`] writes through and reports to: its socket, and the worker's
/// measurements.
struct Io<'a> {
    stream: &'a TcpStream,
    tls: &'a mut Option<TlsClient>,
    now_us: u64,
    /// Interval of a steady feed (µs), for clump detection (0: none).
    interval_us: u64,
    latency: &'a mut Latency,
    /// The connection's subscribers' meters, by stream (one over HTTP/1.1).
    meters: &'a mut [Meter],
    errors: &'a mut HashMap<String, u64>,
    /// The worker's topic names, for HTTP/2 requests.
    topics: &'a [String],
    jwt_secret: Option<&'a str>,
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
                self.latency.record(latency);
                if let Some(m) = self.meters.get_mut(stream) {
                    m.latency_sum = m.latency_sum.saturating_add(latency);
                    m.clumps.see(self.now_us, self.interval_us);
                }
            }
            Event::Pong { .. } => {}
        }
    }
}

impl H2Host for Io<'_> {
    fn query(&mut self, topic: u32) -> String {
        let name = self.topics.get(topic as usize).map_or("", String::as_str);
        let token = self
            .jwt_secret
            .map(|s| format!("&token={}", crate::wire::member_token(s)))
            .unwrap_or_default();
        format!("topic={name}{token}")
    }

    fn stream_ended(&mut self, _stream: usize, why: StreamError) {
        *self.errors.entry(why.to_string()).or_default() += 1;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::ws::frame::encode_frame;
    use clarion_proto::ws::OpCode;

    const UPGRADED: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    /// A connection over a real loopback socket, connected but not yet subscribed, and the
    /// server's end.
    fn conn() -> (Conn, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        client.set_nonblocking(true).unwrap();
        let c = Conn {
            stream: TcpStream::from_std(client),
            tls: None,
            proto: Proto::H1 {
                life: Life::new(0),
                meter: Meter::default(),
            },
        };
        (c, server)
    }

    fn job() -> Job {
        Job {
            target: "127.0.0.1:1".parse().unwrap(),
            source: "127.0.0.1".parse().unwrap(),
            transport: Transport::Ws,
            topics: vec!["t".into()],
            connect_rate: 0,
            interval_us: 0,
            hello: None,
            tls: None,
            jwt_secret: None,
            http2: false,
            streams_per_conn: 1,
        }
    }

    fn setup(job: &Job) -> Setup<'_> {
        Setup {
            transport: job.transport,
            target: job.target,
            payloads: Payloads::Peers,
            max_frame: MAX_FRAME,
            hello: None,
        }
    }

    /// Drives `c` once with a read buffer of `len` bytes.
    fn drive_with(c: &mut Conn, len: usize, closing: bool) -> Result<(), String> {
        drive_job(c, &job(), len, closing, &mut HashMap::new())
    }

    /// Drives `c` of `job` once with a read buffer of `len` bytes, counting stream errors in
    /// `errors`.
    fn drive_job(
        c: &mut Conn,
        job: &Job,
        len: usize,
        closing: bool,
        errors: &mut HashMap<String, u64>,
    ) -> Result<(), String> {
        let topics = vec!["t".to_string(), "u".to_string()];
        let mut latency = Latency::default();
        let (mut buf, mut plain) = (vec![0u8; len], Vec::new());
        let shared = Shared {
            job,
            setup: &setup(job),
            h2: &H2Setup {
                target: job.target,
                tls: false,
                websocket: false,
            },
            topics: &topics,
        };
        drive(
            c,
            &shared,
            (&mut buf, &mut plain),
            10,
            (&mut latency, errors),
            closing,
        )
    }

    fn settle() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    #[test]
    fn a_connection_subscribes_counts_and_sees_the_close() {
        let (mut c, mut server) = conn();
        let mut input = UPGRADED.to_vec();
        input.extend(encode_frame(OpCode::Text, b"0 5 a"));
        input.extend(encode_frame(OpCode::Close, &[3, 232]));
        server.write_all(&input).unwrap();
        settle();
        // The request goes out, then everything in one read: the close is seen in the same turn.
        assert_eq!(
            drive_with(&mut c, 4096, false).unwrap_err(),
            "closed by server"
        );
        assert_eq!(c.received(), 1);
        assert!(!c.handshaking() && c.opened() == 0);
        let mut request = [0u8; 24];
        server.read_exact(&mut request).unwrap();
        assert_eq!(&request, b"GET /ws?topic=t HTTP/1.1");
    }

    #[test]
    fn a_short_read_ends_the_turn_unless_the_stream_is_ending() {
        let frame = encode_frame(OpCode::Text, b"0 5 a");
        let subscribed = || {
            let (mut c, mut server) = conn();
            server.write_all(UPGRADED).unwrap();
            settle();
            drive_with(&mut c, 4096, false).unwrap();
            assert_eq!(c.opened(), 1);
            server.write_all(&frame).unwrap();
            server.shutdown(std::net::Shutdown::Write).unwrap();
            settle();
            (c, server)
        };
        // A frame then the end of stream, read in a buffer that holds only the frame: a short
        // read, but the event said the stream is ending, so reading goes on and finds it.
        let (mut c, _server) = subscribed();
        assert_eq!(
            drive_with(&mut c, frame.len() + 1, true).unwrap_err(),
            "closed by server"
        );
        // Without that flag the short read ends the turn: the end of stream waits for its
        // own event.
        let (mut c, _server) = subscribed();
        assert!(drive_with(&mut c, frame.len() + 1, false).is_ok());
        assert_eq!(c.received(), 1);
        assert_eq!(
            drive_with(&mut c, frame.len() + 1, true).unwrap_err(),
            "closed by server"
        );
    }

    #[test]
    fn an_h2_connection_carries_its_streams_and_counts_their_ends() {
        use clarion_proto::h2::frame;
        use clarion_proto::h2::hpack::Encoder;
        let (mut c, mut server) = conn();
        c.proto = Proto::H2(Box::new((H2Life::new([0, 1]), vec![Meter::default(); 2])));
        let job = Job {
            http2: true,
            streams_per_conn: 2,
            ..job()
        };
        let mut errors = HashMap::new();
        // The preface goes out first.
        drive_job(&mut c, &job, 4096, false, &mut errors).unwrap();
        let mut preface = [0u8; 24];
        server.read_exact(&mut preface).unwrap();
        assert_eq!(&preface, frame::PREFACE);
        let mut input = Vec::new();
        frame::write_settings(&mut input, &[]);
        let mut enc = Encoder::new();
        let mut ok = Vec::new();
        enc.encode(
            [(":status", "200"), ("content-type", "text/event-stream")],
            &mut ok,
        );
        frame::write_headers(&mut input, 1, &ok, false, 16_384);
        let mut refused = Vec::new();
        enc.encode([(":status", "403")], &mut refused);
        frame::write_headers(&mut input, 3, &refused, true, 16_384);
        frame::write_data(&mut input, 1, b"data: 0 5 a\n\n", false);
        server.write_all(&input).unwrap();
        settle();
        drive_job(&mut c, &job, 4096, false, &mut errors).unwrap();
        assert_eq!((c.opened(), c.received(), c.connected()), (1, 1, true));
        assert_eq!(errors.get("h2 stream refused: HTTP 403"), Some(&1));
        // The requests name each stream's topic.
        let mut sent = vec![0u8; 4096];
        let n = server.read(&mut sent).unwrap();
        assert!(n > 30);
        let subs: Vec<(u32, bool)> = c.subs().map(|s| (s.topic, s.open)).collect();
        assert_eq!(subs, [(0, true), (1, false)]);
        // The end of the connection ends every stream.
        drop(server);
        settle();
        assert_eq!(
            drive_job(&mut c, &job, 4096, true, &mut errors).unwrap_err(),
            "closed by server"
        );
        assert_eq!(c.opened(), 0);
    }

    #[test]
    fn a_connection_record_stays_small() {
        // The million-connection runs need well under 1 KB of user space per connection.
        let size = std::mem::size_of::<Conn>();
        println!("size_of::<Conn>() = {size}");
        assert!(size <= 152, "{size}");
    }
}
