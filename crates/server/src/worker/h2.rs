//! HTTP/2 connections in the engine: the I/O side of [`clarion_proto::h2::server`].
//!
//! An HTTP/2 connection is a record in state [`State::H2`] with its protocol state in
//! [`super::side::Side::h2`]; each of its streams is a record of its own, without a socket,
//! that the transports serve exactly as they serve an HTTP/1.1 connection: the stream's request is
//! handed to it as an HTTP/1.1 head, and what it writes (an answer, SSE events, WebSocket
//! frames) waits in its own backlog, as shared chunks under its own slow-consumer limit. The
//! pump ([`Engine::h2_pump`]), run at the end of each engine entry point for the connections
//! whose streams wrote, frames those bytes as far as the flow-control windows allow and writes
//! them on the connection's socket, at most [`PUMP_BYTES`] ahead of what the kernel took.
//!
//! A fan-out's messages to a connection's only stream skip the backlog and the pump when
//! nothing waits before them ([`Engine::h2_deliver_now`]): framed at once, they are written
//! with the fan-out's other writes, as an HTTP/1.1 subscriber's are.
//!
//! So the HTTP/2 connection needs nothing from the transports, and a stream costs what an
//! HTTP/1.1 connection costs minus its socket, plus its entry in the protocol state.
//!
//! A stream record lives exactly as long as its stream is open in the protocol state: it is
//! made for a stream still open once the frames of a read are taken, dropped when the stream
//! is reset (by the client, or by this side for the client's error), and its link counted in
//! [`super::side::Side::h2_records`], so that no connection holds more records than
//! `h2_max_streams`, whatever the protocol state says (see `tests_h2.rs`, which checks it after
//! every step of random frame sequences).
#![deny(clippy::wildcard_enum_match_arm)]

use std::alloc::Layout;
use std::num::{NonZeroU16, NonZeroU32};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use clarion_proto::h2::frame::ErrorCode;
use clarion_proto::h2::response::Ended;
use clarion_proto::h2::server::{Connection, Event};

use super::conn::Conn;
use super::pool::{InPool, Pooled, Slots};
use super::socket::Socket;
use super::state::{Kind, State};
use super::Engine;
use crate::log;
use crate::metrics::CloseReason;

/// Framed bytes a connection may owe its socket before the pump leaves the rest in the
/// streams' backlogs (where each stream's slow-consumer limit counts them).
pub(crate) const PUMP_BYTES: usize = 256 * 1024;
/// The most streams one connection may have open at once, whatever `h2_max_streams` says (a
/// browser uses at most a few hundred): its stream records are counted in 16 bits.
const MAX_STREAMS: usize = u16::MAX as usize;
/// Pump passes over one connection per engine entry point (each up to [`PUMP_BYTES`]).
const MAX_PASSES: usize = 16;
/// The largest pump buffer a worker keeps for the next pass (a ticker's passes are a few
/// hundred bytes; one that framed a large backlog gives its buffer back).
const KEEP_PUMP_BUFFER: usize = 64 * 1024;

/// An HTTP/2 connection's protocol state.
pub(crate) struct H2 {
    pub(crate) conn: Connection,
    /// A polite GOAWAY is due: the pump writes it after the streams' last frames, so a client
    /// that stops reading at a GOAWAY (hyper-h2, and httpx on it) sees its streams end first.
    pub(crate) goaway_due: bool,
    /// Sweeps since something last used this state: at `super::h2_rest::REST_AFTER` it may
    /// rest.
    pub(crate) quiet: u8,
    /// The last second (of `now`) in which the connection had a stream open or a request
    /// arrived: without one for `handshake_timeout`, it is told to go. PINGs and SETTINGS do
    /// not count, so a client cannot hold the socket with them alone.
    pub(crate) busy_at: u32,
    /// When the header block in progress began: it must end within `handshake_timeout`
    /// (a client trickling CONTINUATION bytes holds the whole connection meanwhile).
    pub(crate) block_since: Option<u32>,
}

