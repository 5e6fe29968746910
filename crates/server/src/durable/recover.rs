//! Recovery: from the bytes of a history directory's files to the history a new process starts
//! with, the epoch it issues ids in, and the gaps it must announce. Sans-IO: the files' bytes,
//! the kernel boot id and the time are passed in ([`Input`]), so every rule here is unit tested
//! without a disk or a crash.
//!
//! # The rules
//!
//! - **Same epoch** when nothing a client saw can be missing or reused: the previous process
//!   stopped gracefully (its clean-stop file names the epoch of the last segment and the next
//!   id), or it stopped uncleanly under the same boot id (the machine did not restart, so every
//!   `write(2)` it made is in the page cache and on its way to disk: the log is complete).
//!   A record cut short at the very end of the log after an unclean stop is a write the crash
//!   interrupted: its publish was never acknowledged nor delivered (the log is written before
//!   either), so its id may be issued again.
//! - **New epoch** when ids may have been issued that the log does not hold: the boot id
//!   changed (or cannot be read) since an unclean stop (writes after the last `fsync` may be
//!   lost), or the last record of the log is damaged rather than cut. Resuming clients then get
//!   the `epoch` gap and everything held, as after a restart without `history_dir`; the
//!   recovered messages keep their own ids.
//! - **Damage inside the log** (a record whose CRC fails, a missing segment number, a file cut
//!   before its end) loses the records in it, whose topics are unknown: every topic's floor is
//!   raised to the id before the next intact record (or to the last id issued, for damage at
//!   the end of a gracefully stopped log), so a resume from before it gets a `trimmed` gap and
//!   the intact messages after it. The raised floor is carried in later segments' headers so a
//!   second restart still announces it.

use std::collections::{HashMap, HashSet};

use clarion_proto::history_log::{self, Damage, Message, Record, RecordError, StreamRecord};
use clarion_proto::pubsub::append::CloseReason;

use crate::config::HistoryLimits;

/// One segment file.
pub struct SegmentFile<'a> {
    /// Its number (segments are written in increasing numbers).
    pub seq: u64,
    /// Its name, for reports.
    pub name: String,
    /// What it holds: its intact records, its damage and its tail ([`history_log::scan`] of
    /// its bytes, or the same found piece by piece by [`history_log::Scanner`]).
    pub scan: history_log::Scan<'a>,
    /// Whether it is empty.
    pub empty: bool,
}

/// What recovery reads.
pub struct Input<'a> {
    /// Every segment, in increasing `seq`.
    pub segments: Vec<SegmentFile<'a>>,
    /// The clean-stop file, if there is one.
    pub clean: Option<&'a [u8]>,
    /// This boot's id (`None` if it cannot be read).
    pub boot_id: Option<&'a str>,
    /// Seconds since the Unix epoch.
    pub now_unix: u64,
    /// The history limits now in force.
    pub limits: HistoryLimits,
    /// The `SEQ`s of the streams a hand-over carries open (in the epoch it continues): left
    /// open, not closed by the restart, as the new process takes them over.
    pub carried_open: &'a [u64],
}

/// What the new process starts with.
#[derive(Debug, Default)]
pub struct Recovered<'a> {
    /// The epoch to continue, or `None` to begin a new one.
    pub epoch: Option<String>,
    /// The `SEQ` of the next id to issue.
    pub next_id: u64,
    /// Messages to hold, in increasing id, within the limits.
    pub messages: Vec<Message<'a>>,
    /// Appendable messages to hold, each folded into one entry at its latest position, in
    /// increasing id, within the same limits (a stream counts as one message of its topic).
    pub streams: Vec<FoldedStream<'a>>,
    /// Every topic (and any topic created later) may have lost messages with ids up to this.
    pub floor: u64,
    /// The part of `floor` due to damage, written into new segment headers.
    pub damage_floor: u64,
    /// Topics whose history is full: messages before their first held one were trimmed.
    pub topic_floors: Vec<(String, u64)>,
    /// What was wrong, one line per problem, naming the file.
    pub reports: Vec<String>,
}

