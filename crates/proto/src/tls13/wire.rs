//! The bytes of a TLS 1.3 record around the encryption: the five-byte header (RFC 8446 §5.1)
//! and the inner plaintext's content type and zero padding (§5.4), plus the one
//! post-handshake message this layer handles, KeyUpdate (§4.6.3). No cryptography here.

use super::alert::RecordError;

/// Bytes in a record header: type, legacy version, length.
pub const HEADER_LEN: usize = 5;
/// Plaintext bytes one record may carry (RFC 8446 §5.1: 2^14).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest `TLSCiphertext.length` a peer may send (RFC 8446 §5.2: 2^14 + 256).
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// The AEAD tag of every TLS 1.3 suite (AES-GCM and ChaCha20-Poly1305).
pub const TAG_LEN: usize = 16;
/// The version every TLS 1.3 record carries outside the encryption (RFC 8446 §5.1).
pub const LEGACY_VERSION: [u8; 2] = [3, 3];

/// A record's content type (RFC 8446 §5.1, B.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentType {
    /// Only as a compatibility no-op during the handshake (RFC 8446 §5, D.4).
    ChangeCipherSpec,
    /// An alert (§6).
    Alert,
    /// Handshake messages; after the handshake only post-handshake ones (§4.6).
    Handshake,
    /// Application data, and the outer type of every protected record.
    ApplicationData,
}

impl ContentType {
    /// The type for a byte on the wire; `None` for values TLS 1.3 does not define (including
    /// 0, `invalid`, which only marks padding).
    pub fn from_u8(b: u8) -> Option<ContentType> {
        match b {
            20 => Some(ContentType::ChangeCipherSpec),
            21 => Some(ContentType::Alert),
            22 => Some(ContentType::Handshake),
            23 => Some(ContentType::ApplicationData),
            _ => None,
        }
    }

    /// The byte on the wire.
    pub fn to_u8(self) -> u8 {
        match self {
            ContentType::ChangeCipherSpec => 20,
            ContentType::Alert => 21,
            ContentType::Handshake => 22,
            ContentType::ApplicationData => 23,
        }
    }
}

/// A parsed record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// The outer content type.
    pub content_type: ContentType,
    /// Bytes of record body that follow the header.
    pub length: usize,
    /// The header exactly as received: it is the AEAD's additional data (§5.2).
    pub bytes: [u8; HEADER_LEN],
}

impl RecordHeader {
    /// Parses a header from the start of `input`: `Ok(None)` until five bytes are there.
    ///
    /// Refuses what no TLS peer sends: an undefined content type (`unexpected_message`, §5),
    /// a major version other than 3 (`decode_error`: not TLS at all; otherwise the legacy
    /// version is ignored as §5.1 requires) and a body over 2^14 + 256 bytes
    /// (`record_overflow`, §5.2). The length is checked here, before any of the body is
    /// buffered.
    pub fn parse(input: &[u8]) -> Result<Option<RecordHeader>, RecordError> {
        let Some(&[kind, major, minor, hi, lo]) = input.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let content_type = ContentType::from_u8(kind).ok_or(RecordError::UnexpectedType(kind))?;
        if major != 3 {
            return Err(RecordError::NotTls);
        }
        let length = usize::from(u16::from_be_bytes([hi, lo]));
        if length > MAX_CIPHERTEXT {
            return Err(RecordError::Overflow);
        }
        Ok(Some(RecordHeader {
            content_type,
            length,
            bytes: [kind, major, minor, hi, lo],
        }))
    }

    /// Bytes of the record at the start of `input`, header and body, once all of them are
    /// there (`Ok(None)` until then); the header is checked as [`RecordHeader::parse`] does.
    /// Whoever feeds records one at a time (the hand-off from rustls) cuts here.
    pub fn whole_record(input: &[u8]) -> Result<Option<usize>, RecordError> {
        let Some(header) = RecordHeader::parse(input)? else {
            return Ok(None);
        };
        let len = HEADER_LEN + header.length;
        Ok((len <= input.len()).then_some(len))
    }

