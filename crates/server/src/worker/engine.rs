//! The engine: everything one worker owns except the poller and the listeners. It holds the
//! connection slab, the topic index, the shared buffers and the side tables of connections
//! (held polls, GRIP state, compression state), and it is driven by the shell in [`super`]
//! through a handful of entry points, each given the coarse clock `now` in whole seconds.
//!
//! The engine never reads a clock and never polls: that is what lets its connection logic run
//! in memory under simulated time in tests.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use slab::Slab;

use super::conn::Conn;
use super::filters::FilterTable;
use super::frames::Frames;
use super::index::TopicIndex;
use super::shared::Shared;
use super::side::Side;
use super::socket::Socket;
use super::state::Exit;
use crate::hub::Inbox;
use crate::message::Published;
use crate::metrics::CloseReason;

/// Byte counts gathered during one loop iteration and added to the shared metrics once.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) delivered: u64,
}

/// What one loop iteration reads into and counts, and the work it leaves to the next: shared
/// by every connection of the worker.
pub(crate) struct Scratch {
    /// Reads land here and are parsed in place.
    pub(crate) read_buf: Vec<u8>,
    /// Decrypted bytes of one TLS read, and the handshake records it produced.
    pub(crate) plain_buf: Vec<u8>,
    pub(crate) handshake_buf: Vec<u8>,
    /// Connections whose read budget ran out; read again next iteration.
    pub(crate) more_to_read: Vec<u32>,
    /// HTTP/2 connections whose streams wrote since the last pump.
    pub(crate) h2_dirty: Vec<u32>,
    /// A pump pass's frames, and the (stream, record) pairs of the connection it frames.
    pub(crate) h2_out: Vec<u8>,
    pub(crate) h2_streams: Vec<(u32, u32)>,
    pub(crate) tally: Tally,
}

/// What a fan-out of published messages reuses from one to the next ([`super::deliver`]).
pub(crate) struct Fanout<S: Socket> {
    /// Counts fan-outs: each starts at another place in its topic's subscriber list (see
    /// `deliver::fanout_start`).
    pub(crate) turn: u32,
    /// What writes a fan-out in one submission (the real socket's io_uring), when there is one:
    /// single-message deliveries are then gathered in `pending` and written together.
    pub(crate) batch: Option<S::Batch>,
    pub(crate) pending: Vec<(u32, Arc<[u8]>)>,
    /// TLS subscribers' records for the same submission: sealed at once, one after another,
    /// in `sealed` (each connection's range beside its key), so that a secure fan-out is
    /// written in batches too, not one `send` per subscriber.
    pub(crate) pending_sealed: Vec<(u32, std::ops::Range<usize>)>,
    pub(crate) sealed: Vec<u8>,
    pub(crate) results: Vec<std::io::Result<usize>>,
    /// Recycled vector for inbox swaps.
    pub(crate) spare: Vec<Arc<Published>>,
}

/// The other clocks' readings at the coarse clock's second 0, so that `now` alone gives them.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Anchors {
    /// The Unix time (seconds): token expiry is wall-clock time, the sweep runs on `now`.
    pub(crate) unix: u64,
    /// The broker's hub clock ([`crate::broker::Broker::clock`]), which stamps published
    /// messages for history expiry: an in-band publish is stamped at `hub + now`.
    pub(crate) hub: u32,
}

/// One worker's connections and everything they share.
pub struct Engine<S: Socket = mio::net::TcpStream> {
    pub(crate) id: usize,
    pub(crate) conns: Slab<Conn<S>>,
    pub(crate) index: TopicIndex,
    /// Subscriptions' filters, one evaluation per message per distinct filter.
    pub(crate) filters: FilterTable,
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) shared: Arc<Shared>,
    /// The coarse clock: seconds since the worker started, as the shell last passed it in.
    pub(crate) now: u32,
    /// What connections hold outside their record, every table of it ([`super::side`]).
    pub(crate) side: Side,
    pub(crate) scratch: Scratch,
    pub(crate) frames: Frames,
    pub(crate) fanout: Fanout<S>,
    /// What the coarse clock's second 0 is on the other clocks the engine answers in, set by
    /// the shell (the engine reads no clock).
    pub(crate) anchors: Anchors,
    /// Connections are being lifted out for a new process, or taken from an old one: their
    /// topics change hands without occupancy webhooks ([`super::handover`]).
    pub(crate) handing_over: bool,
}

impl<S: Socket> Engine<S> {
    /// An engine for worker `id`, whose hub deliveries arrive in `inbox`.
    pub fn new(id: usize, inbox: Arc<Inbox>, shared: Arc<Shared>) -> Engine<S> {
        let scratch = Scratch {
            read_buf: vec![0; shared.config.read_buffer],
            plain_buf: Vec::new(),
            handshake_buf: Vec::new(),
            more_to_read: Vec::new(),
            h2_dirty: Vec::new(),
            h2_out: Vec::new(),
            h2_streams: Vec::new(),
            tally: Tally::default(),
        };
        // Only servers with authentication reserve the grants (see `GrantStore::with_capacity`).
        let side = Side::new(shared.auth.as_ref().map(|_| shared.cap));
        let frames = Frames::new(&shared.config);
        Engine {
            id,
            conns: Slab::new(),
            index: TopicIndex::default(),
            filters: FilterTable::default(),
            inbox,
            shared,
            now: 0,
            side,
            scratch,
            frames,
            fanout: Fanout {
                turn: 0,
                batch: None,
                pending: Vec::new(),
                pending_sealed: Vec::new(),
                sealed: Vec::new(),
                results: Vec::new(),
                spare: Vec::new(),
            },
            anchors: Anchors::default(),
            handing_over: false,
        }
    }

