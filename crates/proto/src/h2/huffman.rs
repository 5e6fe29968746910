//! The static Huffman code of HPACK (RFC 7541 §5.2, Appendix B).
//!
//! The code is canonical: it is fully given by each symbol's code length, codes of one length
//! being consecutive in symbol order and each length's first code following the previous
//! length's last one, shifted. So only the 257 lengths are written here (the RFC's facts); the
//! codes, and the decoding tables, are derived from them at compile time.

/// Code length in bits of each byte value, then of EOS (256), from RFC 7541 Appendix B.
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0-15
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 16-31
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // ' ' - '/'
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // '0' - '?'
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // '@' - 'O'
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 'P' - '_'
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // '`' - 'o'
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 'p' - 127
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 128-143
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 144-159
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 160-175
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 176-191
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 192-207
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 208-223
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 224-239
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 240-255
    30, // EOS
];

const MAX_LEN: usize = 30;
const EOS: u16 = 256;

/// The canonical code of each symbol, right-aligned.
const CODES: [u32; 257] = codes();

/// Symbols sorted by (length, value): the order in which codes are handed out.
const SORTED: [u16; 257] = sorted();

/// Per length: the first code of that length, how many symbols have it, and where they start
/// in [`SORTED`].
const FIRST: [u32; MAX_LEN + 1] = firsts().0;
const COUNT: [u32; MAX_LEN + 1] = firsts().1;
const OFFSET: [u32; MAX_LEN + 1] = firsts().2;

// Evaluated at compile time: an index out of bounds fails the build, not a request.
#[allow(clippy::indexing_slicing)]
const fn sorted() -> [u16; 257] {
    let mut out = [0u16; 257];
    let mut n = 0;
    let mut len = 1;
    while len <= MAX_LEN {
        let mut sym = 0;
        while sym < 257 {
            if LENGTHS[sym] as usize == len {
                out[n] = sym as u16;
                n += 1;
            }
            sym += 1;
        }
        len += 1;
    }
    out
}

// Evaluated at compile time: an index out of bounds fails the build, not a request.
#[allow(clippy::indexing_slicing)]
#[allow(clippy::type_complexity)]
const fn firsts() -> ([u32; MAX_LEN + 1], [u32; MAX_LEN + 1], [u32; MAX_LEN + 1]) {
    let mut first = [0u32; MAX_LEN + 1];
    let mut count = [0u32; MAX_LEN + 1];
    let mut offset = [0u32; MAX_LEN + 1];
    let mut sym = 0;
    while sym < 257 {
        count[LENGTHS[sym] as usize] += 1;
        sym += 1;
    }
    let mut code = 0u32;
    let mut seen = 0u32;
    let mut len = 1;
    while len <= MAX_LEN {
        first[len] = code;
        offset[len] = seen;
        code = (code + count[len]) << 1;
        seen += count[len];
        len += 1;
    }
    (first, count, offset)
}

// Evaluated at compile time: an index out of bounds fails the build, not a request.
#[allow(clippy::indexing_slicing)]
const fn codes() -> [u32; 257] {
    let (first, _, offset) = firsts();
    let order = sorted();
    let mut out = [0u32; 257];
    let mut i = 0;
    while i < 257 {
        let sym = order[i] as usize;
        let len = LENGTHS[sym] as usize;
        out[sym] = first[len] + (i as u32 - offset[len]);
        i += 1;
    }
    out
}

/// Why a Huffman string could not be decoded (a `COMPRESSION_ERROR` for the connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HuffmanError {
    /// The EOS symbol inside the string.
    Eos,
    /// Padding longer than 7 bits, or not the most significant bits of EOS (all ones).
    Padding,
}

/// Appends the decoding of `input` to `out`.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    let mut code = 0u32;
    let mut len = 0usize;
    for &byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let (Some(&first), Some(&count), Some(&offset)) =
                (FIRST.get(len), COUNT.get(len), OFFSET.get(len))
            else {
                // Longer than any code: only EOS's 30 ones could get here, and they did not match.
                return Err(HuffmanError::Padding);
            };
            if count > 0 && code >= first && code - first < count {
                let sym = SORTED
                    .get((offset + code - first) as usize)
                    .copied()
                    .unwrap_or(EOS);
                if sym == EOS {
                    return Err(HuffmanError::Eos);
                }
                out.push(sym as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // What is left must be padding: fewer than 8 bits, all ones (RFC 7541 §5.2).
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HuffmanError::Padding);
    }
    Ok(())
}

