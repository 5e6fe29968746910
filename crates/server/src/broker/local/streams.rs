//! Appendable messages in the in-memory broker: the open streams, their limits and timeout,
//! and how each fragment is published under the broker's one lock, so it takes its place in
//! the topic's order like a message.
//!
//! A fragment is delivered live as an `append` event ([`Published::stream_event`]). History
//! keeps each stream folded: ONE entry with its text so far, moved to its latest fragment's
//! position at every fragment (the previous entry is removed), which is the fold rule of
//! [`clarion_proto::pubsub::append`] kept as it goes. A resume after any cursor therefore
//! replays one message per stream with a fragment after it, and the client drops live appends
//! it already holds (`seq` at or below the folded one's).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::event_id;
use clarion_proto::history_log;
use clarion_proto::pubsub::append::{
    append_json, folded_json, Accumulator, AppendError, CloseReason, StreamEvent,
};

use super::{LocalBroker, State};
use crate::broker::{StreamOp, StreamReceipt, StreamRefusal, Unavailable};
use crate::config::StreamSettings;
use crate::durable;
use crate::hub::{lock, Hub};
use crate::message::Published;

/// Closed streams remembered, so a late append is told `409 closed` rather than `404`.
const CLOSED_REMEMBERED: usize = 10_000;

/// One open stream.
struct Open {
    topic: Arc<str>,
    text: Accumulator,
    /// The id of its folded entry in history, if it is kept.
    held: Option<u64>,
    /// When its last fragment came (hub clock).
    last_at: u32,
}

/// The open streams of the broker, by id (the `SEQ` of their opening publish).
#[derive(Default)]
pub(crate) struct Streams {
    pub(crate) settings: StreamSettings,
    open: HashMap<u64, Open>,
    per_topic: HashMap<Arc<str>, usize>,
    closed: HashSet<u64>,
    closed_order: VecDeque<u64>,
    /// Open streams whose history entry is still their latest fragment's `append` event: their
    /// text so far is built into it when something reads history ([`Streams::fold_pending`]).
    unfolded: HashSet<u64>,
}

/// An open stream as a hand-over carries it to the next process
/// ([`clarion_proto::handover_streams`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedStream {
    /// Its id's `SEQ`.
    pub id: u64,
    /// Its topic.
    pub topic: Arc<str>,
    /// The `SEQ` of its folded entry in history, if kept.
    pub held: Option<u64>,
    /// Fragments so far.
    pub seq: u32,
    /// Its text so far.
    pub text: String,
    /// Seconds left before `stream_timeout` closes it.
    pub left: u32,
}

/// The streams a hand-over carries: the open ones, and the ids of those closed lately (oldest
/// first), so a late append is still told `closed` after the upgrade.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    /// The open streams.
    pub open: Vec<CarriedStream>,
    /// Streams closed lately.
    pub closed: Vec<u64>,
}

impl Streams {
    /// The lowest id whose durable log segment must stay, given history's oldest held id: an
    /// open stream's entry is folded from its fragments back to its opening one.
    pub(crate) fn keep_log_from(&self, oldest_held: u64) -> u64 {
        self.open.keys().copied().fold(oldest_held, u64::min)
    }

    /// Builds the history entry (the text so far) of every open stream of `topics` (of all,
    /// with `None`) that had a fragment since it was last built: called under the broker's
    /// lock before anything reads history (a resume, a `latest` read, a hand-over, a rewrite
    /// of the durable log), so no reader sees an entry that is not the stream's text. The
    /// entry keeps its place, age and count; one that history no longer holds stays out.
    pub(crate) fn fold_pending(
        &mut self,
        hub: &mut Hub,
        epoch: &Arc<str>,
        topics: Option<&[&str]>,
    ) {
        let Streams { open, unfolded, .. } = self;
        unfolded.retain(|id| {
            let Some(o) = open.get(id) else {
                return false;
            };
            if topics.is_some_and(|t| !t.contains(&&*o.topic)) {
                return true;
            }
            if let Some(held) = o.held {
                hub.replace_held(
                    &o.topic,
                    Arc::new(folded_entry(epoch, &o.topic, held, *id, o)),
                );
            }
            false
        });
    }

