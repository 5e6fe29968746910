//! The transport seam: how a connection frames what the server tells it, decided in this one
//! place. [`Framing::of`] is the one dispatch over a connection's state; each transport has one
//! arm in each decision below (what a message is sent as, how a typed event is framed, whether
//! output counts as activity, how the connection ends). The features (fan-out, presence, token
//! expiry, resumes, shutdown) name an [`Event`] or an [`End`], never a transport: adding a
//! transport is its file, a [`super::super::state::State`] variant, a [`Framing`] variant and
//! its arms here.
//!
//! Events that later features add (another framing of messages, delta or conflated frames,
//! appended content) are new [`Event`] variants with one arm per transport in [`Framing::frame`].
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::pusher::code::ErrorCode;
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::{CloseCode, DataKind, OpCode};
use clarion_proto::{http1, sse};

use crate::auth::Refusal;
use crate::log;
use crate::message::{DeflateSettings, Encoding, Published, PusherForm};
use crate::metrics::CloseReason;
use crate::worker::frames::Frames;
use crate::worker::socket::Socket;
use crate::worker::state::{PollMode, SseMode, State, StreamMode, WsMode, WsRole};
use crate::worker::Engine;

/// Close code of a WebSocket whose token expired without a `refresh`.
pub const CLOSE_TOKEN_EXPIRED: u16 = 4001;
/// Close code of a WebSocket that did not authenticate in time (anonymous not allowed).
pub const CLOSE_AUTH_REQUIRED: u16 = 4002;

/// How a connection in some state takes what the server tells it: the transport, with the
/// options that change the framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// An open WebSocket of ours (not bridged): frames.
    Ws(WsMode),
    /// A WebSocket speaking the Pusher Channels protocol (`super::pusher`): messages as
    /// Pusher channel events, its own pings and errors.
    Pusher(WsMode),
    /// A Server-Sent Events stream: events.
    Sse(SseMode),
    /// A chunked stream of lines: NDJSON (`raw` false) or raw payload lines.
    Lines {
        /// `format=raw`: payload lines, no JSON envelope.
        raw: bool,
    },
    /// A held long-poll: answered once, with the whole run (`super::poll`).
    Poll(PollMode),
    /// Held by a GRIP backend (a held stream or long-poll, a bridged WebSocket): takes the
    /// content published to its channels (`crate::worker::grip::hold`), nothing else.
    Grip,
    /// An HTTP/2 connection: its streams are records of their own, each with its framing.
    H2,
    /// No response stream: reading a request, or waiting for a GRIP backend's answer.
    Request,
    /// Closing: takes nothing more.
    Closing,
}

/// What the server tells a connection besides published messages.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event<'a> {
    /// A typed JSON message (`{"type":kind,...}`): a presence member list or join/leave
    /// event, a gap notice on a resume. WebSocket: a text frame; SSE: an event named `kind`
    /// without an id; lines: a JSON line.
    Typed {
        /// The message's type, SSE's event name.
        kind: &'a str,
        /// The whole JSON message.
        json: &'a str,
    },
    /// Told to a slow subscriber of a conflating topic before a message that replaced
    /// `skipped` older ones of its key (`{"type":"conflated","topic":..,"skipped":N}`).
    /// WebSocket: a text frame; SSE: an event named `conflated` without an id; lines: a JSON
    /// line.
    Conflated {
        /// The topic.
        topic: &'a str,
        /// Messages the next one replaced.
        skipped: u64,
    },
}

/// Why a connection ends at the server's initiative, each transport ending it its own way.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    /// Its token (or a `connect` hook's grant) expired; `pending`: it never authenticated.
    TokenExpired {
        /// A WebSocket that was still to send its token (`auth_timeout`).
        pending: bool,
    },
    /// It does not read what it is sent: `pending` bytes wait, past the slow-consumer cap.
    SlowConsumer {
        /// The unsent bytes, for the log line.
        pending: usize,
    },
    /// Its state's deadline passed (`State::due`); `partial`: part of a request head arrived.
    Timeout {
        /// What the close is counted as (idle, handshake, ...).
        reason: CloseReason,
        /// Bytes of an unfinished request head are waiting.
        partial: bool,
    },
    /// The server stops or restarts (`restart`: a new process takes over, come back soon).
    Shutdown {
        /// A hand-over or restart, rather than a stop.
        restart: bool,
    },
}

