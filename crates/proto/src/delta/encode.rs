//! Encoders writing the Fossil delta format: the block matcher ([`encode`], the default) and the
//! prefix/suffix splice ([`encode_splice`], the simpler alternative measured beside it).
//!
//! Both keep a delta of UTF-8 text UTF-8: no copy starts or ends inside a multi-byte character,
//! so every insert holds whole characters and the delta can travel as a JSON string.
//!
//! Neither decides whether a delta is worth sending: the caller compares its length with the
//! target's and sends the full message when the delta is not smaller.

use super::fossil::{len_u32, put_copy, put_header, put_insert, put_trailer};

/// The window the block matcher hashes, and the spacing of the base blocks it indexes. A match
/// at least `2 * BLOCK - 1` bytes long always contains a whole indexed block, so it is found;
/// shorter ones are found when they continue the previous copy's alignment (the common case in
/// JSON whose values change in place). 8 beat 16 on the order book of `docs/benchmarks.md`
/// (prices between short keys leave few 31-byte runs unchanged) at the same CPU.
pub const BLOCK: usize = 8;

/// Candidates tried per target position: bounds the time on bases with many identical blocks
/// (repeated JSON keys), at the price of sometimes missing a longer match further down a chain.
const MAX_CHAIN: usize = 8;

/// The shortest copy worth a command inside changed bytes: the copy costs 4 to 10 bytes of
/// delta and splits an insert in two (another 2 or 3). 12 gave the smallest deltas of 8, 12 and
/// 16 on the order book of `docs/benchmarks.md` (273 bytes against 307 with 8), the same on the
/// tick, while 16 missed copies in the tick (185 bytes against 157).
const MIN_COPY: usize = 12;

/// Multiplier of the rolling hash (odd, so every byte position affects the value).
const MUL: u32 = 0x0100_0193;

/// The largest base or target the format can describe (its integers are 32-bit).
const MAX_INPUT: usize = u32::MAX as usize;

/// A byte that continues a UTF-8 character (so a copy may not start or end before it).
fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Whether `i` is a place a copy may start or end in `target`: its end, or before a byte that
/// begins a character. Binary targets lose at most 3 bytes per boundary to this.
fn boundary(target: &[u8], i: usize) -> bool {
    target.get(i).is_none_or(|&b| !is_continuation(b))
}

/// The common prefix and suffix of `base` and `target`, not overlapping in either, both ending
/// on a character boundary of `target`.
fn common_ends(base: &[u8], target: &[u8]) -> (usize, usize) {
    let mut prefix = run_forward(base, target, 0, 0, target.len());
    while prefix > 0 && !boundary(target, prefix) {
        prefix -= 1;
    }
    let room = base.len().min(target.len()) - prefix;
    let mut suffix = run_backward(base, target, base.len(), target.len(), target.len() - room);
    while suffix > 0 && !boundary(target, target.len() - suffix) {
        suffix -= 1;
    }
    (prefix, suffix)
}

/// The splice delta: copy the common prefix, insert the middle, copy the common suffix. Cheapest
/// to compute (one pass from each end) and as small as the block matcher when one region
/// changed; large when changes are spread. `None` only for inputs over 4 GiB.
pub fn encode_splice(base: &[u8], target: &[u8]) -> Option<Vec<u8>> {
    if base.len() > MAX_INPUT || target.len() > MAX_INPUT {
        return None;
    }
    let (prefix, suffix) = common_ends(base, target);
    let middle = target
        .get(prefix..target.len() - suffix)
        .unwrap_or_default();
    let mut out = Vec::with_capacity(middle.len() + 32);
    put_header(&mut out, len_u32(target.len()));
    if prefix > 0 {
        put_copy(&mut out, len_u32(prefix), 0);
    }
    put_insert(&mut out, middle);
    if suffix > 0 {
        put_copy(&mut out, len_u32(suffix), len_u32(base.len() - suffix));
    }
    put_trailer(&mut out, target);
    Some(out)
}

/// The base's blocks of [`BLOCK`] bytes at multiples of [`BLOCK`], by rolling hash.
struct Index {
    /// Bucket to 1 + the last block that hashed there (0: empty).
    head: Vec<u32>,
    /// Block to 1 + the previous block in its bucket (0: none).
    chain: Vec<u32>,
    shift: u32,
}

