//! GRIP holds: connections a backend answered with `Grip-Hold`. A held stream receives the
//! `http-stream` content published to its channels and the backend's `Grip-Keep-Alive` data
//! when quiet; a held response (long-poll) is answered by the first `http-response` published
//! to its channels, or with the backend's own answer at `Grip-Timeout`. Bridged WebSockets
//! receive `ws-message` content here too.
//!
//! Held connections are ordinary records in a GRIP state (`StreamMode::Grip`,
//! `PollMode { grip: true }`, `WsRole::Bridge`); they enter and leave through
//! [`Engine::enter_hold`] and [`Engine::leave_hold`]. This module does not talk to the backend.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::grip::headers::KeepAliveMode;
use clarion_proto::grip::{self as proto, Event as WsEvent};
use clarion_proto::http1;
use clarion_proto::ws::CloseCode;

use super::conn::{bridge, event_request, Answered, GripConn, KeepAlive, Phase, ResponseHold};

use crate::broker::Since;
use crate::grip::backend::Failure;
use crate::grip::{response_bytes, GripContent, StreamPart, WsPart};
use crate::message::Published;
use crate::metrics::CloseReason;
use crate::worker::socket::Socket;
use crate::worker::state::{Kind, PollMode, State, StreamMode};
use crate::worker::Engine;

impl<S: Socket> Engine<S> {
    /// Starts a `Grip-Hold: stream`: the answer's head and body go out (chunked for HTTP/1.1
    /// clients, close-delimited for HTTP/1.0), then the connection receives the `http-stream`
    /// content of its channels and the backend's keep-alive when quiet.
    pub(crate) fn hold_stream(&mut self, k: u32, a: &Answered<'_>, instruct: &proto::Instruct) {
        let mut hdrs: Vec<(&str, &str)> = a.passed.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let chunked = a.version != http1::Version::Http10;
        if chunked {
            hdrs.push(("Transfer-Encoding", "chunked"));
        }
        if !chunked {
            hdrs.push(("Connection", "close"));
        }
        let mut out = Vec::with_capacity(256 + a.body.len());
        http1::write_status_head(&mut out, a.version, a.status, Some(a.reason), &hdrs, None);
        if !a.body.is_empty() {
            if chunked {
                http1::write_chunk(&mut out, a.body);
            } else {
                out.extend_from_slice(a.body);
            }
        }
        let keep_alive = instruct.keep_alive.as_ref().map(|ka| {
            let data: Arc<[u8]> = if chunked {
                let mut c = Vec::new();
                http1::write_chunk(&mut c, &ka.data);
                c.into()
            } else {
                ka.data.clone().into()
            };
            Box::new(KeepAlive {
                data,
                every: ka.timeout_secs.max(1),
                interval: ka.mode == KeepAliveMode::Interval,
                last: self.now,
            })
        });
        let state = State::Stream(StreamMode::Grip {
            chunked,
            keep: chunked && a.keep,
        });
        let entry = keep_alive.map(|ka| GripConn {
            ticket: a.ticket,
            route: a.route,
            phase: Phase::Stream(ka),
        });
        if !self.enter_hold(k, state, entry) {
            return;
        }
        let replay = self.subscribe_channels(k, &instruct.channels);
        self.write_all_to(k, &[&Arc::from(out)], None);
        if !replay.is_empty() {
            self.deliver_grip(k, &replay);
        }
    }

    /// Starts a `Grip-Hold: response` (a long-poll): answered by the first `http-response`
    /// published to its channels, or with the backend's own answer at `Grip-Timeout`.
    pub(crate) fn hold_response(&mut self, k: u32, a: &Answered<'_>, instruct: &proto::Instruct) {
        let mut hdrs: Vec<(&str, &str)> = a.passed.iter().map(|(n, v)| (*n, v.as_str())).collect();
        if !a.keep {
            hdrs.push(("Connection", "close"));
        }
        let mut timeout = Vec::with_capacity(256 + a.body.len());
        http1::write_status_head(
            &mut timeout,
            a.version,
            a.status,
            Some(a.reason),
            &hdrs,
            Some(a.body.len()),
        );
        timeout.extend_from_slice(a.body);
        let secs = instruct
            .timeout_secs
            .map_or(self.shared.config.grip_default_timeout, u64::from) as u32;
        let entry = GripConn {
            ticket: a.ticket,
            route: a.route,
            phase: Phase::Response(Box::new(ResponseHold {
                deadline: self.now.saturating_add(secs.max(1)),
                timeout: timeout.into(),
                headers: a
                    .passed
                    .iter()
                    .map(|(n, v)| (Box::from(*n), Box::from(v.as_str())))
                    .collect(),
            })),
        };
        let state = State::Poll(PollMode {
            keep: a.keep,
            grip: true,
        });
        if !self.enter_hold(k, state, Some(entry)) {
            return;
        }
        let replay = self.subscribe_channels(k, &instruct.channels);
        if !replay.is_empty() {
            self.deliver_grip(k, &replay);
        }
    }

