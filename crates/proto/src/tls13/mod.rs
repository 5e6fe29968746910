//! The TLS 1.3 record layer of an established connection (RFC 8446 §5), sans-IO: protected
//! records in, plaintext and the records we must answer with out; plaintext in, records out.
//!
//! The handshake is not here: whoever ran it (the server uses rustls) hands over the cipher
//! suite, the current key, IV and sequence number of each direction, and a [`KeySchedule`]
//! that yields the next keys when either side updates them (§4.6.3, §7.2). [`SecretSchedule`]
//! is that schedule computed here from the traffic secrets with HKDF-Expand-Label.
//!
//! Layout:
//! - [`wire`]: content types, the record header, inner-plaintext padding (§5.1, §5.4).
//! - [`alert`]: alert levels and descriptions (§6).
//! - [`keys`]: cipher suites, traffic secrets, key/IV derivation and key updates (§7).
//! - [`limits`]: how much one key may protect (§5.5) and the accounting against it.
//! - [`records`]: [`Records`], one connection's two directions, and [`RecordError`].
//! - [`parked`]: an established record layer as bytes, to continue it in another process.
//! - `handoff` (feature `rustls`): taking an established connection over from rustls.
//!
//! Nothing here reads a clock or touches a socket.

pub mod alert;
#[doc(hidden)]
pub mod fuzz;
#[cfg(feature = "rustls")]
pub mod handoff;
pub mod keys;
pub mod limits;
pub mod parked;
pub mod records;
pub mod wire;

pub use alert::{Alert, AlertDescription, AlertLevel};
pub use keys::{CipherSuite, KeyError, KeySchedule, SecretSchedule, TrafficKey, TrafficSecret};
pub use limits::KeyLimits;
pub use parked::{ParkError, Parked};
pub use records::{Read, RecordError, Records};
pub use wire::{ContentType, KeyUpdateRequest, RecordHeader};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_idle;
#[cfg(test)]
mod tests_parked;
