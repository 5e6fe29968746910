//! Topic histories: each topic's recent messages, and what a resuming subscriber missed.
//!
//! History is bounded three ways ([`HistoryLimits`]): by count per topic, by age, and by bytes
//! across topics, the oldest message going first. A topic's `floor` records the newest id that
//! may have been dropped, so a resume from before it is reported as a gap rather than served
//! silently incomplete.

use std::sync::Arc;

use clarion_proto::event_id::EventId;

use super::{Hub, TopicEntry};
use crate::config::HistoryLimits;
use crate::message::{Gap, GapReason, Published};
use crate::metrics::{Eviction, Metrics};

impl Hub {
    /// Keeps `published` (the newest message, of topic `name`) in history, trimming the topic
    /// to `limits.per_topic` messages.
    pub fn keep(
        &mut self,
        name: &Arc<str>,
        published: Arc<Published>,
        limits: &HistoryLimits,
        metrics: &Metrics,
    ) {
        let Some(e) = self.topics.get_mut(&**name) else {
            return;
        };
        let (id, cost) = (published.id, published.cost());
        e.history.push_back(published);
        let over = e.history.len() > limits.per_topic;
        self.held_messages += 1;
        self.held_bytes += cost;
        self.order.push_back((Arc::clone(name), id));
        if over {
            self.trim_front(name, Eviction::Count, metrics);
        }
    }

    /// Keeps `published` like [`Hub::keep`], removing the message `replaces` of the same topic
    /// first if history still holds it: an appendable message's text so far moves to its
    /// latest fragment's position (the broker's streams), one entry per stream.
    pub fn keep_replacing(
        &mut self,
        name: &Arc<str>,
        published: Arc<Published>,
        replaces: Option<u64>,
        limits: &HistoryLimits,
        metrics: &Metrics,
    ) {
        if let Some(e) = replaces.and_then(|_| self.topics.get_mut(&**name)) {
            if let Ok(i) = e.history.binary_search_by_key(&replaces, |m| Some(m.id)) {
                if let Some(old) = e.history.remove(i) {
                    self.held_messages -= 1;
                    self.held_bytes = self.held_bytes.saturating_sub(old.cost());
                }
            }
        }
        self.keep(name, published, limits, metrics);
    }

    /// Puts `published` in place of the entry of topic `name` with the same id, if history
    /// still holds it (an appendable message's text so far, built when it is read: the
    /// broker's streams). Its position, age and count do not change; its bytes do.
    pub fn replace_held(&mut self, name: &str, published: Arc<Published>) {
        let Some(e) = self.topics.get_mut(name) else {
            return;
        };
        if let Ok(i) = e.history.binary_search_by_key(&published.id, |m| m.id) {
            let cost = published.cost();
            if let Some(slot) = e.history.get_mut(i) {
                let old = std::mem::replace(slot, published);
                self.held_bytes = self.held_bytes.saturating_sub(old.cost()) + cost;
            }
        }
    }

    /// Records that message `id` of topic `name` is not kept (history is off).
    pub fn skip(&mut self, name: &str, id: u64) {
        if let Some(e) = self.topics.get_mut(name) {
            e.floor = id;
        }
    }

    /// Removes the oldest message of `topic` from its history.
    pub(crate) fn trim_front(&mut self, topic: &str, why: Eviction, metrics: &Metrics) {
        let Some(e) = self.topics.get_mut(topic) else {
            return;
        };
        let Some(m) = e.history.pop_front() else {
            return;
        };
        e.floor = e.floor.max(m.id);
        self.held_messages -= 1;
        self.held_bytes = self.held_bytes.saturating_sub(m.cost());
        metrics.evicted(why);
        self.forget_if_unused(topic, metrics);
    }

    /// Pops the oldest entry of `order` and trims its message if it is still held. Returns
    /// whether a message was trimmed.
    fn evict_oldest(&mut self, why: Eviction, metrics: &Metrics) -> bool {
        let Some((topic, id)) = self.order.pop_front() else {
            return false;
        };
        let live = self
            .topics
            .get(&*topic)
            .and_then(|e| e.history.front())
            .is_some_and(|m| m.id == id);
        if live {
            self.trim_front(&topic, why, metrics);
        }
        live
    }

    /// The oldest message still held, if `order`'s front entry is live.
    fn oldest_live(&self) -> Option<&Arc<Published>> {
        let (topic, id) = self.order.front()?;
        self.topics
            .get(&**topic)
            .and_then(|e| e.history.front())
            .filter(|m| m.id == *id)
    }

    /// Drops `order` entries whose message is gone once they outnumber live ones.
    fn compact_order(&mut self) {
        if self.order.len() <= 2 * self.held_messages + 1024 {
            return;
        }
        let topics = &self.topics;
        self.order.retain(|(t, id)| {
            topics
                .get(&**t)
                .is_some_and(|e| e.history.binary_search_by_key(id, |m| m.id).is_ok())
        });
    }

