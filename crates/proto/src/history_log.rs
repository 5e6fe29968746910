//! The on-disk format of durable history (`history_dir`): segment files of framed records.
//!
//! Pure functions over bytes: the server's `durable` module does the file I/O and decides what a
//! damaged file means; this module only encodes records and scans a file's bytes into the
//! records that are intact, the regions that are not, and whether the file ends in the middle
//! of a record.
//!
//! A segment is a sequence of records. Every record is framed as
//!
//! ```text
//! MARK (1 byte, 0xC7) | LEN (u32 LE, body bytes) | CRC (u32 LE, CRC-32C of the body) | BODY
//! ```
//!
//! and its body starts with a type byte:
//!
//! - `1` **header**, the first record of every segment: `ELEN u8, EPOCH, BLEN u8, BOOT_ID,
//!   FLOOR u64 LE, SYNCED u8` (the epoch the writing process issued ids in, the kernel boot id
//!   it ran under, the damage floor carried over from earlier recoveries: any topic may have
//!   lost messages with ids up to it; and `1` when every record is `fsync`ed before its publish
//!   is acknowledged or delivered).
//! - `2` **message**: `ID u64 LE, UNIX_SECS u64 LE, ELEN u8, EPOCH, TLEN u16 LE, TOPIC, WIRE`
//!   where `WIRE` is the message body as cluster nodes exchange it ([`crate::pubsub::wire`]:
//!   kind, event name, attachment, payload).
//! - `3` **clean stop**: `ELEN u8, EPOCH, NEXT_ID u64 LE`, the only record of the file a
//!   graceful stop writes last: every id below `NEXT_ID` was issued in `EPOCH` and is on disk.
//! - `4` **stream**: `ID u64 LE, UNIX_SECS u64 LE, ELEN u8, EPOCH, TLEN u16 LE, TOPIC,
//!   STREAM u64 LE, SEQ u32 LE, STATE u8, DATA` (the rest, UTF-8): one fragment of an
//!   appendable message ([`crate::pubsub::append`]) at position `ID`, or (`STATE` bit 0) the
//!   stream's whole text so far, `SEQ` fragments, as a rewrite of history writes it. `STATE`
//!   bits 1-2: 0 open, 1 closed by `done`, 2 by the timeout, 3 by a restart; other bits are 0.
//!   Recovery folds a stream's records into one entry at its latest position (a whole text
//!   sets it, a fragment adds to it). A log written before streams existed has none.
//!
//! The CRC makes a torn or flipped record detectable; the mark byte lets the scanner find the
//! next intact record after damage without trying every offset's CRC.

use crate::pubsub::append::CloseReason;
use crate::pubsub::wire;

/// The first byte of every record.
pub const MARK: u8 = 0xC7;
/// Bytes of a record's frame before its body.
pub const FRAME: usize = 9;
/// The largest body a record may have: larger lengths are damage, not records. Above any
/// publish the server accepts (bodies are bounded far below this by `max_publish_bytes`).
pub const MAX_BODY: usize = 1 << 28;

const HEADER: u8 = 1;
const MESSAGE: u8 = 2;
const CLEAN: u8 = 3;
const STREAM: u8 = 4;

/// A segment's header record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// The epoch of the process that wrote the segment.
    pub epoch: &'a str,
    /// `/proc/sys/kernel/random/boot_id` when it wrote it (empty if it could not be read).
    pub boot_id: &'a str,
    /// Ids up to this may be missing for any topic (damage found by an earlier recovery).
    pub floor: u64,
    /// Every record is `fsync`ed before its publish is acknowledged or delivered.
    pub synced: bool,
}

/// One message record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// The `SEQ` of its id.
    pub id: u64,
    /// When it was published, in seconds since the Unix epoch.
    pub unix_secs: u64,
    /// The `EPOCH` of its id.
    pub epoch: &'a str,
    /// Its topic.
    pub topic: &'a str,
    /// Kind, event name, attachment and payload.
    pub body: wire::Body<'a>,
}