    /// Forgets open stream `id` (its opening could not be recorded).
    fn forget(&mut self, id: u64) {
        self.unfolded.remove(&id);
        if let Some(o) = self.open.remove(&id) {
            if let Some(n) = self.per_topic.get_mut(&o.topic) {
                *n -= 1;
                if *n == 0 {
                    self.per_topic.remove(&o.topic);
                }
            }
        }
    }

    /// What a hand-over carries, at hub time `now`.
    pub(crate) fn carry(&self, now: u32) -> Carried {
        let mut open: Vec<CarriedStream> = self
            .open
            .iter()
            .map(|(id, o)| CarriedStream {
                id: *id,
                topic: Arc::clone(&o.topic),
                held: o.held,
                seq: o.text.seq(),
                text: o.text.text().to_owned(),
                left: self
                    .settings
                    .timeout
                    .saturating_sub(now.saturating_sub(o.last_at)),
            })
            .collect();
        open.sort_by_key(|s| s.id);
        Carried {
            open,
            closed: self.closed_order.iter().copied().collect(),
        }
    }

    fn remember_closed(&mut self, id: u64) {
        self.forget(id);
        self.closed.insert(id);
        self.closed_order.push_back(id);
        if self.closed_order.len() > CLOSED_REMEMBERED {
            if let Some(old) = self.closed_order.pop_front() {
                self.closed.remove(&old);
            }
        }
    }
}

/// Open (or just closed) stream `stream`'s history entry at position `id`: its text so far.
fn folded_entry(epoch: &Arc<str>, topic: &Arc<str>, id: u64, stream: u64, o: &Open) -> Published {
    let (id_s, stream_s) = (format!("{epoch}-{id}"), format!("{epoch}-{stream}"));
    let json = folded_json(&StreamEvent {
        topic,
        id: &id_s,
        stream: &stream_s,
        seq: o.text.seq(),
        data: o.text.text(),
        closed: o.text.closed(),
    });
    Published::stream_event(
        Arc::clone(topic),
        id,
        Arc::clone(epoch),
        o.last_at,
        true,
        &json,
    )
}

impl LocalBroker {
    /// The same broker, bounding streams by `settings`.
    pub fn streaming(mut self, settings: StreamSettings) -> LocalBroker {
        if let Ok(st) = self.state.get_mut() {
            st.streams.settings = settings;
        }
        self
    }

    /// Takes over the streams a hand-over carried (see [`Streams::carry`]), at hub time
    /// `now`: each open stream keeps its text, its fragment count and its deadline.
    pub fn carry_on(self, carried: Carried, now: u32) -> LocalBroker {
        {
            let mut st = lock(&self.state);
            for c in carried.open {
                self.take_over(&mut st, c, now);
            }
            for id in carried.closed {
                st.streams.remember_closed(id);
            }
        }
        self
    }

    /// [`LocalBroker::carry_on`] with `history_dir`, where history was read back from the log
    /// the old process closed: `logged` are the carried streams as the log folds them (held
    /// open in history, [`LocalBroker::durable_carrying`]). The log is what a later restart
    /// replays, so a stream continues from its fold; one the fold does not hold (its entry
    /// left history under the limits) continues from the carried text, which is written to
    /// the log whole first so that a later restart still folds it exactly.
    pub(crate) fn carry_on_logged(
        self,
        carried: Carried,
        logged: Vec<durable::load::OpenFold>,
        now: u32,
    ) -> LocalBroker {
        {
            let mut st = lock(&self.state);
            let mut logged: HashMap<u64, durable::load::OpenFold> =
                logged.into_iter().map(|f| (f.stream, f)).collect();
            for mut c in carried.open {
                match logged.remove(&c.id) {
                    Some(f) => {
                        if (f.seq, f.text.len()) != (c.seq, c.text.len()) {
                            crate::log::warn(format_args!(
                                "hand-over: stream {}-{} has {} fragments in the log and {} in                                  the old process; it continues from the log",
                                self.epoch, c.id, f.seq, c.seq
                            ));
                        }
                        (c.seq, c.text, c.held) = (f.seq, f.text, Some(f.held));
                    }
                    None => {
                        if let Err(e) = self.log_whole(&mut st, &c, now) {
                            crate::log::warn(format_args!(
                                "hand-over: stream {}-{} is not carried on ({e})",
                                self.epoch, c.id
                            ));
                            continue;
                        }
                    }
                }
                self.take_over(&mut st, c, now);
            }
            for id in carried.closed {
                st.streams.remember_closed(id);
            }
        }
        self
    }

