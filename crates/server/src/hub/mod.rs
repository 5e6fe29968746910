//! The hub: this process's pub/sub state, as the in-memory broker keeps it under its one lock.
//!
//! - [`topics`]: for every topic, how many subscribers each worker holds. Not which connections
//!   they are: each worker keeps its own index (`worker::index`).
//! - [`history`]: each topic's recent messages, bounded by count per topic, by age and by total
//!   memory, and what a resuming subscriber missed (or the gap it must be told about).
//! - [`inbox`]: a worker's mailbox of published messages, and the waker of its loop.
//!
//! [`Hub`] is plain data with no lock and no clock: the broker that owns it (`broker::local`)
//! locks it, assigns ids, passes the time in, and hands messages to the inboxes. The hub
//! knows nothing of transports, GRIP or brokers.

pub mod history;
pub mod inbox;
pub mod topics;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

pub use inbox::Inbox;
pub use topics::{TopicEntry, TopicTraffic};

/// Topics, their subscriber counts and their histories.
pub struct Hub {
    /// Every topic with a subscriber or a message in history.
    topics: HashMap<Arc<str>, TopicEntry>,
    /// Workers, each with a subscriber count in every [`TopicEntry`].
    workers: usize,
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

impl Hub {
    /// An empty hub for `workers` workers.
    pub fn new(workers: usize) -> Hub {
        Hub {
            topics: HashMap::new(),
            workers,
            order: VecDeque::new(),
            held_messages: 0,
            held_bytes: 0,
            forgotten_floor: 0,
        }
    }

    /// Messages held in history, across topics.
    pub fn held_messages(&self) -> usize {
        self.held_messages
    }

    /// Bytes held in history, as the memory cap counts them.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }
}

/// Locks a mutex, recovering the data if another thread panicked while holding it: the hub's
/// state stays consistent across a panic because every update is a single counter change.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