/// The record a graceful stop leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clean<'a> {
    /// The epoch ids were issued in.
    pub epoch: &'a str,
    /// The next id the stopped process would have issued.
    pub next_id: u64,
}

/// One stream record: a fragment of an appendable message, or its whole text so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRecord<'a> {
    /// The `SEQ` of its position (the fragment's id, or the latest fragment's for a whole text).
    pub id: u64,
    /// When it was published, in seconds since the Unix epoch.
    pub unix_secs: u64,
    /// The `EPOCH` of its id (and of the stream's).
    pub epoch: &'a str,
    /// Its topic.
    pub topic: &'a str,
    /// The stream's id `SEQ` (its opening fragment's).
    pub stream: u64,
    /// The fragment's number, or the fragments a whole text includes.
    pub seq: u32,
    /// `data` is the whole text so far, not one fragment.
    pub whole: bool,
    /// Set when the stream is closed with this record.
    pub closed: Option<CloseReason>,
    /// The fragment, or the whole text.
    pub data: &'a str,
}

/// One decoded record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// A segment header.
    Header(Header<'a>),
    /// A published message.
    Message(Message<'a>),
    /// A clean-stop mark.
    Clean(Clean<'a>),
    /// A fragment of an appendable message, or its whole text.
    Stream(StreamRecord<'a>),
}

/// Why bytes at some offset are not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The file ends before the record does (a write cut short, or a truncated file).
    #[error("the file ends inside a record")]
    Truncated,
    /// The first byte is not the record mark.
    #[error("no record mark")]
    Mark,
    /// The length is larger than any record may be.
    #[error("record length out of range")]
    Length,
    /// The body does not match its CRC-32C.
    #[error("checksum mismatch")]
    Checksum,
    /// The checksum matches but the body is not a record this version writes.
    #[error("malformed record body")]
    Body,
    /// Past the largest size a segment can have (`history_dir` docs): not read at all.
    #[error("past the largest size a segment can have, not read")]
    Oversized,
}

/// Appends a header record to `out`.
pub fn encode_header(h: &Header<'_>, out: &mut Vec<u8>) {
    frame(out, |b| {
        b.push(HEADER);
        short_str(b, h.epoch);
        short_str(b, h.boot_id);
        b.extend_from_slice(&h.floor.to_le_bytes());
        b.push(u8::from(h.synced));
    });
}

/// Appends a message record to `out`. The topic must be under 64 KiB (topics are at most 255
/// bytes) and the epoch and boot id under 256 bytes.
pub fn encode_message(m: &Message<'_>, out: &mut Vec<u8>) {
    frame(out, |b| {
        b.push(MESSAGE);
        b.extend_from_slice(&m.id.to_le_bytes());
        b.extend_from_slice(&m.unix_secs.to_le_bytes());
        short_str(b, m.epoch);
        let t = m.topic.as_bytes();
        let t = t.get(..t.len().min(u16::MAX as usize)).unwrap_or_default();
        b.extend_from_slice(&(t.len() as u16).to_le_bytes());
        b.extend_from_slice(t);
        m.body.encode(b);
    });
}

/// Appends a stream record to `out` (the same bounds as [`encode_message`]).
pub fn encode_stream(r: &StreamRecord<'_>, out: &mut Vec<u8>) {
    frame(out, |b| {
        b.push(STREAM);
        b.extend_from_slice(&r.id.to_le_bytes());
        b.extend_from_slice(&r.unix_secs.to_le_bytes());
        short_str(b, r.epoch);
        let t = r.topic.as_bytes();
        let t = t.get(..t.len().min(u16::MAX as usize)).unwrap_or_default();
        b.extend_from_slice(&(t.len() as u16).to_le_bytes());
        b.extend_from_slice(t);
        b.extend_from_slice(&r.stream.to_le_bytes());
        b.extend_from_slice(&r.seq.to_le_bytes());
        let closed: u8 = match r.closed {
            None => 0,
            Some(CloseReason::Done) => 1,
            Some(CloseReason::Timeout) => 2,
            Some(CloseReason::Restart) => 3,
        };
        b.push(u8::from(r.whole) | closed << 1);
        b.extend_from_slice(r.data.as_bytes());
    });
}

/// Appends a clean-stop record to `out`.
pub fn encode_clean(c: &Clean<'_>, out: &mut Vec<u8>) {
    frame(out, |b| {
        b.push(CLEAN);
        short_str(b, c.epoch);
        b.extend_from_slice(&c.next_id.to_le_bytes());
    });
}

fn short_str(b: &mut Vec<u8>, s: &str) {
    let s = s.as_bytes();
    let s = s.get(..s.len().min(255)).unwrap_or_default();
    b.push(s.len() as u8);
    b.extend_from_slice(s);
}

/// Writes the frame around the body `body` appends.
fn frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[MARK, 0, 0, 0, 0, 0, 0, 0, 0]);
    body(out);
    let len = (out.len() - start - FRAME) as u32;
    let crc = crc32c(out.get(start + FRAME..).unwrap_or_default());
    if let Some(f) = out.get_mut(start + 1..start + 5) {
        f.copy_from_slice(&len.to_le_bytes());
    }
    if let Some(f) = out.get_mut(start + 5..start + FRAME) {
        f.copy_from_slice(&crc.to_le_bytes());
    }
}