    /// Writes carried stream `c`'s text so far into the log as one whole record.
    fn log_whole(&self, st: &mut State, c: &CarriedStream, now: u32) -> Result<(), String> {
        let record = history_log::StreamRecord {
            id: c.held.unwrap_or(c.id),
            unix_secs: 0,
            epoch: &self.epoch,
            topic: &c.topic,
            stream: c.id,
            seq: c.seq,
            whole: true,
            closed: None,
            data: &c.text,
        };
        match st.log.as_mut() {
            Some(log) => log
                .append_fragment(now, record)
                .map_err(|e| durable::write_failure(&e).1),
            None => Err("the log is closed".to_owned()),
        }
    }

    /// Makes carried stream `c` one of this broker's open streams, its deadline where it was.
    fn take_over(&self, st: &mut State, c: CarriedStream, now: u32) {
        let timeout = st.streams.settings.timeout;
        let (name, _) = st.hub.topic_mut(&c.topic, &self.metrics);
        *st.streams.per_topic.entry(Arc::clone(&name)).or_insert(0) += 1;
        st.streams.open.insert(
            c.id,
            Open {
                topic: name,
                text: Accumulator::resumed(c.seq, c.text),
                held: c.held,
                last_at: now.saturating_sub(timeout.saturating_sub(c.left)),
            },
        );
    }

    /// Opens or appends to a stream of `topic` with `fragment`, at hub time `now`.
    pub fn stream(
        &self,
        topic: &str,
        op: StreamOp<'_>,
        fragment: &str,
        now: u32,
    ) -> Result<StreamReceipt, StreamRefusal> {
        self.stream_keyed(topic, op, fragment, None, now)
    }

    /// [`LocalBroker::stream`] with the publisher's `Idempotency-Key`: a key this process
    /// published within `idempotency_window` (on `topic`) is answered its first receipt with
    /// `repeat`, and nothing is appended or delivered. Claimed and remembered under the lock
    /// the fragment is published under, as a publish's key is.
    pub fn stream_keyed(
        &self,
        topic: &str,
        op: StreamOp<'_>,
        fragment: &str,
        key: Option<&str>,
        now: u32,
    ) -> Result<StreamReceipt, StreamRefusal> {
        let mut st = lock(&self.state);
        if st.frozen {
            return Err(StreamRefusal::Unavailable(Unavailable::upgrading()));
        }
        let claim = st.repeats.claim_fragment(topic, key);
        if let Some((_, Some(first))) = claim {
            self.metrics.publish_repeats.fetch_add(1, Relaxed);
            return Ok(repeat_receipt(first));
        }
        let r = self.stream_locked(&mut st, topic, op, fragment, now)?;
        if let (Some((at, None)), Some(k)) = (claim, key) {
            let early = st.repeats.remember_fragment(at, topic, k, &r);
            self.metrics
                .idempotency_keys_forgotten
                .fetch_add(early as u64, Relaxed);
        }
        Ok(r)
    }

    /// The first receipt of a fragment whose `key` this process remembers on `topic` (as a
    /// repeat), without claiming anything: the NATS broker asks before it sends a fragment.
    pub fn repeated_fragment(&self, topic: &str, key: Option<&str>) -> Option<StreamReceipt> {
        let (_, first) = lock(&self.state).repeats.claim_fragment(topic, key)?;
        let first = first?;
        self.metrics.publish_repeats.fetch_add(1, Relaxed);
        Some(repeat_receipt(first))
    }

