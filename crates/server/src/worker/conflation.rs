//! Conflation's part of the worker (docs/conflation.md): the backlogs of subscribers that fell
//! behind on a conflating topic, fed by fan-out instead of their output buffer, and written out
//! as their sockets drain, each replaced message after its `conflated` notice.
//!
//! A subscriber of a topic matching `conflate_topics` whose unsent bytes reach the rule's
//! `threshold` gets that topic's new messages in a [`ConflateQueue`] (one per subscriber and
//! topic, at most `max_keys` messages: the latest per key). While anything is queued, newer
//! messages of the topic queue behind it, so the subscriber's order stays the queue's. When its
//! socket has taken every byte of its output buffer, the next queued message is written (one
//! at a time: what is written can no longer be replaced; for an HTTP/2 stream: when its
//! connection's pump has framed its bytes). A message that finds the queue full ends
//! the subscriber as a slow consumer, as the cap does on other topics.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::conflate::{ConflateQueue, Item, Push};
use clarion_proto::ws::OpCode;

use super::socket::Socket;
use super::Engine;
use crate::config::conflate::Rule;
use crate::message::{Encoding, Published};
use crate::worker::transport::frame::{opcode_of, pick, Delivery, End, Event, Form, Framing};

/// One subscriber's conflating backlogs, one per topic it is behind on.
#[derive(Default)]
pub(crate) struct Backlogs {
    topics: Vec<TopicBacklog>,
}

struct TopicBacklog {
    /// The topic's id in the worker's index.
    tid: u32,
    topic: Arc<str>,
    queue: ConflateQueue<Arc<Published>>,
}

impl Backlogs {
    /// Whether messages of topic `tid` are queued.
    pub(crate) fn has(&self, tid: u32) -> bool {
        self.topics.iter().any(|t| t.tid == tid)
    }

    /// Forgets topic `tid` (unsubscribed).
    pub(crate) fn forget_topic(&mut self, tid: u32) {
        self.topics.retain(|t| t.tid != tid);
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    fn queue(&mut self, tid: u32, topic: &Arc<str>, rule: &Rule) -> Option<&mut TopicBacklog> {
        let i = match self.topics.iter().position(|t| t.tid == tid) {
            Some(i) => i,
            None => {
                self.topics.push(TopicBacklog {
                    tid,
                    topic: Arc::clone(topic),
                    queue: ConflateQueue::new(0, rule.max_keys),
                });
                self.topics.len() - 1
            }
        };
        self.topics.get_mut(i)
    }

    /// The next message to write while `pending` bytes are unsent: its topic, the messages it
    /// replaced (0: none) and the message. Topics emptied on the way are dropped.
    fn next(&mut self, pending: usize) -> Option<(Arc<str>, u64, Arc<Published>)> {
        self.topics.retain(|t| !t.queue.is_empty());
        // Only once the output buffer is empty: a message written to it can no longer be
        // replaced, so a backlog drained up to the threshold made a slow reader read
        // `threshold` bytes of stale values before each fresh one (docs/conflation.md,
        // "Latency").
        if pending > 0 {
            return None;
        }
        let t = self.topics.first_mut()?;
        let mut skipped = 0;
        loop {
            match t.queue.poll()? {
                Item::Conflated(n) => skipped += n.skipped,
                Item::Message(m) => return Some((Arc::clone(&t.topic), skipped, m)),
            }
        }
    }
}

/// The keys of one run's messages, computed once for all its subscribers.
#[derive(Default)]
pub(crate) struct RunKeys(Vec<Option<Option<String>>>);

impl RunKeys {
    fn get(&mut self, i: usize, rule: &Rule, m: &Published) -> Option<String> {
        if self.0.len() <= i {
            self.0.resize(i + 1, None);
        }
        let key_of = || {
            if m.notice {
                None
            } else {
                rule.key.key_of(m.payload(), m.conflation_key.as_deref())
            }
        };
        match self.0.get_mut(i) {
            Some(slot) => slot.get_or_insert_with(key_of).clone(),
            None => key_of(),
        }
    }
}

impl<S: Socket> Engine<S> {
    /// Takes `run` (messages of topic `tid`, which conflates by `rule`) for subscriber `k`
    /// if it is behind on it: already something queued, or `threshold` unsent bytes with the
    /// run's. Returns
    /// whether it took the run (queued it, or ended `k` because its backlog is full).
    pub(crate) fn conflate_run(
        &mut self,
        k: u32,
        tid: u32,
        rule: &Rule,
        run: &[Arc<Published>],
        keys: &mut RunKeys,
    ) -> bool {
        let queued = self.side.conflation().get(&k).is_some_and(|b| b.has(tid));
        let Some(conn) = self.conns.get(k as usize) else {
            return false;
        };
        // Streams only (a held poll is answered with the run): a connection of its own, or an
        // HTTP/2 stream, whose bytes drain through its connection's pump (which drains this
        // backlog as it frames them, `Engine::h2_pump`).
        let writes = match Framing::of(conn.state).delivery(false) {
            Delivery::Write(_) => conn.stream.is_some() || self.side.h2_streams().contains_key(&k),
            Delivery::Answer | Delivery::Grip | Delivery::Skip => false,
        };
        if !writes {
            return false;
        }
        // Written as usual while the run leaves it below the threshold (a run can be long:
        // written at once, it could pass `max_backlog` in one go).
        let run_bytes: usize = run.iter().map(|m| m.frame.len()).sum();
        if !queued && conn.backlog_bytes().saturating_add(run_bytes) < rule.threshold {
            return false;
        }
        let Some(first) = run.first() else {
            return true;
        };
        let backlog = self.side.conflation_mut().entry(k).or_default();
        let Some(b) = backlog.queue(tid, &first.topic, rule) else {
            return false;
        };
        let (mut skipped, mut full) = (0u64, false);
        for (i, m) in run.iter().enumerate() {
            match b
                .queue
                .push_after(keys.get(i, rule, m), Arc::clone(m), m.debounce_skipped())
            {
                Push::Queued => {}
                Push::Replaced => skipped += 1,
                Push::Full(_) => {
                    full = true;
                    break;
                }
            }
        }
        let metrics = &self.shared.metrics;
        metrics.conflated_skipped.fetch_add(skipped, Relaxed);
        if full {
            // More keys than `max_keys`: the backlog is no longer bounded by them.
            self.side.conflation_mut().remove(&k);
            if let Some(conn) = self.conns.get_mut(k as usize) {
                let (state, pending) = (conn.state, conn.backlog_bytes());
                conn.discard_unstarted();
                self.end_as(k, state, End::SlowConsumer { pending });
            }
            return true;
        }
        self.conflate_drain(k);
        true
    }