/// Decodes the record at the start of `buf`: the record and the bytes it took.
pub fn decode(buf: &[u8]) -> Result<(Record<'_>, usize), RecordError> {
    let Some((&mark, rest)) = buf.split_first() else {
        return Err(RecordError::Truncated);
    };
    if mark != MARK {
        return Err(RecordError::Mark);
    }
    let (len, rest) = take(rest, 4).map_err(|_| RecordError::Truncated)?;
    let len = u32::from_le_bytes(array4(len)) as usize;
    if len > MAX_BODY {
        return Err(RecordError::Length);
    }
    let (crc, rest) = take(rest, 4).map_err(|_| RecordError::Truncated)?;
    let (body, _) = take(rest, len).map_err(|_| RecordError::Truncated)?;
    if crc32c(body) != u32::from_le_bytes(array4(crc)) {
        return Err(RecordError::Checksum);
    }
    let record = decode_body(body).ok_or(RecordError::Body)?;
    Ok((record, FRAME + len))
}

fn decode_body(body: &[u8]) -> Option<Record<'_>> {
    let (&kind, rest) = body.split_first()?;
    match kind {
        HEADER => {
            let (epoch, rest) = take_short_str(rest)?;
            let (boot_id, rest) = take_short_str(rest)?;
            let (floor, rest) = take_u64(rest)?;
            let synced = match rest {
                [0] => false,
                [1] => true,
                _ => return None,
            };
            Some(Record::Header(Header {
                epoch,
                boot_id,
                floor,
                synced,
            }))
        }
        MESSAGE => {
            let (id, rest) = take_u64(rest)?;
            let (unix_secs, rest) = take_u64(rest)?;
            let (epoch, rest) = take_short_str(rest)?;
            let (tlen, rest) = take(rest, 2).ok()?;
            let tlen = u16::from_le_bytes([*tlen.first()?, *tlen.get(1)?]);
            let (topic, rest) = take(rest, usize::from(tlen)).ok()?;
            let topic = std::str::from_utf8(topic).ok()?;
            let body = wire::decode(rest).ok()?;
            Some(Record::Message(Message {
                id,
                unix_secs,
                epoch,
                topic,
                body,
            }))
        }
        STREAM => {
            let (id, rest) = take_u64(rest)?;
            let (unix_secs, rest) = take_u64(rest)?;
            let (epoch, rest) = take_short_str(rest)?;
            let (tlen, rest) = take(rest, 2).ok()?;
            let tlen = u16::from_le_bytes([*tlen.first()?, *tlen.get(1)?]);
            let (topic, rest) = take(rest, usize::from(tlen)).ok()?;
            let topic = std::str::from_utf8(topic).ok()?;
            let (stream, rest) = take_u64(rest)?;
            let (seq, rest) = take(rest, 4).ok()?;
            let seq = u32::from_le_bytes(array4(seq));
            let (&state, rest) = rest.split_first()?;
            let closed = match state >> 1 {
                0 => None,
                1 => Some(CloseReason::Done),
                2 => Some(CloseReason::Timeout),
                3 => Some(CloseReason::Restart),
                _ => return None,
            };
            Some(Record::Stream(StreamRecord {
                id,
                unix_secs,
                epoch,
                topic,
                stream,
                seq,
                whole: state & 1 == 1,
                closed,
                data: std::str::from_utf8(rest).ok()?,
            }))
        }
        CLEAN => {
            let (epoch, rest) = take_short_str(rest)?;
            let (next_id, rest) = take_u64(rest)?;
            rest.is_empty()
                .then_some(Record::Clean(Clean { epoch, next_id }))
        }
        _ => None,
    }
}