    /// Open connections (closing ones included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is left.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Whether some connection's read budget ran out: the shell should not sleep.
    pub fn wants_read(&self) -> bool {
        !self.scratch.more_to_read.is_empty() || !self.scratch.h2_dirty.is_empty()
    }

    /// Reads the connections whose budget ran out last time.
    pub fn read_more(&mut self, now: u32) {
        self.now = now;
        for k in std::mem::take(&mut self.scratch.more_to_read) {
            self.on_readable(k);
        }
        self.settle();
    }

    /// A socket is readable (or hung up): read it.
    pub fn handle_readable(&mut self, k: u32, now: u32) {
        self.now = now;
        self.on_readable(k);
        self.settle();
    }

    /// A socket is writable: write what it owes.
    pub fn handle_writable(&mut self, k: u32, now: u32) {
        self.now = now;
        self.on_writable(k);
        self.settle();
    }

    /// Applies backend answers (GRIP) and delivers what the hub handed to this worker.
    pub fn handle_inbox(&mut self, now: u32) {
        self.now = now;
        self.grip_answers();
        self.hook_answers();
        self.drain_inbox();
        self.settle();
    }

    /// Once per second of `now`: the timers (see [`super::timers`]).
    pub fn handle_tick(&mut self, now: u32) {
        self.now = now;
        self.sweep();
        self.settle();
    }

    /// Tells connections to go, up to `share` (0 to 1) of those open when the shutdown
    /// began; `1.0` tells every one left (see [`super::shutdown`]).
    pub fn handle_shutdown(&mut self, now: u32, share: f64) {
        self.now = now;
        self.drain_to(share);
        self.settle();
    }

    /// The epilogue of every entry point above: the work a transport defers to the end of
    /// an engine call runs here, once. HTTP/2 is the one that defers: its streams' bytes are
    /// framed within the flow-control windows after everything of the call has written.
    fn settle(&mut self) {
        self.h2_pump();
    }

    /// The loop's end: every connection still here is dropped.
    pub fn close_all(&mut self) {
        for k in self.conns.iter().map(|(k, _)| k as u32).collect::<Vec<_>>() {
            self.drop_conn(k, CloseReason::Shutdown);
        }
        self.flush_tally();
    }

    /// Drops everything connection `k` holds outside its record ([`Side::forget`]), and
    /// finishes what the features owning those tables must still do: its HTTP/2 streams end
    /// (see [`Exit`]), a bridged WebSocket's backend hears it left, its presence rooms forget it.
    pub(crate) fn forget_side_state(&mut self, k: u32, exit: Exit) {
        match exit {
            Exit::Gone => self.h2_forget(k),
            // An HTTP/2 connection's streams end with it; a closing stream record keeps its
            // link until its connection has framed its last bytes.
            Exit::Closing if self.side.h2().contains_key(&k) => self.h2_forget(k),
            Exit::Closing | Exit::Moved => {}
        }
        let forgotten = self.side.forget(k);
        if let Some(g) = forgotten.grip {
            self.grip_left(k, g);
        }
        if let Some(p) = forgotten.pusher {
            self.pusher_left(k, p);
        }
        self.presence_forget(k);
    }

    /// The record that owns `k`'s socket: `k` itself, or for an HTTP/2 stream (which has no
    /// socket) its connection.
    pub(crate) fn socket_owner(&self, k: u32) -> u32 {
        self.side.h2_streams().get(&k).map_or(k, |link| link.parent)
    }

    /// The client's address for `k`, on every transport: an HTTP/2 stream's is its
    /// connection's. Everything that reports or forwards the address reads it here.
    pub(crate) fn peer_of(&self, k: u32) -> Option<std::net::IpAddr> {
        let owner = self.socket_owner(k);
        self.conns.get(owner as usize)?.stream.as_ref()?.peer_ip()
    }

    /// Whether `k` reached us over TLS, on every transport: an HTTP/2 stream's answer is its
    /// connection's (the stream's own record never holds the TLS session).
    pub(crate) fn is_tls(&self, k: u32) -> bool {
        let owner = self.socket_owner(k);
        self.conns
            .get(owner as usize)
            .is_some_and(|c| c.tls.is_some())
    }

    /// The current Unix time, from the coarse clock.
    pub(crate) fn unix_now(&self) -> u64 {
        self.anchors.unix + u64::from(self.now)
    }

    /// Sets the Unix time of the coarse clock's second 0 (the shell, at start).
    pub fn set_unix_base(&mut self, unix: u64) {
        self.anchors.unix = unix;
    }

    /// The broker's hub clock, from the coarse clock: what an in-band publish is stamped with.
    pub(crate) fn hub_now(&self) -> u32 {
        self.anchors.hub.saturating_add(self.now)
    }

    /// Sets the hub clock's reading at the coarse clock's second 0 (the shell, each iteration).
    pub fn set_hub_base(&mut self, hub: u32) {
        self.anchors.hub = hub;
    }

    pub(crate) fn flush_tally(&mut self) {
        let t = std::mem::take(&mut self.scratch.tally);
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