impl Index {
    fn new(base: &[u8]) -> Index {
        let blocks = base.len() / BLOCK;
        let bits = (blocks * 2).next_power_of_two().trailing_zeros().max(4);
        let mut index = Index {
            head: vec![0; 1 << bits],
            chain: vec![0; blocks],
            shift: 32 - bits,
        };
        for (i, block) in base.chunks_exact(BLOCK).enumerate() {
            let bucket = index.bucket(hash(block));
            if let (Some(head), Some(link)) = (index.head.get_mut(bucket), index.chain.get_mut(i)) {
                *link = *head;
                *head = len_u32(i + 1);
            }
        }
        index
    }

    fn bucket(&self, h: u32) -> usize {
        (h.wrapping_mul(0x9E37_79B1) >> self.shift) as usize
    }
}

/// The rolling hash of one window.
fn hash(window: &[u8]) -> u32 {
    window
        .iter()
        .fold(0u32, |h, &b| h.wrapping_mul(MUL).wrapping_add(u32::from(b)))
}

/// `MUL` to the power `BLOCK - 1`: the weight of the byte leaving the window.
fn out_weight() -> u32 {
    (1..BLOCK).fold(1u32, |w, _| w.wrapping_mul(MUL))
}

/// How many bytes from `base[b..]` and `target[t..end]` are equal.
fn run_forward(base: &[u8], target: &[u8], b: usize, t: usize, end: usize) -> usize {
    let bs = base.get(b..).unwrap_or_default();
    let ts = target.get(t..end).unwrap_or_default();
    // Whole chunks first: slice equality is a memcmp, several times faster than byte by byte.
    let whole = bs
        .chunks(CHUNK)
        .zip(ts.chunks(CHUNK))
        .take_while(|(x, y)| x.len() == CHUNK && x == y)
        .count()
        * CHUNK;
    let tail = bs.get(whole..).unwrap_or_default();
    let tt = ts.get(whole..).unwrap_or_default();
    whole + tail.iter().zip(tt).take_while(|(x, y)| x == y).count()
}

/// How many bytes before `base[..b]` and `target[floor..t]` are equal.
fn run_backward(base: &[u8], target: &[u8], b: usize, t: usize, floor: usize) -> usize {
    let bs = base.get(..b).unwrap_or_default();
    let ts = target.get(floor..t).unwrap_or_default();
    let whole = bs
        .rchunks(CHUNK)
        .zip(ts.rchunks(CHUNK))
        .take_while(|(x, y)| x.len() == CHUNK && x == y)
        .count()
        * CHUNK;
    let tail = bs.get(..bs.len() - whole).unwrap_or_default();
    let tt = ts.get(..ts.len() - whole).unwrap_or_default();
    whole
        + tail
            .iter()
            .rev()
            .zip(tt.iter().rev())
            .take_while(|(x, y)| x == y)
            .count()
}

/// Bytes compared at once when looking for the end of a run.
const CHUNK: usize = 32;

/// A match: `len` bytes of the base from `from` equal the target from `at`.
#[derive(Clone, Copy)]
struct Match {
    from: usize,
    at: usize,
    len: usize,
}

/// The block-matching delta: the common prefix and suffix as [`encode_splice`] finds them, and
/// in the middle, copies of base regions found by hashing [`BLOCK`]-byte windows (and by
/// continuing the last copy's alignment), inserts elsewhere. Linear in the inputs' sizes (at
/// most [`MAX_CHAIN`] candidates per target byte). `None` only for inputs over 4 GiB.
pub fn encode(base: &[u8], target: &[u8]) -> Option<Vec<u8>> {
    if base.len() > MAX_INPUT || target.len() > MAX_INPUT {
        return None;
    }
    let (prefix, suffix) = common_ends(base, target);
    let end = target.len() - suffix;
    let mut out = Vec::with_capacity((end - prefix) / 2 + 32);
    put_header(&mut out, len_u32(target.len()));
    if prefix > 0 {
        put_copy(&mut out, len_u32(prefix), 0);
    }
    let literal = if end - prefix < 2 * MIN_COPY {
        // No copy worth a command fits between two inserts here: skip hashing the base (the
        // one-field change in a large document).
        prefix
    } else {
        copy_middle(base, target, prefix, end, &mut out)
    };
    put_insert(&mut out, target.get(literal..end).unwrap_or_default());
    if suffix > 0 {
        put_copy(&mut out, len_u32(suffix), len_u32(base.len() - suffix));
    }
    put_trailer(&mut out, target);
    Some(out)
}

