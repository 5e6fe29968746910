//! The in-memory broker: one process, ids from a counter, history in this process's [`Hub`].
//!
//! A publish takes the broker's lock once: it assigns the message ids, encodes each frame once,
//! keeps the messages in history, and appends one shared [`Published`] per message to the inbox
//! of every worker that has a subscriber. Holding the lock while enqueueing is what makes
//! delivery order equal publish order on every worker (see the contract in [`crate::broker`]).
//!
//! With `history_dir` ([`crate::durable`]), the lock also covers the log: a publish writes its
//! messages to the log with one `write(2)` after giving them ids and before keeping, delivering
//! or acknowledging them, so no client ever sees an id the log does not hold. A write that
//! fails answers the publish `503` and delivers nothing (its ids are skipped, never reused).
//!
//! Lock order: `LocalBroker::state` before any `Inbox::queue`. Workers never call the broker
//! while holding their inbox lock.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clarion_proto::event_id;

pub(crate) mod streams;

use super::repeats::{Plan, Repeats};
use super::{Outgoing, Receipt, Since, Subscribed, TopicStatus, Unavailable};
use crate::config::{HistoryLimits, IdempotencyLimits};
use crate::delta::DeltaTopics;
use crate::durable::{self, HistoryLog};
use crate::hub::{lock, Hub, Inbox, TopicEntry, TopicTraffic};
use crate::message::Published;
use crate::metrics::Metrics;

/// What the lock guards: the hub and the id counter, so ids are issued in delivery order.
struct State {
    hub: Hub,
    /// The `SEQ` of the next message.
    next_id: u64,
    /// The durable log, with `history_dir`.
    log: Option<Box<HistoryLog>>,
    /// Whether `history_dir` is set: then a publish without a log (after the graceful stop
    /// closed it) is refused rather than kept only in memory.
    durable: bool,
    /// A hand-over froze this broker: every publish is refused, before it takes an id, with a
    /// reason that says an upgrade is under way (not that the server is stopping).
    frozen: bool,
    /// `Idempotency-Key`s published within the window, claimed under this lock with the
    /// publish. Boxed: it is seldom touched, and keeps the broker enum's variants close in size.
    repeats: Box<Repeats>,
    /// Open appendable messages ([`streams`]).
    streams: Box<streams::Streams>,
}

/// The hub clock's value at start. Recovered messages are older than the process, so their
/// times must fit below it; 2^30 s is 34 years, far beyond any `history_ttl` in use, and
/// leaves 100 years above.
pub(crate) const CLOCK_BASE: u32 = 1 << 30;

/// What a hand-over takes from the in-memory broker ([`LocalBroker::freeze`]).
pub struct Frozen {
    /// The epoch of every id issued.
    pub epoch: Arc<str>,
    /// The `SEQ` of the next id.
    pub next_id: u64,
    /// History is in `history_dir` (closed cleanly), not in `held`.
    pub on_disk: bool,
    /// Every message held, in id order (empty when `on_disk`).
    pub held: Vec<Arc<Published>>,
    /// See [`Hub::floors`].
    pub forgotten_floor: u64,
    /// See [`Hub::floors`].
    pub floors: Vec<(Arc<str>, u64)>,
    /// The hub clock now, to turn the messages' times into Unix time.
    pub clock_now: u32,
    /// The appendable messages open (and closed lately).
    pub streams: streams::Carried,
}

/// How publications go live besides history (each set once at start).
#[derive(Default)]
struct Live {
    /// Topics whose publications get a delta against the previous one.
    delta: OnceLock<DeltaTopics>,
    /// Debounced topics (`max_rate`).
    debounce: OnceLock<Arc<super::debounce::Debouncer>>,
}

/// The single-process broker.
pub struct LocalBroker {
    state: Mutex<State>,
    inboxes: Vec<Arc<Inbox>>,
    metrics: Arc<Metrics>,
    limits: HistoryLimits,
    /// This run's epoch, chosen at start.
    epoch: Arc<str>,
    /// What decides how publications go live (set once at start; boxed, as most brokers
    /// have neither).
    live: Box<Live>,
    /// The origin of the history clock (whole seconds since start fit a `u32` for 136 years).
    start: Instant,
}

