//! TLS alerts (RFC 8446 §6): the two-byte level and description that close a connection,
//! normally (close_notify) or with the reason for an error.

use super::records::RecordError;

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
