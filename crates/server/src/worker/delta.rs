//! Delta subscribers: which connections take a topic's messages as deltas (`delta=1`,
//! `"delta":true` on a topic of `delta_topics`), and for each, the last message it was sent on
//! the topic. A part of its own of the worker's side tables ([`super::side::Side`]): only
//! connections that asked pay for an entry.
//!
//! The rule (`docs/delta.md`): a message goes as its delta only when its delta's base is
//! exactly the last message this connection was sent on the topic; everything else (a new or
//! resumed subscription, a subscriber whose last message was another) gets the full message.
//! The delta itself is computed once per publication by the broker ([`crate::delta`]); this
//! module only decides, and the bytes come from the message's shared encodings.
#![deny(clippy::wildcard_enum_match_arm)]

use std::collections::HashMap;
use std::sync::Arc;

use std::sync::atomic::Ordering::Relaxed;

use crate::delta::{DeltaTopics, Position};
use crate::message::{DeflateSettings, Published};
use crate::worker::socket::Socket;
use crate::worker::transport::frame::Form;
use crate::worker::Engine;

/// Why a delta request is refused on a topic outside `delta_topics`.
pub(crate) const NOT_A_DELTA_TOPIC: &str = "delta is not kept for this topic (delta_topics)";
/// Why a delta request is refused on a transport whose messages carry no ids.
pub(crate) const NO_ENVELOPE: &str =
    "delta needs messages with ids: the clarion.v1 subprotocol, SSE format=json or stream lines";

/// Most messages of one run (one topic's messages delivered together) that can go as deltas;
/// later ones in a longer run go in full (never wrong, and runs are one message but for a
/// burst).
const RUN_MASK_BITS: usize = 64;

/// The delta subscriptions of the worker's connections, by slab key.
#[derive(Default)]
pub(crate) struct DeltaSubs {
    conns: HashMap<u32, Vec<DeltaSub>>,
}

/// One connection's delta subscription to one topic.
struct DeltaSub {
    topic: Arc<str>,
    /// The last message it was sent on the topic (full or delta); `None`: nothing yet, so
    /// the next one goes in full.
    last: Option<Position>,
}

impl DeltaSubs {
    /// Whether no connection takes deltas (the fan-out then never asks).
    pub(crate) fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Connection `k` takes `topic`'s messages as deltas from now on; `sent` are the messages
    /// it was just sent in full (its replay), so the next live one may be a delta of the last.
    pub(crate) fn join(&mut self, k: u32, topic: &Arc<str>, sent: &[Arc<Published>]) {
        let last = sent
            .iter()
            .rev()
            .find(|m| m.topic == *topic && !m.notice && !m.presence)
            .map(position);
        let subs = self.conns.entry(k).or_default();
        match subs.iter_mut().find(|s| s.topic == *topic) {
            Some(s) => {
                if last.is_some() {
                    s.last = last;
                }
            }
            None => subs.push(DeltaSub {
                topic: Arc::clone(topic),
                last,
            }),
        }
    }

    /// Connection `k` left `topic`.
    pub(crate) fn leave(&mut self, k: u32, topic: &str) {
        if let Some(subs) = self.conns.get_mut(&k) {
            subs.retain(|s| &*s.topic != topic);
            if subs.is_empty() {
                self.conns.remove(&k);
            }
        }
    }

    /// Connection `k` is gone (or moved: a moved connection takes full messages until it
    /// subscribes again, which is never wrong).
    pub(crate) fn forget(&mut self, k: u32) {
        self.conns.remove(&k);
    }

    /// Connection `k` is about to be sent `run` (messages of one topic, in order): which of
    /// them go as deltas (bit `i` for `run[i]`), recording each as the last one sent.
    pub(crate) fn plan(&mut self, k: u32, run: &[Arc<Published>]) -> u64 {
        let Some(first) = run.first() else { return 0 };
        let Some(sub) = self
            .conns
            .get_mut(&k)
            .and_then(|subs| subs.iter_mut().find(|s| s.topic == first.topic))
        else {
            return 0;
        };
        let mut mask = 0u64;
        for (i, m) in run.iter().enumerate() {
            // A gap notice or a presence event is not a message of the topic: the last one
            // stays the client's base.
            if m.notice || m.presence {
                continue;
            }
            let follows = m
                .delta()
                .is_some_and(|d| sub.last.as_ref() == Some(&d.base));
            if follows && i < RUN_MASK_BITS {
                mask |= 1 << i;
            }
            sub.last = Some(position(m));
        }
        mask
    }
}