impl LocalBroker {
    /// A broker for workers `0..inboxes.len()`.
    pub fn new(
        inboxes: Vec<Arc<Inbox>>,
        metrics: Arc<Metrics>,
        limits: HistoryLimits,
    ) -> LocalBroker {
        LocalBroker {
            state: Mutex::new(State {
                hub: Hub::new(inboxes.len()),
                next_id: 1,
                log: None,
                durable: false,
                frozen: false,
                repeats: Box::new(Repeats::new(IdempotencyLimits::default())),
                streams: Box::default(),
            }),
            inboxes,
            metrics,
            limits,
            epoch: new_epoch().into(),
            live: Box::default(),
            start: Instant::now(),
        }
    }

    /// Sends the topics of `topics` as deltas from now on (once, at start; later calls are
    /// ignored).
    pub fn set_delta_topics(&self, topics: DeltaTopics) {
        if !topics.is_empty() {
            let _ = self.live.delta.set(topics);
        }
    }

    /// Debounces the live delivery of `max_rate` topics (once, at start).
    pub fn set_debounce(&self, d: Arc<super::debounce::Debouncer>) {
        let _ = self.live.debounce.set(d);
    }

    /// The same broker, remembering `Idempotency-Key`s for `limits` (the default is
    /// `idempotency_window`'s and `idempotency_keys`' defaults).
    pub fn remembering(mut self, limits: IdempotencyLimits) -> LocalBroker {
        if let Ok(st) = self.state.get_mut() {
            *st.repeats = Repeats::new(limits);
        }
        self
    }

    /// A broker whose history is kept in `settings.dir` and recovered from it (see
    /// [`crate::durable`]). The error says which directory and what failed.
    pub fn durable(
        inboxes: Vec<Arc<Inbox>>,
        metrics: Arc<Metrics>,
        limits: HistoryLimits,
        settings: durable::Settings,
        decode_attachment: Option<super::AttachmentDecoder>,
    ) -> Result<LocalBroker, String> {
        let (b, _) =
            Self::durable_carrying(inboxes, metrics, limits, settings, decode_attachment, &[])?;
        Ok(b)
    }

    /// [`LocalBroker::durable`] in a hand-over's new process: the streams `carried_open` (the
    /// old one's open streams) stay open in history, and are returned as the log folds them,
    /// for [`LocalBroker::carry_on_logged`].
    pub(crate) fn durable_carrying(
        inboxes: Vec<Arc<Inbox>>,
        metrics: Arc<Metrics>,
        limits: HistoryLimits,
        settings: durable::Settings,
        decode_attachment: Option<super::AttachmentDecoder>,
        carried_open: &[u64],
    ) -> Result<(LocalBroker, Vec<durable::load::OpenFold>), String> {
        let loaded = durable::load::open(
            settings,
            durable::load::Context {
                workers: inboxes.len(),
                limits: &limits,
                metrics: &metrics,
                decode_attachment,
                clock_now: CLOCK_BASE,
                new_epoch: new_epoch(),
                carried_open,
            },
        )?;
        let b = LocalBroker {
            state: Mutex::new(State {
                hub: loaded.hub,
                next_id: loaded.next_id,
                log: Some(Box::new(loaded.log)),
                durable: true,
                frozen: false,
                repeats: Box::new(Repeats::new(IdempotencyLimits::default())),
                streams: Box::default(),
            }),
            inboxes,
            metrics,
            limits,
            epoch: loaded.epoch,
            live: Box::default(),
            start: Instant::now(),
        };
        Ok((b, loaded.open_streams))
    }

    /// A graceful stop: syncs the durable log and marks it cleanly stopped; publishes after
    /// this are refused. Nothing without `history_dir`.
    pub fn close(&self) {
        self.close_locked(&mut lock(&self.state));
    }

    fn close_locked(&self, st: &mut State) {
        let next_id = st.next_id;
        if let Some(mut log) = st.log.take() {
            match log.close(next_id) {
                Ok(()) => crate::log::info(format_args!(
                    "history_dir: synced and marked cleanly stopped at id {}-{}",
                    self.epoch,
                    next_id - 1
                )),
                Err(e) => crate::log::warn(format_args!(
                    "history_dir: the clean stop could not be recorded ({e}); the next start \
                     treats this stop as a crash"
                )),
            }
        }
    }

