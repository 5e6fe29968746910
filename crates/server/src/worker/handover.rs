//! A worker's part of a hand-over (`clarion serve --upgrade-from PID`, see `crate::handover`):
//! in the old process, lifting every connection that can move out of the slab with its state;
//! in the new one, putting such connections back into a slab, registered with the poller and
//! subscribed again.
//!
//! The point at which a worker lets go is safe by construction: the broker was frozen first
//! (every later publish is refused), so once the worker has drained its inbox each subscriber
//! has been handed every message of its topics, and what the kernel has not taken yet travels
//! as the connection's pending output. The new process continues the same ids from the same
//! history, so a connection re-subscribed there from "now" misses nothing and gets nothing
//! twice.
//!
//! Connections whose state is not carried stay behind and are told to reconnect as in a
//! restart (close 1012, SSE `retry:`): see [`Fallback`]. An HTTP/2 connection moves with its
//! streams (`super::handover_h2`); a stream that cannot move is refused (`REFUSED_STREAM`,
//! which the client retries) and counted under its reason, while its connection moves. A
//! connection a GRIP backend holds moves with its hold (`super::handover_grip`).
//!
//! A TLS connection whose handshake is in flight cannot move (rustls' handshake state is not
//! carried), and its client may already consider the handshake done: it sent its Finished,
//! and its request, which the old process would answer before telling it to reconnect. So a
//! worker asked to let go first stops accepting and goes on serving for up to
//! [`HANDSHAKE_GRACE`] while any handshake is in flight; one that finishes in that time moves
//! like any other connection, one that does not stays (`tls_handshake`).
#![deny(clippy::wildcard_enum_match_arm)]

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use clarion_proto::event_id;
use clarion_proto::handover_grip::{grip_stream, stream_mode};
use clarion_proto::ws::deflate::{Compressor, Inflater};
use mio::{Interest, Token};

use super::conn::Conn;
use super::grip::carried::CarriedGrip;
use super::handover_state::CarriedMode;
use super::side::{Blocker, Taken};
use super::state::{Ext, PollMode, SseMode, State, StreamMode, WsMode, WsRole};
use super::tls::{Session, Unmovable};
use super::transport::poll::PollHold;
use super::{Engine, Worker};
use crate::hub::lock;
use crate::log;
use crate::message::Published;

/// How long a worker asked to let go waits for the TLS handshakes in flight to finish (the
/// freeze is that much longer when one is in flight). The client's Finished follows the
/// server's flight by one round trip: 250 ms covers a round trip across continents, while a
/// client that never finishes costs each hand-over this much at most.
pub(crate) const HANDSHAKE_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// Why a connection could not move; each is counted (`clarion_handover_connections` with
/// `outcome="fallback"` and the label as `reason`) and named in the old process's log. Each
/// label is explained, with what to do about it, in docs/operations.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// A TLS handshake in flight: rustls' handshake state cannot be rebuilt in another process.
    TlsHandshake,
    /// A TLS 1.2 connection: its records stay with rustls, whose state cannot be rebuilt.
    Tls12,
    /// A TLS 1.3 connection whose next keys only rustls can derive (its traffic secrets were
    /// not captured at the handshake; not expected).
    TlsKeys,
    /// A fragmented compressed WebSocket message is being received: the inflater is in the
    /// middle of it, and the frames so far are not carried.
    DeflateFragmented,
    /// A fragmented (uncompressed) WebSocket message is being received.
    Fragment,
    /// A request forwarded to a GRIP backend and not answered yet: the answer comes back to
    /// the old process, and the request is not replayed (it may not be idempotent).
    GripBackend,
    /// A WebSocket bridged to a GRIP backend (WebSocket-over-HTTP): its session is in the
    /// backend's event requests, whose answers come back to the old process.
    GripBridge,
    /// Waiting for the answer of a backend hook (`connect`, `subscribe`, `publish`): the call
    /// belongs to the old process.
    HookWait,
    /// Per-connection state of a mode that is not carried: a held long-poll watching presence
    /// events, or rooms kept in a cluster's Redis.
    ModeState,
    /// An HTTP/2 stream whose request is still arriving or whose answer is being finished:
    /// refused with `REFUSED_STREAM` (the client retries it); its connection moves.
    RequestInFlight,
    /// Closing already (its last bytes queued): the client is being told to go anyway.
    Closing,
}