impl<S: Socket> Engine<S> {
    /// Why a delta request for `topics` is refused, if it is (counted): every topic must be
    /// in `delta_topics`, and the transport must carry the envelope (`shaped`).
    pub(crate) fn delta_refusal<'t>(
        &self,
        topics: impl IntoIterator<Item = &'t str>,
        shaped: bool,
    ) -> Option<String> {
        let why = if !shaped {
            Some(NO_ENVELOPE.to_owned())
        } else {
            let allowed = DeltaTopics::from_config(&self.shared.config);
            topics
                .into_iter()
                .find(|t| !allowed.matches(t))
                .map(|t| format!("{NOT_A_DELTA_TOPIC}: {t:?}"))
        };
        if why.is_some() {
            self.shared.metrics.delta_refused.fetch_add(1, Relaxed);
        }
        why
    }

    /// Connection `k` takes deltas of `names` (its new subscriptions that asked, all in
    /// `delta_topics`), having just been sent `sent` in full.
    pub(crate) fn delta_join(&mut self, k: u32, names: &[Arc<str>], sent: &[Arc<Published>]) {
        let allowed = DeltaTopics::from_config(&self.shared.config);
        for name in names.iter().filter(|n| allowed.matches(n)) {
            self.side.delta_mut().join(k, name, sent);
        }
    }
}

/// Whether message `i` of a run goes as its delta, by [`DeltaSubs::plan`]'s mask (never past
/// its bits: a shift by 64 or more would wrap).
pub(crate) fn as_delta(mask: u64, i: usize) -> bool {
    i < RUN_MASK_BITS && (mask >> i) & 1 == 1
}

fn position(m: &Arc<Published>) -> Position {
    Position {
        epoch: Arc::clone(&m.epoch),
        seq: m.id,
    }
}

/// The delta of `m` in `form`, when that form has a delta shape (the `clarion.v1` envelope on
/// a WebSocket, plain or deflated; SSE `format=json`; NDJSON lines). `None`: send it in full.
pub(crate) fn delta_frame<'m>(
    m: &'m Published,
    form: Form,
    settings: &DeflateSettings,
) -> Option<&'m Arc<[u8]>> {
    match form {
        Form::Shared(e) => m.delta_encoded(e),
        Form::Deflated {
            envelope: true,
            small_window,
        } => m.delta_deflated(small_window, settings),
        Form::Deflated {
            envelope: false, ..
        }
        | Form::Frame
        | Form::Dedicated { .. }
        | Form::Pusher(_) => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::delta::Chain;
    use clarion_proto::ws::DataKind;

    /// Messages 1..=n of topic `t`, each chained to the one before (as the broker does).
    fn ticker(n: u64) -> Vec<Arc<Published>> {
        let mut chain = Chain::default();
        (1..=n)
            .map(|i| {
                let body = format!(r#"{{"px":[100.{i:02},101.50,102.75,103.00],"seq":{i}}}"#);
                let m = Published::new(
                    "t".into(),
                    i,
                    "e".into(),
                    DataKind::Text,
                    None,
                    0,
                    body.as_bytes(),
                );
                m.chain(&mut chain, true);
                Arc::new(m)
            })
            .collect()
    }

    #[test]
    fn a_new_subscriber_gets_a_full_message_first_then_deltas() {
        let msgs = ticker(4);
        let mut subs = DeltaSubs::default();
        subs.join(1, &"t".into(), &[]);
        assert_eq!(subs.plan(1, &msgs[1..2]), 0, "first message: full");
        assert_eq!(
            subs.plan(1, &msgs[2..4]),
            0b11,
            "then each a delta of the one before"
        );
        // Not a delta subscriber: never.
        assert_eq!(subs.plan(2, &msgs[3..4]), 0);
    }

    #[test]
    fn a_missed_or_reordered_message_means_a_full_one_never_a_delta_of_another_base() {
        let msgs = ticker(5);
        let mut subs = DeltaSubs::default();
        subs.join(1, &"t".into(), &msgs[..1]);
        // It was sent 1 (the replay); 3 comes next (2 lost): 3's base is 2, so 3 goes full,
        // and 4 (based on 3) is a delta again.
        assert_eq!(subs.plan(1, &msgs[2..4]), 0b10);
        // Reordered: 2 after 4 is full.
        assert_eq!(subs.plan(1, &msgs[1..2]), 0);
        // And 5 (based on 4) after 2 is full too.
        assert_eq!(subs.plan(1, &msgs[4..5]), 0);
    }

    #[test]
    fn a_run_longer_than_the_mask_goes_in_full_past_it_and_the_rule_still_holds() {
        let msgs = ticker(70);
        let mut subs = DeltaSubs::default();
        subs.join(1, &"t".into(), &msgs[..1]);
        let mask = subs.plan(1, &msgs[1..70]);
        assert_eq!(mask, u64::MAX, "the first 64 of the run follow each other");
        assert!((0..64).all(|i| as_delta(mask, i)));
        // Not bit i % 64: messages 64.. of the run go in full.
        assert!((64..69).all(|i| !as_delta(mask, i)));
        // And the last one sent is recorded all the same: the next one is a delta of it.
        let more = ticker(71);
        assert_eq!(subs.plan(1, &more[70..71]), 1);
    }

    #[test]
    fn a_resume_replays_in_full_and_continues_with_deltas_of_the_last_replayed() {
        let msgs = ticker(3);
        let mut subs = DeltaSubs::default();
        subs.join(7, &"t".into(), &msgs[..2]);
        assert_eq!(subs.plan(7, &msgs[2..3]), 1);
        subs.leave(7, "t");
        assert!(subs.is_empty());
        subs.join(7, &"t".into(), &[]);
        subs.forget(7);
        assert!(subs.is_empty());
    }
}
