//! Frame headers (RFC 6455 section 5.2), masking (5.3) and server frame encoding.
//!
//! The header parser validates as it goes and reports an error as soon as the bytes that prove
//! it are present: a 10 GB length is refused right after the length field, not after the server
//! has tried to buffer it.

/// Frame opcodes defined by RFC 6455. The others (3-7, 0xB-0xF) are reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum OpCode {
    /// Continuation of a fragmented message.
    Continuation = 0,
    /// First frame of a text message.
    Text = 1,
    /// First frame of a binary message.
    Binary = 2,
    /// Close.
    Close = 8,
    /// Ping.
    Ping = 9,
    /// Pong.
    Pong = 10,
}

impl OpCode {
    /// The opcode for a 4-bit value, `None` if reserved.
    pub fn from_u8(v: u8) -> Option<OpCode> {
        Some(match v {
            0 => OpCode::Continuation,
            1 => OpCode::Text,
            2 => OpCode::Binary,
            8 => OpCode::Close,
            9 => OpCode::Ping,
            10 => OpCode::Pong,
            _ => return None,
        })
    }

    /// Close, Ping and Pong are control frames.
    pub fn is_control(self) -> bool {
        self as u8 & 0x8 != 0
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Final fragment of a message.
    pub fin: bool,
    /// RSV1..RSV3 as 3 bits (RSV1 = 0b100).
    pub rsv: u8,
    /// The frame's opcode.
    pub opcode: OpCode,
    /// Masking key, if the frame is masked.
    pub mask: Option<[u8; 4]>,
    /// Payload length in bytes.
    pub payload_len: u64,
    /// Header length in bytes (2 to 14).
    pub header_len: usize,
}

/// Why a frame header is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A reserved opcode.
    #[error("reserved opcode {0:#x}")]
    ReservedOpcode(u8),
    /// RSV bits set without a negotiated extension.
    #[error("reserved bits set")]
    ReservedBits,
    /// A client frame without a mask.
    #[error("frame not masked")]
    Unmasked,
    /// A control frame with more than 125 payload bytes.
    #[error("control frame too long")]
    ControlTooLong,
    /// A control frame without FIN.
    #[error("fragmented control frame")]
    FragmentedControl,
    /// A 64-bit length with the most significant bit set.
    #[error("invalid payload length")]
    BadLength,
    /// A payload larger than the limit.
    #[error("message too big")]
    TooBig,
}

/// Parses a frame header at the start of `buf`; `Ok(None)` if more bytes are needed. Any RSV
/// bit is an error (no extension negotiated).
pub fn parse_header(
    buf: &[u8],
    require_mask: bool,
    max_payload: u64,
) -> Result<Option<FrameHeader>, FrameError> {
    parse_header_with(buf, require_mask, false, max_payload)
}

/// Like [`parse_header`], but RSV1 may be set on data frames when `allow_rsv1` (a negotiated
/// permessage-deflate marks compressed messages with it, RFC 7692 section 6). RSV1 on a control
/// frame, RSV2 and RSV3 are always errors.
pub fn parse_header_with(
    buf: &[u8],
    require_mask: bool,
    allow_rsv1: bool,
    max_payload: u64,
) -> Result<Option<FrameHeader>, FrameError> {
    let (b0, b1) = match buf {
        [b0, b1, ..] => (*b0, *b1),
        _ => return Ok(None),
    };
    let fin = b0 & 0x80 != 0;
    let rsv = (b0 >> 4) & 0x7;
    let raw_op = b0 & 0x0f;
    let opcode = OpCode::from_u8(raw_op).ok_or(FrameError::ReservedOpcode(raw_op))?;
    let rsv1_ok = allow_rsv1 && !opcode.is_control();
    if rsv & 0b011 != 0 || (rsv & 0b100 != 0 && !rsv1_ok) {
        return Err(FrameError::ReservedBits);
    }
    let masked = b1 & 0x80 != 0;
    if require_mask && !masked {
        return Err(FrameError::Unmasked);
    }
    let len7 = b1 & 0x7f;
    if opcode.is_control() {
        if !fin {
            return Err(FrameError::FragmentedControl);
        }
        if len7 > 125 {
            return Err(FrameError::ControlTooLong);
        }
    }
    let (payload_len, mut at) = match len7 {
        126 => match buf.get(2..4) {
            Some(&[hi, lo]) => (u64::from(u16::from_be_bytes([hi, lo])), 4),
            Some(_) => return Ok(None),
            None => return Ok(None),
        },
        127 => match buf.get(2..10) {
            Some(b) => {
                let mut be = [0u8; 8];
                be.copy_from_slice(b);
                let n = u64::from_be_bytes(be);
                if n >> 63 != 0 {
                    return Err(FrameError::BadLength);
                }
                (n, 10)
            }
            None => return Ok(None),
        },
        n => (u64::from(n), 2),
    };
    if payload_len > max_payload {
        return Err(FrameError::TooBig);
    }
    let mask = if masked {
        let Some(&[a, b, c, d]) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        at += 4;
        Some([a, b, c, d])
    } else {
        None
    };
    Ok(Some(FrameHeader {
        fin,
        rsv,
        opcode,
        mask,
        payload_len,
        header_len: at,
    }))
}