/// How many bytes `input` takes Huffman-coded.
pub fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input
        .iter()
        .map(|&b| LENGTHS.get(b as usize).copied().unwrap_or(0) as usize)
        .sum();
    bits.div_ceil(8)
}

/// Appends the Huffman coding of `input` to `out`, padded with ones.
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &b in input {
        let len = u32::from(LENGTHS.get(b as usize).copied().unwrap_or(0));
        let code = u64::from(CODES.get(b as usize).copied().unwrap_or(0));
        acc = (acc << len) | code;
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1u64 << pad) - 1)) as u8);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use crate::h2::tests::hex;

    #[test]
    fn the_lengths_make_a_complete_prefix_code() {
        // Kraft: a complete code fills the tree exactly; one wrong length breaks the equality.
        let sum: u64 = LENGTHS
            .iter()
            .map(|&l| 1u64 << (MAX_LEN - l as usize))
            .sum();
        assert_eq!(sum, 1u64 << MAX_LEN);
    }

    #[test]
    fn derived_codes_match_the_rfc_table() {
        // A sample of Appendix B's "code as hex aligned to LSB" column, across all lengths.
        let rfc = [
            (0, 0x1ff8),
            (1, 0x7f_ffd8),
            (9, 0xff_ffea),
            (10, 0x3fff_fffc),
            (22, 0x3fff_fffe),
            (b' ' as usize, 0x14),
            (b'!' as usize, 0x3f8),
            (b'0' as usize, 0x0),
            (b':' as usize, 0x5c),
            (b'\\' as usize, 0x7_fff0),
            (b'a' as usize, 0x3),
            (b'z' as usize, 0x7b),
            (b'~' as usize, 0x1ffd),
            (127, 0xfff_fffc),
            (128, 0xf_ffe6),
            (153, 0x1f_ffdc),
            (199, 0x1ff_ffec),
            (203, 0x7ff_ffde),
            (220, 0xfff_fffd),
            (255, 0x3ff_ffee),
            (256, 0x3fff_ffff),
        ];
        for (sym, code) in rfc {
            assert_eq!(CODES[sym], code, "symbol {sym}");
        }
    }

    #[test]
    fn rfc_examples_encode_and_decode() {
        // RFC 7541 C.4 and C.6.
        let cases = [
            ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            ("no-cache", "a8eb 1064 9cbf"),
            ("custom-key", "25a8 49e9 5ba9 7d7f"),
            ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
            ("302", "6402"),
            ("private", "aec3 771a 4b"),
            (
                "Mon, 21 Oct 2013 20:13:21 GMT",
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
            ),
            (
                "https://www.example.com",
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
            ),
        ];
        for (text, coded) in cases {
            let mut out = Vec::new();
            encode(text.as_bytes(), &mut out);
            assert_eq!(out, hex(coded), "{text}");
            assert_eq!(encoded_len(text.as_bytes()), out.len());
            let mut back = Vec::new();
            decode(&out, &mut back).unwrap();
            assert_eq!(back, text.as_bytes());
        }
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        let mut coded = Vec::new();
        encode(&all, &mut coded);
        let mut back = Vec::new();
        decode(&coded, &mut back).unwrap();
        assert_eq!(back, all);
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // 'a' is 00011: padded with zeros instead of ones.
        assert_eq!(decode(&[0b0001_1000], &mut out), Err(HuffmanError::Padding));
        // A whole byte of padding (8 ones) after a complete symbol.
        assert_eq!(
            decode(&[0b0001_1111, 0xff], &mut out),
            Err(HuffmanError::Padding)
        );
        // EOS itself: 30 ones (then two of padding).
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut out),
            Err(HuffmanError::Eos)
        );
        // Nothing is a valid empty string.
        assert_eq!(decode(&[], &mut out), Ok(()));
    }
}
