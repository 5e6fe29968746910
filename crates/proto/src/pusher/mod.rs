//! The Pusher Channels protocol (version 7), sans-IO: what pusher-js and the official server
//! libraries send and expect, as pure functions over text.
//!
//! - [`client`]: the client's WebSocket messages, decoded and bounded; presence members and
//!   signed-in users.
//! - [`server`]: the server's WebSocket messages (connection, errors, subscriptions, presence,
//!   cache misses, signin, channel events).
//! - [`code`]: the `pusher:error` and close codes, and what each range tells a client to do.
//! - [`channel`]: channel names and kinds (public, `private-`, `presence-`,
//!   `private-encrypted-`, `cache-` and their combinations).
//! - [`socket_id`]: socket ids.
//! - [`relay`]: a Pusher event's name, excluded socket and user between cluster nodes.
//! - [`signature`]: channel authorization, user signin and webhook signatures.
//! - [`signed_request`]: the HTTP API's request signature.
//! - [`trigger`]: the HTTP API's trigger and batch bodies.
//! - [`webhook`]: webhook events, bodies and headers.
//!
//! Nothing here reads a clock: the request signature's check takes `now` from the caller.

pub mod channel;
pub mod client;
pub mod code;
mod json_depth;
pub mod relay;
pub mod server;
pub mod signature;
pub mod signed_request;
pub mod socket_id;
pub mod trigger;
pub mod webhook;

/// The bounds every decoder here enforces. The defaults are Pusher's published limits, so a
/// client written against Pusher fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest client WebSocket message, bytes: Pusher's 10 KB message limit plus room for the
    /// envelope.
    pub max_client_message: usize,
    /// Deepest JSON nesting in a message or body: real messages nest a few levels; the bound
    /// keeps a hostile one from costing a stack frame per bracket.
    pub max_depth: usize,
    /// Longest event name, bytes (Pusher: 200).
    pub max_event_name: usize,
    /// Largest `data` of a triggered event, bytes (Pusher: 10 KB).
    pub max_event_data: usize,
    /// Most channels one trigger names (Pusher: 100).
    pub max_trigger_channels: usize,
    /// Most events in one batch trigger (Pusher: 10).
    pub max_batch: usize,
    /// Longest presence `user_id`, bytes (Pusher: 128).
    pub max_user_id: usize,
    /// Largest presence `user_info`, bytes of JSON (Pusher: 1 KB).
    pub max_user_info: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_client_message: 10 * 1024 + 512,
            max_depth: 32,
            max_event_name: 200,
            max_event_data: 10 * 1024,
            max_trigger_channels: 100,
            max_batch: 10,
            max_user_id: 128,
            max_user_info: 1024,
        }
    }
}