    /// The header of a protected record whose body is `length` bytes.
    pub fn protected(length: u16) -> [u8; HEADER_LEN] {
        let [hi, lo] = length.to_be_bytes();
        let [v0, v1] = LEGACY_VERSION;
        [ContentType::ApplicationData.to_u8(), v0, v1, hi, lo]
    }
}

/// Splits a decrypted `TLSInnerPlaintext` (§5.4) into its real content type and content:
/// the type is the last non-zero byte, everything after it is padding.
pub fn split_inner(inner: &[u8]) -> Result<(ContentType, &[u8]), RecordError> {
    if inner.len() > MAX_PLAINTEXT + 1 {
        return Err(RecordError::Overflow);
    }
    // §5.4: a record of nothing but zeros has no content type.
    let at = inner
        .iter()
        .rposition(|&b| b != 0)
        .ok_or(RecordError::NoContentType)?;
    let (content, kind) = inner.split_at(at);
    let kind = kind.first().copied().unwrap_or_default();
    let content_type = ContentType::from_u8(kind).ok_or(RecordError::UnexpectedType(kind))?;
    Ok((content_type, content))
}

/// A handshake message type (RFC 8446 §4, B.3); only KeyUpdate is acted on after the
/// handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeType {
    /// A key update (§4.6.3).
    KeyUpdate,
    /// Any other type: never acceptable once the handshake is over on this layer.
    Other(u8),
}

impl HandshakeType {
    /// The type for a byte on the wire.
    pub fn from_u8(b: u8) -> HandshakeType {
        match b {
            24 => HandshakeType::KeyUpdate,
            other => HandshakeType::Other(other),
        }
    }

    /// The byte on the wire.
    pub fn to_u8(self) -> u8 {
        match self {
            HandshakeType::KeyUpdate => 24,
            HandshakeType::Other(b) => b,
        }
    }
}

/// A KeyUpdate's `request_update` field (RFC 8446 §4.6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUpdateRequest {
    /// The sender updated its sending key; nothing is asked of us.
    NotRequested,
    /// The sender also asks us to update our sending key.
    Requested,
}

impl KeyUpdateRequest {
    /// The value for a byte on the wire; any other value calls for `illegal_parameter`.
    pub fn from_u8(b: u8) -> Result<KeyUpdateRequest, RecordError> {
        match b {
            0 => Ok(KeyUpdateRequest::NotRequested),
            1 => Ok(KeyUpdateRequest::Requested),
            _ => Err(RecordError::BadKeyUpdate),
        }
    }

    /// The whole KeyUpdate handshake message: type, 24-bit length 1, the request byte.
    pub fn message(self) -> [u8; KEY_UPDATE_LEN] {
        let request = match self {
            KeyUpdateRequest::NotRequested => 0,
            KeyUpdateRequest::Requested => 1,
        };
        [HandshakeType::KeyUpdate.to_u8(), 0, 0, 1, request]
    }
}

