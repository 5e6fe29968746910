//! Where a connection is in its life and the flags that qualify that: plain values, with the
//! one deadline rule of each state ([`State::due`]) and the gauge that counts it. The moves
//! between states are `super::transitions`; what a transport sends in each state is decided by
//! that transport. This module names no other part of the worker, so every part may name it.
//!
//! Every decision over [`State`] and [`Kind`] names each variant: a new state stops the build
//! wherever something must be decided about it.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::AtomicU64;

use crate::config::limits::CLOSE_LINGER_SECS;
use crate::metrics::{CloseReason, Metrics};

/// Where a connection is in its life, with the options that only mean something there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Reading HTTP request heads (before an upgrade, or between keep-alive requests).
    Http,
    /// An open WebSocket.
    Ws(WsMode),
    /// A Server-Sent Events response being streamed.
    Sse(SseMode),
    /// A chunked (or, for GRIP and HTTP/1.0, close-delimited) response being streamed.
    Stream(StreamMode),
    /// A long-poll request held until a message arrives or its deadline passes.
    Poll(PollMode),
    /// An HTTP/2 connection: its streams are records of their own (see `super::h2`).
    H2,
    /// A request forwarded to a GRIP backend, waiting for its answer; the client's further
    /// bytes (a pipelined request) wait in `input`.
    Proxy,
    /// Our last bytes (a Close frame or a final HTTP answer) are queued; once they are written
    /// the write side is shut and we wait (bounded) for the peer's EOF, discarding its input, so
    /// that closing never resets a connection before the peer has read our answer.
    Closing {
        /// The write side has been shut down.
        write_shut: bool,
    },
}

/// A state without its options: what gauges count and what most checks compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// [`State::Http`].
    Http,
    /// [`State::Ws`].
    Ws,
    /// [`State::Sse`].
    Sse,
    /// [`State::Stream`].
    Stream,
    /// [`State::Poll`].
    Poll,
    /// [`State::Proxy`].
    Proxy,
    /// [`State::H2`].
    H2,
    /// [`State::Closing`].
    Closing,
}

/// What a WebSocket is for: the one place its messages and deliveries are dispatched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsRole {
    /// Pub/sub with control messages; deliveries are the raw payload.
    PubSub,
    /// Pub/sub under the `clarion.v1` subprotocol: deliveries use the JSON envelope.
    Envelope,
    /// The conformance endpoint: messages are echoed.
    Echo,
    /// Bridged to a GRIP backend with WebSocket-over-HTTP (`super::grip::bridge`).
    Bridge,
    /// The Pusher Channels protocol on `/app/{key}` (`super::transport::pusher`): its
    /// per-connection part is the side table's `pusher` entry.
    Pusher,
    /// A Pusher connection that asked for Clarion's resume extension (`"clarion_since"` in a
    /// subscribe): its channel events carry their id (`docs/pusher.md`).
    PusherResume,
}

/// A WebSocket's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WsMode {
    /// What it is for.
    pub role: WsRole,
    /// The permessage-deflate parameters, when compression was negotiated.
    pub deflate: Option<Ext>,
    /// A keep-alive ping was sent and no byte has arrived since.
    pub pinged: bool,
}

impl WsMode {
    /// A fresh WebSocket with `role`.
    pub fn new(role: WsRole) -> WsMode {
        WsMode {
            role,
            deflate: None,
            pinged: false,
        }
    }
}

/// What an SSE event's data carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseMode {
    /// The payload (`format=data`, the default).
    Payload,
    /// The JSON envelope (`format=json`).
    Json,
}

/// What a streamed response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    /// JSON envelope lines (the default).
    Ndjson,
    /// Raw payload lines (`format=raw`).
    Raw,
    /// Held by a GRIP backend: the `http-stream` content published to its channels.
    Grip {
        /// Chunked transfer coding (HTTP/1.1 client); otherwise delimited by closing.
        chunked: bool,
        /// The client allows keep-alive: a published `close` returns it to `Http`.
        keep: bool,
    },
}

/// A held long-poll's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollMode {
    /// The client allows keep-alive: the connection returns to `Http` after the answer.
    pub keep: bool,
    /// Held by a GRIP backend (`Grip-Hold: response`): answered by published `http-response`
    /// content or the backend's timeout answer.
    pub grip: bool,
}

impl State {
    /// The state without its options.
    pub fn kind(self) -> Kind {
        match self {
            State::Http => Kind::Http,
            State::Ws(_) => Kind::Ws,
            State::Sse(_) => Kind::Sse,
            State::Stream(_) => Kind::Stream,
            State::Poll(_) => Kind::Poll,
            State::Proxy => Kind::Proxy,
            State::H2 => Kind::H2,
            State::Closing { .. } => Kind::Closing,
        }
    }

