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
use crate::hub::lock;
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

    /// Forgets open stream `id` (its opening could not be recorded).
    fn forget(&mut self, id: u64) {
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
        let mut st = lock(&self.state);
        if st.frozen {
            return Err(StreamRefusal::Unavailable(Unavailable::upgrading()));
        }
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
        self.emit(&mut st, stream, fragment, now).map_err(|e| {
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
    /// its `append` event, keeps the stream folded in history, and forgets the stream once it
    /// is closed.
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
        let (topic, seq, closed, held, folded) = match st.streams.open.get(&stream) {
            Some(o) => (
                Arc::clone(&o.topic),
                o.text.seq(),
                o.text.closed(),
                o.held,
                (keep || o.text.closed().is_some()).then(|| o.text.text().to_owned()),
            ),
            None => return Ok(self.receipt(id, stream, 0, 0, false)),
        };
        if st.durable {
            let whole = closed.and(folded.as_deref());
            let record = history_log::StreamRecord {
                id,
                unix_secs: 0,
                epoch: &self.epoch,
                topic: &topic,
                stream,
                seq,
                whole: whole.is_some(),
                closed,
                data: whole.unwrap_or(fragment),
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
        let folded = folded.filter(|_| keep);
        let (id_s, stream_s) = (
            format!("{}-{id}", self.epoch),
            format!("{}-{stream}", self.epoch),
        );
        fn event<'a>(
            topic: &'a str,
            id: &'a str,
            stream: &'a str,
            seq: u32,
            data: &'a str,
            closed: Option<CloseReason>,
        ) -> StreamEvent<'a> {
            StreamEvent {
                topic,
                id,
                stream,
                seq,
                data,
                closed,
            }
        }
        let live = Arc::new(Published::stream_event(
            Arc::clone(&topic),
            id,
            Arc::clone(&self.epoch),
            now,
            false,
            &append_json(&event(&topic, &id_s, &stream_s, seq, fragment, closed)),
        ));
        let (name, e) = st.hub.topic_mut(&topic, &self.metrics);
        e.traffic.published += 1;
        let subscribers = e.subscribers();
        for w in e.workers_with_subscribers() {
            if let Some(inbox) = self.inboxes.get(w) {
                inbox.push(std::iter::once(Arc::clone(&live)));
            }
        }
        match folded {
            Some(text) => {
                let folded = Arc::new(Published::stream_event(
                    Arc::clone(&name),
                    id,
                    Arc::clone(&self.epoch),
                    now,
                    true,
                    &folded_json(&event(&topic, &id_s, &stream_s, seq, &text, closed)),
                ));
                st.hub
                    .keep_replacing(&name, folded, held, &self.limits, &self.metrics);
                st.hub.enforce_limits(&self.limits, now, &self.metrics);
            }
            None => st.hub.skip(&name, id),
        }
        self.metrics.stream_fragments.fetch_add(1, Relaxed);
        if let Some(o) = st.streams.open.get_mut(&stream) {
            o.held = Some(id);
        }
        if closed.is_some() {
            st.streams.remember_closed(stream);
        }
        let State {
            hub, log, streams, ..
        } = st;
        if let Some(l) = log.as_mut().filter(|l| l.wants_rotation()) {
            // Segments holding an open stream's fragments stay: its entry is folded from them.
            let oldest = streams.keep_log_from(hub.oldest_held());
            if let Err(e) = l.rotate(oldest, hub.held_bytes() as u64, || hub.held_in_order()) {
                crate::log::warn(format_args!("history_dir: starting a new segment: {e}"));
            }
        }
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
        }
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
}
