//! Topics and their subscriber counts per worker.
//!
//! A topic exists while it has a subscriber or a message in history; when it has neither it is
//! forgotten, and its `floor` is remembered (as `forgotten_floor`) so that a subscriber resuming
//! on a topic created afresh still learns that it may have missed something.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::Hub;
use crate::delta::Chain;
use crate::message::Published;
use crate::metrics::Metrics;

/// One topic: subscriber counts per worker, and its recent messages.
pub struct TopicEntry {
    /// Subscribers on each worker, by worker id.
    pub(super) per_worker: Box<[u32]>,
    /// The sum of `per_worker`.
    pub(super) total: u64,
    /// Recent messages, oldest first, ids increasing.
    pub(super) history: VecDeque<Arc<Published>>,
    /// Every message of this topic with a larger id is in `history` (or not published yet);
    /// messages up to it may have been dropped.
    pub(super) floor: u64,
    /// What the dashboard samples: bumped under the lock a publish already holds.
    pub traffic: TopicTraffic,
    /// Its previous publication, for deltas (`delta_topics` only; see [`crate::delta`]).
    pub delta: Option<Box<Chain>>,
}

/// A topic's publish counter and what the last once-a-second sample made of it. The dashboard
/// (`dashboard::topics`) reads and updates it in one walk over the topics per second; a publish
/// only adds one to `published`, never per delivery.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct TopicTraffic {
    /// Messages published to the topic since it was created.
    pub published: u64,
    /// `published` when the last sample was taken.
    pub sampled: u64,
    /// Messages per second between the last two samples.
    pub rate: f32,
}

impl TopicEntry {
    /// A topic nobody subscribes to yet, which may have missed messages up to `floor`.
    pub(super) fn new(workers: usize, floor: u64) -> TopicEntry {
        TopicEntry {
            per_worker: vec![0; workers].into_boxed_slice(),
            total: 0,
            history: VecDeque::new(),
            floor,
            traffic: TopicTraffic::default(),
            delta: None,
        }
    }

    /// Subscribers across workers.
    pub fn subscribers(&self) -> u64 {
        self.total
    }

    /// Messages held in the topic's history.
    pub fn held(&self) -> usize {
        self.history.len()
    }

    /// The workers holding at least one subscriber, by id.
    pub fn workers_with_subscribers(&self) -> impl Iterator<Item = usize> + '_ {
        self.per_worker
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(w, _)| w)
    }
}

impl Hub {
    /// The topic `name`, created (and counted in metrics) if it is not known.
    pub fn topic_mut(&mut self, name: &str, metrics: &Metrics) -> (Arc<str>, &mut TopicEntry) {
        let key = match self.topics.get_key_value(name) {
            Some((k, _)) => Arc::clone(k),
            None => {
                let k: Arc<str> = name.into();
                let entry = TopicEntry::new(self.workers, self.forgotten_floor);
                self.topics.insert(Arc::clone(&k), entry);
                metrics.topics.fetch_add(1, Relaxed);
                k
            }
        };
        // Found or inserted just above, so this never inserts; the entry API gives the `&mut`
        // without an `unwrap`, and cloning the key is a reference count, not an allocation.
        let entry = self
            .topics
            .entry(Arc::clone(&key))
            .or_insert_with(|| TopicEntry::new(self.workers, self.forgotten_floor));
        (key, entry)
    }

    /// The topic `name`, if it is known.
    pub fn topic(&self, name: &str) -> Option<&TopicEntry> {
        self.topics.get(name)
    }

    /// Calls `visit` with every topic's name, subscriber count and traffic counters.
    pub fn visit_topics(&mut self, mut visit: impl FnMut(&Arc<str>, u64, &mut TopicTraffic)) {
        for (name, e) in &mut self.topics {
            visit(name, e.total, &mut e.traffic);
        }
    }

    /// Counts one more subscriber of `worker` on `entry`.
    pub fn add_subscriber(entry: &mut TopicEntry, worker: usize, metrics: &Metrics) {
        if let Some(n) = entry.per_worker.get_mut(worker) {
            *n += 1;
            entry.total += 1;
            metrics.subscriptions.fetch_add(1, Relaxed);
        }
    }

    /// Counts one subscriber of `worker` less on `topic`, and forgets the topic if that was the
    /// last reason to keep it.
    pub fn remove_subscriber(&mut self, worker: usize, topic: &str, metrics: &Metrics) {
        let Some(e) = self.topics.get_mut(topic) else {
            return;
        };
        if let Some(n) = e.per_worker.get_mut(worker) {
            if *n > 0 {
                *n -= 1;
                e.total -= 1;
                metrics.subscriptions.fetch_sub(1, Relaxed);
            }
        }
        self.forget_if_unused(topic, metrics);
    }

    /// Records that message `id` went to a topic nobody knows and nothing keeps: a client
    /// resuming later from an older id must hear that it may have missed it.
    pub fn note_unseen(&mut self, id: u64) {
        self.forgotten_floor = id;
    }

    /// Drops a topic that has neither subscribers nor history.
    pub(crate) fn forget_if_unused(&mut self, topic: &str, metrics: &Metrics) {
        let unused = self
            .topics
            .get(topic)
            .is_some_and(|e| e.total == 0 && e.history.is_empty());
        if unused {
            if let Some(e) = self.topics.remove(topic) {
                self.forgotten_floor = self.forgotten_floor.max(e.floor);
                metrics.topics.fetch_sub(1, Relaxed);
            }
        }
    }

    /// A stand-in for a topic that is not known: no subscribers, nothing held, and possibly
    /// missed messages up to the forgotten floor.
    pub fn unknown_topic(&self) -> TopicEntry {
        TopicEntry::new(0, self.forgotten_floor)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn topics_live_while_subscribed_and_leave_a_floor() {
        let metrics = Metrics::default();
        let mut hub = Hub::new(2);
        let (name, e) = hub.topic_mut("a", &metrics);
        Hub::add_subscriber(e, 1, &metrics);
        Hub::add_subscriber(e, 1, &metrics);
        // A worker id out of range counts nothing.
        Hub::add_subscriber(e, 7, &metrics);
        e.floor = 5;
        assert_eq!(&*name, "a");
        let e = hub.topic("a").unwrap();
        assert_eq!(e.subscribers(), 2);
        assert_eq!(e.workers_with_subscribers().collect::<Vec<_>>(), vec![1]);
        assert_eq!(metrics.topics.load(Relaxed), 1);
        hub.remove_subscriber(1, "a", &metrics);
        assert!(hub.topic("a").is_some());
        hub.remove_subscriber(1, "a", &metrics);
        assert!(hub.topic("a").is_none(), "no subscriber, no history");
        assert_eq!(metrics.topics.load(Relaxed), 0);
        assert_eq!(metrics.subscriptions.load(Relaxed), 0);
        // Created afresh, it may have missed what the forgotten one had.
        assert_eq!(hub.topic_mut("a", &metrics).1.floor, 5);
        assert_eq!(hub.unknown_topic().floor, 5);
    }
}