    /// Remembers the fragment answered `r`, published with `key` on `topic` (the NATS broker's
    /// half of [`LocalBroker::stream_keyed`]).
    pub fn remember_fragment(&self, topic: &str, key: &str, r: &StreamReceipt) {
        let now = std::time::Instant::now();
        let early = lock(&self.state)
            .repeats
            .remember_fragment(now, topic, key, r);
        self.metrics
            .idempotency_keys_forgotten
            .fetch_add(early as u64, Relaxed);
    }

    fn stream_locked(
        &self,
        st: &mut State,
        topic: &str,
        op: StreamOp<'_>,
        fragment: &str,
        now: u32,
    ) -> Result<StreamReceipt, StreamRefusal> {
        let limits = st.streams.settings.limits;
        let refused = |e: AppendError| match e {
            AppendError::Closed => StreamRefusal::Closed,
            AppendError::Fragments(_) | AppendError::Bytes(_) => {
                StreamRefusal::TooLarge(e.to_string())
            }
        };
        let stream = match op {
            StreamOp::Open => {
                let open = st.streams.per_topic.get(topic).copied().unwrap_or(0);
                if open >= limits.max_open_per_topic {
                    return Err(StreamRefusal::TooManyOpen(limits.max_open_per_topic));
                }
                let text = Accumulator::open(fragment, &limits).map_err(refused)?;
                let id = st.next_id;
                let (name, _) = st.hub.topic_mut(topic, &self.metrics);
                *st.streams.per_topic.entry(Arc::clone(&name)).or_insert(0) += 1;
                st.streams.open.insert(
                    id,
                    Open {
                        topic: name,
                        text,
                        held: None,
                        last_at: now,
                    },
                );
                id
            }
            StreamOp::Append { stream, done } => {
                let id = match event_id::parse(stream) {
                    Ok(p) if p.epoch == &*self.epoch => p.seq,
                    Ok(_) | Err(_) => return Err(StreamRefusal::Unknown),
                };
                let Some(o) = st.streams.open.get_mut(&id).filter(|o| &*o.topic == topic) else {
                    let closed = st.streams.closed.contains(&id);
                    return Err(if closed {
                        StreamRefusal::Closed
                    } else {
                        StreamRefusal::Unknown
                    });
                };
                o.text.append(fragment, done, &limits).map_err(refused)?;
                o.last_at = now;
                id
            }
        };
        self.emit(st, stream, fragment, now).map_err(|e| {
            // Its record is not on disk: nothing happened (the id stays used).
            match op {
                StreamOp::Open => st.streams.forget(stream),
                StreamOp::Append { .. } => {
                    if let Some(o) = st.streams.open.get_mut(&stream) {
                        o.text.take_back(fragment);
                    }
                }
            }
            StreamRefusal::Unavailable(Unavailable(e))
        })
    }

    /// Closes every stream without a fragment for `stream_timeout` seconds, each with an
    /// empty last fragment whose event says `"reason":"timeout"`.
    pub fn close_stale_streams(&self, now: u32) {
        let mut st = lock(&self.state);
        let timeout = st.streams.settings.timeout;
        let stale: Vec<u64> = st
            .streams
            .open
            .iter()
            .filter(|(_, o)| now.saturating_sub(o.last_at) >= timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Some(o) = st.streams.open.get_mut(&id) {
                o.text.close(CloseReason::Timeout);
                if let Err(e) = self.emit(&mut st, id, "", now) {
                    // Tried again at the next sweep.
                    if let Some(o) = st.streams.open.get_mut(&id) {
                        o.text.take_back("");
                    }
                    crate::log::warn(format_args!("stream timeout not recorded: {e}"));
                    continue;
                }
                self.metrics.streams_timed_out.fetch_add(1, Relaxed);
            }
        }
    }