impl H2 {
    /// A connection's state as the engine starts it: just used, nothing due, no header block
    /// pending.
    pub(crate) fn new(conn: Connection, now: u32) -> H2 {
        H2 {
            conn,
            goaway_due: false,
            quiet: 0,
            busy_at: now,
            block_since: None,
        }
    }
}

/// A stream record's place: its connection's key and its stream's id. Stream 0 is the
/// connection itself, never a stream, which leaves the table's slot a niche (8 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Link {
    pub(crate) parent: u32,
    stream: NonZeroU32,
}

impl Link {
    /// The link of stream `stream` of connection `parent`; `None` for stream 0.
    pub(crate) fn new(parent: u32, stream: u32) -> Option<Link> {
        Some(Link {
            parent,
            stream: NonZeroU32::new(stream)?,
        })
    }

    pub(crate) fn stream(self) -> u32 {
        self.stream.get()
    }

    /// Whether this is stream `stream` of connection `parent`.
    pub(crate) fn is(self, parent: u32, stream: u32) -> bool {
        self.parent == parent && self.stream.get() == stream
    }
}

/// The pool every worker's HTTP/2 connections share: a connection's protocol state lives as
/// long as it does (see [`super::pool`]).
static CONNECTIONS: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<H2>()));

impl InPool for H2 {
    fn slots() -> &'static Mutex<Slots> {
        &CONNECTIONS
    }
}

impl<S: Socket> Engine<S> {
    /// Whether connection `k` may become HTTP/2 (it is a connection of its own, not a stream,
    /// and HTTP/2 is on).
    pub(crate) fn h2_allowed(&self, k: u32) -> bool {
        self.shared.config.http2
            && self
                .conns
                .get(k as usize)
                .is_some_and(|c| c.stream.is_some())
    }

    /// Bytes starting with `PRI `: the HTTP/2 preface (prior knowledge, or after ALPN `h2`).
    /// Turns the connection into an HTTP/2 one and sends this side's SETTINGS. Returns `None`
    /// while the preface is incomplete, `Some(0)` once switched (the preface is then read as
    /// HTTP/2), and for anything else hands the bytes to the HTTP/1.1 path.
    pub(crate) fn h2_preface(&mut self, k: u32, data: &[u8]) -> Option<usize> {
        let preface = clarion_proto::h2::frame::PREFACE;
        if data.len() < preface.len() && preface.starts_with(data) {
            return None;
        }
        if !data.starts_with(preface) {
            // "PRI" is no HTTP/1.1 method of ours: a broken preface. Close, as RFC 9113 §3.4
            // allows, rather than answer in a protocol the client did not speak.
            log::debug(format_args!("bad HTTP/2 preface"));
            self.start_closing(k, None, CloseReason::HttpError);
            return Some(data.len());
        }
        let conn = Connection::new(self.h2_settings());
        let mut out = Vec::with_capacity(64);
        conn.start(&mut out);
        self.h2_put(k, Pooled::new(H2::new(conn, self.now)));
        self.set_state(k, State::H2);
        if let Some(c) = self.conns.get_mut(k as usize) {
            c.last_seen = self.now;
        }
        self.write_to(k, &Arc::from(out), Some(self.h2_cap()));
        Some(0)
    }

    /// Streams one connection may have open at once: `h2_max_streams`, within 1 and
    /// [`MAX_STREAMS`].
    pub(crate) fn h2_max_streams(&self) -> usize {
        self.shared.config.h2_max_streams.clamp(1, MAX_STREAMS)
    }

    /// What an HTTP/2 connection may owe its socket when it answers the client (control
    /// frames): the pump's framed bytes, plus as much as an HTTP/1.1 connection may owe. Past
    /// it the client has stopped reading and the connection is closed.
    fn h2_cap(&self) -> usize {
        let cfg = &self.shared.config;
        PUMP_BYTES + cfg.max_backlog + cfg.max_message_size
    }

