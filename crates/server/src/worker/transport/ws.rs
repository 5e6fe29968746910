//! WebSocket connections: frames in (through `clarion_proto`'s receiver), control messages,
//! echo, automatic pongs, the close handshake, permessage-deflate in both directions. A bridged
//! (GRIP) WebSocket's messages go to [`crate::grip`] instead of the control handler.
//!
//! Deliveries of published messages are made by [`crate::worker`]'s fan-out.
#![deny(clippy::wildcard_enum_match_arm)]

use std::borrow::Cow;
use std::sync::Arc;

use clarion_proto::ws::close::encode_close_frame;
use clarion_proto::ws::deflate::{self, Compressor, InflateError, Inflater};
use clarion_proto::ws::frame::{encode_compressed_frame, encode_frame};
use clarion_proto::ws::receiver::Limits;
use clarion_proto::ws::{CloseCode, DataKind, Event, OpCode};

use clarion_proto::pubsub::control::{self, Reply, Request};
use clarion_proto::pubsub::validate_topic;

use crate::broker::{Outgoing, Since};
use crate::hooks::Hook;
use crate::log;
use crate::message::{compress_frame, frame_payload};
use crate::metrics::CloseReason;
use crate::worker::filters::{keep_passing, read_filter_json};
use crate::worker::socket::Socket;
use crate::worker::state::{Ext, Kind, WsRole};
use crate::worker::transport::frame::pick;
use crate::worker::transport::hooks::Gate;
use crate::worker::Engine;