    /// Publishes the fragment just added to open stream `stream`: takes the next id, delivers
    /// its `append` event, keeps the stream's entry in history at this fragment's position,
    /// and forgets the stream once it is closed.
    ///
    /// The entry holds the text so far only once something reads it ([`Streams::fold_pending`])
    /// or the stream closes: until then it is the fragment's own `append` event, so a
    /// fragment costs O(fragment), not a copy of the whole text.
    ///
    /// With `history_dir`, its record is written first (the closing one as the stream's whole
    /// text, so a closed stream's entry never needs its older fragments on disk); when that
    /// fails nothing is delivered and the reason is returned.
    fn emit(
        &self,
        st: &mut State,
        stream: u64,
        fragment: &str,
        now: u32,
    ) -> Result<StreamReceipt, String> {
        let id = st.next_id;
        st.next_id += 1;
        let keep = self.limits.enabled();
        let Some(o) = st.streams.open.get(&stream) else {
            return Ok(self.receipt(id, stream, 0, 0, false));
        };
        let (topic, seq, closed, held) =
            (Arc::clone(&o.topic), o.text.seq(), o.text.closed(), o.held);
        if st.durable {
            let record = history_log::StreamRecord {
                id,
                unix_secs: 0,
                epoch: &self.epoch,
                topic: &topic,
                stream,
                seq,
                whole: closed.is_some(),
                closed,
                data: if closed.is_some() {
                    o.text.text()
                } else {
                    fragment
                },
            };
            match st.log.as_mut() {
                Some(log) => log.append_fragment(now, record).map_err(|e| {
                    let (why, text) = durable::write_failure(&e);
                    self.metrics.history_write_failed(why);
                    text
                })?,
                None => return Err("the server is stopping".to_owned()),
            }
        }
        let (id_s, stream_s) = (
            format!("{}-{id}", self.epoch),
            format!("{}-{stream}", self.epoch),
        );
        let live = Arc::new(Published::stream_event(
            Arc::clone(&topic),
            id,
            Arc::clone(&self.epoch),
            now,
            false,
            &append_json(&StreamEvent {
                topic: &topic,
                id: &id_s,
                stream: &stream_s,
                seq,
                data: fragment,
                closed,
            }),
        ));
        let (name, e) = st.hub.topic_mut(&topic, &self.metrics);
        e.traffic.published += 1;
        let subscribers = e.subscribers();
        for w in e.workers_with_subscribers() {
            if let Some(inbox) = self.inboxes.get(w) {
                inbox.push(std::iter::once(Arc::clone(&live)));
            }
        }
        if let Some(o) = st.streams.open.get_mut(&stream) {
            o.held = Some(id);
            o.last_at = now;
        }
        if keep {
            let entry = match closed {
                // Its last entry: built now, once.
                Some(_) => {
                    st.streams.unfolded.remove(&stream);
                    match st.streams.open.get(&stream) {
                        Some(o) => Arc::new(folded_entry(&self.epoch, &name, id, stream, o)),
                        None => live,
                    }
                }
                None => {
                    st.streams.unfolded.insert(stream);
                    live
                }
            };
            st.hub
                .keep_replacing(&name, entry, held, &self.limits, &self.metrics);
            st.hub.enforce_limits(&self.limits, now, &self.metrics);
        } else {
            st.hub.skip(&name, id);
        }
        self.metrics.stream_fragments.fetch_add(1, Relaxed);
        if closed.is_some() {
            st.streams.remember_closed(stream);
        }
        self.rotate_log_if_due(st);
        Ok(self.receipt(id, stream, seq, subscribers, closed.is_some()))
    }

    fn receipt(
        &self,
        id: u64,
        stream: u64,
        seq: u32,
        subscribers: u64,
        done: bool,
    ) -> StreamReceipt {
        StreamReceipt {
            id: format!("{}-{id}", self.epoch),
            stream: format!("{}-{stream}", self.epoch),
            seq,
            subscribers,
            done,
            repeat: false,
        }
    }
}

