//! WebSocket-over-HTTP: a WebSocket upgrade on an `over_http` route is bridged to the backend.
//! The client's messages become `TEXT`/`BINARY` events POSTed to the backend (one request at a
//! time per connection, later events batched behind it); the backend's answers carry events for
//! the client and `c:` control messages (subscribe, unsubscribe, detach, keep-alive).
//!
//! The bridge's state is a [`super::conn::Bridge`] in the connection's [`super::conn::GripConn`].
//! This module does not parse client frames (the WebSocket transport does) nor deliver published
//! content (see [`super::hold`]).
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::grip::publish::WsMessage;
use clarion_proto::grip::{self as proto, Control, Event as WsEvent, EventLimits, Prefixed};
use clarion_proto::http1::{self, Version};
use clarion_proto::ws::close::encode_close_frame;
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::handshake;
use clarion_proto::ws::{CloseCode, DataKind, OpCode};

use super::conn::{apply_meta, bridge, client_headers, event_request, GripConn, Phase, Upgrade};
use crate::grip::backend::{Failure, Response};
use crate::log;
use crate::metrics::CloseReason;
use crate::worker::socket::Socket;
use crate::worker::state::{Kind, State, WsMode, WsRole};
use crate::worker::Engine;
use clarion_proto::pubsub::validate_topic;

/// Limits on a backend's websocket-events body: message size is bounded by `grip_max_body`.
pub(crate) fn event_limits(max: usize) -> EventLimits {
    EventLimits {
        max_content: max,
        max_events: crate::config::limits::GRIP_WS_MAX_EVENTS,
    }
}

impl<S: Socket> Engine<S> {
    /// Accepts (or refuses) a bridged WebSocket after the backend answered its OPEN.
    pub(crate) fn accept_bridge(
        &mut self,
        k: u32,
        r: Response,
        keep: bool,
        route: u32,
        ticket: u64,
        upgrade: Upgrade,
    ) {
        let Upgrade {
            key,
            offered,
            mut bridge,
        } = upgrade;
        let is_events = r
            .header("content-type")
            .is_some_and(|t| t.trim().starts_with("application/websocket-events"));
        if r.status != 200 || !is_events {
            // The backend refused the connection: its answer goes to the client as is.
            self.back_to_http(k);
            let passed = client_headers(&r);
            let mut hdrs: Vec<(&str, &str)> =
                passed.iter().map(|(n, v)| (*n, v.as_str())).collect();
            if !keep {
                hdrs.push(("Connection", "close"));
            }
            let status = if r.status == 200 { 502 } else { r.status };
            let mut out = Vec::new();
            let length = Some(r.body.len());
            http1::write_status_head(
                &mut out,
                Version::Http11,
                status,
                Some(&r.reason),
                &hdrs,
                length,
            );
            out.extend_from_slice(&r.body);
            return self.finish_answer(k, out.into(), keep, status);
        }
        let limits = event_limits(self.shared.config.grip_max_body);
        let events = match proto::decode_body(&r.body, &limits) {
            Ok(e) => e,
            Err(e) => {
                let f = Failure::Invalid(format!("websocket-events: {e}"));
                return self.backend_failed(k, &f, keep);
            }
        };
        if !matches!(events.first(), Some(WsEvent::Open)) {
            let f = Failure::Invalid("the backend's answer does not start with OPEN".into());
            return self.backend_failed(k, &f, keep);
        }
        bridge.prefix = r
            .header("sec-websocket-extensions")
            .and_then(proto::grip_message_prefix)
            .map(Into::into);
        apply_meta(&mut bridge, &r);
        bridge.in_flight = false;
        let protocol = r
            .header("sec-websocket-protocol")
            .map(str::trim)
            .filter(|p| offered.iter().any(|o| o == p));
        let mut out = Vec::with_capacity(256);
        handshake::write_accept(&mut out, &key, protocol, None);
        let entry = GripConn {
            ticket,
            route,
            phase: Phase::Ws(bridge),
        };
        if !self.enter_hold(k, State::Ws(WsMode::new(WsRole::Bridge)), Some(entry)) {
            return;
        }
        self.send(k, &Arc::from(out));
        let rest: Vec<WsEvent<'_>> = events.into_iter().skip(1).collect();
        self.apply_events(k, &rest);
        self.flush_bridge(k);
    }

