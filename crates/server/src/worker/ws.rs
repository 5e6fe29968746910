//! WebSocket connections in the loop: frames in (through `clarion_proto`'s receiver), control
//! messages, echo, automatic pongs, the close handshake, and deliveries of published messages.

use std::sync::Arc;

use base64::Engine as _;
use clarion_proto::ws::close::encode_close_frame;
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::receiver::Limits;
use clarion_proto::ws::{CloseCode, DataKind, Event, OpCode};

use super::conn::{State, ECHO, ENVELOPE};
use super::Worker;
use crate::control::{self, Reply, Request};
use crate::hub::{validate_topic, Outgoing};
use crate::log;
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
        let Some(conn) = self.conns.get(k as usize) else {
            return;
        };
        match event {
            Event::Message { kind, payload } => {
                if conn.has(ECHO) {
                    let op = match kind {
                        DataKind::Text => OpCode::Text,
                        DataKind::Binary => OpCode::Binary,
                    };
                    self.send(k, &Arc::from(encode_frame(op, &payload)));
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
            Event::Ping(payload) => self.send(k, &Arc::from(encode_frame(OpCode::Pong, payload))),
            Event::Pong(_) => {}
            Event::Close(received) => {
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
                        error: &why,
                        topic: None,
                    },
                )
            }
        };
        match request {
            Request::Subscribe { topic } => {
                if let Err(e) = validate_topic(&topic) {
                    return self.reply(
                        k,
                        &Reply::Error {
                            error: &e.to_string(),
                            topic: None,
                        },
                    );
                }
                let already = self.index.id_of(&topic).is_some_and(|tid| {
                    self.conns
                        .get(k as usize)
                        .is_some_and(|c| c.subs.contains(tid))
                });
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
                if !already {
                    self.subscribe(k, &topic);
                }
                self.reply(k, &Reply::Subscribed { topic: &topic });
            }
            Request::Unsubscribe { topic } => {
                if let Some(tid) = self.index.id_of(&topic) {
                    let subscribed = self
                        .conns
                        .get(k as usize)
                        .is_some_and(|c| c.subs.contains(tid));
                    if subscribed {
                        self.unsubscribe(k, tid);
                    }
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
                let (kind, payload) = match encoding.as_deref() {
                    None => (DataKind::Text, data.as_bytes().to_vec()),
                    Some("base64") => {
                        match base64::engine::general_purpose::STANDARD.decode(&*data) {
                            Ok(bytes) => (DataKind::Binary, bytes),
                            Err(_) => {
                                let error = "data is not valid base64";
                                return self.reply(
                                    k,
                                    &Reply::Error {
                                        error,
                                        topic: Some(&topic),
                                    },
                                );
                            }
                        }
                    }
                    Some(_) => {
                        let error = "unknown encoding (only \"base64\" is defined)";
                        return self.reply(
                            k,
                            &Reply::Error {
                                error,
                                topic: Some(&topic),
                            },
                        );
                    }
                };
                let receipts = self.shared.hub.publish(&[Outgoing {
                    topic: &topic,
                    kind,
                    payload: &payload,
                }]);
                if let Some(r) = receipts.first() {
                    let reply = Reply::Published {
                        topic: &topic,
                        id: r.id.to_string(),
                        subscribers: r.subscribers,
                    };
                    self.reply(k, &reply);
                }
            }
        }
    }

    fn reply(&mut self, k: u32, reply: &Reply<'_>) {
        let frame = encode_frame(OpCode::Text, reply.to_json().as_bytes());
        self.send(k, &Arc::from(frame));
    }

    /// Subscribes connection `k` to `topic` (the caller checked it is valid and new).
    pub(super) fn subscribe(&mut self, k: u32, topic: &str) {
        if !self.conns.contains(k as usize) {
            return;
        }
        // The hub first: once it counts this worker, every later publish reaches the inbox.
        let name = self.shared.hub.subscribe(self.id, topic);
        let tid = self.index.add(name, k);
        if let Some(conn) = self.conns.get_mut(k as usize) {
            conn.subs.push(tid);
        }
    }

    fn unsubscribe(&mut self, k: u32, tid: u32) {
        if let Some(conn) = self.conns.get_mut(k as usize) {
            conn.subs.remove(tid);
        }
        if let Some(name) = self.index.remove(tid, k) {
            self.shared.hub.unsubscribe(self.id, &name);
        }
    }

    /// Writes every message waiting in the inbox to its local subscribers. A single message is
    /// written straight away; a burst is queued per connection and flushed with one `writev` each.
    pub(super) fn drain_inbox(&mut self) {
        let mut batch = std::mem::take(&mut self.spare);
        self.inbox.take(&mut batch);
        if batch.is_empty() {
            self.spare = batch;
            return;
        }
        // Consecutive messages to the same topic go out together: each subscriber gets the
        // whole run in one `writev`. Runs are taken in publish order, so a subscriber of
        // several topics still receives everything in order.
        let mut targets: Vec<u32> = Vec::new();
        let mut frames: Vec<&Arc<[u8]>> = Vec::new();
        for run in batch.chunk_by(|a, b| a.topic == b.topic) {
            let Some(first) = run.first() else { continue };
            targets.clear();
            targets.extend_from_slice(self.index.subscribers(&first.topic));
            for &k in &targets {
                let Some(conn) = self.conns.get(k as usize) else {
                    continue;
                };
                if conn.state != State::Ws {
                    continue;
                }
                let envelope = conn.has(ENVELOPE);
                if let [msg] = run {
                    let bytes = if envelope { msg.envelope() } else { &msg.frame };
                    self.deliver(k, bytes);
                } else {
                    frames.clear();
                    frames.extend(
                        run.iter()
                            .map(|m| if envelope { m.envelope() } else { &m.frame }),
                    );
                    self.deliver_all(k, &frames);
                }
                self.tally.delivered += run.len() as u64;
            }
        }
        drop(frames);
        batch.clear();
        self.spare = batch;
    }
}
