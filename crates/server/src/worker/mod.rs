//! The event loop: one per worker thread, each with its own listener (`SO_REUSEPORT`), poller,
//! connection slab, subscriber index and read buffer.
//!
//! This is the only place where client sockets are read and written, and where time passes: the
//! loop keeps a coarse clock in whole seconds and sweeps its connections once a second for
//! handshake, ping, idle and closing deadlines, so no connection owns a timer. Protocol meaning
//! comes from `clarion_proto`; HTTP routing lives in [`http`], WebSocket handling in [`ws`].
//!
//! Sub-modules: [`conn`] (the connection record and write path), [`index`] (topic → local
//! subscribers), [`http`] (request heads on the client listener, upgrades, SSE, streaming and
//! long-poll responses), [`ws`] (frames, control messages, subscriptions, deliveries), [`tls`]
//! (one connection's TLS records).
//!
//! A connection accepted on the TLS listener carries a [`tls::Session`]: its bytes are
//! decrypted into a worker buffer before the same HTTP/WebSocket code sees them, and its writes
//! are encrypted in the write path; nothing else knows the difference.

pub mod conn;
mod grip;
mod http;
pub mod index;
pub mod tls;
mod tls_records;
mod ws;

use std::collections::HashMap;
use std::io::{self, Read as _};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::broker::Broker;
use crate::config::Config;
use crate::hub::{lock, Inbox};
use crate::log;
use crate::message::Published;
use crate::metrics::{CloseReason, Metrics};
use conn::{Conn, State, GRIP, PINGED, WRITE_SHUT};
use index::TopicIndex;

const LISTENER: Token = Token(usize::MAX - 1);
const TLS_LISTENER: Token = Token(usize::MAX - 3);
/// The token under which a worker's waker is registered.
pub const WAKER: Token = Token(usize::MAX - 2);

/// Reads from one connection per readiness event before others get a turn; the rest is read on
/// the next loop iteration, so one fast sender cannot starve the loop.
const READ_BUDGET: usize = 16;

/// Seconds a closing connection may take to read our last bytes and close its side. Long enough
/// for a slow link to drain a Close frame, short enough that dead peers do not pile up.
const CLOSE_LINGER_SECS: u32 = 5;

/// What every worker shares.
pub struct Shared {
    /// The configuration, validated.
    pub config: Config,
    /// Publishing, subscriptions and history (see [`crate::broker`]).
    pub broker: Broker,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Set once by the signal handler; workers stop accepting and close their connections.
    pub stopping: AtomicBool,
    /// Client connections open across all workers (compared with `cap`).
    pub open: AtomicUsize,
    /// Most client connections at once.
    pub cap: usize,
    /// Open connections per client address key, when `max_connections_per_address` is set.
    /// Touched only at accept and close, never per message.
    pub per_address: Mutex<HashMap<u32, u32>>,
    /// Certificates and TLS settings, when a TLS listener is configured.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// GRIP proxy mode, when routes are configured.
    pub grip: Option<crate::grip::Proxy>,
}

/// Binds the client listener once per worker on the same address with `SO_REUSEPORT`, so the
/// kernel spreads new connections over the workers without a shared accept lock. The first bind
/// resolves port 0; the others reuse the port it got.
pub fn bind_listeners(addr: SocketAddr, n: usize) -> io::Result<Vec<std::net::TcpListener>> {
    let mut out = Vec::with_capacity(n);
    let mut addr = addr;
    for _ in 0..n {
        let domain = socket2::Domain::for_address(addr);
        let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        // The kernel caps this at net.core.somaxconn; ask for plenty so connect storms queue.
        s.listen(4096)?;
        let l: std::net::TcpListener = s.into();
        addr = l.local_addr()?;
        out.push(l);
    }
    Ok(out)
}

/// The `clarion_connections` gauge that counts connections in `state` (none for `Closing`,
/// which has left the count already).
pub(super) fn gauge(m: &Metrics, state: State) -> Option<&std::sync::atomic::AtomicU64> {
    match state {
        State::Http | State::Proxy => Some(&m.http_connections),
        State::Ws => Some(&m.ws_connections),
        State::Sse => Some(&m.sse_connections),
        State::Stream => Some(&m.stream_connections),
        State::Poll => Some(&m.polls_held),
        State::Closing => None,
    }
}

