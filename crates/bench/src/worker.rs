//! One load-generating process: opens its share of the connections from one source address,
//! reads everything they receive, checks every delivery and measures latency.
//!
//! What a connection does with the bytes it reads (the answer, frames, events, polls, the
//! checks) is its [`Life`]; this file is the process around the lives: sockets, TLS, the poll
//! loop, the connect pace, and the latency and clump sums.
//!
//! It talks to the coordinator over stdin/stdout, one JSON object per line: a [`Job`] in, then
//! progress lines and a final [`Report`] out; a [`Finish`] on stdin says how many messages each
//! topic got, and the worker reports once every connection has them (or a deadline passes).

use std::collections::HashMap;
use std::io::{self, BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Poll, Token, Waker};
use serde::{Deserialize, Serialize};

use crate::check::{SeqChecker, Verdict};
use crate::conn_life::{Event, Host, Life, Payloads, Phase, Setup};
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

/// One connection: the socket and what the worker measures around its [`Life`].
struct Conn {
    stream: TcpStream,
    /// The TLS client state, when the job is over TLS.
    tls: Option<TlsClient>,
    /// The protocol: its topic is an index into the worker's topic names.
    life: Life<1>,
    clumps: Clumps,
    /// Latencies of the messages counted, summed (µs): the connection's mean at the end.
    latency_sum: u64,
}

impl Conn {
    /// The check of the connection's one topic.
    fn check(&self) -> &SeqChecker {
        let [check] = self.life.streams();
        check
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
            conns.iter().filter(|c| c.life.handshaking()).count()
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
                &setup,
                &topic_names,
                (&mut read_buf, &mut plain),
                now_us,
                &mut latency,
                closing,
            );
            if let Err(kind) = step {
                *report.errors.entry(kind).or_default() += 1;
                c.life.fail();
                let _ = poll.registry().deregister(&mut c.stream);
            }
        }
        let opened = || {
            conns
                .iter()
                .filter(|c| c.life.phase() == Phase::Open)
                .count() as u64
        };
        let became_ready =
            !ready_sent && planned == plan.len() && !conns.iter().any(|c| c.life.handshaking());
        if became_ready {
            ready_sent = true;
            report.opened = opened();
            report.connect_seconds = started.elapsed().as_secs_f64();
        }
        // Readiness is told at once: the coordinator waits for it before publishing.
        if Instant::now() >= next_progress || became_ready {
            next_progress = Instant::now() + PROGRESS_EVERY;
            let opened = opened();
            let received = conns.iter().map(|c| c.check().received()).sum();
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
                c.life.phase() != Phase::Open
                    || c.check().received()
                        >= topic_names
                            .get(c.life.topic() as usize)
                            .and_then(|t| f.published.get(t))
                            .copied()
                            .unwrap_or(0)
            });
            if all || Instant::now() >= *deadline {
                let mut means = Latency::default();
                for c in &conns {
                    let expected = topic_names
                        .get(c.life.topic() as usize)
                        .and_then(|t| f.published.get(t))
                        .copied()
                        .unwrap_or(0);
                    if c.life.phase() != Phase::Dead || c.check().received() > 0 {
                        report.verdict.add(&c.check().finish(expected));
                    } else {
                        report.verdict.missing += expected;
                    }
                    report.clumped += c.clumps.clumped;
                    if let Some(mean) = c.latency_sum.checked_div(c.check().received()) {
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
        life: Life::new(topic),
        clumps: Clumps::default(),
        latency_sum: 0,
    })
}

/// Advances one connection; `Err(kind)` when it failed. `closing`: the readiness event also
/// reported the peer's end of stream or an error, so reading goes on to find it. `bufs`: the
/// worker's read buffer, and its buffer for the plaintext of a TLS read.
#[allow(clippy::too_many_arguments)]
fn drive(
    c: &mut Conn,
    job: &Job,
    setup: &Setup<'_>,
    topics: &[String],
    (read_buf, plain): (&mut [u8], &mut Vec<u8>),
    now_us: u64,
    latency: &mut Latency,
    closing: bool,
) -> Result<(), String> {
    let topic = topics
        .get(c.life.topic() as usize)
        .map_or("", String::as_str);
    let Conn {
        stream,
        tls,
        life,
        clumps,
        latency_sum,
    } = c;
    let mut io = Io {
        stream,
        tls,
        now_us,
        interval_us: job.interval_us,
        latency,
        clumps,
        latency_sum,
    };
    if life.phase() == Phase::Connecting {
        if !source_ports::connected(io.stream)? {
            return Ok(());
        }
        let token = job
            .jwt_secret
            .as_deref()
            .map(|s| format!("&token={}", crate::wire::member_token(s)))
            .unwrap_or_default();
        life.handle_connected(setup, topic, &token, &mut io)
            .map_err(|e| e.to_string())?;
    }
    // TLS records rustls could not write yet (the handshake, or a request behind it).
    if let Some(t) = io.tls.as_mut() {
        t.flush(io.stream)
            .map_err(|e| format!("write: {}", e.kind()))?;
    }
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
            life.handle_input(setup, topic, fresh, &mut io)
                .map_err(|e| e.to_string())?;
            if drained {
                break;
            }
            continue;
        };
        plain.clear();
        eof |= t.receive(io.stream, fresh, plain)?;
        life.handle_input(setup, topic, plain, &mut io)
            .map_err(|e| e.to_string())?;
    }
    if eof {
        return Err(life.handle_end(setup).to_string());
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
    clumps: &'a mut Clumps,
    latency_sum: &'a mut u64,
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
            Event::Delivered { published_us, .. } => {
                let latency = self.now_us.saturating_sub(published_us);
                self.latency.record(latency);
                *self.latency_sum = self.latency_sum.saturating_add(latency);
                self.clumps.see(self.now_us, self.interval_us);
            }
            Event::Pong { .. } => {}
        }
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
            life: Life::new(0),
            clumps: Clumps::default(),
            latency_sum: 0,
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
        let job = job();
        let topics = vec!["t".to_string()];
        let mut latency = Latency::default();
        let (mut buf, mut plain) = (vec![0u8; len], Vec::new());
        drive(
            c,
            &job,
            &setup(&job),
            &topics,
            (&mut buf, &mut plain),
            10,
            &mut latency,
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
        assert_eq!(c.check().received(), 1);
        assert_eq!(c.life.phase(), Phase::Dead);
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
            assert_eq!(c.life.phase(), Phase::Open);
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
        assert_eq!(c.check().received(), 1);
        assert_eq!(
            drive_with(&mut c, frame.len() + 1, true).unwrap_err(),
            "closed by server"
        );
    }

    #[test]
    fn a_connection_record_stays_small() {
        // The million-connection runs need well under 1 KB of user space per connection.
        let size = std::mem::size_of::<Conn>();
        println!("size_of::<Conn>() = {size}");
        assert!(size <= 152, "{size}");
    }
}