/// An appendable message as its records fold: its text up to the last fragment on disk, at
/// that fragment's position. A stream open when the log ended is closed by the restart, unless
/// a hand-over carries it open ([`Input::carried_open`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoldedStream<'a> {
    /// The `SEQ` of its latest fragment's position.
    pub id: u64,
    /// When that fragment was published, in Unix seconds.
    pub unix_secs: u64,
    /// The epoch of its ids.
    pub epoch: &'a str,
    /// Its topic.
    pub topic: &'a str,
    /// The stream's id `SEQ`.
    pub stream: u64,
    /// Fragments its text includes.
    pub seq: u32,
    /// The text so far.
    pub text: String,
    /// Why it is closed ([`CloseReason::Restart`] when it was open and not carried on).
    pub closed: Option<CloseReason>,
}

/// One step of the log in file order.
enum Entry<'a> {
    Message(Message<'a>),
    Stream(StreamRecord<'a>),
    /// Records lost here; `cut` when the log simply ends inside its last record.
    Lost {
        cut: bool,
    },
}

/// Recovers the history a directory's files hold.
pub fn recover<'a>(input: &Input<'a>) -> Recovered<'a> {
    let mut out = Recovered::default();
    let mut entries: Vec<Entry<'a>> = Vec::new();
    let mut last_header: Option<(&'a str, &'a str, bool)> = None;
    let mut prev_seq: Option<u64> = None;
    let count = input.segments.len();
    for (i, seg) in input.segments.iter().enumerate() {
        if let Some(p) = prev_seq {
            if seg.seq != p + 1 {
                out.reports.push(format!(
                    "segment files {} to {} are missing (before {})",
                    p + 1,
                    seg.seq - 1,
                    seg.name
                ));
                entries.push(Entry::Lost { cut: false });
            }
        }
        prev_seq = Some(seg.seq);
        let scan = &seg.scan;
        let mut header = None;
        if let Some(d) = scan.damage.first().filter(|d| d.offset == 0) {
            // Damage before the first intact record.
            report(&mut out.reports, &seg.name, d);
            entries.push(Entry::Lost { cut: false });
        }
        for (n, (_, r)) in scan.records.iter().enumerate() {
            match r {
                Record::Header(h) if n == 0 => {
                    header = Some((h.epoch, h.boot_id, h.synced));
                    out.damage_floor = out.damage_floor.max(h.floor);
                }
                Record::Message(m) => entries.push(Entry::Message(*m)),
                Record::Stream(r) => entries.push(Entry::Stream(*r)),
                _ => {}
            }
            if let Some(d) = scan.damage.iter().find(|d| at_end_of(d, &scan.records, n)) {
                report(&mut out.reports, &seg.name, d);
                entries.push(Entry::Lost { cut: false });
            }
        }
        if header.is_none() && !seg.empty {
            out.reports
                .push(format!("{}: no valid segment header", seg.name));
        }
        if let Some(h) = header {
            last_header = Some(h);
        }
        if let Some(t) = &scan.tail {
            let last = i + 1 == count;
            let cut = last && t.error == RecordError::Truncated;
            report(&mut out.reports, &seg.name, t);
            entries.push(Entry::Lost { cut });
        }
    }

    let max_id = entries.iter().filter_map(Entry::id).max().unwrap_or(0);
    let clean = input
        .clean
        .and_then(|b| history_log::decode(b).ok())
        .and_then(|(r, _)| match r {
            Record::Clean(c) => Some(c),
            _ => None,
        })
        .filter(|c| last_header.is_some_and(|(e, _, _)| e == c.epoch));
    if input.clean.is_some() && clean.is_none() {
        out.reports.push(
            "the clean-stop file does not match the log: treating the stop as unclean".into(),
        );
    }
    let ends_in_damage = matches!(entries.last(), Some(Entry::Lost { cut: false }));
    out.next_id = max_id + 1;
    // The id after the last one that may have been issued (known only when continuing).
    let mut end = None;
    // Whether what the end of the log lost was never acknowledged (every write was synced).
    let mut tail_unacknowledged = false;
    match (last_header, clean) {
        (Some((epoch, _, _)), Some(c)) => {
            out.epoch = Some(epoch.to_owned());
            out.next_id = out.next_id.max(c.next_id);
            end = Some(c.next_id.max(max_id + 1));
        }
        (Some((epoch, boot, synced)), None) => {
            let same_boot = !boot.is_empty() && input.boot_id == Some(boot);
            if synced {
                // Every record a client may have seen was on disk before it was delivered:
                // whatever the end of the log lost, cut or damaged, was never acknowledged.
                out.epoch = Some(epoch.to_owned());
                end = Some(max_id + 1);
                tail_unacknowledged = true;
            } else if !same_boot {
                out.reports.push(
                    "unclean stop and the machine restarted since (boot id changed): messages \
                     written after the last fsync may be lost, so a new epoch begins"
                        .into(),
                );
            } else if ends_in_damage {
                out.reports.push(
                    "unclean stop and the end of the log is damaged: ids issued after it are \
                     unknown, so a new epoch begins"
                        .into(),
                );
            } else {
                out.epoch = Some(epoch.to_owned());
                end = Some(max_id + 1);
            }
        }
        (None, _) => {}
    }

    // Lost records: the floor rises to just before the next intact id.
    let mut before = 0u64;
    for (i, e) in entries.iter().enumerate() {
        match e {
            Entry::Message(_) | Entry::Stream(_) => before = before.max(e.id().unwrap_or(0)),
            Entry::Lost { cut } => {
                let after = entries
                    .get(i + 1..)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(Entry::id)
                    .filter(|id| *id > before)
                    .min();
                let lost_to = match (after, end) {
                    (Some(a), _) => a - 1,
                    // A cut at the end after an unclean stop lost nothing acknowledged.
                    (None, _) if (*cut || tail_unacknowledged) && clean.is_none() => continue,
                    (None, Some(end)) => end - 1,
                    (None, None) => max_id,
                };
                if lost_to > before {
                    out.damage_floor = out.damage_floor.max(lost_to);
                }
            }
        }
    }

    // The messages to hold: one copy of each id, in order, within age and count.
    let mut seen = HashSet::new();
    let fresh =
        |unix_secs: u64| u64::from(input.limits.ttl) > input.now_unix.saturating_sub(unix_secs);
    let mut streams = fold_streams(&entries, &mut seen, &mut out.reports);
    streams.retain(|f| fresh(f.unix_secs));
    for f in &mut streams {
        // The ids a hand-over carries are the epoch's it continues: a stream of an older one
        // with the same SEQ is another stream.
        let carried =
            out.epoch.as_deref() == Some(f.epoch) && input.carried_open.contains(&f.stream);
        if !carried {
            f.closed = f.closed.or(Some(CloseReason::Restart));
        }
    }
    let mut msgs: Vec<Message<'a>> = entries
        .into_iter()
        .filter_map(|e| match e {
            Entry::Message(m) => Some(m),
            Entry::Stream(_) | Entry::Lost { .. } => None,
        })
        .filter(|m| seen.insert(m.id))
        .filter(|m| fresh(m.unix_secs))
        .collect();
    msgs.sort_unstable_by_key(|m| m.id);
    // Both kinds, in id order: a stream is one entry of its topic's history.
    let mut held: Vec<(u64, &'a str)> = msgs
        .iter()
        .map(|m| (m.id, m.topic))
        .chain(streams.iter().map(|f| (f.id, f.topic)))
        .collect();
    held.sort_unstable();
    let mut per_topic: HashMap<&str, usize> = HashMap::new();
    for (_, t) in &held {
        *per_topic.entry(t).or_default() += 1;
    }
    let mut skip: HashMap<&str, usize> = per_topic
        .iter()
        .map(|(t, n)| (*t, n.saturating_sub(input.limits.per_topic)))
        .collect();
    held.retain(|(_, t)| match skip.get_mut(t) {
        Some(n) if *n > 0 => {
            *n -= 1;
            false
        }
        _ => true,
    });
    let kept: HashSet<u64> = held.iter().map(|(id, _)| *id).collect();
    msgs.retain(|m| kept.contains(&m.id));
    streams.retain(|f| kept.contains(&f.id));
    // Where each entry's positions begin: a stream's at its opening fragment (the ids between
    // it and its entry are its own fragments, not messages a resume misses).
    let mut starts: Vec<(u64, &'a str)> = msgs
        .iter()
        .map(|m| (m.id, m.topic))
        .chain(streams.iter().map(|f| (f.stream.min(f.id), f.topic)))
        .collect();
    starts.sort_unstable();
    let mut firsts: HashMap<&str, u64> = HashMap::new();
    for (id, t) in &starts {
        firsts.entry(t).or_insert(*id);
    }
    out.topic_floors = firsts
        .into_iter()
        .filter(|(t, _)| {
            per_topic
                .get(t)
                .is_some_and(|n| *n >= input.limits.per_topic)
        })
        .map(|(t, first)| (t.to_owned(), first - 1))
        .collect();
    out.topic_floors.sort();
    // Ids below the oldest held message were trimmed (or never existed): any topic may miss them.
    let oldest = starts.first().map_or(out.next_id, |(id, _)| *id);
    out.floor = (oldest - 1).max(out.damage_floor);
    out.messages = msgs;
    out.streams = streams;
    out
}

impl Entry<'_> {
    fn id(&self) -> Option<u64> {
        match self {
            Entry::Message(m) => Some(m.id),
            Entry::Stream(r) => Some(r.id),
            Entry::Lost { .. } => None,
        }
    }
}

