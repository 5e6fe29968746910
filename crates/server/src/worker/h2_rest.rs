//! HTTP/2 connections at rest: an idle connection's protocol state in its 64-byte resting
//! form ([`Dormant`]) instead of its 144-byte pool slot.
//!
//! Most of a push server's HTTP/2 connections hold one stream (a browser's EventSource or
//! RFC 8441 WebSocket) and hear nothing for seconds at a time. The once-a-second sweep puts
//! such a connection to rest when nothing used its state for [`REST_AFTER`] sweeps: one stream
//! open, nothing in passing, no GOAWAY due, the worker's own settings ([`Connection::doze`]
//! says which states qualify). The first use wakes it: a frame from the client, a message for its
//! stream, its socket's writable event, its end, a hand-over. Every such use goes through
//! [`Engine::h2_state`] or [`Engine::h2_take`], so no caller sees the resting form.
//!
//! A woken connection is the connection that rested, field for field (the proto crate's tests
//! and the `h2_server` fuzzer compare their hand-over bytes); what the engine kept beside it
//! starts again as a busy connection's: its idle clock at now, no header block pending (one
//! would have kept it awake), no GOAWAY due (likewise).
//!
//! [`Connection::doze`]: clarion_proto::h2::server::Connection::doze
#![deny(clippy::wildcard_enum_match_arm)]

use std::alloc::Layout;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use clarion_proto::h2::server::{Dormant, Settings};

use super::h2::H2;
use super::pool::{Either, InPool, Pooled, Slots, Which};
use super::socket::Socket;
use super::Engine;

/// An HTTP/2 connection's protocol state, awake or at rest, in one pointer (the table of
/// them has a slot for every slab key).
pub(crate) struct Held(Either<H2, Dormant>);

impl Held {
    pub(crate) fn awake(h: Pooled<H2>) -> Held {
        Held(Either::a(h))
    }

    fn resting(d: Pooled<Dormant>) -> Held {
        Held(Either::b(d))
    }

    /// The state, if it is awake.
    pub(crate) fn awake_mut(&mut self) -> Option<&mut H2> {
        match self.0.get_mut() {
            Which::A(h) => Some(h),
            Which::B(_) => None,
        }
    }

    pub(crate) fn is_resting(&self) -> bool {
        match self.0.get() {
            Which::A(_) => false,
            Which::B(_) => true,
        }
    }

    /// The handle bound to `stream`, while it is open.
    #[cfg(test)]
    pub(crate) fn user_of(&self, stream: u32) -> Option<u32> {
        match self.0.get() {
            Which::A(h) => h.conn.user_of(stream),
            Which::B(d) => d.user().filter(|_| d.stream() == stream),
        }
    }

    /// Whether `stream` is open.
    #[cfg(test)]
    pub(crate) fn is_open(&self, stream: u32) -> bool {
        match self.0.get() {
            Which::A(h) => h.conn.is_open(stream),
            Which::B(d) => d.stream() == stream,
        }
    }
}

/// Sweeps (seconds) a connection's state goes unused before it rests: long enough that a
/// ticker of a message every few seconds (prices, scores, the 2-second ticker of the
/// benchmarks) never makes a connection rest and wake per message, which cost 10–20 % more
/// CPU per delivery when it rested after one quiet sweep; short enough that a connection
/// that hears only the SSE keep-alive (every 20 s) rests three quarters of the time.
pub(crate) const REST_AFTER: u8 = 5;

/// The pool every worker's resting HTTP/2 connections share (see [`super::pool`]).
static RESTING: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Dormant>()));

impl InPool for Dormant {
    fn slots() -> &'static Mutex<Slots> {
        &RESTING
    }
}

impl<S: Socket> Engine<S> {
    /// What this worker's HTTP/2 connections advertise and enforce.
    pub(crate) fn h2_settings(&self) -> Settings {
        let cfg = &self.shared.config;
        Settings {
            max_streams: self.h2_max_streams() as u32,
            max_header_list: cfg.max_head_size.min(u32::MAX as usize) as u32,
            header_table: cfg.h2_header_table,
            ..Settings::default()
        }
    }

    /// Connection `k`'s protocol state, woken if it rested, marked as used.
    pub(crate) fn h2_state(&mut self, k: u32) -> Option<&mut H2> {
        if self.side.h2().get(&k)?.is_resting() {
            let h = self.h2_take(k)?;
            self.h2_put(k, h);
        }
        let h = self.side.h2_mut().get_mut(&k)?.awake_mut()?; // Woken just above.
        h.quiet = 0;
        Some(h)
    }

    /// Connection `k`'s protocol state, out of its table (woken if it rested, marked as
    /// used): put it back with [`Self::h2_put`].
    pub(crate) fn h2_take(&mut self, k: u32) -> Option<Pooled<H2>> {
        let mut h = match self.side.h2_mut().remove(&k)?.0.into_inner() {
            Which::A(h) => h,
            Which::B(d) => {
                self.shared.metrics.h2_resting.fetch_sub(1, Relaxed);
                let conn = d.into_inner().wake(self.h2_settings());
                Pooled::new(H2::new(conn, self.now))
            }
        };
        h.quiet = 0;
        Some(h)
    }

    /// Puts connection `k`'s protocol state (back) in its table.
    pub(crate) fn h2_put(&mut self, k: u32, h: Pooled<H2>) {
        self.side.h2_mut().insert(k, Held::awake(h));
    }

    /// The sweep's part: puts to rest the connections `tired` it found may rest
    /// ([`H2::may_rest`]), after its `tick` gave back what passed.
    pub(crate) fn h2_rest(&mut self, tired: &[u32], settings: &Settings) {
        for &k in tired {
            let Some(Which::A(h)) = self
                .side
                .h2_mut()
                .remove(&k)
                .map(|held| held.0.into_inner())
            else {
                continue;
            };
            let held = match h.into_inner().conn.doze(settings) {
                Ok(d) => {
                    self.shared.metrics.h2_resting.fetch_add(1, Relaxed);
                    Held::resting(Pooled::new(d))
                }
                // Not reached: `may_rest` asked the same of the same state.
                Err(conn) => Held::awake(Pooled::new(H2::new(conn, self.now))),
            };
            self.side.h2_mut().insert(k, held);
        }
    }
}

impl H2 {
    /// Whether the sweep may put this connection to rest: unused for [`REST_AFTER`] sweeps,
    /// nothing due or pending beside the protocol state, and a state that may doze.
    pub(crate) fn may_rest(&self, settings: &Settings) -> bool {
        self.quiet >= REST_AFTER
            && !self.goaway_due
            && self.block_since.is_none()
            && self.conn.can_doze(settings)
    }
}
