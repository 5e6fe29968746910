//! The NATS client protocol (core NATS, text protocol), sans-IO: what a client writes and how
//! to read what a server sends, as described in the NATS protocol reference
//! (<https://docs.nats.io/reference/reference-protocols/nats-protocol>).
//!
//! - [`encode`]: the client's operations (`CONNECT`, `PUB`, `SUB`, `UNSUB`, `PING`, `PONG`),
//!   appended to a caller's buffer, with subject checks.
//! - [`mod@decode`]: an incremental reader of the server's operations (`INFO`, `MSG`, `HMSG`,
//!   `PING`, `PONG`, `+OK`, `-ERR`) over a buffer the caller owns; "need more bytes" is
//!   `Ok(None)`, and a control line or payload over its limit is an error, so a caller that
//!   keeps only what is not yet decoded never holds more than `max_line + max_payload + 2`.
//! - [`subject`]: subject rules and the reversible mapping of a Clarion topic to one subject
//!   under a prefix (topics may contain `.`, which NATS reads as a token separator).
//! - [`url`]: `nats://[user:pass@]host[:port]` server lists, as given in configuration.
//!
//! Nothing here opens a socket or reads a clock; the server's `cluster::nats_link` does the
//! I/O and the timing (pings, reconnects).

pub mod decode;
pub mod encode;
pub mod subject;
pub mod url;

pub use decode::{decode, DecodeError, Info, Limits, ServerOp};
pub use encode::Connect;
pub use subject::{validate_subject, SubjectError, SubjectMap};
pub use url::{parse_servers, ServerUrl, UrlError};
