//! WebSocket connections in the loop: frames in (through `clarion_proto`'s receiver), control
//! messages, echo, automatic pongs, the close handshake, and deliveries of published messages.

use std::borrow::Cow;
use std::sync::Arc;

use clarion_proto::ws::close::encode_close_frame;
use clarion_proto::ws::deflate::{self, Compressor, InflateError, Inflater};
use clarion_proto::ws::frame::{encode_compressed_frame, encode_frame};
use clarion_proto::ws::receiver::Limits;
use clarion_proto::ws::{CloseCode, DataKind, Event, OpCode};

use super::conn::{State, DEFLATE, ECHO, ENVELOPE, GRIP, JSON, RAW};
use super::Worker;
use clarion_proto::pubsub::control::{self, Reply, Request};
use clarion_proto::pubsub::validate_topic;

use crate::broker::{Outgoing, Since, Subscribed};
use crate::log;
use crate::message::{compress_frame, frame_payload, DeflateSettings, Encoding, Published};
use crate::metrics::CloseReason;

impl Worker {
    /// Decodes and handles every complete frame at the start of `data`; returns the bytes used.
    pub(super) fn on_frames(&mut self, k: u32, data: &mut [u8]) -> usize {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return data.len();
        };
        let mut rx = std::mem::take(&mut conn.rx);
        let limits = Limits {
            max_message: self.shared.config.max_message_size,
            require_mask: true,
            deflate: conn.has(DEFLATE),
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
                        .is_some_and(|c| c.state == State::Ws);
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

    fn on_event(&mut self, k: u32, event: Event<'_>) {
        if !self.conns.contains(k as usize) {
            return;
        }
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
                let Some(conn) = self.conns.get(k as usize) else {
                    return;
                };
                if conn.has(GRIP) {
                    self.grip_client_message(k, kind, &payload);
                } else if conn.has(ECHO) {
                    let op = match kind {
                        DataKind::Text => OpCode::Text,
                        DataKind::Binary => OpCode::Binary,
                    };
                    let frame: Arc<[u8]> = encode_frame(op, &payload).into();
                    let frame = self.compress_for(k, &frame, op);
                    self.send(k, &frame);
                } else if kind == DataKind::Binary {
                    self.close_ws(
                        k,
                        CloseCode::Unsupported,
                        "binary messages are not accepted; control messages are JSON text",
                        CloseReason::ProtocolError,
                    );
                } else {
                    self.on_control(k, &payload);
                }
            }
            Event::Ping(payload) => {
                self.send(k, &Arc::from(encode_frame(OpCode::Pong, payload)));
                self.grip_client_ping(k, payload);
            }
            Event::Pong(_) => {}
            Event::Close(received) => {
                self.grip_client_close(k, received);
                // Echo the peer's code (RFC 6455 5.5.1); an empty Close gets an empty one.
                let reply: Arc<[u8]> = match received {
                    Some((code, _)) => encode_close_frame(code, "").into(),
                    None => encode_frame(OpCode::Close, b"").into(),
                };
                self.start_closing(k, Some(reply), CloseReason::ClientClose);
            }
        }
    }

    fn on_control(&mut self, k: u32, text: &[u8]) {
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
            Request::Subscribe { topic, since } => {
                if let Err(e) = validate_topic(&topic) {
                    return self.reply(
                        k,
                        &Reply::Error {
                            error: &e.to_string(),
                            topic: None,
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
                let envelope = self.conns.get(k as usize).is_some_and(|c| c.has(ENVELOPE));
                if let Some(since) = since.as_deref() {
                    let bad = if !envelope {
                        Some("resuming (since) needs the clarion.v1 subprotocol".to_owned())
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
                if already {
                    // Already receiving it live: replaying would duplicate.
                    return self.reply(k, &Reply::Subscribed { topic: &topic });
                }
                let since = since.as_deref().map_or(Since::Now, Since::Id);
                let Some(sub) = self.subscribe_conn(k, &[&topic], since) else {
                    return;
                };
                self.reply(k, &Reply::Subscribed { topic: &topic });
                let gaps: Vec<Arc<[u8]>> = sub
                    .gaps
                    .iter()
                    .map(|g| encode_frame(OpCode::Text, g.json().as_bytes()).into())
                    .collect();
                let mut frames: Vec<&Arc<[u8]>> = gaps.iter().collect();
                frames.extend(sub.replay.iter().map(|m| m.encoded(Encoding::WsEnvelope)));
                if !frames.is_empty() {
                    self.write_all_to(k, &frames, None);
                    self.tally.delivered += sub.replay.len() as u64;
                }
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
                let (kind, payload) = match control::decode_data(&data, encoding.as_deref()) {
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
                let receipts = self.shared.broker.publish(&[Outgoing {
                    topic: &topic,
                    kind,
                    payload: &payload,
                    event: None,
                    attachment: None,
                }]);
                if let Some(r) = receipts.first() {
                    let reply = Reply::Published {
                        topic: &topic,
                        id: r.id.clone(),
                        subscribers: r.subscribers,
                    };
                    self.reply(k, &reply);
                }
            }
        }
    }

    /// Inflates a compressed message (RFC 7692) under the message size limit, and checks text
    /// is UTF-8. On failure the connection is closed (1009 over the limit, 1007 for corrupt
    /// data or text that is not UTF-8) and `None` returned.
    fn inflate(&mut self, k: u32, kind: DataKind, data: &[u8]) -> Option<Vec<u8>> {
        let ext = self.conns.get(k as usize)?.ext;
        let max = self.shared.config.max_message_size;
        let inflated = if ext.client_keeps_context() {
            // The client compresses with context: its window must outlive the message.
            let inf = self
                .inflaters
                .entry(k)
                .or_insert_with(|| Inflater::new(ext.client_window_bits()));
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
    fn compress_for(&mut self, k: u32, frame: &Arc<[u8]>, opcode: OpCode) -> Arc<[u8]> {
        let Some(conn) = self.conns.get(k as usize) else {
            return Arc::clone(frame);
        };
        if !conn.has(DEFLATE) {
            return Arc::clone(frame);
        }
        let ext = conn.ext;
        let settings = self.deflate_settings;
        if !ext.dedicated() || !self.may_dedicate(k) {
            let bits = if ext.small_server_window() { 9 } else { 15 };
            return compress_frame(frame, opcode, bits, &settings);
        }
        let payload = frame_payload(frame);
        if payload.len() < settings.threshold {
            return Arc::clone(frame);
        }
        let bits = if ext.small_server_window() {
            9
        } else {
            self.shared.config.compression_window_bits
        };
        let c = self
            .deflaters
            .entry(k)
            .or_insert_with(|| Compressor::new(settings.level, bits, 8));
        // Sent compressed even when it does not shrink: the context now holds it.
        let z = c.compress(payload);
        encode_compressed_frame(opcode, &z).into()
    }

    /// Whether connection `k` has, or may get, a dedicated compressor: this worker's share of
    /// `compression_dedicated_limit` bounds their memory. Past it, connections get the shared
    /// frames, which is always allowed (a compressor may ignore its context).
    fn may_dedicate(&self, k: u32) -> bool {
        let workers = self.shared.config.worker_count().max(1);
        let share = self
            .shared
            .config
            .compression_dedicated_limit
            .div_ceil(workers);
        self.deflaters.contains_key(&k) || self.deflaters.len() < share
    }

    fn reply(&mut self, k: u32, reply: &Reply<'_>) {
        let frame = encode_frame(OpCode::Text, reply.to_json().as_bytes());
        self.send(k, &Arc::from(frame));
    }

    /// Subscribes connection `k` to `topics` (valid, new for it) and returns what it missed
    /// since `since`, for the caller to send in its transport's format. `None` when the
    /// connection went away meanwhile.
    ///
    /// Messages already waiting in this worker's inbox were published before the subscription:
    /// they go to the other subscribers first, before `k` joins the index, so `k` never gets a
    /// message twice (once replayed, once live).
    pub(super) fn subscribe_conn(
        &mut self,
        k: u32,
        topics: &[&str],
        since: Since<'_>,
    ) -> Option<Subscribed> {
        let mut pending = Vec::new();
        let sub = self
            .shared
            .broker
            .subscribe(self.id, topics, since, &mut pending);
        if !pending.is_empty() {
            self.deliver_batch(&mut pending);
        }
        let alive = self
            .conns
            .get(k as usize)
            .is_some_and(|c| !matches!(c.state, State::Closing | State::Http));
        if !alive {
            for name in &sub.names {
                self.shared.broker.unsubscribe(self.id, name);
            }
            return None;
        }
        for name in &sub.names {
            let tid = self.index.add(Arc::clone(name), k);
            if let Some(conn) = self.conns.get_mut(k as usize) {
                conn.subs.push(tid);
            }
        }
        Some(sub)
    }

    /// The index id of topic `name` if connection `k` subscribes to it.
    pub(super) fn subscription(&self, k: u32, name: &str) -> Option<u32> {
        let tid = self.index.id_of(name)?;
        let conn = self.conns.get(k as usize)?;
        conn.subs.contains(tid).then_some(tid)
    }

    pub(super) fn unsubscribe(&mut self, k: u32, tid: u32) {
        if let Some(conn) = self.conns.get_mut(k as usize) {
            conn.subs.remove(tid);
        }
        if let Some(name) = self.index.remove(tid, k) {
            self.shared.broker.unsubscribe(self.id, &name);
        }
    }

    /// Writes every message waiting in the inbox to its local subscribers.
    pub(super) fn drain_inbox(&mut self) {
        let mut batch = std::mem::take(&mut self.spare);
        self.inbox.take(&mut batch);
        if !batch.is_empty() {
            self.deliver_batch(&mut batch);
        }
        self.spare = batch;
    }

    /// Delivers `batch` (in publish order) to local subscribers and empties it. A single message
    /// is written straight away; a run of messages to one topic goes to each subscriber in one
    /// `writev`. Held long-polls are answered with the whole run.
    pub(super) fn deliver_batch(&mut self, batch: &mut Vec<Arc<Published>>) {
        // Runs are taken in publish order, so a subscriber of several topics still receives
        // everything in order.
        let mut targets: Vec<u32> = Vec::new();
        let mut polls: Vec<u32> = Vec::new();
        let mut frames: Vec<&Arc<[u8]>> = Vec::new();
        for run in batch.chunk_by(|a, b| a.topic == b.topic) {
            let Some(first) = run.first() else { continue };
            targets.clear();
            targets.extend_from_slice(self.index.subscribers(&first.topic));
            for &k in &targets {
                let dedicated = self
                    .conns
                    .get(k as usize)
                    .is_some_and(|c| c.has(DEFLATE) && c.ext.dedicated())
                    && self.may_dedicate(k);
                let Some(conn) = self.conns.get_mut(k as usize) else {
                    continue;
                };
                if conn.has(GRIP) {
                    self.deliver_grip(k, run);
                    continue;
                }
                let envelope = conn.has(ENVELOPE);
                let form = match conn.state {
                    State::Ws if dedicated => Form::Dedicated { envelope },
                    State::Ws if conn.has(DEFLATE) => Form::Deflated {
                        envelope,
                        small_window: conn.ext.small_server_window(),
                    },
                    State::Ws if envelope => Form::Shared(Encoding::WsEnvelope),
                    State::Ws => Form::Frame,
                    State::Sse if conn.has(JSON) => Form::Shared(Encoding::SseJson),
                    State::Sse => Form::Shared(Encoding::Sse),
                    State::Stream if conn.has(RAW) => Form::Shared(Encoding::RawChunk),
                    State::Stream => Form::Shared(Encoding::NdjsonChunk),
                    State::Poll => {
                        polls.push(k);
                        continue;
                    }
                    State::Http | State::Proxy | State::Closing => continue,
                };
                if conn.state != State::Ws {
                    // Output counts as activity for the keep-alive timer of HTTP streams.
                    conn.last_seen = self.now;
                }
                let settings = self.deflate_settings;
                if let Form::Dedicated { envelope } = form {
                    // Compressed for this connection alone, in order, with its own context.
                    let own: Vec<Arc<[u8]>> = run
                        .iter()
                        .map(|m| {
                            let (base, op) = if envelope {
                                (m.encoded(Encoding::WsEnvelope), OpCode::Text)
                            } else {
                                (&m.frame, opcode_of(m.kind))
                            };
                            self.compress_for(k, base, op)
                        })
                        .collect();
                    let refs: Vec<&Arc<[u8]>> = own.iter().collect();
                    self.deliver_all(k, &refs);
                } else if let [msg] = run {
                    self.deliver(k, pick(msg, form, &settings));
                } else {
                    frames.clear();
                    frames.extend(run.iter().map(|m| pick(m, form, &settings)));
                    self.deliver_all(k, &frames);
                }
                self.tally.delivered += run.len() as u64;
            }
            if !polls.is_empty() {
                let cursor = run.last().map(|m| m.id_string()).unwrap_or_default();
                let body: Arc<[u8]> =
                    super::http::messages_body(run.iter().map(|m| m.json()), &cursor, &[]).into();
                for k in polls.drain(..) {
                    self.answer_poll(k, &body);
                    self.tally.delivered += run.len() as u64;
                }
            }
        }
        batch.clear();
    }
}

/// What a subscriber gets of each message.
#[derive(Clone, Copy)]
enum Form {
    /// The plain WebSocket frame.
    Frame,
    /// One of the shared encodings.
    Shared(Encoding),
    /// The shared permessage-deflate frame (of the payload, or of the envelope).
    Deflated { envelope: bool, small_window: bool },
    /// Compressed for this connection alone (dedicated mode).
    Dedicated { envelope: bool },
}

/// The shared bytes of `m` a subscriber gets (every form but `Dedicated`, which is per
/// connection and handled by the caller).
fn pick<'m>(m: &'m Published, form: Form, settings: &DeflateSettings) -> &'m Arc<[u8]> {
    match form {
        Form::Frame | Form::Dedicated { .. } => &m.frame,
        Form::Shared(e) => m.encoded(e),
        Form::Deflated {
            envelope,
            small_window,
        } => m.deflated(envelope, small_window, settings),
    }
}

fn opcode_of(kind: DataKind) -> OpCode {
    match kind {
        DataKind::Text => OpCode::Text,
        DataKind::Binary => OpCode::Binary,
    }
}
