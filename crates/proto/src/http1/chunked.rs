//! A sans-IO decoder for chunked request bodies (RFC 9112 section 7.1).
//!
//! Chunk extensions are skipped, trailer fields are read and discarded, and the decoded size is
//! limited so a client cannot make the server buffer more than it allows. Every line the decoder
//! has to look at (chunk size, trailers) is bounded too.

/// Why a chunked body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The chunked framing is invalid.
    #[error("malformed chunked body")]
    Malformed,
    /// The decoded body exceeds the limit.
    #[error("body too large")]
    TooLarge,
}

/// Longest chunk-size line (size plus extensions) or trailer line accepted.
const MAX_LINE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Reading a chunk-size line; `len` bytes of it seen so far.
    Size { len: usize },
    /// Copying chunk data; this many bytes left.
    Data { left: u64 },
    /// Expecting the CRLF after chunk data; `seen` bytes of it consumed.
    DataEnd { seen: u8 },
    /// Reading trailer lines after the last chunk; `len` bytes of the current one seen.
    Trailer { len: usize },
    /// The body is complete.
    Done,
}

/// Decoder state. Feed it bytes with [`ChunkedDecoder::decode`] as they arrive.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    step: Step,
    /// The chunk size being accumulated while in `Step::Size`, or `None` before any digit.
    size: Option<u64>,
    /// Whether the size line has reached its extensions (after `;`) or trailing whitespace.
    size_ended: bool,
    decoded: usize,
    max_body: usize,
}

impl ChunkedDecoder {
    /// The decoder's state as bytes, for a hand-over (`crate::h2::server::park`): always
    /// [`Self::PARKED_LEN`] bytes, `STEP (u8) | STEP_VALUE (u64 LE) | HAS_SIZE (u8) |
    /// SIZE (u64 LE) | SIZE_ENDED (u8) | DECODED (u64 LE) | MAX_BODY (u64 LE)`.
    pub fn park(&self, out: &mut Vec<u8>) {
        let ChunkedDecoder {
            step,
            size,
            size_ended,
            decoded,
            max_body,
        } = self;
        let (tag, value) = match *step {
            Step::Size { len } => (0u8, len as u64),
            Step::Data { left } => (1, left),
            Step::DataEnd { seen } => (2, u64::from(seen)),
            Step::Trailer { len } => (3, len as u64),
            Step::Done => (4, 0),
        };
        out.push(tag);
        out.extend_from_slice(&value.to_le_bytes());
        out.push(u8::from(size.is_some()));
        out.extend_from_slice(&size.unwrap_or(0).to_le_bytes());
        out.push(u8::from(*size_ended));
        out.extend_from_slice(&(*decoded as u64).to_le_bytes());
        out.extend_from_slice(&(*max_body as u64).to_le_bytes());
    }

    /// Bytes [`ChunkedDecoder::park`] writes.
    pub const PARKED_LEN: usize = 1 + 8 + 1 + 8 + 1 + 8 + 8;