impl Fallback {
    /// Every reason, in the order of [`Fallbacks::counts`].
    pub const ALL: [Fallback; 11] = [
        Fallback::TlsHandshake,
        Fallback::Tls12,
        Fallback::TlsKeys,
        Fallback::DeflateFragmented,
        Fallback::Fragment,
        Fallback::GripBackend,
        Fallback::GripBridge,
        Fallback::HookWait,
        Fallback::ModeState,
        Fallback::RequestInFlight,
        Fallback::Closing,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Fallback::TlsHandshake => "tls_handshake",
            Fallback::Tls12 => "tls12",
            Fallback::TlsKeys => "tls_keys",
            Fallback::DeflateFragmented => "deflate_fragmented",
            Fallback::Fragment => "fragment",
            Fallback::GripBackend => "grip_backend",
            Fallback::GripBridge => "grip_bridge",
            Fallback::HookWait => "hook_wait",
            Fallback::ModeState => "mode_state",
            Fallback::RequestInFlight => "h2_request_in_flight",
            Fallback::Closing => "closing",
        }
    }

    /// Why a connection in `state` is not carried, when [`state_to_wire`] has no encoding for
    /// it (`None`: it has one).
    fn of_state(state: State) -> Option<Fallback> {
        match state {
            State::Http | State::Sse(_) | State::Stream(_) | State::Poll(_) => None,
            State::Ws(m) => match m.role {
                // A Pusher connection's own part moves in its mode state (`CarriedPusher`).
                WsRole::PubSub
                | WsRole::Envelope
                | WsRole::Echo
                | WsRole::Pusher
                | WsRole::PusherResume => None,
                WsRole::Bridge => Some(Fallback::GripBridge),
            },
            State::Proxy => Some(Fallback::GripBackend),
            State::H2 => None,
            State::Closing { .. } => Some(Fallback::Closing),
        }
    }
}

/// Counts of connections that fell back, by reason.
#[derive(Debug, Default)]
pub struct Fallbacks {
    counts: [AtomicU64; 11],
}

impl Fallbacks {
    pub(super) fn add(&self, why: Fallback) {
        if let Some(c) = Fallback::ALL
            .iter()
            .position(|f| *f == why)
            .and_then(|i| self.counts.get(i))
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// (reason, count) for every reason.
    pub fn counts(&self) -> Vec<(Fallback, u64)> {
        Fallback::ALL
            .iter()
            .zip(&self.counts)
            .map(|(f, c)| (*f, c.load(Relaxed)))
            .collect()
    }
}

/// One connection lifted out of a worker, with its descriptor.
pub struct Moving {
    /// The worker it came from.
    pub worker: usize,
    /// Its state.
    pub state: State,
    /// For a held poll: seconds left and the cursor its answer resumes from.
    pub poll: Option<(u32, String)>,
    /// Seconds since its last counted activity.
    pub idle: u32,
    /// Its address key.
    pub peer: u32,
    /// Unconsumed input.
    pub input: Vec<u8>,
    /// Output the kernel has not taken.
    pub output: Vec<u8>,
    /// Its topics.
    pub topics: Vec<Arc<str>>,
    /// What authentication, hooks and presence keep for it.
    pub mode: Option<CarriedMode>,
    /// For a TLS 1.3 connection, its record layer (`input` and `output` are plaintext then).
    pub tls: Option<MovingTls>,
    /// For a WebSocket with compression that keeps context, its streams' windows.
    pub deflate: DeflateWindows,
    /// For an HTTP/2 connection, its protocol state and its streams.
    pub h2: Option<H2Part>,
    /// For a connection a GRIP backend holds, what its hold keeps.
    pub grip: Option<CarriedGrip>,
    /// The socket.
    pub fd: OwnedFd,
}

/// An HTTP/2 connection's protocol state and streams as they move, either way.
pub struct H2Part {
    /// The protocol state ([`clarion_proto::h2::server::Connection::park`]).
    pub connection: Vec<u8>,
    /// The streams that move with it.
    pub streams: Vec<H2Stream>,
}

/// One HTTP/2 stream's record as it moves: what a connection's carries, without a socket.
pub struct H2Stream {
    /// Its stream id.
    pub id: u32,
    /// Its state.
    pub state: State,
    /// For a held poll: seconds left and the cursor its answer resumes from.
    pub poll: Option<(u32, String)>,
    /// Seconds since its last counted activity.
    pub idle: u32,
    /// Its request's bytes not yet consumed (WebSocket frames, on a WebSocket stream).
    pub input: Vec<u8>,
    /// Its answer's bytes not yet framed (HTTP/1.1-shaped).
    pub output: Vec<u8>,
    /// Its topics.
    pub topics: Vec<Arc<str>>,
    /// With a clustered broker, on arrival: the ids it resumes its topics from.
    pub resume: Option<String>,
    /// What authentication, hooks and presence keep for it.
    pub mode: Option<CarriedMode>,
    /// For an RFC 8441 WebSocket with compression that keeps context, its streams' windows.
    pub deflate: DeflateWindows,
    /// For a stream a GRIP backend holds, what its hold keeps.
    pub grip: Option<CarriedGrip>,
}

/// The permessage-deflate streams of a WebSocket that keep context, as the last bytes each
/// saw (at most its window): the new process primes fresh streams with them
/// ([`clarion_proto::ws::deflate::Compressor::resume`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeflateWindows {
    /// The dedicated-mode compressor's.
    pub deflater: Option<Vec<u8>>,
    /// The inflater's, for a client that keeps context.
    pub inflater: Option<Vec<u8>>,
}