    /// Frames from the client: returns the bytes used (the rest is an incomplete frame).
    pub(crate) fn on_h2(&mut self, k: u32, data: &mut [u8]) -> usize {
        let Some(mut h) = self.h2_take(k) else {
            return data.len();
        };
        let (mut out, mut events) = (Vec::new(), Vec::new());
        let res = h.conn.receive(data, &mut out, &mut events);
        let stream_errors = h.conn.take_stream_errors();
        if stream_errors > 0 {
            let m = &self.shared.metrics;
            m.h2_stream_errors
                .fetch_add(u64::from(stream_errors), Relaxed);
        }
        // The events were made before any stream of this read was bound: the protocol state,
        // as it is after the whole read, says which streams are still open and their records.
        for ev in events {
            match ev {
                Event::Request {
                    stream, request, ..
                } => {
                    h.busy_at = self.now;
                    // Reset later in the same read (a zero WINDOW_UPDATE right after its
                    // HEADERS): gone already, so no record is made for it.
                    if h.conn.is_open(stream) {
                        self.h2_open(k, &mut h, stream, request.head, &mut out);
                    }
                }
                Event::Data {
                    stream,
                    data,
                    end_stream,
                    ..
                } => {
                    if let Some(child) = self.h2_child(k, stream, h.conn.user_of(stream)) {
                        self.h2_body(child, data, end_stream);
                    }
                }
                Event::Reset { stream, user } => {
                    if let Some(child) = self.h2_child(k, stream, user) {
                        self.h2_stream_gone(child, CloseReason::Disconnected);
                    }
                }
            }
        }
        h.block_since = match (h.conn.pending_header_block(), h.block_since) {
            (true, Some(t)) => Some(t),
            (true, None) => Some(self.now),
            (false, _) => None,
        };
        self.h2_put(k, h);
        self.scratch.h2_dirty.push(k);
        if !out.is_empty() {
            self.write_to(k, &Arc::from(out), Some(self.h2_cap()));
        }
        match res {
            Ok(used) => used,
            Err(fatal) => {
                log::debug(format_args!("HTTP/2: {fatal}"));
                if fatal.code != ErrorCode::NoError {
                    self.shared.metrics.h2_errors.fetch_add(1, Relaxed);
                }
                self.start_closing(k, None, CloseReason::HttpError);
                data.len()
            }
        }
    }

    /// A new stream: a record of its own, admitted like a connection, given its request.
    fn h2_open(&mut self, k: u32, h: &mut H2, stream: u32, mut head: Vec<u8>, out: &mut Vec<u8>) {
        let Some(peer) = self.conns.get(k as usize).map(|c| c.peer) else {
            return;
        };
        // The protocol state refuses streams past `h2_max_streams`; this holds the engine to
        // it too, should a record ever outlive its stream.
        if self.h2_records_of(k) >= self.h2_max_streams() {
            log::debug(format_args!(
                "HTTP/2 stream refused: records at h2_max_streams"
            ));
            h.conn.cancel(stream, ErrorCode::RefusedStream, out);
            return;
        }
        if let Some((_, why)) = self.admit(peer) {
            log::debug(format_args!("HTTP/2 stream refused: {why}"));
            h.conn.cancel(stream, ErrorCode::RefusedStream, out);
            return;
        }
        let child = self
            .conns
            .insert(Conn::stream_of_h2(State::Http, self.now, peer)) as u32;
        h.conn.bind(stream, child);
        self.h2_link(child, k, stream);
        self.shared.metrics.h2_streams_opened.fetch_add(1, Relaxed);
        self.consume(child, &mut head);
    }

    /// Links stream record `child` to `stream` of connection `parent`: with
    /// [`Self::h2_unlink`], the only place [`super::side::Side::h2_streams`] and
    /// [`super::side::Side::h2_records`] change.
    pub(crate) fn h2_link(&mut self, child: u32, parent: u32, stream: u32) {
        let Some(link) = Link::new(parent, stream) else {
            return; // Stream 0 is the connection's: the protocol state binds no record to it.
        };
        if let Some(old) = self.side.h2_streams_mut().insert(child, link) {
            self.h2_count(old.parent, false);
        } else {
            self.shared.metrics.h2_streams.fetch_add(1, Relaxed);
        }
        self.h2_count(parent, true);
    }

