//! Message assembly (RFC 6455 sections 5.4, 5.5 and 8.1): frames in, messages and control
//! events out.
//!
//! An idle connection's [`Receiver`] is one null pointer. State is allocated only while a
//! fragmented message is in progress, and dropped when it completes. A message that arrives in
//! a single frame is unmasked in place and handed out borrowed, without a copy.

use std::borrow::Cow;

use super::close::{parse_close, CloseCode, CloseError};
use super::frame::{apply_mask, parse_header, parse_header_with, FrameError, OpCode};

/// Whether a data message is text or binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    /// UTF-8 text.
    Text,
    /// Arbitrary bytes.
    Binary,
}

/// What one frame produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A complete data message: borrowed from the input when it arrived in one frame, owned
    /// when reassembled from fragments.
    Message {
        /// Text or binary.
        kind: DataKind,
        /// The unmasked payload: valid UTF-8 for uncompressed text; for a compressed message,
        /// the deflate data, which the caller inflates and then validates.
        payload: Cow<'a, [u8]>,
        /// The first frame had RSV1 set under a negotiated permessage-deflate.
        compressed: bool,
    },
    /// A Ping with its payload; the caller answers with a Pong carrying the same payload.
    Ping(&'a [u8]),
    /// A Pong with its payload.
    Pong(&'a [u8]),
    /// A valid Close; the caller answers with a Close echoing the code.
    Close(Option<(CloseCode, &'a str)>),
}

/// Why the connection must be failed: the close code and a short reason for the Close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Violation {
    /// The close code to send.
    pub code: CloseCode,
    /// A short, static reason for the Close frame and the log.
    pub reason: &'static str,
}

impl Violation {
    const fn new(code: CloseCode, reason: &'static str) -> Self {
        Violation { code, reason }
    }
}

/// Limits applied while receiving.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest message accepted, summed over its fragments.
    pub max_message: usize,
    /// Refuse unmasked frames (always true for a server talking to clients).
    pub require_mask: bool,
    /// permessage-deflate was negotiated: RSV1 on a message's first frame marks it compressed.
    pub deflate: bool,
}

/// Per-connection receive state.
#[derive(Debug, Default)]
pub struct Receiver {
    frag: Option<Box<Fragmented>>,
}

#[derive(Debug)]
struct Fragmented {
    kind: DataKind,
    compressed: bool,
    buf: Vec<u8>,
    /// For text: `buf[..utf8_valid_upto]` is known to be valid UTF-8; the rest is the start of
    /// a character split across fragments.
    utf8_valid_upto: usize,
}

const UNEXPECTED_CONTINUATION: Violation = Violation::new(
    CloseCode::Protocol,
    "continuation frame without a message in progress",
);
const EXPECTED_CONTINUATION: Violation = Violation::new(
    CloseCode::Protocol,
    "new message while a fragmented one is in progress",
);
const BAD_UTF8: Violation =
    Violation::new(CloseCode::InvalidPayload, "invalid UTF-8 in text message");
const TOO_BIG: Violation = Violation::new(CloseCode::TooBig, "message too big");
const RSV1_ON_CONTINUATION: Violation =
    Violation::new(CloseCode::Protocol, "RSV1 set on a continuation frame");

fn frame_violation(e: FrameError) -> Violation {
    let reason = match e {
        FrameError::ReservedOpcode(_) => "reserved opcode",
        FrameError::ReservedBits => "reserved bits set",
        FrameError::Unmasked => "client frames must be masked",
        FrameError::ControlTooLong => "control frame longer than 125 bytes",
        FrameError::FragmentedControl => "fragmented control frame",
        FrameError::BadLength => "invalid payload length",
        FrameError::TooBig => "message too big",
    };
    Violation::new(e.close_code(), reason)
}

fn close_violation(e: CloseError) -> Violation {
    let reason = match e {
        CloseError::Truncated => "one-byte close payload",
        CloseError::InvalidCode(_) => "invalid close code",
        CloseError::InvalidReason => "close reason is not UTF-8",
    };
    Violation::new(e.close_code(), reason)
}

/// Validates `buf[from..]` as the continuation of valid UTF-8 and returns how far it is
/// valid. An incomplete character at the very end is allowed (more may follow); any sequence
/// that can never become valid is an error.
fn validate_utf8_prefix(buf: &[u8], from: usize) -> Result<usize, Violation> {
    let tail = buf.get(from..).unwrap_or_default();
    match std::str::from_utf8(tail) {
        Ok(_) => Ok(buf.len()),
        Err(e) if e.error_len().is_none() => Ok(from + e.valid_up_to()),
        Err(_) => Err(BAD_UTF8),
    }
}

impl Receiver {
    /// Decodes at most one frame from the start of `buf`, unmasking its payload in place.
    ///
    /// `Ok(None)`: `buf` does not hold a whole frame yet. `Ok(Some((consumed, event)))`: a
    /// frame of `consumed` bytes was processed; `event` is `None` for a non-final fragment.
    /// Errors are reported as soon as the header proves them, before the payload arrives.
    pub fn next<'a>(
        &'a mut self,
        buf: &'a mut [u8],
        limits: &Limits,
    ) -> Result<Option<(usize, Option<Event<'a>>)>, Violation> {
        let header = match parse_header_with(buf, limits.require_mask, limits.deflate, u64::MAX) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(None),
            Err(e) => return Err(frame_violation(e)),
        };
        // Sequencing and size are checked from the header alone.
        let already = self.frag.as_ref().map(|f| f.buf.len() as u64);
        match (header.opcode, already) {
            (OpCode::Continuation, None) => return Err(UNEXPECTED_CONTINUATION),
            (OpCode::Text | OpCode::Binary, Some(_)) => return Err(EXPECTED_CONTINUATION),
            // RFC 7692 6.1: RSV1 belongs to a message's first frame only.
            (OpCode::Continuation, Some(_)) if header.rsv & 0b100 != 0 => {
                return Err(RSV1_ON_CONTINUATION)
            }
            _ => {}
        }
        if !header.opcode.is_control()
            && already.unwrap_or(0).saturating_add(header.payload_len) > limits.max_message as u64
        {
            return Err(TOO_BIG);
        }
        // The length is now bounded by max_message (data) or 125 (control), so it fits a usize.
        let len = usize::try_from(header.payload_len).map_err(|_| TOO_BIG)?;
        let total = header.header_len + len;
        if buf.len() < total {
            return Ok(None);
        }
        let Some(payload) = buf.get_mut(header.header_len..total) else {
            return Ok(None);
        };
        if let Some(mask) = header.mask {
            apply_mask(payload, mask, 0);
        }
        let payload: &'a [u8] = payload;

        let event = match header.opcode {
            OpCode::Ping => Some(Event::Ping(payload)),
            OpCode::Pong => Some(Event::Pong(payload)),
            OpCode::Close => Some(Event::Close(parse_close(payload).map_err(close_violation)?)),
            OpCode::Text | OpCode::Binary => {
                let kind = if header.opcode == OpCode::Text {
                    DataKind::Text
                } else {
                    DataKind::Binary
                };
                let compressed = header.rsv & 0b100 != 0;
                // Compressed text is validated after inflating, by the caller.
                let check_utf8 = kind == DataKind::Text && !compressed;
                if header.fin {
                    if check_utf8 && std::str::from_utf8(payload).is_err() {
                        return Err(BAD_UTF8);
                    }
                    Some(Event::Message {
                        kind,
                        payload: Cow::Borrowed(payload),
                        compressed,
                    })
                } else {
                    let utf8_valid_upto = if check_utf8 {
                        validate_utf8_prefix(payload, 0)?
                    } else {
                        0
                    };
                    let buf = payload.to_vec();
                    self.frag = Some(Box::new(Fragmented {
                        kind,
                        compressed,
                        buf,
                        utf8_valid_upto,
                    }));
                    None
                }
            }
            OpCode::Continuation => {
                let Some(frag) = self.frag.as_mut() else {
                    return Err(UNEXPECTED_CONTINUATION);
                };
                frag.buf.extend_from_slice(payload);
                if frag.kind == DataKind::Text && !frag.compressed {
                    frag.utf8_valid_upto = validate_utf8_prefix(&frag.buf, frag.utf8_valid_upto)?;
                    if header.fin && frag.utf8_valid_upto != frag.buf.len() {
                        return Err(BAD_UTF8);
                    }
                }
                if header.fin {
                    self.frag.take().map(|f| {
                        let Fragmented {
                            kind,
                            buf,
                            compressed,
                            ..
                        } = *f;
                        Event::Message {
                            kind,
                            payload: Cow::Owned(buf),
                            compressed,
                        }
                    })
                } else {
                    None
                }
            }
        };
        Ok(Some((total, event)))
    }

    /// Length of the whole frame at the start of `buf`, if its header is complete and valid,
    /// so the caller can reserve exactly that much for a partial frame.
    pub fn frame_len(buf: &[u8]) -> Option<u64> {
        match parse_header(buf, false, u64::MAX) {
            Ok(Some(h)) => Some((h.header_len as u64).saturating_add(h.payload_len)),
            _ => None,
        }
    }

    /// Whether a fragmented message is in progress.
    pub fn in_message(&self) -> bool {
        self.frag.is_some()
    }

    /// Whether the fragmented message in progress is compressed (its first frame had RSV1).
    pub fn in_compressed_message(&self) -> bool {
        self.frag.as_ref().is_some_and(|f| f.compressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_message: 1 << 20,
        require_mask: true,
        deflate: false,
    };
    const DEFLATE: Limits = Limits {
        deflate: true,
        ..LIMITS
    };
    const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// A masked client frame.
    fn frame(fin: bool, op: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::from(fin) << 7 | op];
        let len = payload.len();
        if len < 126 {
            out.push(0x80 | len as u8);
        } else if len <= 0xffff {
            out.push(0x80 | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            out.push(0x80 | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
        out.extend_from_slice(&MASK);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
        out
    }

    /// What a run over `input` produced, as owned values.
    #[derive(Debug, PartialEq, Eq)]
    enum Got {
        Msg(DataKind, Vec<u8>),
        Zipped(DataKind, Vec<u8>),
        Ping(Vec<u8>),
        Pong(Vec<u8>),
        Close(Option<(u16, String)>),
        Fragment,
    }

    /// Feeds all of `input`, returning events and the first violation.
    fn run(rx: &mut Receiver, input: &[u8], limits: &Limits) -> (Vec<Got>, Option<Violation>) {
        let (got, err, _) = feed(rx, input, limits);
        (got, err)
    }

    /// Decodes every complete frame in `input`: events, first violation, bytes consumed.
    fn feed(
        rx: &mut Receiver,
        input: &[u8],
        limits: &Limits,
    ) -> (Vec<Got>, Option<Violation>, usize) {
        let mut buf = input.to_vec();
        let mut at = 0;
        let mut got = Vec::new();
        loop {
            match rx.next(&mut buf[at..], limits) {
                Ok(None) => return (got, None, at),
                Ok(Some((n, ev))) => {
                    got.push(match ev {
                        None => Got::Fragment,
                        Some(Event::Message {
                            kind,
                            payload,
                            compressed: false,
                        }) => Got::Msg(kind, payload.into_owned()),
                        Some(Event::Message {
                            kind,
                            payload,
                            compressed: true,
                        }) => Got::Zipped(kind, payload.into_owned()),
                        Some(Event::Ping(p)) => Got::Ping(p.to_vec()),
                        Some(Event::Pong(p)) => Got::Pong(p.to_vec()),
                        Some(Event::Close(c)) => {
                            Got::Close(c.map(|(code, r)| (code.as_u16(), r.to_owned())))
                        }
                    });
                    at += n;
                }
                Err(v) => return (got, Some(v), at),
            }
        }
    }

    fn text(s: &str) -> Got {
        Got::Msg(DataKind::Text, s.as_bytes().to_vec())
    }

    #[test]
    fn idle_receiver_is_one_pointer() {
        assert_eq!(std::mem::size_of::<Receiver>(), 8);
    }

    #[test]
    fn rfc_examples() {
        // Single-frame masked "Hello", exactly as in RFC 6455 5.7.
        let hello = [
            0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
        ];
        let mut rx = Receiver::default();
        assert_eq!(run(&mut rx, &hello, &LIMITS), (vec![text("Hello")], None));
        // Fragmented "Hel" + "lo".
        let mut input = frame(false, 1, b"Hel");
        input.extend(frame(true, 0, b"lo"));
        assert_eq!(
            run(&mut rx, &input, &LIMITS),
            (vec![Got::Fragment, text("Hello")], None)
        );
        assert!(!rx.in_message());
        // Ping "Hello".
        let got = run(&mut rx, &frame(true, 9, b"Hello"), &LIMITS);
        assert_eq!(got, (vec![Got::Ping(b"Hello".to_vec())], None));
        // 256 bytes and 64 KiB binary.
        for len in [256usize, 65536] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let got = run(&mut rx, &frame(true, 2, &payload), &LIMITS);
            assert_eq!(got, (vec![Got::Msg(DataKind::Binary, payload)], None));
        }
    }

    #[test]
    fn single_frame_messages_are_borrowed() {
        let mut buf = frame(true, 2, b"abc");
        let mut rx = Receiver::default();
        match rx.next(&mut buf, &LIMITS) {
            Ok(Some((
                _,
                Some(Event::Message {
                    payload: Cow::Borrowed(p),
                    ..
                }),
            ))) => {
                assert_eq!(p, b"abc")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn control_frames_interleave_with_fragments() {
        let mut input = frame(false, 1, b"fragment1");
        input.extend(frame(true, 9, b"p"));
        input.extend(frame(false, 0, b" fragment2"));
        input.extend(frame(true, 10, b""));
        input.extend(frame(true, 0, b" end"));
        let mut rx = Receiver::default();
        let (got, err) = run(&mut rx, &input, &LIMITS);
        assert_eq!(err, None);
        assert_eq!(
            got,
            vec![
                Got::Fragment,
                Got::Ping(b"p".to_vec()),
                Got::Fragment,
                Got::Pong(vec![]),
                text("fragment1 fragment2 end")
            ]
        );
    }

    #[test]
    fn every_split_point_needs_more_until_complete() {
        let mut input = frame(false, 1, "héllo ".as_bytes());
        input.extend(frame(true, 9, b"ping"));
        input.extend(frame(true, 0, "wörld".as_bytes()));
        input.extend(frame(true, 2, &[0u8; 300]));
        let mut rx = Receiver::default();
        let (whole, err) = run(&mut rx, &input, &LIMITS);
        assert_eq!(err, None);
        assert_eq!(whole.len(), 4);
        // Feed the same stream the way a socket would: append bytes, decode what is complete.
        for chunk in 1..=17 {
            let mut rx = Receiver::default();
            let mut pending: Vec<u8> = Vec::new();
            let mut got = Vec::new();
            for piece in input.chunks(chunk) {
                pending.extend_from_slice(piece);
                let (events, err, n) = feed(&mut rx, &pending, &LIMITS);
                assert_eq!(err, None);
                got.extend(events);
                pending.drain(..n);
            }
            assert!(pending.is_empty(), "chunk {chunk}");
            assert_eq!(got, whole, "chunk {chunk}");
        }
        // And every strict prefix of the first frame is "need more".
        let first = frame(true, 1, b"hello");
        for n in 0..first.len() {
            let mut rx = Receiver::default();
            let mut p = first[..n].to_vec();
            assert_eq!(rx.next(&mut p, &LIMITS), Ok(None), "prefix {n}");
        }
    }

    #[test]
    fn sequencing_errors() {
        let mut rx = Receiver::default();
        let (_, err) = run(&mut rx, &frame(true, 0, b"x"), &LIMITS);
        assert_eq!(err, Some(UNEXPECTED_CONTINUATION));
        let mut input = frame(false, 1, b"a");
        input.extend(frame(true, 1, b"b"));
        let (_, err) = run(&mut Receiver::default(), &input, &LIMITS);
        assert_eq!(err, Some(EXPECTED_CONTINUATION));
        assert_eq!(EXPECTED_CONTINUATION.code, CloseCode::Protocol);
    }

    #[test]
    fn sequencing_error_is_reported_from_the_header_alone() {
        let mut rx = Receiver::default();
        let mut header_only = frame(true, 0, &[0u8; 100]);
        header_only.truncate(6);
        assert_eq!(
            rx.next(&mut header_only, &LIMITS),
            Err(UNEXPECTED_CONTINUATION)
        );
    }

    #[test]
    fn frame_errors_map_to_close_codes() {
        let mut unmasked = vec![0x81, 0x01, b'a'];
        let err = Receiver::default().next(&mut unmasked, &LIMITS).err();
        assert_eq!(err.map(|v| v.code), Some(CloseCode::Protocol));
        let lax = Limits {
            require_mask: false,
            ..LIMITS
        };
        let got = run(&mut Receiver::default(), &unmasked, &lax);
        assert_eq!(got, (vec![text("a")], None));
        let mut rsv = frame(true, 1, b"a");
        rsv[0] |= 0x40;
        assert_eq!(
            run(&mut Receiver::default(), &rsv, &LIMITS)
                .1
                .map(|v| v.code),
            Some(CloseCode::Protocol)
        );
    }

    #[test]
    fn invalid_utf8_split_across_fragments_fails_at_the_bad_fragment() {
        // "κόσμε" followed by an invalid byte, split at every position.
        let mut bytes = "κόσμε".as_bytes().to_vec();
        bytes.extend_from_slice(&[0xed, 0xa0, 0x80]); // a UTF-16 surrogate: never valid
        bytes.extend_from_slice(b"edited");
        let bad_at = "κόσμε".len() + 1; // the surrogate is proven invalid by its second byte
        for split in 0..=bytes.len() {
            let mut input = frame(false, 1, &bytes[..split]);
            input.extend(frame(true, 0, &bytes[split..]));
            let (got, err) = run(&mut Receiver::default(), &input, &LIMITS);
            assert_eq!(err, Some(BAD_UTF8), "split {split}");
            // Fail fast: the fragment holding the proving byte is the one refused.
            assert_eq!(got.len(), usize::from(split <= bad_at), "split {split}");
        }
    }

    #[test]
    fn valid_utf8_split_at_every_byte() {
        let s = "a€𝄞é";
        for split in 0..=s.len() {
            let mut input = frame(false, 1, &s.as_bytes()[..split]);
            input.extend(frame(true, 0, &s.as_bytes()[split..]));
            let (got, err) = run(&mut Receiver::default(), &input, &LIMITS);
            assert_eq!(err, None, "split {split}");
            assert_eq!(got.last(), Some(&text(s)));
        }
    }

    #[test]
    fn incomplete_character_at_the_end_of_the_message_is_invalid() {
        let mut input = frame(false, 1, b"ok");
        input.extend(frame(true, 0, &[0xe2, 0x82]));
        assert_eq!(
            run(&mut Receiver::default(), &input, &LIMITS).1,
            Some(BAD_UTF8)
        );
        assert_eq!(
            run(
                &mut Receiver::default(),
                &frame(true, 1, &[0xe2, 0x82]),
                &LIMITS
            )
            .1,
            Some(BAD_UTF8)
        );
    }

    #[test]
    fn overlong_and_surrogates_are_rejected() {
        for bad in [
            &[0xc0, 0xaf][..],
            &[0xe0, 0x80, 0xaf],
            &[0xed, 0xa0, 0x80],
            &[0xf4, 0x90, 0x80, 0x80],
            &[0xff],
        ] {
            assert_eq!(
                run(&mut Receiver::default(), &frame(true, 1, bad), &LIMITS).1,
                Some(BAD_UTF8)
            );
            let mut input = frame(false, 1, &bad[..1]);
            input.extend(frame(true, 0, &bad[1..]));
            assert_eq!(
                run(&mut Receiver::default(), &input, &LIMITS).1,
                Some(BAD_UTF8),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn binary_is_not_validated() {
        let got = run(
            &mut Receiver::default(),
            &frame(true, 2, &[0xff, 0xfe]),
            &LIMITS,
        );
        assert_eq!(
            got,
            (vec![Got::Msg(DataKind::Binary, vec![0xff, 0xfe])], None)
        );
    }

    #[test]
    fn rsv1_marks_compressed_messages_only_when_negotiated() {
        let mut zipped = frame(true, 1, b"\xff\x00 not utf-8: inflated later");
        zipped[0] |= 0x40;
        // Without the extension, RSV1 is a protocol error.
        let (_, err) = run(&mut Receiver::default(), &zipped, &LIMITS);
        assert_eq!(err.map(|v| v.code), Some(CloseCode::Protocol));
        // With it, the message comes out compressed and unvalidated.
        let (got, err) = run(&mut Receiver::default(), &zipped, &DEFLATE);
        assert_eq!(err, None);
        assert!(matches!(&got[..], [Got::Zipped(DataKind::Text, _)]));
        // Fragmented: RSV1 on the first frame only.
        let mut first = frame(false, 2, b"ab");
        first[0] |= 0x40;
        let mut input = first.clone();
        input.extend(frame(true, 0, b"cd"));
        let (got, err) = run(&mut Receiver::default(), &input, &DEFLATE);
        assert_eq!(err, None);
        assert_eq!(got[1], Got::Zipped(DataKind::Binary, b"abcd".to_vec()));
        let mut bad_cont = frame(true, 0, b"cd");
        bad_cont[0] |= 0x40;
        let mut input = first;
        input.extend(bad_cont);
        let (_, err) = run(&mut Receiver::default(), &input, &DEFLATE);
        assert_eq!(err.map(|v| v.code), Some(CloseCode::Protocol));
        // Never on control frames, and RSV2/RSV3 stay reserved.
        for (op, bits) in [(9u8, 0x40u8), (1, 0x20), (1, 0x10)] {
            let mut f = frame(true, op, b"x");
            f[0] |= bits;
            let (_, err) = run(&mut Receiver::default(), &f, &DEFLATE);
            assert_eq!(
                err.map(|v| v.code),
                Some(CloseCode::Protocol),
                "{op} {bits:#x}"
            );
        }
    }

    #[test]
    fn size_limit_across_fragments() {
        let limits = Limits {
            max_message: 10,
            require_mask: true,
            deflate: false,
        };
        let mut input = frame(false, 2, &[1; 6]);
        input.extend(frame(true, 0, &[2; 4]));
        let (got, err) = run(&mut Receiver::default(), &input, &limits);
        assert_eq!((got.len(), err), (2, None));
        let mut input = frame(false, 2, &[1; 6]);
        input.extend(frame(false, 0, &[2; 5]));
        let (_, err) = run(&mut Receiver::default(), &input, &limits);
        assert_eq!(err, Some(TOO_BIG));
        // Detected from the header, before the payload arrives.
        let mut head = frame(true, 2, &[0; 11]);
        head.truncate(6);
        assert_eq!(Receiver::default().next(&mut head, &limits), Err(TOO_BIG));
        assert_eq!(TOO_BIG.code.as_u16(), 1009);
    }

    #[test]
    fn close_frames() {
        let got = run(&mut Receiver::default(), &frame(true, 8, b""), &LIMITS);
        assert_eq!(got, (vec![Got::Close(None)], None));
        let got = run(
            &mut Receiver::default(),
            &frame(true, 8, b"\x03\xe8bye"),
            &LIMITS,
        );
        assert_eq!(got, (vec![Got::Close(Some((1000, "bye".into())))], None));
        for code in [3000u16, 4999] {
            let got = run(
                &mut Receiver::default(),
                &frame(true, 8, &code.to_be_bytes()),
                &LIMITS,
            );
            assert_eq!(got, (vec![Got::Close(Some((code, String::new())))], None));
        }
        let one = run(&mut Receiver::default(), &frame(true, 8, b"\x03"), &LIMITS).1;
        assert_eq!(one.map(|v| v.code), Some(CloseCode::Protocol));
        for code in [999u16, 1004, 1005, 1006, 5000] {
            let err = run(
                &mut Receiver::default(),
                &frame(true, 8, &code.to_be_bytes()),
                &LIMITS,
            )
            .1;
            assert_eq!(err.map(|v| v.code), Some(CloseCode::Protocol), "{code}");
        }
        let err = run(
            &mut Receiver::default(),
            &frame(true, 8, b"\x03\xe8\xff"),
            &LIMITS,
        )
        .1;
        assert_eq!(err.map(|v| v.code), Some(CloseCode::InvalidPayload));
    }

    #[test]
    fn frame_len_reports_header_plus_payload() {
        let f = frame(true, 2, &[0; 300]);
        assert_eq!(Receiver::frame_len(&f[..1]), None);
        assert_eq!(Receiver::frame_len(&f[..3]), None);
        assert_eq!(Receiver::frame_len(&f[..4]), None); // mask not complete
        assert_eq!(Receiver::frame_len(&f[..8]), Some(f.len() as u64));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0xdead_beef_cafe_f00d;
        let limits = Limits {
            max_message: 64,
            require_mask: false,
            deflate: x & 1 == 1,
        };
        for _ in 0..50_000 {
            let mut buf = Vec::new();
            for _ in 0..(x % 24) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Bias towards plausible headers so deep paths are reached.
                let b = match x % 5 {
                    0 => [0x01, 0x81, 0x80, 0x00, 0x88][(x >> 8) as usize % 5],
                    1 => (x >> 16) as u8 & 0x8f,
                    _ => (x >> 24) as u8,
                };
                buf.push(b);
            }
            let mut rx = Receiver::default();
            let mut at = 0;
            while let Ok(Some((n, _))) = rx.next(&mut buf[at..], &limits) {
                assert!(n > 0);
                at += n;
            }
        }
    }
}
