//! The Fossil delta format: its base-64 integers, its checksum, writing commands and applying
//! a delta to a base. No matching here (that is [`mod@super::encode`]).

use super::DeltaError;

/// Fossil's base-64 digits, in value order: `0-9`, `A-Z`, `_`, `a-z`, `~`.
const DIGITS: &[u8; 64] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~";

/// The value of a base-64 digit, or `None` for any other byte.
fn digit_value(b: u8) -> Option<u32> {
    let v = match b {
        b'0'..=b'9' => b - b'0',
        b'A'..=b'Z' => b - b'A' + 10,
        b'_' => 36,
        b'a'..=b'z' => b - b'a' + 37,
        b'~' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

/// Appends `n` in base 64, most significant digit first (`0` for zero).
pub(crate) fn put_int(out: &mut Vec<u8>, n: u32) {
    let mut buf = [0u8; 6];
    let mut at = buf.len();
    let mut n = n;
    loop {
        at -= 1;
        // `n & 63` is below 64, the table's length; `at` stays in 0..6 since a u32 has at
        // most 6 base-64 digits.
        #[allow(clippy::indexing_slicing)]
        {
            buf[at] = DIGITS[(n & 63) as usize];
        }
        n >>= 6;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(buf.get(at..).unwrap_or_default());
}

/// Appends the header: the target's size and a newline.
pub(crate) fn put_header(out: &mut Vec<u8>, target_len: u32) {
    put_int(out, target_len);
    out.push(b'\n');
}

/// Appends a copy of `len` bytes of the base from `offset`.
pub(crate) fn put_copy(out: &mut Vec<u8>, len: u32, offset: u32) {
    put_int(out, len);
    out.push(b'@');
    put_int(out, offset);
    out.push(b',');
}

/// Appends an insert of `bytes`, literally.
pub(crate) fn put_insert(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    put_int(out, len_u32(bytes.len()));
    out.push(b':');
    out.extend_from_slice(bytes);
}

/// Appends the terminator carrying the target's checksum.
pub(crate) fn put_trailer(out: &mut Vec<u8>, target: &[u8]) {
    put_int(out, checksum(target));
    out.push(b';');
}

/// A length the encoders were given as at most `u32::MAX` (they refuse larger inputs).
pub(crate) fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The format's checksum of a target: the wrapping sum of its bytes read as big-endian 32-bit
/// words, the last partial word padded with zero bytes on the right.
pub fn checksum(data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(4);
    let mut sum = 0u32;
    for w in words.by_ref() {
        let mut b = [0u8; 4];
        b.copy_from_slice(w);
        sum = sum.wrapping_add(u32::from_be_bytes(b));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 4];
        for (slot, v) in b.iter_mut().zip(rest) {
            *slot = *v;
        }
        sum = sum.wrapping_add(u32::from_be_bytes(b));
    }
    sum
}

/// A reader over a delta's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// Reads a base-64 integer of at least one digit and the operator byte after it.
    fn int_then_op(&mut self) -> Result<(u32, u8), DeltaError> {
        let mut value: u32 = 0;
        let mut digits = 0usize;
        loop {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err(DeltaError::Truncated);
            };
            self.at += 1;
            match digit_value(b) {
                Some(d) => {
                    value = value
                        .checked_mul(64)
                        .and_then(|v| v.checked_add(d))
                        .ok_or(DeltaError::IntegerOverflow)?;
                    digits += 1;
                }
                None if digits == 0 => return Err(DeltaError::UnexpectedByte(b)),
                None => return Ok((value, b)),
            }
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DeltaError> {
        let end = self.at.checked_add(n).ok_or(DeltaError::InsertPastEnd)?;
        let s = self
            .bytes
            .get(self.at..end)
            .ok_or(DeltaError::InsertPastEnd)?;
        self.at = end;
        Ok(s)
    }
}

/// The target size a delta declares, without applying it (for a limit check or a buffer).
pub fn target_size(delta: &[u8]) -> Result<u32, DeltaError> {
    let mut c = Cursor {
        bytes: delta,
        at: 0,
    };
    match c.int_then_op()? {
        (size, b'\n') => Ok(size),
        (_, other) => Err(DeltaError::UnexpectedByte(other)),
    }
}

/// Applies `delta` to `base` and returns the target, checked against the delta's size and
/// checksum. A delta declaring more than `limit` bytes is refused before anything is allocated;
/// the output never grows past the declared size.
pub fn apply(base: &[u8], delta: &[u8], limit: usize) -> Result<Vec<u8>, DeltaError> {
    let mut c = Cursor {
        bytes: delta,
        at: 0,
    };
    let size = match c.int_then_op()? {
        (size, b'\n') => size as usize,
        (_, other) => return Err(DeltaError::UnexpectedByte(other)),
    };
    if size > limit {
        return Err(DeltaError::TooLarge {
            size: size as u64,
            limit,
        });
    }
    let mut out = Vec::with_capacity(size);
    loop {
        let (n, op) = c.int_then_op()?;
        let n = n as usize;
        match op {
            b'@' => {
                let (offset, comma) = c.int_then_op()?;
                if comma != b',' {
                    return Err(DeltaError::UnexpectedByte(comma));
                }
                if out.len() + n > size {
                    return Err(DeltaError::Overrun);
                }
                let from = offset as usize;
                let piece = from
                    .checked_add(n)
                    .and_then(|end| base.get(from..end))
                    .ok_or(DeltaError::CopyOutOfBase)?;
                out.extend_from_slice(piece);
            }
            b':' => {
                if out.len() + n > size {
                    return Err(DeltaError::Overrun);
                }
                out.extend_from_slice(c.take(n)?);
            }
            b';' => {
                if out.len() != size {
                    return Err(DeltaError::SizeMismatch);
                }
                if checksum(&out) != n as u32 {
                    return Err(DeltaError::ChecksumMismatch);
                }
                if c.at != delta.len() {
                    return Err(DeltaError::TrailingBytes);
                }
                return Ok(out);
            }
            other => return Err(DeltaError::UnexpectedByte(other)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn int(n: u32) -> String {
        let mut v = Vec::new();
        put_int(&mut v, n);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn integers_are_base_64_most_significant_first() {
        assert_eq!(int(0), "0");
        assert_eq!(int(9), "9");
        assert_eq!(int(10), "A");
        assert_eq!(int(36), "_");
        assert_eq!(int(37), "a");
        assert_eq!(int(63), "~");
        assert_eq!(int(64), "10");
        assert_eq!(int(4096 + 2 * 64 + 3), "123");
        assert_eq!(int(u32::MAX), "3~~~~~");
    }

    #[test]
    fn every_digit_reads_back_as_its_value() {
        for (i, &d) in DIGITS.iter().enumerate() {
            assert_eq!(digit_value(d), Some(i as u32));
        }
        assert_eq!(digit_value(b'-'), None);
        assert_eq!(digit_value(b'@'), None);
    }

    #[test]
    fn checksum_sums_big_endian_words_and_pads_the_tail() {
        assert_eq!(checksum(b""), 0);
        assert_eq!(checksum(&[1, 2, 3, 4]), 0x0102_0304);
        assert_eq!(checksum(&[1, 2, 3, 4, 5]), 0x0102_0304 + 0x0500_0000);
        assert_eq!(checksum(&[0xff; 8]), 0xffff_fffe);
    }

    #[test]
    fn a_hand_written_delta_applies() {
        let base = b"hello world";
        let target = b"hello there world";
        let mut d = Vec::new();
        put_header(&mut d, target.len() as u32);
        put_copy(&mut d, 6, 0);
        put_insert(&mut d, b"there ");
        put_copy(&mut d, 5, 6);
        put_trailer(&mut d, target);
        assert_eq!(apply(base, &d, 100).unwrap(), target);
        assert_eq!(target_size(&d), Ok(17));
        assert!(d.starts_with(b"H\n6@0,6:there 5@6,"));
    }

    fn delta_of(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn malformed_deltas_are_typed_errors() {
        let base = b"abcdef";
        let ok_sum = int(checksum(b"abc"));
        let cases: Vec<(String, DeltaError)> = vec![
            (String::new(), DeltaError::Truncated),
            ("3".into(), DeltaError::Truncated),
            ("3\n3@0,".into(), DeltaError::Truncated),
            ("3\n3:ab".into(), DeltaError::InsertPastEnd),
            ("3\n4@0,".into(), DeltaError::Overrun),
            ("3\n3@4,".into(), DeltaError::CopyOutOfBase),
            ("3\n3@0;".into(), DeltaError::UnexpectedByte(b';')),
            (
                "3\n2@0,".to_string() + &ok_sum + ";",
                DeltaError::SizeMismatch,
            ),
            ("3\n3@0,1;".into(), DeltaError::ChecksumMismatch),
            (
                "3\n3@0,".to_string() + &ok_sum + ";x",
                DeltaError::TrailingBytes,
            ),
            ("3\n3!".into(), DeltaError::UnexpectedByte(b'!')),
            ("\n".into(), DeltaError::UnexpectedByte(b'\n')),
            ("3!".into(), DeltaError::UnexpectedByte(b'!')),
            ("1000000\n".into(), DeltaError::IntegerOverflow),
        ];
        for (d, want) in cases {
            assert_eq!(apply(base, &delta_of(&d), 100), Err(want), "{d:?}");
        }
        assert_eq!(
            apply(
                base,
                &delta_of(&("3\n3@0,".to_string() + &ok_sum + ";")),
                100
            )
            .unwrap(),
            b"abc"
        );
    }

    #[test]
    fn a_declared_size_above_the_limit_is_refused_before_allocating() {
        assert_eq!(
            apply(b"", b"3~~~~~\n", 1 << 20),
            Err(DeltaError::TooLarge {
                size: u64::from(u32::MAX),
                limit: 1 << 20
            })
        );
    }
}
