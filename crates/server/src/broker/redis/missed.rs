//! What a resuming subscriber missed on one topic, sans-IO: which entry of the ids it sent
//! applies to the topic, what to read from the topic's stream, and what the read means. The
//! caller ([`super::resume`]) does the reading; nothing here touches Redis, a lock or a clock.
//!
//! The rule (`docs/cluster.md`, "Resume"): an id of the topic's current epoch replays what came
//! after it, up to the position the subscriber was counted at; an id of another epoch, or one
//! not issued yet, replays everything held with an `epoch` gap notice; what the stream no
//! longer holds is a `trimmed` gap notice. An id `…-0` asks for the topic from its start.

use clarion_proto::event_id::{self, EventId};

use crate::message::GapReason;

/// The entries of a resume's ids: `EPOCH-SEQ` or `topic:EPOCH-SEQ` each, comma-separated
/// (ids hold no colon); entries that are not ids are left out.
pub(super) fn entries(given: &str) -> Vec<(Option<&str>, EventId<'_>)> {
    given
        .split(',')
        .filter_map(|s| {
            let s = s.trim();
            match s.rsplit_once(':') {
                Some((t, id)) => Some((Some(t), event_id::parse(id).ok()?)),
                None => Some((None, event_id::parse(s).ok()?)),
            }
        })
        .collect()
}

/// The entry for topic `name` whose current epoch is `epoch`: the one named for it, else the
/// unnamed id of its epoch, else an unnamed id from the very start (`…-0`).
pub(super) fn entry_for<'a>(
    ids: &[(Option<&str>, EventId<'a>)],
    name: &str,
    epoch: Option<&str>,
) -> Option<EventId<'a>> {
    let named = ids.iter().find(|(t, _)| *t == Some(name)).map(|(_, i)| *i);
    named.or_else(|| {
        let plain = || ids.iter().filter(|(t, _)| t.is_none()).map(|(_, i)| *i);
        plain()
            .find(|i| Some(i.epoch) == epoch)
            .or_else(|| plain().find(|i| i.seq == 0))
    })
}

/// What to do for one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// Nothing was missed.
    Nothing,
    /// Nothing to read, but a gap notice to give.
    Gap(GapReason),
    /// Read offsets `from..=to` of the current epoch; `gap` is a notice owed whatever the
    /// read finds.
    Read {
        from: u64,
        to: u64,
        gap: Option<GapReason>,
    },
}

/// The plan for a topic at `epoch-last` (the position the subscriber was counted at; `None`:
/// nothing published in Redis's present history), resuming from `mine`.
pub(super) fn plan(mine: Option<EventId<'_>>, epoch: Option<&str>, last: u64) -> Plan {
    let Some(epoch) = epoch else {
        // From the very start there is nothing to miss; from anything else there is.
        return if mine.is_none_or(|i| i.seq != 0) {
            Plan::Gap(GapReason::Epoch)
        } else {
            Plan::Nothing
        };
    };
    let after = mine.and_then(|i| (i.epoch == epoch || i.seq == 0).then_some(i.seq));
    let (gap, after) = match after {
        Some(seq) if seq <= last => (None, seq),
        // Another epoch, or an id not issued yet: everything held, with a notice.
        _ => (Some(GapReason::Epoch), 0),
    };
    if after == last {
        return gap.map_or(Plan::Nothing, Plan::Gap);
    }
    Plan::Read {
        from: after + 1,
        to: last,
        gap,
    }
}

/// What a read of `Plan::Read { from, to, gap }` of `epoch` means: the gap notice to give, and
/// whether the messages read are replayed. `now` is the epoch Redis held at the read, `count`
/// how many entries were read and `holes` how many offsets of the range an appendable
/// message's folded entry left when it moved on (removed, not lost: its text is in the later
/// entry). The range is whole when every offset is an entry or such a hole; trimming removes
/// entries, never holes, so any trimmed offset makes it short.
pub(super) fn judge(
    plan_gap: Option<GapReason>,
    epoch: &str,
    now: Option<&str>,
    (from, to): (u64, u64),
    count: usize,
    holes: u64,
) -> (Option<GapReason>, bool) {
    let same = now == Some(epoch);
    let complete = same && count as u64 + holes == to - from + 1;
    let gap = match plan_gap {
        Some(r) => Some(r),
        None if !complete => Some(GapReason::Trimmed),
        None => None,
    };
    (gap, same)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(epoch: &str, seq: u64) -> EventId<'_> {
        EventId { epoch, seq }
    }

    #[test]
    fn an_id_of_the_current_epoch_reads_what_came_after_it() {
        assert_eq!(
            plan(Some(id("e", 3)), Some("e"), 7),
            Plan::Read {
                from: 4,
                to: 7,
                gap: None
            }
        );
        assert_eq!(plan(Some(id("e", 7)), Some("e"), 7), Plan::Nothing);
    }

    #[test]
    fn another_epoch_or_an_id_not_issued_yet_reads_everything_with_an_epoch_gap() {
        let all = Plan::Read {
            from: 1,
            to: 7,
            gap: Some(GapReason::Epoch),
        };
        assert_eq!(plan(Some(id("old", 3)), Some("e"), 7), all);
        assert_eq!(plan(Some(id("e", 9)), Some("e"), 7), all);
        assert_eq!(plan(None, Some("e"), 7), all);
        assert_eq!(
            plan(Some(id("old", 3)), Some("e"), 0),
            Plan::Gap(GapReason::Epoch)
        );
    }

    #[test]
    fn from_the_very_start_reads_everything_without_a_gap() {
        assert_eq!(
            plan(Some(id("any", 0)), Some("e"), 2),
            Plan::Read {
                from: 1,
                to: 2,
                gap: None
            }
        );
        assert_eq!(plan(Some(id("any", 0)), None, 0), Plan::Nothing);
        assert_eq!(plan(Some(id("e", 4)), None, 0), Plan::Gap(GapReason::Epoch));
    }

    #[test]
    fn a_read_short_of_the_range_or_of_another_epoch_is_a_trimmed_gap() {
        assert_eq!(judge(None, "e", Some("e"), (4, 7), 4, 0), (None, true));
        assert_eq!(
            judge(None, "e", Some("e"), (4, 7), 2, 0),
            (Some(GapReason::Trimmed), true)
        );
        assert_eq!(
            judge(None, "e", Some("f"), (4, 7), 4, 0),
            (Some(GapReason::Trimmed), false)
        );
        assert_eq!(
            judge(Some(GapReason::Epoch), "e", Some("e"), (1, 7), 5, 0),
            (Some(GapReason::Epoch), true)
        );
        // An appendable message's moved entries are holes, not trimmed offsets.
        assert_eq!(judge(None, "e", Some("e"), (4, 7), 2, 2), (None, true));
        assert_eq!(
            judge(None, "e", Some("e"), (4, 7), 1, 2),
            (Some(GapReason::Trimmed), true)
        );
    }

    #[test]
    fn the_entry_named_for_a_topic_wins_then_its_epoch_then_the_start() {
        let ids = entries("a:e1-3, e2-5 ,x-0,not an id");
        assert_eq!(ids.len(), 3);
        assert_eq!(entry_for(&ids, "a", Some("e2")), Some(id("e1", 3)));
        assert_eq!(entry_for(&ids, "b", Some("e2")), Some(id("e2", 5)));
        assert_eq!(entry_for(&ids, "c", Some("e9")), Some(id("x", 0)));
        assert_eq!(entry_for(&entries("e2-5"), "c", Some("e9")), None);
    }
}
