//! The read path and the write path of every connection: reading into the worker's shared
//! buffer (through TLS when the connection has a session), keeping partial input, handing
//! complete bytes to the transport of the connection's state, and writing under the
//! slow-consumer cap (direct writes, flushes on writability, closing once the last bytes left).
//!
//! The one dispatch on a connection's state for incoming bytes is [`Engine::process`]; this
//! module does not interpret bytes itself.
#![deny(clippy::wildcard_enum_match_arm)]

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use slab::Slab;

use super::conn::Conn;
use super::socket::Socket;
use super::state::{Kind, State};
use super::transport::frame::{End, Framing};
use super::{tls, Engine};
use crate::config::limits::READ_BUDGET;
use crate::log;
use crate::metrics::CloseReason;

/// Writes a fan-out hands to [`Socket::write_many`] at once: the ring's submission size
/// (`uring::ENTRIES`).
const WRITE_MANY_CHUNK: usize = 256;

/// Ciphertext a fan-out gathers before it writes what it has: a few hundred small records,
/// enough to fill the ring's submissions, while the buffer stays small and warm in cache
/// (a fan-out to 15,000 secure subscribers would otherwise hold a megabyte of records).
const SEALED_BATCH: usize = 64 * 1024;

impl<S: Socket> Engine<S> {
    pub(crate) fn on_readable(&mut self, k: u32) {
        for _ in 0..READ_BUDGET {
            let Some(conn) = self.conns.get_mut(k as usize) else {
                return;
            };
            let Some(stream) = conn.stream.as_ref() else {
                return; // An HTTP/2 stream: its bytes come through its connection.
            };
            let res = stream.read(&mut self.scratch.read_buf);
            match res {
                Ok(0) => {
                    let reason = match conn.state.kind() {
                        Kind::Http | Kind::Closing | Kind::H2 => CloseReason::HttpDone,
                        Kind::Ws | Kind::Sse | Kind::Stream | Kind::Poll | Kind::Proxy => {
                            CloseReason::Disconnected
                        }
                    };
                    self.drop_conn(k, reason);
                    return;
                }
                Ok(n) => {
                    self.scratch.tally.bytes_in += n as u64;
                    match &mut conn.state {
                        State::Ws(mode) => {
                            conn.last_seen = self.now;
                            mode.pinged = false;
                        }
                        State::H2 => conn.last_seen = self.now,
                        // Other states count what they read where they parse it.
                        State::Http
                        | State::Sse(_)
                        | State::Stream(_)
                        | State::Poll(_)
                        | State::Proxy
                        | State::Closing { .. } => {}
                    }
                    if conn.tls.is_some() {
                        self.on_tls_data(k, n);
                    } else {
                        self.on_data(k, n);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::debug(format_args!("read: {e}"));
                    self.drop_conn(k, CloseReason::Disconnected);
                    return;
                }
            }
        }
        self.scratch.more_to_read.push(k);
    }

    /// Handles `n` fresh bytes in the read buffer, joined to any partial input kept from before.
    pub(crate) fn on_data(&mut self, k: u32, n: usize) {
        let mut fresh = std::mem::take(&mut self.scratch.read_buf);
        self.consume(k, fresh.get_mut(..n).unwrap_or_default());
        self.scratch.read_buf = fresh;
    }

    /// Handles `n` fresh bytes of ciphertext: decrypts them, sends what the handshake needs,
    /// and hands the plaintext to [`Self::consume`].
    pub(crate) fn on_tls_data(&mut self, k: u32, n: usize) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let Some(session) = conn.tls.as_mut() else {
            return;
        };
        let mut fresh = std::mem::take(&mut self.scratch.read_buf);
        let data = fresh.get_mut(..n).unwrap_or_default();
        // A plain HTTP request on the TLS port (a ClientHello starts with record type 22):
        // answer it in plain text, as nginx does, instead of a TLS alert nobody can read.
        if session.untouched()
            && data
                .first()
                .is_some_and(|&b| crate::tls::starts_plain_http(b))
        {
            self.scratch.read_buf = fresh;
            self.refuse_plaintext(k);
            return;
        }
        let (mut plain, mut out) = (
            std::mem::take(&mut self.scratch.plain_buf),
            std::mem::take(&mut self.scratch.handshake_buf),
        );
        let was_established = session.established();
        let res = session.read(data, &mut plain, &mut out);
        // An error in the same read as the client's Finished comes from the record layer after
        // a completed handshake: it counts as a TLS error, and the handshake as done.
        let established_now = session.established();
        self.scratch.read_buf = fresh;
        let written = if out.is_empty() {
            Ok(0)
        } else {
            conn.write_records(&out)
        };
        match (res, written) {
            (Ok(outcome), Ok(w)) => {
                self.scratch.tally.bytes_out += w as u64;
                if outcome.handshake_done {
                    self.shared.metrics.tls_handshakes.fetch_add(1, Relaxed);
                }
                if !plain.is_empty() {
                    self.consume(k, &mut plain);
                }
                if outcome.peer_closed {
                    self.drop_conn(k, CloseReason::Disconnected);
                }
            }
            (Err(e), _) => {
                log::debug(format_args!("TLS: {e}"));
                let m = &self.shared.metrics;
                if !was_established && established_now {
                    m.tls_handshakes.fetch_add(1, Relaxed);
                }
                if established_now {
                    m.tls_errors.fetch_add(1, Relaxed);
                } else {
                    m.tls_failed(tls::failure_reason(&e));
                }
                // The alert (if any) is written; the connection ends.
                self.drop_conn(k, CloseReason::Disconnected);
            }
            (Ok(_), Err(e)) => {
                log::debug(format_args!("write: {e}"));
                self.drop_conn(k, CloseReason::Disconnected);
            }
        }
        plain.clear();
        out.clear();
        self.scratch.plain_buf = plain;
        self.scratch.handshake_buf = out;
    }