impl<S: Socket> Engine<S> {
    /// Decodes and handles every complete frame at the start of `data`; returns the bytes used.
    pub(crate) fn on_frames(&mut self, k: u32, data: &mut [u8]) -> usize {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return data.len();
        };
        let mut rx = std::mem::take(&mut conn.rx);
        let limits = Limits {
            max_message: self.shared.config.max_message_size,
            require_mask: true,
            deflate: conn.state.ws().is_some_and(|m| m.deflate.is_some()),
        };
        let mut pos = 0;
        loop {
            let rest = data.get_mut(pos..).unwrap_or_default();
            match rx.next(rest, &limits) {
                Ok(None) => break,
                Ok(Some((used, event))) => {
                    pos += used;
                    if let Some(event) = event {
                        self.on_event(k, event);
                    }
                    let open = self
                        .conns
                        .get(k as usize)
                        .is_some_and(|c| c.state.kind() == Kind::Ws);
                    if !open {
                        return data.len();
                    }
                }
                Err(v) => {
                    log::debug(format_args!(
                        "websocket violation: {} ({})",
                        v.reason,
                        v.code.as_u16()
                    ));
                    let reason = if v.code == CloseCode::TooBig {
                        CloseReason::TooBig
                    } else {
                        CloseReason::ProtocolError
                    };
                    self.close_ws(k, v.code, v.reason, reason);
                    return data.len();
                }
            }
        }
        if let Some(conn) = self.conns.get_mut(k as usize) {
            conn.rx = rx;
        }
        pos
    }

    pub(crate) fn on_event(&mut self, k: u32, event: Event<'_>) {
        if !self.conns.contains(k as usize) {
            return;
        }
        let Some(role) = self
            .conns
            .get(k as usize)
            .and_then(|c| Some(c.state.ws()?.role))
        else {
            return;
        };
        let bridged = role == WsRole::Bridge;
        match event {
            Event::Message {
                kind,
                payload,
                compressed,
            } => {
                let payload = if compressed {
                    match self.inflate(k, kind, &payload) {
                        Some(p) => Cow::Owned(p),
                        None => return, // the connection is closing
                    }
                } else {
                    payload
                };
                // The one dispatch on a WebSocket's role for its messages.
                match role {
                    WsRole::Bridge => self.grip_client_message(k, kind, &payload),
                    WsRole::Pusher | WsRole::PusherResume => self.pusher_message(k, kind, &payload),
                    WsRole::Echo => {
                        let op = match kind {
                            DataKind::Text => OpCode::Text,
                            DataKind::Binary => OpCode::Binary,
                        };
                        let frame: Arc<[u8]> = encode_frame(op, &payload).into();
                        let frame = self.compress_for(k, &frame, op);
                        self.send(k, &frame);
                    }
                    WsRole::PubSub | WsRole::Envelope if kind == DataKind::Binary => {
                        self.close_ws(
                            k,
                            CloseCode::Unsupported,
                            "binary messages are not accepted; control messages are JSON text",
                            CloseReason::ProtocolError,
                        );
                    }
                    WsRole::PubSub | WsRole::Envelope => self.on_control(k, &payload),
                }
            }
            Event::Ping(payload) => {
                self.send(k, &Arc::from(encode_frame(OpCode::Pong, payload)));
                if bridged {
                    self.grip_client_ping(k, payload);
                }
            }
            Event::Pong(_) => {}
            Event::Close(received) => {
                if bridged {
                    self.grip_client_close(k, received);
                }
                // Echo the peer's code (RFC 6455 5.5.1); an empty Close gets an empty one.
                let reply: Arc<[u8]> = match received {
                    Some((code, _)) => encode_close_frame(code, "").into(),
                    None => encode_frame(OpCode::Close, b"").into(),
                };
                self.start_closing(k, Some(reply), CloseReason::ClientClose);
            }
        }
    }

    pub(crate) fn on_control(&mut self, k: u32, text: &[u8]) {
        if self.hook_queue(k, text) {
            return;
        }
        let request = match control::parse(text) {
            Ok(r) => r,
            Err(why) => {
                return self.reply(
                    k,
                    &Reply::Error {
                        error: &why.to_string(),
                        topic: None,
                    },
                )
            }
        };
        match request {
            Request::Subscribe {
                topic,
                since,
                presence,
                filter,
                delta,
            } => {
                if let Err(e) = validate_topic(&topic) {
                    return self.reply(
                        k,
                        &Reply::Error {
                            error: &e.to_string(),
                            topic: None,
                        },
                    );
                }
                let filter = match filter
                    .as_ref()
                    .map(|v| read_filter_json(v, &self.shared.metrics.filters))
                {
                    None => None,
                    Some(Ok(f)) => Some(f),
                    Some(Err(error)) => {
                        return self.reply(
                            k,
                            &Reply::Error {
                                error: &error,
                                topic: Some(&topic),
                            },
                        )
                    }
                };
                let gate = self.hook_gate(k, Hook::Subscribe, &topic, text, None);
                let approved = match gate {
                    Gate::Waiting => return,
                    Gate::Refused(error) => {
                        let topic = Some(&*topic);
                        return self.reply(
                            k,
                            &Reply::Error {
                                error: &error,
                                topic,
                            },
                        );
                    }
                    Gate::Approved(_) => true,
                    Gate::Pass => false,
                };
                if let Err(r) =
                    self.ws_may_subscribe(k, &topic)
                        .or_else(|r| if approved { Ok(()) } else { Err(r) })
                {
                    r.count(&self.shared.metrics);
                    return self.reply(
                        k,
                        &Reply::Error {
                            error: r.reason,
                            topic: Some(&topic),
                        },
                    );
                }
                let already = self.subscription(k, &topic).is_some();
                let count = self.conns.get(k as usize).map_or(0, |c| c.subs.len());
                if !already && count >= self.shared.config.max_subscriptions {
                    let error = format!(
                        "too many subscriptions: at most {} per connection",
                        self.shared.config.max_subscriptions
                    );
                    return self.reply(
                        k,
                        &Reply::Error {
                            error: &error,
                            topic: Some(&topic),
                        },
                    );
                }
                let envelope = self
                    .conns
                    .get(k as usize)
                    .and_then(|c| c.state.ws())
                    .is_some_and(|m| m.role == WsRole::Envelope);
                if let Some(since) = since.as_deref() {
                    let bad = if !envelope {
                        Some("resuming (since) needs the clarion.v1 subprotocol".to_owned())
                    } else if since == clarion_proto::event_id::LATEST {
                        None
                    } else {
                        clarion_proto::event_id::parse(since)
                            .err()
                            .map(|e| format!("invalid since {since:?}: {e}"))
                    };
                    if let Some(error) = bad {
                        return self.reply(
                            k,
                            &Reply::Error {
                                error: &error,
                                topic: Some(&topic),
                            },
                        );
                    }
                }
                if presence {
                    if let Some(error) = self.presence_refusal(&topic, envelope) {
                        return self.reply(
                            k,
                            &Reply::Error {
                                error,
                                topic: Some(&topic),
                            },
                        );
                    }
                }
                if delta {
                    if let Some(error) = self.delta_refusal([&*topic], envelope) {
                        return self.reply(
                            k,
                            &Reply::Error {
                                error: &error,
                                topic: Some(&topic),
                            },
                        );
                    }
                }
                if let Some(tid) = self.subscription(k, &topic) {
                    // Already receiving it live: replaying would duplicate. Its filter is the
                    // one given now; deltas start after its next full message.
                    self.filters
                        .set(k, tid, filter.as_ref(), &self.shared.metrics.filters);
                    if delta {
                        let name: Arc<str> = Arc::from(&*topic);
                        self.delta_join(k, &[name], &[]);
                    }
                    self.reply(k, &Reply::Subscribed { topic: &topic });
                    if presence {
                        let name: Arc<str> = Arc::from(&*topic);
                        self.presence_listen(k, &[name]);
                    }
                    return;
                }
                let since = Since::from_cursor(since.as_deref());
                let Some(mut sub) =
                    self.subscribe_filtered(k, &[&topic], since, true, filter.as_ref())
                else {
                    return;
                };
                keep_passing(filter.as_ref(), &mut sub.replay);
                self.reply(k, &Reply::Subscribed { topic: &topic });
                let gaps: Vec<Arc<[u8]>> = sub
                    .gaps
                    .iter()
                    .map(|g| encode_frame(OpCode::Text, g.json().as_bytes()).into())
                    .collect();
                let mut frames: Vec<&Arc<[u8]>> = gaps.iter().collect();
                let (form, settings) =
                    (self.framing(k).replay_form(), self.frames.deflate_settings);
                frames.extend(sub.replay.iter().map(|m| pick(m, form, &settings)));
                if !frames.is_empty() {
                    self.write_all_to(k, &frames, None);
                    self.scratch.tally.delivered += sub.replay.len() as u64;
                }
                if delta {
                    self.delta_join(k, &sub.names, &sub.replay);
                }
                if presence {
                    self.presence_listen(k, &sub.names);
                }
            }
            Request::Presence { topic, after } => {
                self.presence_query(k, &topic, after.as_deref());
            }
            Request::Unsubscribe { topic } => {
                if let Some(tid) = self.subscription(k, &topic) {
                    self.unsubscribe(k, tid);
                }
                self.reply(k, &Reply::Unsubscribed { topic: &topic });
            }
            Request::Publish {
                topic,
                data,
                encoding,
            } => {
                if !self.shared.config.allow_client_publish {
                    let error = "publishing from clients is disabled on this server";
                    return self.reply(
                        k,
                        &Reply::Error {
                            error,
                            topic: Some(&topic),
                        },
                    );
                }
                if let Err(e) = validate_topic(&topic) {
                    return self.reply(
                        k,
                        &Reply::Error {
                            error: &e.to_string(),
                            topic: None,
                        },
                    );
                }
                let gate = self.hook_gate(
                    k,
                    Hook::Publish,
                    &topic,
                    text,
                    Some((&data, encoding.as_deref())),
                );
                let replaced = match gate {
                    Gate::Waiting => return,
                    Gate::Refused(error) => {
                        let topic = Some(&*topic);
                        return self.reply(
                            k,
                            &Reply::Error {
                                error: &error,
                                topic,
                            },
                        );
                    }
                    Gate::Approved(data) => Some(data),
                    Gate::Pass => None,
                };
                if let Err(r) = self.ws_may_publish(k, &topic).or_else(|r| {
                    if replaced.is_some() {
                        Ok(())
                    } else {
                        Err(r)
                    }
                }) {
                    r.count(&self.shared.metrics);
                    let error = if r.status == 403 {
                        "the token does not allow publishing to this topic"
                    } else {
                        "publishing needs a token that allows the topic"
                    };
                    return self.reply(
                        k,
                        &Reply::Error {
                            error,
                            topic: Some(&topic),
                        },
                    );
                }
                let decoded = match replaced.flatten() {
                    Some(d) => control::decode_data(&d, None),
                    None => control::decode_data(&data, encoding.as_deref()),
                };
                let (kind, payload) = match decoded {
                    Ok(decoded) => decoded,
                    Err(e) => {
                        return self.reply(
                            k,
                            &Reply::Error {
                                error: &e.to_string(),
                                topic: Some(&topic),
                            },
                        )
                    }
                };
                let msg = Outgoing {
                    tags: &[],
                    conflation_key: None,
                    topic: &topic,
                    kind,
                    payload: &payload,
                    event: None,
                    attachment: None,
                    key: None,
                };
                // At the time the shell passed in: the engine reads no clock.
                let receipts = self.shared.broker.publish_at(&[msg], self.hub_now());
                let receipts = match receipts {
                    Ok(r) => r,
                    Err(e) => {
                        crate::log::warn(format_args!("in-band publish refused: {e}"));
                        let error = if e.during_upgrade() {
                            format!("message not published: {e}")
                        } else {
                            format!("broker unavailable, message not published: {e}")
                        };
                        return self.reply(
                            k,
                            &Reply::Error {
                                error: &error,
                                topic: Some(&topic),
                            },
                        );
                    }
                };
                if let Some(r) = receipts.first() {
                    let reply = Reply::Published {
                        topic: &topic,
                        id: r.id.clone(),
                        subscribers: r.subscribers,
                    };
                    self.reply(k, &reply);
                }
            }
            Request::Auth { token } | Request::Refresh { token } => {
                self.on_token_message(k, &token);
            }
        }
    }

    /// Inflates a compressed message (RFC 7692) under the message size limit, and checks text
    /// is UTF-8. On failure the connection is closed (1009 over the limit, 1007 for corrupt
    /// data or text that is not UTF-8) and `None` returned.
    pub(crate) fn inflate(&mut self, k: u32, kind: DataKind, data: &[u8]) -> Option<Vec<u8>> {
        let ext = self
            .conns
            .get(k as usize)?
            .state
            .ws()?
            .deflate
            .unwrap_or_default();
        let max = self.shared.config.max_message_size;
        let inflated = if ext.client_keeps_context() {
            // The client compresses with context: its window must outlive the message.
            let inf = self
                .side
                .inflaters_mut()
                .entry(k)
                .or_insert_with(|| Inflater::keeping_context(ext.client_window_bits()));
            let mut out = Vec::new();
            inf.inflate(data, max, &mut out).map(|()| out)
        } else {
            deflate::inflate_message(data, ext.client_window_bits(), max)
        };
        let (code, why, reason) = match inflated {
            Ok(out) if kind == DataKind::Binary || std::str::from_utf8(&out).is_ok() => {
                return Some(out)
            }
            Ok(_) => (
                CloseCode::InvalidPayload,
                "invalid UTF-8 in text message",
                CloseReason::ProtocolError,
            ),
            Err(InflateError::TooBig) => {
                (CloseCode::TooBig, "message too big", CloseReason::TooBig)
            }
            Err(InflateError::Corrupt) => (
                CloseCode::InvalidPayload,
                "invalid compressed data",
                CloseReason::ProtocolError,
            ),
        };
        log::debug(format_args!("websocket violation: {why}"));
        self.close_ws(k, code, why, reason);
        None
    }

    /// `frame` as connection `k` should receive it: compressed when it negotiated
    /// permessage-deflate (with its own context in dedicated mode), else unchanged.
    pub(crate) fn compress_for(&mut self, k: u32, frame: &Arc<[u8]>, opcode: OpCode) -> Arc<[u8]> {
        let Some(conn) = self.conns.get(k as usize) else {
            return Arc::clone(frame);
        };
        let Some(ext) = conn.state.ws().and_then(|m| m.deflate) else {
            return Arc::clone(frame);
        };
        let settings = self.frames.deflate_settings;
        if !ext.dedicated() || !self.may_dedicate(k) {
            let bits = if ext.small_server_window() { 9 } else { 15 };
            return compress_frame(frame, opcode, bits, &settings);
        }
        let payload = frame_payload(frame);
        if payload.len() < settings.threshold {
            return Arc::clone(frame);
        }
        let bits = self.dedicated_window_bits(ext);
        let c = self
            .side
            .deflaters_mut()
            .entry(k)
            .or_insert_with(|| Compressor::keeping_context(settings.level, bits, 8));
        // Sent compressed even when it does not shrink: the context now holds it.
        let z = c.compress(payload);
        encode_compressed_frame(opcode, &z).into()
    }

    /// The window of connection `k`'s dedicated compressor: the 9-bit one when the client
    /// limited the server's window, else `compression_window_bits`.
    pub(crate) fn dedicated_window_bits(&self, ext: Ext) -> u8 {
        if ext.small_server_window() {
            9
        } else {
            self.shared.config.compression_window_bits
        }
    }

    /// Whether connection `k` has, or may get, a dedicated compressor: this worker's share of
    /// `compression_dedicated_limit` bounds their memory. Past it, connections get the shared
    /// frames, which is always allowed (a compressor may ignore its context).
    pub(crate) fn may_dedicate(&self, k: u32) -> bool {
        let workers = self.shared.config.worker_count().max(1);
        let share = self
            .shared
            .config
            .compression_dedicated_limit
            .div_ceil(workers);
        self.side.deflaters().contains_key(&k) || self.side.deflaters().len() < share
    }

    pub(crate) fn reply(&mut self, k: u32, reply: &Reply<'_>) {
        let frame = encode_frame(OpCode::Text, reply.to_json().as_bytes());
        self.send(k, &Arc::from(frame));
    }
}
