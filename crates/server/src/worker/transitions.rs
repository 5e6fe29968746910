//! The transitions between states: every move goes through here, so the
//! `clarion_connections{state}` gauges, the per-address counts and the open-connection count
//! stay exact. This module owns no I/O beyond queueing a connection's last bytes when it
//! starts closing.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::socket::Socket;
use super::state::{gauge, Exit, Kind, State};
use super::Engine;
use crate::hub::lock;
use crate::metrics::CloseReason;

impl<S: Socket> Engine<S> {
    /// Moves connection `k` to state `to` and keeps the counts exact: the
    /// `clarion_connections{state}` gauges, `grip_holds`, and, when it enters `Closing`, the
    /// per-address count and the open-connection count. Every state change goes through here
    /// (or through [`Self::drop_conn`] for a record that leaves the slab). Returns the state it
    /// left, or `None` if the connection is gone.
    pub(crate) fn set_state(&mut self, k: u32, to: State) -> Option<State> {
        let conn = self.conns.get_mut(k as usize)?;
        let from = conn.state;
        conn.state = to;
        let peer = conn.peer;
        self.account(from, Some(to), peer);
        Some(from)
    }

    /// The counts for a connection from `peer` moving from `from` to `to` (`None`: it is gone
    /// without passing through `Closing`).
    pub(crate) fn account(&self, from: State, to: Option<State>, peer: u32) {
        let m = &self.shared.metrics;
        let (fk, tk) = (from.kind(), to.map_or(Kind::Closing, State::kind));
        if fk != tk {
            if let Some(g) = gauge(m, fk) {
                g.fetch_sub(1, Relaxed);
            }
            if let Some(g) = gauge(m, tk) {
                g.fetch_add(1, Relaxed);
            }
        }
        let (fg, tg) = (from.grip_held(), to.is_some_and(State::grip_held));
        if fg && !tg {
            m.grip_holds.fetch_sub(1, Relaxed);
        } else if tg && !fg {
            m.grip_holds.fetch_add(1, Relaxed);
        }
        if fk != Kind::Closing && tk == Kind::Closing {
            self.shared.open.fetch_sub(1, Relaxed);
            if self.shared.config.max_connections_per_address > 0 {
                let mut counts = lock(&self.shared.per_address);
                if let Some(n) = counts.get_mut(&peer) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        counts.remove(&peer);
                    }
                }
            }
        }
    }

    /// Enters `Closing` after queueing `last` (a Close frame or a final HTTP answer): the
    /// connection leaves every topic now, and is dropped once the peer has read and closed.
    pub(crate) fn start_closing(&mut self, k: u32, last: Option<Arc<[u8]>>, reason: CloseReason) {
        self.hook_gone(k, reason);
        self.leave_all_topics(k);
        self.forget_side_state(k, Exit::Closing);
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        if conn.state.kind() == Kind::Closing {
            return;
        }
        conn.last_seen = self.now;
        conn.input = None;
        conn.rx = Default::default();
        self.set_state(k, State::Closing { write_shut: false });
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
        self.hook_gone(k, reason);
        self.leave_all_topics(k);
        self.forget_side_state(k, Exit::Gone);
        let Some(conn) = self.conns.try_remove(k as usize) else {
            return;
        };
        if conn.tls.is_some() {
            self.shared.metrics.tls_connections.fetch_sub(1, Relaxed);
        }
        if conn.state.kind() != Kind::Closing {
            self.account(conn.state, None, conn.peer);
            self.shared.metrics.closed(reason);
        }
        // Dropping the stream closes the descriptor, which also removes it from epoll.
    }
}
