//! Idempotency keys for the brokers that remember them in the process (the in-memory broker,
//! and so each NATS node): which messages of a publish repeat a key seen within
//! `idempotency_window` and must not be published again. The table and its rules are
//! [`clarion_proto::pubsub::idempotency`]'s; this module reads the clock for it and applies it
//! to a publish call. The Redis broker keeps the same promise inside its publish script.

use std::collections::HashMap;
use std::time::Instant;

use clarion_proto::pubsub::{Claim, Recorded, Remembered};

use super::{Outgoing, Receipt};
use crate::config::IdempotencyLimits;

/// What to do with one message of a publish call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Plan {
    /// Publish it (it has no key, or a key not seen within the window).
    Publish,
    /// Its key was published with this id: answer it, publish nothing.
    Repeat(String),
    /// Its key is that of an earlier message of the same call (at this index): answer that
    /// one's id, publish nothing.
    RepeatOf(usize),
}

/// The keys one process remembers (kept under its broker's lock, so a key is claimed and
/// published in one step).
pub(super) struct Repeats {
    table: Remembered,
    on: bool,
}

impl Repeats {
    pub(super) fn new(limits: IdempotencyLimits) -> Repeats {
        Repeats {
            table: Remembered::new(limits.window, limits.keys),
            on: !limits.window.is_zero(),
        }
    }

    /// The plan for `msgs`, or `None` when none carries a key (nothing to remember, no clock
    /// read).
    pub(super) fn plan(&mut self, msgs: &[Outgoing<'_>]) -> Option<(Instant, Vec<Plan>)> {
        if !self.on || msgs.iter().all(|m| m.key.is_none()) {
            return None;
        }
        let now = Instant::now();
        let mut first: HashMap<(&str, &str), usize> = HashMap::new();
        let mut plan = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.iter().enumerate() {
            let Some(key) = m.key else {
                plan.push(Plan::Publish);
                continue;
            };
            if let Some(&j) = first.get(&(m.topic, key)) {
                plan.push(Plan::RepeatOf(j));
                continue;
            }
            match self.table.claim(now, m.topic, key) {
                Claim::Fresh => {
                    first.insert((m.topic, key), i);
                    plan.push(Plan::Publish);
                }
                // A fragment's record answers a message with its id.
                Claim::Repeat(line) => plan.push(Plan::Repeat(Recorded::parse(&line).id)),
            }
        }
        Some((now, plan))
    }

    /// One appendable-message fragment's key (`None`: no key, or keys are off): the time of
    /// the claim and the first fragment's record when it repeats one seen within the window.
    pub(super) fn claim_fragment(
        &mut self,
        topic: &str,
        key: Option<&str>,
    ) -> Option<(Instant, Option<Recorded>)> {
        let key = key.filter(|_| self.on)?;
        let now = Instant::now();
        match self.table.claim(now, topic, key) {
            Claim::Fresh => Some((now, None)),
            Claim::Repeat(line) => Some((now, Some(Recorded::parse(&line)))),
        }
    }

    /// Remembers a fragment published with `key` (claimed at `now`) and its answer; returns
    /// how many older keys a full table forgot early.
    pub(super) fn remember_fragment(
        &mut self,
        now: Instant,
        topic: &str,
        key: &str,
        r: &super::StreamReceipt,
    ) -> usize {
        let line = Recorded::fragment_line(&r.id, &r.stream, r.seq, r.done);
        self.table.remember(now, topic, key, &line)
    }

    /// Remembers the keys of the messages `plan` published, with the ids `receipts` gave them;
    /// returns how many older keys a full table forgot early.
    pub(super) fn remember(
        &mut self,
        now: Instant,
        msgs: &[Outgoing<'_>],
        plan: &[Plan],
        receipts: &[Receipt],
    ) -> usize {
        let mut early = 0;
        for ((m, p), r) in msgs.iter().zip(plan).zip(receipts) {
            match (m.key, p) {
                (Some(key), Plan::Publish) => {
                    early += self.table.remember(now, m.topic, key, &r.id);
                }
                (None, _) | (Some(_), Plan::Repeat(_) | Plan::RepeatOf(_)) => {}
            }
        }
        early
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use clarion_proto::ws::DataKind;

    use super::*;

    fn msg<'a>(topic: &'a str, key: Option<&'a str>) -> Outgoing<'a> {
        Outgoing {
            tags: &[],
            conflation_key: None,
            topic,
            kind: DataKind::Text,
            payload: b"x",
            event: None,
            attachment: None,
            key,
        }
    }

    fn receipt(id: &str) -> Receipt {
        Receipt {
            id: id.to_owned(),
            subscribers: 0,
            repeat: false,
        }
    }

    #[test]
    fn a_key_repeated_in_the_same_call_or_a_later_one_is_not_published_again() {
        let mut r = Repeats::new(IdempotencyLimits {
            window: Duration::from_secs(60),
            keys: 10,
        });
        let call = [msg("t", Some("k")), msg("t", None), msg("t", Some("k"))];
        let (now, plan) = r.plan(&call).unwrap();
        assert_eq!(plan, [Plan::Publish, Plan::Publish, Plan::RepeatOf(0)]);
        r.remember(now, &call, &plan, &[receipt("e-1"), receipt("e-2")]);
        let again = [msg("t", Some("k")), msg("u", Some("k"))];
        let (_, plan) = r.plan(&again).unwrap();
        assert_eq!(plan, [Plan::Repeat("e-1".into()), Plan::Publish]);
    }

    #[test]
    fn without_keys_or_with_a_zero_window_nothing_is_planned() {
        let mut r = Repeats::new(IdempotencyLimits {
            window: Duration::from_secs(60),
            keys: 10,
        });
        assert_eq!(r.plan(&[msg("t", None)]), None);
        let mut off = Repeats::new(IdempotencyLimits {
            window: Duration::ZERO,
            keys: 10,
        });
        assert_eq!(off.plan(&[msg("t", Some("k"))]), None);
    }

    #[test]
    fn a_fragments_key_answers_its_receipt_and_a_message_reusing_it_its_id() {
        let mut r = Repeats::new(IdempotencyLimits {
            window: Duration::from_secs(60),
            keys: 10,
        });
        let (now, first) = r.claim_fragment("t", Some("k")).unwrap();
        assert_eq!(first, None);
        let receipt = super::super::StreamReceipt {
            id: "e-4".into(),
            stream: "e-2".into(),
            seq: 3,
            subscribers: 1,
            done: false,
            repeat: false,
        };
        r.remember_fragment(now, "t", "k", &receipt);
        let (_, again) = r.claim_fragment("t", Some("k")).unwrap();
        let again = again.unwrap();
        assert_eq!(again.id, "e-4");
        assert_eq!(again.fragment, Some(("e-2".to_owned(), 3, false)));
        // Another topic: another key.
        assert_eq!(r.claim_fragment("u", Some("k")).unwrap().1, None);
        // A plain publish reusing it is answered the fragment's id, as any reused key is.
        let (_, plan) = r.plan(&[msg("t", Some("k"))]).unwrap();
        assert_eq!(plan, [Plan::Repeat("e-4".into())]);
        assert_eq!(r.claim_fragment("t", None), None);
    }
}
