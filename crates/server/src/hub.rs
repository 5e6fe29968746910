//! The hub: where publishes meet subscribers across worker threads.
//!
//! The hub knows, for every topic, how many subscribers each worker holds; it does not know which
//! connections they are (each worker keeps its own index, see [`crate::worker::index`]). A publish
//! takes the hub lock once: it assigns the message id, encodes the frame once, and appends one
//! shared [`Published`] to the inbox of every worker that has a subscriber. Holding the lock while
//! enqueueing is what makes delivery order equal publish order on every worker.
//!
//! Lock order: `Hub::state` before any `Inbox::queue`. Workers never take the hub lock while
//! holding their inbox lock.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use base64::Engine as _;
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::{DataKind, OpCode};

use crate::metrics::Metrics;

/// Longest topic name, in bytes. Long enough for `tenant:room/sub-room@region` shapes, short
/// enough that a subscriber index entry stays small.
pub const MAX_TOPIC_LEN: usize = 128;

/// Why a topic name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// The name is empty.
    #[error("topic name is empty")]
    Empty,
    /// The name is longer than [`MAX_TOPIC_LEN`] bytes.
    #[error("topic name longer than 128 bytes")]
    TooLong,
    /// The name has a byte outside `[A-Za-z0-9_.:@/-]`.
    #[error("topic name may only contain A-Z a-z 0-9 _ . : @ / -")]
    BadChar,
}

/// Checks a topic name: 1 to 128 bytes of `[A-Za-z0-9_.:@/-]`. The charset is URL- and
/// JSON-safe, so a name never needs escaping in a query string, a path or an envelope.
pub fn validate_topic(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::Empty);
    }
    if name.len() > MAX_TOPIC_LEN {
        return Err(TopicError::TooLong);
    }
    let ok =
        |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'@' | b'/' | b'-');
    if name.bytes().all(ok) {
        Ok(())
    } else {
        Err(TopicError::BadChar)
    }
}

/// One published message, encoded once and shared by every worker and every backlog.
pub struct Published {
    /// The topic it was published to.
    pub topic: Arc<str>,
    /// Its id: increases with publish order (within a topic and across topics).
    pub id: u64,
    /// Text or binary, as published.
    pub kind: DataKind,
    /// The payload as a complete WebSocket frame, sent to plain subscribers.
    pub frame: Arc<[u8]>,
    /// The `clarion.v1` envelope frame, encoded the first time an envelope subscriber needs it.
    envelope: OnceLock<Arc<[u8]>>,
}

impl Published {
    fn new(topic: Arc<str>, id: u64, kind: DataKind, payload: &[u8]) -> Published {
        let opcode = match kind {
            DataKind::Text => OpCode::Text,
            DataKind::Binary => OpCode::Binary,
        };
        Published {
            topic,
            id,
            kind,
            frame: encode_frame(opcode, payload).into(),
            envelope: OnceLock::new(),
        }
    }

    /// The payload, without its frame header.
    pub fn payload(&self) -> &[u8] {
        let header = match self.frame.get(1).map(|b| b & 0x7f) {
            Some(126) => 4,
            Some(127) => 10,
            _ => 2,
        };
        self.frame.get(header..).unwrap_or_default()
    }

    /// The envelope frame: `{"type":"message","topic":..,"id":"N","data":..}`, binary payloads
    /// base64-encoded with `"encoding":"base64"`. See `docs/protocol.md`.
    pub fn envelope(&self) -> &Arc<[u8]> {
        self.envelope.get_or_init(|| {
            let payload = self.payload();
            let id = self.id.to_string();
            let json = match self.kind {
                // The payload was validated as UTF-8 when it was published.
                DataKind::Text => serde_json::json!({
                    "type": "message", "topic": &*self.topic, "id": id,
                    "data": String::from_utf8_lossy(payload),
                }),
                DataKind::Binary => serde_json::json!({
                    "type": "message", "topic": &*self.topic, "id": id, "encoding": "base64",
                    "data": base64::engine::general_purpose::STANDARD.encode(payload),
                }),
            };
            encode_frame(OpCode::Text, json.to_string().as_bytes()).into()
        })
    }
}

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

/// Subscriber counts of one topic, per worker.
struct TopicEntry {
    per_worker: Box<[u32]>,
    total: u64,
}

struct State {
    topics: HashMap<Arc<str>, TopicEntry>,
    next_id: u64,
}

/// A message to publish: topic, kind and payload (validated by the caller).
pub struct Outgoing<'a> {
    /// A topic name that passed [`validate_topic`].
    pub topic: &'a str,
    /// Text (valid UTF-8) or binary.
    pub kind: DataKind,
    /// The message itself.
    pub payload: &'a [u8],
}

/// What a publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The id given to the message.
    pub id: u64,
    /// How many subscribers it was handed to.
    pub subscribers: u64,
}

/// Shared by the API, every worker, and in-band publishers.
pub struct Hub {
    state: Mutex<State>,
    inboxes: Vec<Arc<Inbox>>,
    metrics: Arc<Metrics>,
}

impl Hub {
    /// A hub for workers `0..inboxes.len()`.
    pub fn new(inboxes: Vec<Arc<Inbox>>, metrics: Arc<Metrics>) -> Hub {
        Hub {
            state: Mutex::new(State {
                topics: HashMap::new(),
                next_id: 1,
            }),
            inboxes,
            metrics,
        }
    }

    /// Wakes every worker (used to announce shutdown).
    pub fn wake_all(&self) {
        for inbox in &self.inboxes {
            inbox.wake();
        }
    }

