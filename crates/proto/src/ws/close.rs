//! Close codes (RFC 6455 section 7.4) and Close frame payloads (section 5.5.1).

use super::frame::{encode_header, FrameError, OpCode};

/// A WebSocket close status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseCode {
    /// 1000: normal closure.
    Normal,
    /// 1001: endpoint going away (server shutdown, idle timeout).
    GoingAway,
    /// 1002: protocol error.
    Protocol,
    /// 1003: data type the endpoint cannot accept.
    Unsupported,
    /// 1005: no status code present (never sent on the wire).
    NoStatus,
    /// 1006: closed without a Close frame (never sent on the wire).
    Abnormal,
    /// 1007: payload inconsistent with its type (e.g. invalid UTF-8 text).
    InvalidPayload,
    /// 1008: policy violation.
    Policy,
    /// 1009: message too big.
    TooBig,
    /// 1010: the client expected an extension the server did not negotiate.
    MandatoryExtension,
    /// 1011: unexpected server condition.
    Internal,
    /// 1012: service restart.
    ServiceRestart,
    /// 1013: try again later.
    TryAgainLater,
    /// 1014: bad gateway.
    BadGateway,
    /// 1015: TLS handshake failure (never sent on the wire).
    Tls,
    /// Any other code, e.g. application codes 3000-4999.
    Other(u16),
}

impl CloseCode {
    /// The code for a numeric value.
    pub fn from_u16(v: u16) -> CloseCode {
        match v {
            1000 => CloseCode::Normal,
            1001 => CloseCode::GoingAway,
            1002 => CloseCode::Protocol,
            1003 => CloseCode::Unsupported,
            1005 => CloseCode::NoStatus,
            1006 => CloseCode::Abnormal,
            1007 => CloseCode::InvalidPayload,
            1008 => CloseCode::Policy,
            1009 => CloseCode::TooBig,
            1010 => CloseCode::MandatoryExtension,
            1011 => CloseCode::Internal,
            1012 => CloseCode::ServiceRestart,
            1013 => CloseCode::TryAgainLater,
            1014 => CloseCode::BadGateway,
            1015 => CloseCode::Tls,
            other => CloseCode::Other(other),
        }
    }

    /// The numeric value.
    pub fn as_u16(self) -> u16 {
        match self {
            CloseCode::Normal => 1000,
            CloseCode::GoingAway => 1001,
            CloseCode::Protocol => 1002,
            CloseCode::Unsupported => 1003,
            CloseCode::NoStatus => 1005,
            CloseCode::Abnormal => 1006,
            CloseCode::InvalidPayload => 1007,
            CloseCode::Policy => 1008,
            CloseCode::TooBig => 1009,
            CloseCode::MandatoryExtension => 1010,
            CloseCode::Internal => 1011,
            CloseCode::ServiceRestart => 1012,
            CloseCode::TryAgainLater => 1013,
            CloseCode::BadGateway => 1014,
            CloseCode::Tls => 1015,
            CloseCode::Other(v) => v,
        }
    }

    /// Whether a peer may put this code in a Close frame.
    pub fn is_sendable(self) -> bool {
        matches!(self.as_u16(), 1000..=1003 | 1007..=1014 | 3000..=4999)
    }
}

/// Why a received Close payload is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CloseError {
    /// A one-byte payload (a code needs two).
    #[error("truncated close code")]
    Truncated,
    /// A code that must not appear on the wire.
    #[error("invalid close code {0}")]
    InvalidCode(u16),
    /// A reason that is not UTF-8.
    #[error("close reason is not UTF-8")]
    InvalidReason,
}

impl CloseError {
    /// The code the receiving endpoint closes with.
    pub fn close_code(&self) -> CloseCode {
        match self {
            CloseError::InvalidReason => CloseCode::InvalidPayload,
            _ => CloseCode::Protocol,
        }
    }
}

