//! One connection of a load-generating worker ([`crate::worker`]): its socket, its TLS state
//! and its protocol's [`Life`] (or [`H2Life`], a stream per subscriber), what the worker
//! measures of each subscriber, and [`drive`], which advances a connection on a readiness
//! event: the reads, TLS, the life's input and what it writes back.

use std::collections::HashMap;
use std::io::{self, Read};

use mio::net::TcpStream;
use mio::Poll;

use crate::check::SeqChecker;
use crate::conn_life::{Event, Host, Life, Phase, Setup};
use crate::h2_life::{H2Host, H2Life, H2Setup, StreamError, StreamPhase};
use crate::source_ports::{self, SourcePorts};
use crate::stats::{Clumps, Latency};
use crate::tls_client::{TlsClient, TlsSetup};
use crate::wire::rand16;
use crate::worker_msg::Job;

/// Largest frame payload accepted from the server: far above any benchmark message, low
/// enough that a broken length cannot make a connection buffer without bound.
pub(crate) const MAX_FRAME: u64 = 64 * 1024 * 1024;

/// One connection: the socket and what the worker measures around its life.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    /// The TLS client state, when the job is over TLS.
    tls: Option<TlsClient>,
    proto: Proto,
}

/// What the worker measures of one subscriber.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meter {
    pub(crate) clumps: Clumps,
    /// Latencies of the messages counted, summed (µs): the subscriber's mean at the end.
    pub(crate) latency_sum: u64,
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
pub(crate) struct Sub<'a> {
    pub(crate) topic: u32,
    /// Open now (answered, not ended): it should have every message published.
    pub(crate) open: bool,
    pub(crate) check: &'a SeqChecker,
    pub(crate) meter: &'a Meter,
}

impl Conn {
    pub(crate) fn handshaking(&self) -> bool {
        match &self.proto {
            Proto::H1 { life, .. } => life.handshaking(),
            Proto::H2(h) => h.0.handshaking(),
        }
    }

    /// Subscribers answered and not ended.
    pub(crate) fn opened(&self) -> u64 {
        match &self.proto {
            Proto::H1 { life, .. } => u64::from(life.phase() == Phase::Open),
            Proto::H2(h) => h.0.open_streams() as u64,
        }
    }

    /// The connection itself is open (HTTP/1.1: answered; HTTP/2: past the SETTINGS).
    pub(crate) fn connected(&self) -> bool {
        match &self.proto {
            Proto::H1 { life, .. } => life.phase() == Phase::Open,
            Proto::H2(h) => h.0.phase() == Phase::Open,
        }
    }

    /// Messages received and checked, over every subscriber.
    pub(crate) fn received(&self) -> u64 {
        self.subs().map(|s| s.check.received()).sum()
    }

    pub(crate) fn subs(&self) -> Box<dyn Iterator<Item = Sub<'_>> + '_> {
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

    pub(crate) fn fail(&mut self) {
        match &mut self.proto {
            Proto::H1 { life, .. } => life.fail(),
            Proto::H2(h) => h.0.fail(),
        }
    }
}

/// Opens connection `index`, for the subscribers following `topics` (one, or a stream each
/// over HTTP/2).
pub(crate) fn open(
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
pub(crate) struct Shared<'a> {
    pub(crate) job: &'a Job,
    pub(crate) setup: &'a Setup<'a>,
    pub(crate) h2: &'a H2Setup,
    /// The worker's topic names, by number.
    pub(crate) topics: &'a [String],
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
pub(crate) fn drive(
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
    use crate::conn_life::Payloads;
    use crate::worker_msg::Transport;
    use clarion_proto::ws::frame::encode_frame;
    use clarion_proto::ws::OpCode;
    use std::io::Write;

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