/// What a delivery of published messages does with one subscriber.
#[derive(Clone, Copy)]
pub(crate) enum Delivery {
    /// Write each message in this form.
    Write(Form),
    /// A held long-poll: answered with the whole run.
    Answer,
    /// GRIP-held: gets its channels' content (`crate::worker::grip::hold`).
    Grip,
    /// Not a subscriber.
    Skip,
}

/// What a subscriber gets of each message.
#[derive(Clone, Copy)]
pub(crate) enum Form {
    /// The plain WebSocket frame.
    Frame,
    /// One of the shared encodings.
    Shared(Encoding),
    /// The shared permessage-deflate frame (of the payload, or of the envelope).
    Deflated { envelope: bool, small_window: bool },
    /// Compressed for this connection alone (dedicated mode).
    Dedicated { envelope: bool },
    /// A Pusher channel event, shared by the Pusher connections of that form.
    Pusher(PusherForm),
}

/// How a Pusher WebSocket of `mode` takes channel events: with ids when it asked for Clarion's
/// resume extension; compressed (shared, once per message and window, as `clarion.v1` is) when
/// it agreed permessage-deflate. Not in dedicated mode: its own messages are compressed with a
/// context the client's window mirrors, which a shared frame in between would break, so
/// published messages stay uncompressed there (RFC 7692 lets each message choose).
pub(crate) fn pusher_form(mode: WsMode) -> PusherForm {
    PusherForm {
        ids: mode.role == WsRole::PusherResume,
        deflate: mode
            .deflate
            .filter(|ext| !ext.dedicated())
            .map(|ext| ext.small_server_window()),
    }
}

impl Framing {
    /// The one dispatch over a connection's state for framing.
    pub(crate) fn of(state: State) -> Framing {
        if state.grip_held() {
            Framing::Grip
        } else {
            Framing::of_transport(state)
        }
    }

    /// The framing of `state`'s transport, GRIP-held or not (a hold's grant ends, and a
    /// bridged WebSocket is warned, as any connection of its transport).
    pub(crate) fn of_transport(state: State) -> Framing {
        match state {
            State::Ws(mode) => match mode.role {
                WsRole::Pusher | WsRole::PusherResume => Framing::Pusher(mode),
                WsRole::PubSub | WsRole::Envelope | WsRole::Echo | WsRole::Bridge => {
                    Framing::Ws(mode)
                }
            },
            State::Sse(mode) => Framing::Sse(mode),
            State::Stream(StreamMode::Ndjson | StreamMode::Grip { .. }) => {
                Framing::Lines { raw: false }
            }
            State::Stream(StreamMode::Raw) => Framing::Lines { raw: true },
            State::Poll(mode) => Framing::Poll(mode),
            State::H2 => Framing::H2,
            State::Http | State::Proxy => Framing::Request,
            State::Closing { .. } => Framing::Closing,
        }
    }

    /// What a delivery of published messages does; `dedicated`: this WebSocket may have its
    /// messages compressed for it alone.
    pub(crate) fn delivery(self, dedicated: bool) -> Delivery {
        match self {
            Framing::Ws(mode) => {
                let envelope = mode.role == WsRole::Envelope;
                Delivery::Write(match mode.deflate {
                    Some(_) if dedicated => Form::Dedicated { envelope },
                    Some(ext) => Form::Deflated {
                        envelope,
                        small_window: ext.small_server_window(),
                    },
                    None if envelope => Form::Shared(Encoding::WsEnvelope),
                    None => Form::Frame,
                })
            }
            Framing::Sse(_) | Framing::Lines { .. } => match self.encoding() {
                Some(e) => Delivery::Write(Form::Shared(e)),
                None => Delivery::Skip,
            },
            Framing::Pusher(mode) => Delivery::Write(Form::Pusher(pusher_form(mode))),
            Framing::Poll(_) => Delivery::Answer,
            Framing::Grip => Delivery::Grip,
            Framing::H2 | Framing::Request | Framing::Closing => Delivery::Skip,
        }
    }

