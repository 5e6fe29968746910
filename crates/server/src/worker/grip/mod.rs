//! GRIP's per-connection runtime, as the engine runs it: [`forward`] (a request on a routed
//! path goes to the backend; its first answer is passed through or starts a hold or a bridge),
//! [`hold`] (held streams and long-polls, and deliveries of GRIP content), [`bridge`]
//! (WebSocket-over-HTTP), over [`conn`] (what one connection keeps); [`carried`] is a hold as it
//! moves in a hand-over.
//!
//! What every worker shares in proxy mode (routes, the backend pool, publish content) is
//! [`crate::grip`]; this module owns only what one connection keeps, in the engine's `grip`
//! table.

pub(crate) mod bridge;
pub mod carried;
pub(crate) mod conn;
pub(crate) mod forward;
pub(crate) mod hold;
