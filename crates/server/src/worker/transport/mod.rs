//! The client-facing transports, as the worker's engine runs them: HTTP request routing and the
//! WebSocket upgrade ([`http`]), WebSocket connections ([`ws`]), HTTP streams (SSE and NDJSON,
//! [`stream`]) and long-polls ([`poll`]), and the checks of authentication ([`auth`]) they share;
//! [`pages`]: the listener's two fixed documents (`/`, and the browser client at `/client.js`).
//! [`pusher`]: the Pusher Channels protocol on `/app/{key}`, with its per-connection part in
//! [`pusher_conn`], and what they tell the application's webhook in `pusher_hooks`.
//! [`frame`] is the seam between them and the features: how each transport frames an event and
//! ends a connection, in one dispatch over the connection's state.
//!
//! Each is a set of `Engine` methods called from the worker's dispatch points (read path,
//! delivery, sweep, shutdown); none touches a socket or reads a clock: bytes go out through the
//! worker's write path and time is the engine's `now`.

pub mod auth;
pub mod frame;
mod hook_answers;
pub mod hooks;
pub mod http;
pub mod pages;
pub mod poll;
pub mod pusher;
pub mod pusher_conn;
mod pusher_hooks;
pub mod stream;
pub mod ws;
