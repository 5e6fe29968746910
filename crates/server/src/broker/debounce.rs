//! Per-topic publish debouncing (`max_rate` on a `[[conflate_topics]]` table,
//! docs/conflation.md "Debouncing"): the node's one decision, per topic, of which publications
//! go to its workers now and which wait for the end of the topic's interval, the latest per key
//! winning. The rule is [`clarion_proto::debounce::Debounce`]; this is its clock and its timer.
//!
//! A broker asks [`Debouncer::hold`] for every live publication of a debounced topic, under its
//! own lock, before handing it to the inboxes: history keeps every message whatever the
//! answer. A thread of its own flushes the held messages at each interval's end, marking the
//! ones that replaced others ([`Published::mark_debounced`]) so that the workers send the
//! `conflated` notice first. Lock order: a broker's lock, then the debouncer's, then an
//! inbox's; the thread takes the debouncer's, then the inboxes'.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::debounce::{Debounce, Offer};

use crate::config::conflate::Rules;
use crate::config::Config;
use crate::hub::{lock, Inbox};
use crate::message::Published;
use crate::metrics::Metrics;

/// The node's debounced topics.
pub struct Debouncer {
    topics: Mutex<HashMap<Arc<str>, Debounce<Arc<Published>>>>,
    /// Wakes the timer thread when a message is held.
    held: Condvar,
    rules: Rules,
    inboxes: Vec<Arc<Inbox>>,
    metrics: Arc<Metrics>,
    start: Instant,
}

impl Debouncer {
    /// The debouncer of `config`'s topics with a `max_rate`, its timer thread started; `None`
    /// when no topic has one.
    pub fn start(
        config: &Config,
        inboxes: &[Arc<Inbox>],
        metrics: &Arc<Metrics>,
    ) -> std::io::Result<Option<Arc<Debouncer>>> {
        let rules = Rules::of(config);
        if !rules.debounces() {
            return Ok(None);
        }
        let d = Arc::new(Debouncer {
            topics: Mutex::new(HashMap::new()),
            held: Condvar::new(),
            rules,
            inboxes: inboxes.to_vec(),
            metrics: Arc::clone(metrics),
            start: Instant::now(),
        });
        let timer = Arc::clone(&d);
        std::thread::Builder::new()
            .name("debounce".into())
            .spawn(move || timer.run())?;
        Ok(Some(d))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether `m` waits (held, or in place of a held one of its key) instead of going to
    /// the workers now. Gap notices and presence events always go now.
    pub(crate) fn hold(&self, m: &Arc<Published>) -> bool {
        if m.notice || m.presence {
            return false;
        }
        let Some(rule) = self.rules.for_topic(&m.topic) else {
            return false;
        };
        let Some(rate) = rule.max_rate else {
            return false;
        };
        let key = rule.key.key_of(m.payload(), m.conflation_key.as_deref());
        let now = self.now_ms();
        let mut topics = lock(&self.topics);
        let d = topics
            .entry(Arc::clone(&m.topic))
            .or_insert_with(|| Debounce::new(rate, rule.max_keys));
        match d.offer(now, key, Arc::clone(m)) {
            Offer::Now(_) => false,
            Offer::Held => {
                self.held.notify_one();
                true
            }
            Offer::Replaced => {
                self.metrics.debounced.fetch_add(1, Relaxed);
                true
            }
        }
    }

    /// The timer: flushes each topic's held messages when due, and forgets topics idle for a
    /// while. Never returns (the process ends it).
    fn run(&self) {
        let mut topics = lock(&self.topics);
        loop {
            let now = self.now_ms();
            let mut out: Vec<Arc<Published>> = Vec::new();
            let mut next: Option<u64> = None;
            for d in topics.values_mut() {
                for (m, skipped) in d.flush(now) {
                    if skipped > 0 {
                        m.mark_debounced(skipped);
                    }
                    out.push(m);
                }
                if let Some(t) = d.due() {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
            if !out.is_empty() {
                // Every worker: one without a subscriber of the topic finds none and moves on
                // (at most `max_rate` rounds per second per topic).
                for inbox in &self.inboxes {
                    inbox.push(out.iter().cloned());
                }
            }
            // Topics with nothing held and no round for a second hold nothing worth keeping.
            topics.retain(|_, d| d.held() > 0 || d.recent(now, 1000));
            let wait = next.map_or(1000, |t| t.saturating_sub(now).clamp(1, 1000));
            topics = match self.held.wait_timeout(topics, Duration::from_millis(wait)) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}
