//! The hub: where publishes meet subscribers across worker threads.
//!
//! The hub knows, for every topic, how many subscribers each worker holds; it does not know which
//! connections they are (each worker keeps its own index, see [`crate::worker::index`]). A publish
//! takes the hub lock once: it assigns the message id, encodes the frame once, and appends one
//! shared [`Published`] to the inbox of every worker that has a subscriber. Holding the lock while
//! enqueueing is what makes delivery order equal publish order on every worker.
//!
//! The hub also keeps each topic's recent messages (its history), bounded by count per topic, by
//! age and by total memory, so that a client that reconnects with the id of the last message it
//! saw gets exactly what it missed ([`Hub::subscribe`]), or is told that it cannot.
//!
//! Lock order: `Hub::state` before any `Inbox::queue`. Workers never take the hub lock while
//! holding their inbox lock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clarion_proto::event_id;
use clarion_proto::ws::DataKind;

use crate::config::HistoryLimits;
use crate::message::{Attachment, Gap, GapReason, Published};
use crate::metrics::{Eviction, Metrics};

/// A worker's mailbox: published messages waiting to be written, and the waker of its loop.
pub struct Inbox {
    /// Messages in publish order. Swapped out whole by the worker, so it holds the lock for a
    /// pointer swap only.
    queue: Mutex<Vec<Arc<Published>>>,
    waker: mio::Waker,
}

impl Inbox {
    /// An inbox that wakes the loop owning `waker`.
    pub fn new(waker: mio::Waker) -> Inbox {
        Inbox {
            queue: Mutex::new(Vec::new()),
            waker,
        }
    }

    /// Appends messages; wakes the worker only when the queue goes from empty to not empty (a
    /// non-empty queue means a wake-up is already on its way).
    fn push(&self, msgs: impl Iterator<Item = Arc<Published>>) {
        let mut q = lock(&self.queue);
        let was_empty = q.is_empty();
        q.extend(msgs);
        if was_empty && !q.is_empty() {
            self.wake();
        }
    }

    /// Takes every queued message, swapping in `spare` (an empty vector whose capacity is reused).
    pub fn take(&self, spare: &mut Vec<Arc<Published>>) {
        std::mem::swap(&mut *lock(&self.queue), spare);
    }

    /// Wakes the worker's loop (new messages, or shutdown).
    pub fn wake(&self) {
        if let Err(e) = self.waker.wake() {
            crate::log::warn(format_args!("cannot wake worker: {e}"));
        }
    }
}

/// One topic: subscriber counts per worker, and its recent messages.
struct TopicEntry {
    per_worker: Box<[u32]>,
    total: u64,
    /// Recent messages, oldest first, ids increasing.
    history: VecDeque<Arc<Published>>,
    /// Every message of this topic with a larger id is in `history` (or not published yet);
    /// messages up to it may have been dropped.
    floor: u64,
}

struct State {
    topics: HashMap<Arc<str>, TopicEntry>,
    next_id: u64,
    /// (topic, id) of history messages in publish order, for expiry and the memory cap. Entries
    /// whose message was already trimmed by count stay until they reach the front or a
    /// compaction removes them.
    order: VecDeque<(Arc<str>, u64)>,
    held_messages: usize,
    held_bytes: usize,
    /// The largest `floor` of any topic forgotten so far: a topic created afresh may have had
    /// messages up to here that nobody holds any more.
    forgotten_floor: u64,
}

impl State {
    /// Drops a topic that has neither subscribers nor history.
    fn forget_if_unused(&mut self, topic: &str, metrics: &Metrics) {
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

    /// Removes the oldest message of `topic` from its history.
    fn trim_front(&mut self, topic: &str, why: Eviction, metrics: &Metrics) {
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

    /// The id of the oldest message still held, with its topic's front, if `order`'s front is live.
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
                .and_then(|e| e.history.front())
                .is_some_and(|front| front.id <= *id)
        });
    }
}

/// A message to publish: topic, kind and payload (validated by the caller).
pub struct Outgoing<'a> {
    /// A topic name that passed [`clarion_proto::pubsub::validate_topic`].
    pub topic: &'a str,
    /// Text (valid UTF-8) or binary.
    pub kind: DataKind,
    /// The message itself.
    pub payload: &'a [u8],
    /// An SSE event name (checked with [`clarion_proto::pubsub::validate_event_name`]).
    pub event: Option<&'a str>,
    /// Content for the connections of another protocol's mode (see [`Attachment`]).
    pub attachment: Option<Arc<dyn Attachment>>,
}