/// Writes the commands for `target[prefix..end]` up to the last copy, returning where the
/// bytes not yet written start.
fn copy_middle(base: &[u8], target: &[u8], prefix: usize, end: usize, out: &mut Vec<u8>) -> usize {
    let index = Index::new(base);
    let weight = out_weight();
    // Base offset minus target offset of the last copy: where an in-place edit resumes.
    let mut diagonal: isize = 0;
    let mut literal = prefix;
    let mut pos = prefix;
    let mut h: Option<u32> = None;
    while pos + BLOCK <= end {
        let window = target.get(pos..pos + BLOCK).unwrap_or_default();
        let cur = match h {
            Some(v) => v,
            None => hash(window),
        };
        let found = best_match(base, target, &index, cur, pos, literal, end, diagonal);
        if let Some(m) = found {
            put_insert(out, target.get(literal..m.at).unwrap_or_default());
            put_copy(out, len_u32(m.len), len_u32(m.from));
            diagonal = m.from as isize - m.at as isize;
            pos = m.at + m.len;
            literal = pos;
            h = None;
            continue;
        }
        // Slide the window one byte.
        let (Some(&gone), Some(&next)) = (target.get(pos), target.get(pos + BLOCK)) else {
            break;
        };
        h = Some(
            cur.wrapping_sub(u32::from(gone).wrapping_mul(weight))
                .wrapping_mul(MUL)
                .wrapping_add(u32::from(next)),
        );
        pos += 1;
    }
    literal
}

