//! The once-a-second sweep: token expiry (`transport::auth`), handshake deadlines, keep-alive pings and stream keep-alives, idle
//! timeouts, long-poll deadlines, closing deadlines, and GRIP holds' timers. No connection owns
//! a timer: the sweep compares each record's `last_seen` with the coarse clock.
//!
//! The sweep decides what is due; what is sent is built by the transports.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::socket::Socket;
use super::state::{Kind, State, StreamMode};
use super::Engine;
use crate::config::limits::CLOSE_LINGER_SECS;
use crate::log;
use crate::metrics::CloseReason;
use crate::worker::transport::poll::messages_body;

impl<S: Socket> Engine<S> {
    /// Once a second: handshake deadlines, keep-alive pings and lines, idle timeouts, long-poll
    /// deadlines, closing deadlines, and (on worker 0) history expiry.
    pub(crate) fn sweep(&mut self) {
        self.grip_sweep();
        self.auth_sweep();
        let cfg = &self.shared.config;
        let (handshake, ping, idle, keepalive) = (
            cfg.handshake_timeout as u32,
            cfg.ping_interval as u32,
            cfg.idle_timeout as u32,
            cfg.sse_keepalive as u32,
        );
        let mut expired: Vec<(u32, CloseReason)> = Vec::new();
        let mut to_ping: Vec<u32> = Vec::new();
        let mut to_keepalive: Vec<(u32, bool)> = Vec::new();
        for (k, conn) in self.conns.iter_mut() {
            if let Some(t) = conn.tls.as_mut() {
                t.compact();
            }
            let quiet = self.now.saturating_sub(conn.last_seen);
            match conn.state {
                State::Http if quiet >= handshake => {
                    if conn.tls.as_ref().is_some_and(|t| !t.established()) {
                        self.shared.metrics.tls_failed("timeout");
                    }
                    expired.push((k as u32, CloseReason::HandshakeTimeout));
                }
                State::Ws(_) if idle > 0 && quiet >= idle => {
                    expired.push((k as u32, CloseReason::IdleTimeout));
                }
                State::Ws(ref mut mode) if ping > 0 && quiet >= ping && !mode.pinged => {
                    mode.pinged = true;
                    to_ping.push(k as u32);
                }
                // GRIP streams send the backend's keep-alives (see `grip_sweep`), never ours.
                State::Sse(_) | State::Stream(StreamMode::Ndjson | StreamMode::Raw)
                    if keepalive > 0 && quiet >= keepalive =>
                {
                    conn.last_seen = self.now;
                    to_keepalive.push((k as u32, conn.state.kind() == Kind::Sse));
                }
                State::Closing { .. } if quiet >= CLOSE_LINGER_SECS => {
                    expired.push((k as u32, CloseReason::Disconnected));
                }
                _ => {}
            }
        }
        let due: Vec<(u32, String)> = self
            .polls
            .iter()
            .filter(|(_, h)| self.now >= h.deadline)
            .map(|(k, h)| (*k, h.cursor.clone()))
            .collect();
        for (k, cursor) in due {
            let body = messages_body(std::iter::empty(), &cursor, &[]);
            self.answer_poll(k, &Arc::from(body));
        }
        let (sse_ka, stream_ka) = (
            Arc::clone(&self.sse_keepalive),
            Arc::clone(&self.stream_keepalive),
        );
        for (k, sse) in to_keepalive {
            self.deliver(k, if sse { &sse_ka } else { &stream_ka });
        }
        for (k, reason) in expired {
            let (state, partial) = match self.conns.get(k as usize) {
                Some(c) => (c.state, c.input.is_some()),
                None => continue,
            };
            match state {
                State::Ws(_) => {
                    log::debug(format_args!("idle timeout"));
                    self.close_ws(
                        k,
                        clarion_proto::ws::CloseCode::GoingAway,
                        "idle timeout",
                        reason,
                    );
                }
                // Part of a request head arrived, but not all of it in time: say so.
                State::Http if partial => {
                    self.shared.metrics.http_errors.fetch_add(1, Relaxed);
                    log::debug(format_args!("request head timed out"));
                    let mut out = Vec::with_capacity(128);
                    let body = "request head not received in time\n";
                    clarion_proto::http1::write_response_head(
                        &mut out,
                        408,
                        &[
                            ("Content-Type", "text/plain; charset=utf-8"),
                            ("Connection", "close"),
                        ],
                        Some(body.len()),
                    );
                    out.extend_from_slice(body.as_bytes());
                    self.start_closing(k, Some(out.into()), reason);
                }
                _ => self.drop_conn(k, reason),
            }
        }
        let ping = Arc::clone(&self.ping_frame);
        for k in to_ping {
            self.deliver(k, &ping);
        }
    }
}
