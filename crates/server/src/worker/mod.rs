//! The event loop: one per worker thread, each with its own listener (`SO_REUSEPORT`), poller and
//! [`Engine`].
//!
//! The loop is split in two. [`Worker`] is the shell: the `mio` poller, the listeners, the waker
//! and the real clock, read once per iteration and passed on as whole seconds. [`Engine`] owns the
//! connections (slab, topic index, shared buffers) and all their logic; it never reads a clock or
//! polls, so tests drive it in memory.
//!
//! The engine's parts, one concept each: [`accept`] (admission and refusals), [`io`] (read and
//! write paths, slow consumers), [`deliver`] (fan-out of published messages), [`timers`] (the
//! once-a-second sweep), [`shutdown`], [`state`] (states, flags, deadlines and their gauges),
//! [`transitions`] (every move between states), [`side`] (per-connection side state),
//! [`subscriptions`], [`conn`] (the record and its write buffers), [`index`] (topic → local
//! subscribers), [`tls`] (one connection's TLS records, their sessions kept side by side in a
//! [`pool`]), [`trim`] (the heap given back after a storm of connections), [`transport`]
//! (HTTP routing and the upgrade, WebSocket, SSE and NDJSON streams, long-poll), [`grip`]
//! (GRIP's per-connection runtime: forwarding, holds, the WebSocket-over-HTTP bridge).
//! Transports and GRIP live under the worker because they are engine methods: outside it, they
//! would import the worker that imports them.
//!
//! A connection accepted on the TLS listener carries a [`tls::Session`]: its bytes are
//! decrypted into a worker buffer before the same HTTP/WebSocket code sees them, and its writes
//! are encrypted in the write path; nothing else knows the difference.

mod accept;
mod conflation;
pub mod conn;
mod deliver;
mod delta;
mod dense;
mod engine;
mod filters;
mod frames;
pub(crate) mod grip;
mod h2;
mod h2_rest;
pub mod handover;
mod handover_grip;
mod handover_h2;
pub mod handover_state;
pub mod index;
mod io;
pub mod pool;
mod presence;
mod shared;
mod shutdown;
mod side;
pub mod socket;
pub mod state;
mod subscriptions;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_auth;
#[cfg(test)]
mod tests_h2;
#[cfg(test)]
mod tests_h2_pump;
#[cfg(test)]
mod tests_h2_rest;
#[cfg(test)]
mod tests_handover_pusher;
#[cfg(test)]
mod tests_handover_state;
#[cfg(test)]
mod tests_hooks;
mod timers;
pub mod tls;
mod transitions;
pub(crate) mod transport;
mod trim;
pub mod uring;

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};

use crate::hub::Inbox;
use crate::log;
pub use engine::Engine;
pub use shared::{Modes, Shared};

const LISTENER: Token = Token(usize::MAX - 1);
const TLS_LISTENER: Token = Token(usize::MAX - 3);
/// The token under which a worker's waker is registered.
pub const WAKER: Token = Token(usize::MAX - 2);

/// Binds the client listener once per worker on the same address with `SO_REUSEPORT`, so the
/// kernel spreads new connections over the workers without a shared accept lock. The first bind
/// resolves port 0; the others reuse the port it got.
pub fn bind_listeners(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
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
        s.listen(crate::config::limits::LISTEN_BACKLOG)?;
        let l: std::net::TcpListener = s.into();
        addr = l.local_addr()?;
        out.push(l);
    }
    Ok(out)
}

/// One event loop: the poller, the listeners and the real clock around an [`Engine`].
pub struct Worker {
    id: usize,
    poll: Poll,
    listener: Option<TcpListener>,
    tls_listener: Option<TcpListener>,
    engine: Engine<mio::net::TcpStream>,
    start: Instant,
    /// The second of the last sweep.
    last_sweep: u32,
    /// `accept` failed for lack of descriptors; retry on the next sweep.
    accept_blocked: bool,
    shutdown_deadline: Option<Instant>,
    /// A drain in progress: when it began and over how long (`drain_period`).
    drain: Option<(Instant, Duration)>,
    /// This worker has let go of its connections for a hand-over.
    let_go: bool,
    /// Asked to let go while TLS handshakes were in flight: until when it waits for them
    /// (`handover::HANDSHAKE_GRACE`).
    grace: Option<Instant>,
    /// When to give the heap back (worker 0 only: the call covers the whole process).
    storms: trim::Storms,
}

