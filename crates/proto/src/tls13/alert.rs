//! TLS alerts (RFC 8446 §6): the two-byte level and description that close a connection,
//! normally (close_notify) or with the reason for an error; and why records could not be read or
//! written ([`RecordError`]), each with the alert it sends.

use super::keys::KeyError;

/// An alert's level. TLS 1.3 ignores it except to say that unknown alerts are errors (§6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertLevel {
    /// `warning` (1): what close_notify and user_canceled carry.
    Warning,
    /// `fatal` (2): every error alert.
    Fatal,
    /// A level TLS does not define.
    Unknown(u8),
}

impl AlertLevel {
    /// The level for a byte on the wire.
    pub fn from_u8(b: u8) -> AlertLevel {
        match b {
            1 => AlertLevel::Warning,
            2 => AlertLevel::Fatal,
            other => AlertLevel::Unknown(other),
        }
    }

    /// The byte on the wire.
    pub fn to_u8(self) -> u8 {
        match self {
            AlertLevel::Warning => 1,
            AlertLevel::Fatal => 2,
            AlertLevel::Unknown(b) => b,
        }
    }
}

macro_rules! descriptions {
    ($($(#[$doc:meta])* $name:ident = $value:literal,)*) => {
        /// What an alert says (RFC 8446 §6, B.2).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum AlertDescription {
            $($(#[$doc])* $name,)*
            /// A value TLS 1.3 does not define (a peer may still send one).
            Unknown(u8),
        }

        impl AlertDescription {
            /// The description for a byte on the wire.
            pub fn from_u8(b: u8) -> AlertDescription {
                match b {
                    $($value => AlertDescription::$name,)*
                    other => AlertDescription::Unknown(other),
                }
            }

            /// The byte on the wire.
            pub fn to_u8(self) -> u8 {
                match self {
                    $(AlertDescription::$name => $value,)*
                    AlertDescription::Unknown(b) => b,
                }
            }
        }
    };
}

descriptions! {
    /// The sender will send no more data (§6.1): a normal close.
    CloseNotify = 0,
    /// A message arrived that is not allowed here.
    UnexpectedMessage = 10,
    /// A record failed authentication.
    BadRecordMac = 20,
    /// A record longer than TLS allows.
    RecordOverflow = 22,
    /// No acceptable set of security parameters.
    HandshakeFailure = 40,
    /// A certificate was corrupt or its signatures did not verify.
    BadCertificate = 42,
    /// A certificate of an unsupported type.
    UnsupportedCertificate = 43,
    /// A revoked certificate.
    CertificateRevoked = 44,
    /// An expired or not yet valid certificate.
    CertificateExpired = 45,
    /// Some other certificate problem.
    CertificateUnknown = 46,
    /// A field was out of range or inconsistent with other fields.
    IllegalParameter = 47,
    /// The certificate chain's CA is not trusted.
    UnknownCa = 48,
    /// Valid credentials, but access refused.
    AccessDenied = 49,
    /// A message could not be decoded.
    DecodeError = 50,
    /// A handshake cryptographic operation failed.
    DecryptError = 51,
    /// A protocol version the sender does not support.
    ProtocolVersion = 70,
    /// The peer's parameters are too weak.
    InsufficientSecurity = 71,
    /// The sender failed for reasons of its own.
    InternalError = 80,
    /// A downgrade attempt (RFC 7507).
    InappropriateFallback = 86,
    /// The sender is cancelling the handshake.
    UserCanceled = 90,
    /// A mandatory extension was missing.
    MissingExtension = 109,
    /// An extension the receiver did not offer.
    UnsupportedExtension = 110,
    /// No server of the requested name.
    UnrecognizedName = 112,
    /// A bad OCSP response.
    BadCertificateStatusResponse = 113,
    /// No acceptable PSK identity.
    UnknownPskIdentity = 115,
    /// A certificate was required but not sent.
    CertificateRequired = 116,
    /// No ALPN protocol in common.
    NoApplicationProtocol = 120,
}

/// One alert message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alert {
    /// Its level.
    pub level: AlertLevel,
    /// What it says.
    pub description: AlertDescription,
}

impl Alert {
    /// The normal close (sent at warning level, as every implementation does).
    pub const CLOSE_NOTIFY: Alert = Alert {
        level: AlertLevel::Warning,
        description: AlertDescription::CloseNotify,
    };

    /// A fatal alert saying `description`.
    pub fn fatal(description: AlertDescription) -> Alert {
        Alert {
            level: AlertLevel::Fatal,
            description,
        }
    }

    /// The two bytes on the wire.
    pub fn encode(self) -> [u8; 2] {
        [self.level.to_u8(), self.description.to_u8()]
    }

    /// Parses the content of an alert record: exactly one alert, never fragmented or
    /// coalesced (§5.1), else `decode_error`.
    pub fn parse(content: &[u8]) -> Result<Alert, RecordError> {
        match content {
            &[level, description] => Ok(Alert {
                level: AlertLevel::from_u8(level),
                description: AlertDescription::from_u8(description),
            }),
            _ => Err(RecordError::BadAlert),
        }
    }
}

/// Why a connection's records could not be read or written; each maps to the fatal alert
/// we send ([`RecordError::alert`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A record failed authentication (tampered, or not from this connection), or is too
    /// short to carry a tag.
    #[error("bad record MAC")]
    BadMac,
    /// A record longer than TLS allows (§5.2, §5.4).
    #[error("record overflow")]
    Overflow,
    /// A record of a type TLS 1.3 does not allow here (§5): anything but application data
    /// outside the encryption, or an undefined type inside it.
    #[error("unexpected record type {0}")]
    UnexpectedType(u8),
    /// A record header whose version is not TLS's at all.
    #[error("not a TLS record")]
    NotTls,
    /// A protected record with no non-zero byte, hence no content type (§5.4).
    #[error("record without a content type")]
    NoContentType,
    /// An alert record that is not exactly one alert (§5.1).
    #[error("malformed alert")]
    BadAlert,
    /// A post-handshake message other than KeyUpdate (we neither request certificates nor
    /// accept tickets), a zero-length handshake record, a KeyUpdate not at the end of its
    /// record, or another record type between the fragments of a message (§5.1).
    #[error("unexpected handshake message")]
    UnexpectedHandshake,
    /// A KeyUpdate whose length is not 1 (`decode_error`).
    #[error("malformed key update")]
    BadKeyUpdateLength,
    /// A KeyUpdate whose request is neither 0 nor 1 (§4.6.3: `illegal_parameter`).
    #[error("key update with an illegal request value")]
    BadKeyUpdate,
    /// The peer kept using a key past its §5.5 limit instead of updating it.
    #[error("the peer's key is past its usage limit")]
    PeerKeyExhausted,
    /// The peer sent an alert other than close_notify.
    #[error("alert from the peer: {:?}", .0.description)]
    PeerAlert(Alert),
    /// The next keys could not be derived.
    #[error("key update failed: {0}")]
    KeyUpdate(KeyError),
    /// Our sending key has no room left for this record under its §5.5 limit (reached only
    /// after a failed key update: the writer updates long before).
    #[error("our sending key is at its usage limit")]
    KeyExhausted,
}

impl RecordError {
    /// The alert to send for this error (none for an alert the peer sent).
    pub fn alert(&self) -> Option<Alert> {
        use AlertDescription as D;
        let description = match self {
            RecordError::BadMac => D::BadRecordMac,
            RecordError::Overflow => D::RecordOverflow,
            RecordError::UnexpectedType(_)
            | RecordError::NoContentType
            | RecordError::UnexpectedHandshake
            | RecordError::PeerKeyExhausted => D::UnexpectedMessage,
            RecordError::NotTls | RecordError::BadAlert | RecordError::BadKeyUpdateLength => {
                D::DecodeError
            }
            RecordError::BadKeyUpdate => D::IllegalParameter,
            RecordError::KeyUpdate(_) | RecordError::KeyExhausted => D::InternalError,
            RecordError::PeerAlert(_) => return None,
        };
        Some(Alert::fatal(description))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(AlertDescription::from_u8(b).to_u8(), b);
            assert_eq!(AlertLevel::from_u8(b).to_u8(), b);
        }
        assert_eq!(
            AlertDescription::from_u8(20),
            AlertDescription::BadRecordMac
        );
        assert_eq!(AlertDescription::from_u8(21), AlertDescription::Unknown(21));
    }

    #[test]
    fn encode_and_parse() {
        assert_eq!(Alert::CLOSE_NOTIFY.encode(), [1, 0]);
        assert_eq!(
            Alert::fatal(AlertDescription::RecordOverflow).encode(),
            [2, 22]
        );
        assert_eq!(Alert::parse(&[1, 0]), Ok(Alert::CLOSE_NOTIFY));
        assert_eq!(
            Alert::parse(&[2, 80]),
            Ok(Alert::fatal(AlertDescription::InternalError))
        );
        for bad in [&[][..], &[1], &[1, 0, 1, 0]] {
            assert_eq!(Alert::parse(bad), Err(RecordError::BadAlert));
        }
    }
}