/// Folds the stream records of `entries` (file order) into one entry per stream, noting each
/// record's id in `seen`: a whole text sets a stream's text when it includes more fragments
/// than held, the next fragment is added, one already included is passed over. A fragment
/// whose predecessor is not on disk (lost to damage) leaves its stream out, reported: its text
/// would miss a piece. A stream still open at the end is left open (the caller decides).
fn fold_streams<'a>(
    entries: &[Entry<'a>],
    seen: &mut HashSet<u64>,
    reports: &mut Vec<String>,
) -> Vec<FoldedStream<'a>> {
    let mut folds: HashMap<u64, FoldedStream<'a>> = HashMap::new();
    let mut broken: HashSet<u64> = HashSet::new();
    for e in entries {
        let Entry::Stream(r) = e else { continue };
        // A whole text shares its id with the fragment it ends at: both may be on disk.
        let repeated = !seen.insert(r.id) && !r.whole;
        if repeated || broken.contains(&r.stream) {
            continue;
        }
        let held = folds.get(&r.stream).map_or(0, |f| f.seq);
        let next = r.whole && r.seq >= held || !r.whole && r.seq == held + 1;
        if next {
            let f = folds.entry(r.stream).or_insert_with(|| FoldedStream {
                id: r.id,
                unix_secs: r.unix_secs,
                epoch: r.epoch,
                topic: r.topic,
                stream: r.stream,
                seq: 0,
                text: String::new(),
                closed: None,
            });
            if r.whole {
                f.text.clear();
            }
            f.text.push_str(r.data);
            f.seq = r.seq;
            f.id = f.id.max(r.id);
            f.unix_secs = r.unix_secs;
            f.closed = r.closed;
        } else if r.seq > held {
            reports.push(format!(
                "stream {}-{} of topic {}: fragment {} follows fragment {held}; the stream is \
                 left out (a fragment was lost)",
                r.epoch, r.stream, r.topic, r.seq
            ));
            folds.remove(&r.stream);
            broken.insert(r.stream);
        }
    }
    let mut out: Vec<FoldedStream<'a>> = folds.into_values().collect();
    out.sort_unstable_by_key(|f| f.id);
    out
}