    /// Unlinks stream record `child`; its connection's key and stream id, if it was one.
    pub(crate) fn h2_unlink(&mut self, child: u32) -> Option<(u32, u32)> {
        let link = self.side.h2_streams_mut().remove(&child)?;
        self.shared.metrics.h2_streams.fetch_sub(1, Relaxed);
        self.h2_count(link.parent, false);
        Some((link.parent, link.stream()))
    }

    fn h2_count(&mut self, parent: u32, up: bool) {
        let records = self.side.h2_records_mut();
        let n = records.get(&parent).map_or(0, |n| n.get());
        // Within `MAX_STREAMS`, which `h2_open` keeps.
        let n = if up {
            n.saturating_add(1)
        } else {
            n.saturating_sub(1)
        };
        match NonZeroU16::new(n) {
            Some(n) => {
                records.insert(parent, n);
            }
            None => {
                records.remove(&parent);
            }
        }
    }

    /// The stream records connection `parent` holds.
    pub(crate) fn h2_records_of(&self, parent: u32) -> usize {
        self.side
            .h2_records()
            .get(&parent)
            .map_or(0, |n| usize::from(n.get()))
    }

    /// `user`, the handle the protocol state has for `stream` of connection `k`, if it is
    /// still that stream's record: one dropped during this read (while the state was out of
    /// the table) stays bound there, and its key may serve another record by now.
    fn h2_child(&self, k: u32, stream: u32, user: Option<u32>) -> Option<u32> {
        user.filter(|u| {
            self.side
                .h2_streams()
                .get(u)
                .is_some_and(|l| l.is(k, stream))
        })
    }

    /// Request body bytes for a stream (WebSocket frames on a WebSocket stream).
    fn h2_body(&mut self, child: u32, data: &[u8], end_stream: bool) {
        let Some(c) = self.conns.get_mut(child as usize) else {
            return;
        };
        if let State::Ws(mode) = &mut c.state {
            c.last_seen = self.now;
            mode.pinged = false;
        }
        if !data.is_empty() {
            let mut bytes = data.to_vec();
            self.consume(child, &mut bytes);
        }
        // The client has finished sending: for a WebSocket that is its end (as EOF is on a
        // connection of its own); a request's body is simply complete.
        let ws_open = self
            .conns
            .get(child as usize)
            .is_some_and(|c| c.state.kind() == Kind::Ws);
        if end_stream && ws_open {
            self.h2_stream_gone(child, CloseReason::Disconnected);
        }
    }

    /// A stream record wrote (or started closing): its connection has framing to do.
    pub(crate) fn h2_stream_wrote(&mut self, child: u32) {
        if let Some(link) = self.side.h2_streams().get(&child) {
            self.scratch.h2_dirty.push(link.parent);
        }
    }

