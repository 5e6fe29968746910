//! Checking one logical client of the soak across its reconnects: every message of its topic,
//! from the first it received to the last published, arrives once and in order, whichever TCP
//! connection carried it, except the messages a gap notice announced.
//!
//! The publisher numbers each topic's messages 0, 1, 2, ... in its payloads (the server's ids
//! are not consecutive per topic, and change epoch when Redis restarts, so they cannot say what
//! is missing). A client resumes with its last id; a [`ResumeCheck`] sees the payload numbers
//! of every connection in turn. A number skipped right after a gap notice is *announced* (the
//! server said it could not replay it) and counted apart; any other number skipped is a hole,
//! kept (up to [`MAX_HOLES`]) so the coordinator can set aside the publishes that were never
//! confirmed (an API call that failed may or may not have reached Redis) before calling the
//! rest lost. Nothing here reads a clock or touches a socket.

use serde::{Deserialize, Serialize};

/// Holes kept per client; more are only counted (a client missing that many has a problem no
/// list will explain).
pub const MAX_HOLES: usize = 256;

/// What a client's deliveries came to (or the sum over many clients).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakCounts {
    /// Messages received once, in their place (in order, or a hole filled late: see
    /// `reordered`).
    pub delivered: u64,
    /// Messages received again.
    pub duplicated: u64,
    /// Messages received after a later one.
    pub reordered: u64,
    /// Messages skipped right after a gap notice: the server announced it could not replay
    /// them.
    pub announced: u64,
    /// Gap notices received.
    pub gap_notices: u64,
    /// Holes not kept in the list (past [`MAX_HOLES`] for one client): lost, whatever the
    /// publisher knows.
    pub holes_unlisted: u64,
}

impl SoakCounts {
    /// Adds another client's counts.
    pub fn add(&mut self, o: &SoakCounts) {
        self.delivered += o.delivered;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
        self.announced += o.announced;
        self.gap_notices += o.gap_notices;
        self.holes_unlisted += o.holes_unlisted;
    }
}

/// What one arrival was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The first message of this client, or the next expected.
    InOrder,
    /// A later message than expected, right after a gap notice: this many were announced.
    AfterAnnouncedGap(u64),
    /// A later message than expected with no gap notice: this many are holes (for now).
    AfterHole(u64),
    /// A hole filled late.
    Reordered,
    /// A message already received.
    Duplicate,
}

/// The continuity check of one logical client, across all its connections.
#[derive(Debug, Default, Clone)]
pub struct ResumeCheck {
    /// The next payload number expected; `None` before the first message.
    next: Option<u64>,
    /// A gap notice arrived and no message since: the next skip is announced.
    gap_pending: bool,
    /// Numbers skipped without a notice, sorted (they may still arrive, late).
    holes: Vec<u64>,
    counts: SoakCounts,
}

impl ResumeCheck {
    /// A gap notice arrived (on any connection of this client).
    pub fn gap_notice(&mut self) {
        self.counts.gap_notices += 1;
        self.gap_pending = true;
    }

    /// Message `seq` arrived.
    pub fn see(&mut self, seq: u64) -> Arrival {
        let Some(next) = self.next else {
            self.next = Some(seq + 1);
            self.gap_pending = false;
            self.counts.delivered += 1;
            return Arrival::InOrder;
        };
        if seq >= next {
            self.next = Some(seq + 1);
            self.counts.delivered += 1;
            let skipped = seq - next;
            let announced = std::mem::take(&mut self.gap_pending);
            if skipped == 0 {
                Arrival::InOrder
            } else if announced {
                self.counts.announced += skipped;
                Arrival::AfterAnnouncedGap(skipped)
            } else {
                self.hole(next..seq);
                Arrival::AfterHole(skipped)
            }
        } else if let Ok(i) = self.holes.binary_search(&seq) {
            self.holes.remove(i);
            self.counts.delivered += 1;
            self.counts.reordered += 1;
            Arrival::Reordered
        } else {
            self.counts.duplicated += 1;
            Arrival::Duplicate
        }
    }

    /// Whether every message up to `last` (a topic's last confirmed publish) has arrived, or
    /// the client never received any (it has nothing to wait for).
    pub fn caught_up(&self, last: u64) -> bool {
        self.next.is_none_or(|n| n > last)
    }

