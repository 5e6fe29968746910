//! The busiest topics, kept cheap with thousands of them.
//!
//! A publish adds one to its topic's counter ([`TopicTraffic::published`]), under the broker
//! lock it already holds: nothing per delivery, nothing per subscriber, no allocation. Once a
//! second, and only while a dashboard feed is open, the sampler thread walks the topic table
//! once under that lock: for each topic it turns the counter's growth into a rate (stored back
//! in the entry for searches) and offers the topic to a min-heap of [`TOP_TOPICS`] entries, so
//! the walk is O(topics · log 20) with no allocation per topic. Names are `Arc<str>` shared
//! with the broker (a reference count, not a copy). A search walks the table the same way on
//! request, bounded to `limit` results.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

/// Busiest topics sent with each sample: a screenful, and the bound on the sampler's heap.
pub const TOP_TOPICS: usize = 20;

use crate::broker::Broker;
use crate::hub::TopicTraffic;

/// Most results of one search.
pub const SEARCH_LIMIT: usize = 50;

/// One topic in a list: name, subscribers, messages per second, messages published.
#[derive(Debug, Clone)]
pub struct TopicRow {
    /// Its name, shared with the broker.
    pub name: Arc<str>,
    /// Subscribers in this process.
    pub subscribers: u64,
    /// Messages per second at the last sample.
    pub rate: f32,
    /// Messages published since the topic was created.
    pub published: u64,
}

impl TopicRow {
    fn new(name: &Arc<str>, subscribers: u64, t: &TopicTraffic) -> TopicRow {
        TopicRow {
            name: Arc::clone(name),
            subscribers,
            rate: t.rate,
            published: t.published,
        }
    }

    /// How busy: messages per second, then subscribers, then name (for a stable order).
    fn busier(&self, other: &TopicRow) -> Ordering {
        self.rate
            .total_cmp(&other.rate)
            .then(self.subscribers.cmp(&other.subscribers))
            .then_with(|| other.name.cmp(&self.name))
    }

    /// As the page reads it.
    pub fn json(&self) -> Value {
        json!({
            "topic": &*self.name,
            "subscribers": self.subscribers,
            "rate": (f64::from(self.rate) * 10.0).round() / 10.0,
            "published": self.published,
        })
    }
}

/// A row in the heap, ordered by [`TopicRow::busier`].
struct ByBusy(TopicRow);

impl PartialEq for ByBusy {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for ByBusy {}
impl PartialOrd for ByBusy {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByBusy {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.busier(&other.0)
    }
}

/// The `n` busiest of the rows offered, busiest first.
struct Top {
    n: usize,
    heap: BinaryHeap<Reverse<ByBusy>>,
}

impl Top {
    fn new(n: usize) -> Top {
        Top {
            n,
            heap: BinaryHeap::with_capacity(n + 1),
        }
    }

    /// Offers a row, built only if it would enter the list.
    fn offer(&mut self, name: &Arc<str>, subscribers: u64, t: &TopicTraffic) {
        if self.n == 0 {
            return;
        }
        if self.heap.len() == self.n {
            let Some(Reverse(least)) = self.heap.peek() else {
                return;
            };
            let probe = TopicRow {
                name: Arc::clone(name),
                subscribers,
                rate: t.rate,
                published: t.published,
            };
            if probe.busier(&least.0) != Ordering::Greater {
                return;
            }
            self.heap.pop();
            self.heap.push(Reverse(ByBusy(probe)));
            return;
        }
        self.heap
            .push(Reverse(ByBusy(TopicRow::new(name, subscribers, t))));
    }

