//! Socket ids: `DIGITS.DIGITS`, given to a connection in `pusher:connection_established` and
//! signed into every channel authorization. The server chooses them; the numbers come from the
//! caller (this crate has no randomness).

use std::fmt;

/// Most digits on either side of the dot: two `u64`s print in at most 20.
const MAX_DIGITS: usize = 20;

/// A socket id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketId {
    /// Before the dot.
    pub high: u64,
    /// After the dot.
    pub low: u64,
}

impl fmt::Display for SocketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.high, self.low)
    }
}

/// Why a socket id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SocketIdError {
    /// Not two runs of 1 to 20 digits joined by one dot.
    #[error("socket_id must be two numbers joined by a dot (1234.5678)")]
    Malformed,
}

/// Whether `text` has the shape of a socket id (what the HTTP API checks of `socket_id`).
pub fn validate(text: &str) -> Result<(), SocketIdError> {
    parse(text).map(|_| ())
}

/// Reads a socket id.
pub fn parse(text: &str) -> Result<SocketId, SocketIdError> {
    let (a, b) = text.split_once('.').ok_or(SocketIdError::Malformed)?;
    let number = |s: &str| {
        if s.is_empty() || s.len() > MAX_DIGITS || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(SocketIdError::Malformed);
        }
        s.parse::<u64>().map_err(|_| SocketIdError::Malformed)
    };
    Ok(SocketId {
        high: number(a)?,
        low: number(b)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_malformed_ones_are_refused() {
        let id = parse("1234.1234").expect("valid");
        assert_eq!(
            id,
            SocketId {
                high: 1234,
                low: 1234
            }
        );
        assert_eq!(id.to_string(), "1234.1234");
        let big = SocketId {
            high: u64::MAX,
            low: 0,
        };
        assert_eq!(parse(&big.to_string()), Ok(big));
        for bad in [
            "",
            "1234",
            ".1",
            "1.",
            "1.2.3",
            "a.1",
            "1.-1",
            " 1.1",
            "1.1\n",
            "+1.1",
            "123456789012345678901.1",
        ] {
            assert_eq!(parse(bad), Err(SocketIdError::Malformed), "{bad:?}");
        }
    }
}