/// A TLS 1.3 connection's record layer as it moves (see [`super::tls::Session::park`]). The
/// traffic secrets in `session` are wiped when it is dropped.
pub struct MovingTls {
    /// Keys' state: suite, traffic secrets, sequence numbers, KeyUpdate owed.
    pub session: Box<clarion_proto::tls13::Parked>,
    /// Ciphertext of the client's next record, partly received.
    pub partial: Vec<u8>,
    /// Records sealed but not taken by the kernel; they go out first.
    pub unsent: Vec<u8>,
}

/// What the hand-over asks of the workers, shared through [`super::Shared`].
#[derive(Default)]
pub struct Switch {
    /// Set once the broker is frozen: each worker lets go at its next iteration.
    requested: AtomicBool,
    /// Where each worker puts what it lifted.
    lifted: Mutex<Vec<(usize, Vec<Moving>)>>,
    /// Workers that have let go.
    done: std::sync::Condvar,
    /// Connections that stayed behind, by reason.
    pub fallbacks: Fallbacks,
    /// Connections handed to a new process.
    pub moved_out: AtomicU64,
    /// Connections taken from an old process.
    pub taken: AtomicU64,
}

impl Switch {
    /// Asks every worker to let go (the caller froze the broker and wakes them).
    pub fn request(&self) {
        self.requested.store(true, Relaxed);
    }

    /// Whether a hand-over asked the workers to let go.
    pub fn requested(&self) -> bool {
        self.requested.load(Relaxed)
    }

    /// Waits until `workers` workers have let go (or `timeout` passed) and takes what they
    /// lifted; `None` on a timeout.
    pub fn collect(&self, workers: usize, timeout: std::time::Duration) -> Option<Vec<Moving>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut g = lock(&self.lifted);
        while g.len() < workers {
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            g = self
                .done
                .wait_timeout(g, left)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
        Some(
            std::mem::take(&mut *g)
                .into_iter()
                .flat_map(|(_, v)| v)
                .collect(),
        )
    }

    /// Appends the `clarion_handover_connections` family to a `/metrics` answer.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(
            out,
            "# HELP clarion_handover_connections Connections taken from the process this one \
             replaced (taken), handed to the one that replaces it (moved_out), or left to \
             reconnect because their state cannot move (fallback, by reason).\n\
             # TYPE clarion_handover_connections counter\n\
             clarion_handover_connections{{outcome=\"taken\"}} {}\n\
             clarion_handover_connections{{outcome=\"moved_out\"}} {}\n",
            self.taken.load(Relaxed),
            self.moved_out.load(Relaxed)
        );
        for (f, n) in self.fallbacks.counts() {
            let _ = writeln!(
                out,
                "clarion_handover_connections{{outcome=\"fallback\",reason=\"{}\"}} {n}",
                f.label()
            );
        }
    }

    fn put(&self, worker: usize, list: Vec<Moving>) {
        self.moved_out.fetch_add(list.len() as u64, Relaxed);
        lock(&self.lifted).push((worker, list));
        self.done.notify_all();
    }
}

