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
