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

use clarion_proto::history_log::{self, Damage, Message, Record, RecordError};

use crate::config::HistoryLimits;

/// One segment file.
pub struct SegmentFile<'a> {
    /// Its number (segments are written in increasing numbers).
    pub seq: u64,
    /// Its name, for reports.
    pub name: String,
    /// Its whole contents.
    pub bytes: &'a [u8],
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
    /// Every topic (and any topic created later) may have lost messages with ids up to this.
    pub floor: u64,
    /// The part of `floor` due to damage, written into new segment headers.
    pub damage_floor: u64,
    /// Topics whose history is full: messages before their first held one were trimmed.
    pub topic_floors: Vec<(String, u64)>,
    /// What was wrong, one line per problem, naming the file.
    pub reports: Vec<String>,
}

/// One step of the log in file order.
enum Entry<'a> {
    Message(Message<'a>),
    /// Records lost here; `cut` when the log simply ends inside its last record.
    Lost { cut: bool },
}

/// Recovers the history a directory's files hold.
pub fn recover<'a>(input: &Input<'a>) -> Recovered<'a> {
    let mut out = Recovered::default();
    let mut entries: Vec<Entry<'a>> = Vec::new();
    let mut last_header: Option<(&'a str, &'a str)> = None;
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
        let scan = history_log::scan(seg.bytes);
        let mut header = None;
        if let Some(d) = scan.damage.first().filter(|d| d.offset == 0) {
            // Damage before the first intact record.
            report(&mut out.reports, &seg.name, d);
            entries.push(Entry::Lost { cut: false });
        }
        for (n, (_, r)) in scan.records.iter().enumerate() {
            match r {
                Record::Header(h) if n == 0 => {
                    header = Some((h.epoch, h.boot_id));
                    out.damage_floor = out.damage_floor.max(h.floor);
                }
                Record::Message(m) => entries.push(Entry::Message(*m)),
                _ => {}
            }
            if let Some(d) = scan.damage.iter().find(|d| at_end_of(d, &scan.records, n)) {
                report(&mut out.reports, &seg.name, d);
                entries.push(Entry::Lost { cut: false });
            }
        }
        if header.is_none() && !seg.bytes.is_empty() {
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

    let max_id = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Message(m) => Some(m.id),
            Entry::Lost { .. } => None,
        })
        .max()
        .unwrap_or(0);
    let clean = input
        .clean
        .and_then(|b| history_log::decode(b).ok())
        .and_then(|(r, _)| match r {
            Record::Clean(c) => Some(c),
            _ => None,
        })
        .filter(|c| last_header.is_some_and(|(e, _)| e == c.epoch));
    if input.clean.is_some() && clean.is_none() {
        out.reports.push(
            "the clean-stop file does not match the log: treating the stop as unclean".into(),
        );
    }
    let ends_in_damage = matches!(entries.last(), Some(Entry::Lost { cut: false }));
    out.next_id = max_id + 1;
    // The id after the last one that may have been issued (known only when continuing).
    let mut end = None;
    match (last_header, clean) {
        (Some((epoch, _)), Some(c)) => {
            out.epoch = Some(epoch.to_owned());
            out.next_id = out.next_id.max(c.next_id);
            end = Some(c.next_id.max(max_id + 1));
        }
        (Some((epoch, boot)), None) => {
            let same_boot = !boot.is_empty() && input.boot_id == Some(boot);
            if !same_boot {
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
            Entry::Message(m) => before = before.max(m.id),
            Entry::Lost { cut } => {
                let after = entries
                    .get(i + 1..)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|e| match e {
                        Entry::Message(m) if m.id > before => Some(m.id),
                        _ => None,
                    })
                    .min();
                let lost_to = match (after, end) {
                    (Some(a), _) => a - 1,
                    // A cut at the end after an unclean stop lost nothing acknowledged.
                    (None, _) if *cut && clean.is_none() => continue,
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
    let mut msgs: Vec<Message<'a>> = entries
        .into_iter()
        .filter_map(|e| match e {
            Entry::Message(m) => Some(m),
            Entry::Lost { .. } => None,
        })
        .filter(|m| seen.insert(m.id))
        .filter(|m| u64::from(input.limits.ttl) > input.now_unix.saturating_sub(m.unix_secs))
        .collect();
    msgs.sort_unstable_by_key(|m| m.id);
    let mut per_topic: HashMap<&str, usize> = HashMap::new();
    for m in &msgs {
        *per_topic.entry(m.topic).or_default() += 1;
    }
    let mut skip: HashMap<&str, usize> = per_topic
        .iter()
        .map(|(t, n)| (*t, n.saturating_sub(input.limits.per_topic)))
        .collect();
    msgs.retain(|m| match skip.get_mut(m.topic) {
        Some(n) if *n > 0 => {
            *n -= 1;
            false
        }
        _ => true,
    });
    let mut firsts: HashMap<&str, u64> = HashMap::new();
    for m in &msgs {
        firsts.entry(m.topic).or_insert(m.id);
    }
    out.topic_floors = firsts
        .into_iter()
        .filter(|(t, _)| per_topic.get(t).is_some_and(|n| *n >= input.limits.per_topic))
        .map(|(t, first)| (t.to_owned(), first - 1))
        .collect();
    out.topic_floors.sort();
    // Ids below the oldest held message were trimmed (or never existed): any topic may miss them.
    let oldest = msgs.first().map_or(out.next_id, |m| m.id);
    out.floor = (oldest - 1).max(out.damage_floor);
    out.messages = msgs;
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