/// A connection arriving from the old process, as the new one rebuilds it.
pub struct Arriving {
    /// Its state.
    pub state: State,
    /// For a held poll: seconds left and its cursor.
    pub poll: Option<(u32, String)>,
    /// Seconds since its last counted activity.
    pub idle: u32,
    /// Its address key.
    pub peer: u32,
    /// Unconsumed input.
    pub input: Vec<u8>,
    /// Output still owed.
    pub output: Vec<u8>,
    /// Its topics.
    pub topics: Vec<String>,
    /// With a clustered broker: the ids it resumes its topics from (`topic:EPOCH-SEQ`, one per
    /// topic), where the old process stopped delivering.
    pub resume: Option<String>,
    /// What authentication, hooks and presence kept for it.
    pub mode: Option<CarriedMode>,
    /// For a TLS 1.3 connection, its record layer.
    pub tls: Option<MovingTls>,
    /// Its compression streams' windows.
    pub deflate: DeflateWindows,
    /// For an HTTP/2 connection, its protocol state and its streams.
    pub h2: Option<H2Part>,
    /// For a connection a GRIP backend holds, what its hold keeps.
    pub grip: Option<CarriedGrip>,
    /// The socket.
    pub fd: OwnedFd,
}

/// The transport byte and options of the format for `state` (`None`: not carried).
pub fn state_to_wire(state: State) -> Option<(u8, u8, Option<u8>, bool)> {
    Some(match state {
        State::Http => (0, 0, None, false),
        State::Ws(m) => {
            let role = match m.role {
                WsRole::PubSub => 0,
                WsRole::Envelope => 1,
                WsRole::Echo => 2,
                WsRole::Pusher => 3,
                WsRole::PusherResume => 4,
                WsRole::Bridge => return None,
            };
            (1, role, m.deflate.map(Ext::bits), m.pinged)
        }
        State::Sse(SseMode::Payload) => (2, 0, None, false),
        State::Sse(SseMode::Json) => (2, 1, None, false),
        State::Stream(StreamMode::Ndjson) => (3, 0, None, false),
        State::Stream(StreamMode::Raw) => (3, 1, None, false),
        State::Stream(StreamMode::Grip { chunked, keep }) => {
            (3, stream_mode(chunked, keep), None, false)
        }
        // A GRIP long-poll is told apart by its record's GRIP part (`CarriedGrip`).
        State::Poll(PollMode { keep, grip: _ }) => (4, u8::from(keep), None, false),
        State::H2 => (5, 0, None, false),
        State::Proxy | State::Closing { .. } => return None,
    })
}

/// The state a format's transport byte and options stand for.
pub fn state_from_wire(kind: u8, option: u8, deflate: Option<u8>, pinged: bool) -> Option<State> {
    Some(match (kind, option) {
        (0, _) => State::Http,
        (1, role) => State::Ws(WsMode {
            role: match role {
                0 => WsRole::PubSub,
                1 => WsRole::Envelope,
                2 => WsRole::Echo,
                3 => WsRole::Pusher,
                4 => WsRole::PusherResume,
                _ => return None,
            },
            deflate: deflate.map(Ext::from_bits),
            pinged,
        }),
        (2, 0) => State::Sse(SseMode::Payload),
        (2, 1) => State::Sse(SseMode::Json),
        (3, 0) => State::Stream(StreamMode::Ndjson),
        (3, 1) => State::Stream(StreamMode::Raw),
        (3, m) => {
            let (chunked, keep) = grip_stream(m)?;
            State::Stream(StreamMode::Grip { chunked, keep })
        }
        (4, keep) => State::Poll(PollMode {
            keep: keep == 1,
            grip: false,
        }),
        (5, 0) => State::H2,
        _ => return None,
    })
}

impl Engine<mio::net::TcpStream> {
    /// How many TLS connections have not finished their handshake: rustls' handshake state
    /// cannot move, so a hand-over gives them a moment to finish first ([`HANDSHAKE_GRACE`]).
    pub(crate) fn handshakes_in_flight(&self) -> usize {
        self.conns
            .iter()
            .filter(|(_, c)| c.tls.as_ref().is_some_and(|t| !t.established()))
            .count()
    }