    /// A fan-out's messages to stream record `child`: framed at once into its connection's
    /// write (gathered with the fan-out's other writes when `together`), skipping the stream's
    /// backlog and the pump's pass, when the stream is its connection's only one (a browser's
    /// one EventSource, or one RFC 8441 WebSocket, per connection) and nothing waits before
    /// the messages on either (a run of them shares DATA frames, as an HTTP/1.1 subscriber's
    /// run shares TLS records); otherwise into the stream's backlog for the pump, as
    /// [`Engine::deliver_all`] would, its connection marked without a second lookup. What the
    /// windows do not allow waits in the backlog too. `false`: `child` is not a stream of an
    /// HTTP/2 connection, nothing was done.
    ///
    /// Several streams of one connection keep the pump, whose one pass frames all of them into
    /// one write (a fan-out's writes for one socket must be one item of its submission).
    pub(crate) fn h2_deliver_now(
        &mut self,
        child: u32,
        frames: &[&Arc<[u8]>],
        together: bool,
    ) -> bool {
        let Some(&link) = self.side.h2_streams().get(&child) else {
            return false;
        };
        let (p, stream) = (link.parent, link.stream());
        let idle = self
            .conns
            .get(child as usize)
            .is_some_and(|c| c.backlog_bytes() == 0);
        let parent_ready = self
            .conns
            .get(p as usize)
            .is_some_and(|c| c.state == State::H2 && (c.seals_directly() || c.sends_directly()));
        let records_ready = idle && parent_ready && !self.side.conflation().contains_key(&child);
        // The protocol state binds the stream to this very record (the link above is the
        // record's own; both must agree before its bytes go on that stream).
        let mut out = std::mem::take(&mut self.scratch.h2_out);
        out.clear();
        let state = if records_ready {
            self.h2_state(p)
        } else {
            None
        };
        let state = state.filter(|h| {
            !h.goaway_due && h.conn.open_streams() == 1 && h.conn.user_of(stream) == Some(child)
        });
        let (framed, cut) = state.map_or((0, 0), |h| h.conn.respond_run(stream, frames, &mut out));
        // What was not framed (all of it, when the stream cannot be framed at once) waits in
        // the backlog, in order: the rest of a message the windows cut (the client's
        // WINDOW_UPDATE marks the connection for the pump), then the messages after it.
        if let Some(c) = self.conns.get_mut(child as usize) {
            let mut rest = frames.get(framed..).unwrap_or_default().iter();
            if cut > 0 {
                if let Some(&frame) = rest.next() {
                    c.keep_unsent(frame, cut);
                }
            }
            for &frame in rest {
                c.queue(frame);
            }
            if c.backlog_bytes() > 0 {
                self.after_write_of(child, Some(self.shared.config.max_backlog), Some(p));
            }
        }
        if !out.is_empty() {
            self.h2_send(p, &out, together);
        }
        if out.capacity() <= KEEP_PUMP_BUFFER {
            self.scratch.h2_out = out;
        }
        true
    }

    /// Drops a stream's record (its stream is reset, unless already gone).
    fn h2_stream_gone(&mut self, child: u32, reason: CloseReason) {
        if self.conns.contains(child as usize) {
            self.drop_conn(child, reason);
        }
    }

    /// A record leaves the slab: a stream record resets its stream if it had not ended; a
    /// connection takes its streams with it.
    pub(crate) fn h2_forget(&mut self, k: u32) {
        if let Some((parent, stream)) = self.h2_unlink(k) {
            if let Some(h) = self.h2_state(parent) {
                let mut out = Vec::new();
                h.conn.cancel(stream, ErrorCode::Cancel, &mut out);
                if !out.is_empty() {
                    self.write_to(parent, &Arc::from(out), None);
                }
            }
            return;
        }
        if let Some(h) = self.h2_take(k) {
            let children = self.h2_children(k, &h);
            drop(h);
            for (c, _) in children {
                self.drop_conn(c, CloseReason::Disconnected);
            }
            self.side.h2_records_mut().remove(&k);
        }
    }

    /// The stream records of connection `k` (whose protocol state is `h`, out of its table)
    /// and their stream ids. Found through the streams the state has bound, so that closing
    /// or moving many connections costs each its own streams, not a walk over every stream
    /// record; the walk remains for a count that says some record was not found.
    pub(crate) fn h2_children(&self, k: u32, h: &H2) -> Vec<(u32, u32)> {
        let streams = self.side.h2_streams();
        let children: Vec<(u32, u32)> = h
            .conn
            .bound()
            .filter(|&(stream, user)| streams.get(&user).is_some_and(|l| l.is(k, stream)))
            .map(|(stream, user)| (user, stream))
            .collect();
        if children.len() == self.h2_records_of(k) {
            return children;
        }
        streams
            .iter()
            .filter(|(_, l)| l.parent == k)
            .map(|(c, l)| (c, l.stream()))
            .collect()
    }

    /// Socket `k` took bytes: if it is an HTTP/2 connection, its streams may frame more.
    pub(crate) fn h2_writable(&mut self, k: u32) {
        if self.side.h2().contains_key(&k) {
            self.scratch.h2_dirty.push(k);
        }
    }

