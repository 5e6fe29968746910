//! Checking deliveries: every message a connection should receive arrives once, in order.
//!
//! The publisher numbers the messages of each topic 0, 1, 2, ... A [`SeqChecker`] per connection
//! compares what arrives with what it expects next, so losses, duplicates and reordering are
//! counted exactly, not inferred from totals.

/// Delivery verdicts of one connection (or the sum over many).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    /// Messages received in order.
    pub in_order: u64,
    /// Messages never received.
    pub missing: u64,
    /// Messages received more than once.
    pub duplicated: u64,
    /// Messages received after a later one.
    pub reordered: u64,
}

impl Verdict {
    /// Adds another verdict (summing connections).
    pub fn add(&mut self, o: &Verdict) {
        self.in_order += o.in_order;
        self.missing += o.missing;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
    }

    /// Whether every expected message arrived exactly once, in order.
    pub fn perfect(&self) -> bool {
        self.missing == 0 && self.duplicated == 0 && self.reordered == 0
    }
}

/// What one arrival was, against the messages before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The next message expected.
    InOrder,
    /// A later message than expected: this many before it are missing for now (they may
    /// still arrive, out of order).
    AfterGap(u64),
    /// A message skipped over earlier, arriving late.
    Reordered,
    /// A message already received.
    Duplicate,
}

/// Tracks the sequence numbers one connection receives.
#[derive(Debug, Default, Clone)]
pub struct SeqChecker {
    /// The next sequence number expected.
    next: u64,
    /// Numbers skipped over (possibly arriving late), kept sorted; usually empty.
    gaps: Vec<u64>,
    v: Verdict,
}

impl SeqChecker {
    /// Records the arrival of message `seq`.
    pub fn see(&mut self, seq: u64) -> Seen {
        if seq == self.next {
            self.next += 1;
            self.v.in_order += 1;
            Seen::InOrder
        } else if seq > self.next {
            // Everything between is missing for now; it may still arrive out of order.
            let skipped = seq - self.next;
            if skipped <= 4096 {
                self.gaps.extend(self.next..seq);
            } else {
                self.v.missing += skipped;
            }
            self.next = seq + 1;
            self.v.in_order += 1;
            Seen::AfterGap(skipped)
        } else if let Ok(i) = self.gaps.binary_search(&seq) {
            self.gaps.remove(i);
            self.v.reordered += 1;
            Seen::Reordered
        } else {
            self.v.duplicated += 1;
            Seen::Duplicate
        }
    }

    /// Messages received so far (each counted once).
    pub fn received(&self) -> u64 {
        self.v.in_order + self.v.reordered
    }

    /// The verdict once `expected` messages were published to this connection's topic.
    pub fn finish(&self, expected: u64) -> Verdict {
        let mut v = self.v;
        v.missing += self.gaps.len() as u64 + expected.saturating_sub(self.next);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: &[u64], expected: u64) -> Verdict {
        let mut c = SeqChecker::default();
        for &s in seqs {
            c.see(s);
        }
        c.finish(expected)
    }

    #[test]
    fn perfect_stream() {
        let v = run(&[0, 1, 2, 3], 4);
        assert!(v.perfect());
        assert_eq!(v.in_order, 4);
    }

    #[test]
    fn losses_in_the_middle_and_at_the_end() {
        let v = run(&[0, 1, 4, 5], 8);
        assert_eq!((v.missing, v.duplicated, v.reordered), (4, 0, 0));
    }

    #[test]
    fn duplicates_and_reordering_are_told_apart() {
        let v = run(&[0, 2, 1, 2, 3, 3], 4);
        assert_eq!((v.missing, v.duplicated, v.reordered), (0, 2, 1));
        assert!(!v.perfect());
    }

    #[test]
    fn each_arrival_says_what_it_was() {
        let mut c = SeqChecker::default();
        let seen: Vec<Seen> = [0, 3, 1, 1, 4].iter().map(|&s| c.see(s)).collect();
        assert_eq!(
            seen,
            [
                Seen::InOrder,
                Seen::AfterGap(2),
                Seen::Reordered,
                Seen::Duplicate,
                Seen::InOrder
            ]
        );
    }

    #[test]
    fn nothing_received() {
        assert_eq!(run(&[], 5).missing, 5);
    }

    #[test]
    fn huge_jumps_do_not_allocate_per_missing_message() {
        let v = run(&[0, 1_000_000], 1_000_001);
        assert_eq!(v.missing, 999_999);
    }
}
