//! One client connection to a NATS server (or a cluster of them), on its own thread.
//!
//! The protocol is `clarion_proto::nats`; this module owns the socket, the clock and the
//! thread. [`NatsLink::start`] returns at once and connects in the background, trying the
//! configured servers in turn with capped exponential backoff and jitter, forever. Once the
//! server has answered our `CONNECT` (sent with `echo: false`: a node delivers its own
//! publishes locally) and the `PING` after it, the link is up: every remembered subscription
//! was sent again before that `PING`, so it is in force when [`LinkEvent::Connected`] arrives.
//!
//! Events (connected, disconnected, messages) are delivered to one callback, on the link
//! thread, in the order the server sent them. The callback may call back into the link
//! (subscribe, publish): no lock is held while it runs.
//!
//! Memory stays bounded whatever the server does: publishes go into one outgoing queue of at
//! most [`LinkOptions::max_queue_bytes`] (a publish that does not fit is refused with
//! [`LinkError::Backlog`], never blocked on), and the read buffer holds at most one
//! incomplete operation, within the server's `max_payload` and the line limit. A server that
//! stops answering (stalled, or a network that drops packets) is found by our own `PING`: no
//! `PONG` within [`LinkOptions::pong_timeout`] ends the connection, and what was queued for
//! it is dropped (core NATS is at-most-once; the broker layer above deals with holes).

mod runner;

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use clarion_proto::nats::{self, encode, parse_servers, Limits, SubjectError, UrlError};
use mio::{Poll, Waker};

use crate::log;
use runner::{Runner, WAKER};

/// What the link reports to its owner, on the link thread, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent<'a> {
    /// The server accepted the connection and every subscription made so far is in force.
    /// It comes before any [`LinkEvent::Message`] of this connection.
    Connected,
    /// A connection that was up has ended; the link is reconnecting. Messages published
    /// meanwhile by other nodes are not seen.
    Disconnected {
        /// Why, for logs and `/healthz`.
        reason: &'a str,
    },
    /// The link's owner shut it down while a connection was up (a clean stop, not a loss):
    /// the last event.
    Stopped,
    /// A message on one of our subscriptions.
    Message {
        /// The subject it was published to.
        subject: &'a str,
        /// Its payload.
        payload: &'a [u8],
    },
}