/// A long-poll being held: when it expires, and the cursor its empty answer carries.
pub(super) struct PollHold {
    deadline: u32,
    cursor: String,
}

/// Byte counts gathered during one loop iteration and added to the shared metrics once.
#[derive(Default)]
struct Tally {
    bytes_in: u64,
    bytes_out: u64,
    delivered: u64,
}

/// One event loop and everything it owns.
pub struct Worker {
    id: usize,
    poll: Poll,
    listener: Option<TcpListener>,
    tls_listener: Option<TcpListener>,
    conns: Slab<Conn>,
    index: TopicIndex,
    /// Shared by every connection of this worker: reads land here and are parsed in place.
    read_buf: Vec<u8>,
    /// Decrypted bytes of one TLS read, and the handshake records it produced (shared by every
    /// TLS connection of this worker).
    plain_buf: Vec<u8>,
    handshake_buf: Vec<u8>,
    inbox: Arc<Inbox>,
    shared: Arc<Shared>,
    start: Instant,
    /// Seconds since `start`, updated once per loop iteration.
    now: u32,
    last_sweep: u32,
    /// An empty Ping frame, shared by every keep-alive ping.
    ping_frame: Arc<[u8]>,
    /// An SSE comment and an empty NDJSON line (as a chunk): keep-alives for HTTP streams.
    sse_keepalive: Arc<[u8]>,
    stream_keepalive: Arc<[u8]>,
    /// Held long-polls, by slab key. Only polls pay for this entry, not idle connections.
    polls: HashMap<u32, PollHold>,
    /// GRIP connections' state beyond their record, by slab key (proxy mode only).
    grip: HashMap<u32, grip::GripConn>,
    /// Inflaters of clients that compress with context takeover, created when such a client
    /// first sends a compressed message.
    inflaters: HashMap<u32, clarion_proto::ws::deflate::Inflater>,
    /// Dedicated-mode compressors, created at a connection's first compressed delivery.
    deflaters: HashMap<u32, clarion_proto::ws::deflate::Compressor>,
    /// How shared compressed frames are made.
    deflate_settings: crate::message::DeflateSettings,
    /// Recycled vector for inbox swaps.
    spare: Vec<Arc<Published>>,
    /// Connections whose read budget ran out; read again next iteration.
    more_to_read: Vec<u32>,
    /// `accept` failed for lack of descriptors; retry on the next sweep.
    accept_blocked: bool,
    shutdown_deadline: Option<Instant>,
    tally: Tally,
}

impl Worker {
    /// A worker for `listener` (and `tls_listener`); `poll` is the poller whose waker is in
    /// `inbox`.
    pub fn new(
        id: usize,
        poll: Poll,
        listener: std::net::TcpListener,
        tls_listener: Option<std::net::TcpListener>,
        inbox: Arc<Inbox>,
        shared: Arc<Shared>,
    ) -> io::Result<Worker> {
        let mut listener = TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let tls_listener = match tls_listener {
            Some(l) => {
                let mut l = TcpListener::from_std(l);
                poll.registry()
                    .register(&mut l, TLS_LISTENER, Interest::READABLE)?;
                Some(l)
            }
            None => None,
        };
        let read_buf = vec![0; shared.config.read_buffer];
        let deflate_settings = crate::message::DeflateSettings {
            threshold: shared.config.compression_threshold,
            level: shared.config.compression_level,
        };
        Ok(Worker {
            id,
            poll,
            listener: Some(listener),
            tls_listener,
            conns: Slab::new(),
            index: TopicIndex::default(),
            read_buf,
            plain_buf: Vec::new(),
            handshake_buf: Vec::new(),
            inbox,
            shared,
            start: Instant::now(),
            now: 0,
            last_sweep: 0,
            ping_frame: clarion_proto::ws::frame::encode_frame(
                clarion_proto::ws::OpCode::Ping,
                b"",
            )
            .into(),
            sse_keepalive: Arc::from(&b":\n\n"[..]),
            stream_keepalive: {
                let mut v = Vec::new();
                clarion_proto::http1::write_chunk(&mut v, b"\n");
                v.into()
            },
            polls: HashMap::new(),
            grip: HashMap::new(),
            inflaters: HashMap::new(),
            deflaters: HashMap::new(),
            deflate_settings,
            spare: Vec::new(),
            more_to_read: Vec::new(),
            accept_blocked: false,
            shutdown_deadline: None,
            tally: Tally::default(),
        })
    }