    /// Gap notices received so far.
    pub fn gap_notices(&self) -> u64 {
        self.counts.gap_notices
    }

    /// Whether the client received anything.
    pub fn started(&self) -> bool {
        self.next.is_some()
    }

    /// The end of the run: `last` is the topic's last publish attempted (`None`: none). The
    /// numbers after the last received are holes too (announced if a gap notice came last).
    /// Returns the counts and the holes, sorted.
    pub fn finish(mut self, last: Option<u64>) -> (SoakCounts, Vec<u64>) {
        if let (Some(next), Some(last)) = (self.next, last) {
            if last >= next {
                if self.gap_pending {
                    self.counts.announced += last + 1 - next;
                } else {
                    self.hole(next..last + 1);
                }
            }
        }
        (self.counts, self.holes)
    }

    fn hole(&mut self, range: std::ops::Range<u64>) {
        let room = MAX_HOLES.saturating_sub(self.holes.len()) as u64;
        let n = range.end - range.start;
        let kept = n.min(room);
        self.holes.extend(range.start..range.start + kept);
        self.counts.holes_unlisted += n - kept;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[Option<u64>], last: Option<u64>) -> (SoakCounts, Vec<u64>) {
        let mut c = ResumeCheck::default();
        for e in events {
            match e {
                Some(seq) => {
                    c.see(*seq);
                }
                None => c.gap_notice(),
            }
        }
        c.finish(last)
    }

    #[test]
    fn a_client_may_start_anywhere_and_must_then_see_everything() {
        let (c, holes) = run(&[Some(7), Some(8), Some(9)], Some(9));
        assert_eq!(c.delivered, 3);
        assert!(holes.is_empty());
        assert_eq!((c.duplicated, c.reordered, c.announced), (0, 0, 0));
        // Nothing received: nothing expected.
        let (c, holes) = run(&[], Some(9));
        assert_eq!((c.delivered, holes.len()), (0, 0));
    }

    #[test]
    fn holes_are_listed_and_the_tail_counts() {
        let (c, holes) = run(&[Some(0), Some(3), Some(4)], Some(6));
        assert_eq!(holes, [1, 2, 5, 6]);
        assert_eq!(c.delivered, 3);
    }

    #[test]
    fn a_gap_notice_announces_the_next_skip_only() {
        let (c, holes) = run(&[Some(0), None, Some(5), Some(7)], Some(7));
        assert_eq!((c.announced, c.gap_notices), (4, 1));
        assert_eq!(holes, [6]);
        // A notice with nothing skipped announces nothing and does not carry over.
        let (c, holes) = run(&[Some(0), None, Some(1), Some(3)], Some(3));
        assert_eq!(c.announced, 0);
        assert_eq!(holes, [2]);
        // A notice at the very end announces the tail.
        let (c, holes) = run(&[Some(0), None], Some(3));
        assert_eq!((c.announced, holes.len()), (3, 0));
    }

    #[test]
    fn duplicates_and_late_arrivals_are_told_apart() {
        let mut c = ResumeCheck::default();
        let seen: Vec<Arrival> = [0, 2, 1, 1, 2, 3].iter().map(|&s| c.see(s)).collect();
        assert_eq!(
            seen,
            [
                Arrival::InOrder,
                Arrival::AfterHole(1),
                Arrival::Reordered,
                Arrival::Duplicate,
                Arrival::Duplicate,
                Arrival::InOrder
            ]
        );
        let (counts, holes) = c.finish(Some(3));
        assert_eq!((counts.duplicated, counts.reordered), (2, 1));
        assert!(holes.is_empty());
    }

    #[test]
    fn caught_up_waits_for_the_last_confirmed() {
        let mut c = ResumeCheck::default();
        assert!(c.caught_up(5));
        c.see(3);
        assert!(!c.caught_up(5));
        c.see(4);
        c.see(5);
        assert!(c.caught_up(5));
    }

    #[test]
    fn a_huge_hole_is_counted_not_listed() {
        let (c, holes) = run(&[Some(0), Some(1_000_000)], None);
        assert_eq!(holes.len(), MAX_HOLES);
        assert_eq!(c.holes_unlisted, 999_999 - MAX_HOLES as u64);
    }
}
