//! Sans-IO protocol code for Clarion.
//!
//! Everything here is a pure function or state machine over bytes: no sockets, no clock, no
//! threads. The server's event loop feeds bytes in and writes bytes out; this crate decides what
//! they mean. Every parser returns "need more bytes" (`Ok(None)`) rather than an error on a short
//! buffer, enforces its limits while parsing, and never panics on peer input.
//!
//! Layout:
//! - [`http1`]: HTTP/1.1 request heads (with limits), query strings, chunked bodies, response
//!   heads; writing request and response heads; which headers a proxy forwards (hop-by-hop).
//! - [`ws`]: RFC 6455 WebSocket: opening handshake, frame codec, close codes, message assembly.
//! - [`sse`]: Server-Sent Events encoding.
//! - [`auth`]: JSON Web Tokens (HS256, RS256, ES256), keys from PEM and JWKS, topic patterns.
//! - [`conflate`]: "latest wins" conflation of a slow subscriber's backlog by key, with the
//!   notice of what it skipped.
//! - [`delta`]: delta compression of consecutive publications (the Fossil delta format):
//!   encoders and a bounded decoder.
//! - [`filter`]: subscription filters over publication tags: the text and JSON forms, bounds,
//!   canonical form and evaluation.
//! - [`event_id`]: message ids (`EPOCH-SEQ`), as clients send them back to resume.
//! - [`pubsub`]: Clarion's own pub/sub format: topic rules, WebSocket control messages,
//!   publish batches, message envelopes, gap notices and long-poll bodies.
//! - [`pusher`]: the Pusher Channels protocol (v7): client and server WebSocket messages,
//!   channel kinds, channel/signin/webhook signatures, the HTTP API's request signature and
//!   trigger bodies.
//! - [`grip`]: GRIP, Pushpin's proxy protocol: instruction headers, publish bodies,
//!   WebSocket-over-HTTP events, control messages and `Grip-Sig`.
//! - [`h2`]: HTTP/2: HPACK header compression (RFC 7541) with its Huffman code.
//! - [`handover`]: the frames a running server sends the binary that replaces it (listening
//!   sockets, connection records, where ids stand), versioned, beside `SCM_RIGHTS` descriptors;
//!   [`handover_state`]: the records' section for what authentication, hooks and presence keep
//!   per connection; [`handover_grip`]: the records' part for a connection a GRIP backend holds;
//!   [`handover_streams`]: the history frame's table of appendable messages.
//! - [`history_log`]: the record format of durable history files (`history_dir`): framing
//!   with CRC-32C, and a scanner that separates intact records from damage.
//! - [`hooks`]: backend hooks: the JSON of `connect`/`subscribe`/`publish` calls and answers,
//!   and their HMAC-SHA256 signature.
//! - [`resp`]: RESP2, the Redis protocol, as a client speaks it (the cluster broker).
//! - [`nats`]: the NATS client protocol (core NATS): client operations, an incremental reader
//!   of server operations, subject rules and the mapping of topics to subjects.
//! - [`sd_notify`]: the service manager's notification datagrams (systemd `Type=notify`):
//!   `READY=1`, `RELOADING=1`, `STOPPING=1`, `STATUS=`, `MAINPID=`, and `$NOTIFY_SOCKET`.
//! - [`tls13`]: the TLS 1.3 record layer after the handshake: record protection, alerts, key
//!   updates and the RFC 8446 §5.5 key usage limits.
#![forbid(unsafe_code)]
// Peer input reaches almost every line here: no indexing that could panic outside tests.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

pub mod auth;
pub mod conflate;
pub mod debounce;
pub mod delta;
pub mod event_id;
pub mod filter;
pub mod grip;
pub mod h2;
pub mod handover;
mod handover_cursor;
pub mod handover_grip;
pub mod handover_state;
pub mod handover_streams;
pub mod history_log;
pub mod hooks;
pub mod http1;
pub mod nats;
pub mod pubsub;
pub mod pusher;
pub mod resp;
pub mod sd_notify;
pub mod sse;
#[cfg(test)]
mod test_rng;
pub mod tls13;
pub mod ws;