    /// Whether a GRIP backend holds the connection (a held stream or long-poll, or a bridged
    /// WebSocket): counted by the `grip_holds` gauge.
    pub fn grip_held(self) -> bool {
        matches!(
            self,
            State::Ws(WsMode {
                role: WsRole::Bridge,
                ..
            }) | State::Stream(StreamMode::Grip { .. })
                | State::Poll(PollMode { grip: true, .. })
        )
    }

    /// Whether the connection is a subscriber of some transport (a WebSocket, a stream, a
    /// held poll), as opposed to a request in progress, a backend request or a closing one.
    pub fn subscribed(self) -> bool {
        matches!(
            self,
            State::Ws(_) | State::Sse(_) | State::Stream(_) | State::Poll(_)
        )
    }

    /// The WebSocket options, in `Ws`.
    pub fn ws(self) -> Option<WsMode> {
        match self {
            State::Ws(m) => Some(m),
            State::Http
            | State::Sse(_)
            | State::Stream(_)
            | State::Poll(_)
            | State::H2
            | State::Proxy
            | State::Closing { .. } => None,
        }
    }

    /// What the once-a-second sweep owes a connection in this state that has been quiet for
    /// `quiet` seconds: the one deadline rule of each state. States whose deadlines live in a
    /// side part (a held poll's, a GRIP hold's, an HTTP/2 connection's, a token's) say `None`
    /// here and are swept with that part (see `super::timers`).
    pub(crate) fn due(self, quiet: u32, limits: &Limits) -> Option<Due> {
        match self {
            State::Http => {
                (quiet >= limits.handshake).then_some(Due::Expire(CloseReason::HandshakeTimeout))
            }
            State::Ws(mode) => {
                if limits.idle > 0 && quiet >= limits.idle {
                    Some(Due::Expire(CloseReason::IdleTimeout))
                } else if limits.ping > 0 && quiet >= limits.ping && !mode.pinged {
                    Some(Due::Ping)
                } else {
                    None
                }
            }
            State::Sse(_) | State::Stream(StreamMode::Ndjson | StreamMode::Raw) => {
                (limits.keepalive > 0 && quiet >= limits.keepalive).then_some(Due::KeepAlive)
            }
            // GRIP streams send the backend's keep-alives (the GRIP part's timers), never ours.
            State::Stream(StreamMode::Grip { .. }) => None,
            // A held poll's deadline is its hold's; a forwarded request's, its backend's; an
            // HTTP/2 connection's, its protocol state's.
            State::Poll(_) | State::Proxy | State::H2 => None,
            State::Closing { .. } => {
                (quiet >= CLOSE_LINGER_SECS).then_some(Due::Expire(CloseReason::Disconnected))
            }
        }
    }
}

/// The timeouts [`State::due`] compares a connection's quiet time with, in seconds (0: off).
pub(crate) struct Limits {
    /// A request head (or a TLS handshake) must arrive within this.
    pub(crate) handshake: u32,
    /// A WebSocket quiet this long is pinged.
    pub(crate) ping: u32,
    /// A WebSocket quiet this long is closed.
    pub(crate) idle: u32,
    /// An SSE or NDJSON stream quiet this long gets a keep-alive.
    pub(crate) keepalive: u32,
}

impl Limits {
    /// The limits `config` sets.
    pub(crate) fn of(config: &crate::config::Config) -> Limits {
        Limits {
            handshake: config.handshake_timeout as u32,
            ping: config.ping_interval as u32,
            idle: config.idle_timeout as u32,
            keepalive: config.sse_keepalive as u32,
        }
    }
}

/// What is due to one connection at a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// Its deadline passed: it ends, for this reason.
    Expire(CloseReason),
    /// A WebSocket keep-alive ping.
    Ping,
    /// An SSE comment or an empty NDJSON line.
    KeepAlive,
}

/// How a connection leaves: what `Engine::forget_side_state` ends with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// It starts closing (its last bytes are queued).
    Closing,
    /// It leaves the slab: an HTTP/2 stream record resets its stream if it had not ended.
    Gone,
    /// It is lifted out for a new process, which carries its HTTP/2 part.
    Moved,
}

/// The `clarion_connections` gauge that counts connections in `state` (none for `Closing`,
/// which has left the count already).
pub(crate) fn gauge(m: &Metrics, state: Kind) -> Option<&AtomicU64> {
    match state {
        Kind::Http | Kind::Proxy => Some(&m.http_connections),
        Kind::Ws => Some(&m.ws_connections),
        Kind::Sse => Some(&m.sse_connections),
        Kind::Stream => Some(&m.stream_connections),
        Kind::Poll => Some(&m.polls_held),
        Kind::H2 => Some(&m.h2_connections),
        Kind::Closing => None,
    }
}

