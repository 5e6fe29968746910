//! The stream table of a hand-over's **history** frame ([`crate::handover::History`]): the
//! appendable messages ([`crate::pubsub::append`]) the old process holds, so that a publisher
//! appending to a stream opened before the upgrade carries on, and history keeps replaying
//! each stream as one folded message.
//!
//! Pure functions over bytes. The table is an optional part at the end of the frame's body:
//! a frame written before streams existed (or by a process holding none) ends after its
//! records and decodes with no table, and a process holding none writes none, so an older
//! binary still reads its frame. The decoder checks every length and count against what is
//! left, refuses non-canonical bytes (a flag other than 0 or 1, text that is not UTF-8), and
//! never panics.
//!
//! ```text
//! n (u32) open streams: id u64 | topic str16 | held? (flag | u64) | seq u32
//!                       | left u32 (seconds before its timeout closes it) | text (u32 len, UTF-8)
//! n (u32) folded ids (u64 each): history entries that are a stream's text so far
//! n (u32) closed ids (u64 each): streams closed lately (a late append is told `closed`)
//! ```

use crate::handover_cursor::{Error, Reader};

/// One open stream, as the old process holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenStream<'a> {
    /// Its id's `SEQ` (its opening publish's).
    pub id: u64,
    /// Its topic.
    pub topic: &'a str,
    /// The `SEQ` of its folded entry in history, if history keeps it.
    pub held: Option<u64>,
    /// Fragments so far.
    pub seq: u32,
    /// Seconds left before `stream_timeout` closes it (its deadline, relative to the freeze).
    pub left: u32,
    /// Its text so far (its byte count is the text's length).
    pub text: &'a str,
}

/// The streams a hand-over carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamTable<'a> {
    /// The open streams.
    pub open: Vec<OpenStream<'a>>,
    /// The `SEQ`s of the history entries that are folded streams (open or closed), in id order.
    pub folded: Vec<u64>,
    /// The `SEQ`s of streams closed lately, oldest first.
    pub closed: Vec<u64>,
}

impl StreamTable<'_> {
    /// Whether it holds nothing (then the frame carries no table).
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.folded.is_empty() && self.closed.is_empty()
    }
}

/// Appends `t`'s encoding to `out`. A topic beyond 64 KiB is cut (topics are at most 255 bytes).
pub fn encode(t: &StreamTable<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(&(t.open.len() as u32).to_le_bytes());
    for s in &t.open {
        out.extend_from_slice(&s.id.to_le_bytes());
        let topic = s.topic.as_bytes();
        let topic = topic.get(..topic.len().min(0xFFFF)).unwrap_or_default();
        out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
        out.extend_from_slice(topic);
        match s.held {
            None => out.push(0),
            Some(h) => {
                out.push(1);
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        out.extend_from_slice(&s.seq.to_le_bytes());
        out.extend_from_slice(&s.left.to_le_bytes());
        out.extend_from_slice(&(s.text.len() as u32).to_le_bytes());
        out.extend_from_slice(s.text.as_bytes());
    }
    for ids in [&t.folded, &t.closed] {
        out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
}

/// Reads a table from `r` (which it consumes to the table's end).
pub(crate) fn decode<'a>(r: &mut Reader<'a>) -> Result<StreamTable<'a>, Error> {
    let n = r.u32()? as usize;
    // An open stream takes at least 27 bytes, an id 8: a count beyond that is a lie, not a
    // size to reserve.
    let mut open = Vec::with_capacity(n.min(r.buf.len() / 27));
    for _ in 0..n {
        let id = r.u64()?;
        let topic = r.str16()?;
        let held = if r.flag()? { Some(r.u64()?) } else { None };
        let seq = r.u32()?;
        let left = r.u32()?;
        let len = r.u32()? as usize;
        let text = r.str_of(len)?;
        open.push(OpenStream {
            id,
            topic,
            held,
            seq,
            left,
            text,
        });
    }
    let mut ids = || -> Result<Vec<u64>, Error> {
        let n = r.u32()? as usize;
        let mut v = Vec::with_capacity(n.min(r.buf.len() / 8));
        for _ in 0..n {
            v.push(r.u64()?);
        }
        Ok(v)
    };
    let folded = ids()?;
    let closed = ids()?;
    Ok(StreamTable {
        open,
        folded,
        closed,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::handover::{decode as decode_frame, encode as encode_frame, Frame, History};

    fn history(streams: Option<StreamTable<'static>>) -> Frame<'static> {
        Frame::History(History {
            epoch: "k3x9",
            next_id: 1001,
            on_disk: false,
            forgotten_floor: 7,
            floors: vec![("news", 12)],
            records: b"\xC7records",
            streams,
        })
    }

    fn table() -> StreamTable<'static> {
        StreamTable {
            open: vec![
                OpenStream {
                    id: 990,
                    topic: "ai/answers",
                    held: Some(999),
                    seq: 4,
                    left: 287,
                    text: "Hello wor\u{e9}",
                },
                OpenStream {
                    id: 1000,
                    topic: "t",
                    held: None,
                    seq: 1,
                    left: 0,
                    text: "",
                },
            ],
            folded: vec![870, 999],
            closed: vec![870, 12],
        }
    }

    #[test]
    fn a_history_frame_with_streams_round_trips() {
        for streams in [Some(table()), Some(StreamTable::default())] {
            let f = history(streams);
            let mut out = Vec::new();
            encode_frame(&f, &mut out);
            let (got, used) = decode_frame(&out).unwrap().unwrap();
            assert_eq!((got, used), (f, out.len()));
        }
    }

    #[test]
    fn a_history_frame_written_before_streams_decodes_without_a_table() {
        // What a process without streams wrote: the body ends after the records.
        let f = history(None);
        let mut old = Vec::new();
        encode_frame(&f, &mut old);
        let mut with = Vec::new();
        encode_frame(&history(Some(table())), &mut with);
        assert!(with.len() > old.len());
        let (got, _) = decode_frame(&old).unwrap().unwrap();
        let Frame::History(h) = got else {
            panic!("not a history frame")
        };
        assert_eq!(h.streams, None);
        assert_eq!(h.records, b"\xC7records");
    }

    #[test]
    fn a_cut_or_lying_stream_table_is_refused_without_panicking() {
        let mut out = Vec::new();
        encode_frame(&history(Some(table())), &mut out);
        let body_start = crate::handover::HEAD;
        // Every cut inside the table leaves a frame whose length says less: each one is
        // refused, never read as a shorter table.
        let mut full = Vec::new();
        encode_frame(&history(None), &mut full);
        for cut in full.len() + 1..out.len() {
            let mut b = out[..cut].to_vec();
            let len = (cut - body_start) as u32;
            b[5..9].copy_from_slice(&len.to_le_bytes());
            assert!(decode_frame(&b).is_err(), "cut at {cut}");
        }
        // A count of streams far beyond the bytes left.
        let mut b = full.clone();
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        let len = (b.len() - body_start) as u32;
        b[5..9].copy_from_slice(&len.to_le_bytes());
        assert!(decode_frame(&b).is_err());
    }
}