    /// Frames what the streams of the connections in `h2_dirty` wrote, within the windows
    /// (from the engine's epilogue only).
    pub(crate) fn h2_pump(&mut self) {
        if self.scratch.h2_dirty.is_empty() {
            return;
        }
        let mut dirty = std::mem::take(&mut self.scratch.h2_dirty);
        dirty.sort_unstable();
        dirty.dedup();
        // Several connections to pump (a ticker's message to many HTTP/2 subscribers): their
        // frames are written together in one submission, as a fan-out's are.
        let together = self.fanout.batch.is_some() && dirty.len() > 1;
        for &p in &dirty {
            // A pass stops at PUMP_BYTES. If the kernel then took everything, no writable
            // event will come to continue: pass again until it refuses something (the event
            // then continues) or nothing is left; past a bound, the next iteration of the
            // loop continues (it does not sleep while `h2_dirty` holds work). A pass whose
            // frames wait for the submission is the connection's last here (a second would
            // be written before them): the next iteration continues it.
            let mut more = true;
            for _ in 0..MAX_PASSES {
                let (again, gathered) = self.h2_pump_one(p, together);
                more = again;
                let owed = self.conns.get(p as usize).map_or(1, |c| c.backlog_bytes());
                if gathered || !more || owed > 0 {
                    more = more && gathered;
                    break;
                }
            }
            if more {
                self.scratch.h2_dirty.push(p);
            }
        }
        self.write_fanout();
        dirty.clear();
        if self.scratch.h2_dirty.is_empty() {
            self.scratch.h2_dirty = dirty;
        }
    }

    /// One pass over connection `p`'s streams: whether it stopped at [`PUMP_BYTES`] with
    /// streams left to frame, and whether its frames were gathered for the fan-out's
    /// submission (`together`) rather than written.
    fn h2_pump_one(&mut self, p: u32, together: bool) -> (bool, bool) {
        let owed = match self.conns.get(p as usize).map(|c| (c.state, c)) {
            Some((State::H2, c)) => c.backlog_bytes(),
            // Closing (its GOAWAY is out), or the key serves another record by now.
            Some((
                State::Http
                | State::Ws(_)
                | State::Sse(_)
                | State::Stream(_)
                | State::Poll(_)
                | State::Proxy
                | State::Closing { .. },
                _,
            ))
            | None => return (false, false),
        };
        if owed > PUMP_BYTES {
            return (false, false); // The socket's writable event pumps again.
        }
        let Some(mut h) = self.h2_take(p) else {
            return (false, false);
        };
        h.conn.take_windows_opened();
        // The frames and the list of streams reuse the worker's buffers (a ticker pumps
        // thousands of connections per message).
        let mut out = std::mem::take(&mut self.scratch.h2_out);
        let mut streams = std::mem::take(&mut self.scratch.h2_streams);
        out.clear();
        streams.clear();
        streams.extend(h.conn.bound());
        let mut finished = Vec::new();
        let mut all = true;
        // Streams that framed bytes and hold a conflation backlog: written on from it below.
        let mut drained = Vec::new();
        for &(stream, child) in &streams {
            // A record dropped while the state was out of the table (during `on_h2`) left its
            // stream bound; its key may serve another stream or connection by now.
            let ours = self.h2_child(p, stream, Some(child)).is_some();
            let Some(c) = self.conns.get_mut(child as usize).filter(|_| ours) else {
                h.conn.cancel(stream, ErrorCode::Cancel, &mut out);
                continue;
            };
            let before = c.backlog_bytes();
            while let Some(front) = c.backlog_front() {
                let n = h.conn.respond(stream, front, &mut out);
                let whole = n == front.len();
                c.backlog_consume(n);
                if !whole {
                    break;
                }
            }
            if c.backlog_bytes() < before && self.side.conflation().contains_key(&child) {
                drained.push(child);
            }
            if c.backlog_bytes() == 0 {
                if c.state.kind() == Kind::Closing {
                    if h.conn.end(stream, &mut out) == Ended::Done {
                        finished.push(child);
                    }
                } else {
                    // Decoded bytes of a chunked answer may wait for window.
                    h.conn.respond(stream, &[], &mut out);
                }
            }
            if owed + out.len() > PUMP_BYTES {
                all = false;
                break;
            }
        }
        if h.goaway_due && all {
            h.goaway_due = false;
            h.conn.go_away(ErrorCode::NoError, &mut out);
        }
        let idle_goaway = h.conn.going_away() && h.conn.open_streams() == 0;
        self.h2_put(p, h);
        for child in finished {
            self.h2_unlink(child);
            self.conns.try_remove(child as usize);
        }
        // A connection told to go closes right after: its GOAWAY is written now.
        let gathered = !out.is_empty() && self.h2_send(p, &out, together && !idle_goaway);
        // Kept unless a large pass grew them.
        if out.capacity() <= KEEP_PUMP_BUFFER {
            self.scratch.h2_out = out;
        }
        self.scratch.h2_streams = streams;
        // What the pump took made room: conflated messages follow (they mark the connection
        // dirty again, so the next pump frames them).
        for child in drained {
            self.conflate_drain(child);
        }
        if idle_goaway {
            self.start_closing(p, None, CloseReason::HttpDone);
        }
        (!all, gathered)
    }