/// XORs `data` with `mask`, where `data[0]` is byte number `offset` of the payload.
pub fn apply_mask(data: &mut [u8], mask: [u8; 4], offset: usize) {
    let mut m = mask;
    m.rotate_left(offset % 4);
    // The mask repeated over 8 bytes, in memory order, so one XOR covers 8 payload bytes.
    let mut w = [0u8; 8];
    w[..4].copy_from_slice(&m);
    w[4..].copy_from_slice(&m);
    let wide = u64::from_ne_bytes(w);
    let mut chunks = data.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(b) ^ wide).to_ne_bytes());
    }
    for (byte, k) in chunks.into_remainder().iter_mut().zip(m.iter().cycle()) {
        *byte ^= k;
    }
}

/// Writes an unmasked (server) frame header for a `len`-byte payload; returns its length.
pub fn encode_header(out: &mut [u8; 10], fin: bool, rsv1: bool, opcode: OpCode, len: u64) -> usize {
    out[0] = u8::from(fin) << 7 | u8::from(rsv1) << 6 | opcode as u8;
    if len < 126 {
        out[1] = len as u8;
        2
    } else if let Ok(short) = u16::try_from(len) {
        out[1] = 126;
        out[2..4].copy_from_slice(&short.to_be_bytes());
        4
    } else {
        out[1] = 127;
        out[2..10].copy_from_slice(&len.to_be_bytes());
        10
    }
}

/// A complete unmasked frame with RSV1 set: a message compressed with permessage-deflate.
pub fn encode_compressed_frame(opcode: OpCode, compressed: &[u8]) -> Vec<u8> {
    let mut head = [0u8; 10];
    let n = encode_header(&mut head, true, true, opcode, compressed.len() as u64);
    let mut out = Vec::with_capacity(n + compressed.len());
    out.extend_from_slice(head.get(..n).unwrap_or_default());
    out.extend_from_slice(compressed);
    out
}

/// A complete unmasked frame, header and payload, in a Vec of exactly that size.
pub fn encode_frame(opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let mut head = [0u8; 10];
    let n = encode_header(&mut head, true, false, opcode, payload.len() as u64);
    let mut out = Vec::with_capacity(n + payload.len());
    out.extend_from_slice(head.get(..n).unwrap_or_default());
    out.extend_from_slice(payload);
    out
}