/// How often a drain tells its next slice of connections to go.
const DRAIN_STEP: Duration = Duration::from_millis(25);

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
    ) -> std::io::Result<Worker> {
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
        let use_uring = shared.config.io_uring;
        let mut engine = Engine::new(id, inbox, shared);
        if use_uring {
            match uring::SendRing::new() {
                Ok(ring) => engine.fanout.batch = Some(ring),
                Err(e) if id == 0 => log::info(format_args!(
                    "io_uring unavailable ({e}): each delivery is its own send"
                )),
                Err(_) => {}
            }
        }
        // The clock's second 0 is now: token times (wall-clock) map onto the coarse clock.
        engine.set_unix_base(crate::auth::unix_now());
        Ok(Worker {
            id,
            poll,
            listener: Some(listener),
            tls_listener,
            engine,
            start: Instant::now(),
            last_sweep: 0,
            accept_blocked: false,
            shutdown_deadline: None,
            drain: None,
            let_go: false,
            grace: None,
            storms: trim::Storms::default(),
        })
    }

    /// Runs until shutdown has closed every connection (or its deadline passed).
    pub fn run(mut self) {
        let mut events = Events::with_capacity(crate::config::limits::POLL_EVENTS);
        loop {
            let timeout = if self.engine.wants_read() {
                Duration::ZERO
            } else if self.drain.is_some() {
                DRAIN_STEP
            } else if let Some(until) = self.grace.filter(|_| !self.let_go) {
                until.saturating_duration_since(Instant::now())
            } else {
                Duration::from_secs(1)
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    log::warn(format_args!("worker {}: poll failed: {e}", self.id));
                }
                continue;
            }
            // The only clock reading of the iteration: everything below sees the same second.
            let now = self.start.elapsed().as_secs() as u32;
            // Wall-clock seconds for token times, re-anchored each iteration so that the
            // engine's Unix time is the current second, never behind it (a token minted this
            // second, `iat` = now, must pass), whatever fraction of a second the start fell on.
            if self.engine.shared.auth.is_some() {
                self.engine
                    .set_unix_base(crate::auth::unix_now().saturating_sub(u64::from(now)));
            }
            // The broker's hub clock, anchored the same way: an in-band publish is stamped
            // with the hub's current second.
            let hub = self.engine.shared.broker.clock();
            self.engine.set_hub_base(hub.saturating_sub(now));
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(false, now),
                    TLS_LISTENER => self.accept_all(true, now),
                    WAKER => {}
                    Token(k) => {
                        let k = k as u32;
                        if ev.is_writable() {
                            self.engine.handle_writable(k, now);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.engine.handle_readable(k, now);
                        }
                    }
                }
            }
            self.engine.read_more(now);
            self.engine.handle_inbox(now);
            if !self.let_go && self.engine.shared.handover.requested() && self.may_let_go() {
                self.let_go(now);
            }
            let stopping = self.engine.shared.stopping.load(Relaxed);
            if self.shutdown_deadline.is_none() && stopping {
                self.begin_shutdown(now);
            } else if self.drain.is_some() {
                self.drain_step(now);
            }
            if now != self.last_sweep {
                self.last_sweep = now;
                if self.accept_blocked {
                    self.accept_all(false, now);
                    self.accept_all(true, now);
                }
                if self.id == 0 {
                    self.engine.shared.broker.expire();
                    self.trim_after_storm();
                }
                self.engine.handle_tick(now);
            }
            self.engine.flush_tally();
            if let Some(deadline) = self.shutdown_deadline {
                if self.engine.is_empty() || Instant::now() >= deadline {
                    break;
                }
            }
        }
        let left = self.engine.len();
        if left > 0 {
            log::warn(format_args!(
                "worker {}: {left} connections did not close in time",
                self.id
            ));
        }
        self.engine.close_all();
    }

    fn accept_all(&mut self, tls: bool, now: u32) {
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
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
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
            // Push messages are small and latency matters more than segment count.
            let _ = stream.set_nodelay(true);
            let registry = self.poll.registry();
            self.engine
                .handle_accept(stream, conn::address_key(peer.ip()), tls, now, |s, key| {
                    registry.register(s, Token(key), Interest::READABLE | Interest::WRITABLE)
                });
        }
    }

    /// Stops accepting and starts telling the connections to go: all at once, or over
    /// `drain_period` (continued by [`Worker::drain_step`]).
    fn begin_shutdown(&mut self, now: u32) {
        let c = &self.engine.shared.config;
        let drain = Duration::from_secs(c.drain_period);
        let timeout = Duration::from_secs(c.shutdown_timeout);
        let began = Instant::now();
        self.shutdown_deadline = Some(began + drain + timeout);
        self.drain = (!drain.is_zero()).then_some((began, drain));
        for mut l in [self.listener.take(), self.tls_listener.take()]
            .into_iter()
            .flatten()
        {
            let _ = self.poll.registry().deregister(&mut l);
        }
        self.drain_step(now);
    }

    /// Tells the share of the connections that the time into the drain calls for.
    fn drain_step(&mut self, now: u32) {
        let share = match self.drain {
            Some((began, period)) => {
                let share = began.elapsed().as_secs_f64() / period.as_secs_f64();
                if share >= 1.0 {
                    self.drain = None;
                }
                share.min(1.0)
            }
            None => 1.0,
        };
        self.engine.handle_shutdown(now, share);
    }

    /// After a storm of new connections, the heap their handshakes left free goes back to the
    /// kernel (see [`trim`]).
    fn trim_after_storm(&mut self) {
        let admitted = self.engine.shared.admitted.load(Relaxed);
        if self.storms.due(admitted) {
            let began = Instant::now();
            let gave = trim::give_back();
            log::debug(format_args!(
                "heap trimmed after {admitted} connections: {} in {:?}",
                if gave {
                    "pages given back"
                } else {
                    "nothing to give back"
                },
                began.elapsed()
            ));
        }
    }
}