    /// The shared encoding of published messages on an HTTP stream (its replay and its live
    /// messages); `None` for a connection whose messages are not one of them.
    pub(crate) fn encoding(self) -> Option<Encoding> {
        match self {
            Framing::Sse(SseMode::Payload) => Some(Encoding::Sse),
            Framing::Sse(SseMode::Json) => Some(Encoding::SseJson),
            Framing::Lines { raw: false } => Some(Encoding::NdjsonChunk),
            Framing::Lines { raw: true } => Some(Encoding::RawChunk),
            Framing::Ws(_)
            | Framing::Pusher(_)
            | Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => None,
        }
    }

    /// The form of the messages a `clarion.v1` WebSocket is replayed when it subscribes or
    /// resumes: the envelope, compressed once per message and window as its live messages
    /// are when it agreed permessage-deflate without context (a resume after a long answer
    /// is mostly text, which deflate shrinks); uncompressed with a context of its own, which
    /// only its live messages feed (RFC 7692 lets each message choose). Other framings: the
    /// uncompressed envelope.
    pub(crate) fn replay_form(self) -> Form {
        match self {
            Framing::Ws(mode) => match mode.deflate {
                Some(ext) if !ext.dedicated() => Form::Deflated {
                    envelope: true,
                    small_window: ext.small_server_window(),
                },
                Some(_) | None => Form::Shared(Encoding::WsEnvelope),
            },
            Framing::Sse(_)
            | Framing::Lines { .. }
            | Framing::Pusher(_)
            | Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => Form::Shared(Encoding::WsEnvelope),
        }
    }

    /// The form of a presence event ([`crate::message::Published::presence`], already
    /// encoded once for every listener); `None` for a connection that does not take them.
    pub(crate) fn presence_form(self) -> Option<Form> {
        match self {
            // Compressed once per event and window for every WebSocket that agreed
            // permessage-deflate without context; one whose compression keeps context gets the
            // event uncompressed (a shared frame would break the window its client mirrors).
            Framing::Ws(mode) => Some(match mode.deflate {
                Some(ext) if !ext.dedicated() => Form::Deflated {
                    envelope: false,
                    small_window: ext.small_server_window(),
                },
                Some(_) | None => Form::Frame,
            }),
            // Presence events are typed: SSE names them, whatever the data format.
            Framing::Sse(_) => Some(Form::Shared(Encoding::Sse)),
            Framing::Lines { .. } => Some(Form::Shared(Encoding::NdjsonChunk)),
            // Pusher's form of a join or leave: `pusher_internal:member_added`/`_removed`,
            // compressed as its channel events are (a presence event never carries an id).
            Framing::Pusher(mode) => Some(Form::Pusher(pusher_form(mode))),
            Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => None,
        }
    }

    /// Whether a connection framed so is a member of the rooms it subscribes to: WebSockets
    /// of ours and streams, not long-polls (between requests they are not connected), not
    /// GRIP connections.
    pub(crate) fn joins_rooms(self) -> bool {
        match self {
            Framing::Ws(mode) => match mode.role {
                WsRole::PubSub | WsRole::Envelope => true,
                WsRole::Echo | WsRole::Bridge | WsRole::Pusher | WsRole::PusherResume => false,
            },
            // Pusher connections are members of their `presence-` channels.
            Framing::Sse(_) | Framing::Lines { .. } | Framing::Pusher(_) => true,
            Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => false,
        }
    }