/// A complete masked frame: what a client sends (RFC 6455 section 5.3). The server never sends
/// one; load generators and tests that play the client do. `mask` must be unpredictable to the
/// application on a real network (section 10.3); tests may fix it.
pub fn encode_client_frame(opcode: OpCode, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut head = [0u8; 10];
    let n = encode_header(&mut head, true, false, opcode, payload.len() as u64);
    head[1] |= 0x80;
    let mut out = Vec::with_capacity(n + 4 + payload.len());
    out.extend_from_slice(head.get(..n).unwrap_or_default());
    out.extend_from_slice(&mask);
    let start = out.len();
    out.extend_from_slice(payload);
    if let Some(body) = out.get_mut(start..) {
        apply_mask(body, mask, 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_frames_parse_back_as_masked_frames() {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        for len in [0usize, 5, 125, 126, 65_535, 65_536] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let frame = encode_client_frame(OpCode::Binary, &payload, mask);
            let Ok(Some(h)) = parse_header(&frame, true, u64::MAX) else {
                panic!("a client frame of {len} bytes does not parse");
            };
            assert!(h.fin);
            assert_eq!(h.opcode, OpCode::Binary);
            assert_eq!(h.mask, Some(mask));
            assert_eq!(h.payload_len, len as u64);
            assert_eq!(frame.len(), h.header_len + len);
            let mut body = frame[h.header_len..].to_vec();
            apply_mask(&mut body, mask, 0);
            assert_eq!(body, payload);
        }
        // RFC 6455 section 5.7: a masked "Hello".
        assert_eq!(
            encode_client_frame(OpCode::Text, b"Hello", mask),
            [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58]
        );
    }

    const MAX: u64 = u64::MAX;

    fn header(buf: &[u8]) -> FrameHeader {
        match parse_header(buf, true, MAX) {
            Ok(Some(h)) => h,
            other => panic!("expected a header, got {other:?}"),
        }
    }

    #[test]
    fn rfc_examples() {
        // RFC 6455 5.7: masked "Hello".
        let h = header(&[0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d]);
        assert_eq!(
            h,
            FrameHeader {
                fin: true,
                rsv: 0,
                opcode: OpCode::Text,
                mask: Some([0x37, 0xfa, 0x21, 0x3d]),
                payload_len: 5,
                header_len: 6
            }
        );
        let mut payload = [0x7f, 0x9f, 0x4d, 0x51, 0x58];
        apply_mask(&mut payload, [0x37, 0xfa, 0x21, 0x3d], 0);
        assert_eq!(&payload, b"Hello");
        // 256 bytes binary, 64 KiB binary (unmasked, as a server would send them).
        let h = parse_header(&[0x82, 0x7E, 0x01, 0x00], false, MAX)
            .ok()
            .flatten();
        assert_eq!(h.map(|h| (h.payload_len, h.header_len)), Some((256, 4)));
        let h = parse_header(&[0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0], false, MAX)
            .ok()
            .flatten();
        assert_eq!(h.map(|h| (h.payload_len, h.header_len)), Some((65536, 10)));
    }

    #[test]
    fn every_prefix_needs_more() {
        let full = [0x82, 0xFF, 0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4];
        for n in 0..full.len() {
            assert_eq!(parse_header(&full[..n], true, MAX), Ok(None), "prefix {n}");
        }
        assert_eq!(header(&full).header_len, 14);
    }

    #[test]
    fn violations() {
        let cases: &[(&[u8], FrameError)] = &[
            (&[0x83, 0x80], FrameError::ReservedOpcode(3)),
            (&[0x8B, 0x80], FrameError::ReservedOpcode(0xB)),
            (&[0xC1, 0x80], FrameError::ReservedBits),
            (&[0xA1, 0x80], FrameError::ReservedBits),
            (&[0x91, 0x80], FrameError::ReservedBits),
            (&[0x81, 0x00], FrameError::Unmasked),
            (&[0x89, 0xFE], FrameError::ControlTooLong),
            (&[0x09, 0x80], FrameError::FragmentedControl),
            (
                &[0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0],
                FrameError::BadLength,
            ),
        ];
        for (buf, err) in cases {
            assert_eq!(parse_header(buf, true, MAX), Err(*err), "{buf:?}");
        }
    }

    #[test]
    fn too_big_is_reported_before_the_mask_and_payload() {
        assert_eq!(
            parse_header(&[0x82, 0xFE, 0x01, 0x00], true, 255),
            Err(FrameError::TooBig)
        );
        assert_eq!(parse_header(&[0x82, 0xFE, 0x00, 0xFF], true, 255), Ok(None));
    }

    #[test]
    fn masking_matches_bytewise_reference_at_any_offset() {
        let mask = [0xA1, 0x02, 0xF3, 0x44];
        for len in 0..40 {
            for offset in 0..8 {
                let original: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                let mut fast = original.clone();
                apply_mask(&mut fast, mask, offset);
                let slow: Vec<u8> = original
                    .iter()
                    .enumerate()
                    .map(|(i, b)| b ^ mask[(i + offset) % 4])
                    .collect();
                assert_eq!(fast, slow, "len {len} offset {offset}");
            }
        }
    }

    #[test]
    fn encoding_round_trips() {
        for len in [0usize, 1, 125, 126, 127, 65535, 65536, 70000] {
            let payload = vec![0x5a; len];
            let frame = encode_frame(OpCode::Binary, &payload);
            let h = parse_header(&frame, false, MAX)
                .ok()
                .flatten()
                .expect("header");
            assert_eq!(h.payload_len, len as u64);
            assert_eq!(frame.len(), h.header_len + len);
            assert_eq!(frame.capacity(), frame.len());
            assert!(h.fin && h.mask.is_none() && h.opcode == OpCode::Binary);
        }
        let mut head = [0u8; 10];
        assert_eq!(encode_header(&mut head, false, true, OpCode::Text, 3), 2);
        assert_eq!(&head[..2], &[0x41, 3]);
    }

    #[test]
    fn opcodes() {
        for v in 0..16u8 {
            if let Some(op) = OpCode::from_u8(v) {
                assert_eq!(op as u8, v);
                assert_eq!(op.is_control(), v >= 8);
            }
        }
        assert_eq!(OpCode::from_u8(3), None);
    }
}
