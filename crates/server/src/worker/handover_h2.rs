//! HTTP/2 connections in a hand-over (`super::handover`): a connection moves with its protocol
//! state (parked by [`clarion_proto::h2::server::park`]) and with the records of its streams,
//! each carried as an HTTP/1.1 connection's record would be (its transport, topics, held
//! poll, unframed answer bytes, auth/hooks/presence state), and re-linked to the connection
//! in the new process.
//!
//! A stream that cannot move (its request still arriving, its answer being finished, a hook
//! call or a GRIP backend waiting, a live compression context...) is refused with
//! `RST_STREAM(REFUSED_STREAM)` just before its connection is parked: the client retries it
//! (RFC 9113 §8.7), on the same connection, which the new process serves. It is counted under
//! its reason in `clarion_handover_connections{outcome="fallback"}`.
#![deny(clippy::wildcard_enum_match_arm)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::h2::frame::ErrorCode;
use clarion_proto::h2::server::Connection;
use clarion_proto::ws::deflate::{Compressor, Inflater};

use super::conn::Conn;
use super::h2::H2;
use super::handover::{Fallback, H2Part, H2Stream};
use super::pool::Pooled;
use super::side::Taken;
use super::state::State;
use super::transport::poll::PollHold;
use super::Engine;
use crate::hub::lock;
use crate::log;
use crate::metrics::CloseReason;

impl Engine<mio::net::TcpStream> {
    /// Why stream record `child` cannot move with its connection, or `None` if it can.
    fn stream_cannot_move(&self, child: u32, c: &Conn) -> Option<Fallback> {
        match c.state {
            // A request being received or answered: its head was consumed here.
            State::Http | State::Closing { .. } => return Some(Fallback::RequestInFlight),
            State::Ws(_)
            | State::Sse(_)
            | State::Stream(_)
            | State::Poll(_)
            | State::Proxy
            | State::H2 => {}
        }
        self.cannot_move(child, c)
    }

    /// The old process's side for HTTP/2 connection `k`, about to be lifted: refuses the
    /// streams that cannot move, lifts the others out of the slab (released as a connection
    /// is: quietly), and parks the protocol state. `None` if `k` has no HTTP/2 state.
    pub(super) fn lift_h2(
        &mut self,
        k: u32,
        listening: &mut HashMap<u32, Vec<(Arc<str>, u64)>>,
        lifted: &mut HashSet<u32>,
    ) -> Option<H2Part> {
        let mut h = self.h2_take(k)?;
        let mut children = self.h2_children(k, &h);
        children.sort_unstable_by_key(|&(_, id)| id);
        let mut refusals = Vec::new();
        let mut streams = Vec::with_capacity(children.len());
        for (child, id) in children {
            let why = match self.conns.get(child as usize) {
                Some(c) => self.stream_cannot_move(child, c),
                None => Some(Fallback::Closing),
            };
            self.h2_unlink(child);
            if let Some(why) = why {
                self.shared.handover.fallbacks.add(why);
                log::debug(format_args!(
                    "hand-over: HTTP/2 stream {id} refused ({})",
                    why.label()
                ));
                h.conn.cancel(id, ErrorCode::RefusedStream, &mut refusals);
                // Its record ends here, as a connection's would (the stream is gone already).
                self.drop_conn(child, CloseReason::Shutdown);
                continue;
            }
            if self.conns.get(child as usize).is_none() {
                continue;
            }
            let (topics, poll) = self.followed(child);
            // Between messages (a fragmented one was refused). Before the release.
            let deflate = self.take_windows(child);
            let grip = self.take_grip(child);
            let mode = self.release(child, listening.remove(&child).unwrap_or_default());
            lifted.insert(child);
            let Some(mut c) = self.conns.try_remove(child as usize) else {
                continue;
            };
            self.account(c.state, None, c.peer);
            streams.push(H2Stream {
                id,
                state: c.state,
                poll,
                idle: self.now.saturating_sub(c.last_seen),
                input: c.input.take().map(|b| *b).unwrap_or_default(),
                output: c.take_unsent(),
                topics,
                resume: None,
                mode,
                deflate,
                grip,
            });
        }
        if !refusals.is_empty() {
            // Queued on the connection: they leave with its owed output, before anything else
            // the new process writes.
            if let Some(c) = self.conns.get_mut(k as usize) {
                c.queue(&Arc::from(refusals));
            }
        }
        let H2 {
            conn,
            // A GOAWAY due (idle, shutdown) and the idle and header-block clocks start again
            // in the new process (a header block still pending gets its full time there).
            goaway_due: _,
            quiet: _,
            busy_at: _,
            block_since: _,
        } = h.into_inner();
        let mut connection = Vec::with_capacity(256);
        conn.park(&mut connection);
        Some(H2Part {
            connection,
            streams,
        })
    }