    /// Whether it takes in-band replies (`clarion.v1` control messages: expiry warnings,
    /// answers to requests): WebSockets.
    pub(crate) fn in_band(self) -> bool {
        match self {
            Framing::Ws(_) => true,
            Framing::Pusher(_)
            | Framing::Sse(_)
            | Framing::Lines { .. }
            | Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => false,
        }
    }

    /// Whether its unsent bytes are capped (`max_backlog`): subscribers, and an HTTP/2
    /// connection (whose control answers pile up when the client does not read).
    pub(crate) fn caps_backlog(self) -> bool {
        match self {
            Framing::Ws(_)
            | Framing::Pusher(_)
            | Framing::Sse(_)
            | Framing::Lines { .. }
            | Framing::H2 => true,
            Framing::Poll(_) | Framing::Grip | Framing::Request | Framing::Closing => false,
        }
    }

    /// The transport's name in webhooks' `connected` events; `None` for a connection that is
    /// not reported (a long-poll is a request, not a connection).
    pub(crate) fn hook_name(self) -> Option<&'static str> {
        match self {
            Framing::Ws(_) => Some("ws"),
            Framing::Pusher(_) => Some("pusher"),
            Framing::Sse(_) => Some("sse"),
            Framing::Lines { .. } => Some("stream"),
            Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => None,
        }
    }

    /// The keep-alive an idle HTTP stream is sent (`State::due`'s `KeepAlive`): an SSE
    /// comment, an empty line; `None` for a transport that keeps alive otherwise.
    pub(crate) fn keep_alive(self, frames: &Frames) -> Option<&Arc<[u8]>> {
        match self {
            Framing::Sse(_) => Some(&frames.sse_keepalive),
            Framing::Lines { .. } => Some(&frames.stream_keepalive),
            Framing::Ws(_)
            | Framing::Pusher(_)
            | Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => None,
        }
    }

    /// Whether output to it counts as activity for its timeout (HTTP streams' keep-alive);
    /// a WebSocket's activity is what it reads.
    pub(crate) fn output_is_activity(self) -> bool {
        match self {
            Framing::Ws(_) | Framing::Pusher(_) => false,
            Framing::Sse(_)
            | Framing::Lines { .. }
            | Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => true,
        }
    }

    /// `event` framed for this connection, appended to `out`; `false` (nothing written) for
    /// a connection that does not take it.
    pub(crate) fn frame(self, event: Event<'_>, out: &mut Vec<u8>) -> bool {
        match event {
            Event::Conflated { topic, skipped } => {
                let json =
                    serde_json::json!({"type": "conflated", "topic": topic, "skipped": skipped})
                        .to_string();
                return self.frame(
                    Event::Typed {
                        kind: "conflated",
                        json: &json,
                    },
                    out,
                );
            }
            Event::Typed { kind, json } => match self {
                Framing::Ws(_) => {
                    out.extend_from_slice(&encode_frame(OpCode::Text, json.as_bytes()))
                }
                Framing::Sse(_) => sse::write_event(out, None, Some(kind), json.as_bytes()),
                Framing::Lines { .. } => http1::write_chunk(out, format!("{json}\n").as_bytes()),
                // Clarion's typed events (gap notices, presence) have no Pusher form.
                Framing::Pusher(_)
                | Framing::Poll(_)
                | Framing::Grip
                | Framing::H2
                | Framing::Request
                | Framing::Closing => return false,
            },
        }
        true
    }

    /// [`Framing::frame`] as one shared buffer, `None` when the connection does not take it.
    pub(crate) fn framed(self, event: Event<'_>) -> Option<Arc<[u8]>> {
        let mut out = Vec::new();
        self.frame(event, &mut out).then(|| out.into())
    }
}

