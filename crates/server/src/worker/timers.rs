//! The once-a-second sweep, the one place timers run: each connection's state says what is due
//! to it ([`State::due`]: handshake deadlines, keep-alive pings and stream keep-alives, idle
//! timeouts, closing deadlines), and the side parts with deadlines of their own are swept from
//! here in a fixed order: GRIP holds (`grip::hold`), tokens (`transport::auth`), held
//! long-polls, HTTP/2 connections (`h2`). No connection owns a timer: the sweep compares each record's
//! `last_seen` with the coarse clock.
//!
//! The sweep decides what is due; what is sent is built by the transports.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::Arc;

use super::socket::Socket;
use super::state::{Due, Limits, State};
use super::Engine;
use crate::metrics::CloseReason;
use crate::worker::transport::frame::{End, Framing};
use crate::worker::transport::poll::messages_body;

impl<S: Socket> Engine<S> {
    /// Once a second: GRIP holds' and tokens' deadlines, what each connection's state owes it,
    /// held long-polls' deadlines, then HTTP/2 connections' (this order is the one the sweep
    /// always had).
    pub(crate) fn sweep(&mut self) {
        self.grip_timers();
        self.auth_timers();
        let limits = Limits::of(&self.shared.config);
        let mut expired: Vec<(u32, CloseReason)> = Vec::new();
        let mut to_ping: Vec<u32> = Vec::new();
        let mut to_keepalive: Vec<u32> = Vec::new();
        for (k, conn) in self.conns.iter_mut() {
            if let Some(t) = conn.tls.as_mut() {
                t.compact();
            }
            let quiet = self.now.saturating_sub(conn.last_seen);
            match conn.state.due(quiet, &limits) {
                None => {}
                Some(Due::Expire(reason)) => {
                    if conn.state == State::Http
                        && conn.tls.as_ref().is_some_and(|t| !t.established())
                    {
                        self.shared.metrics.tls_failed("timeout");
                    }
                    expired.push((k as u32, reason));
                }
                Some(Due::Ping) => {
                    if let State::Ws(ref mut mode) = conn.state {
                        mode.pinged = true;
                    }
                    to_ping.push(k as u32);
                }
                Some(Due::KeepAlive) => {
                    conn.last_seen = self.now;
                    to_keepalive.push(k as u32);
                }
            }
        }
        let due: Vec<(u32, String)> = self
            .side
            .polls()
            .iter()
            .filter(|(_, h)| self.now >= h.deadline)
            .map(|(k, h)| (*k, h.cursor.clone()))
            .collect();
        for (k, cursor) in due {
            let body = messages_body(std::iter::empty(), &cursor, &[]);
            self.answer_poll(k, &Arc::from(body));
        }
        for k in to_keepalive {
            let framing = self.framing_of_transport(k);
            if let Some(ka) = framing.keep_alive(&self.frames).cloned() {
                self.deliver(k, &ka);
            }
        }
        for (k, reason) in expired {
            self.expire(k, reason);
        }
        let ping = Arc::clone(&self.frames.ping_frame);
        for k in to_ping {
            // The one transport whose keep-alive ping is a message of its protocol.
            if let Framing::Pusher(_) = self.framing(k) {
                self.pusher_ping(k);
            } else {
                self.deliver(k, &ping);
            }
        }
        self.h2_timers();
    }

    /// Ends connection `k`, whose state's deadline passed, the way its state says goodbye.
    fn expire(&mut self, k: u32, reason: CloseReason) {
        let (state, partial) = match self.conns.get(k as usize) {
            Some(c) => (c.state, c.input.is_some()),
            None => return,
        };
        self.end_as(k, state, End::Timeout { reason, partial });
    }
}