    /// A hand-over's start (see `crate::handover`): from here on every publish is refused
    /// (`503`, as after a graceful stop), the durable log is closed cleanly, and what the next
    /// process needs to continue the same ids is returned. Everything published before is
    /// already in the workers' inboxes, so once they have drained them no message is in flight.
    pub fn freeze(&self) -> Frozen {
        // One lock for all of it: a publish refused after the log closed still uses up an id
        // (ids are never reused), so the next id must be read where the log was closed.
        let mut st = lock(&self.state);
        self.close_locked(&mut st);
        let st = &mut *st;
        // What is carried is what a reader would get.
        st.streams.fold_pending(&mut st.hub, &self.epoch, None);
        let on_disk = st.durable;
        st.durable = true;
        st.frozen = true;
        let (forgotten_floor, floors) = st.hub.floors();
        Frozen {
            epoch: Arc::clone(&self.epoch),
            next_id: st.next_id,
            on_disk,
            held: if on_disk {
                Vec::new()
            } else {
                st.hub.held_in_order()
            },
            forgotten_floor,
            floors,
            streams: st.streams.carry(self.clock()),
            clock_now: self.clock(),
        }
    }

    /// A broker that continues a handed-over one: its epoch, its next id and its history
    /// (`hub`, rebuilt on the hub clock's [`CLOCK_BASE`]).
    pub fn thawed(
        inboxes: Vec<Arc<Inbox>>,
        metrics: Arc<Metrics>,
        limits: HistoryLimits,
        epoch: Arc<str>,
        next_id: u64,
        hub: Hub,
    ) -> LocalBroker {
        LocalBroker {
            state: Mutex::new(State {
                hub,
                next_id,
                log: None,
                durable: false,
                frozen: false,
                repeats: Box::new(Repeats::new(IdempotencyLimits::default())),
                streams: Box::default(),
            }),
            inboxes,
            metrics,
            limits,
            epoch,
            live: Box::default(),
            start: Instant::now(),
        }
    }

    /// The `SEQ` the next message would get.
    pub fn next_id(&self) -> u64 {
        lock(&self.state).next_id
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

    /// The hub clock: seconds since this broker started, from [`CLOCK_BASE`]. Read by callers
    /// outside the worker engines (the API, the sweep); an engine gets it from its shell.
    pub fn clock(&self) -> u32 {
        CLOCK_BASE.saturating_add(self.start.elapsed().as_secs() as u32)
    }

    /// Subscribes one connection of `worker` to `topics` (valid, distinct names) and computes
    /// what it missed since `since`.
    ///
    /// Under the lock, this also takes everything waiting in the worker's inbox into
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
        let mut st = lock(&self.state);
        if let Some(inbox) = self.inboxes.get(worker) {
            inbox.take(pending);
        }
        self.fold_streams(&mut st, topics, since);
        let last = st.next_id - 1;
        let mut out = self.missed(last, topics.len());
        for &topic in topics {
            let (name, e) = st.hub.topic_mut(topic, &self.metrics);
            Hub::add_subscriber(e, worker, &self.metrics);
            self.add_missed(e, name, since, last, &mut out);
        }
        drop(st);
        if resume_from(since).is_some() {
            self.metrics.resumes.fetch_add(1, Relaxed);
            if !out.gaps.is_empty() {
                self.metrics.resume_gaps.fetch_add(1, Relaxed);
            }
        }
        finish_replay(&mut out);
        out
    }

    /// What a subscriber to `topics` would be replayed since `since`, without subscribing: no
    /// count changes, no topic is created, no inbox is touched.
    pub fn read_since(&self, topics: &[&str], since: Since<'_>) -> Subscribed {
        let mut st = lock(&self.state);
        self.fold_streams(&mut st, topics, since);
        let last = st.next_id - 1;
        let mut out = self.missed(last, topics.len());
        let unknown = st.hub.unknown_topic();
        for &topic in topics {
            let e = st.hub.topic(topic).unwrap_or(&unknown);
            self.add_missed(e, topic.into(), since, last, &mut out);
        }
        drop(st);
        finish_replay(&mut out);
        out
    }