/// Bytes in a KeyUpdate message, header included.
pub const KEY_UPDATE_LEN: usize = 5;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn header_needs_five_bytes_and_never_panics() {
        let full = [23, 3, 3, 0, 20];
        for n in 0..5 {
            assert_eq!(RecordHeader::parse(&full[..n]), Ok(None));
        }
        let h = RecordHeader::parse(&full).unwrap().unwrap();
        assert_eq!(h.content_type, ContentType::ApplicationData);
        assert_eq!(h.length, 20);
        assert_eq!(h.bytes, full);
        // Every possible header either parses or maps to an error; none panics.
        for kind in 0..=255u8 {
            for major in [0u8, 3, 0x16, 255] {
                let _ = RecordHeader::parse(&[kind, major, 1, 0xff, 0xff]);
            }
        }
    }

    #[test]
    fn whole_records_are_measured_only_once_complete() {
        let mut two = vec![22, 3, 1, 0, 3, 1, 2, 3];
        two.extend_from_slice(&[23, 3, 3, 0, 0]);
        for n in 0..8 {
            assert_eq!(RecordHeader::whole_record(&two[..n]), Ok(None), "{n}");
        }
        assert_eq!(RecordHeader::whole_record(&two), Ok(Some(8)));
        assert_eq!(RecordHeader::whole_record(&two[8..]), Ok(Some(5)));
        assert_eq!(
            RecordHeader::whole_record(b"GET / HTTP/1.1"),
            Err(RecordError::UnexpectedType(b'G'))
        );
    }

    #[test]
    fn header_limits_and_types() {
        let max = (MAX_CIPHERTEXT as u16).to_be_bytes();
        assert!(RecordHeader::parse(&[23, 3, 3, max[0], max[1]]).is_ok());
        let over = (MAX_CIPHERTEXT as u16 + 1).to_be_bytes();
        assert_eq!(
            RecordHeader::parse(&[23, 3, 3, over[0], over[1]]),
            Err(RecordError::Overflow)
        );
        assert_eq!(
            RecordHeader::parse(&[24, 3, 3, 0, 1]),
            Err(RecordError::UnexpectedType(24))
        );
        assert_eq!(
            RecordHeader::parse(b"GET / HTTP/1.1"),
            Err(RecordError::UnexpectedType(b'G'))
        );
        assert_eq!(
            RecordHeader::parse(&[23, 0x47, 0x45, 0, 1]),
            Err(RecordError::NotTls)
        );
        // The minor version is ignored (§5.1): 0x0301 is what some first records carry.
        assert!(RecordHeader::parse(&[22, 3, 1, 0, 1]).unwrap().is_some());
        assert_eq!(RecordHeader::protected(0x0123), [23, 3, 3, 1, 0x23]);
    }

    #[test]
    fn content_types_round_trip() {
        for b in 0..=255u8 {
            if let Some(t) = ContentType::from_u8(b) {
                assert_eq!(t.to_u8(), b);
            }
        }
        assert_eq!(ContentType::from_u8(0), None);
        assert_eq!(HandshakeType::from_u8(24), HandshakeType::KeyUpdate);
        assert_eq!(HandshakeType::from_u8(4).to_u8(), 4);
    }

    #[test]
    fn inner_plaintext_strips_padding() {
        assert_eq!(
            split_inner(b"hello\x17\0\0\0"),
            Ok((ContentType::ApplicationData, &b"hello"[..]))
        );
        assert_eq!(split_inner(b"\x15"), Ok((ContentType::Alert, &b""[..])));
        // Zeros inside the content stay; only the trailing ones are padding.
        assert_eq!(
            split_inner(b"a\0b\x17\0"),
            Ok((ContentType::ApplicationData, &b"a\0b"[..]))
        );
        assert_eq!(split_inner(b""), Err(RecordError::NoContentType));
        assert_eq!(split_inner(&[0; 30]), Err(RecordError::NoContentType));
        assert_eq!(
            split_inner(b"x\x18\0"),
            Err(RecordError::UnexpectedType(0x18))
        );
        let mut big = vec![b'x'; MAX_PLAINTEXT];
        big.push(23);
        assert!(split_inner(&big).is_ok());
        big.push(0);
        assert_eq!(split_inner(&big), Err(RecordError::Overflow));
    }

    #[test]
    fn key_update_messages() {
        assert_eq!(KeyUpdateRequest::NotRequested.message(), [24, 0, 0, 1, 0]);
        assert_eq!(KeyUpdateRequest::Requested.message(), [24, 0, 0, 1, 1]);
        assert_eq!(
            KeyUpdateRequest::from_u8(1),
            Ok(KeyUpdateRequest::Requested)
        );
        assert_eq!(KeyUpdateRequest::from_u8(2), Err(RecordError::BadKeyUpdate));
    }
}