    /// Writes a pump's frames for connection `p`, or, with `together`, gathers them for the
    /// fan-out's one submission ([`Self::write_fanout`]) when nothing waits before them
    /// (sealed now on a TLS connection); `true` if gathered.
    fn h2_send(&mut self, p: u32, out: &[u8], together: bool) -> bool {
        if let Some(c) = self.conns.get_mut(p as usize).filter(|_| together) {
            if c.seals_directly() {
                self.gather_sealed(p, out);
                return true;
            }
            if c.sends_directly() {
                self.fanout.pending.push((p, Arc::from(out)));
                return true;
            }
        }
        self.write_to(p, &Arc::from(out), None);
        false
    }

    /// Ends an HTTP/2 connection politely (shutdown, idle): GOAWAY from the next pump, after
    /// the last frames of the streams told to end with it, and the connection closes once its
    /// streams have.
    pub(crate) fn h2_go_away(&mut self, k: u32) {
        if let Some(h) = self.h2_state(k) {
            h.goaway_due = true;
            self.scratch.h2_dirty.push(k);
        }
    }

    /// The sweep's HTTP/2 part (see `super::timers`): the flood budgets start again; a
    /// connection without a stream or a request for `handshake_timeout` (PINGs do not count)
    /// is told to go, and one whose header block has not ended within it is ended (GOAWAY
    /// `PROTOCOL_ERROR`); the dense tables give back the slots of keys gone.
    pub(crate) fn h2_timers(&mut self) {
        let limit = self.shared.config.handshake_timeout as u32;
        let settings = self.h2_settings();
        let (mut idle, mut late, mut tired) = (Vec::new(), Vec::new(), Vec::new());
        for (k, held) in self.side.h2_mut().iter_mut() {
            // A resting connection has its one stream open and nothing passing.
            let Some(h) = held.awake_mut() else {
                continue;
            };
            h.conn.tick();
            if h.conn.open_streams() > 0 {
                h.busy_at = self.now;
            } else if self.now.saturating_sub(h.busy_at) >= limit && !h.goaway_due {
                idle.push(k);
            }
            if h.block_since
                .is_some_and(|t| self.now.saturating_sub(t) >= limit)
            {
                let mut out = Vec::new();
                let fatal = h.conn.header_block_late(&mut out);
                late.push((k, out, fatal));
            }
            h.quiet = h.quiet.saturating_add(1);
            if h.may_rest(&settings) {
                tired.push(k);
            }
        }
        for k in idle {
            self.h2_go_away(k);
        }
        self.h2_rest(&tired, &settings);
        self.side.h2_mut().compact();
        self.side.h2_streams_mut().compact();
        self.side.h2_records_mut().compact();
        for (k, out, fatal) in late {
            log::debug(format_args!("HTTP/2: {fatal}"));
            self.shared.metrics.h2_errors.fetch_add(1, Relaxed);
            self.write_to(k, &Arc::from(out), Some(self.h2_cap()));
            self.start_closing(k, None, CloseReason::HandshakeTimeout);
        }
    }
}