/// The permessage-deflate parameters of one connection, packed into one byte so that
/// negotiating compression costs an idle connection nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ext(u8);

impl Ext {
    const WINDOW: u8 = 0b0000_0111;
    const CLIENT_CONTEXT: u8 = 0b0000_1000;
    const SMALL_SERVER_WINDOW: u8 = 0b0001_0000;
    const DEDICATED: u8 = 0b0010_0000;

    /// Packs what was agreed.
    pub fn new(a: &clarion_proto::ws::deflate::Agreed) -> Ext {
        let mut v = a.client_max_window_bits.clamp(8, 15) - 8;
        if !a.client_no_context_takeover {
            v |= Self::CLIENT_CONTEXT;
        }
        if a.server_max_window_bits < 15 {
            v |= Self::SMALL_SERVER_WINDOW;
        }
        if !a.server_no_context_takeover {
            v |= Self::DEDICATED;
        }
        Ext(v)
    }

    /// The packed byte, as a hand-over carries it.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Parameters from a packed byte (a hand-over's); bits this version does not define are
    /// dropped.
    pub fn from_bits(b: u8) -> Ext {
        Ext(b & (Self::WINDOW | Self::CLIENT_CONTEXT | Self::SMALL_SERVER_WINDOW | Self::DEDICATED))
    }

    /// The client's LZ77 window, 8 to 15 bits: what its inflater needs.
    pub fn client_window_bits(self) -> u8 {
        8 + (self.0 & Self::WINDOW)
    }

    /// The client compresses with context carried between messages: its inflater must live
    /// as long as the connection (once it sends a compressed message).
    pub fn client_keeps_context(self) -> bool {
        self.0 & Self::CLIENT_CONTEXT != 0
    }

    /// The client limited the server's window below 15 bits: use the 9-bit encodings, which are
    /// valid for any limit from 9 up.
    pub fn small_server_window(self) -> bool {
        self.0 & Self::SMALL_SERVER_WINDOW != 0
    }

    /// The server keeps compression context for this connection (dedicated mode).
    pub fn dedicated(self) -> bool {
        self.0 & Self::DEDICATED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        handshake: 10,
        ping: 20,
        idle: 60,
        keepalive: 15,
    };

    #[test]
    fn each_state_says_what_its_quiet_time_makes_due() {
        let ws = State::Ws(WsMode::new(WsRole::PubSub));
        let pinged = State::Ws(WsMode {
            pinged: true,
            ..WsMode::new(WsRole::PubSub)
        });
        let cases = [
            (State::Http, 9, None),
            (
                State::Http,
                10,
                Some(Due::Expire(CloseReason::HandshakeTimeout)),
            ),
            (ws, 19, None),
            (ws, 20, Some(Due::Ping)),
            (pinged, 20, None),
            (pinged, 60, Some(Due::Expire(CloseReason::IdleTimeout))),
            (State::Sse(SseMode::Json), 15, Some(Due::KeepAlive)),
            (State::Stream(StreamMode::Raw), 15, Some(Due::KeepAlive)),
            // The backend sends a GRIP stream's keep-alives; the side parts own these deadlines.
            (
                State::Stream(StreamMode::Grip {
                    chunked: true,
                    keep: false,
                }),
                1000,
                None,
            ),
            (
                State::Poll(PollMode {
                    keep: true,
                    grip: false,
                }),
                1000,
                None,
            ),
            (State::H2, 1000, None),
            (State::Proxy, 1000, None),
            (
                State::Closing { write_shut: true },
                CLOSE_LINGER_SECS - 1,
                None,
            ),
            (
                State::Closing { write_shut: true },
                CLOSE_LINGER_SECS,
                Some(Due::Expire(CloseReason::Disconnected)),
            ),
        ];
        for (state, quiet, due) in cases {
            assert_eq!(state.due(quiet, &LIMITS), due, "{state:?} quiet {quiet}s");
        }
    }

    #[test]
    fn a_limit_of_zero_is_off() {
        let off = Limits {
            handshake: 10,
            ping: 0,
            idle: 0,
            keepalive: 0,
        };
        let ws = State::Ws(WsMode::new(WsRole::Envelope));
        assert_eq!(ws.due(u32::MAX, &off), None);
        assert_eq!(State::Sse(SseMode::Payload).due(u32::MAX, &off), None);
    }
}