    fn into_rows(self) -> Vec<TopicRow> {
        let mut rows: Vec<TopicRow> = self.heap.into_iter().map(|Reverse(b)| b.0).collect();
        rows.sort_by(|a, b| b.busier(a));
        rows
    }
}

/// When the rates were last sampled.
#[derive(Debug, Default)]
pub struct Rates {
    last: Option<Instant>,
}

impl Rates {
    /// Updates every topic's rate from its counter and returns the `n` busiest.
    pub fn sample(&mut self, broker: &Broker, now: Instant, n: usize) -> Vec<TopicRow> {
        let secs = self
            .last
            .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f32());
        self.last = Some(now);
        let mut top = Top::new(n);
        broker.visit_topics(|name, subscribers, t| {
            let grown = t.published.saturating_sub(t.sampled);
            t.sampled = t.published;
            // The first sample has no interval: its growth is history, not a rate.
            t.rate = if secs > 0.0 { grown as f32 / secs } else { 0.0 };
            top.offer(name, subscribers, t);
        });
        top.into_rows()
    }
}

/// Topics whose name contains `text` (all of them when it is empty), busiest first, at most
/// `limit`.
pub fn search(broker: &Broker, text: &str, limit: usize) -> Value {
    let mut top = Top::new(limit);
    let mut matched = 0u64;
    broker.visit_topics(|name, subscribers, t| {
        if name.contains(text) {
            matched += 1;
            top.offer(name, subscribers, t);
        }
    });
    let rows: Vec<Value> = top.into_rows().iter().map(TopicRow::json).collect();
    json!({ "query": text, "matched": matched, "topics": rows })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn traffic(rate: f32) -> TopicTraffic {
        TopicTraffic {
            published: 0,
            sampled: 0,
            rate,
        }
    }

    #[test]
    fn top_keeps_the_busiest_in_order() {
        let mut top = Top::new(3);
        let names: Vec<Arc<str>> = (0..10).map(|i| format!("t{i}").into()).collect();
        for (i, name) in names.iter().enumerate() {
            // t7 is the busiest, then ties on rate broken by subscribers.
            let rate = if i == 7 { 100.0 } else { (i % 3) as f32 };
            top.offer(name, i as u64, &traffic(rate));
        }
        let rows = top.into_rows();
        let got: Vec<&str> = rows.iter().map(|r| &*r.name).collect();
        assert_eq!(got, vec!["t7", "t8", "t5"]);
        assert!(Top::new(0).into_rows().is_empty());
    }

    #[test]
    fn rates_come_from_the_publish_counters() {
        use crate::broker::Outgoing;
        use crate::config::HistoryLimits;
        use crate::hub::Inbox;
        use crate::metrics::Metrics;
        use clarion_proto::ws::DataKind;
        use std::time::Duration;

        let poll = mio::Poll::new().unwrap();
        let inbox = Arc::new(Inbox::new(
            mio::Waker::new(poll.registry(), mio::Token(0)).unwrap(),
        ));
        let limits = HistoryLimits {
            per_topic: 10,
            ttl: 3600,
            max_bytes: 1 << 20,
        };
        let broker = Broker::local(vec![inbox], Arc::new(Metrics::default()), limits);
        let send = |topic: &str, n: usize| {
            for _ in 0..n {
                let _ = broker.publish(&[Outgoing {
                    tags: &[],
                    conflation_key: None,
                    topic,
                    kind: DataKind::Text,
                    payload: b"x",
                    event: None,
                    attachment: None,
                    key: None,
                }]);
            }
        };
        send("quiet", 1);
        send("busy", 3);
        let mut rates = Rates::default();
        let t0 = Instant::now();
        // The first sample has no interval: counts so far are not a rate.
        let first = rates.sample(&broker, t0, 5);
        assert!(first.iter().all(|r| r.rate == 0.0));
        send("busy", 8);
        send("quiet", 2);
        let rows = rates.sample(&broker, t0 + Duration::from_secs(2), 1);
        assert_eq!(rows.len(), 1, "bounded to n");
        assert_eq!(
            (&*rows[0].name, rows[0].rate, rows[0].published),
            ("busy", 4.0, 11)
        );
        let found = search(&broker, "qui", 10);
        assert_eq!(found["matched"], 1);
        assert_eq!(found["topics"][0]["rate"], 1.0);
        assert_eq!(broker.topic_status("busy").map(|s| s.held), Some(10));
    }
}