    /// Runs until shutdown has closed every connection (or its deadline passed).
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        loop {
            let timeout = if self.more_to_read.is_empty() {
                Duration::from_secs(1)
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::warn(format_args!("worker {}: poll failed: {e}", self.id));
                }
                continue;
            }
            self.now = self.start.elapsed().as_secs() as u32;
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(false),
                    TLS_LISTENER => self.accept_all(true),
                    WAKER => {}
                    Token(k) => {
                        let k = k as u32;
                        if ev.is_writable() {
                            self.on_writable(k);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.on_readable(k);
                        }
                    }
                }
            }
            for k in std::mem::take(&mut self.more_to_read) {
                self.on_readable(k);
            }
            self.grip_answers();
            self.drain_inbox();
            if self.shutdown_deadline.is_none() && self.shared.stopping.load(Relaxed) {
                self.begin_shutdown();
            }
            if self.now != self.last_sweep {
                self.last_sweep = self.now;
                self.sweep();
            }
            self.flush_tally();
            if let Some(deadline) = self.shutdown_deadline {
                if self.conns.is_empty() || Instant::now() >= deadline {
                    break;
                }
            }
        }
        let left = self.conns.len();
        if left > 0 {
            log::warn(format_args!(
                "worker {}: {left} connections did not close in time",
                self.id
            ));
        }
        for k in self.conns.iter().map(|(k, _)| k as u32).collect::<Vec<_>>() {
            self.drop_conn(k, CloseReason::Shutdown);
        }
        self.flush_tally();
    }

    fn accept_all(&mut self, tls: bool) {
        loop {
            let listener = if tls {
                self.tls_listener.as_ref()
            } else {
                self.listener.as_ref()
            };
            let Some(listener) = listener else {
                return;
            };
            let (stream, peer) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    if !self.accept_blocked {
                        log::warn(format_args!(
                            "worker {}: accept: {e}; retrying each second",
                            self.id
                        ));
                    }
                    self.accept_blocked = true;
                    return;
                }
                Err(e) => {
                    log::debug(format_args!("accept: {e}"));
                    continue;
                }
            };
            self.accept_blocked = false;
            self.adopt(stream, conn::address_key(peer.ip()), tls);
        }
    }

    /// Takes a new connection, or refuses it at once when a limit is reached: the refusal is
    /// written immediately (the request is never read) and the connection closes like any other,
    /// so a flood costs a slab entry for at most `CLOSE_LINGER_SECS`.
    fn adopt(&mut self, mut stream: TcpStream, peer: u32, tls: bool) {
        let refusal = self.admit(peer);
        let session = match (tls, &self.shared.tls) {
            (false, _) => None,
            (true, Some(t)) if refusal.is_none() => match tls::Session::new(t.config()) {
                Ok(s) => Some(Box::new(s)),
                Err(e) => {
                    log::warn(format_args!("TLS session: {e}"));
                    self.note_gone(State::Http, peer);
                    return;
                }
            },
            // Refused before TLS begins: there is no channel to say why, so just close.
            (true, _) => return,
        };
        // Push messages are small and latency matters more than segment count.
        let _ = stream.set_nodelay(true);
        let entry = self.conns.vacant_entry();
        let k = entry.key() as u32;
        let registered = self.poll.registry().register(
            &mut stream,
            Token(entry.key()),
            Interest::READABLE | Interest::WRITABLE,
        );
        if let Err(e) = registered {
            log::warn(format_args!("register: {e}"));
            if refusal.is_none() {
                self.note_gone(State::Http, peer);
            }
            return;
        }
        match refusal {
            None => {
                let mut conn = Conn::new(stream, State::Http, self.now, peer);
                if session.is_some() {
                    self.shared.metrics.tls_connections.fetch_add(1, Relaxed);
                }
                conn.tls = session;
                entry.insert(conn);
            }
            Some((status, why)) => {
                entry.insert(Conn::new(stream, State::Closing, self.now, peer));
                log::debug(format_args!("refused at accept: {why}"));
                let mut out = Vec::with_capacity(160);
                let headers = [
                    ("Retry-After", "5"),
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("Connection", "close"),
                ];
                clarion_proto::http1::write_response_head(
                    &mut out,
                    status,
                    &headers,
                    Some(why.len() + 1),
                );
                out.extend_from_slice(why.as_bytes());
                out.push(b'\n');
                self.write_to(k, &Arc::from(out), None);
            }
        }
    }

    /// Counts a new connection against the limits; `Some((status, reason))` refuses it.
    fn admit(&self, peer: u32) -> Option<(u16, &'static str)> {
        let (shared, m) = (&self.shared, &self.shared.metrics);
        if shared.open.fetch_add(1, Relaxed) >= shared.cap {
            shared.open.fetch_sub(1, Relaxed);
            m.refused_capacity.fetch_add(1, Relaxed);
            return Some((503, "server at its connection limit"));
        }
        let handshakes = shared.config.max_handshakes;
        if handshakes > 0 && m.http_connections.load(Relaxed) >= handshakes as u64 {
            shared.open.fetch_sub(1, Relaxed);
            m.refused_handshakes.fetch_add(1, Relaxed);
            return Some((503, "too many connections still sending their request"));
        }
        let per_address = shared.config.max_connections_per_address;
        if per_address > 0 {
            let mut counts = lock(&shared.per_address);
            let n = counts.entry(peer).or_insert(0);
            if *n as usize >= per_address {
                drop(counts);
                shared.open.fetch_sub(1, Relaxed);
                m.refused_address.fetch_add(1, Relaxed);
                return Some((429, "too many connections from your address"));
            }
            *n += 1;
        }
        m.http_connections.fetch_add(1, Relaxed);
        None
    }

    fn on_readable(&mut self, k: u32) {
        for _ in 0..READ_BUDGET {
            let Some(conn) = self.conns.get_mut(k as usize) else {
                return;
            };
            let res = (&conn.stream).read(&mut self.read_buf);
            match res {
                Ok(0) => {
                    let reason = match conn.state {
                        State::Http | State::Closing => CloseReason::HttpDone,
                        State::Ws | State::Sse | State::Stream | State::Poll | State::Proxy => {
                            CloseReason::Disconnected
                        }
                    };
                    self.drop_conn(k, reason);
                    return;
                }
                Ok(n) => {
                    self.tally.bytes_in += n as u64;
                    if conn.state == State::Ws {
                        conn.last_seen = self.now;
                        conn.flags &= !PINGED;
                    }
                    if conn.tls.is_some() {
                        self.on_tls_data(k, n);
                    } else {
                        self.on_data(k, n);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::debug(format_args!("read: {e}"));
                    self.drop_conn(k, CloseReason::Disconnected);
                    return;
                }
            }
        }
        self.more_to_read.push(k);
    }

    /// Handles `n` fresh bytes in the read buffer, joined to any partial input kept from before.
    fn on_data(&mut self, k: u32, n: usize) {
        let mut fresh = std::mem::take(&mut self.read_buf);
        self.consume(k, fresh.get_mut(..n).unwrap_or_default());
        self.read_buf = fresh;
    }

    /// Handles `n` fresh bytes of ciphertext: decrypts them, sends what the handshake needs,
    /// and hands the plaintext to [`Self::consume`].
    fn on_tls_data(&mut self, k: u32, n: usize) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let Some(session) = conn.tls.as_mut() else {
            return;
        };
        let mut fresh = std::mem::take(&mut self.read_buf);
        let data = fresh.get_mut(..n).unwrap_or_default();
        // A plain HTTP request on the TLS port (a ClientHello starts with record type 22):
        // answer it in plain text, as nginx does, instead of a TLS alert nobody can read.
        if session.untouched() && data.first().is_some_and(|b| b.is_ascii_uppercase()) {
            self.read_buf = fresh;
            self.refuse_plaintext(k);
            return;
        }
        let (mut plain, mut out) = (
            std::mem::take(&mut self.plain_buf),
            std::mem::take(&mut self.handshake_buf),
        );
        let was_established = session.established();
        let res = session.read(data, &mut plain, &mut out);
        self.read_buf = fresh;
        let written = if out.is_empty() {
            Ok(0)
        } else {
            conn.write_records(&out)
        };
        match (res, written) {
            (Ok(outcome), Ok(w)) => {
                self.tally.bytes_out += w as u64;
                if outcome.handshake_done {
                    self.shared.metrics.tls_handshakes.fetch_add(1, Relaxed);
                }
                if !plain.is_empty() {
                    self.consume(k, &mut plain);
                }
                if outcome.peer_closed {
                    self.drop_conn(k, CloseReason::Disconnected);
                }
            }
            (Err(e), _) => {
                log::debug(format_args!("TLS: {e}"));
                let m = &self.shared.metrics;
                if was_established {
                    m.tls_errors.fetch_add(1, Relaxed);
                } else {
                    m.tls_failed(tls::failure_reason(&e));
                }
                // The alert (if any) is written; the connection ends.
                self.drop_conn(k, CloseReason::Disconnected);
            }
            (Ok(_), Err(e)) => {
                log::debug(format_args!("write: {e}"));
                self.drop_conn(k, CloseReason::Disconnected);
            }
        }
        plain.clear();
        out.clear();
        self.plain_buf = plain;
        self.handshake_buf = out;
    }

    /// Answers a plain HTTP request that arrived on the TLS listener with 400, in plain text.
    fn refuse_plaintext(&mut self, k: u32) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        conn.tls = None;
        let m = &self.shared.metrics;
        m.tls_connections.fetch_sub(1, Relaxed);
        m.tls_failed("plaintext");
        m.http_errors.fetch_add(1, Relaxed);
        log::debug(format_args!("plain HTTP on the TLS listener"));
        let body = "this port speaks TLS: use https:// or wss://\n";
        let mut out = Vec::with_capacity(160);
        clarion_proto::http1::write_response_head(
            &mut out,
            400,
            &[
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Connection", "close"),
            ],
            Some(body.len()),
        );
        out.extend_from_slice(body.as_bytes());
        self.start_closing(k, Some(out.into()), CloseReason::HttpDone);
    }

    /// Interprets fresh plaintext, joined to any partial input kept from before.
    pub(super) fn consume(&mut self, k: u32, data: &mut [u8]) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        if conn.state == State::Closing {
            return; // Waiting for EOF: the peer's bytes no longer mean anything.
        }
        if let Some(mut input) = conn.input.take() {
            input.extend_from_slice(data);
            let used = self.process(k, &mut input);
            input.drain(..used.min(input.len()));
            if let Some(conn) = self.conns.get_mut(k as usize) {
                if !input.is_empty() && conn.state != State::Closing {
                    conn.input = Some(input);
                }
            }
        } else {
            let used = self.process(k, data);
            if let Some(conn) = self.conns.get_mut(k as usize) {
                if let Some(rest) = data.get(used..).filter(|r| !r.is_empty()) {
                    if conn.state != State::Closing {
                        // Reserve the whole frame at once when its length is known.
                        let want = clarion_proto::ws::Receiver::frame_len(rest)
                            .filter(|_| conn.state == State::Ws)
                            .map_or(rest.len(), |l| l as usize);
                        let mut v = Vec::with_capacity(want.max(rest.len()));
                        v.extend_from_slice(rest);
                        conn.input = Some(Box::new(v));
                    }
                }
            }
        }
    }

    /// Interprets bytes according to the connection's state; returns how many were used (the
    /// rest is an incomplete head or frame). The connection may be closed on return.
    fn process(&mut self, k: u32, data: &mut [u8]) -> usize {
        let mut pos = 0;
        while pos < data.len() {
            let Some(conn) = self.conns.get(k as usize) else {
                return data.len();
            };
            let rest = data.get_mut(pos..).unwrap_or_default();
            match conn.state {
                State::Http => match self.on_http(k, rest) {
                    Some(used) => pos += used,
                    None => return pos,
                },
                State::Ws => return pos + self.on_frames(k, rest),
                // Waiting for a backend: a pipelined request waits its turn (bounded), and is
                // read once the answer is out and the connection is back in `Http`.
                State::Proxy => {
                    if data.len() - pos > self.shared.config.head_limits().max_head_bytes {
                        self.drop_conn(k, CloseReason::Disconnected);
                        return data.len();
                    }
                    return pos;
                }
                // A streaming or held response: the client has nothing more to say, and
                // anything it sends (pipelined requests included) is discarded.
                State::Sse | State::Stream | State::Poll | State::Closing => return data.len(),
            }
        }
        pos
    }

    fn on_writable(&mut self, k: u32) {
        self.flush(k, None);
    }

    /// Writes what a connection owes, then applies the closing and backlog rules.
    fn flush(&mut self, k: u32, cap: Option<usize>) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        match conn.flush() {
            Ok(n) => self.tally.bytes_out += n as u64,
            Err(e) => {
                log::debug(format_args!("write: {e}"));
                self.drop_conn(k, CloseReason::Disconnected);
                return;
            }
        }
        self.after_write(k, cap);
    }

    /// After a write: a closing connection whose last bytes are out shuts its write side; an
    /// open one that owes more than `cap` bytes is a slow consumer.
    fn after_write(&mut self, k: u32, cap: Option<usize>) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let pending = conn.backlog_bytes();
        match conn.state {
            State::Closing if pending == 0 && !conn.has(WRITE_SHUT) => {
                conn.flags |= WRITE_SHUT;
                conn.shutdown_write();
            }
            State::Ws if cap.is_some_and(|cap| pending > cap) => {
                conn.discard_unstarted();
                log::debug(format_args!("slow consumer: {pending} bytes unsent"));
                self.close_ws(
                    k,
                    clarion_proto::ws::CloseCode::Policy,
                    "slow consumer",
                    CloseReason::SlowConsumer,
                );
            }
            State::Sse | State::Stream if cap.is_some_and(|cap| pending > cap) => {
                // No way to say why in-band without breaking the stream's framing: close it
                // after the message in flight; the client reconnects and resumes by id.
                conn.discard_unstarted();
                log::debug(format_args!("slow consumer: {pending} bytes unsent"));
                self.start_closing(k, None, CloseReason::SlowConsumer);
            }
            _ => {}
        }
    }

    /// Sends a reply to something the client sent (handshake answer, pong, control reply,
    /// echo). Replies may exceed `max_backlog` by one largest message, so an echo of a large
    /// message is not mistaken for a slow consumer, while a client that floods requests
    /// without reading the answers is still cut off.
    fn send(&mut self, k: u32, data: &Arc<[u8]>) {
        let cfg = &self.shared.config;
        let cap = cfg
            .max_backlog
            .saturating_add(cfg.max_message_size)
            .saturating_add(14);
        self.write_to(k, data, Some(cap));
    }

    /// Sends a published message (or a keep-alive ping) under the slow-consumer cap.
    fn deliver(&mut self, k: u32, data: &Arc<[u8]>) {
        self.write_to(k, data, Some(self.shared.config.max_backlog));
    }

    fn write_to(&mut self, k: u32, data: &Arc<[u8]>, cap: Option<usize>) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        match conn.send(data) {
            Ok(n) => self.tally.bytes_out += n as u64,
            Err(e) => {
                log::debug(format_args!("write: {e}"));
                self.drop_conn(k, CloseReason::Disconnected);
                return;
            }
        }
        self.after_write(k, cap);
    }

    /// Delivers several frames to one subscriber, coalesced into as few writes as possible.
    fn deliver_all(&mut self, k: u32, frames: &[&Arc<[u8]>]) {
        self.write_all_to(k, frames, Some(self.shared.config.max_backlog));
    }

    /// Writes several buffers with as few system calls as possible, then applies `cap`.
    fn write_all_to(&mut self, k: u32, frames: &[&Arc<[u8]>], cap: Option<usize>) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        match conn.send_all(frames) {
            Ok(n) => self.tally.bytes_out += n as u64,
            Err(e) => {
                log::debug(format_args!("write: {e}"));
                self.drop_conn(k, CloseReason::Disconnected);
                return;
            }
        }
        self.after_write(k, cap);
    }

    /// Enters `Closing` after queueing `last` (a Close frame or a final HTTP answer): the
    /// connection leaves every topic now, and is dropped once the peer has read and closed.
    fn start_closing(&mut self, k: u32, last: Option<Arc<[u8]>>, reason: CloseReason) {
        self.leave_all_topics(k);
        self.forget_side_state(k);
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let was = conn.state;
        if was == State::Closing {
            return;
        }
        conn.state = State::Closing;
        conn.last_seen = self.now;
        conn.input = None;
        conn.rx = Default::default();
        let peer = conn.peer;
        self.note_gone(was, peer);
        self.shared.metrics.closed(reason);
        if let Some(bytes) = last {
            self.write_to(k, &bytes, None);
        } else {
            self.after_write(k, None);
        }
    }

    /// Sends a Close frame and starts closing a WebSocket.
    fn close_ws(
        &mut self,
        k: u32,
        code: clarion_proto::ws::CloseCode,
        why: &str,
        reason: CloseReason,
    ) {
        let frame = clarion_proto::ws::close::encode_close_frame(code, why);
        self.start_closing(k, Some(frame.into()), reason);
    }

    /// Drops what a connection may hold outside its record (a held poll, compression state).
    fn forget_side_state(&mut self, k: u32) {
        self.grip_forget(k);
        self.polls.remove(&k);
        self.inflaters.remove(&k);
        self.deflaters.remove(&k);
    }

    /// Removes a connection at once (EOF, reset, or end of closing).
    fn drop_conn(&mut self, k: u32, reason: CloseReason) {
        self.leave_all_topics(k);
        self.forget_side_state(k);
        let Some(conn) = self.conns.try_remove(k as usize) else {
            return;
        };
        if conn.tls.is_some() {
            self.shared.metrics.tls_connections.fetch_sub(1, Relaxed);
        }
        if conn.state != State::Closing {
            self.note_gone(conn.state, conn.peer);
            self.shared.metrics.closed(reason);
        }
        // Dropping the stream closes the descriptor, which also removes it from epoll.
    }

    /// Updates the gauges and the connection counts when a connection from `peer` leaves
    /// `state` for good.
    fn note_gone(&self, state: State, peer: u32) {
        let m = &self.shared.metrics;
        if state != State::Closing && self.shared.config.max_connections_per_address > 0 {
            let mut counts = lock(&self.shared.per_address);
            if let Some(n) = counts.get_mut(&peer) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&peer);
                }
            }
        }
        if let Some(g) = gauge(m, state) {
            g.fetch_sub(1, Relaxed);
            self.shared.open.fetch_sub(1, Relaxed);
        }
    }

    pub(super) fn leave_all_topics(&mut self, k: u32) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        for tid in conn.subs.take_all() {
            if let Some(name) = self.index.remove(tid, k) {
                self.shared.broker.unsubscribe(self.id, &name);
            }
        }
    }

    /// Once a second: handshake deadlines, keep-alive pings and lines, idle timeouts, long-poll
    /// deadlines, closing deadlines, and (on worker 0) history expiry.
    fn sweep(&mut self) {
        if self.accept_blocked {
            self.accept_all(false);
            self.accept_all(true);
        }
        if self.id == 0 {
            self.shared.broker.expire();
        }
        self.grip_sweep();
        let cfg = &self.shared.config;
        let (handshake, ping, idle, keepalive) = (
            cfg.handshake_timeout as u32,
            cfg.ping_interval as u32,
            cfg.idle_timeout as u32,
            cfg.sse_keepalive as u32,
        );
        let mut expired: Vec<(u32, CloseReason)> = Vec::new();
        let mut to_ping: Vec<u32> = Vec::new();
        let mut to_keepalive: Vec<(u32, bool)> = Vec::new();
        for (k, conn) in self.conns.iter_mut() {
            if let Some(t) = conn.tls.as_mut() {
                t.compact();
            }
            let quiet = self.now.saturating_sub(conn.last_seen);
            match conn.state {
                State::Http if quiet >= handshake => {
                    if conn.tls.as_ref().is_some_and(|t| !t.established()) {
                        self.shared.metrics.tls_failed("timeout");
                    }
                    expired.push((k as u32, CloseReason::HandshakeTimeout));
                }
                State::Ws if idle > 0 && quiet >= idle => {
                    expired.push((k as u32, CloseReason::IdleTimeout));
                }
                State::Ws if ping > 0 && quiet >= ping && !conn.has(PINGED) => {
                    conn.flags |= PINGED;
                    to_ping.push(k as u32);
                }
                // GRIP streams send the backend's keep-alives (see `grip_sweep`), never ours.
                State::Sse | State::Stream
                    if keepalive > 0 && quiet >= keepalive && !conn.has(GRIP) =>
                {
                    conn.last_seen = self.now;
                    to_keepalive.push((k as u32, conn.state == State::Sse));
                }
                State::Closing if quiet >= CLOSE_LINGER_SECS => {
                    expired.push((k as u32, CloseReason::Disconnected));
                }
                _ => {}
            }
        }
        let due: Vec<(u32, String)> = self
            .polls
            .iter()
            .filter(|(_, h)| self.now >= h.deadline)
            .map(|(k, h)| (*k, h.cursor.clone()))
            .collect();
        for (k, cursor) in due {
            let body = http::messages_body(std::iter::empty(), &cursor, &[]);
            self.answer_poll(k, &Arc::from(body));
        }
        let (sse_ka, stream_ka) = (
            Arc::clone(&self.sse_keepalive),
            Arc::clone(&self.stream_keepalive),
        );
        for (k, sse) in to_keepalive {
            self.deliver(k, if sse { &sse_ka } else { &stream_ka });
        }
        for (k, reason) in expired {
            let (state, partial) = match self.conns.get(k as usize) {
                Some(c) => (c.state, c.input.is_some()),
                None => continue,
            };
            match state {
                State::Ws => {
                    log::debug(format_args!("idle timeout"));
                    self.close_ws(
                        k,
                        clarion_proto::ws::CloseCode::GoingAway,
                        "idle timeout",
                        reason,
                    );
                }
                // Part of a request head arrived, but not all of it in time: say so.
                State::Http if partial => {
                    self.shared.metrics.http_errors.fetch_add(1, Relaxed);
                    log::debug(format_args!("request head timed out"));
                    let mut out = Vec::with_capacity(128);
                    let body = "request head not received in time\n";
                    clarion_proto::http1::write_response_head(
                        &mut out,
                        408,
                        &[
                            ("Content-Type", "text/plain; charset=utf-8"),
                            ("Connection", "close"),
                        ],
                        Some(body.len()),
                    );
                    out.extend_from_slice(body.as_bytes());
                    self.start_closing(k, Some(out.into()), reason);
                }
                _ => self.drop_conn(k, reason),
            }
        }
        let ping = Arc::clone(&self.ping_frame);
        for k in to_ping {
            self.deliver(k, &ping);
        }
    }

    /// Stops accepting and starts closing every connection with 1001.
    fn begin_shutdown(&mut self) {
        let timeout = Duration::from_secs(self.shared.config.shutdown_timeout);
        self.shutdown_deadline = Some(Instant::now() + timeout);
        for mut l in [self.listener.take(), self.tls_listener.take()]
            .into_iter()
            .flatten()
        {
            let _ = self.poll.registry().deregister(&mut l);
        }
        let keys: Vec<(u32, State)> = self
            .conns
            .iter()
            .map(|(k, c)| (k as u32, c.state))
            .collect();
        for (k, state) in keys {
            match state {
                State::Poll | State::Stream | State::Ws
                    if self.conns.get(k as usize).is_some_and(|c| c.has(GRIP)) =>
                {
                    self.grip_shutdown(k);
                }
                State::Ws => self.close_ws(
                    k,
                    clarion_proto::ws::CloseCode::GoingAway,
                    "server shutting down",
                    CloseReason::Shutdown,
                ),
                // The client reconnects (EventSource does so by itself) and resumes by id.
                State::Sse => self.start_closing(k, None, CloseReason::Shutdown),
                State::Stream => {
                    let last: Arc<[u8]> = Arc::from(clarion_proto::http1::LAST_CHUNK);
                    self.start_closing(k, Some(last), CloseReason::Shutdown);
                }
                State::Poll => {
                    let cursor = self.polls.get(&k).map(|h| h.cursor.clone());
                    let body =
                        http::messages_body(std::iter::empty(), &cursor.unwrap_or_default(), &[]);
                    self.answer_poll(k, &Arc::from(body));
                }
                State::Http | State::Proxy => self.drop_conn(k, CloseReason::Shutdown),
                State::Closing => {}
            }
        }
    }

    fn flush_tally(&mut self) {
        let t = std::mem::take(&mut self.tally);
        let m = &self.shared.metrics;
        if t.bytes_in > 0 {
            m.bytes_in.fetch_add(t.bytes_in, Relaxed);
        }
        if t.bytes_out > 0 {
            m.bytes_out.fetch_add(t.bytes_out, Relaxed);
        }
        if t.delivered > 0 {
            m.delivered.fetch_add(t.delivered, Relaxed);
        }
    }
}
