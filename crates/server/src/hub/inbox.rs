//! A worker's mailbox: published messages waiting to be written, and the waker of its loop.
//!
//! Whoever delivers (the broker) appends; only the owning worker takes. Lock order: the
//! broker's lock before any inbox's; a worker never takes the broker's lock while holding its
//! inbox's.

use std::sync::{Arc, Mutex};

use super::lock;
use crate::message::Published;

/// One worker's mailbox.
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
    pub(crate) fn push(&self, msgs: impl Iterator<Item = Arc<Published>>) {
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