    /// The backend's answer to an event request.
    pub(crate) fn on_bridge_answer(&mut self, k: u32, result: Result<Response, Failure>) {
        let r = match result {
            Ok(r) if r.status == 200 => r,
            Ok(r) => {
                log::info(format_args!(
                    "GRIP: backend answered {} to events",
                    r.status
                ));
                self.shared
                    .metrics
                    .grip_backend_errors
                    .fetch_add(1, Relaxed);
                return self.close_bridge(k, CloseCode::Internal, "backend error");
            }
            Err(f) => {
                log::info(format_args!("GRIP: websocket events: {f:?}"));
                self.shared
                    .metrics
                    .grip_backend_errors
                    .fetch_add(1, Relaxed);
                return self.close_bridge(k, CloseCode::Internal, "backend unavailable");
            }
        };
        if let Some(b) = bridge(self.side.grip_mut(), k) {
            apply_meta(b, &r);
        }
        let limits = event_limits(self.shared.config.grip_max_body);
        match proto::decode_body(&r.body, &limits) {
            Ok(events) => self.apply_events(k, &events),
            Err(e) => {
                log::info(format_args!("GRIP: backend sent bad websocket-events: {e}"));
                return self.close_bridge(k, CloseCode::Internal, "backend error");
            }
        }
        self.flush_bridge(k);
    }

    /// Closes a bridged WebSocket because of its backend; the backend is not told again.
    pub(crate) fn close_bridge(&mut self, k: u32, code: CloseCode, why: &str) {
        if let Some(b) = bridge(self.side.grip_mut(), k) {
            b.told = true;
        }
        self.close_ws(k, code, why, CloseReason::Backend);
    }

