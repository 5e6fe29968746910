//! Where a connection is in its life, the flags that qualify that, and the transitions that
//! change it: every move between states goes through here, so the `clarion_connections{state}`
//! gauges, the per-address counts and the open-connection count stay exact.
//!
//! This module owns no I/O beyond queueing a connection's last bytes when it starts closing;
//! what a transport sends in each state is decided by that transport.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::Engine;
use crate::hub::lock;
use crate::metrics::{CloseReason, Metrics};

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Reading HTTP request heads (before an upgrade, or between keep-alive requests).
    Http,
    /// An open WebSocket.
    Ws,
    /// A Server-Sent Events response being streamed.
    Sse,
    /// A chunked newline-delimited response being streamed (`/stream`).
    Stream,
    /// A long-poll request held until a message arrives or its deadline passes.
    Poll,
    /// A request forwarded to a GRIP backend, waiting for its answer; the client's further
    /// bytes (a pipelined request) wait in `input`.
    Proxy,
    /// Our last bytes (a Close frame or a final HTTP answer) are queued; once they are written
    /// the write side is shut and we wait (bounded) for the peer's EOF, discarding its input, so
    /// that closing never resets a connection before the peer has read our answer.
    Closing,
}

/// Deliveries use the `clarion.v1` envelope instead of the raw payload.
pub const ENVELOPE: u16 = 1;
/// The WebSocket echoes messages (conformance endpoint) instead of doing pub/sub.
pub const ECHO: u16 = 2;
/// A ping was sent and no byte has arrived since.
pub const PINGED: u16 = 4;
/// The write side has been shut down (Closing only).
pub const WRITE_SHUT: u16 = 8;
/// SSE events carry the JSON envelope as data (`format=json`) instead of the payload.
pub const JSON: u16 = 16;
/// Stream lines carry the raw payload (`format=raw`) instead of the JSON envelope.
pub const RAW: u16 = 32;
/// The held long-poll's client allows keep-alive: the connection returns to `Http` after the
/// answer.
pub const KEEP: u16 = 64;
/// permessage-deflate was negotiated (WebSocket); its parameters are in [`Conn::ext`].
pub const DEFLATE: u16 = 128;
/// Held by a GRIP backend (stream, response or WebSocket-over-HTTP): deliveries use the
/// message's GRIP content, state beyond this record is in the worker's GRIP table.
pub const GRIP: u16 = 256;
/// A GRIP stream answers in chunked transfer coding (the client speaks HTTP/1.1); otherwise the
/// stream is delimited by closing the connection.
pub const CHUNKED: u16 = 512;

/// The `clarion_connections` gauge that counts connections in `state` (none for `Closing`,
/// which has left the count already).
pub(crate) fn gauge(m: &Metrics, state: State) -> Option<&AtomicU64> {
    match state {
        State::Http | State::Proxy => Some(&m.http_connections),
        State::Ws => Some(&m.ws_connections),
        State::Sse => Some(&m.sse_connections),
        State::Stream => Some(&m.stream_connections),
        State::Poll => Some(&m.polls_held),
        State::Closing => None,
    }
}

impl Engine {
    /// Enters `Closing` after queueing `last` (a Close frame or a final HTTP answer): the
    /// connection leaves every topic now, and is dropped once the peer has read and closed.
    pub(crate) fn start_closing(&mut self, k: u32, last: Option<Arc<[u8]>>, reason: CloseReason) {
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
    pub(crate) fn close_ws(
        &mut self,
        k: u32,
        code: clarion_proto::ws::CloseCode,
        why: &str,
        reason: CloseReason,
    ) {
        let frame = clarion_proto::ws::close::encode_close_frame(code, why);
        self.start_closing(k, Some(frame.into()), reason);
    }

    /// Removes a connection at once (EOF, reset, or end of closing).
    pub(crate) fn drop_conn(&mut self, k: u32, reason: CloseReason) {
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
    pub(crate) fn note_gone(&self, state: State, peer: u32) {
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
}