    /// The new process's side for HTTP/2 connection `k`, just put in the slab with its socket:
    /// puts each carried stream back as a record of its own, counted as an admitted stream,
    /// bound to its stream in `conn`, subscribed again, with its unframed answer bytes queued
    /// for the pump. A stream that was bound but did not come is reset (`CANCEL`).
    pub(super) fn adopt_h2(
        &mut self,
        k: u32,
        mut conn: Connection,
        streams: Vec<H2Stream>,
        peer: u32,
    ) {
        let mut keys = HashMap::with_capacity(streams.len());
        let mut resumes = Vec::with_capacity(streams.len());
        for s in streams {
            let ext = s.state.ws().and_then(|m| m.deflate);
            let inflater = match (s.deflate.inflater.as_deref(), ext) {
                (Some(w), Some(ext)) => match Inflater::resume(ext.client_window_bits(), w) {
                    Some(i) => Some(i),
                    None => {
                        // Left out: the restored connection resets the stream.
                        log::warn(format_args!(
                            "hand-over: an HTTP/2 WebSocket's inflate window was refused"
                        ));
                        continue;
                    }
                },
                (Some(_) | None, None) | (None, Some(_)) => None,
            };
            let mut c = Conn::stream_of_h2(s.state, self.now.saturating_sub(s.idle), peer);
            if !s.input.is_empty() {
                c.input = Some(Box::new(s.input));
            }
            if !s.output.is_empty() {
                c.queue(&Arc::from(s.output));
            }
            let child = self.conns.insert(c) as u32;
            self.restore_grip(child, s.grip);
            let mut taken = Taken {
                inflater,
                ..Taken::default()
            };
            if let (Some(w), Some(ext)) = (s.deflate.deflater.as_deref(), ext) {
                // As for a connection of its own: past this worker's share of dedicated
                // compressors the stream gets the shared frames.
                if self.may_dedicate(child) {
                    let bits = self.dedicated_window_bits(ext);
                    let level = self.frames.deflate_settings.level;
                    taken.deflater = Some(Compressor::resume(level, bits, 8, w));
                }
            }
            let sh = &self.shared;
            sh.open.fetch_add(1, Relaxed);
            sh.admitted.fetch_add(1, Relaxed);
            if sh.config.max_connections_per_address > 0 {
                *lock(&sh.per_address).entry(peer).or_insert(0) += 1;
            }
            self.account(State::Closing { write_shut: false }, Some(s.state), peer);
            self.h2_link(child, k, s.id);
            taken.poll = s.poll.map(|(left, cursor)| PollHold {
                deadline: self.now.saturating_add(left),
                cursor,
                presence: false,
            });
            self.side.restore(child, taken);
            keys.insert(s.id, child);
            let topics: Vec<String> = s.topics.iter().map(|t| t.to_string()).collect();
            resumes.push((child, topics, s.resume, s.mode));
        }
        let mut out = Vec::new();
        conn.rebind(|id| keys.get(&id).copied(), &mut out);
        let block_since = conn.pending_header_block().then_some(self.now);
        let mut h = H2::new(conn, self.now);
        h.block_since = block_since;
        self.h2_put(k, Pooled::new(h));
        for (child, topics, resume, mode) in resumes {
            self.resume(child, &topics, resume.as_deref(), mode.as_ref());
        }
        if !out.is_empty() {
            log::warn(format_args!(
                "hand-over: an HTTP/2 stream arrived without its record and was reset"
            ));
            self.write_to(k, &Arc::from(out), None);
        }
        self.scratch.h2_dirty.push(k);
    }
}
