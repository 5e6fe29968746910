//! Following one topic's live sequence, sans-IO: the ordering, hole, epoch and gap rules of the
//! Redis broker's reader ([`super::link`]), as a state machine that takes events and returns
//! actions. It owns no clock, lock, thread or connection: the reader thread hands it what it
//! read (a live message, the topic's position, a stream range) and carries its actions out
//! (hand messages to the workers, send a gap notice, read a range of the stream, wake a
//! resume that waits), the way tungstenite keeps a protocol's state apart from the stream it
//! is handed.
//!
//! The rules (`docs/cluster.md`, "Live order"):
//! - a topic's messages are delivered in offset order, each once: the next one must be the
//!   last delivered plus one;
//! - a hole before a message (pub/sub is at-most-once: a reconnect, an output buffer limit) is
//!   filled from the stream; what the stream no longer holds, or what cannot be read, is
//!   announced with a `trimmed` gap notice, never skipped silently;
//! - a message of another epoch (Redis lost the topic's history) is announced with an `epoch`
//!   gap notice and starts the count again;
//! - at most `MAX_HELD` messages wait behind a hole; past that the hole is announced and
//!   delivery goes on, so a stalled fill cannot grow memory.
//!
//! Messages arrive in channel order, so what waits (`held`) is always in chronological order:
//! runs of one epoch each, ascending within a run, possibly repeating what a fill brought.
//! A fill answers the range right after the last delivered message, so it goes in front.

use std::sync::Arc;

use crate::message::{GapReason, Published};

/// A message of a followed topic, as the follower sees it: its epoch and offset.
pub(super) trait Sequenced: Clone {
    /// The history (epoch) the message belongs to.
    fn epoch(&self) -> &Arc<str>;
    /// Its offset in that history, from 1.
    fn offset(&self) -> u64;
}

impl Sequenced for Arc<Published> {
    fn epoch(&self) -> &Arc<str> {
        &self.epoch
    }
    fn offset(&self) -> u64 {
        self.id
    }
}

/// What the follower asks its caller to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action<M> {
    /// Hand the message to the topic's subscribers.
    Deliver(M),
    /// Tell the topic's subscribers that what follows `since_epoch-since_last` up to
    /// `epoch-at` is lost (`reason`); they stand at `epoch-at` afterwards.
    Gap {
        since_epoch: Arc<str>,
        since_last: u64,
        reason: GapReason,
        epoch: Arc<str>,
        at: u64,
    },
    /// Read offsets `from..=to` of `epoch` from the topic's stream and hand the answer to
    /// [`Follower::filled`].
    Fill { epoch: Arc<str>, from: u64, to: u64 },
    /// A hole was filled from the stream (counted in the metrics).
    HoleFilled,
    /// Something was delivered or the topic became ready: a resume waiting for this node to
    /// reach an id may go on.
    Wake,
}

/// What a stream read ([`Action::Fill`]) found.
#[derive(Debug, Clone)]
pub(super) enum Read<M> {
    /// The epoch Redis holds now, and the entries of the range it still has.
    Range {
        epoch: Option<Arc<str>>,
        msgs: Vec<M>,
    },
    /// The read failed (the caller logs why).
    Failed,
}

/// One followed topic's sequence (see the module doc).
#[derive(Debug)]
pub(super) struct Follower<M, const MAX_HELD: usize> {
    /// The epoch and offset delivered last, known once the topic is ready.
    epoch: Option<Arc<str>>,
    last: u64,
    /// The topic's position is known: live messages can be delivered.
    ready: bool,
    /// Messages that arrived before the topic was ready, or behind a hole being filled. Boxed:
    /// most topics never hold anything back (in-order messages skip it), and a followed
    /// topic's record stays small (`size_tests` in [`super`]).
    #[allow(
        clippy::box_collection,
        reason = "a thin pointer keeps the followed topic's record within its size test"
    )]
    held: Option<Box<Vec<M>>>,
    /// A fill of the hole before `held` has been asked for and not answered.
    filling: bool,
    /// Positioned before: its subscribers stand at `epoch-last`, even when that is "nothing
    /// published yet" (`None` epoch).
    known: bool,
}

impl<M: Sequenced, const MAX_HELD: usize> Follower<M, MAX_HELD> {
    /// A topic not positioned yet.
    pub(super) fn new() -> Self {
        Follower {
            epoch: None,
            last: 0,
            ready: false,
            held: None,
            filling: false,
            known: false,
        }
    }

    /// Whether the topic's position is known (live messages are delivered).
    pub(super) fn ready(&self) -> bool {
        self.ready
    }

    /// The epoch and offset delivered last (`None` epoch: nothing known yet).
    pub(super) fn position(&self) -> (Option<&Arc<str>>, u64) {
        (self.epoch.as_ref(), self.last)
    }

    /// The subscription was lost (the connection dropped, or Redis dropped the subscription
    /// when the slot moved): live messages stop until [`Follower::positioned`] again, and a
    /// fill asked for is not coming (the caller's requests went with the connection).
    pub(super) fn reset(&mut self) {
        self.ready = false;
        self.filling = false;
    }

    /// The node let go of the topic (its last subscriber left): what waits is dropped, and
    /// the topic is positioned again if it is followed again.
    pub(super) fn let_go(&mut self) {
        self.reset();
        self.held = None;
    }