/// The callback that receives a link's events.
pub type EventHandler = Box<dyn FnMut(LinkEvent<'_>) + Send>;

/// Why the link refused a request.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The server URL list could not be read.
    #[error("bad NATS URL: {0}")]
    Url(#[from] UrlError),
    /// A subject that NATS would refuse.
    #[error("bad NATS subject: {0}")]
    Subject(#[from] SubjectError),
    /// Not connected to any server now: the publish would go nowhere.
    #[error("not connected to NATS")]
    Down,
    /// The outgoing queue is full: the server is not taking our bytes fast enough.
    #[error("NATS outgoing queue full")]
    Backlog,
    /// The payload is over the server's `max_payload`.
    #[error("payload of {size} bytes is over the NATS server's max_payload of {max}")]
    TooLarge {
        /// The payload's size.
        size: usize,
        /// The server's limit.
        max: usize,
    },
    /// The poller or the thread could not be created.
    #[error("cannot start the NATS link: {0}")]
    Start(#[from] io::Error),
}

/// Counters and gauges of one link, readable from any thread.
#[derive(Debug, Default)]
pub struct LinkMetrics {
    /// 1 while connected (the handshake done), else 0.
    pub connected: AtomicU64,
    /// Connections made after the first one.
    pub reconnects: AtomicU64,
    /// Connection attempts that failed before the link was up.
    pub connect_failures: AtomicU64,
    /// Connections that were up and ended (server gone, stalled, error).
    pub disconnects: AtomicU64,
    /// Of those, connections ended because no `PONG` came in time.
    pub ping_timeouts: AtomicU64,
    /// Bytes waiting to be written to the server now.
    pub queued_bytes: AtomicU64,
    /// Messages published (queued while connected).
    pub published: AtomicU64,
    /// Publishes refused because the outgoing queue was full.
    pub backlog_refusals: AtomicU64,
    /// Publishes refused because no server was connected.
    pub down_refusals: AtomicU64,
    /// Queued bytes dropped because their connection ended before they were written.
    pub dropped_bytes: AtomicU64,
    /// Messages received on our subscriptions.
    pub received: AtomicU64,
    /// Messages dropped because they came before the handshake was done (see
    /// [`LinkEvent::Connected`]).
    pub early_messages: AtomicU64,
    /// Bytes received from the server.
    pub bytes_in: AtomicU64,
    /// Bytes written to the server.
    pub bytes_out: AtomicU64,
}

/// How a link behaves; [`LinkOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// Shown by the server's monitoring (`connz`): the node's name.
    pub client_name: String,
    /// Whether the server sends us our own publishes. Clarion delivers its own publishes
    /// locally, so `false`; tests may turn it on.
    pub echo: bool,
    /// How often we PING a quiet server: 2 s finds a dead broker within about 4 s.
    pub ping_interval: Duration,
    /// How long a PING may wait for its PONG before the connection counts as dead.
    pub pong_timeout: Duration,
    /// How long a TCP connect, and then the server's INFO and the handshake's PONG, may take.
    pub connect_timeout: Duration,
    /// First reconnect delay; it doubles per failed attempt up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest reconnect delay: a broker that comes back is found within this.
    pub backoff_max: Duration,
    /// Most bytes waiting to be written: 8 MiB is about a second of a busy node's publishes;
    /// beyond that the server is not keeping up and publishes are refused.
    pub max_queue_bytes: usize,
    /// Longest control line read from the server (see [`nats::Limits`]).
    pub max_line: usize,
}

impl LinkOptions {
    /// The defaults, for a client named `client_name`.
    pub fn new(client_name: &str) -> LinkOptions {
        LinkOptions {
            client_name: client_name.to_owned(),
            echo: false,
            ping_interval: Duration::from_secs(2),
            pong_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            max_queue_bytes: 8 << 20,
            max_line: Limits::default().max_line,
        }
    }
}

/// A running link: a handle to its thread. Dropping it stops the thread, as
/// [`NatsLink::shutdown`] does.
pub struct NatsLink {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the handle and the link thread share.
struct Shared {
    state: Mutex<State>,
    /// Wakes the link thread: bytes were queued, or it must stop.
    waker: Waker,
    metrics: Arc<LinkMetrics>,
}

/// The part of a link both sides change, under one lock that is never held across I/O or
/// the event callback.
#[derive(Default)]
struct State {
    /// Every subscription, by subject, with its sid: re-sent after each reconnect.
    subs: HashMap<String, u64>,
    /// The sids in `subs`: a message for any other (unsubscribed, in flight) is dropped.
    live_sids: HashSet<u64>,
    next_sid: u64,
    /// CONNECT has been queued on the current connection: SUB/UNSUB go straight into `out`.
    session: bool,
    /// The handshake is done: publishes are accepted.
    connected: bool,
    /// PINGs of the handshake still unanswered: the one after CONNECT, plus one after each
    /// SUB queued during the handshake, so that every subscription made before
    /// [`LinkEvent::Connected`] is in force at the server when it is reported.
    handshake_pings: u32,
    /// Bytes for the server that the link thread has not taken yet.
    out: Vec<u8>,
    /// Bytes queued and not yet written (in `out` and in the link thread's hands).
    queued: usize,
    /// The server's max_payload, from its INFO.
    max_payload: usize,
    /// [`LinkOptions::max_queue_bytes`].
    max_queue: usize,
    /// Why the last connection or attempt failed, for health reports.
    last_error: Option<String>,
    stop: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves consistent plain data: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        if let Err(e) = self.waker.wake() {
            log::warn(format_args!("nats link: cannot wake the link thread: {e}"));
        }
    }
}

impl State {
    /// Queues bytes written by `f` outside the publish bound (control operations), and says
    /// whether the link thread must be woken.
    fn queue_control(&mut self, metrics: &LinkMetrics, f: impl FnOnce(&mut Vec<u8>)) -> bool {
        let was_empty = self.out.is_empty();
        let before = self.out.len();
        f(&mut self.out);
        self.queued += self.out.len() - before;
        metrics.queued_bytes.store(self.queued as u64, Relaxed);
        was_empty && !self.out.is_empty()
    }
}

impl NatsLink {
    /// Starts a link with the default [`LinkOptions`] for `client_name`. `url` is
    /// `nats://[user:pass@]host[:port]`, several separated by commas.
    pub fn start(
        url: &str,
        client_name: &str,
        on_event: EventHandler,
        metrics: Arc<LinkMetrics>,
    ) -> Result<NatsLink, LinkError> {
        NatsLink::start_with(url, LinkOptions::new(client_name), on_event, metrics)
    }

    /// Starts a link with the given options; see [`NatsLink::start`].
    pub fn start_with(
        url: &str,
        options: LinkOptions,
        on_event: EventHandler,
        metrics: Arc<LinkMetrics>,
    ) -> Result<NatsLink, LinkError> {
        let servers = parse_servers(url)?;
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_sid: 1,
                max_payload: Limits::default().max_payload,
                max_queue: options.max_queue_bytes,
                ..State::default()
            }),
            waker,
            metrics,
        });
        let runner = Runner::new(shared.clone(), servers, options, on_event, poll);
        let thread = std::thread::Builder::new()
            .name("nats-link".into())
            .spawn(move || runner.run())?;
        Ok(NatsLink {
            shared,
            thread: Some(thread),
        })
    }

    /// Subscribes to `subject` (wildcards allowed), now if connected and after every
    /// reconnect. Subscribing twice to one subject is one subscription. A subscription made
    /// before [`LinkEvent::Connected`] is in force at the server when that event is reported;
    /// one made while connected takes effect once the server reads it (NATS gives no
    /// acknowledgement).
    pub fn subscribe(&self, subject: &str) -> Result<(), LinkError> {
        nats::validate_subject(subject, true)?;
        let mut state = self.shared.lock();
        if state.subs.contains_key(subject) {
            return Ok(());
        }
        let sid = state.next_sid;
        state.next_sid += 1;
        state.subs.insert(subject.to_owned(), sid);
        state.live_sids.insert(sid);
        if state.session {
            let handshake = !state.connected;
            if handshake {
                state.handshake_pings += 1;
            }
            let wake = state.queue_control(&self.shared.metrics, |out| {
                // Validated above: encoding cannot refuse it.
                let _ = encode::subscribe(out, subject, None, sid);
                if handshake {
                    encode::ping(out);
                }
            });
            drop(state);
            if wake {
                self.shared.wake();
            }
        }
        Ok(())
    }

    /// Ends the subscription to `subject`, if there is one. Messages already on their way
    /// for it are dropped.
    pub fn unsubscribe(&self, subject: &str) {
        let mut state = self.shared.lock();
        let Some(sid) = state.subs.remove(subject) else {
            return;
        };
        state.live_sids.remove(&sid);
        if state.session {
            let wake = state.queue_control(&self.shared.metrics, |out| {
                encode::unsubscribe(out, sid, None);
            });
            drop(state);
            if wake {
                self.shared.wake();
            }
        }
    }

    /// Queues a publish. Never blocks on the network: [`LinkError::Down`] when no server is
    /// connected, [`LinkError::Backlog`] when the outgoing queue is full,
    /// [`LinkError::TooLarge`] over the server's `max_payload`. `Ok` means queued on a live
    /// connection, not delivered: core NATS is at-most-once.
    pub fn publish(&self, subject: &str, payload: &[u8]) -> Result<(), LinkError> {
        nats::validate_subject(subject, false)?;
        let len = encode::publish_len(subject, None, payload.len());
        let metrics = &self.shared.metrics;
        let mut state = self.shared.lock();
        if !state.connected {
            metrics.down_refusals.fetch_add(1, Relaxed);
            return Err(LinkError::Down);
        }
        if payload.len() > state.max_payload {
            return Err(LinkError::TooLarge {
                size: payload.len(),
                max: state.max_payload,
            });
        }
        if state.queued + len > state.max_queue {
            metrics.backlog_refusals.fetch_add(1, Relaxed);
            return Err(LinkError::Backlog);
        }
        let wake = state.queue_control(metrics, |out| {
            let _ = encode::publish(out, subject, None, payload);
        });
        drop(state);
        metrics.published.fetch_add(1, Relaxed);
        if wake {
            self.shared.wake();
        }
        Ok(())
    }

    /// Whether a server is connected and the handshake done.
    pub fn connected(&self) -> bool {
        self.shared.lock().connected
    }

    /// Why the last connection or connection attempt ended, if one did.
    pub fn last_error(&self) -> Option<String> {
        self.shared.lock().last_error.clone()
    }

    /// The link's metrics.
    pub fn metrics(&self) -> &Arc<LinkMetrics> {
        &self.shared.metrics
    }

    /// Stops the link thread and waits for it: at most about one poll interval, plus the
    /// event callback if it is running (a [`LinkEvent::Stopped`] is the last event when a
    /// connection was up).
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for NatsLink {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::warn(format_args!("nats link: the link thread panicked"));
            }
        }
    }
}