    /// Why connection `k` cannot move, or `None` if it can.
    pub(super) fn cannot_move(&self, k: u32, conn: &Conn) -> Option<Fallback> {
        let s = &self.shared;
        if let Some(Err(why)) = conn.tls.as_ref().map(|t| t.park()) {
            return Some(match why {
                Unmovable::Handshake => Fallback::TlsHandshake,
                Unmovable::Tls12 => Fallback::Tls12,
                Unmovable::Keys => Fallback::TlsKeys,
            });
        }
        // What it holds outside its record: a hook's answer, a GRIP hold, a presence poll.
        if let Some(why) = self.side.blocker(k) {
            return Some(match why {
                Blocker::HookWait => Fallback::HookWait,
                Blocker::GripBackend => Fallback::GripBackend,
                Blocker::GripBridge => Fallback::GripBridge,
                Blocker::PresencePoll | Blocker::Conflating => Fallback::ModeState,
            });
        }
        if let Some(why) = self.grip_blocker(conn.state) {
            return Some(why);
        }
        if s.presence.as_ref().is_some_and(|p| p.clustered()) {
            return Some(Fallback::ModeState);
        }
        if let Some(why) = Fallback::of_state(conn.state) {
            return Some(why);
        }
        if self.pusher_part_missing(k, conn.state) {
            return Some(Fallback::Closing);
        }
        if conn.rx.in_compressed_message() {
            return Some(Fallback::DeflateFragmented);
        }
        if conn.rx.in_message() {
            return Some(Fallback::Fragment);
        }
        None
    }

    /// Lifts every connection that can move out of the slab, deregistered from `registry`
    /// and without closing its socket; the others stay (and are counted in `fallbacks`).
    pub(crate) fn lift_all(&mut self, registry: &mio::Registry) -> Vec<Moving> {
        let keys: Vec<u32> = self.conns.iter().map(|(k, _)| k as u32).collect();
        let mut out = Vec::with_capacity(keys.len());
        let mut listening = self.presence_listening_all();
        let mut lifted = std::collections::HashSet::new();
        for k in keys {
            let Some(conn) = self.conns.get(k as usize) else {
                continue;
            };
            if conn.stream.is_none() {
                // An HTTP/2 stream: it moves with its connection, or is refused there.
                continue;
            }
            if let Some(why) = self.cannot_move(k, conn) {
                self.shared.handover.fallbacks.add(why);
                continue;
            }
            let (topics, poll) = self.followed(k);
            let h2 = if conn.state == State::H2 {
                match self.lift_h2(k, &mut listening, &mut lifted) {
                    Some(part) => Some(part),
                    None => {
                        self.shared.handover.fallbacks.add(Fallback::Closing);
                        continue;
                    }
                }
            } else {
                None
            };
            // Between messages (a fragmented one stays behind). Before `release`, which
            // forgets the compressors.
            let deflate = self.take_windows(k);
            let grip = self.take_grip(k);
            let mode = self.release(k, listening.remove(&k).unwrap_or_default());
            lifted.insert(k);
            let Some(mut conn) = self.conns.try_remove(k as usize) else {
                continue;
            };
            let Some(mut stream) = conn.stream.take() else {
                continue;
            };
            let _ = registry.deregister(&mut stream);
            self.account(conn.state, None, conn.peer);
            // Parked after the last record was sealed: nothing changes it from here on.
            let tls = conn.tls.as_mut().and_then(|t| {
                let session = t.park().ok()?;
                let (partial, unsent) = t.take_in_flight();
                Some(MovingTls {
                    session: Box::new(session),
                    partial,
                    unsent,
                })
            });
            if conn.tls.is_some() {
                self.shared.metrics.tls_connections.fetch_sub(1, Relaxed);
            }
            let output = conn.take_unsent();
            let input = conn.input.take().map(|b| *b).unwrap_or_default();
            out.push(Moving {
                worker: self.id,
                state: conn.state,
                poll,
                idle: self.now.saturating_sub(conn.last_seen),
                peer: conn.peer,
                input,
                output,
                topics,
                mode,
                tls,
                deflate,
                h2,
                grip,
                fd: OwnedFd::from(std::net::TcpStream::from(stream)),
            });
        }
        if !lifted.is_empty() {
            self.presence_drop_listeners(&lifted);
        }
        out
    }