    /// A decoder from [`ChunkedDecoder::park`]'s bytes (exactly [`Self::PARKED_LEN`]); `None`
    /// for a state the decoder could not have been in (one encoding per state).
    pub fn restore(b: &[u8; Self::PARKED_LEN]) -> Option<ChunkedDecoder> {
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b.get(i..i + 8).unwrap_or(&[0; 8]));
            u64::from_le_bytes(a)
        };
        let value = u64_at(1);
        let small = |v: u64| usize::try_from(v).ok().filter(|&n| n <= MAX_LINE);
        let step = match b[0] {
            0 => Step::Size { len: small(value)? },
            1 => Step::Data { left: value },
            2 if value <= 1 => Step::DataEnd { seen: value as u8 },
            3 => Step::Trailer { len: small(value)? },
            4 if value == 0 => Step::Done,
            _ => return None,
        };
        let size = match (b[9], u64_at(10)) {
            (0, 0) => None,
            (1, v) => Some(v),
            _ => return None,
        };
        let size_ended = match b[18] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let decoded = usize::try_from(u64_at(19)).ok()?;
        let max_body = usize::try_from(u64_at(27)).ok()?;
        if decoded > max_body {
            return None;
        }
        Some(ChunkedDecoder {
            step,
            size,
            size_ended,
            decoded,
            max_body,
        })
    }

    /// A decoder that refuses bodies larger than `max_body` decoded bytes.
    pub fn new(max_body: usize) -> Self {
        ChunkedDecoder {
            step: Step::Size { len: 0 },
            size: None,
            size_ended: false,
            decoded: 0,
            max_body,
        }
    }

    /// Consumes bytes from `input`, appending decoded body bytes to `out`. Returns how many
    /// bytes were consumed and whether the body is complete. Bytes after the end of the body
    /// are not consumed.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, bool), BodyError> {
        let mut i = 0;
        while i < input.len() {
            match self.step {
                Step::Done => break,
                Step::Size { len } => {
                    let Some(&b) = input.get(i) else { break };
                    i += 1;
                    if len + 1 > MAX_LINE {
                        return Err(BodyError::Malformed);
                    }
                    self.step = Step::Size { len: len + 1 };
                    match b {
                        b'\n' => {
                            let size = self.size.take().ok_or(BodyError::Malformed)?;
                            self.size_ended = false;
                            if size == 0 {
                                self.step = Step::Trailer { len: 0 };
                            } else {
                                let total = (self.decoded as u64).saturating_add(size);
                                if total > self.max_body as u64 {
                                    return Err(BodyError::TooLarge);
                                }
                                self.step = Step::Data { left: size };
                            }
                        }
                        b'\r' => {}
                        b';' | b' ' | b'\t' => self.size_ended = true,
                        _ if self.size_ended => {}
                        _ => {
                            let digit = hex(b).ok_or(BodyError::Malformed)?;
                            let size = self.size.unwrap_or(0);
                            if size >> 60 != 0 {
                                return Err(BodyError::TooLarge);
                            }
                            self.size = Some(size << 4 | u64::from(digit));
                        }
                    }
                }
                Step::Data { left } => {
                    let avail = input.len() - i;
                    let take = usize::try_from(left).map_or(avail, |l| l.min(avail));
                    out.extend_from_slice(input.get(i..i + take).unwrap_or_default());
                    i += take;
                    self.decoded += take;
                    let left = left - take as u64;
                    self.step = if left == 0 {
                        Step::DataEnd { seen: 0 }
                    } else {
                        Step::Data { left }
                    };
                }
                Step::DataEnd { seen } => {
                    let Some(&b) = input.get(i) else { break };
                    i += 1;
                    self.step = match (seen, b) {
                        (0, b'\r') => Step::DataEnd { seen: 1 },
                        (0 | 1, b'\n') => Step::Size { len: 0 },
                        _ => return Err(BodyError::Malformed),
                    };
                }
                Step::Trailer { len } => {
                    let Some(&b) = input.get(i) else { break };
                    i += 1;
                    if len + 1 > MAX_LINE {
                        return Err(BodyError::Malformed);
                    }
                    self.step = match b {
                        // An empty line (only CR before LF) ends the trailers.
                        b'\n' if len == 0 => Step::Done,
                        b'\n' => Step::Trailer { len: 0 },
                        b'\r' if len == 0 => Step::Trailer { len: 0 },
                        _ => Step::Trailer { len: len + 1 },
                    };
                }
            }
        }
        Ok((i, self.step == Step::Done))
    }
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], max: usize) -> Result<(Vec<u8>, usize, bool), BodyError> {
        let mut d = ChunkedDecoder::new(max);
        let mut out = Vec::new();
        let (n, done) = d.decode(input, &mut out)?;
        Ok((out, n, done))
    }

    const BODY: &[u8] = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: yes\r\n\r\nNEXT";

    #[test]
    fn decodes_in_one_go() {
        let (out, n, done) = decode_all(BODY, 100).expect("valid");
        assert_eq!(out, b"hello, world");
        assert!(done);
        assert_eq!(&BODY[n..], b"NEXT");
    }

    #[test]
    fn decodes_byte_by_byte_and_at_every_split() {
        let body_len = BODY.len() - b"NEXT".len();
        for split in 0..body_len {
            let mut d = ChunkedDecoder::new(100);
            let mut out = Vec::new();
            let (a, done_a) = d.decode(&BODY[..split], &mut out).expect("first half");
            assert_eq!(a, split);
            assert!(!done_a);
            let (b, done) = d.decode(&BODY[split..], &mut out).expect("second half");
            assert!(done);
            assert_eq!(&BODY[split + b..], b"NEXT");
            assert_eq!(out, b"hello, world");
        }
    }

    #[test]
    fn bare_lf_and_uppercase_hex() {
        let (out, _, done) = decode_all(b"A\nabcdefghij\n0\n\n", 100).expect("valid");
        assert_eq!(out, b"abcdefghij");
        assert!(done);
    }

    #[test]
    fn size_limit() {
        assert_eq!(
            decode_all(b"5\r\nhello\r\n0\r\n\r\n", 4),
            Err(BodyError::TooLarge)
        );
        assert_eq!(
            decode_all(b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n", 5),
            Err(BodyError::TooLarge)
        );
        assert_eq!(
            decode_all(b"fffffffffffffffff\r\n", usize::MAX),
            Err(BodyError::TooLarge)
        );
        assert!(decode_all(b"5\r\nhello\r\n0\r\n\r\n", 5).is_ok());
    }

    #[test]
    fn malformed() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\r\nhelloXX",
            b"; ext\r\n",
            b"-1\r\n",
        ] {
            assert_eq!(decode_all(bad, 100), Err(BodyError::Malformed), "{bad:?}");
        }
        let long = [b'0'; MAX_LINE + 1];
        assert_eq!(decode_all(&long, 100), Err(BodyError::Malformed));
    }

    #[test]
    fn incomplete_is_not_done() {
        let (out, n, done) = decode_all(b"5\r\nhel", 100).expect("partial");
        assert_eq!((out.as_slice(), n, done), (&b"hel"[..], 6, false));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet = b"0123456789abcdefxX;= \t\r\n";
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let buf: Vec<u8> = (0..(x % 40) as usize)
                .map(|i| alphabet[((x >> (i % 59)) as usize ^ i) % alphabet.len()])
                .collect();
            let _ = decode_all(&buf, 64);
        }
    }
}