    /// Walks every topic under the lock (see [`crate::hub::Hub::visit_topics`]).
    pub fn visit_topics(&self, visit: impl FnMut(&Arc<str>, u64, &mut TopicTraffic)) {
        lock(&self.state).hub.visit_topics(visit);
    }

    /// A topic's subscribers, traffic and held messages, if it is known.
    pub fn topic_status(&self, topic: &str) -> Option<TopicStatus> {
        let st = lock(&self.state);
        st.hub.topic(topic).map(|e| TopicStatus {
            subscribers: e.subscribers(),
            traffic: e.traffic,
            held: e.held(),
        })
    }

    /// With `history_dir`, starts a new log segment when the current one is due, rewriting
    /// the history held (open streams' entries built first: the log holds what a reader would
    /// get). Segments holding an open stream's fragments stay: its entry is folded from them.
    fn rotate_log_if_due(&self, st: &mut State) {
        let State {
            hub, log, streams, ..
        } = st;
        if let Some(l) = log.as_mut().filter(|l| l.wants_rotation()) {
            let oldest = streams.keep_log_from(hub.oldest_held());
            let held_bytes = hub.held_bytes() as u64;
            let rewrite = || {
                streams.fold_pending(hub, &self.epoch, None);
                hub.held_in_order()
            };
            if let Err(e) = l.rotate(oldest, held_bytes, rewrite) {
                crate::log::warn(format_args!("history_dir: starting a new segment: {e}"));
            }
        }
    }

    /// Builds the text so far of the open streams of `topics` into their history entries
    /// when `since` reads history ([`streams::Streams::fold_pending`]).
    fn fold_streams(&self, st: &mut State, topics: &[&str], since: Since<'_>) {
        match since {
            Since::Now => {}
            Since::Id(_) | Since::Latest | Since::PublisherId(_) => {
                st.streams
                    .fold_pending(&mut st.hub, &self.epoch, Some(topics));
            }
        }
    }

    /// An empty answer for a subscription to `n` topics, positioned after `last`.
    fn missed(&self, last: u64, n: usize) -> Subscribed {
        Subscribed {
            names: Vec::with_capacity(n),
            replay: Vec::new(),
            gaps: Vec::new(),
            position: format!("{}-{last}", self.epoch),
        }
    }

    /// Adds what a subscriber of topic `name` (whose entry is `e`) missed since `since` to
    /// `out`: the replay from history, and a gap where history cannot cover it. One rule for
    /// subscribing and for reading, so the two never disagree.
    fn add_missed(
        &self,
        e: &TopicEntry,
        name: Arc<str>,
        since: Since<'_>,
        last: u64,
        out: &mut Subscribed,
    ) {
        if let Some((given, id)) = resume_from(since) {
            e.replay_after(
                &name,
                given,
                id,
                &self.epoch,
                last,
                &mut out.replay,
                &mut out.gaps,
            );
        }
        match since {
            Since::PublisherId(prev) => e.replay_after_publisher_id(prev, &mut out.replay),
            // Under the same lock that counts the subscriber: every later publish reaches it
            // through the inbox, every earlier one is at or before this message.
            Since::Latest => out.replay.extend(e.latest().cloned()),
            Since::Now | Since::Id(_) => {}
        }
        out.names.push(name);
    }

    /// Records that `worker` lost a subscriber to `topic`.
    pub fn unsubscribe(&self, worker: usize, topic: &str) {
        lock(&self.state)
            .hub
            .remove_subscriber(worker, topic, &self.metrics);
    }