fn take(buf: &[u8], n: usize) -> Result<(&[u8], &[u8]), ()> {
    if buf.len() < n {
        return Err(());
    }
    Ok(buf.split_at(n))
}

fn array4(b: &[u8]) -> [u8; 4] {
    let mut a = [0; 4];
    if let Some(src) = b.get(..4) {
        a.copy_from_slice(src);
    }
    a
}

fn take_u64(buf: &[u8]) -> Option<(u64, &[u8])> {
    let (n, rest) = take(buf, 8).ok()?;
    let mut a = [0; 8];
    a.copy_from_slice(n);
    Some((u64::from_le_bytes(a), rest))
}

fn take_short_str(buf: &[u8]) -> Option<(&str, &[u8])> {
    let (&n, rest) = buf.split_first()?;
    let (s, rest) = take(rest, usize::from(n)).ok()?;
    Some((std::str::from_utf8(s).ok()?, rest))
}

/// A region of a file that holds no intact record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damage {
    /// Where it starts.
    pub offset: usize,
    /// How many bytes it spans.
    pub len: usize,
    /// What was wrong with the first bytes of it.
    pub error: RecordError,
}

/// What [`scan`] found in one file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scan<'a> {
    /// Intact records with their offsets, in file order.
    pub records: Vec<(usize, Record<'a>)>,
    /// Damaged regions followed by at least one intact record.
    pub damage: Vec<Damage>,
    /// Bytes at the end that hold no intact record: `Some` with `error` [`RecordError::Truncated`]
    /// when the file simply ends inside its last record (a write cut short), otherwise damage
    /// that runs to the end of the file.
    pub tail: Option<Damage>,
}

/// Splits a whole file into its intact records and its damaged regions. After a record that
/// does not decode, scanning resumes at the next offset where an intact record starts (its
/// mark, length and CRC all agree), so one flipped byte costs one record, not the rest of the
/// file. Never panics, whatever the bytes.
pub fn scan(buf: &[u8]) -> Scan<'_> {
    let mut out = Scan::default();
    let mut at = 0;
    while at < buf.len() {
        let rest = buf.get(at..).unwrap_or_default();
        match decode(rest) {
            Ok((r, used)) => {
                out.records.push((at, r));
                at += used;
            }
            Err(error) => match resync(buf, at + 1) {
                Some(next) => {
                    out.damage.push(Damage {
                        offset: at,
                        len: next - at,
                        error,
                    });
                    at = next;
                }
                None => {
                    out.tail = Some(Damage {
                        offset: at,
                        len: buf.len() - at,
                        error,
                    });
                    break;
                }
            },
        }
    }
    out
}

/// [`scan`] one piece of a file at a time, so that reading a file holds only the record being
/// read, never the whole file (a segment of a gigabyte of zeros costs a buffer, not a
/// gigabyte). Feeding a file's bytes in pieces of any sizes finds the same records, damage and
/// tail as [`scan`] of the whole of it.
#[derive(Debug, Default)]
pub struct Scanner {
    /// The file offset of the first byte of the next piece.
    at: usize,
    /// Damage found at this offset with this error, whose end is not found yet.
    damage: Option<(usize, RecordError)>,
}

