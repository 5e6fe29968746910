//! Per-topic publish debouncing (`max_rate`): at most one delivery round per interval for a
//! topic, the latest message per key winning in between. Pure: the server owns one per
//! debounced topic and node, offers it every publication with the time
//! ([`Debounce::offer`]), and flushes it when [`Debounce::due`] says
//! ([`Debounce::flush`]); no clock, no socket here.
//!
//! **Rule.** A message offered when the topic's interval has elapsed since its last delivery
//! round goes out at once and starts a new interval. Any other is held: one held message per
//! key (a message without a key is the topic's one unkeyed slot), a newer one of the same key
//! replacing the held one and counting it as skipped. At the interval's end the held messages
//! go out together, in publish order, each with the number it replaced, and a new interval
//! starts. So a key is delivered at most once per interval, its latest value at most one
//! interval after it was published, and nothing is held forever.
//!
//! **Bound.** At most `max_keys` messages are held; a message with a key not held once that
//! many are goes out at once (memory stays bounded, the rate is exceeded for it alone).

use std::collections::HashMap;

/// What [`Debounce::offer`] did with a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer<M> {
    /// Deliver it now (handed back): the interval had elapsed, or the held keys are full.
    Now(M),
    /// Held until the interval ends.
    Held,
    /// Held in place of an older one of its key (which is dropped: skipped).
    Replaced,
}

struct Held<M> {
    message: M,
    /// Order of the held message among the offers (publish order).
    seq: u64,
    /// Messages it replaced.
    skipped: u64,
}

/// One topic's debouncing state. See the module documentation for the rule.
pub struct Debounce<M> {
    interval_ms: u64,
    max_keys: usize,
    /// When the next delivery round may start (`None`: at once).
    next_at: Option<u64>,
    held: HashMap<Option<String>, Held<M>>,
    seq: u64,
}

impl<M> Debounce<M> {
    /// A topic delivered at most `max_rate` times per second (at least 1), holding at most
    /// `max_keys` messages.
    pub fn new(max_rate: u32, max_keys: usize) -> Debounce<M> {
        Debounce {
            interval_ms: 1000 / u64::from(max_rate.max(1)).min(1000),
            max_keys: max_keys.max(1),
            next_at: None,
            held: HashMap::new(),
            seq: 0,
        }
    }

    /// The interval between delivery rounds, in milliseconds.
    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    /// Messages held.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Offers a publication with its key at `now_ms`.
    pub fn offer(&mut self, now_ms: u64, key: Option<String>, message: M) -> Offer<M> {
        if self.held.is_empty() && self.next_at.is_none_or(|t| now_ms >= t) {
            self.next_at = Some(now_ms.saturating_add(self.interval_ms));
            return Offer::Now(message);
        }
        self.seq += 1;
        let seq = self.seq;
        if let Some(h) = self.held.get_mut(&key) {
            h.message = message;
            h.seq = seq;
            h.skipped += 1;
            return Offer::Replaced;
        }
        if self.held.len() >= self.max_keys {
            return Offer::Now(message);
        }
        self.held.insert(
            key,
            Held {
                message,
                seq,
                skipped: 0,
            },
        );
        Offer::Held
    }

    /// Whether a delivery round was allowed within `window_ms` before `now_ms` (an idle topic's
    /// state may be dropped: a fresh one behaves the same).
    pub fn recent(&self, now_ms: u64, window_ms: u64) -> bool {
        self.next_at
            .is_some_and(|t| now_ms < t.saturating_add(window_ms))
    }

    /// When the held messages are due (`None`: nothing held).
    pub fn due(&self) -> Option<u64> {
        if self.held.is_empty() {
            return None;
        }
        Some(self.next_at.unwrap_or(0))
    }

