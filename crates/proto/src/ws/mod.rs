//! RFC 6455 WebSocket, server side. Module names follow the RFC's sections.
//!
//! - [`handshake`]: section 4, the opening handshake (validating the upgrade, `Sec-WebSocket-Accept`).
//! - [`frame`]: section 5.2, frame headers, masking, encoding server frames.
//! - [`close`]: sections 5.5.1 and 7.4, close codes and close payloads.
//! - [`receiver`]: sections 5.4 and 5.5, turning frames into messages and control events
//!   (fragmentation, interleaved control frames, incremental UTF-8 validation, size limits).

pub mod close;
pub mod deflate;
pub mod frame;
pub mod handshake;
pub mod receiver;

pub use close::CloseCode;
pub use frame::OpCode;
pub use receiver::{DataKind, Event, Receiver, Violation};