    /// Subscribes a held connection to each channel (from its `prev-id` when given) and returns
    /// what it missed, in publish order.
    pub(crate) fn subscribe_channels(
        &mut self,
        k: u32,
        channels: &[proto::Channel],
    ) -> Vec<Arc<Published>> {
        let mut replay = Vec::new();
        for c in channels {
            let since = c.prev_id.as_deref().map_or(Since::Now, Since::PublisherId);
            if self.subscription(k, &c.name).is_some() {
                continue;
            }
            match self.subscribe_conn(k, &[c.name.as_str()], since, false) {
                Some(sub) => replay.extend(sub.replay),
                None => return Vec::new(),
            }
        }
        replay.sort_by_key(|m| m.id);
        replay.dedup_by_key(|m| m.id);
        replay
    }

    /// Delivers the GRIP content of `run` (in publish order) to held connection `k`.
    pub(crate) fn deliver_grip(&mut self, k: u32, run: &[Arc<Published>]) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        match conn.state {
            State::Stream(StreamMode::Grip { chunked, .. }) => {
                conn.last_seen = self.now;
                let mut frames: Vec<&Arc<[u8]>> = Vec::new();
                let mut close = false;
                for m in run {
                    match GripContent::of(m).and_then(|g| g.stream.as_ref()) {
                        Some(StreamPart::Send { raw, chunk }) => {
                            frames.push(if chunked { chunk } else { raw })
                        }
                        Some(StreamPart::Close) => {
                            close = true;
                            break;
                        }
                        None => {}
                    }
                }
                let n = frames.len() as u64;
                if !frames.is_empty() {
                    self.deliver_all(k, &frames);
                    self.scratch.tally.delivered += n;
                }
                if close {
                    self.end_grip_stream(k);
                }
            }
            State::Poll(mode) => {
                let found = run
                    .iter()
                    .find_map(|m| GripContent::of(m).and_then(|g| g.response.as_ref()));
                if let Some(r) = found {
                    let keep = mode.keep && !self.shared.stopping.load(Relaxed);
                    let mut merged = (**r).clone();
                    if let Some(GripConn {
                        phase: Phase::Response(hold),
                        ..
                    }) = self.side.grip().get(&k)
                    {
                        let headers = &hold.headers;
                        let own = std::mem::take(&mut merged.headers);
                        let mut all: Vec<(String, String)> = headers
                            .iter()
                            .filter(|(n, _)| !own.iter().any(|(o, _)| o.eq_ignore_ascii_case(n)))
                            .map(|(n, v)| (n.to_string(), v.to_string()))
                            .collect();
                        all.extend(own);
                        merged.headers = all;
                    }
                    let bytes: Arc<[u8]> = response_bytes(&merged, keep).into();
                    self.scratch.tally.delivered += 1;
                    self.finish_grip_poll(k, &bytes, keep);
                }
            }
            State::Ws(_) => {
                let mut frames: Vec<&Arc<[u8]>> = Vec::new();
                let mut close = None;
                for m in run {
                    match GripContent::of(m).and_then(|g| g.ws.as_ref()) {
                        Some(WsPart::Frame(f)) => frames.push(f),
                        Some(WsPart::Close(f)) => {
                            close = Some(Arc::clone(f));
                            break;
                        }
                        None => {}
                    }
                }
                let n = frames.len() as u64;
                if !frames.is_empty() {
                    self.deliver_all(k, &frames);
                    self.scratch.tally.delivered += n;
                }
                if let Some(frame) = close {
                    // The client's Close reply ends the session; the backend hears a CLOSE, as
                    // Pushpin reports it.
                    if let Some(b) = bridge(self.side.grip_mut(), k) {
                        if !b.told && !b.client_closed {
                            b.client_closed = true;
                            proto::write_event(&mut b.pending, &WsEvent::Close(None));
                        }
                    }
                    self.start_closing(k, Some(frame), CloseReason::Backend);
                }
            }
            // Not held by a backend (any more): nothing of GRIP's to deliver.
            State::Stream(StreamMode::Ndjson | StreamMode::Raw)
            | State::Http
            | State::Sse(_)
            | State::H2
            | State::Proxy
            | State::Closing { .. } => {}
        }
    }

    /// Turns connection `k`, whose backend just answered, into a held one in `state` (a GRIP
    /// stream, long-poll or bridged WebSocket), with its side entry when it needs one. False if
    /// the connection is gone.
    pub(crate) fn enter_hold(&mut self, k: u32, state: State, entry: Option<GripConn>) -> bool {
        debug_assert!(state.grip_held());
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return false;
        };
        conn.last_seen = self.now;
        self.set_state(k, state);
        if let Some(e) = entry {
            self.side.grip_mut().insert(k, e);
        }
        true
    }

    /// Ends the hold of connection `k` (which leaves its channels) and, if it is still held in
    /// state `from`, returns it to `Http` for the client's next request. False otherwise.
    pub(crate) fn leave_hold(&mut self, k: u32, from: Kind) -> bool {
        self.leave_all_topics(k);
        self.side.grip_mut().remove(&k);
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return false;
        };
        if conn.state.kind() != from || !conn.state.grip_held() {
            return false;
        }
        conn.last_seen = self.now;
        self.set_state(k, State::Http);
        true
    }

    /// Ends a held stream (a published `close`): the last chunk, then the connection serves
    /// the client's next request if it allows keep-alive, else it closes.
    pub(crate) fn end_grip_stream(&mut self, k: u32) {
        let Some(conn) = self.conns.get(k as usize) else {
            return;
        };
        let State::Stream(StreamMode::Grip { chunked, keep }) = conn.state else {
            return;
        };
        if !(chunked && keep) || self.shared.stopping.load(Relaxed) {
            let last: Option<Arc<[u8]>> = chunked.then(|| Arc::from(http1::LAST_CHUNK));
            return self.start_closing(k, last, CloseReason::Backend);
        }
        if self.leave_hold(k, Kind::Stream) {
            self.write_all_to(k, &[&Arc::from(http1::LAST_CHUNK)], None);
        }
    }

    /// Answers a held GRIP long-poll with `bytes` (a complete response) and returns the
    /// connection to `Http`, or closes it.
    pub(crate) fn finish_grip_poll(&mut self, k: u32, bytes: &Arc<[u8]>, keep: bool) {
        if !self.leave_hold(k, Kind::Poll) {
            return;
        }
        self.write_all_to(k, &[bytes], None);
        if !keep {
            self.start_closing(k, None, CloseReason::HttpDone);
        }
    }

    /// The sweep's GRIP part (see `super::super::timers`): stream keep-alives, long-poll
    /// timeouts, bridge keep-alives.
    pub(crate) fn grip_timers(&mut self) {
        if self.side.grip().is_empty() {
            return;
        }
        let now = self.now;
        let mut sends: Vec<(u32, Arc<[u8]>)> = Vec::new();
        let mut timeouts: Vec<(u32, Arc<[u8]>)> = Vec::new();
        let mut pings: Vec<u32> = Vec::new();
        let mut stuck: Vec<u32> = Vec::new();
        // A request can also wait in the pool's queue behind slow backends; the worker gives
        // up a little after the backend's own deadline would have passed.
        let patience = (self.shared.config.grip_backend_timeout as u32).saturating_add(5);
        for (&k, g) in self.side.grip_mut().iter_mut() {
            match &mut g.phase {
                Phase::Waiting(_) => {
                    let waited = self
                        .conns
                        .get(k as usize)
                        .map_or(0, |c| now.saturating_sub(c.last_seen));
                    if waited >= patience {
                        stuck.push(k);
                    }
                }
                Phase::Stream(ka) => {
                    let quiet = self
                        .conns
                        .get(k as usize)
                        .map_or(0, |c| now.saturating_sub(c.last_seen));
                    let due = if ka.interval {
                        now.saturating_sub(ka.last) >= ka.every
                    } else {
                        quiet >= ka.every
                    };
                    if due {
                        ka.last = now;
                        sends.push((k, Arc::clone(&ka.data)));
                    }
                }
                Phase::Response(hold) if now >= hold.deadline => {
                    timeouts.push((k, Arc::clone(&hold.timeout)));
                }
                Phase::Ws(b) => {
                    if let Some((frame, every, last)) = &mut b.keep_alive {
                        if now.saturating_sub(*last) >= *every {
                            *last = now;
                            sends.push((k, Arc::clone(frame)));
                        }
                    }
                    if b.interval > 0
                        && !b.in_flight
                        && !b.detached
                        && now.saturating_sub(b.last_request) >= b.interval
                    {
                        pings.push(k);
                    }
                }
                _ => {}
            }
        }
        for k in stuck {
            if let Some(GripConn {
                phase: Phase::Waiting(w),
                ..
            }) = self.side.grip_mut().remove(&k)
            {
                self.backend_failed(k, &Failure::Timeout, w.keep);
            }
        }
        for (k, data) in sends {
            if let Some(conn) = self.conns.get_mut(k as usize) {
                if conn.state.kind() == Kind::Stream {
                    conn.last_seen = now;
                }
            }
            self.deliver(k, &data);
        }
        for (k, answer) in timeouts {
            let keep = self
                .conns
                .get(k as usize)
                .is_some_and(|c| matches!(c.state, State::Poll(PollMode { keep: true, .. })));
            self.finish_grip_poll(k, &answer, keep);
        }
        for k in pings {
            self.post_events(k, true);
        }
    }

    /// A GRIP connection left (closing or dropped) with state `g`; a bridged
    /// WebSocket's backend is told with CLOSE (sent earlier by the client) or DISCONNECT.
    pub(crate) fn grip_left(&mut self, k: u32, g: GripConn) {
        let mut b = match g.phase {
            Phase::Ws(b) => b,
            // The client left while the backend was deciding on its OPEN: the backend may
            // already count the connection, so it hears DISCONNECT too.
            Phase::Waiting(w) => match w.upgrade {
                Some(u) => u.bridge,
                None => return,
            },
            Phase::Stream(_) | Phase::Response(_) => return,
        };
        if b.told || b.detached {
            return;
        }
        if !b.client_closed {
            proto::write_event(&mut b.pending, &WsEvent::Disconnect);
        }
        let sig = self
            .shared
            .grip
            .as_ref()
            .and_then(|p| p.route_signature(g.route, self.unix_now()));
        let request = event_request(&b, sig.as_deref(), &b.pending);
        self.submit(k, g.ticket, g.route, request, false, false);
    }

    /// Shutdown: held streams end (with their last chunk), long-polls get their timeout answer,
    /// bridged WebSockets close with 1001.
    pub(crate) fn grip_shutdown(&mut self, k: u32) {
        let Some(state) = self.conns.get(k as usize).map(|c| c.state) else {
            return;
        };
        match state {
            State::Stream(mode) => {
                let chunked = matches!(mode, StreamMode::Grip { chunked: true, .. });
                let last: Option<Arc<[u8]>> = chunked.then(|| Arc::from(http1::LAST_CHUNK));
                self.start_closing(k, last, CloseReason::Shutdown);
            }
            State::Poll(_) => {
                let answer = match self.side.grip().get(&k) {
                    Some(GripConn {
                        phase: Phase::Response(hold),
                        ..
                    }) => Arc::clone(&hold.timeout),
                    _ => return self.drop_conn(k, CloseReason::Shutdown),
                };
                self.finish_grip_poll(k, &answer, false);
            }
            State::Ws(_) => self.close_ws(
                k,
                CloseCode::GoingAway,
                "server shutting down",
                CloseReason::Shutdown,
            ),
            State::Http | State::Sse(_) | State::H2 | State::Proxy | State::Closing { .. } => {
                self.drop_conn(k, CloseReason::Shutdown)
            }
        }
    }
}
