//! Admission: a connection the shell accepted becomes a record in the slab, or is refused at
//! once when a limit is reached (capacity, handshakes in progress, per-address), with the
//! refusal written before the request is parsed: only what has already arrived is looked at,
//! to answer an `EventSource` in a way it retries.
//!
//! The listener itself belongs to the shell in [`super`].
#![deny(clippy::wildcard_enum_match_arm)]

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::conn::Conn;
use super::socket::Socket;
use super::state::State;
use super::transport::stream::{asks_for_event_stream, sse_unavailable_answer};
use super::{tls, Engine};
use crate::hub::lock;
use crate::log;

impl<S: Socket> Engine<S> {
    /// Takes a new connection, or refuses it at once when a limit is reached: the refusal is
    /// written immediately (a `503`/`429`, or for a request already seen to ask for an event
    /// stream the `200` answer that makes an `EventSource` retry; the request is not waited
    /// for) and the connection closes like any other,
    /// so a flood costs a slab entry for at most `CLOSE_LINGER_SECS`.
    ///
    /// `register` makes the socket known to the shell's poller under the given slab key.
    pub fn handle_accept(
        &mut self,
        mut stream: S,
        peer: u32,
        tls: bool,
        now: u32,
        register: impl FnOnce(&mut S, usize) -> io::Result<()>,
    ) {
        self.now = now;
        let refusal = self.admit(peer);
        let session = match (tls, &self.shared.tls) {
            (false, _) => None,
            (true, Some(t)) if refusal.is_none() => match tls::Session::new(t.config()) {
                Ok(s) => Some(super::pool::Pooled::new(s)),
                Err(e) => {
                    log::warn(format_args!("TLS session: {e}"));
                    self.account(State::Http, None, peer);
                    return;
                }
            },
            // Refused before TLS begins: there is no channel to say why, so just close.
            (true, _) => return,
        };
        let entry = self.conns.vacant_entry();
        let k = entry.key() as u32;
        let registered = register(&mut stream, entry.key());
        if let Err(e) = registered {
            log::warn(format_args!("register: {e}"));
            if refusal.is_none() {
                self.account(State::Http, None, peer);
            }
            return;
        }
        match refusal {
            None => {
                let mut conn = Conn::new(stream, State::Http, self.now, peer);
                if session.is_some() {
                    self.shared.metrics.tls_connections.fetch_add(1, Relaxed);
                }
                conn.tls = session;
                entry.insert(conn);
            }
            Some((status, why)) => {
                // Whatever of the request has already arrived (often all of it: under load a
                // connection waits in the accept queue) tells an EventSource apart, which gives
                // up for good on a 503 but retries a 200 stream that says when to come back.
                let mut first = [0u8; 1024];
                let sse = matches!(stream.read(&mut first), Ok(n) if n > 0
                    && asks_for_event_stream(first.get(..n).unwrap_or_default()));
                entry.insert(Conn::new(
                    stream,
                    State::Closing { write_shut: false },
                    self.now,
                    peer,
                ));
                log::debug(format_args!("refused at accept: {why}"));
                if sse {
                    let answer = sse_unavailable_answer(&self.shared.config.cors_allow_origin, why);
                    self.write_to(k, &Arc::from(answer), None);
                    return;
                }
                let mut out = Vec::with_capacity(160);
                let headers = [
                    ("Retry-After", "5"),
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("Connection", "close"),
                ];
                clarion_proto::http1::write_response_head(
                    &mut out,
                    status,
                    &headers,
                    Some(why.len() + 1),
                );
                out.extend_from_slice(why.as_bytes());
                out.push(b'\n');
                self.write_to(k, &Arc::from(out), None);
            }
        }
    }

    /// Counts a new connection against the limits; `Some((status, reason))` refuses it.
    pub(crate) fn admit(&self, peer: u32) -> Option<(u16, &'static str)> {
        let (shared, m) = (&self.shared, &self.shared.metrics);
        if shared.open.fetch_add(1, Relaxed) >= shared.cap {
            shared.open.fetch_sub(1, Relaxed);
            m.refused_capacity.fetch_add(1, Relaxed);
            return Some((503, "server at its connection limit"));
        }
        let handshakes = shared.config.max_handshakes;
        if handshakes > 0 && m.http_connections.load(Relaxed) >= handshakes as u64 {
            shared.open.fetch_sub(1, Relaxed);
            m.refused_handshakes.fetch_add(1, Relaxed);
            return Some((503, "too many connections still sending their request"));
        }
        let per_address = shared.config.max_connections_per_address;
        if per_address > 0 {
            let mut counts = lock(&shared.per_address);
            let n = counts.entry(peer).or_insert(0);
            if *n as usize >= per_address {
                drop(counts);
                shared.open.fetch_sub(1, Relaxed);
                m.refused_address.fetch_add(1, Relaxed);
                return Some((429, "too many connections from your address"));
            }
            *n += 1;
        }
        m.http_connections.fetch_add(1, Relaxed);
        shared.admitted.fetch_add(1, Relaxed);
        None
    }
}