/// What [`Scanner::feed`] found, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found<'a> {
    /// An intact record.
    Record {
        /// Its offset in the file.
        offset: usize,
        /// Its bytes, frame included.
        bytes: &'a [u8],
        /// It, decoded.
        record: Record<'a>,
    },
    /// A damaged region followed by an intact record.
    Damage(Damage),
}

impl Scanner {
    /// Scans `buf`, the file's bytes from where the previous piece's used bytes ended, and
    /// hands what it finds to `found`. `end`: `buf` reaches the end of the file. Returns how
    /// many bytes of `buf` it used: the caller drops them and feeds the rest again with the
    /// bytes that follow (the start of a record not yet whole). With `end`, every byte is used.
    pub fn feed<'a>(
        &mut self,
        buf: &'a [u8],
        end: bool,
        mut found: impl FnMut(Found<'a>),
    ) -> usize {
        let mut i = 0;
        loop {
            let rest = buf.get(i..).unwrap_or_default();
            match self.damage {
                Some((start, error)) => {
                    let Some(q) = rest.iter().position(|&b| b == MARK).map(|q| i + q) else {
                        i = buf.len();
                        break;
                    };
                    match decode(buf.get(q..).unwrap_or_default()) {
                        Ok(_) => {
                            found(Found::Damage(Damage {
                                offset: start,
                                len: self.at + q - start,
                                error,
                            }));
                            self.damage = None;
                            i = q;
                        }
                        Err(RecordError::Truncated) if !end => {
                            i = q;
                            break;
                        }
                        Err(_) => i = q + 1,
                    }
                }
                None => {
                    if rest.is_empty() {
                        break;
                    }
                    match decode(rest) {
                        Ok((record, used)) => {
                            found(Found::Record {
                                offset: self.at + i,
                                bytes: rest.get(..used).unwrap_or_default(),
                                record,
                            });
                            i += used;
                        }
                        Err(RecordError::Truncated) if !end => break,
                        Err(error) => {
                            self.damage = Some((self.at + i, error));
                            i += 1;
                        }
                    }
                }
            }
        }
        self.at += i;
        i
    }

    /// After the last piece (fed with `end`): the damage that runs to the end of the file, as
    /// [`Scan::tail`].
    pub fn finish(self) -> Option<Damage> {
        self.damage.map(|(offset, error)| Damage {
            offset,
            len: self.at - offset,
            error,
        })
    }
}