    /// A live message.
    pub(super) fn live(&mut self, m: M, out: &mut Vec<Action<M>>) {
        let waiting = self.held.as_ref().is_some_and(|h| !h.is_empty());
        if self.ready
            && !waiting
            && self.epoch.as_deref() == Some(&**m.epoch())
            && m.offset() == self.last + 1
        {
            // The usual case: the next message, nothing held back (what `drain` would do).
            self.last = m.offset();
            out.push(Action::Deliver(m));
            out.push(Action::Wake);
            return;
        }
        let held = self.held.get_or_insert_with(Box::default);
        held.push(m);
        if self.ready {
            self.drain(out);
        } else if held.len() > MAX_HELD {
            // Not positioned yet: the oldest goes; the position's fill covers it.
            held.remove(0);
        }
    }

    /// Where Redis says the topic stands (its epoch and last offset), read after the
    /// subscription was confirmed. Ignored when the topic is ready already.
    pub(super) fn positioned(
        &mut self,
        epoch: Option<Arc<str>>,
        last: u64,
        out: &mut Vec<Action<M>>,
    ) {
        if self.ready {
            return;
        }
        match (&self.epoch, epoch) {
            // Followed before, same history: fill what was published meanwhile.
            (Some(ours), Some(now)) if **ours == *now => {
                if last > self.last && !self.filling {
                    self.filling = true;
                    out.push(Action::Fill {
                        epoch: now,
                        from: self.last + 1,
                        to: last,
                    });
                }
            }
            // Followed before, and Redis now has another history (or none yet): the next
            // message, of a new epoch, brings the gap notice (see `drain`).
            (Some(_), _) => {}
            // Followed before, when nothing was published: everything of the first epoch is
            // new to its subscribers. Before, the topic took Redis's position as if new here,
            // and what was published while the link was down was skipped without a notice.
            (None, Some(now)) if self.known => {
                self.epoch = Some(Arc::clone(&now));
                self.last = 0;
                if last > 0 && !self.filling {
                    self.filling = true;
                    out.push(Action::Fill {
                        epoch: now,
                        from: 1,
                        to: last,
                    });
                }
            }
            // New here: everything after Redis's current position is live.
            (None, now) => {
                self.epoch = now;
                self.last = last;
            }
        }
        self.ready = true;
        self.known = true;
        self.drain(out);
        out.push(Action::Wake);
    }

    /// The answer to an [`Action::Fill`] of `epoch`, `from..=to`.
    pub(super) fn filled(
        &mut self,
        epoch: &Arc<str>,
        from: u64,
        to: u64,
        read: Read<M>,
        out: &mut Vec<Action<M>>,
    ) {
        self.filling = false;
        if self.epoch.as_deref() != Some(&**epoch) || self.last + 1 != from {
            // Overtaken (a gap notice or another fill moved the position on).
            self.drain(out);
            return;
        }
        match read {
            Read::Range {
                epoch: Some(now),
                mut msgs,
            } if *now == **epoch => {
                let complete = msgs.len() as u64 == to - from + 1
                    && msgs.first().is_some_and(|m| m.offset() == from);
                if complete {
                    out.push(Action::HoleFilled);
                    // The range comes right after the last delivered message: in front.
                    if let Some(held) = self.held.as_mut() {
                        msgs.append(held);
                    }
                    self.held = Some(Box::new(msgs));
                } else {
                    self.lost(Arc::clone(epoch), to, out);
                }
            }
            // Redis holds another history now (or none): the rest of this epoch can never be
            // read, so the hole is announced; the new epoch's first message says the rest.
            // A read that failed is announced the same way.
            Read::Range { .. } | Read::Failed => self.lost(Arc::clone(epoch), to, out),
        }
        self.drain(out);
    }

    /// Announces that everything after the last delivered message up to `epoch-at` is lost.
    fn lost(&mut self, epoch: Arc<str>, at: u64, out: &mut Vec<Action<M>>) {
        let since_epoch = self.epoch.clone().unwrap_or_else(|| Arc::clone(&epoch));
        out.push(Action::Gap {
            since_epoch,
            since_last: self.last,
            reason: GapReason::Trimmed,
            epoch: Arc::clone(&epoch),
            at,
        });
        self.epoch = Some(epoch);
        self.last = at;
        self.filling = false;
    }

    /// Delivers what is held as far as it continues the sequence; asks for a fill at the first
    /// hole; gives up on a hole (with a gap notice) when too much waits behind it.
    fn drain(&mut self, out: &mut Vec<Action<M>>) {
        let Some(mut held) = self.held.take() else {
            return;
        };
        let mut i = 0;
        let mut delivered = false;
        while let Some(m) = held.get(i).cloned() {
            if self.epoch.as_deref() != Some(&**m.epoch()) {
                // Redis lost the topic's history and began a new epoch (or this is the first
                // message of a topic that had none).
                if let Some(old) = self.epoch.take() {
                    out.push(Action::Gap {
                        since_epoch: old,
                        since_last: self.last,
                        reason: GapReason::Epoch,
                        epoch: Arc::clone(m.epoch()),
                        at: 0,
                    });
                }
                self.epoch = Some(Arc::clone(m.epoch()));
                self.last = 0;
                self.filling = false;
            }
            let id = m.offset();
            if id <= self.last {
                i += 1;
                continue;
            }
            if id == self.last + 1 {
                self.last = id;
                out.push(Action::Deliver(m));
                delivered = true;
                i += 1;
                continue;
            }
            // A hole before m.
            if held.len() - i > MAX_HELD {
                self.lost(Arc::clone(m.epoch()), id - 1, out);
                continue;
            }
            if !self.filling {
                self.filling = true;
                out.push(Action::Fill {
                    epoch: Arc::clone(m.epoch()),
                    from: self.last + 1,
                    to: id - 1,
                });
            }
            break;
        }
        held.drain(..i.min(held.len()));
        self.held = Some(held);
        if delivered {
            out.push(Action::Wake);
        }
    }
}

#[cfg(test)]
#[path = "follow_tests.rs"]
mod tests;
