//! The link thread: connect, handshake, read and write, ping, reconnect with backoff.
//!
//! One `mio` poller with two sources: the socket of the current connection and a waker that
//! the handle pulls when it queues bytes or asks the thread to stop. Each connection goes
//! through [`Phase`]s; a failure at any point closes the socket, drops what was queued for it,
//! and after a backoff the next server of the list is tried.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, DefaultHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clarion_proto::nats::{decode, encode, Limits, ServerOp, ServerUrl};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use super::{EventHandler, LinkEvent, LinkOptions, Shared};
use crate::log;

const SOCKET: Token = Token(0);
pub(super) const WAKER: Token = Token(1);

/// How much one read takes from the socket; the read buffer grows beyond it only to hold an
/// operation split across reads.
const READ_CHUNK: usize = 64 * 1024;

/// The longest a poll waits when no deadline is nearer, so a stop is never missed for long.
const MAX_POLL_WAIT: Duration = Duration::from_millis(500);

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The TCP connect is under way.
    Connecting,
    /// Connected; waiting for the server's INFO.
    AwaitInfo,
    /// CONNECT, the subscriptions and a PING are queued; waiting for the PONG that says the
    /// server accepted them.
    AwaitPong,
    /// Up: publishes are accepted.
    Up,
}

/// How a connection ended.
enum End {
    /// It never came up.
    Failed(String),
    /// It was up and was lost.
    Lost {
        reason: String,
        /// Lost because a PING went unanswered.
        ping_timeout: bool,
    },
    /// The handle asked the thread to stop.
    Stopped { was_up: bool },
}

pub(super) struct Runner {
    shared: Arc<Shared>,
    servers: Vec<ServerUrl>,
    options: LinkOptions,
    on_event: EventHandler,
    poll: Poll,
    events: Events,
    jitter: DefaultHasher,
    /// Reused for every read.
    chunk: Vec<u8>,
}

/// One connection's I/O state, owned by the link thread.
struct Conn {
    stream: TcpStream,
    phase: Phase,
    /// When the current phase must be over (all but `Up`).
    deadline: Instant,
    /// Bytes read and not yet decoded: at most one incomplete operation.
    rbuf: Vec<u8>,
    limits: Limits,
    /// Bytes taken from the shared queue, written up to `written`.
    pending: Vec<u8>,
    written: usize,
    /// When our oldest unanswered PING was sent.
    ping_sent: Option<Instant>,
    next_ping: Instant,
}

impl Runner {
    pub(super) fn new(
        shared: Arc<Shared>,
        servers: Vec<ServerUrl>,
        options: LinkOptions,
        on_event: EventHandler,
        poll: Poll,
    ) -> Runner {
        Runner {
            shared,
            servers,
            options,
            on_event,
            poll,
            events: Events::with_capacity(16),
            jitter: RandomState::new().build_hasher(),
            chunk: vec![0; READ_CHUNK],
        }
    }

    fn stopping(&self) -> bool {
        self.shared.lock().stop
    }

    pub(super) fn run(mut self) {
        let metrics = self.shared.metrics.clone();
        // Failed attempts since the link was last up: the backoff's exponent.
        let mut failures: u32 = 0;
        let mut ever_up = false;
        for server in self.servers.clone().iter().cycle() {
            let end = self.connection(server, ever_up);
            let dropped = {
                let mut state = self.shared.lock();
                state.session = false;
                state.connected = false;
                state.out.clear();
                let dropped = std::mem::take(&mut state.queued);
                if let End::Failed(reason) | End::Lost { reason, .. } = &end {
                    state.last_error = Some(format!("{server}: {reason}"));
                }
                dropped
            };
            metrics.connected.store(0, Relaxed);
            metrics.queued_bytes.store(0, Relaxed);
            metrics.dropped_bytes.fetch_add(dropped as u64, Relaxed);
            match end {
                End::Failed(reason) => {
                    metrics.connect_failures.fetch_add(1, Relaxed);
                    failures = failures.saturating_add(1);
                    log::debug(format_args!("nats link: {server}: {reason}"));
                }
                End::Lost {
                    reason,
                    ping_timeout,
                } => {
                    ever_up = true;
                    failures = 0;
                    metrics.disconnects.fetch_add(1, Relaxed);
                    if ping_timeout {
                        metrics.ping_timeouts.fetch_add(1, Relaxed);
                    }
                    log::warn(format_args!("nats link: lost {server}: {reason}"));
                    (self.on_event)(LinkEvent::Disconnected { reason: &reason });
                }
                End::Stopped { was_up } => {
                    if was_up {
                        metrics.disconnects.fetch_add(1, Relaxed);
                        (self.on_event)(LinkEvent::Stopped);
                    }
                    return;
                }
            }
            if self.backoff(failures) {
                return;
            }
        }
    }