/// The first offset from `from` at which an intact record starts.
fn resync(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(rest) = buf.get(at..) {
        let i = rest.iter().position(|&b| b == MARK)?;
        at += i;
        if decode(buf.get(at..).unwrap_or_default()).is_ok() {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// CRC-32C (Castagnoli), as iSCSI and ext4 use it: reflected polynomial 0x82F63B78.
// The index is masked to 0..=255 and the table has 256 entries.
#[allow(clippy::indexing_slicing)]
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

// `i` runs over 0..256, the table's length.
#[allow(clippy::indexing_slicing)]
const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::ws::DataKind;

    fn msg(id: u64, payload: &str) -> Message<'_> {
        Message {
            id,
            unix_secs: 1_700_000_000 + id,
            epoch: "ep1",
            topic: "news",
            body: wire::Body {
                tags: None,
                conflation_key: None,
                kind: DataKind::Text,
                event: if id.is_multiple_of(2) {
                    Some("tick")
                } else {
                    None
                },
                attachment: if id.is_multiple_of(3) {
                    Some(b"grip")
                } else {
                    None
                },
                payload: payload.as_bytes(),
            },
        }
    }

    fn segment(n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_header(
            &Header {
                epoch: "ep1",
                boot_id: "boot",
                floor: 7,
                synced: true,
            },
            &mut out,
        );
        for id in 1..=n {
            encode_message(&msg(id, &format!("payload {id}")), &mut out);
        }
        out
    }

    fn ids(s: &Scan<'_>) -> Vec<u64> {
        s.records
            .iter()
            .filter_map(|(_, r)| match r {
                Record::Message(m) => Some(m.id),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // RFC 3720 B.4 / the usual check value for "123456789".
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }

    #[test]
    fn records_round_trip() {
        let buf = segment(6);
        let s = scan(&buf);
        assert!(s.damage.is_empty() && s.tail.is_none());
        assert_eq!(ids(&s), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(
            s.records[0].1,
            Record::Header(Header {
                epoch: "ep1",
                boot_id: "boot",
                floor: 7,
                synced: true
            })
        );
        assert_eq!(s.records[6].1, Record::Message(msg(6, "payload 6")));
        let mut c = Vec::new();
        encode_clean(
            &Clean {
                epoch: "ep1",
                next_id: 42,
            },
            &mut c,
        );
        assert_eq!(
            decode(&c).unwrap(),
            (
                Record::Clean(Clean {
                    epoch: "ep1",
                    next_id: 42
                }),
                c.len()
            )
        );
    }

    #[test]
    fn a_file_cut_inside_its_last_record_is_a_truncated_tail() {
        let buf = segment(5);
        for cut in 1..buf.len() {
            let s = scan(&buf[..cut]);
            assert!(s.damage.is_empty(), "cut at {cut}: {:?}", s.damage);
            let whole = s
                .records
                .last()
                .map_or(0, |(o, _)| *o + decode(&buf[*o..]).unwrap().1);
            match s.tail {
                None => assert_eq!(whole, cut),
                Some(t) => {
                    assert_eq!(t.error, RecordError::Truncated, "cut at {cut}");
                    assert_eq!(t.offset, whole);
                }
            }
        }
    }

    #[test]
    fn a_flipped_byte_costs_one_record_and_is_reported() {
        let buf = segment(8);
        let s = scan(&buf);
        let (o3, _) = s.records[3];
        let (o4, _) = s.records[4];
        for i in o3..o4 {
            let mut bad = buf.clone();
            bad[i] ^= 0x5A;
            let s = scan(&bad);
            assert_eq!(ids(&s), vec![1, 2, 4, 5, 6, 7, 8], "flip at {i}");
            assert_eq!(s.damage.len(), 1);
            assert_eq!(s.damage[0].offset, o3);
            assert_eq!(s.damage[0].len, o4 - o3);
            assert!(s.tail.is_none());
        }
    }

    #[test]
    fn damage_at_the_end_is_not_mistaken_for_a_cut() {
        let buf = segment(3);
        let mut bad = buf.clone();
        let n = bad.len();
        bad[n - 2] ^= 1;
        let s = scan(&bad);
        assert_eq!(ids(&s), vec![1, 2]);
        assert_eq!(s.tail.unwrap().error, RecordError::Checksum);
    }

    #[test]
    fn garbage_gives_no_records() {
        let junk: Vec<u8> = (0..4000u32).map(|i| (i * 7919 % 251) as u8).collect();
        assert!(scan(&junk).records.is_empty());
        let mut huge = vec![MARK];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&huge), Err(RecordError::Length));
        // A CRC-valid body of an unknown type is damage, not a record.
        let mut odd = Vec::new();
        frame(&mut odd, |b| b.push(9));
        assert_eq!(decode(&odd), Err(RecordError::Body));
    }

    /// [`Scanner`] over `buf` in pieces of `piece` bytes, keeping only what it did not use.
    fn scan_in_pieces(buf: &[u8], piece: usize) -> (Vec<usize>, Scan<'static>, usize) {
        let mut sc = Scanner::default();
        let mut held: Vec<u8> = Vec::new();
        let mut out = Scan::default();
        let mut offsets = Vec::new();
        let mut fed = 0;
        let mut most = 0;
        loop {
            let next = (fed + piece).min(buf.len());
            held.extend_from_slice(&buf[fed..next]);
            fed = next;
            let end = fed == buf.len();
            let used = sc.feed(&held, end, |f| match f {
                Found::Record { offset, bytes, .. } => {
                    assert_eq!(&buf[offset..offset + bytes.len()], bytes);
                    offsets.push(offset);
                }
                Found::Damage(d) => out.damage.push(d),
            });
            held.drain(..used);
            most = most.max(held.len());
            if end {
                assert!(held.is_empty());
                break;
            }
        }
        out.tail = sc.finish();
        (offsets, out, most)
    }

    #[test]
    fn a_file_scanned_in_pieces_gives_what_a_whole_scan_gives() {
        let good = segment(12);
        let whole = scan(&good);
        let mut cases: Vec<Vec<u8>> = vec![good.clone(), vec![0; 5000], Vec::new()];
        for (o, _) in whole.records.iter().skip(1).step_by(3) {
            let mut flipped = good.clone();
            flipped[o + 11] ^= 0x21;
            cases.push(flipped);
            cases.push(good[..o + 5].to_vec());
            let mut marked = good.clone();
            marked[*o + 2] = MARK;
            cases.push(marked);
        }
        let mut zeros_then_good = vec![0u8; 3000];
        zeros_then_good.extend_from_slice(&good);
        zeros_then_good.extend_from_slice(&[MARK, 1, 0]);
        cases.push(zeros_then_good);
        for (n, case) in cases.iter().enumerate() {
            let want = scan(case);
            for piece in [1, 2, 7, 9, 64, 1000, 100_000] {
                let (offsets, got, _) = scan_in_pieces(case, piece);
                let want_offsets: Vec<usize> = want.records.iter().map(|(o, _)| *o).collect();
                assert_eq!(offsets, want_offsets, "case {n}, pieces of {piece}");
                assert_eq!(got.damage, want.damage, "case {n}, pieces of {piece}");
                assert_eq!(got.tail, want.tail, "case {n}, pieces of {piece}");
            }
        }
        // What is held between pieces is the start of one record, never the damage before it.
        let mut zeros = vec![0u8; 1 << 20];
        zeros.extend_from_slice(&good);
        let (offsets, got, most) = scan_in_pieces(&zeros, 4096);
        assert_eq!(offsets.len(), whole.records.len());
        assert_eq!(got.damage[0].len, 1 << 20);
        assert!(most < 4096, "held {most} bytes");
    }

    #[test]
    fn stream_records_round_trip_beside_messages_and_odd_states_are_refused() {
        let frag = |seq: u32, whole, closed| StreamRecord {
            id: 40 + u64::from(seq),
            unix_secs: 1_700_000_000,
            epoch: "ep1",
            topic: "ai",
            stream: 41,
            seq,
            whole,
            closed,
            data: "h\u{e9}llo",
        };
        let records = [
            frag(1, false, None),
            frag(2, true, None),
            frag(3, false, Some(CloseReason::Done)),
            frag(4, true, Some(CloseReason::Timeout)),
            frag(5, true, Some(CloseReason::Restart)),
        ];
        let mut buf = Vec::new();
        encode_message(&msg(1, "plain"), &mut buf);
        for r in &records {
            encode_stream(r, &mut buf);
        }
        let s = scan(&buf);
        assert!(s.damage.is_empty() && s.tail.is_none());
        assert_eq!(s.records.len(), 6);
        assert_eq!(s.records[0].1, Record::Message(msg(1, "plain")));
        for (got, want) in s.records[1..].iter().zip(&records) {
            assert_eq!(got.1, Record::Stream(*want));
        }
        // A state byte with a bit beyond the three used is not a record this version writes.
        let mut one = Vec::new();
        encode_stream(&records[0], &mut one);
        let state = one.len() - "h\u{e9}llo".len() - 1;
        one[state] = 0b1000;
        let crc = crc32c(&one[FRAME..]);
        one[5..9].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&one), Err(RecordError::Body));
    }
}