    /// Carries out the events a backend sent for a bridged connection.
    pub(crate) fn apply_events(&mut self, k: u32, events: &[WsEvent<'_>]) {
        let Some(prefix) = bridge(self.side.grip_mut(), k).map(|b| b.prefix.clone()) else {
            return;
        };
        for ev in events {
            let alive = self
                .conns
                .get(k as usize)
                .is_some_and(|c| c.state.kind() == Kind::Ws);
            if !alive {
                return;
            }
            match ev {
                WsEvent::Text(t) => {
                    let message = match prefix.as_deref() {
                        None => Some(t.as_bytes()),
                        Some(p) => match proto::split_prefix(t.as_bytes(), p) {
                            Prefixed::Control(json) => {
                                self.on_backend_control(k, json);
                                None
                            }
                            Prefixed::Message(m) => Some(m),
                            Prefixed::Unprefixed => {
                                log::debug(format_args!("GRIP: unprefixed message dropped"));
                                None
                            }
                        },
                    };
                    if let Some(m) = message {
                        self.send(k, &Arc::from(encode_frame(OpCode::Text, m)));
                    }
                }
                WsEvent::Binary(b) => {
                    // With the grip extension, binary messages carry the prefix too.
                    let data = match prefix.as_deref() {
                        Some(p) => b.strip_prefix(p.as_bytes()).unwrap_or(b),
                        None => b,
                    };
                    self.send(k, &Arc::from(encode_frame(OpCode::Binary, data)));
                }
                WsEvent::Ping(p) => self.send(k, &Arc::from(encode_frame(OpCode::Ping, p))),
                WsEvent::Pong(p) => self.send(k, &Arc::from(encode_frame(OpCode::Pong, p))),
                WsEvent::Close(c) => {
                    let frame: Arc<[u8]> = match c {
                        Some((code, reason)) => encode_close_frame(*code, reason).into(),
                        None => encode_frame(OpCode::Close, b"").into(),
                    };
                    if let Some(b) = bridge(self.side.grip_mut(), k) {
                        b.told = true;
                    }
                    self.start_closing(k, Some(frame), CloseReason::Backend);
                    return;
                }
                WsEvent::Disconnect => {
                    if let Some(b) = bridge(self.side.grip_mut(), k) {
                        b.told = true;
                    }
                    self.drop_conn(k, CloseReason::Backend);
                    return;
                }
                WsEvent::Open => {}
            }
        }
    }

    pub(crate) fn on_backend_control(&mut self, k: u32, json: &[u8]) {
        let control = match proto::decode_control(json) {
            Ok(c) => c,
            Err(e) => {
                log::info(format_args!("GRIP: control message ignored: {e}"));
                return;
            }
        };
        match control {
            Control::Subscribe { channel } => {
                if let Err(e) = validate_topic(&channel) {
                    log::info(format_args!("GRIP: cannot subscribe to {channel:?}: {e}"));
                    return;
                }
                let over = self
                    .conns
                    .get(k as usize)
                    .is_some_and(|c| c.subs.len() >= self.shared.config.max_subscriptions);
                if over {
                    log::info(format_args!("GRIP: subscription limit reached"));
                    return;
                }
                let ch = proto::Channel {
                    name: channel,
                    prev_id: None,
                    filters: Vec::new(),
                };
                self.subscribe_channels(k, std::slice::from_ref(&ch));
            }
            Control::Unsubscribe { channel } => {
                if let Some(tid) = self.subscription(k, &channel) {
                    self.unsubscribe(k, tid);
                }
            }
            Control::Detach => {
                if let Some(b) = bridge(self.side.grip_mut(), k) {
                    b.detached = true;
                    b.pending.clear();
                }
            }
            Control::KeepAlive(ka) => {
                if let Some(b) = bridge(self.side.grip_mut(), k) {
                    b.keep_alive = ka.map(|ka| {
                        let (op, data): (OpCode, &[u8]) = match &ka.message {
                            WsMessage::Text(t) => (OpCode::Text, t.as_bytes()),
                            WsMessage::Binary(d) => (OpCode::Binary, d),
                            WsMessage::Ping(d) => (OpCode::Ping, d),
                            WsMessage::Pong(d) => (OpCode::Pong, d),
                        };
                        (
                            Arc::from(encode_frame(op, data)),
                            ka.timeout_secs.max(1),
                            self.now,
                        )
                    });
                }
            }
        }
    }

    /// A message from a bridged client: queued as an event for the backend.
    pub(crate) fn grip_client_message(&mut self, k: u32, kind: DataKind, payload: &[u8]) {
        let Some(b) = bridge(self.side.grip_mut(), k) else {
            return;
        };
        if b.detached {
            return;
        }
        if b.pending.len() + payload.len() > self.shared.config.grip_max_body {
            // The backend is not keeping up with this client.
            self.close_bridge(k, CloseCode::TryAgainLater, "backend too slow");
            return;
        }
        match kind {
            DataKind::Text => {
                let text = std::str::from_utf8(payload).unwrap_or_default();
                proto::write_event(&mut b.pending, &WsEvent::Text(text));
            }
            DataKind::Binary => proto::write_event(&mut b.pending, &WsEvent::Binary(payload)),
        }
        self.flush_bridge(k);
    }

    /// A Ping from a bridged client (already answered): the backend gets a PING event, as
    /// Pushpin sends it.
    pub(crate) fn grip_client_ping(&mut self, k: u32, payload: &[u8]) {
        let Some(b) = bridge(self.side.grip_mut(), k) else {
            return;
        };
        if b.detached || b.pending.len() + payload.len() > self.shared.config.grip_max_body {
            return;
        }
        proto::write_event(&mut b.pending, &WsEvent::Ping(payload));
        self.flush_bridge(k);
    }

    /// A Close frame from a bridged client: the backend gets a CLOSE event.
    pub(crate) fn grip_client_close(&mut self, k: u32, close: Option<(CloseCode, &str)>) {
        let Some(b) = bridge(self.side.grip_mut(), k) else {
            return;
        };
        if !b.told && !b.client_closed {
            b.client_closed = true;
            proto::write_event(&mut b.pending, &WsEvent::Close(close));
        }
    }

    /// Sends the queued events if no request is in flight.
    pub(crate) fn flush_bridge(&mut self, k: u32) {
        self.post_events(k, false);
    }

    /// Sends the queued events in one request, unless one is in flight; with `even_empty`, an
    /// empty request too (`Keep-Alive-Interval`: the backend learns the connection is alive,
    /// and may answer with events).
    pub(crate) fn post_events(&mut self, k: u32, even_empty: bool) {
        let shared = Arc::clone(&self.shared);
        let Some(proxy) = shared.grip.as_ref() else {
            return;
        };
        let unix_now = self.unix_now();
        let Some(g) = self.side.grip_mut().get_mut(&k) else {
            return;
        };
        let (ticket, route) = (g.ticket, g.route);
        let Phase::Ws(b) = &mut g.phase else {
            return;
        };
        if b.in_flight || b.detached || (b.pending.is_empty() && !even_empty) {
            return;
        }
        let events = std::mem::take(&mut b.pending);
        let request = event_request(
            b,
            proxy.route_signature(route, unix_now).as_deref(),
            &events,
        );
        b.in_flight = true;
        b.last_request = self.now;
        self.submit(k, ticket, route, request, false, true);
    }
}