    /// [`LocalBroker::try_publish`] for a broker without `history_dir`, which cannot fail.
    #[cfg(test)]
    pub fn publish(&self, msgs: &[Outgoing<'_>]) -> Vec<Receipt> {
        self.try_publish(msgs).unwrap_or_default()
    }

    /// Which of `msgs` repeat an `Idempotency-Key` remembered now (or one earlier in `msgs`),
    /// without claiming any: the NATS broker leaves them out of what it sends to other nodes.
    pub fn repeated(&self, msgs: &[Outgoing<'_>]) -> Vec<bool> {
        match lock(&self.state).repeats.plan(msgs) {
            None => Vec::new(),
            Some((_, plan)) => plan.iter().map(|p| *p != Plan::Publish).collect(),
        }
    }

    /// Publishes messages in order, under one lock acquisition, waking each interested worker
    /// once, and keeps them in history. Returns one receipt per message, or [`Unavailable`]
    /// when `history_dir` is set and the messages could not be written to it (then none of
    /// them is delivered or kept).
    pub fn try_publish(&self, msgs: &[Outgoing<'_>]) -> Result<Vec<Receipt>, Unavailable> {
        self.try_publish_at(msgs, self.clock())
    }

    /// [`LocalBroker::try_publish`] at hub time `now` ([`LocalBroker::clock`] as the caller
    /// read it): a worker engine publishes at the time its shell passed in.
    pub fn try_publish_at(
        &self,
        msgs: &[Outgoing<'_>],
        now: u32,
    ) -> Result<Vec<Receipt>, Unavailable> {
        let keep = self.limits.enabled();
        let workers = self.inboxes.len();
        let mut receipts = Vec::with_capacity(msgs.len());
        // Per worker, the messages it must deliver, so each inbox is locked and woken once.
        let mut per_worker: Vec<Vec<Arc<Published>>> = vec![Vec::new(); workers];
        // The messages to keep, written to the durable log before anything else sees them.
        let mut batch: Vec<(Arc<str>, Arc<Published>)> = Vec::with_capacity(msgs.len());
        let mut st = lock(&self.state);
        if st.frozen {
            return Err(Unavailable::upgrading());
        }
        let plan = st.repeats.plan(msgs);
        for (i, m) in msgs.iter().enumerate() {
            let first = match plan.as_ref().and_then(|(_, p)| p.get(i)) {
                None | Some(Plan::Publish) => None,
                Some(Plan::Repeat(id)) => Some(id.clone()),
                Some(Plan::RepeatOf(j)) => receipts.get(*j).map(|r: &Receipt| r.id.clone()),
            };
            if let Some(id) = first {
                receipts.push(Receipt {
                    id,
                    subscribers: 0,
                    repeat: true,
                });
                continue;
            }
            let id = st.next_id;
            st.next_id += 1;
            receipts.push(Receipt {
                id: format!("{}-{id}", self.epoch),
                subscribers: 0,
                repeat: false,
            });
            if !keep && st.hub.topic(m.topic).is_none() {
                // No subscriber and no history: nobody will ever see it.
                st.hub.note_unseen(id);
                continue;
            }
            let (name, e) = st.hub.topic_mut(m.topic, &self.metrics);
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
            published.tags = m.tags.into();
            published.conflation_key = m.conflation_key.map(Into::into);
            let published = Arc::new(published);
            if self.live.delta.get().is_some_and(|d| d.matches(m.topic)) {
                let listened = e.subscribers() > 0;
                published.chain(e.delta.get_or_insert_with(Default::default), listened);
                if published.delta().is_some() {
                    self.metrics.deltas_computed.fetch_add(1, Relaxed);
                }
            }
            e.traffic.published += 1;
            if let Some(r) = receipts.last_mut() {
                r.subscribers = e.subscribers();
            }
            // History keeps every message; live delivery of a debounced topic may wait.
            let live = self.live.debounce.get().is_none_or(|d| !d.hold(&published));
            for w in e.workers_with_subscribers().filter(|_| live) {
                if let Some(list) = per_worker.get_mut(w) {
                    list.push(Arc::clone(&published));
                }
            }
            if keep {
                batch.push((name, published));
            } else {
                st.hub.skip(&name, id);
            }
        }
        if st.durable {
            let written = match st.log.as_mut() {
                Some(log) => {
                    let list: Vec<Arc<Published>> =
                        batch.iter().map(|(_, p)| Arc::clone(p)).collect();
                    log.append(&list).map_err(|e| {
                        let (why, text) = durable::write_failure(&e);
                        self.metrics.history_write_failed(why);
                        text
                    })
                }
                None => Err("the server is stopping".to_owned()),
            };
            if let Err(e) = written {
                for (name, _) in &batch {
                    st.hub.forget_if_unused(name, &self.metrics);
                }
                drop(st);
                // Logged once, by whoever answers the publisher (the API's `publish refused`).
                return Err(Unavailable(e));
            }
        }
        for (name, published) in batch {
            st.hub.keep(&name, published, &self.limits, &self.metrics);
        }
        for (inbox, list) in self.inboxes.iter().zip(per_worker) {
            if !list.is_empty() {
                inbox.push(list.into_iter());
            }
        }
        if keep {
            st.hub.enforce_limits(&self.limits, now, &self.metrics);
        }
        self.rotate_log_if_due(&mut st);
        if let Some((at, plan)) = &plan {
            let early = st.repeats.remember(*at, msgs, plan, &receipts);
            self.metrics
                .idempotency_keys_forgotten
                .fetch_add(early as u64, Relaxed);
        }
        drop(st);
        let repeats = receipts.iter().filter(|r| r.repeat).count() as u64;
        self.metrics.publish_repeats.fetch_add(repeats, Relaxed);
        self.metrics
            .published
            .fetch_add(msgs.len() as u64 - repeats, Relaxed);
        Ok(receipts)
    }

    /// Hands `event` (a presence event, [`Published::presence`]) to every worker with a
    /// subscriber of its topic, in order with the topic's messages; never kept in history.
    pub fn announce(&self, event: Arc<Published>) {
        let st = lock(&self.state);
        if let Some(e) = st.hub.topic(&event.topic) {
            for w in e.workers_with_subscribers() {
                if let Some(inbox) = self.inboxes.get(w) {
                    inbox.push(std::iter::once(Arc::clone(&event)));
                }
            }
        }
    }

    /// Trims history by age and memory. Called on every publish and once a second by a worker.
    pub fn expire(&self) {
        if self.limits.enabled() {
            let now = self.clock();
            lock(&self.state)
                .hub
                .enforce_limits(&self.limits, now, &self.metrics);
        }
    }
}

/// The id a subscriber resumes from, as sent and parsed (`None` inside when it is not an id),
/// or `None` when it asked for no replay by id.
/// Messages replayed from several topics go out in publish order.
fn finish_replay(out: &mut Subscribed) {
    if out.names.len() > 1 {
        out.replay.sort_unstable_by_key(|m| m.id);
    }
}

fn resume_from(since: Since<'_>) -> Option<(&str, Option<event_id::EventId<'_>>)> {
    match since {
        Since::Now | Since::PublisherId(_) | Since::Latest => None,
        Since::Id(s) => Some((s, event_id::parse(s).ok())),
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::message::GapReason;
    use crate::metrics::Eviction;
    use clarion_proto::ws::DataKind;

    const NO_HISTORY: HistoryLimits = HistoryLimits {
        per_topic: 0,
        ttl: 0,
        max_bytes: 0,
    };

    fn hub(workers: usize, limits: HistoryLimits) -> (LocalBroker, Vec<mio::Poll>, Arc<Metrics>) {
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
            LocalBroker::new(inboxes, Arc::clone(&metrics), limits),
            polls,
            metrics,
        )
    }

    fn text<'a>(topic: &'a str, payload: &'a str) -> Outgoing<'a> {
        Outgoing {
            tags: &[],
            conflation_key: None,
            topic,
            kind: DataKind::Text,
            payload: payload.as_bytes(),
            event: None,
            attachment: None,
            key: None,
        }
    }

    fn sub(hub: &LocalBroker, worker: usize, topics: &[&str], since: Since<'_>) -> Subscribed {
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
    fn a_frozen_broker_refuses_publishes_saying_an_upgrade_is_in_progress() {
        let (hub, _polls, _) = hub(1, NO_HISTORY);
        sub(&hub, 0, &["t"], Since::Now);
        hub.publish(&[text("t", "1")]);
        let frozen = hub.freeze();
        let refused = hub.try_publish(&[text("t", "2")]).unwrap_err();
        assert!(refused.during_upgrade(), "{refused}");
        assert!(refused.to_string().contains("an upgrade is in progress"));
        assert!(!refused.to_string().contains("stopping"));
        // The refusal took no id: the next process continues from where the freeze stood.
        let mut got = Vec::new();
        hub.inboxes[0].take(&mut got);
        assert_eq!(payloads(&got), vec!["1"]);
        assert_eq!(frozen.next_id, got[0].id + 1);
        assert_eq!(hub.freeze().next_id, frozen.next_id);
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
            st.hub.trim_front("b", Eviction::Memory, &hub.metrics);
            assert!(st.hub.topic("b").is_none());
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
        assert_eq!(st.hub.held_messages(), 3);
        let order = st.hub.order_len();
        assert!(order <= 2 * 3 + 1024 + 1, "{order}");
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

    #[test]
    fn since_latest_gives_the_last_message_then_every_later_one_under_a_concurrent_publisher() {
        let (hub, _polls, metrics) = hub(1, HISTORY);
        // None yet: live only.
        let s = sub(&hub, 0, &["q"], Since::Latest);
        assert!(s.replay.is_empty() && s.gaps.is_empty());
        hub.unsubscribe(0, "q");
        let hub = Arc::new(hub);
        let publisher = {
            let hub = Arc::clone(&hub);
            std::thread::spawn(move || {
                for i in 1..=20_000u32 {
                    hub.publish(&[text("a", &i.to_string()), text("b", "other")]);
                }
            })
        };
        // Subscribe while the publisher runs: what the subscription starts with and what the
        // inbox brings afterwards must be one unbroken run of the topic's messages.
        while metrics.published.load(Relaxed) < 100 {
            std::thread::yield_now();
        }
        let mut pending = Vec::new();
        let s = hub.subscribe(0, &["a"], Since::Latest, &mut pending);
        publisher.join().unwrap();
        assert_eq!(s.replay.len(), 1, "the last message, once");
        let first: u32 = payloads(&s.replay)[0].parse().unwrap();
        assert!(s.replay[0].id <= seq(&s.position));
        let mut live = Vec::new();
        hub.inboxes[0].take(&mut live);
        let later: Vec<u32> = payloads(&live).iter().map(|p| p.parse().unwrap()).collect();
        let want: Vec<u32> = (first + 1..=20_000).collect();
        assert_eq!(later, want, "no gap, no duplicate after {first}");
    }

    #[test]
    fn read_since_replays_like_subscribe_without_subscribing() {
        let (hub, _polls, metrics) = hub(1, HISTORY);
        let r = hub.publish(&[text("a", "1"), text("a", "2"), text("b", "x")]);
        let s = hub.read_since(&["a"], Since::Id(&r[0].id));
        assert_eq!(payloads(&s.replay), vec!["2"]);
        assert!(s.gaps.is_empty());
        assert_eq!(s.position, r[2].id);
        assert_eq!(metrics.subscriptions.load(Relaxed), 0);
        assert_eq!(metrics.resumes.load(Relaxed), 0);
        // A topic nobody knows is not created, and another epoch is still a gap.
        let s = hub.read_since(&["nobody", "a"], Since::Id("zzz-1"));
        assert_eq!(payloads(&s.replay), vec!["1", "2"]);
        assert_eq!(s.gaps.len(), 2);
        assert_eq!(metrics.topics.load(Relaxed), 2);
        // A publish after the read still reaches nobody: no subscriber was counted.
        assert_eq!(hub.publish(&[text("a", "3")])[0].subscribers, 0);
    }

    fn durable_broker(dir: &std::path::Path, limits: HistoryLimits) -> (LocalBroker, mio::Poll) {
        durable_broker_with(dir, limits, None)
    }

    fn durable_broker_with(
        dir: &std::path::Path,
        limits: HistoryLimits,
        decode: Option<super::super::AttachmentDecoder>,
    ) -> (LocalBroker, mio::Poll) {
        let poll = mio::Poll::new().expect("poll");
        let inbox = Arc::new(Inbox::new(
            mio::Waker::new(poll.registry(), mio::Token(0)).expect("waker"),
        ));
        let settings = crate::config::HistoryDisk {
            dir: dir.to_owned(),
            // The fsync thread runs too (every 20 ms).
            fsync_ms: 20,
            segment_bytes: 4096,
            max_segment_bytes: 1 << 20,
        };
        let b = LocalBroker::durable(
            vec![inbox],
            Arc::new(Metrics::default()),
            limits,
            settings,
            decode,
        )
        .unwrap();
        (b, poll)
    }

    fn disk_bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn durable_history_comes_back_with_the_same_epoch_ids_and_bodies_and_stays_bounded() {
        let dir = std::env::temp_dir().join(format!("clarion-durable-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let limits = HistoryLimits {
            per_topic: 20,
            ttl: 3600,
            max_bytes: 1 << 20,
        };
        let (b, _poll) = durable_broker(&dir, limits);
        let mut receipts = Vec::new();
        for i in 0..2000 {
            let p = format!("message {i}");
            receipts.extend(
                b.try_publish(&[text(if i % 2 == 0 { "a" } else { "b" }, &p)])
                    .unwrap(),
            );
        }
        let epoch = b.epoch().to_owned();
        // 2,000 records of ~45 bytes would be 90 KB; 40 held stay within two segments' worth
        // beside twice what history holds.
        assert!(
            disk_bytes(&dir) < 2 * (1 << 20) / 100 + 3 * 4096,
            "{}",
            disk_bytes(&dir)
        );
        b.close();
        assert!(
            b.try_publish(&[text("a", "late")]).is_err(),
            "refused after the stop"
        );
        drop(b);
        let (b, _poll) = durable_broker(&dir, limits);
        assert_eq!(b.epoch(), epoch);
        let s = b.read_since(&["a"], Since::Id(&receipts[1979].id));
        assert!(s.gaps.is_empty());
        assert_eq!(
            payloads(&s.replay),
            (1980..2000)
                .step_by(2)
                .map(|i| format!("message {i}"))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            s.replay.iter().map(|m| m.id_string()).collect::<Vec<_>>(),
            receipts[1980..]
                .iter()
                .step_by(2)
                .map(|r| r.id.clone())
                .collect::<Vec<_>>()
        );
        // Before what is held: a gap, as in memory.
        let s = b.read_since(&["a"], Since::Id(&receipts[10].id));
        assert_eq!(s.gaps.len(), 1);
        assert_eq!(s.gaps[0].reason, GapReason::Trimmed);
        let next = b.try_publish(&[text("a", "after")]).unwrap();
        assert_eq!(seq(&next[0].id), 2001);
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An attachment that travels as its own bytes (as GRIP content does).
    struct Tag(String);

    impl crate::message::Attachment for Tag {
        fn cost(&self) -> usize {
            self.0.len()
        }
        fn publisher_id(&self) -> Option<&str> {
            Some(&self.0)
        }
        fn encode(&self) -> Option<Vec<u8>> {
            Some(self.0.as_bytes().to_vec())
        }
    }

    fn decode_tag(b: &[u8]) -> Option<Arc<dyn crate::message::Attachment>> {
        Some(Arc::new(Tag(String::from_utf8(b.to_vec()).ok()?)))
    }

    #[test]
    fn durable_history_keeps_attachments_and_event_names() {
        let dir = std::env::temp_dir().join(format!("clarion-durable-att-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let limits = HistoryLimits {
            per_topic: 100,
            ttl: 3600,
            max_bytes: 1 << 20,
        };
        let (b, _poll) = durable_broker_with(&dir, limits, Some(decode_tag));
        for i in 0..5 {
            let p = format!("m{i}");
            let tag = format!("p{i}");
            b.try_publish(&[Outgoing {
                tags: &[],
                conflation_key: None,
                topic: "g",
                kind: DataKind::Binary,
                payload: p.as_bytes(),
                event: Some("tick"),
                attachment: Some(Arc::new(Tag(tag))),
                key: None,
            }])
            .unwrap();
        }
        b.close();
        drop(b);
        let (b, _poll) = durable_broker_with(&dir, limits, Some(decode_tag));
        let s = b.read_since(&["g"], Since::PublisherId("p2"));
        assert_eq!(payloads(&s.replay), vec!["m3", "m4"]);
        let m = &s.replay[0];
        assert_eq!(m.kind, DataKind::Binary);
        assert_eq!(m.event.as_deref(), Some("tick"));
        assert_eq!(m.attachment::<Tag>().map(|t| t.0.as_str()), Some("p3"));
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