    /// The names of the topics `k` follows, and for a held poll its time left and cursor:
    /// what a moving record (a connection's or an HTTP/2 stream's) says of its subscriptions.
    pub(super) fn followed(&self, k: u32) -> (Vec<Arc<str>>, Option<(u32, String)>) {
        let topics = self
            .conns
            .get(k as usize)
            .map(|c| {
                c.subs
                    .ids()
                    .into_iter()
                    .filter_map(|tid| self.index.name_of(tid))
                    .collect()
            })
            .unwrap_or_default();
        let poll = self
            .side
            .polls()
            .get(&k)
            .map(|h| (h.deadline.saturating_sub(self.now), h.cursor.clone()));
        (topics, poll)
    }

    /// Takes `k`'s compression windows, each all that its stream's next message can refer
    /// back to. Called before [`Self::release`], which forgets the compressors.
    pub(super) fn take_windows(&mut self, k: u32) -> DeflateWindows {
        let Taken {
            poll: _, // Carried as its deadline and cursor (`followed`).
            inflater,
            deflater,
        } = self.side.take(k);
        DeflateWindows {
            deflater: deflater.map(|c| c.window().to_vec()),
            inflater: inflater.map(|i| i.window().to_vec()),
        }
    }

    /// Takes a handed-over connection: a record in `state`, counted as an accepted one would
    /// be, registered with `registry`, subscribed again to its topics from now, with its
    /// pending output queued and its input kept. Returns `false` if it could not be taken (its
    /// socket is then closed).
    pub(crate) fn take_arriving(&mut self, a: Arriving, registry: &mio::Registry) -> bool {
        // An HTTP/2 state that cannot be rebuilt: the same.
        let h2 = match a.h2.map(|p| {
            clarion_proto::h2::server::Connection::restore(&p.connection).map(|c| (c, p.streams))
        }) {
            Some(Err(e)) => {
                log::warn(format_args!("hand-over: HTTP/2 state refused: {e}"));
                return false;
            }
            Some(Ok(h)) => Some(h),
            None => None,
        };
        // A TLS record layer that cannot be rebuilt: the socket closes, the client reconnects.
        let tls = match a
            .tls
            .map(|t| Session::resume(t.session, t.partial, t.unsent))
        {
            Some(Err(e)) => {
                log::warn(format_args!("hand-over: TLS state refused: {e}"));
                return false;
            }
            Some(Ok(session)) => Some(session),
            None => None,
        };
        let ext = a.state.ws().and_then(|m| m.deflate);
        let inflater = match (a.deflate.inflater.as_deref(), ext) {
            (Some(w), Some(ext)) => match Inflater::resume(ext.client_window_bits(), w) {
                Some(i) => Some(i),
                None => {
                    log::warn(format_args!(
                        "hand-over: a client's inflate window was refused"
                    ));
                    return false;
                }
            },
            (Some(_) | None, None) | (None, Some(_)) => None,
        };
        let std_stream = std::net::TcpStream::from(a.fd);
        if std_stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut stream = mio::net::TcpStream::from_std(std_stream);
        let entry = self.conns.vacant_entry();
        let k = entry.key() as u32;
        if let Err(e) = registry.register(
            &mut stream,
            Token(entry.key()),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            log::warn(format_args!("hand-over: register: {e}"));
            return false;
        }
        let mut conn = Conn::new(stream, a.state, self.now.saturating_sub(a.idle), a.peer);
        if let Some(t) = tls {
            conn.tls = Some(super::pool::Pooled::new(t));
            self.shared.metrics.tls_connections.fetch_add(1, Relaxed);
        }
        if !a.input.is_empty() {
            conn.input = Some(Box::new(a.input));
        }
        if !a.output.is_empty() {
            conn.queue(&Arc::from(a.output));
        }
        entry.insert(conn);
        self.restore_grip(k, a.grip);
        let mut taken = Taken {
            inflater,
            ..Taken::default()
        };
        if let (Some(w), Some(ext)) = (a.deflate.deflater.as_deref(), ext) {
            // Past this worker's share of dedicated compressors the connection gets the shared
            // frames, which any client inflater reads whatever its window holds.
            if self.may_dedicate(k) {
                let bits = self.dedicated_window_bits(ext);
                let level = self.frames.deflate_settings.level;
                taken.deflater = Some(Compressor::resume(level, bits, 8, w));
            }
        }
        let s = &self.shared;
        s.open.fetch_add(1, Relaxed);
        s.admitted.fetch_add(1, Relaxed);
        if s.config.max_connections_per_address > 0 {
            *lock(&s.per_address).entry(a.peer).or_insert(0) += 1;
        }
        self.account(State::Closing { write_shut: false }, Some(a.state), a.peer);
        taken.poll = a.poll.map(|(left, cursor)| PollHold {
            deadline: self.now.saturating_add(left),
            cursor,
            presence: false,
        });
        self.side.restore(k, taken);
        self.resume(k, &a.topics, a.resume.as_deref(), a.mode.as_ref());
        if let Some((connection, streams)) = h2 {
            self.adopt_h2(k, connection, streams, a.peer);
        }
        // Bytes that arrived while the connection was moving are read at once.
        self.scratch.more_to_read.push(k);
        true
    }
}