    /// Writes subscriber `k`'s conflated messages while its socket takes them whole (its
    /// output buffer empty; called after fan-out and when its socket drains).
    pub(crate) fn conflate_drain(&mut self, k: u32) {
        if self.side.conflation().is_empty() {
            return;
        }
        let cfg = &self.shared.config;
        // Written only to an empty output buffer: at most one message (and its notice).
        let cap = cfg
            .max_backlog
            .saturating_add(cfg.max_message_size)
            .saturating_add(14);
        loop {
            let Some(conn) = self.conns.get(k as usize) else {
                self.side.conflation_mut().remove(&k);
                return;
            };
            let pending = conn.backlog_bytes();
            let Some(backlog) = self.side.conflation_mut().get_mut(&k) else {
                return;
            };
            let Some((topic, skipped, m)) = backlog.next(pending) else {
                if backlog.is_empty() {
                    self.side.conflation_mut().remove(&k);
                }
                return;
            };
            if !self.write_noticed(k, &topic, skipped, &m, Some(cap)) {
                // No longer a stream subscriber (closing): nothing more to write.
                self.side.conflation_mut().remove(&k);
                return;
            }
        }
    }

    /// Writes `m` to subscriber `k`, after a `conflated` notice for `skipped` messages of
    /// `topic` when there were any (on SSE then without its `id:` line: see
    /// docs/conflation.md, "Resuming"). `false` when `k` takes no written messages (a held
    /// poll, GRIP, closing): nothing is written.
    pub(crate) fn write_noticed(
        &mut self,
        k: u32,
        topic: &Arc<str>,
        skipped: u64,
        m: &Arc<Published>,
        cap: Option<usize>,
    ) -> bool {
        let Some(conn) = self.conns.get(k as usize) else {
            return false;
        };
        let framing = Framing::of(conn.state);
        let dedicated = conn
            .state
            .ws()
            .and_then(|ws| ws.deflate)
            .is_some_and(|ext| ext.dedicated())
            && self.may_dedicate(k);
        let form = match framing.delivery(dedicated) {
            Delivery::Write(form) => form,
            Delivery::Answer | Delivery::Grip | Delivery::Skip => return false,
        };
        let mut frames: Vec<Arc<[u8]>> = Vec::with_capacity(2);
        if skipped > 0 {
            let notice = Event::Conflated { topic, skipped };
            frames.extend(framing.framed(notice));
        }
        let frame = match form {
            Form::Dedicated { envelope } => {
                let (base, op) = if envelope {
                    (m.encoded(Encoding::WsEnvelope), OpCode::Text)
                } else {
                    (&m.frame, opcode_of(m.kind))
                };
                self.compress_for(k, base, op)
            }
            Form::Frame | Form::Shared(_) | Form::Deflated { .. } | Form::Pusher(_) => {
                let settings = self.frames.deflate_settings;
                let shared = pick(m, form, &settings);
                match framing {
                    // A replaced message leaves EventSource's last id where it was: a
                    // resume from there replays what this message stands for.
                    Framing::Sse(_) if skipped > 0 => without_id_line(shared),
                    Framing::Sse(_)
                    | Framing::Ws(_)
                    | Framing::Pusher(_)
                    | Framing::Lines { .. }
                    | Framing::Poll(_)
                    | Framing::Grip
                    | Framing::H2
                    | Framing::Request
                    | Framing::Closing => Arc::clone(shared),
                }
            }
        };
        frames.push(frame);
        if framing.output_is_activity() {
            if let Some(c) = self.conns.get_mut(k as usize) {
                c.last_seen = self.now;
            }
        }
        let refs: Vec<&Arc<[u8]>> = frames.iter().collect();
        self.write_all_to(k, &refs, cap);
        self.scratch.tally.delivered += 1;
        true
    }
}

/// An SSE event without its `id:` line (the first, as `sse::write_event` writes it).
fn without_id_line(event: &Arc<[u8]>) -> Arc<[u8]> {
    match event.strip_prefix(b"id:".as_slice()) {
        Some(rest) => match rest.iter().position(|&b| b == b'\n') {
            Some(nl) => Arc::from(rest.get(nl + 1..).unwrap_or_default()),
            None => Arc::clone(event),
        },
        None => Arc::clone(event),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::without_id_line;
    use std::sync::Arc;

    #[test]
    fn a_replaced_sse_event_goes_without_its_id_line() {
        let e: Arc<[u8]> = Arc::from(b"id: e-5\nevent: p\ndata: {}\n\n".as_slice());
        assert_eq!(&*without_id_line(&e), b"event: p\ndata: {}\n\n");
        let no_id: Arc<[u8]> = Arc::from(b"data: x\n\n".as_slice());
        assert_eq!(&*without_id_line(&no_id), b"data: x\n\n");
    }
}