    /// Waits before the next attempt (see [`backoff_delay`]). True when the thread must stop.
    fn backoff(&mut self, failures: u32) -> bool {
        self.jitter.write_u32(failures);
        let delay = backoff_delay(&self.options, failures, self.jitter.finish());
        let until = Instant::now() + delay;
        loop {
            if self.stopping() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            let wait = (until - now).min(MAX_POLL_WAIT);
            if let Err(e) = self.poll.poll(&mut self.events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    std::thread::sleep(wait);
                }
            }
        }
    }

    /// One connection to `server`, from the TCP connect to its end.
    fn connection(&mut self, server: &ServerUrl, ever_up: bool) -> End {
        let addr = match resolve(server) {
            Ok(addr) => addr,
            Err(e) => return End::Failed(format!("cannot resolve: {e}")),
        };
        let mut stream = match TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => return End::Failed(format!("cannot connect: {e}")),
        };
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            SOCKET,
            Interest::READABLE | Interest::WRITABLE,
        ) {
            return End::Failed(format!("cannot poll the socket: {e}"));
        }
        let now = Instant::now();
        let mut conn = Conn {
            stream,
            phase: Phase::Connecting,
            deadline: now + self.options.connect_timeout,
            rbuf: Vec::new(),
            limits: Limits {
                max_line: self.options.max_line,
                ..Limits::default()
            },
            pending: Vec::new(),
            written: 0,
            ping_sent: None,
            next_ping: now,
        };
        let end = self.drive(&mut conn, server, ever_up);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        end
    }

    fn drive(&mut self, conn: &mut Conn, server: &ServerUrl, ever_up: bool) -> End {
        let mut writable = false;
        loop {
            if self.stopping() {
                // Best effort: what is already queued goes out if the socket takes it now.
                let _ = self.flush(conn);
                return End::Stopped {
                    was_up: conn.phase == Phase::Up,
                };
            }
            let now = Instant::now();
            let next = match conn.phase {
                Phase::Up => conn
                    .ping_sent
                    .map_or(conn.next_ping, |t| t + self.options.pong_timeout)
                    .min(conn.next_ping),
                _ => conn.deadline,
            };
            let wait = next.saturating_duration_since(now).min(MAX_POLL_WAIT);
            if let Err(e) = self.poll.poll(&mut self.events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return ended(conn.phase, format!("poll: {e}"));
                }
            }
            let mut readable = false;
            let mut woken = false;
            for event in self.events.iter() {
                if event.token() == SOCKET {
                    readable |= event.is_readable() || event.is_read_closed() || event.is_error();
                    writable |= event.is_writable() || event.is_error();
                } else {
                    woken = true;
                }
            }
            let now = Instant::now();
            if conn.phase == Phase::Connecting && (writable || readable) {
                match conn.stream.take_error() {
                    Ok(Some(e)) | Err(e) => {
                        return ended(conn.phase, format!("cannot connect: {e}"))
                    }
                    Ok(None) => {}
                }
                match conn.stream.peer_addr() {
                    Ok(_) => {
                        let _ = conn.stream.set_nodelay(true);
                        conn.phase = Phase::AwaitInfo;
                        conn.deadline = now + self.options.connect_timeout;
                        readable = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => {}
                    Err(e) => return ended(conn.phase, format!("cannot connect: {e}")),
                }
            }
            if conn.phase != Phase::Connecting {
                if readable {
                    if let Err(reason) = self.read(conn, server, ever_up, now) {
                        return ended(conn.phase, reason);
                    }
                }
                if writable || woken || !conn.pending.is_empty() {
                    match self.flush(conn) {
                        Ok(blocked) => writable = !blocked,
                        Err(e) => return ended(conn.phase, format!("write: {e}")),
                    }
                }
            }
            match conn.phase {
                Phase::Up => {
                    if let Some(sent) = conn.ping_sent {
                        if now >= sent + self.options.pong_timeout {
                            return End::Lost {
                                reason: format!(
                                    "no PONG within {} ms",
                                    self.options.pong_timeout.as_millis()
                                ),
                                ping_timeout: true,
                            };
                        }
                    }
                    if now >= conn.next_ping {
                        self.queue_control(encode::ping);
                        conn.ping_sent.get_or_insert(now);
                        conn.next_ping = now + self.options.ping_interval;
                        if let Err(e) = self.flush(conn) {
                            return ended(conn.phase, format!("write: {e}"));
                        }
                    }
                }
                phase if now >= conn.deadline => {
                    return ended(conn.phase, format!("timed out ({phase:?})"));
                }
                _ => {}
            }
        }
    }

    /// Reads until the socket has nothing more, handling every complete operation.
    fn read(
        &mut self,
        conn: &mut Conn,
        server: &ServerUrl,
        ever_up: bool,
        now: Instant,
    ) -> Result<(), String> {
        loop {
            let n = match conn.stream.read(&mut self.chunk) {
                Ok(0) => return Err("server closed the connection".into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("read: {e}")),
            };
            self.shared.metrics.bytes_in.fetch_add(n as u64, Relaxed);
            conn.rbuf
                .extend_from_slice(self.chunk.get(..n).unwrap_or_default());
            let mut at = 0;
            let mut rbuf = std::mem::take(&mut conn.rbuf);
            let result = loop {
                let rest = rbuf.get(at..).unwrap_or_default();
                match decode(rest, &conn.limits) {
                    Ok(Some((op, used))) => {
                        at += used;
                        if let Err(e) = self.handle(conn, op, server, ever_up, now) {
                            break Err(e);
                        }
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(format!("protocol error: {e}")),
                }
            };
            rbuf.drain(..at);
            // A large message leaves a large buffer behind: give it back once it is consumed.
            if rbuf.is_empty() && rbuf.capacity() > 4 * READ_CHUNK {
                rbuf = Vec::new();
            }
            conn.rbuf = rbuf;
            result?;
        }
    }

    /// Acts on one operation from the server.
    fn handle(
        &mut self,
        conn: &mut Conn,
        op: ServerOp<'_>,
        server: &ServerUrl,
        ever_up: bool,
        now: Instant,
    ) -> Result<(), String> {
        match op {
            ServerOp::Msg {
                subject,
                sid,
                payload,
                ..
            }
            | ServerOp::HMsg {
                subject,
                sid,
                payload,
                ..
            } => {
                // Connected comes before any message of a connection: the few the server
                // sends before it answers the handshake's PING are dropped, as messages
                // published while the link was down are (the owner treats every
                // reconnect as a possible gap).
                if conn.phase != Phase::Up {
                    self.shared.metrics.early_messages.fetch_add(1, Relaxed);
                    return Ok(());
                }
                let live = sid
                    .parse::<u64>()
                    .is_ok_and(|sid| self.shared.lock().live_sids.contains(&sid));
                if live {
                    self.shared.metrics.received.fetch_add(1, Relaxed);
                    (self.on_event)(LinkEvent::Message { subject, payload });
                }
            }
            ServerOp::Ping => self.queue_control(encode::pong),
            ServerOp::Pong => match conn.phase {
                Phase::AwaitPong => {
                    {
                        let mut state = self.shared.lock();
                        state.handshake_pings = state.handshake_pings.saturating_sub(1);
                        if state.handshake_pings > 0 {
                            return Ok(());
                        }
                        // Under the same lock as the count: a subscribe either added a PING
                        // above or sees `connected` and needs none.
                        state.connected = true;
                    }
                    conn.phase = Phase::Up;
                    conn.next_ping = now + self.options.ping_interval;
                    let metrics = &self.shared.metrics;
                    metrics.connected.store(1, Relaxed);
                    if ever_up {
                        metrics.reconnects.fetch_add(1, Relaxed);
                    }
                    log::info(format_args!("nats link: connected to {server}"));
                    (self.on_event)(LinkEvent::Connected);
                }
                _ => conn.ping_sent = None,
            },
            ServerOp::Info(info) => {
                if info.tls_required {
                    return Err("the server requires TLS, which the link does not speak".into());
                }
                if info.max_payload > 0 {
                    let max = usize::try_from(info.max_payload).unwrap_or(usize::MAX);
                    conn.limits.max_payload = max;
                    self.shared.lock().max_payload = max;
                }
                if info.ldm {
                    log::info(format_args!("nats link: {server} is in lame duck mode"));
                }
                if conn.phase == Phase::AwaitInfo {
                    self.begin_session(server);
                    conn.phase = Phase::AwaitPong;
                    conn.deadline = now + self.options.connect_timeout;
                }
            }
            ServerOp::Err(text) => {
                // Permission and subject errors concern one operation; the server closes the
                // connection after any other.
                let lower = text.to_ascii_lowercase();
                if conn.phase == Phase::Up
                    && (lower.starts_with("permissions violation")
                        || lower.starts_with("invalid subject"))
                {
                    log::warn(format_args!("nats link: {server}: -ERR '{text}'"));
                } else {
                    return Err(format!("server error: {text}"));
                }
            }
            ServerOp::Ok => {}
        }
        Ok(())
    }

    /// Queues CONNECT, every subscription and the PING whose PONG completes the handshake.
    /// From here on, the handle queues SUB and UNSUB directly.
    fn begin_session(&mut self, server: &ServerUrl) {
        let mut connect = encode::Connect::new(&self.options.client_name, self.options.echo);
        connect.user = server.user.clone();
        connect.pass = server.pass.clone();
        connect.auth_token = server.token.clone();
        let mut state = self.shared.lock();
        let mut subs: Vec<(u64, String)> = state
            .subs
            .iter()
            .map(|(subject, sid)| (*sid, subject.clone()))
            .collect();
        subs.sort_unstable();
        state.session = true;
        state.handshake_pings = 1;
        state.queue_control(&self.shared.metrics, |out| {
            connect.encode(out);
            for (sid, subject) in &subs {
                // Checked when subscribed: encoding cannot refuse it.
                let _ = encode::subscribe(out, subject, None, *sid);
            }
            encode::ping(out);
        });
    }

    /// Queues a control operation (PING, PONG) behind what is already queued.
    fn queue_control(&self, f: impl FnOnce(&mut Vec<u8>)) {
        // The link thread flushes after handling what it read: no wake needed.
        self.shared.lock().queue_control(&self.shared.metrics, f);
    }

    /// Writes queued bytes until the socket refuses more (`Ok(true)`) or none are left.
    fn flush(&mut self, conn: &mut Conn) -> io::Result<bool> {
        loop {
            if conn.written == conn.pending.len() {
                conn.pending.clear();
                conn.written = 0;
                std::mem::swap(&mut self.shared.lock().out, &mut conn.pending);
                if conn.pending.is_empty() {
                    // A burst leaves a large buffer behind: give it back once it is written.
                    if conn.pending.capacity() > 16 * READ_CHUNK {
                        conn.pending = Vec::new();
                    }
                    return Ok(false);
                }
            }
            let rest = conn.pending.get(conn.written..).unwrap_or_default();
            match conn.stream.write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    conn.written += n;
                    let metrics = &self.shared.metrics;
                    metrics.bytes_out.fetch_add(n as u64, Relaxed);
                    let mut state = self.shared.lock();
                    state.queued = state.queued.saturating_sub(n);
                    metrics.queued_bytes.store(state.queued as u64, Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// How a connection in `phase` ends on an error: lost if it was up (even if it came up in
/// the same read that found the error), else failed.
fn ended(phase: Phase, reason: String) -> End {
    if phase == Phase::Up {
        End::Lost {
            reason,
            ping_timeout: false,
        }
    } else {
        End::Failed(reason)
    }
}

/// The wait before the next attempt: `backoff_min` doubled per failure, capped at
/// `backoff_max`, times a factor in [0.5, 1) drawn from `random`, so that nodes cut off
/// together do not come back in lockstep.
fn backoff_delay(options: &LinkOptions, failures: u32, random: u64) -> Duration {
    let base = options
        .backoff_min
        .saturating_mul(1u32 << failures.min(16))
        .min(options.backoff_max);
    base.mul_f64(0.5 + (random % 1000) as f64 / 2000.0)
}

/// The first address `server` resolves to. Name resolution blocks, on the link thread only.
fn resolve(server: &ServerUrl) -> io::Result<SocketAddr> {
    server
        .address()
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_with_jitter() {
        let options = LinkOptions::new("t");
        let ms = |failures, random| backoff_delay(&options, failures, random).as_millis();
        assert_eq!((ms(0, 0), ms(0, 999)), (50, 99));
        assert_eq!((ms(1, 0), ms(3, 0)), (100, 400));
        assert_eq!(
            ms(6, 0),
            2500,
            "capped at backoff_max (5 s), halved by the jitter"
        );
        assert_eq!(ms(u32::MAX, 999), 4997);
        let spread: std::collections::HashSet<u128> = (0..50).map(|r| ms(4, r * 7)).collect();
        assert!(spread.len() > 40, "jitter spreads the delays");
    }
}