    /// At `now_ms`, once due: the held messages in publish order, each with the number it
    /// replaced; a new interval starts. Before then, nothing.
    pub fn flush(&mut self, now_ms: u64) -> Vec<(M, u64)> {
        if self.due().is_none_or(|t| now_ms < t) {
            return Vec::new();
        }
        let mut out: Vec<Held<M>> = self.held.drain().map(|(_, h)| h).collect();
        out.sort_unstable_by_key(|h| h.seq);
        self.next_at = Some(now_ms.saturating_add(self.interval_ms));
        out.into_iter().map(|h| (h.message, h.skipped)).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    #[test]
    fn one_round_per_interval_and_the_latest_per_key_at_its_end() {
        let mut d = Debounce::new(10, 100);
        assert_eq!(d.interval_ms(), 100);
        assert_eq!(d.offer(0, Some("a".into()), 1), Offer::Now(1));
        assert_eq!(d.offer(10, Some("a".into()), 2), Offer::Held);
        assert_eq!(d.offer(20, Some("b".into()), 3), Offer::Held);
        assert_eq!(d.offer(30, Some("a".into()), 4), Offer::Replaced);
        assert_eq!(d.offer(40, Some("a".into()), 5), Offer::Replaced);
        assert_eq!(d.due(), Some(100));
        assert!(d.flush(99).is_empty());
        assert_eq!(d.flush(100), vec![(3, 0), (5, 2)]);
        // The round just made starts an interval: the next message waits for its end.
        assert_eq!(d.offer(150, None, 6), Offer::Held);
        assert_eq!(d.offer(160, None, 7), Offer::Replaced);
        assert_eq!(d.flush(200), vec![(7, 1)]);
        assert_eq!(d.due(), None);
        assert_eq!(d.offer(300, None, 8), Offer::Now(8));
    }

    #[test]
    fn held_keys_are_bounded_and_a_new_key_past_the_bound_goes_at_once() {
        let mut d = Debounce::new(1, 2);
        assert_eq!(d.offer(0, Some("x".into()), 0), Offer::Now(0));
        assert_eq!(d.offer(1, Some("a".into()), 1), Offer::Held);
        assert_eq!(d.offer(1, Some("b".into()), 2), Offer::Held);
        assert_eq!(d.offer(1, Some("c".into()), 3), Offer::Now(3));
        assert_eq!(d.offer(1, Some("b".into()), 4), Offer::Replaced);
        assert_eq!(d.held(), 2);
    }

    /// splitmix64, so a failure repeats with its seed.
    #[test]
    fn every_message_is_delivered_or_skipped_once_at_the_rate_and_the_latest_arrives() {
        let mut rng = Rng(52);
        for case in 0..200 {
            let rate = 1 + rng.below(50) as u32;
            let keys = 1 + rng.below(6) as u32;
            let mut d: Debounce<(u32, u32)> = Debounce::new(rate, 100);
            let (mut now, mut published) = (0u64, vec![0u32; keys as usize]);
            let (mut rounds, mut delivered, mut skipped): (Vec<u64>, Vec<(u32, u32)>, u64) =
                (Vec::new(), Vec::new(), 0);
            for _ in 0..rng.below(300) {
                now += rng.below(30) as u64;
                let out = d.flush(now);
                if !out.is_empty() {
                    rounds.push(now);
                }
                for (m, s) in out {
                    delivered.push(m);
                    skipped += s;
                }
                let k = rng.below(keys as usize) as u32;
                published[k as usize] += 1;
                let m = (k, published[k as usize]);
                match d.offer(now, Some(k.to_string()), m) {
                    Offer::Now(m) => {
                        rounds.push(now);
                        delivered.push(m);
                    }
                    Offer::Held | Offer::Replaced => {}
                }
            }
            now += 10_000;
            for (m, s) in d.flush(now) {
                delivered.push(m);
                skipped += s;
            }
            let total: u64 = published.iter().map(|&n| u64::from(n)).sum();
            assert_eq!(delivered.len() as u64 + skipped, total, "case {case}");
            rounds.dedup();
            assert!(
                rounds.windows(2).all(|w| w[1] - w[0] >= d.interval_ms()),
                "case {case}: rounds at most once per interval"
            );
            for k in 0..keys {
                let mine: Vec<u32> = delivered.iter().filter(|m| m.0 == k).map(|m| m.1).collect();
                assert!(
                    mine.windows(2).all(|w| w[0] < w[1]),
                    "case {case}: in order"
                );
                if published[k as usize] > 0 {
                    assert_eq!(mine.last(), Some(&published[k as usize]), "case {case}");
                }
            }
        }
    }
}