/// Parses a received Close payload: `Ok(None)` when empty, else the code and reason.
pub fn parse_close(payload: &[u8]) -> Result<Option<(CloseCode, &str)>, CloseError> {
    match payload {
        [] => Ok(None),
        [_] => Err(CloseError::Truncated),
        [hi, lo, reason @ ..] => {
            let code = CloseCode::from_u16(u16::from_be_bytes([*hi, *lo]));
            if !code.is_sendable() {
                return Err(CloseError::InvalidCode(code.as_u16()));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| CloseError::InvalidReason)?;
            Ok(Some((code, reason)))
        }
    }
}

/// A complete server Close frame carrying `code` and `reason`; the reason is cut at a character
/// boundary so the payload fits in the 125 bytes a control frame allows.
pub fn encode_close_frame(code: CloseCode, reason: &str) -> Vec<u8> {
    let mut cut = reason.len().min(123);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let reason = reason.as_bytes().get(..cut).unwrap_or_default();
    let mut head = [0u8; 10];
    let n = encode_header(
        &mut head,
        true,
        false,
        OpCode::Close,
        2 + reason.len() as u64,
    );
    let mut out = Vec::with_capacity(n + 2 + reason.len());
    out.extend_from_slice(head.get(..n).unwrap_or_default());
    out.extend_from_slice(&code.as_u16().to_be_bytes());
    out.extend_from_slice(reason);
    out
}

impl FrameError {
    /// The close code that fails the connection for this error.
    pub fn close_code(&self) -> CloseCode {
        match self {
            FrameError::TooBig => CloseCode::TooBig,
            _ => CloseCode::Protocol,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for v in 0..6000u16 {
            assert_eq!(CloseCode::from_u16(v).as_u16(), v);
        }
    }

    #[test]
    fn sendable_codes() {
        for v in [
            1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 4999,
        ] {
            assert!(CloseCode::from_u16(v).is_sendable(), "{v}");
        }
        for v in [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535] {
            assert!(!CloseCode::from_u16(v).is_sendable(), "{v}");
        }
    }

    #[test]
    fn parsing() {
        assert_eq!(parse_close(b""), Ok(None));
        assert_eq!(parse_close(b"\x03"), Err(CloseError::Truncated));
        assert_eq!(parse_close(b"\x03\xe8"), Ok(Some((CloseCode::Normal, ""))));
        assert_eq!(
            parse_close(b"\x0b\xb8bye"),
            Ok(Some((CloseCode::Other(3000), "bye")))
        );
        assert_eq!(
            parse_close(b"\x13\x87"),
            Ok(Some((CloseCode::Other(4999), "")))
        );
        for v in [999u16, 1004, 1005, 1006, 1015, 5000] {
            assert_eq!(
                parse_close(&v.to_be_bytes()),
                Err(CloseError::InvalidCode(v))
            );
        }
        assert_eq!(parse_close(b"\x03\xe8\xff"), Err(CloseError::InvalidReason));
        assert_eq!(
            CloseError::InvalidReason.close_code(),
            CloseCode::InvalidPayload
        );
        assert_eq!(CloseError::Truncated.close_code(), CloseCode::Protocol);
    }

    #[test]
    fn encoding() {
        assert_eq!(
            encode_close_frame(CloseCode::GoingAway, "bye"),
            b"\x88\x05\x03\xe9bye"
        );
        let long = "é".repeat(100);
        let frame = encode_close_frame(CloseCode::Normal, &long);
        assert!(frame.len() - 2 <= 125);
        let reason = parse_close(&frame[2..])
            .ok()
            .flatten()
            .map(|(_, r)| r.len());
        assert_eq!(reason, Some(122));
    }

    #[test]
    fn frame_errors_fail_with_their_close_code() {
        assert_eq!(FrameError::TooBig.close_code(), CloseCode::TooBig);
        assert_eq!(FrameError::Unmasked.close_code(), CloseCode::Protocol);
    }
}