/// The longest match covering target position `pos` (extended back to `literal` and forward to
/// `end`), trimmed to character boundaries, if it is at least [`MIN_COPY`] long.
#[allow(clippy::too_many_arguments)]
fn best_match(
    base: &[u8],
    target: &[u8],
    index: &Index,
    h: u32,
    pos: usize,
    literal: usize,
    end: usize,
    diagonal: isize,
) -> Option<Match> {
    let mut best: Option<Match> = None;
    let mut consider = |from: usize| {
        let ahead = run_forward(base, target, from, pos, end);
        if ahead < BLOCK {
            return;
        }
        let back = run_backward(base, target, from, pos, literal);
        let len = back + ahead;
        if best.is_none_or(|b| len > b.len) {
            best = Some(Match {
                from: from - back,
                at: pos - back,
                len,
            });
        }
    };
    let along = pos as isize + diagonal;
    if along >= 0 {
        consider(along as usize);
    }
    let mut link = index.head.get(index.bucket(h)).copied().unwrap_or(0);
    let mut tried = 0;
    while link != 0 && tried < MAX_CHAIN {
        let block = link as usize - 1;
        consider(block * BLOCK);
        link = index.chain.get(block).copied().unwrap_or(0);
        tried += 1;
    }
    let mut m = best?;
    // Trim to character boundaries so inserts hold whole characters.
    while m.len > 0 && !boundary(target, m.at) {
        m.at += 1;
        m.from += 1;
        m.len -= 1;
    }
    while m.len > 0 && !boundary(target, m.at + m.len) {
        m.len -= 1;
    }
    (m.len >= MIN_COPY).then_some(m)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::super::{apply, DeltaError};
    use super::*;
    use crate::test_rng::Rng;

    /// Random bytes from a small alphabet (so matches occur) or, every fourth case, any byte
    /// (so UTF-8 trimming meets invalid text), and random multi-byte characters.
    fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
        let mode = rng.below(4);
        let mut v = Vec::with_capacity(len);
        while v.len() < len {
            match mode {
                0 => v.push(rng.below(256) as u8),
                1 => v.extend_from_slice("é€😀".as_bytes().get(rng.below(9)..9).unwrap()),
                _ => v.push(b"abc{}\":,0123"[rng.below(12)]),
            }
        }
        v
    }

    /// `base` with a few random edits: replace, insert, delete, move a region.
    fn edited(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
        let mut t = base.to_vec();
        for _ in 0..rng.below(6) {
            let at = rng.below(t.len() + 1);
            let n = rng.below(20);
            match rng.below(4) {
                0 => {
                    let end = (at + n).min(t.len());
                    let fresh = random_bytes(rng, end - at);
                    t.splice(at..end, fresh);
                }
                1 => {
                    let fresh = random_bytes(rng, n);
                    t.splice(at..at, fresh);
                }
                2 => {
                    let end = (at + n).min(t.len());
                    t.drain(at..end);
                }
                _ => {
                    let end = (at + n * 4).min(t.len());
                    let moved: Vec<u8> = t.drain(at..end).collect();
                    let to = rng.below(t.len() + 1);
                    t.splice(to..to, moved);
                }
            }
        }
        t
    }

    #[test]
    fn decode_of_encode_gives_the_target_for_random_and_edited_pairs() {
        let mut rng = Rng(51);
        for case in 0..3000 {
            let n = rng.below(600);
            let base = random_bytes(&mut rng, n);
            let target = if case % 3 == 0 {
                let n = rng.below(600);
                random_bytes(&mut rng, n)
            } else {
                edited(&mut rng, &base)
            };
            for (name, d) in [
                ("block", encode(&base, &target).unwrap()),
                ("splice", encode_splice(&base, &target).unwrap()),
            ] {
                assert_eq!(
                    apply(&base, &d, target.len()).as_deref(),
                    Ok(&target[..]),
                    "{name} case {case}"
                );
                if std::str::from_utf8(&target).is_ok() {
                    assert!(std::str::from_utf8(&d).is_ok(), "{name} case {case}: UTF-8");
                }
            }
        }
    }

    #[test]
    fn a_delta_applied_to_another_base_is_a_checksum_mismatch_or_an_error() {
        let base = br#"{"bid":"100.25","ask":"100.50","qty":"3","note":"same length"}"#;
        let target = br#"{"bid":"100.26","ask":"100.50","qty":"3","note":"same length"}"#;
        let other = br#"{"bid":"200.25","ask":"100.50","qty":"3","note":"same length"}"#;
        let d = encode(base, target).unwrap();
        assert_eq!(apply(other, &d, 1000), Err(DeltaError::ChecksumMismatch));
        assert_eq!(apply(b"", &d, 1000), Err(DeltaError::CopyOutOfBase));
    }

    #[test]
    fn one_changed_field_in_a_large_document_is_a_small_delta() {
        let base: String = (0..300)
            .map(|i| format!("\"field{i}\":\"value {i}\","))
            .collect();
        let target = base.replace("\"value 150\"", "\"value 15O\"");
        let d = encode(base.as_bytes(), target.as_bytes()).unwrap();
        assert!(d.len() < 30, "{}", String::from_utf8_lossy(&d));
        let s = encode_splice(base.as_bytes(), target.as_bytes()).unwrap();
        assert!(s.len() < 30, "{}", String::from_utf8_lossy(&s));
    }

    #[test]
    fn spread_changes_are_found_by_the_block_matcher_and_not_by_the_splice() {
        let base: String = (0..60)
            .map(|i| format!("{{\"p\":{},\"q\":{}}},", 1000 + i, i))
            .collect();
        let target = base
            .replace("\"q\":5}", "\"q\":6}")
            .replace("\"q\":55}", "\"q\":56}");
        let d = encode(base.as_bytes(), target.as_bytes()).unwrap();
        let s = encode_splice(base.as_bytes(), target.as_bytes()).unwrap();
        assert!(d.len() < 40, "{}", String::from_utf8_lossy(&d));
        assert!(s.len() > 500);
    }

    #[test]
    fn identical_inputs_are_one_copy() {
        let t = b"the same message, again and again";
        let d = encode(t, t).unwrap();
        assert!(d.starts_with(b"X\nX@0,"), "{}", String::from_utf8_lossy(&d));
        assert_eq!(apply(t, &d, 100).unwrap(), t);
        assert_eq!(d.last(), Some(&b';'));
    }

    #[test]
    fn copies_never_split_a_character() {
        let base = "prix: 10€ ou 12€".as_bytes();
        let target = "prix: 10£ ou 12£".as_bytes();
        for d in [
            encode(base, target).unwrap(),
            encode_splice(base, target).unwrap(),
        ] {
            assert!(std::str::from_utf8(&d).is_ok());
            assert_eq!(apply(base, &d, 100).unwrap(), target);
        }
    }
}