/// What a repeated `Idempotency-Key` answers: the first attempt's receipt (a message's
/// record, reused by a fragment, has no stream: its stream is empty and `seq` 0).
pub(crate) fn repeat_receipt(first: clarion_proto::pubsub::Recorded) -> StreamReceipt {
    let (stream, seq, done) = first.fragment.unwrap_or_default();
    StreamReceipt {
        id: first.id,
        stream,
        seq,
        subscribers: 0,
        done,
        repeat: true,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::broker::{Outgoing, Since};
    use crate::config::{HistoryLimits, StreamSettings};
    use crate::hub::Inbox;
    use crate::metrics::Metrics;
    use clarion_proto::ws::DataKind;

    fn broker() -> (LocalBroker, mio::Poll) {
        let poll = mio::Poll::new().expect("poll");
        let waker = mio::Waker::new(poll.registry(), mio::Token(0)).expect("waker");
        let limits = HistoryLimits {
            per_topic: 100,
            ttl: 3600,
            max_bytes: 1 << 20,
        };
        let b = LocalBroker::new(
            vec![Arc::new(Inbox::new(waker))],
            Arc::new(Metrics::default()),
            limits,
        );
        (b, poll)
    }

    fn texts(b: &LocalBroker, since: &str) -> Vec<String> {
        b.read_since(&["t"], Since::Id(since))
            .replay
            .iter()
            .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
            .collect()
    }

    #[test]
    fn history_holds_one_entry_per_stream_with_its_text_at_its_latest_fragment() {
        let (b, _poll) = broker();
        let open = b.stream("t", StreamOp::Open, "He", 0).unwrap();
        let plain = b.publish(&[Outgoing {
            tags: &[],
            conflation_key: None,
            topic: "t",
            kind: DataKind::Text,
            payload: b"plain",
            event: None,
            attachment: None,
            key: None,
        }]);
        let append = |frag: &str, done: bool| {
            let op = StreamOp::Append {
                stream: &open.stream,
                done,
            };
            b.stream("t", op, frag, 0).unwrap()
        };
        let second = append("llo", false);
        append(" wor", false);
        let last = append("ld", true);
        assert_eq!((last.seq, last.done), (4, true));
        let start = format!("{}-0", b.epoch());
        let all = texts(&b, &start);
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0], "plain");
        assert!(
            all[1].contains(r#""seq":4,"data":"Hello world","done":true"#),
            "{all:?}"
        );
        assert_eq!(texts(&b, &plain[0].id).len(), 1);
        assert_eq!(texts(&b, &second.id).len(), 1);
        assert!(texts(&b, &last.id).is_empty());
        assert_eq!(lock(&b.state).hub.held_messages(), 2);
        let op = StreamOp::Append {
            stream: &open.stream,
            done: false,
        };
        assert_eq!(b.stream("t", op, "x", 0), Err(StreamRefusal::Closed));
    }

    #[test]
    fn a_retried_fragment_is_answered_its_first_receipt_and_appended_once() {
        let (b, _poll) = broker();
        let open = b
            .stream_keyed("t", StreamOp::Open, "He", Some("o"), 0)
            .unwrap();
        let again = b
            .stream_keyed("t", StreamOp::Open, "He", Some("o"), 0)
            .unwrap();
        assert!(again.repeat && !open.repeat);
        assert_eq!(
            (&again.id, &again.stream, again.seq),
            (&open.id, &open.stream, 1)
        );
        let op = |done| StreamOp::Append {
            stream: &open.stream,
            done,
        };
        let first = b.stream_keyed("t", op(false), "llo", Some("a"), 0).unwrap();
        let retry = b.stream_keyed("t", op(false), "llo", Some("a"), 0).unwrap();
        assert_eq!((retry.id, retry.seq, retry.repeat), (first.id, 2, true));
        let last = b.stream_keyed("t", op(true), "!", Some("d"), 0).unwrap();
        // The retry of the closing fragment is not told 409: it is the same answer.
        let retry = b.stream_keyed("t", op(true), "!", Some("d"), 0).unwrap();
        assert_eq!((&retry.id, retry.seq, retry.done), (&last.id, 3, true));
        // The same key on another topic is another key (and another stream there).
        let other = b
            .stream_keyed("u", StreamOp::Open, "x", Some("o"), 0)
            .unwrap();
        assert!(!other.repeat);
        let all = texts(&b, &format!("{}-0", b.epoch()));
        assert_eq!(all.len(), 1, "{all:?}");
        assert!(
            all[0].contains(r#""seq":3,"data":"Hello!","done":true"#),
            "{all:?}"
        );
        assert_eq!(b.metrics.publish_repeats.load(Relaxed), 3);
    }

    #[test]
    fn a_carried_stream_keeps_its_text_its_count_its_deadline_and_the_closed_ones() {
        let (old, _poll) = broker();
        let old = old.streaming(StreamSettings {
            timeout: 60,
            ..StreamSettings::default()
        });
        let done = old.stream("t", StreamOp::Open, "x", 100).unwrap();
        let close = StreamOp::Append {
            stream: &done.stream,
            done: true,
        };
        old.stream("t", close, "", 100).unwrap();
        let open = old.stream("t", StreamOp::Open, "Hel", 100).unwrap();
        let carried = lock(&old.state).streams.carry(110);
        assert_eq!(carried.open.len(), 1);
        assert_eq!(
            (
                carried.open[0].seq,
                &*carried.open[0].text,
                carried.open[0].left
            ),
            (1, "Hel", 50)
        );
        let (new, _poll2) = broker();
        let new = new
            .streaming(StreamSettings {
                timeout: 60,
                ..StreamSettings::default()
            })
            .carry_on(carried, 5000);
        // The same epoch in a real hand-over; here the ids are read back in the new one's.
        let sid = |id: &str| format!("{}-{}", new.epoch(), id.rsplit('-').next().unwrap());
        let (open_id, done_id) = (sid(&open.stream), sid(&done.stream));
        fn op(stream: &str, done: bool) -> StreamOp<'_> {
            StreamOp::Append { stream, done }
        }
        // Its deadline moved with it: 50 s were left at the freeze.
        new.close_stale_streams(5049);
        assert_eq!(lock(&new.state).streams.open.len(), 1);
        let next = new.stream("t", op(&open_id, false), "lo", 5049).unwrap();
        assert_eq!(next.seq, 2);
        let refused = new.stream("t", op(&done_id, false), "x", 5049);
        assert_eq!(refused, Err(StreamRefusal::Closed));
        new.close_stale_streams(5109);
        assert!(lock(&new.state).streams.open.is_empty());
    }

    #[test]
    fn an_append_builds_no_text_so_far_until_history_is_read_and_every_read_gets_it_exactly() {
        let (b, _poll) = broker();
        let open = b.stream("t", StreamOp::Open, "a", 0).unwrap();
        let start = format!("{}-0", b.epoch());
        let entry = |b: &LocalBroker| {
            let st = lock(&b.state);
            let m = st.hub.topic("t").unwrap().latest().unwrap();
            (m.id, String::from_utf8_lossy(m.payload()).into_owned())
        };
        let mut text = String::from("a");
        for i in 0..30 {
            let frag = format!("-{i}");
            let op = StreamOp::Append {
                stream: &open.stream,
                done: false,
            };
            let r = b.stream("t", op, &frag, 0).unwrap();
            text.push_str(&frag);
            let seq: u64 = r.id.rsplit('-').next().unwrap().parse().unwrap();
            // Until something reads history, the entry is the fragment's own event, at its place.
            let (id, payload) = entry(&b);
            assert_eq!(id, seq);
            assert!(payload.starts_with(r#"{"type":"append""#), "{payload}");
            if i % 7 == 3 {
                // A resume at this boundary: the text so far, exactly, once.
                let all = texts(&b, &start);
                assert_eq!(all.len(), 1, "{all:?}");
                let want = format!(r#""seq":{},"data":"{text}"}}"#, i + 2);
                assert!(all[0].ends_with(&want), "{} vs {want}", all[0]);
                assert!(entry(&b).1.starts_with(r#"{"type":"message""#));
            }
        }
        // A hand-over carries the text so far, not the last fragment.
        let frozen = b.freeze();
        let held = String::from_utf8_lossy(frozen.held[0].payload()).into_owned();
        assert!(held.contains(&format!(r#""data":"{text}""#)), "{held}");
    }
}