impl<S: super::socket::Socket> Engine<S> {
    /// Writes to connection `k` alone, as live deliveries, what it missed while it moved (read
    /// from the clustered broker by the subscription), then a gap notice per topic the broker
    /// could not cover, positioned where live delivery continues. Before any later delivery,
    /// so the order is the order of ids.
    pub(super) fn catch_up_arriving(&mut self, k: u32, sub: crate::broker::Subscribed) {
        let mut batch = sub.replay;
        for g in &sub.gaps {
            let Some((epoch, at)) = event_id::resume_id(&sub.position, &g.topic, sub.names.len())
            else {
                continue;
            };
            let notice = Published::notice(Arc::clone(&g.topic), at, epoch.into(), 0, g);
            batch.push(Arc::new(notice));
        }
        if !batch.is_empty() {
            self.deliver_batch_to(&mut batch, Some(k));
        }
    }
}

impl Worker {
    /// Whether to let go now: when no TLS handshake is in flight, or the grace for them has
    /// passed. The first call stops accepting (the listeners belong to the new process now)
    /// and starts the grace.
    pub(super) fn may_let_go(&mut self) -> bool {
        let in_flight = self.engine.handshakes_in_flight();
        if in_flight == 0 {
            return true;
        }
        let now = std::time::Instant::now();
        let Some(until) = self.grace else {
            self.stop_accepting();
            self.grace = Some(now + HANDSHAKE_GRACE);
            return false;
        };
        if now < until {
            return false;
        }
        log::info(format_args!(
            "hand-over: worker {}: {in_flight} TLS handshakes did not finish within {} ms",
            self.id,
            HANDSHAKE_GRACE.as_millis()
        ));
        true
    }

    /// Deregisters the listeners: connections waiting in their queues go to the new process.
    fn stop_accepting(&mut self) {
        for mut l in [self.listener.take(), self.tls_listener.take()]
            .into_iter()
            .flatten()
        {
            let _ = self.poll.registry().deregister(&mut l);
        }
    }

    /// The old process's side: stops accepting, delivers what the inbox holds, and lifts the
    /// connections that can move; the rest stay, to be told to reconnect by the restart that
    /// follows.
    pub(super) fn let_go(&mut self, now: u32) {
        self.stop_accepting();
        self.engine.handle_inbox(now);
        self.engine.flush_tally();
        let lifted = self.engine.lift_all(self.poll.registry());
        self.engine.shared.handover.put(self.id, lifted);
        self.let_go = true;
    }

    /// The new process's side, before the loop runs: takes `arriving` connections.
    pub fn adopt_all(&mut self, arriving: Vec<Arriving>) -> usize {
        let mut n = 0;
        for a in arriving {
            if self.engine.take_arriving(a, self.poll.registry()) {
                n += 1;
            }
        }
        self.engine
            .shared
            .handover
            .taken
            .fetch_add(n as u64, Relaxed);
        n
    }
}

#[cfg(test)]
#[path = "handover_tests.rs"]
mod tests;