    /// Trims history by memory and then by age (`now` in seconds of the broker's clock), and
    /// updates the history gauges.
    pub fn enforce_limits(&mut self, limits: &HistoryLimits, now: u32, metrics: &Metrics) {
        use std::sync::atomic::Ordering::Relaxed;
        while self.held_bytes > limits.max_bytes {
            if !self.evict_oldest(Eviction::Memory, metrics) && self.order.is_empty() {
                break;
            }
        }
        loop {
            match self.oldest_live() {
                Some(m) if now.saturating_sub(m.at) >= limits.ttl => {
                    self.evict_oldest(Eviction::Age, metrics);
                }
                Some(_) => break,
                None if self.order.is_empty() => break,
                // A stale entry (its message was trimmed by count): skip it.
                None => {
                    self.order.pop_front();
                }
            }
        }
        self.compact_order();
        metrics
            .history_messages
            .store(self.held_messages as u64, Relaxed);
        metrics.history_bytes.store(self.held_bytes as u64, Relaxed);
    }

    /// Every message held, in increasing id (what durable history rewrites into a new segment).
    pub fn held_in_order(&self) -> Vec<Arc<Published>> {
        let mut all: Vec<Arc<Published>> = self
            .topics
            .values()
            .flat_map(|e| e.history.iter().cloned())
            .collect();
        all.sort_unstable_by_key(|m| m.id);
        all
    }

    /// The smallest id held in any topic's history (`u64::MAX` when none is held).
    pub fn oldest_held(&self) -> u64 {
        self.topics
            .values()
            .filter_map(|e| e.history.front().map(|m| m.id))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Raises every topic's floor, and that of topics created later, to at least `floor`: any
    /// message up to it may be missing (durable history found it lost or trimmed).
    pub fn raise_floors(&mut self, floor: u64) {
        for e in self.topics.values_mut() {
            e.floor = e.floor.max(floor);
        }
        self.forgotten_floor = self.forgotten_floor.max(floor);
    }

    /// The floor of topics created afresh, and every topic's floor above zero: what a hand-over
    /// carries so that the next process reports the same gaps.
    pub fn floors(&self) -> (u64, Vec<(Arc<str>, u64)>) {
        let topics = self
            .topics
            .iter()
            .filter(|(_, e)| e.floor > 0)
            .map(|(n, e)| (Arc::clone(n), e.floor))
            .collect();
        (self.forgotten_floor, topics)
    }

    /// Sets a handed-over topic's floor, creating the topic when it holds no message (it has
    /// subscribers that are about to join it again).
    pub fn restore_topic_floor(&mut self, topic: &str, floor: u64, metrics: &Metrics) {
        let (_, e) = self.topic_mut(topic, metrics);
        e.floor = e.floor.max(floor);
    }

    /// Raises the floor of topics created afresh (a hand-over's, see [`Hub::floors`]).
    pub fn restore_forgotten_floor(&mut self, floor: u64) {
        self.forgotten_floor = self.forgotten_floor.max(floor);
    }

    /// Raises one topic's floor to at least `floor`.
    pub fn raise_topic_floor(&mut self, topic: &str, floor: u64) {
        if let Some(e) = self.topics.get_mut(topic) {
            e.floor = e.floor.max(floor);
        }
    }

    /// Entries of the publish-order queue (live or stale), for tests of its bound.
    #[cfg(test)]
    pub(crate) fn order_len(&self) -> usize {
        self.order.len()
    }
}

impl TopicEntry {
    /// Appends to `replay` what this topic (`name`) holds after the id a client resumed from
    /// (`given` as sent, `parsed` if it is an id), and to `gaps` why that is incomplete, if it
    /// is. `epoch` is the current run's and `last` the newest id issued.
    #[allow(clippy::too_many_arguments)]
    pub fn replay_after(
        &self,
        name: &Arc<str>,
        given: &str,
        parsed: Option<EventId<'_>>,
        epoch: &str,
        last: u64,
        replay: &mut Vec<Arc<Published>>,
        gaps: &mut Vec<Gap>,
    ) {
        let from = match parsed {
            Some(id) if id.epoch == epoch && id.seq <= last => {
                if id.seq < self.floor {
                    gaps.push(Gap {
                        topic: Arc::clone(name),
                        since: given.to_owned(),
                        reason: GapReason::Trimmed,
                    });
                }
                id.seq
            }
            _ => {
                gaps.push(Gap {
                    topic: Arc::clone(name),
                    since: given.to_owned(),
                    reason: GapReason::Epoch,
                });
                0
            }
        };
        let start = self.history.partition_point(|m| m.id <= from);
        replay.extend(self.history.range(start..).cloned());
    }

    /// The newest message history holds, if any.
    pub fn latest(&self) -> Option<&Arc<Published>> {
        self.history.back()
    }

    /// Appends to `replay` what this topic holds after the newest message whose publisher-given
    /// id is `prev`; nothing when history no longer holds such a message.
    pub fn replay_after_publisher_id(&self, prev: &str, replay: &mut Vec<Arc<Published>>) {
        let found = self.history.iter().rposition(|m| {
            m.attachment
                .as_ref()
                .and_then(|a| a.publisher_id())
                .is_some_and(|id| id == prev)
        });
        if let Some(i) = found {
            replay.extend(self.history.range(i + 1..).cloned());
        }
    }
}