    /// Records that `worker` gained a subscriber to `topic`. Returns the shared name, which the
    /// worker keeps in its index so it matches published messages without copying.
    pub fn subscribe(&self, worker: usize, topic: &str) -> Arc<str> {
        let mut st = lock(&self.state);
        let workers = self.inboxes.len();
        let (name, entry) = match st.topics.get_key_value(topic) {
            Some((k, _)) => {
                let k = Arc::clone(k);
                let e = st.topics.get_mut(&*k);
                (k, e)
            }
            None => {
                let k: Arc<str> = topic.into();
                st.topics.insert(
                    Arc::clone(&k),
                    TopicEntry {
                        per_worker: vec![0; workers].into_boxed_slice(),
                        total: 0,
                    },
                );
                self.metrics.topics.fetch_add(1, Relaxed);
                let e = st.topics.get_mut(&*k);
                (k, e)
            }
        };
        if let Some(e) = entry {
            if let Some(n) = e.per_worker.get_mut(worker) {
                *n += 1;
                e.total += 1;
            }
        }
        self.metrics.subscriptions.fetch_add(1, Relaxed);
        name
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
        if e.total == 0 {
            st.topics.remove(topic);
            self.metrics.topics.fetch_sub(1, Relaxed);
        }
    }

    /// Publishes messages in order, under one lock acquisition, waking each interested worker
    /// once. Returns one receipt per message.
    pub fn publish(&self, msgs: &[Outgoing<'_>]) -> Vec<Receipt> {
        let mut receipts = Vec::with_capacity(msgs.len());
        // Per worker, the messages it must deliver, so each inbox is locked and woken once.
        let mut per_worker: Vec<Vec<Arc<Published>>> = vec![Vec::new(); self.inboxes.len()];
        let mut st = lock(&self.state);
        for m in msgs {
            let id = st.next_id;
            st.next_id += 1;
            let (name, entry) = match st.topics.get_key_value(m.topic) {
                Some((k, e)) => (Arc::clone(k), Some(e)),
                None => (Arc::from(m.topic), None),
            };
            let subscribers = entry.map_or(0, |e| e.total);
            receipts.push(Receipt { id, subscribers });
            let Some(entry) = entry else { continue };
            let published = Arc::new(Published::new(name, id, m.kind, m.payload));
            for (w, n) in entry.per_worker.iter().enumerate() {
                if *n > 0 {
                    if let Some(list) = per_worker.get_mut(w) {
                        list.push(Arc::clone(&published));
                    }
                }
            }
        }
        for (inbox, list) in self.inboxes.iter().zip(per_worker) {
            if !list.is_empty() {
                inbox.push(list.into_iter());
            }
        }
        drop(st);
        self.metrics.published.fetch_add(msgs.len() as u64, Relaxed);
        receipts
    }
}

/// Locks a mutex, recovering the data if another thread panicked while holding it: the hub's
/// state stays consistent across a panic because every update is a single counter change.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert_eq!(validate_topic("prices.eu:BTC/EUR@x-1_y"), Ok(()));
        assert_eq!(validate_topic(""), Err(TopicError::Empty));
        assert_eq!(validate_topic(&"a".repeat(128)), Ok(()));
        assert_eq!(validate_topic(&"a".repeat(129)), Err(TopicError::TooLong));
        for bad in ["a b", "a\"", "é", "a?b", "a#", "a%20"] {
            assert_eq!(validate_topic(bad), Err(TopicError::BadChar), "{bad}");
        }
    }

    #[test]
    fn envelope_escapes_and_encodes() {
        let p = Published::new("t".into(), 7, DataKind::Text, "a\"b\n".as_bytes());
        assert_eq!(p.payload(), b"a\"b\n");
        let env = p.envelope();
        let json: serde_json::Value = serde_json::from_slice(&env[2..]).expect("json");
        assert_eq!(json["data"], "a\"b\n");
        assert_eq!(json["id"], "7");
        let b = Published::new("t".into(), 8, DataKind::Binary, &[0, 1, 255]);
        let env = b.envelope();
        let json: serde_json::Value = serde_json::from_slice(&env[2..]).expect("json");
        assert_eq!(json["encoding"], "base64");
        assert_eq!(json["data"], "AAH/");
        let big = Published::new("t".into(), 9, DataKind::Binary, &[7u8; 300]);
        assert_eq!(big.payload(), &[7u8; 300][..]);
    }

    fn hub(workers: usize) -> (Hub, Vec<mio::Poll>, Arc<Metrics>) {
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
        (Hub::new(inboxes, Arc::clone(&metrics)), polls, metrics)
    }

    fn text<'a>(topic: &'a str, payload: &'a str) -> Outgoing<'a> {
        Outgoing {
            topic,
            kind: DataKind::Text,
            payload: payload.as_bytes(),
        }
    }

    #[test]
    fn publish_reaches_only_workers_with_subscribers_in_order() {
        let (hub, _polls, metrics) = hub(2);
        hub.subscribe(1, "a");
        hub.subscribe(1, "a");
        let r = hub.publish(&[text("a", "1"), text("b", "x"), text("a", "2")]);
        assert_eq!(
            r.iter().map(|r| r.subscribers).collect::<Vec<_>>(),
            vec![2, 0, 2]
        );
        assert!(r[0].id < r[1].id && r[1].id < r[2].id);
        let mut got = Vec::new();
        hub.inboxes[0].take(&mut got);
        assert!(got.is_empty(), "worker 0 has no subscriber");
        hub.inboxes[1].take(&mut got);
        let payloads: Vec<&[u8]> = got.iter().map(|p| p.payload()).collect();
        assert_eq!(payloads, vec![b"1", b"2"]);
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
        let (hub, _polls, _) = hub(3);
        for w in 0..3 {
            hub.subscribe(w, "t");
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
}
