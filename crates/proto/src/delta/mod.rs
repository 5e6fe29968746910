//! Delta compression of consecutive publications of a topic, in the Fossil delta format.
//!
//! Pure functions over bytes: the server decides which subscriber gets a delta and which the
//! full message (its per-connection delta state is not here); this module only encodes the
//! difference between a base and a target and applies one to a base.
//!
//! The format is Fossil's (the version-control system's delta encoding, which Centrifugo's SDKs
//! and the npm `fossil-delta` package decode), chosen on the measurements in
//! `docs/benchmarks.md` ("Delta compression"); `docs/delta.md` describes it for a client author.
//! A delta is text when both inputs are: a header, then commands, each a base-64 integer and
//! a one-character operator:
//!
//! ```text
//! SIZE "\n"                 the target's length
//! LEN "@" OFFSET ","        copy LEN bytes of the base from OFFSET
//! LEN ":" BYTES             insert the next LEN bytes of the delta
//! CHECKSUM ";"              end: the target's checksum (see [`checksum`])
//! ```
//!
//! - [`fossil`]: the integers, the checksum and the decoder ([`apply`]), which bounds the
//!   output before allocating it and never panics on a malformed delta.
//! - [`mod@encode`]: two encoders writing that format: [`encode()`] (block matching, the default)
//!   and [`encode_splice`] (common prefix and suffix only, the simpler one measured beside it).

pub mod encode;
pub mod fossil;

pub use encode::{encode, encode_splice};
pub use fossil::{apply, checksum, target_size};

/// Why a delta does not apply to a base. Every variant is a malformed or mismatched delta: a
/// client that meets one must not show anything and should resubscribe for a full message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    /// The delta ends before its `;` terminator.
    #[error("delta ends before its terminator")]
    Truncated,
    /// A byte where a base-64 digit or an operator was expected.
    #[error("unexpected byte {0:#04x} in delta")]
    UnexpectedByte(u8),
    /// An integer with more digits than a 32-bit value holds.
    #[error("integer in delta exceeds 32 bits")]
    IntegerOverflow,
    /// The declared target size is above the caller's limit; nothing was allocated.
    #[error("delta target of {size} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// The size the delta declares.
        size: u64,
        /// The limit the caller gave.
        limit: usize,
    },
    /// A copy reads past the end of the base (the delta is for another base).
    #[error("copy reads past the end of the base")]
    CopyOutOfBase,
    /// A copy or insert writes past the declared target size.
    #[error("delta writes past its declared size")]
    Overrun,
    /// An insert's length runs past the end of the delta.
    #[error("insert runs past the end of the delta")]
    InsertPastEnd,
    /// The terminator came before the output reached the declared size.
    #[error("delta output is shorter than its declared size")]
    SizeMismatch,
    /// The output's checksum differs from the delta's: a wrong base or a corrupted delta.
    #[error("delta checksum mismatch")]
    ChecksumMismatch,
    /// Bytes after the terminator.
    #[error("bytes after the delta terminator")]
    TrailingBytes,
}