/// Whether damage `d` starts right after record `n` of `records`.
fn at_end_of(d: &Damage, records: &[(usize, Record<'_>)], n: usize) -> bool {
    let Some((start, _)) = records.get(n) else {
        return false;
    };
    let next = records.get(n + 1).map_or(usize::MAX, |(o, _)| *o);
    d.offset > *start && d.offset < next
}

fn report(reports: &mut Vec<String>, name: &str, d: &Damage) {
    reports.push(format!(
        "{name}: {} bytes at offset {} unreadable ({})",
        d.len, d.offset, d.error
    ));
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use clarion_proto::history_log::{encode_clean, encode_header, encode_message, Clean, Header};
    use clarion_proto::pubsub::wire;
    use clarion_proto::ws::DataKind;

    const NOW: u64 = 1_800_000_000;
    const LIMITS: HistoryLimits = HistoryLimits {
        per_topic: 1000,
        ttl: 3600,
        max_bytes: 1 << 30,
    };

    /// A segment written by epoch `ep` under boot `boot`, holding messages `ids` (topic by
    /// parity), published `age` seconds ago.
    fn seg(ep: &str, boot: &str, ids: std::ops::RangeInclusive<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_header(
            &Header {
                epoch: ep,
                boot_id: boot,
                floor: 0,
                synced: false,
            },
            &mut out,
        );
        for id in ids {
            encode_message(
                &Message {
                    id,
                    unix_secs: NOW - 10,
                    epoch: ep,
                    topic: if id % 2 == 0 { "even" } else { "odd" },
                    body: wire::Body {
                        tags: None,
                        conflation_key: None,
                        kind: DataKind::Text,
                        event: None,
                        attachment: None,
                        payload: b"x",
                    },
                },
                &mut out,
            );
        }
        out
    }

    fn clean(ep: &str, next_id: u64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_clean(&Clean { epoch: ep, next_id }, &mut out);
        out
    }

    fn run<'a>(
        files: &'a [Vec<u8>],
        clean: Option<&'a [u8]>,
        boot: Option<&'a str>,
    ) -> Recovered<'a> {
        run_carrying(files, clean, boot, &[])
    }

    fn run_carrying<'a>(
        files: &'a [Vec<u8>],
        clean: Option<&'a [u8]>,
        boot: Option<&'a str>,
        carried_open: &'a [u64],
    ) -> Recovered<'a> {
        recover(&Input {
            segments: files
                .iter()
                .enumerate()
                .map(|(i, b)| SegmentFile {
                    seq: i as u64 + 1,
                    name: format!("{}.seg", i + 1),
                    scan: history_log::scan(b),
                    empty: b.is_empty(),
                })
                .collect(),
            clean,
            boot_id: boot,
            now_unix: NOW,
            limits: LIMITS,
            carried_open,
        })
    }

    fn ids(r: &Recovered<'_>) -> Vec<u64> {
        r.messages.iter().map(|m| m.id).collect()
    }

    #[test]
    fn an_empty_directory_begins_a_new_epoch_at_id_1() {
        let r = run(&[], None, Some("b1"));
        assert_eq!((r.epoch, r.next_id, r.floor), (None, 1, 0));
        assert!(r.reports.is_empty());
    }

    #[test]
    fn a_clean_stop_continues_the_epoch_whatever_the_boot() {
        let files = [seg("e1", "b1", 1..=5), seg("e1", "b1", 6..=9)];
        let c = clean("e1", 10);
        for boot in [Some("b1"), Some("b2"), None] {
            let r = run(&files, Some(&c), boot);
            assert_eq!(r.epoch.as_deref(), Some("e1"));
            assert_eq!((r.next_id, r.floor), (10, 0));
            assert_eq!(ids(&r), (1..=9).collect::<Vec<_>>());
            assert!(r.reports.is_empty(), "{:?}", r.reports);
        }
    }

    #[test]
    fn a_crash_under_the_same_boot_continues_and_a_new_boot_begins_a_new_epoch() {
        let files = [seg("e1", "b1", 1..=5)];
        let r = run(&files, None, Some("b1"));
        assert_eq!((r.epoch.as_deref(), r.next_id), (Some("e1"), 6));
        assert!(r.reports.is_empty());
        for boot in [Some("b2"), None] {
            let r = run(&files, None, boot);
            assert_eq!(r.epoch, None, "writes after the last fsync may be lost");
            assert_eq!(r.next_id, 6, "the sequence still grows past what is held");
            assert_eq!(
                ids(&r),
                vec![1, 2, 3, 4, 5],
                "what is held keeps its own ids"
            );
            assert!(r.reports[0].contains("boot id changed"));
        }
        // A segment written without a boot id never counts as the same boot.
        let no_boot = [seg("e1", "", 1..=2)];
        let r = run(&no_boot, None, Some(""));
        assert_eq!(r.epoch, None);
    }

    #[test]
    fn a_write_cut_short_by_a_crash_is_dropped_and_its_id_may_be_reissued() {
        let mut f = seg("e1", "b1", 1..=5);
        let n = f.len();
        f.truncate(n - 3);
        let files = [f];
        let r = run(&files, None, Some("b1"));
        assert_eq!((r.epoch.as_deref(), r.next_id, r.floor), (Some("e1"), 5, 0));
        assert_eq!(ids(&r), vec![1, 2, 3, 4]);
        assert!(r.reports[0].contains("1.seg"));
    }

    #[test]
    fn a_cut_tail_after_a_clean_stop_is_a_gap_up_to_the_last_id_issued() {
        let mut f = seg("e1", "b1", 1..=5);
        let n = f.len();
        f.truncate(n - 3);
        let files = [f];
        let c = clean("e1", 6);
        let r = run(&files, Some(&c), Some("b1"));
        assert_eq!((r.epoch.as_deref(), r.next_id), (Some("e1"), 6));
        assert_eq!((r.floor, r.damage_floor), (5, 5));
    }

    #[test]
    fn damage_at_the_end_after_a_crash_begins_a_new_epoch() {
        let mut f = seg("e1", "b1", 1..=5);
        let n = f.len();
        f[n - 1] ^= 1;
        let files = [f];
        let r = run(&files, None, Some("b1"));
        assert_eq!(r.epoch, None);
        assert!(r.reports.iter().any(|l| l.contains("checksum")));
    }

    #[test]
    fn damage_inside_the_log_raises_every_floor_to_the_next_intact_id() {
        let mut f = seg("e1", "b1", 1..=8);
        // Flip a byte inside record 4's payload area (records: header, then 1..=8).
        let scan = history_log::scan(&f);
        let (o4, _) = scan.records[4];
        let (o5, _) = scan.records[5];
        f[(o4 + o5) / 2] ^= 0xFF;
        let files = [f, seg("e1", "b1", 9..=10)];
        let r = run(&files, None, Some("b1"));
        assert_eq!(r.epoch.as_deref(), Some("e1"));
        assert_eq!(ids(&r), vec![1, 2, 3, 5, 6, 7, 8, 9, 10]);
        assert_eq!((r.floor, r.damage_floor, r.next_id), (4, 4, 11));
        assert!(r.reports[0].starts_with("1.seg:"), "{:?}", r.reports);
    }

    #[test]
    fn a_missing_segment_is_damage_between_its_neighbours() {
        let files = [
            seg("e1", "b1", 1..=3),
            seg("e1", "b1", 4..=6),
            seg("e1", "b1", 7..=9),
        ];
        let kept = [(1u64, &files[0]), (3, &files[2])];
        let r = recover(&Input {
            segments: kept
                .iter()
                .map(|(seq, b)| SegmentFile {
                    seq: *seq,
                    name: format!("{seq}.seg"),
                    scan: history_log::scan(b),
                    empty: b.is_empty(),
                })
                .collect(),
            clean: None,
            boot_id: Some("b1"),
            now_unix: NOW,
            limits: LIMITS,
            carried_open: &[],
        });
        assert_eq!(r.floor, 6);
        assert!(r.reports[0].contains("missing"));
    }

    #[test]
    fn a_floor_in_a_header_is_carried_over() {
        let mut f = Vec::new();
        encode_header(
            &Header {
                epoch: "e1",
                boot_id: "b1",
                floor: 42,
                synced: false,
            },
            &mut f,
        );
        let files = [f];
        let c = clean("e1", 50);
        let r = run(&files, Some(&c), Some("b1"));
        assert_eq!((r.floor, r.damage_floor, r.next_id), (49, 42, 50));
    }

    #[test]
    fn limits_apply_and_full_topics_get_a_floor() {
        let files = [seg("e1", "b1", 1..=10)];
        let c = clean("e1", 11);
        let mut input = Input {
            segments: vec![SegmentFile {
                seq: 1,
                name: "1.seg".into(),
                scan: history_log::scan(&files[0]),
                empty: false,
            }],
            clean: Some(&c),
            boot_id: Some("b1"),
            now_unix: NOW,
            limits: HistoryLimits {
                per_topic: 3,
                ..LIMITS
            },
            carried_open: &[],
        };
        let r = recover(&input);
        assert_eq!(ids(&r), vec![5, 6, 7, 8, 9, 10]);
        assert_eq!(
            r.topic_floors,
            vec![("even".to_owned(), 5), ("odd".to_owned(), 4)]
        );
        assert_eq!(r.floor, 4);
        // Older than the ttl: nothing is held, and every resume before the end is a gap.
        input.limits = HistoryLimits { ttl: 5, ..LIMITS };
        let r = recover(&input);
        assert!(r.messages.is_empty());
        assert_eq!((r.floor, r.next_id), (10, 11));
    }

    #[test]
    fn a_clean_file_of_another_epoch_is_not_trusted_and_copies_are_held_once() {
        let files = [seg("e1", "b1", 1..=4), seg("e1", "b1", 3..=6)];
        let c = clean("e0", 100);
        let r = run(&files, Some(&c), Some("b2"));
        assert_eq!(r.epoch, None);
        assert_eq!(ids(&r), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(r.next_id, 7);
        assert!(r.reports[0].contains("clean-stop file"));
    }

    #[test]
    fn a_log_synced_before_every_ack_continues_after_a_power_loss() {
        // The same messages under a header that says every record was fsync'd before its ack.
        let plain = seg("e1", "b1", 1..=5);
        let scan = history_log::scan(&plain);
        let mut f = Vec::new();
        encode_header(
            &Header {
                epoch: "e1",
                boot_id: "b1",
                floor: 0,
                synced: true,
            },
            &mut f,
        );
        f.extend_from_slice(&plain[scan.records[1].0..]);
        let n = f.len();
        f[n - 1] ^= 1;
        let files = [f];
        let r = run(&files, None, Some("b2"));
        assert_eq!(r.epoch.as_deref(), Some("e1"), "{:?}", r.reports);
        assert_eq!((r.next_id, r.floor), (5, 0));
        assert_eq!(ids(&r), vec![1, 2, 3, 4]);
    }

    fn frag(id: u64, stream: u64, seq: u32, whole: bool, data: &str, out: &mut Vec<u8>) {
        history_log::encode_stream(
            &StreamRecord {
                id,
                unix_secs: NOW - 10,
                epoch: "e1",
                topic: "ai",
                stream,
                seq,
                whole,
                closed: None,
                data,
            },
            out,
        );
    }

    #[test]
    fn stream_records_fold_into_one_entry_per_stream_at_its_latest_fragment() {
        let mut a = seg("e1", "b1", 1..=2);
        frag(3, 3, 1, false, "He", &mut a);
        frag(4, 3, 2, false, "llo", &mut a);
        // A rewrite of history wrote the whole text; the fragment after it adds to it.
        let mut b = seg("e1", "b1", 5..=5);
        frag(4, 3, 2, true, "Hello", &mut b);
        frag(6, 3, 3, false, "!", &mut b);
        // A stream whose second fragment was lost is left out.
        frag(7, 7, 1, false, "a", &mut b);
        frag(9, 7, 3, false, "c", &mut b);
        let files = [a, b];
        let r = run(&files, None, Some("b1"));
        assert_eq!(ids(&r), vec![1, 2, 5]);
        assert_eq!(r.streams.len(), 1, "{:?}", r.streams);
        let f = &r.streams[0];
        assert_eq!((f.id, f.stream, f.seq, &*f.text), (6, 3, 3, "Hello!"));
        assert_eq!(f.closed, Some(CloseReason::Restart));
        assert_eq!(r.next_id, 10);
        assert!(
            r.reports.iter().any(|l| l.contains("e1-7")),
            "{:?}",
            r.reports
        );
    }

    #[test]
    fn a_stream_a_hand_over_carries_open_stays_open_and_the_others_are_closed_by_the_restart() {
        let mut a = seg("e1", "b1", 1..=1);
        frag(2, 2, 1, false, "carried", &mut a);
        frag(3, 3, 1, false, "left", &mut a);
        frag(4, 2, 2, false, " on", &mut a);
        let c = clean("e1", 5);
        let files = [a];
        let r = run_carrying(&files, Some(&c), Some("b1"), &[2]);
        let got: Vec<_> = r
            .streams
            .iter()
            .map(|f| (f.stream, f.seq, &*f.text, f.closed))
            .collect();
        assert_eq!(
            got,
            vec![
                (3, 1, "left", Some(CloseReason::Restart)),
                (2, 2, "carried on", None),
            ]
        );
        // A new epoch is not the one the hand-over's ids are in: nothing stays open.
        let r = run_carrying(&files, None, Some("b2"), &[2]);
        assert_eq!(r.epoch, None);
        assert!(r
            .streams
            .iter()
            .all(|f| f.closed == Some(CloseReason::Restart)));
    }
}