    /// Answers a plain HTTP request that arrived on the TLS listener with 400, in plain text.
    pub(crate) fn refuse_plaintext(&mut self, k: u32) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        conn.tls = None;
        let m = &self.shared.metrics;
        m.tls_connections.fetch_sub(1, Relaxed);
        m.tls_failed("plaintext");
        m.http_errors.fetch_add(1, Relaxed);
        log::debug(format_args!("plain HTTP on the TLS listener"));
        let body = crate::tls::PLAINTEXT_REFUSAL;
        let mut out = Vec::with_capacity(160);
        clarion_proto::http1::write_response_head(
            &mut out,
            400,
            &[
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Connection", "close"),
            ],
            Some(body.len()),
        );
        out.extend_from_slice(body.as_bytes());
        self.start_closing(k, Some(out.into()), CloseReason::HttpDone);
    }

    /// Interprets fresh plaintext, joined to any partial input kept from before.
    pub(crate) fn consume(&mut self, k: u32, data: &mut [u8]) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        if conn.state.kind() == Kind::Closing {
            return; // Waiting for EOF: the peer's bytes no longer mean anything.
        }
        if let Some(mut input) = conn.input.take() {
            input.extend_from_slice(data);
            let used = self.process(k, &mut input);
            input.drain(..used.min(input.len()));
            if let Some(conn) = self.conns.get_mut(k as usize) {
                if !input.is_empty() && conn.state.kind() != Kind::Closing {
                    conn.input = Some(input);
                }
            }
        } else {
            let used = self.process(k, data);
            if let Some(conn) = self.conns.get_mut(k as usize) {
                if let Some(rest) = data.get(used..).filter(|r| !r.is_empty()) {
                    if conn.state.kind() != Kind::Closing {
                        // Reserve the whole frame at once when its length is known.
                        let want = clarion_proto::ws::Receiver::frame_len(rest)
                            .filter(|_| conn.state.kind() == Kind::Ws)
                            .map_or(rest.len(), |l| l as usize);
                        let mut v = Vec::with_capacity(want.max(rest.len()));
                        v.extend_from_slice(rest);
                        conn.input = Some(Box::new(v));
                    }
                }
            }
        }
    }

    /// Interprets bytes according to the connection's state; returns how many were used (the
    /// rest is an incomplete head or frame). The connection may be closed on return.
    pub(crate) fn process(&mut self, k: u32, data: &mut [u8]) -> usize {
        let mut pos = 0;
        while pos < data.len() {
            let Some(conn) = self.conns.get(k as usize) else {
                return data.len();
            };
            let rest = data.get_mut(pos..).unwrap_or_default();
            match conn.state {
                State::Http if rest.starts_with(b"PRI ") && self.h2_allowed(k) => {
                    match self.h2_preface(k, rest) {
                        Some(used) => pos += used,
                        None => return pos,
                    }
                }
                State::Http => match self.on_http(k, rest) {
                    Some(used) => pos += used,
                    None => return pos,
                },
                State::H2 => return pos + self.on_h2(k, rest),
                State::Ws(_) => return pos + self.on_frames(k, rest),
                // Waiting for a backend: a pipelined request waits its turn (bounded), and is
                // read once the answer is out and the connection is back in `Http`.
                State::Proxy => {
                    if data.len() - pos > self.shared.config.head_limits().max_head_bytes {
                        self.drop_conn(k, CloseReason::Disconnected);
                        return data.len();
                    }
                    return pos;
                }
                // A streaming or held response: the client has nothing more to say, and
                // anything it sends (pipelined requests included) is discarded.
                State::Sse(_) | State::Stream(_) | State::Poll(_) | State::Closing { .. } => {
                    return data.len()
                }
            }
        }
        pos
    }

    pub(crate) fn on_writable(&mut self, k: u32) {
        self.flush(k, None);
        self.conflate_drain(k);
        self.h2_writable(k);
    }

    /// Writes what a connection owes, then applies the closing and backlog rules.
    pub(crate) fn flush(&mut self, k: u32, cap: Option<usize>) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let written = conn.flush();
        self.wrote(k, written, cap);
    }

    /// Counts what a write put out and applies [`Self::after_write`]; a failed write means the
    /// peer is gone.
    fn wrote(&mut self, k: u32, written: io::Result<usize>, cap: Option<usize>) {
        match written {
            Ok(n) => self.scratch.tally.bytes_out += n as u64,
            Err(e) => {
                log::debug(format_args!("write: {e}"));
                self.drop_conn(k, CloseReason::Disconnected);
                return;
            }
        }
        self.after_write(k, cap);
    }

    /// After a write: a closing connection whose last bytes are out shuts its write side; an
    /// open one that owes more than `cap` bytes is a slow consumer.
    pub(crate) fn after_write(&mut self, k: u32, cap: Option<usize>) {
        self.after_write_of(k, cap, None);
    }

    /// [`Self::after_write`], for an HTTP/2 stream whose connection `parent` the caller has
    /// already looked up (it is marked for the pump without a second lookup).
    pub(crate) fn after_write_of(&mut self, k: u32, cap: Option<usize>, parent: Option<u32>) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let pending = conn.backlog_bytes();
        // An HTTP/2 stream's bytes wait for its connection's pump (no second lookup for a
        // connection of its own, on every write).
        let h2_stream = conn.stream.is_none();
        if conn.state == (State::Closing { write_shut: false }) && pending == 0 {
            conn.state = State::Closing { write_shut: true };
            conn.shutdown_write();
        } else if cap.is_some_and(|cap| pending > cap) {
            // Past the cap: a subscriber's transport ends it (a state with no subscriber
            // backlog to cap does nothing).
            let state = conn.state;
            if Framing::of_transport(state).caps_backlog() {
                conn.discard_unstarted();
                self.end_as(k, state, End::SlowConsumer { pending });
            }
        }
        match (h2_stream, parent) {
            (false, _) => {}
            (true, Some(p)) => self.scratch.h2_dirty.push(p),
            (true, None) => self.h2_stream_wrote(k),
        }
    }

    /// Sends a reply to something the client sent (handshake answer, pong, control reply,
    /// echo). Replies may exceed `max_backlog` by one largest message, so an echo of a large
    /// message is not mistaken for a slow consumer, while a client that floods requests
    /// without reading the answers is still cut off.
    pub(crate) fn send(&mut self, k: u32, data: &Arc<[u8]>) {
        let cfg = &self.shared.config;
        let cap = cfg
            .max_backlog
            .saturating_add(cfg.max_message_size)
            .saturating_add(14);
        self.write_to(k, data, Some(cap));
    }

    /// Sends a published message (or a keep-alive ping) under the slow-consumer cap.
    pub(crate) fn deliver(&mut self, k: u32, data: &Arc<[u8]>) {
        self.write_to(k, data, Some(self.shared.config.max_backlog));
    }

    pub(crate) fn write_to(&mut self, k: u32, data: &Arc<[u8]>, cap: Option<usize>) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let written = conn.send(data);
        self.wrote(k, written, cap);
    }

    /// Seals `bytes` for connection `k` (which [`Conn::seals_directly`]) into the fan-out's
    /// buffer, to be written with the rest of its submission; a connection whose session
    /// cannot seal is dropped. A full buffer is written at once.
    pub(crate) fn gather_sealed(&mut self, k: u32, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        match conn.seal_into(bytes, &mut self.fanout.sealed) {
            Ok(records) => self.fanout.pending_sealed.push((k, records)),
            Err(e) => self.wrote(k, Err(e), None),
        }
        if self.fanout.sealed.len() >= SEALED_BATCH {
            self.write_fanout();
        }
    }

    /// Writes the single-message deliveries gathered in `fanout` (subscribers with nothing
    /// waiting: clear-text frames, and TLS subscribers' records sealed for this submission) in
    /// one submission, then treats each result as [`Self::deliver`] would: a short write keeps
    /// the rest for the writable event, a failed one drops the connection.
    pub(crate) fn write_fanout(&mut self) {
        if self.fanout.pending.is_empty() && self.fanout.pending_sealed.is_empty() {
            return;
        }
        let mut sends = std::mem::take(&mut self.fanout.pending);
        let mut sealed = std::mem::take(&mut self.fanout.pending_sealed);
        let mut arena = std::mem::take(&mut self.fanout.sealed);
        let mut results = std::mem::take(&mut self.fanout.results);
        results.clear();
        // Every gathered key is a live connection with its socket: nothing between gathering
        // and here closes one (kept as a check, so that items and results stay in step).
        let open = |conns: &Slab<Conn<S>>, k: u32| {
            conns.get(k as usize).is_some_and(|c| c.stream.is_some())
        };
        sends.retain(|(k, _)| open(&self.conns, *k));
        sealed.retain(|(k, _)| open(&self.conns, *k));
        {
            // Handed to the ring a submission's worth at a time: the list of what to write stays
            // small (a fan-out to 15,000 would otherwise build and free 360 KB each time).
            let stream = |k: u32| self.conns.get(k as usize)?.stream.as_ref();
            let mut all = sends
                .iter()
                .filter_map(|(k, data)| Some((stream(*k)?, &data[..])))
                .chain(
                    sealed
                        .iter()
                        .filter_map(|(k, r)| Some((stream(*k)?, arena.get(r.clone())?))),
                );
            let total = sends.len() + sealed.len();
            let mut items: Vec<(&S, &[u8])> = Vec::with_capacity(total.min(WRITE_MANY_CHUNK));
            loop {
                items.clear();
                items.extend(all.by_ref().take(WRITE_MANY_CHUNK));
                if items.is_empty() {
                    break;
                }
                S::write_many(&mut self.fanout.batch, &items, &mut results);
            }
        }
        let max_backlog = self.shared.config.max_backlog;
        // What `deliver` would cap; an HTTP/2 connection's own bytes are bounded by its pump.
        let cap = |conn: &Conn<S>| match conn.state {
            State::H2 => None,
            State::Http
            | State::Ws(_)
            | State::Sse(_)
            | State::Stream(_)
            | State::Poll(_)
            | State::Proxy
            | State::Closing { .. } => Some(max_backlog),
        };
        let mut results_in_order = results.drain(..);
        for ((k, data), result) in sends.drain(..).zip(results_in_order.by_ref()) {
            let Some(conn) = self.conns.get_mut(k as usize) else {
                continue;
            };
            let cap = cap(conn);
            let written = match result {
                Ok(n) => Ok(conn.keep_unsent(&data, n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(conn.keep_unsent(&data, 0)),
                Err(e) => Err(e),
            };
            self.wrote(k, written, cap);
        }
        for ((k, range), result) in sealed.drain(..).zip(results_in_order) {
            let Some(conn) = self.conns.get_mut(k as usize) else {
                continue;
            };
            let cap = cap(conn);
            let records = arena.get(range).unwrap_or_default();
            let written = match result {
                // All out (the usual case): nothing to keep, the session is not touched again.
                Ok(n) if n >= records.len() => Ok(n),
                Ok(n) => Ok(conn.keep_unsent_records(records, n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    Ok(conn.keep_unsent_records(records, 0))
                }
                Err(e) => Err(e),
            };
            self.wrote(k, written, cap);
        }
        arena.clear();
        self.fanout.pending = sends;
        self.fanout.pending_sealed = sealed;
        self.fanout.sealed = arena;
        self.fanout.results = results;
    }

    /// Delivers several frames to one subscriber, coalesced into as few writes as possible.
    pub(crate) fn deliver_all(&mut self, k: u32, frames: &[&Arc<[u8]>]) {
        self.write_all_to(k, frames, Some(self.shared.config.max_backlog));
    }

    /// Writes several buffers with as few system calls as possible, then applies `cap`.
    pub(crate) fn write_all_to(&mut self, k: u32, frames: &[&Arc<[u8]>], cap: Option<usize>) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let written = conn.send_all(frames);
        self.wrote(k, written, cap);
    }
}