/// The shared bytes of `m` a subscriber gets (every form but `Dedicated`, which is per
/// connection and handled by the caller).
pub(crate) fn pick<'m>(m: &'m Published, form: Form, settings: &DeflateSettings) -> &'m Arc<[u8]> {
    match form {
        Form::Frame | Form::Dedicated { .. } => &m.frame,
        Form::Shared(e) => m.encoded(e),
        Form::Deflated {
            envelope,
            small_window,
        } => m.deflated(envelope, small_window, settings),
        Form::Pusher(form) => m.pusher(form, settings),
    }
}

pub(crate) fn opcode_of(kind: DataKind) -> OpCode {
    match kind {
        DataKind::Text => OpCode::Text,
        DataKind::Binary => OpCode::Binary,
    }
}

impl<S: Socket> Engine<S> {
    /// The framing of connection `k` now ([`Framing::Closing`] for a gone one).
    pub(crate) fn framing(&self, k: u32) -> Framing {
        self.conns
            .get(k as usize)
            .map_or(Framing::Closing, |c| Framing::of(c.state))
    }

    /// [`Framing::of_transport`] of connection `k` now.
    pub(crate) fn framing_of_transport(&self, k: u32) -> Framing {
        self.conns
            .get(k as usize)
            .map_or(Framing::Closing, |c| Framing::of_transport(c.state))
    }

    /// Tells connection `k` that it could not be subscribed (to `topic`, first of its topics)
    /// because the broker is unavailable (`error` says why): in-band, an error reply; an SSE
    /// request, a `200` stream that says when to come back (a browser's `EventSource` gives
    /// up on any other status); any other request, `503` with `Retry-After`.
    pub(crate) fn tell_unavailable(
        &mut self,
        k: u32,
        error: &str,
        topic: Option<&str>,
        in_band: bool,
    ) {
        if in_band {
            let reply = clarion_proto::pubsub::Reply::Error { error, topic };
            return self.reply(k, &reply);
        }
        match self.framing_of_transport(k) {
            Framing::Sse(_) => self.sse_unavailable(k, error),
            Framing::Pusher(_) => self.pusher_unavailable(k, error, topic),
            Framing::Ws(_)
            | Framing::Lines { .. }
            | Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => self.respond(k, 503, &[("Retry-After", "5")], error, false),
        }
    }