/// What a publish did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The id given to the message, `EPOCH-SEQ`.
    pub id: String,
    /// How many subscribers it was handed to.
    pub subscribers: u64,
}

/// Where a subscriber asks to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since<'a> {
    /// Only messages published from now on.
    Now,
    /// Everything after this id (as the client sent it), then live messages.
    Id(&'a str),
    /// Everything after the message whose publisher-given id ([`Attachment::publisher_id`]) is
    /// this, if history still holds it; otherwise live messages only. GRIP holds resume from
    /// their `prev-id` this way.
    PublisherId(&'a str),
}

/// What [`Hub::subscribe`] did.
pub struct Subscribed {
    /// The topic names, shared with the hub (same order as requested).
    pub names: Vec<Arc<str>>,
    /// Messages the subscriber missed, in publish order, across all its topics.
    pub replay: Vec<Arc<Published>>,
    /// Topics for which the replay is incomplete.
    pub gaps: Vec<Gap>,
    /// The id of the last message published before the subscription began.
    pub position: String,
}

/// Shared by the API, every worker, and in-band publishers.
pub struct Hub {
    state: Mutex<State>,
    inboxes: Vec<Arc<Inbox>>,
    metrics: Arc<Metrics>,
    limits: HistoryLimits,
    epoch: Arc<str>,
    start: Instant,
}

impl Hub {
    /// A hub for workers `0..inboxes.len()`.
    pub fn new(inboxes: Vec<Arc<Inbox>>, metrics: Arc<Metrics>, limits: HistoryLimits) -> Hub {
        Hub {
            state: Mutex::new(State {
                topics: HashMap::new(),
                next_id: 1,
                order: VecDeque::new(),
                held_messages: 0,
                held_bytes: 0,
                forgotten_floor: 0,
            }),
            inboxes,
            metrics,
            limits,
            epoch: new_epoch().into(),
            start: Instant::now(),
        }
    }

    /// This server run's epoch, the first part of every message id.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// Wakes every worker (used to announce shutdown).
    pub fn wake_all(&self) {
        for inbox in &self.inboxes {
            inbox.wake();
        }
    }

    fn clock(&self) -> u32 {
        self.start.elapsed().as_secs() as u32
    }

    /// Subscribes one connection of `worker` to `topics` (valid, distinct names) and computes
    /// what it missed since `since`.
    ///
    /// Under the hub lock, this also takes everything waiting in the worker's inbox into
    /// `pending`: those messages were published before the subscription and must reach the
    /// worker's other subscribers, but not this one (it gets them from `replay` if it asked).
    /// The worker delivers `pending` before it adds the connection to its index; every later
    /// message reaches it through the inbox. That is what makes a resume gap-free and
    /// duplicate-free.
    pub fn subscribe(
        &self,
        worker: usize,
        topics: &[&str],
        since: Since<'_>,
        pending: &mut Vec<Arc<Published>>,
    ) -> Subscribed {
        let workers = self.inboxes.len();
        let mut st = lock(&self.state);
        if let Some(inbox) = self.inboxes.get(worker) {
            inbox.take(pending);
        }
        let parsed = match since {
            Since::Now | Since::PublisherId(_) => None,
            Since::Id(s) => Some((s, event_id::parse(s).ok())),
        };
        let last = st.next_id - 1;
        let mut out = Subscribed {
            names: Vec::with_capacity(topics.len()),
            replay: Vec::new(),
            gaps: Vec::new(),
            position: format!("{}-{last}", self.epoch),
        };
        for &topic in topics {
            let floor = st.forgotten_floor;
            let (name, entry) = match st.topics.get_key_value(topic) {
                Some((k, _)) => {
                    let k = Arc::clone(k);
                    (Arc::clone(&k), st.topics.get_mut(&*k))
                }
                None => {
                    let k: Arc<str> = topic.into();
                    st.topics.insert(
                        Arc::clone(&k),
                        TopicEntry {
                            per_worker: vec![0; workers].into_boxed_slice(),
                            total: 0,
                            history: VecDeque::new(),
                            floor,
                        },
                    );
                    self.metrics.topics.fetch_add(1, Relaxed);
                    (Arc::clone(&k), st.topics.get_mut(&*k))
                }
            };
            let Some(e) = entry else { continue };
            if let Some(n) = e.per_worker.get_mut(worker) {
                *n += 1;
                e.total += 1;
                self.metrics.subscriptions.fetch_add(1, Relaxed);
            }
            if let Some((given, id)) = parsed {
                let from = match id {
                    Some(id) if id.epoch == &*self.epoch && id.seq <= last => {
                        if id.seq < e.floor {
                            out.gaps.push(Gap {
                                topic: Arc::clone(&name),
                                since: given.to_owned(),
                                reason: GapReason::Trimmed,
                            });
                        }
                        id.seq
                    }
                    _ => {
                        out.gaps.push(Gap {
                            topic: Arc::clone(&name),
                            since: given.to_owned(),
                            reason: GapReason::Epoch,
                        });
                        0
                    }
                };
                let start = e.history.partition_point(|m| m.id <= from);
                out.replay.extend(e.history.range(start..).cloned());
            }
            if let Since::PublisherId(prev) = since {
                let found = e.history.iter().rposition(|m| {
                    m.attachment
                        .as_ref()
                        .and_then(|a| a.publisher_id())
                        .is_some_and(|id| id == prev)
                });
                if let Some(i) = found {
                    out.replay.extend(e.history.range(i + 1..).cloned());
                }
            }
            out.names.push(name);
        }
        drop(st);
        if parsed.is_some() {
            self.metrics.resumes.fetch_add(1, Relaxed);
            if !out.gaps.is_empty() {
                self.metrics.resume_gaps.fetch_add(1, Relaxed);
            }
        }
        if topics.len() > 1 {
            out.replay.sort_unstable_by_key(|m| m.id);
        }
        out
    }

    /// Records that `worker` lost a subscriber to `topic`.
    pub fn unsubscribe(&self, worker: usize, topic: &str) {
        let mut st = lock(&self.state);
        let Some(e) = st.topics.get_mut(topic) else {
            return;
        };
        if let Some(n) = e.per_worker.get_mut(worker) {
            if *n > 0 {
                *n -= 1;
                e.total -= 1;
                self.metrics.subscriptions.fetch_sub(1, Relaxed);
            }
        }
        st.forget_if_unused(topic, &self.metrics);
    }

    /// Publishes messages in order, under one lock acquisition, waking each interested worker
    /// once, and keeps them in history. Returns one receipt per message.
    pub fn publish(&self, msgs: &[Outgoing<'_>]) -> Vec<Receipt> {
        let now = self.clock();
        let keep = self.limits.enabled();
        let workers = self.inboxes.len();
        let mut receipts = Vec::with_capacity(msgs.len());
        // Per worker, the messages it must deliver, so each inbox is locked and woken once.
        let mut per_worker: Vec<Vec<Arc<Published>>> = vec![Vec::new(); workers];
        let mut st = lock(&self.state);
        for m in msgs {
            let id = st.next_id;
            st.next_id += 1;
            receipts.push(Receipt {
                id: format!("{}-{id}", self.epoch),
                subscribers: 0,
            });
            if !keep && !st.topics.contains_key(m.topic) {
                // No subscriber and no history: nobody will ever see it. A client resuming
                // later from an older id must hear that it may have missed it.
                st.forgotten_floor = id;
                continue;
            }
            let floor = st.forgotten_floor;
            let name = match st.topics.get_key_value(m.topic) {
                Some((k, _)) => Arc::clone(k),
                None => {
                    let k: Arc<str> = m.topic.into();
                    st.topics.insert(
                        Arc::clone(&k),
                        TopicEntry {
                            per_worker: vec![0; workers].into_boxed_slice(),
                            total: 0,
                            history: VecDeque::new(),
                            floor,
                        },
                    );
                    self.metrics.topics.fetch_add(1, Relaxed);
                    k
                }
            };
            let mut published = Published::new(
                Arc::clone(&name),
                id,
                Arc::clone(&self.epoch),
                m.kind,
                m.event.map(Into::into),
                now,
                m.payload,
            );
            published.attachment = m.attachment.clone();
            let published = Arc::new(published);
            let Some(e) = st.topics.get_mut(&*name) else {
                continue;
            };
            if let Some(r) = receipts.last_mut() {
                r.subscribers = e.total;
            }
            for (w, n) in e.per_worker.iter().enumerate() {
                if *n > 0 {
                    if let Some(list) = per_worker.get_mut(w) {
                        list.push(Arc::clone(&published));
                    }
                }
            }
            if !keep {
                e.floor = id;
                continue;
            }
            let cost = published.cost();
            e.history.push_back(published);
            let over = e.history.len() > self.limits.per_topic;
            st.held_messages += 1;
            st.held_bytes += cost;
            st.order.push_back((Arc::clone(&name), id));
            if over {
                st.trim_front(&name, Eviction::Count, &self.metrics);
            }
        }
        for (inbox, list) in self.inboxes.iter().zip(per_worker) {
            if !list.is_empty() {
                inbox.push(list.into_iter());
            }
        }
        if keep {
            self.enforce_limits(&mut st, now);
        }
        drop(st);
        self.metrics.published.fetch_add(msgs.len() as u64, Relaxed);
        receipts
    }

    /// Trims history by age and memory. Called on every publish and once a second by a worker.
    pub fn expire(&self) {
        if self.limits.enabled() {
            let now = self.clock();
            self.enforce_limits(&mut lock(&self.state), now);
        }
    }

    fn enforce_limits(&self, st: &mut State, now: u32) {
        while st.held_bytes > self.limits.max_bytes {
            if !st.evict_oldest(Eviction::Memory, &self.metrics) && st.order.is_empty() {
                break;
            }
        }
        loop {
            match st.oldest_live() {
                Some(m) if now.saturating_sub(m.at) >= self.limits.ttl => {
                    st.evict_oldest(Eviction::Age, &self.metrics);
                }
                Some(_) => break,
                None if st.order.is_empty() => break,
                // A stale entry (its message was trimmed by count): skip it.
                None => {
                    st.order.pop_front();
                }
            }
        }
        st.compact_order();
        self.metrics
            .history_messages
            .store(st.held_messages as u64, Relaxed);
        self.metrics
            .history_bytes
            .store(st.held_bytes as u64, Relaxed);
    }
}

/// A new epoch: the time and process id, mixed, in base 36 (at most 8 characters). Two runs get
/// the same epoch only if they start in the same nanosecond with the same pid, or by a 1 in 2^41
/// chance.
fn new_epoch() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ (u64::from(std::process::id()) << 32);
    // splitmix64's finaliser: every input bit affects every output bit.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    event_id::base36(x & ((1 << 41) - 1))
}

/// Locks a mutex, recovering the data if another thread panicked while holding it: the hub's
/// state stays consistent across a panic because every update is a single counter change.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const NO_HISTORY: HistoryLimits = HistoryLimits {
        per_topic: 0,
        ttl: 0,
        max_bytes: 0,
    };

    fn hub(workers: usize, limits: HistoryLimits) -> (Hub, Vec<mio::Poll>, Arc<Metrics>) {
        let polls: Vec<mio::Poll> = (0..workers)
            .map(|_| mio::Poll::new().expect("poll"))
            .collect();
        let inboxes = polls
            .iter()
            .map(|p| {
                Arc::new(Inbox::new(
                    mio::Waker::new(p.registry(), mio::Token(0)).expect("waker"),
                ))
            })
            .collect();
        let metrics = Arc::new(Metrics::default());
        (
            Hub::new(inboxes, Arc::clone(&metrics), limits),
            polls,
            metrics,
        )
    }

    fn text<'a>(topic: &'a str, payload: &'a str) -> Outgoing<'a> {
        Outgoing {
            topic,
            kind: DataKind::Text,
            payload: payload.as_bytes(),
            event: None,
            attachment: None,
        }
    }

    fn sub(hub: &Hub, worker: usize, topics: &[&str], since: Since<'_>) -> Subscribed {
        let mut pending = Vec::new();
        hub.subscribe(worker, topics, since, &mut pending)
    }

    fn seq(id: &str) -> u64 {
        event_id::parse(id).unwrap().seq
    }

    fn payloads(msgs: &[Arc<Published>]) -> Vec<String> {
        msgs.iter()
            .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
            .collect()
    }

    #[test]
    fn publish_reaches_only_workers_with_subscribers_in_order() {
        let (hub, _polls, metrics) = hub(2, NO_HISTORY);
        sub(&hub, 1, &["a"], Since::Now);
        sub(&hub, 1, &["a"], Since::Now);
        let r = hub.publish(&[text("a", "1"), text("b", "x"), text("a", "2")]);
        assert_eq!(
            r.iter().map(|r| r.subscribers).collect::<Vec<_>>(),
            vec![2, 0, 2]
        );
        assert!(seq(&r[0].id) < seq(&r[1].id) && seq(&r[1].id) < seq(&r[2].id));
        assert!(r[0].id.starts_with(hub.epoch()));
        let mut got = Vec::new();
        hub.inboxes[0].take(&mut got);
        assert!(got.is_empty(), "worker 0 has no subscriber");
        hub.inboxes[1].take(&mut got);
        assert_eq!(payloads(&got), vec!["1", "2"]);
        assert_eq!(metrics.topics.load(Relaxed), 1);
        assert_eq!(metrics.subscriptions.load(Relaxed), 2);
        hub.unsubscribe(1, "a");
        hub.unsubscribe(1, "a");
        hub.unsubscribe(1, "a");
        assert_eq!(metrics.topics.load(Relaxed), 0);
        assert_eq!(metrics.subscriptions.load(Relaxed), 0);
        assert_eq!(hub.publish(&[text("a", "3")])[0].subscribers, 0);
    }

    #[test]
    fn concurrent_publishers_are_seen_in_one_order_by_every_worker() {
        let (hub, _polls, _) = hub(3, NO_HISTORY);
        for w in 0..3 {
            sub(&hub, w, &["t"], Since::Now);
        }
        let hub = Arc::new(hub);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let hub = Arc::clone(&hub);
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        hub.publish(&[text("t", "m")]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("publisher");
        }
        let ids: Vec<Vec<u64>> = (0..3)
            .map(|w| {
                let mut got = Vec::new();
                hub.inboxes[w].take(&mut got);
                got.iter().map(|p| p.id).collect()
            })
            .collect();
        assert_eq!(ids[0].len(), 2000);
        assert!(
            ids[0].windows(2).all(|w| w[0] < w[1]),
            "ids increase in delivery order"
        );
        assert_eq!(ids[0], ids[1]);
        assert_eq!(ids[1], ids[2]);
    }

    const HISTORY: HistoryLimits = HistoryLimits {
        per_topic: 3,
        ttl: 3600,
        max_bytes: 1 << 20,
    };

    #[test]
    fn resume_replays_exactly_what_was_missed() {
        let (hub, _polls, metrics) = hub(1, HISTORY);
        let r = hub.publish(&[
            text("a", "1"),
            text("b", "x"),
            text("a", "2"),
            text("a", "3"),
        ]);
        // Nobody subscribed, yet history holds them.
        assert_eq!(metrics.history_messages.load(Relaxed), 4);
        let s = sub(&hub, 0, &["a"], Since::Id(&r[0].id));
        assert!(s.gaps.is_empty());
        assert_eq!(payloads(&s.replay), vec!["2", "3"]);
        assert_eq!(s.position, r[3].id);
        // From the latest id: nothing to replay, nothing missed.
        let s = sub(&hub, 0, &["a"], Since::Id(&r[3].id));
        assert!(s.replay.is_empty() && s.gaps.is_empty());
        // Several topics: one merged replay in publish order.
        let s = sub(
            &hub,
            0,
            &["b", "a"],
            Since::Id(&format!("{}-0", hub.epoch())),
        );
        assert_eq!(payloads(&s.replay), vec!["1", "x", "2", "3"]);
        assert!(s.gaps.is_empty(), "nothing was trimmed yet");
        assert_eq!(metrics.resumes.load(Relaxed), 3);
    }

    #[test]
    fn trimmed_history_and_other_epochs_are_reported_as_gaps() {
        let (hub, _polls, metrics) = hub(1, HISTORY);
        let r = hub.publish(&[
            text("a", "1"),
            text("a", "2"),
            text("a", "3"),
            text("a", "4"),
            text("a", "5"),
        ]);
        // Three kept: 3, 4, 5. Resuming from 1 missed 2.
        let s = sub(&hub, 0, &["a"], Since::Id(&r[0].id));
        assert_eq!(s.gaps.len(), 1);
        assert_eq!(s.gaps[0].reason, GapReason::Trimmed);
        assert_eq!(payloads(&s.replay), vec!["3", "4", "5"]);
        // Resuming from 2 is complete: 3, 4 and 5 are all there.
        let s = sub(&hub, 0, &["a"], Since::Id(&r[1].id));
        assert!(s.gaps.is_empty());
        assert_eq!(payloads(&s.replay), vec!["3", "4", "5"]);
        // Another epoch, an id from the future, or garbage: gap, then everything held.
        for bad in ["zzz-2", &format!("{}-99", hub.epoch()), "garbage"] {
            let s = sub(&hub, 0, &["a"], Since::Id(bad));
            assert_eq!(s.gaps[0].reason, GapReason::Epoch, "{bad}");
            assert_eq!(s.gaps[0].since, bad);
            assert_eq!(payloads(&s.replay), vec!["3", "4", "5"]);
        }
        assert_eq!(metrics.resume_gaps.load(Relaxed), 4);
        assert_eq!(metrics.evicted_count.load(Relaxed), 2);
    }

    #[test]
    fn a_forgotten_topic_reports_a_gap_instead_of_silence() {
        let (hub, _polls, _) = hub(1, HISTORY);
        let r = hub.publish(&[text("a", "1")]);
        let s = sub(&hub, 0, &["b"], Since::Now);
        assert!(s.replay.is_empty());
        hub.publish(&[text("b", "2")]);
        // History of b is trimmed away and the topic forgotten entirely (no subscriber left).
        hub.unsubscribe(0, "b");
        {
            let mut st = lock(&hub.state);
            st.trim_front("b", Eviction::Memory, &hub.metrics);
            assert!(!st.topics.contains_key("b"));
        }
        // A client that last saw message 1 may have missed "2" on b: it must be told.
        let s = sub(&hub, 0, &["b"], Since::Id(&r[0].id));
        assert_eq!(s.gaps.len(), 1);
        assert_eq!(s.gaps[0].reason, GapReason::Trimmed);
    }

    #[test]
    fn memory_cap_evicts_oldest_first_across_topics() {
        let probe = Published::new("a".into(), 1, "e".into(), DataKind::Text, None, 0, b"x");
        let cost = probe.cost();
        let limits = HistoryLimits {
            per_topic: 100,
            ttl: 3600,
            max_bytes: 3 * cost,
        };
        let (hub, _polls, metrics) = hub(1, limits);
        let r = hub.publish(&[
            text("a", "1"),
            text("b", "2"),
            text("a", "3"),
            text("b", "4"),
        ]);
        assert_eq!(metrics.history_messages.load(Relaxed), 3);
        assert_eq!(metrics.evicted_memory.load(Relaxed), 1);
        assert!(metrics.history_bytes.load(Relaxed) <= 3 * cost as u64);
        let s = sub(
            &hub,
            0,
            &["a", "b"],
            Since::Id(&format!("{}-0", hub.epoch())),
        );
        assert_eq!(payloads(&s.replay), vec!["2", "3", "4"]);
        assert_eq!(s.gaps.len(), 1, "only a lost a message");
        assert_eq!(&*s.gaps[0].topic, "a");
        let s = sub(&hub, 0, &["a", "b"], Since::Id(&r[0].id));
        assert!(s.gaps.is_empty());
    }

    #[test]
    fn order_queue_stays_bounded_under_count_trimming() {
        let (hub, _polls, _) = hub(1, HISTORY);
        for _ in 0..10_000 {
            hub.publish(&[text("a", "m")]);
        }
        let st = lock(&hub.state);
        assert_eq!(st.held_messages, 3);
        assert!(st.order.len() <= 2 * 3 + 1024 + 1, "{}", st.order.len());
    }

    #[test]
    fn without_history_every_resume_that_may_have_missed_something_is_a_gap() {
        let (hub, _polls, _) = hub(1, NO_HISTORY);
        let r = hub.publish(&[text("a", "1")]);
        hub.publish(&[text("b", "nobody listening")]);
        let s = sub(&hub, 0, &["b"], Since::Id(&r[0].id));
        assert_eq!(s.gaps.len(), 1);
        assert_eq!(s.gaps[0].reason, GapReason::Trimmed);
        assert!(s.replay.is_empty());
        let now = s.position.clone();
        let s = sub(&hub, 0, &["b"], Since::Id(&now));
        assert!(s.gaps.is_empty(), "nothing published since");
    }

    #[test]
    fn subscribe_takes_what_was_queued_before_it() {
        let (hub, _polls, _) = hub(1, NO_HISTORY);
        sub(&hub, 0, &["a"], Since::Now);
        hub.publish(&[text("a", "early")]);
        let mut pending = Vec::new();
        hub.subscribe(0, &["a"], Since::Now, &mut pending);
        assert_eq!(payloads(&pending), vec!["early"]);
        hub.publish(&[text("a", "late")]);
        let mut got = Vec::new();
        hub.inboxes[0].take(&mut got);
        assert_eq!(payloads(&got), vec!["late"]);
    }
}