    /// Ends connection `k` (in `state`) for `why`, the way its transport tells the client:
    /// the one dispatch for server-initiated ends.
    pub(crate) fn end_as(&mut self, k: u32, state: State, why: End) {
        // A GRIP hold ends at shutdown as its backend asked; a hold's expired grant ends it as
        // its transport ends any connection.
        let framing = match why {
            End::Shutdown { .. } => Framing::of(state),
            End::TokenExpired { .. } | End::SlowConsumer { .. } | End::Timeout { .. } => {
                Framing::of_transport(state)
            }
        };
        match (framing, why) {
            (Framing::Grip, End::Shutdown { .. }) => self.grip_shutdown(k),
            // Pusher's close codes tell pusher-js what to do: 4200 reconnect at once (a restart
            // or a stop: another process or node takes it), 4100 after a while (it did not
            // read), 4201 (no pong), 4009 (no longer authorized).
            (Framing::Pusher(_), End::Shutdown { .. }) => {
                self.pusher_close(k, ErrorCode::ReconnectNow, CloseReason::Shutdown);
            }
            (Framing::Pusher(_), End::SlowConsumer { pending }) => {
                log::debug(format_args!("pusher slow consumer: {pending} bytes unsent"));
                // The Close alone (pusher-js acts on its code): a `pusher:error` first would be
                // one more write over the cap, which ends the connection again, and again.
                let code = ErrorCode::OverCapacity;
                self.close_ws(
                    k,
                    CloseCode::Other(code.code()),
                    code.message(),
                    CloseReason::SlowConsumer,
                );
            }
            (Framing::Pusher(_), End::Timeout { reason, .. }) => {
                self.pusher_close(k, ErrorCode::PongNotReceived, reason);
            }
            (Framing::Pusher(_), End::TokenExpired { .. }) => {
                self.pusher_close(k, ErrorCode::Unauthorized, CloseReason::TokenExpired);
            }
            (Framing::Ws(_), End::TokenExpired { pending: true }) => self.close_ws(
                k,
                CloseCode::Other(CLOSE_AUTH_REQUIRED),
                "authentication required",
                CloseReason::TokenExpired,
            ),
            (Framing::Ws(_), End::TokenExpired { pending: false }) => self.close_ws(
                k,
                CloseCode::Other(CLOSE_TOKEN_EXPIRED),
                "token expired",
                CloseReason::TokenExpired,
            ),
            (Framing::Ws(_), End::Shutdown { restart: true }) => self.close_ws(
                k,
                CloseCode::ServiceRestart,
                "service restart",
                CloseReason::Shutdown,
            ),
            (Framing::Ws(_), End::Shutdown { restart: false }) => self.close_ws(
                k,
                CloseCode::GoingAway,
                "server shutting down",
                CloseReason::Shutdown,
            ),
            (Framing::Sse(_), End::TokenExpired { .. }) => {
                let mut out = Vec::new();
                let data = br#"{"error":"token expired"}"#;
                sse::write_event(&mut out, None, Some("expired"), data);
                self.start_closing(k, Some(out.into()), CloseReason::TokenExpired);
            }
            // The client reconnects (EventSource does so by itself) and resumes by id; on a
            // restart, soon and not all at once: 1 to 3 s, at random.
            (Framing::Sse(_), End::Shutdown { restart: true }) => {
                let mut out = Vec::new();
                sse::write_retry(&mut out, jittered_ms(1000, 2000));
                self.start_closing(k, Some(Arc::from(out)), CloseReason::Shutdown);
            }
            (Framing::Sse(_), End::Shutdown { restart: false }) => {
                self.start_closing(k, None, CloseReason::Shutdown);
            }
            (Framing::Lines { .. }, End::TokenExpired { .. }) => {
                let mut out = Vec::new();
                http1::write_chunk(&mut out, b"{\"type\":\"expired\"}\n");
                out.extend_from_slice(http1::LAST_CHUNK);
                self.start_closing(k, Some(out.into()), CloseReason::TokenExpired);
            }
            (Framing::Lines { .. }, End::Shutdown { .. }) => {
                let last: Arc<[u8]> = Arc::from(http1::LAST_CHUNK);
                self.start_closing(k, Some(last), CloseReason::Shutdown);
            }
            (Framing::Poll(mode), End::TokenExpired { .. }) => {
                self.leave_all_topics(k);
                self.side.polls_mut().remove(&k);
                self.set_state(k, State::Http);
                let expired = Refusal::token(clarion_proto::auth::TokenError::Expired);
                self.refuse_http(k, expired, mode.keep);
            }
            (Framing::Poll(_), End::Shutdown { .. }) => self.answer_poll_empty(k),
            (Framing::Ws(_), End::SlowConsumer { pending }) => {
                log::debug(format_args!("slow consumer: {pending} bytes unsent"));
                self.close_ws(
                    k,
                    CloseCode::Policy,
                    "slow consumer",
                    CloseReason::SlowConsumer,
                );
            }
            // No way to say why in-band without breaking the stream's framing: close it after
            // the message in flight; the client reconnects and resumes by id.
            (Framing::Sse(_) | Framing::Lines { .. }, End::SlowConsumer { pending }) => {
                log::debug(format_args!("slow consumer: {pending} bytes unsent"));
                self.start_closing(k, None, CloseReason::SlowConsumer);
            }
            // Its control answers pile up: the client does not read (a PING or SETTINGS flood,
            // or a dead peer).
            (Framing::H2, End::SlowConsumer { pending }) => {
                log::debug(format_args!(
                    "HTTP/2 connection not reading: {pending} bytes unsent"
                ));
                self.start_closing(k, None, CloseReason::SlowConsumer);
            }
            (Framing::Ws(_), End::Timeout { reason, .. }) => {
                log::debug(format_args!("idle timeout"));
                self.close_ws(k, CloseCode::GoingAway, "idle timeout", reason);
            }
            // Part of a request head arrived, but not all of it in time: say so.
            (Framing::Request, End::Timeout { reason, partial: true }) if state == State::Http => {
                self.shared.metrics.http_errors.fetch_add(1, Relaxed);
                log::debug(format_args!("request head timed out"));
                let mut out = Vec::with_capacity(128);
                let body = "request head not received in time\n";
                http1::write_response_head(
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
            (
                Framing::Sse(_)
                | Framing::Lines { .. }
                | Framing::Poll(_)
                | Framing::Grip
                | Framing::H2
                | Framing::Request
                | Framing::Closing,
                End::Timeout { reason, .. },
            ) => self.drop_conn(k, reason),
            (Framing::Request, End::Shutdown { .. }) => self.drop_conn(k, CloseReason::Shutdown),
            // GOAWAY now; the connection closes once its streams (told first) have.
            (Framing::H2, End::Shutdown { .. }) => self.h2_go_away(k),
            // `of_transport` never says `Grip`; the others hold no grant or are ending already.
            (
                Framing::Grip | Framing::H2 | Framing::Request | Framing::Closing,
                End::TokenExpired { .. },
            )
            | (Framing::Closing, End::Shutdown { .. })
            // Not capped (see `caps_backlog`).
            | (
                Framing::Poll(_) | Framing::Grip | Framing::Request | Framing::Closing,
                End::SlowConsumer { .. },
            ) => {}
        }
    }
}

/// A `retry:` of `min` to `min + spread` ms at random, so that the clients told to come back
/// at the same moment do not all come back at the same moment (5 s ± 1 s for an SSE answer
/// that could not be subscribed, 1 to 3 s on a restart).
pub(crate) fn jittered_ms(min: u64, spread: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // Every RandomState has fresh keys: a hash of nothing is a cheap random number.
    let h = std::collections::hash_map::RandomState::new().build_hasher();
    min + h.finish() % (spread + 1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{Event, Framing};
    use crate::worker::state::{PollMode, SseMode, State, StreamMode, WsMode, WsRole};

    fn typed(f: Framing) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let json = r#"{"type":"gap"}"#;
        f.frame(Event::Typed { kind: "gap", json }, &mut out)
            .then_some(out)
    }

    #[test]
    fn a_typed_event_is_framed_by_each_transport_its_own_way() {
        let ws = typed(Framing::Ws(WsMode::new(WsRole::PubSub))).unwrap();
        // An unmasked text frame, FIN set, holding the JSON.
        assert_eq!(ws[0], 0x81);
        assert!(ws.ends_with(br#"{"type":"gap"}"#));
        let sse = typed(Framing::Sse(SseMode::Json)).unwrap();
        assert_eq!(sse, b"event: gap\ndata: {\"type\":\"gap\"}\n\n");
        let line = typed(Framing::Lines { raw: false }).unwrap();
        assert_eq!(line, b"f\r\n{\"type\":\"gap\"}\n\r\n");
        for none in [
            Framing::Poll(PollMode {
                keep: true,
                grip: false,
            }),
            Framing::Grip,
            Framing::H2,
            Framing::Request,
            Framing::Closing,
        ] {
            assert_eq!(typed(none), None, "{none:?}");
        }
    }

    #[test]
    fn grip_held_connections_take_only_their_content_but_end_as_their_transport() {
        let held = [
            State::Ws(WsMode::new(WsRole::Bridge)),
            State::Stream(StreamMode::Grip {
                chunked: true,
                keep: false,
            }),
            State::Poll(PollMode {
                keep: false,
                grip: true,
            }),
        ];
        for s in held {
            assert_eq!(Framing::of(s), Framing::Grip);
            assert_ne!(Framing::of_transport(s), Framing::Grip);
        }
        assert_eq!(
            Framing::of(State::Stream(StreamMode::Raw)),
            Framing::Lines { raw: true }
        );
    }
}
