//! The Redis broker: many Clarion processes and machines share topics, ids and history
//! through one Redis (7.0 or later). The design and its guarantees are in `docs/cluster.md`.
//!
//! - **Ids per topic.** One script per publish ([`SCRIPT`]) takes the topic's next offset
//!   (`HINCRBY`), appends the message to the topic's stream with the entry id `OFFSET-0`
//!   (trimmed to `history_size`, expiring after `history_ttl`), and publishes `EPOCH OFFSET
//!   BODY` on the topic's sharded channel (`SPUBLISH`). The epoch is a random string created
//!   with the topic's metadata, so a Redis that lost its data shows up as a new epoch, never
//!   as reused offsets. A message id is `EPOCH-OFFSET`, the same on every node.
//! - **Interest.** A node subscribes (`SSUBSCRIBE`) to a topic's channel while it has a
//!   subscriber to it, so its traffic follows its audience. Keys and channels carry the hash tag
//!   of one of [`PARTITIONS`] partitions, so a topic's keys and channel live in one slot.
//! - **Live order.** Each followed topic remembers its epoch and the last offset delivered;
//!   the next message must be that plus one. A hole (pub/sub is at-most-once: a reconnect, an
//!   output buffer limit) is filled from the stream, or announced with a gap notice.
//! - **Resume.** A subscriber is counted (and so receives every later live message) before its
//!   missed messages are read from the stream up to the offset delivered at that moment; the
//!   two never overlap, and a stream that cannot cover the range yields a gap notice.
//!
//! Threads: callers (API threads, workers) run commands on a small [`pool::Pool`]; one reader
//! thread ([`link`]) owns the subscriber connection, hands each live message to its topic's
//! sans-IO follower ([`follow`]: the ordering, hole, epoch and gap rules), delivers what it
//! releases to the workers' inboxes under the state lock (the same lock subscribers are counted under, which is what
//! makes a resume exact), and reconnects with backoff.

mod appendable;
mod cluster;
pub mod conn;
mod epoch;
mod follow;
mod freeze;
mod layout;
mod leave;
mod link;
mod missed;
pub mod occupancy;
pub mod pool;
mod position;
pub mod presence;
mod publish;
mod resume;
pub mod sentinel;
mod shard;
pub mod stream;
pub mod topology;

use crate::redact::Urls;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::resp::Value;

use self::conn::LinkError;
use self::epoch::{random_epoch, sha1_hex};
use self::layout::topic_of;
pub use self::layout::{keys, partition, PARTITIONS};
use self::position::joined_position;
use self::sentinel::SentinelAuth;
use self::shard::Shard;
use self::stream::RedisTls;
use super::{Since, Subscribed, TopicStatus, Unavailable};
use crate::config::{HistoryLimits, IdempotencyLimits};
use crate::hub::{lock, Inbox, TopicTraffic};
use crate::message::{Gap, GapReason, Published};
use crate::metrics::Metrics;

/// The publish script (see the module doc): the offset rule it shares with the
/// appendable-message script ([`appendable`]), then the publish.
pub const SCRIPT: &str = concat!(include_str!("offset.lua"), include_str!("script.lua"));

/// Messages a topic may hold back while a hole before them is being filled; past it the hole
/// is announced as a gap and delivery goes on, so a stalled fill cannot grow memory.
const MAX_HELD_BACK: usize = 10_000;

use super::AttachmentDecoder;

/// A followed topic's sequence of live messages.
type Sequence = follow::Follower<Arc<Published>, MAX_HELD_BACK>;

/// The clustered broker over Redis.
pub struct RedisBroker {
    core: Arc<Core>,
    /// One reader thread per Redis shard, and a Sentinel watcher per shard behind Sentinel.
    readers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Appendable messages' limits and timeout ([`appendable`]).
    streams: crate::config::StreamSettings,
    /// When this node last swept for stale streams (its clock, seconds): once a second.
    swept: std::sync::atomic::AtomicU32,
}

/// What the reader thread and the callers share.
pub(crate) struct Core {
    state: Mutex<State>,
    /// Signalled when a topic becomes ready or the subscriber connection goes up or down.
    changed: Condvar,
    inboxes: Vec<Arc<Inbox>>,
    metrics: Arc<Metrics>,
    limits: HistoryLimits,
    /// How long an `Idempotency-Key` is remembered (in Redis, by the publish script).
    idempotency: IdempotencyLimits,
    shards: Vec<Shard>,
    /// With a Redis Cluster: the route from partitions to places of `shards`.
    cluster: Option<topology::Topology>,
    /// For `rediss://` shards.
    tls: Option<Arc<RedisTls>>,
    timeout: Duration,
    name: String,
    sha: String,
    stop: AtomicBool,
    start: Instant,
    decode_attachment: Option<AttachmentDecoder>,
    /// Epoch candidates: unique per publish call within this process.
    nonce: AtomicU64,
    /// This process's own epoch, for what needs a process-unique prefix (GRIP connection ids).
    node_epoch: String,
    /// A hand-over froze delivery and publishing ([`freeze`]).
    frozen: AtomicBool,
    /// Topics whose messages get a delta against the previous one (set once at start).
    delta: std::sync::OnceLock<crate::delta::DeltaTopics>,
    /// Debounced topics (`max_rate`; set once at start).
    pub(crate) debounce: std::sync::OnceLock<Arc<crate::broker::debounce::Debouncer>>,
}

/// Topics this node follows, under the one lock.
pub(crate) struct State {
    topics: HashMap<Arc<str>, Topic>,
    /// Per shard: its subscriber connection is up.
    connected: Vec<bool>,
    /// Topics whose last subscriber here left, and when: let go of lazily ([`leave`]).
    leaving: VecDeque<(Arc<str>, Instant)>,
}

/// Where a topic's channel subscription stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// Not subscribed (or an unsubscribe is on its way).
    Idle,
    /// `SSUBSCRIBE` sent, not confirmed yet.
    Subscribing,
    /// Confirmed; live messages arrive. Ready once its position is known.
    Live,
}

/// One topic this node follows.
struct Topic {
    per_worker: Box<[u32]>,
    total: u64,
    /// Subscribers on their way in (waiting for the topic to become ready).
    joining: u32,
    follow: Follow,
    /// Subscribe/unsubscribe commands sent and not yet confirmed: only the confirmation of the
    /// last one says where the subscription stands.
    unconfirmed: u32,
    /// Its live sequence: position, held-back messages, holes ([`follow`]).
    seq: Sequence,
    traffic: TopicTraffic,
    /// The previous message delivered here, for deltas (`delta_topics` only).
    delta: Option<Box<crate::delta::Chain>>,
}

impl State {
    /// Whether shard `i`'s subscriber connection is up.
    fn up(&self, i: usize) -> bool {
        self.connected.get(i).copied().unwrap_or(false)
    }
}

impl Topic {
    fn new(workers: usize) -> Topic {
        Topic {
            per_worker: vec![0; workers].into_boxed_slice(),
            total: 0,
            joining: 0,
            follow: Follow::Idle,
            unconfirmed: 0,
            seq: Sequence::new(),
            traffic: TopicTraffic::default(),
            delta: None,
        }
    }

    fn unused(&self) -> bool {
        self.total == 0 && self.joining == 0
    }
}

impl RedisBroker {
    /// Hands a presence event to this node's workers with a subscriber of its topic.
    pub fn announce(&self, event: Arc<Published>) {
        self.core.announce(event);
    }

    /// Connects to Redis (the first connection is made now, so a wrong URL or password stops
    /// startup with its reason) and starts the reader thread. A TLS failure does not stop
    /// startup: the node starts without the broker (publishes `503`, `/healthz` says so) and
    /// retries with backoff, logging why each attempt failed, so a certificate fixed on
    /// either side is picked up without a restart.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        url: &str,
        tls: Option<Arc<RedisTls>>,
        sentinel_auth: &SentinelAuth,
        node: &str,
        timeout: Duration,
        inboxes: Vec<Arc<Inbox>>,
        metrics: Arc<Metrics>,
        limits: HistoryLimits,
        idempotency: IdempotencyLimits,
        decode_attachment: Option<AttachmentDecoder>,
    ) -> Result<RedisBroker, String> {
        let sha = sha1_hex(SCRIPT.as_bytes());
        let mut shards = Vec::new();
        let mut down_at_start = Vec::new();
        let urls = sentinel::split_urls(url);
        let cluster = shard::cluster_url(&urls)?;
        if cluster.is_some() {
            shards = (0..PARTITIONS)
                .map(|_| Shard::place(tls.clone(), node, timeout, &metrics))
                .collect();
        }
        for one in urls.iter().filter(|_| cluster.is_none()) {
            let opened = Shard::open(
                one,
                SCRIPT,
                sentinel_auth,
                tls.clone(),
                node,
                timeout,
                &metrics,
            )?;
            if opened.down_at_start {
                down_at_start.push(opened.shard.label.clone());
            }
            shards.push(opened.shard);
        }
        if shards.is_empty() {
            return Err(format!("broker {:?}: no Redis URL", Urls(url)));
        }
        metrics.broker_configured.store(1, Relaxed);
        let core = Arc::new(Core {
            state: Mutex::new(State {
                topics: HashMap::new(),
                connected: vec![false; shards.len()],
                leaving: VecDeque::new(),
            }),
            changed: Condvar::new(),
            inboxes,
            metrics,
            limits,
            idempotency,
            shards,
            cluster: cluster.map(topology::Topology::new),
            tls,
            timeout,
            name: node.to_owned(),
            sha,
            stop: AtomicBool::new(false),
            start: Instant::now(),
            decode_attachment,
            nonce: AtomicU64::new(0),
            node_epoch: random_epoch(u64::MAX),
            frozen: AtomicBool::new(false),
            delta: std::sync::OnceLock::new(),
            debounce: std::sync::OnceLock::new(),
        });
        let mut readers = Vec::new();
        if core.cluster.is_some() {
            core.first_topology(url, &mut down_at_start)?;
            let c = Arc::clone(&core);
            readers.push(
                std::thread::Builder::new()
                    .name("clarion-topology".to_owned())
                    .spawn(move || c.watch_topology())
                    .map_err(|e| format!("cannot start the topology thread: {e}"))?,
            );
        }
        for shard in 0..core.shards.len() {
            let c = Arc::clone(&core);
            let reader = std::thread::Builder::new()
                .name(format!("clarion-redis-{shard}"))
                .spawn(move || link::run(&c, shard))
                .map_err(|e| format!("cannot start the broker thread: {e}"))?;
            readers.push(reader);
        }
        for shard in 0..core.shards.len() {
            let c = Arc::clone(&core);
            if core
                .shards
                .get(shard)
                .is_some_and(|s| s.endpoint.is_sentinel())
            {
                let watcher = std::thread::Builder::new()
                    .name(format!("clarion-sentinel-{shard}"))
                    .spawn(move || {
                        if let Some(s) = c.shards.get(shard) {
                            s.watch(c.tls.as_deref(), c.timeout, &c.name, &c.stop);
                        }
                    })
                    .map_err(|e| format!("cannot start the sentinel thread: {e}"))?;
                readers.push(watcher);
            }
        }
        // Serve nothing before every subscriber connection is up: a subscription arriving
        // first would be refused as if the broker were down.
        let deadline = Instant::now() + timeout;
        let mut st = lock(&core.state);
        let waited = |st: &State| {
            core.shards
                .iter()
                .enumerate()
                .all(|(i, s)| st.up(i) || down_at_start.contains(&s.label) || !core.in_use(i))
        };
        while !waited(&st) && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            st = core
                .changed
                .wait_timeout(st, left)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
        let down: Vec<String> = (0..core.shards.len())
            .filter(|&i| !st.up(i) && core.in_use(i))
            .filter_map(|i| core.shards.get(i))
            .filter(|s| !down_at_start.contains(&s.label))
            .map(|s| s.endpoint.label())
            .collect();
        drop(st);
        let broker = RedisBroker {
            core,
            readers: Mutex::new(readers),
            streams: crate::config::StreamSettings::default(),
            swept: std::sync::atomic::AtomicU32::new(0),
        };
        if !down.is_empty() {
            return Err(format!(
                "broker {}: the subscriber connection did not come up within {} ms",
                down.join(", "),
                timeout.as_millis()
            ));
        }
        Ok(broker)
    }

    /// The clock the reader threads stamp delivered messages with (seconds since start).
    pub fn clock(&self) -> u32 {
        self.core.clock()
    }

    /// The same broker, bounding appendable messages by `settings` (`stream_*`).
    pub fn streaming(mut self, settings: crate::config::StreamSettings) -> RedisBroker {
        self.streams = settings;
        self
    }

    /// Subscribes one connection of `worker` (see [`super::Broker::subscribe`]): the topics are
    /// followed first (subscribed at Redis and positioned), then the subscriber is counted and
    /// what it missed is read from the streams.
    pub fn subscribe(
        &self,
        worker: usize,
        topics: &[&str],
        since: Since<'_>,
        pending: &mut Vec<Arc<Published>>,
    ) -> Result<Subscribed, Unavailable> {
        let core = &self.core;
        core.follow(topics)?;
        if let Since::Id(given) = since {
            core.catch_up(given, topics);
        }
        let mut positions = Vec::with_capacity(topics.len());
        let mut names = Vec::with_capacity(topics.len());
        {
            let mut st = lock(&core.state);
            if let Some(inbox) = core.inboxes.get(worker) {
                inbox.take(pending);
            }
            for &topic in topics {
                let Some(name) = st.topics.get_key_value(topic).map(|(n, _)| Arc::clone(n)) else {
                    continue;
                };
                if let Some(t) = st.topics.get_mut(topic) {
                    t.joining = t.joining.saturating_sub(1);
                    if let Some(n) = t.per_worker.get_mut(worker) {
                        *n += 1;
                        t.total += 1;
                        core.metrics.subscriptions.fetch_add(1, Relaxed);
                    }
                    let (epoch, last) = t.seq.position();
                    positions.push((epoch.cloned(), last));
                }
                names.push(name);
            }
        }
        let mut out = Subscribed {
            names,
            replay: Vec::new(),
            gaps: Vec::new(),
            position: String::new(),
        };
        out.position = joined_position(&out.names, &positions);
        if matches!(since, Since::Id(_)) {
            core.metrics.resumes.fetch_add(1, Relaxed);
        }
        core.read_since_into(since, &positions, &mut out);
        if matches!(since, Since::Id(_)) && !out.gaps.is_empty() {
            core.metrics.resume_gaps.fetch_add(1, Relaxed);
        }
        Ok(out)
    }

    /// Records that `worker` lost a subscriber to `topic`; after the last one the node lets go
    /// of the topic, lazily ([`leave`]).
    pub fn unsubscribe(&self, worker: usize, topic: &str) {
        let core = &self.core;
        let mut st = lock(&core.state);
        let Some(t) = st.topics.get_mut(topic) else {
            return;
        };
        let Some(n) = t.per_worker.get_mut(worker).filter(|n| **n > 0) else {
            return;
        };
        *n -= 1;
        t.total -= 1;
        core.metrics.subscriptions.fetch_sub(1, Relaxed);
        if t.unused() {
            core.release(&mut st, topic);
        }
    }

    /// What a subscriber to `topics` would be replayed since `since`, from the streams.
    pub fn read_since(&self, topics: &[&str], since: Since<'_>) -> Subscribed {
        let core = &self.core;
        let names: Vec<Arc<str>> = topics.iter().map(|&t| Arc::from(t)).collect();
        let mut positions = Vec::with_capacity(topics.len());
        for &t in topics {
            positions.push(core.remote_position(t).unwrap_or((None, 0)));
        }
        let mut out = Subscribed {
            names,
            replay: Vec::new(),
            gaps: Vec::new(),
            position: String::new(),
        };
        out.position = joined_position(&out.names, &positions);
        core.read_since_into(since, &positions, &mut out);
        out
    }

    /// Every topic this node follows (see [`super::Broker::visit_topics`]).
    pub fn visit_topics(&self, mut visit: impl FnMut(&Arc<str>, u64, &mut TopicTraffic)) {
        let mut st = lock(&self.core.state);
        for (name, t) in &mut st.topics {
            visit(name, t.total, &mut t.traffic);
        }
    }

    /// A followed topic's subscribers on this node and traffic (history is in Redis: `held` 0).
    pub fn topic_status(&self, topic: &str) -> Option<TopicStatus> {
        let st = lock(&self.core.state);
        st.topics.get(topic).map(|t| TopicStatus {
            subscribers: t.total,
            traffic: t.traffic,
            held: 0,
        })
    }

    /// Sends the topics of `topics` as deltas from now on (once, at start).
    pub fn set_delta_topics(&self, topics: crate::delta::DeltaTopics) {
        if !topics.is_empty() {
            let _ = self.core.delta.set(topics);
        }
    }

    /// Debounces the live delivery of `max_rate` topics (once, at start).
    pub fn set_debounce(&self, d: Arc<crate::broker::debounce::Debouncer>) {
        let _ = self.core.debounce.set(d);
    }

    /// This process's own epoch: a prefix unique to it (GRIP connection ids), and with `-0` a
    /// resume "from the very start" of any topic.
    pub fn epoch(&self) -> &str {
        &self.core.node_epoch
    }

    /// Commands routed by topic partition through this broker's Redis (or Redis Cluster).
    pub fn router(&self) -> topology::Router {
        topology::Router(Arc::clone(&self.core))
    }

    /// Whether the subscriber connection is up.
    pub fn connected(&self) -> bool {
        self.core.all_up(&lock(&self.core.state))
    }

    /// Wakes every worker.
    pub fn wake_all(&self) {
        for inbox in &self.core.inboxes {
            inbox.wake();
        }
    }

    /// Stops the reader thread (bounded by the command timeout).
    pub fn shutdown(&self) {
        self.core.stop.store(true, Relaxed);
        self.core.stop_topology();
        for shard in &self.core.shards {
            if let Some(w) = lock(&shard.writer).as_ref() {
                w.shutdown();
            }
        }
        for h in lock(&self.readers).drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for RedisBroker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Seconds a topic's metadata (epoch and offset) outlives its last publish, at least: long
/// enough that a client away for a day resumes with an exact answer (a gap notice, or its
/// messages) rather than a new epoch.
const META_TTL_SECS: u64 = 86_400;

impl From<LinkError> for Unavailable {
    fn from(e: LinkError) -> Unavailable {
        Unavailable(e.to_string())
    }
}

impl Core {
    fn clock(&self) -> u32 {
        self.start.elapsed().as_secs() as u32
    }

    /// The shard holding `topic`.
    pub(crate) fn shard_of(&self, topic: &str) -> usize {
        self.shard_of_partition(partition(topic))
    }

    /// The shard holding partition `p`: `p mod k` of `k` Redis servers, or in a Redis Cluster
    /// the place of the master serving its slot.
    pub(crate) fn shard_of_partition(&self, p: u32) -> usize {
        match &self.cluster {
            Some(topo) => topo.place(p),
            None => p as usize % self.shards.len().max(1),
        }
    }

    /// Whether shard `i` serves any topic (in a Redis Cluster most places are free).
    fn in_use(&self, i: usize) -> bool {
        self.cluster.as_ref().is_none_or(|t| t.in_use(i))
    }

    /// Whether the subscriber connection of every shard in use is up.
    fn all_up(&self, st: &State) -> bool {
        (0..self.shards.len()).all(|i| st.up(i) || !self.in_use(i))
    }

    /// Runs `EVALSHA` calls of `script` on one shard, loading it again where Redis lost it
    /// (restarted or flushed its scripts: the calls that answered NOSCRIPT did nothing).
    pub(crate) fn run_script_calls(
        &self,
        shard: usize,
        script: &str,
        cmds: &[Vec<Vec<u8>>],
    ) -> Result<Vec<Value>, Unavailable> {
        let pool = &self
            .shards
            .get(shard)
            .ok_or_else(|| Unavailable("no such shard".to_owned()))?
            .pool;
        let noscript = |r: &Value| matches!(r, Value::Error(e) if e.starts_with("NOSCRIPT"));
        let mut replies = pool.call(cmds).map_err(Unavailable::from)?;
        if replies.iter().any(noscript) {
            pool.call(&[vec![
                b"SCRIPT".to_vec(),
                b"LOAD".to_vec(),
                script.as_bytes().to_vec(),
            ]])
            .map_err(Unavailable::from)?;
            let again: Vec<Vec<Vec<u8>>> = cmds
                .iter()
                .zip(&replies)
                .filter(|(_, r)| noscript(r))
                .map(|(c, _)| c.clone())
                .collect();
            let mut redone = pool.call(&again).map_err(Unavailable::from)?.into_iter();
            for r in &mut replies {
                if noscript(r) {
                    if let Some(v) = redone.next() {
                        *r = v;
                    }
                }
            }
        }
        Ok(replies)
    }

    /// A new random epoch for a topic created by this publish.
    fn fresh_epoch(&self) -> String {
        random_epoch(self.nonce.fetch_add(1, Relaxed))
    }

    /// Makes sure this node follows every one of `topics` and knows its position, counting the
    /// caller as joining each (the count is turned into a subscriber by the caller, or undone
    /// here on failure).
    fn follow(&self, topics: &[&str]) -> Result<(), Unavailable> {
        let deadline = Instant::now() + self.timeout;
        let mut st = lock(&self.state);
        let workers = self.inboxes.len();
        for &topic in topics {
            let t = st
                .topics
                .entry(Arc::from(topic))
                .or_insert_with(|| Topic::new(workers));
            t.joining += 1;
        }
        let mut to_send: Vec<(usize, String)> = Vec::new();
        loop {
            if topics.iter().any(|t| !st.up(self.shard_of(t))) {
                self.abandon(&mut st, topics);
                return Err(Unavailable(
                    "the broker is unreachable (reconnecting)".to_owned(),
                ));
            }
            let mut waiting = false;
            to_send.clear();
            for &topic in topics {
                let Some(t) = st.topics.get_mut(topic) else {
                    continue;
                };
                match t.follow {
                    Follow::Live if t.seq.ready() => {}
                    Follow::Idle => {
                        t.follow = Follow::Subscribing;
                        t.unconfirmed += 1;
                        to_send.push((self.shard_of(topic), keys(topic)[2].clone()));
                        waiting = true;
                    }
                    _ => waiting = true,
                }
            }
            for shard in 0..self.shards.len() {
                let cmds: Vec<Vec<Vec<u8>>> = to_send
                    .iter()
                    .filter(|(s, _)| *s == shard)
                    .map(|(_, c)| vec![b"SSUBSCRIBE".to_vec(), c.as_bytes().to_vec()])
                    .collect();
                if cmds.is_empty() {
                    continue;
                }
                if let Err(e) = self.send_sub(shard, &cmds) {
                    self.abandon(&mut st, topics);
                    return Err(Unavailable(format!("the broker is unreachable: {e}")));
                }
            }
            if !waiting {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                self.abandon(&mut st, topics);
                self.metrics.broker_errors.fetch_add(1, Relaxed);
                return Err(Unavailable(
                    "the broker did not confirm the subscription in time".to_owned(),
                ));
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }

    /// Undoes the joining counts of a failed [`Core::follow`].
    fn abandon(&self, st: &mut State, topics: &[&str]) {
        for &topic in topics {
            if let Some(t) = st.topics.get_mut(topic) {
                t.joining = t.joining.saturating_sub(1);
                if t.unused() {
                    self.release(st, topic);
                }
            }
        }
    }

    /// Writes commands on the subscriber connection.
    fn send_sub(&self, shard: usize, cmds: &[Vec<Vec<u8>>]) -> std::io::Result<()> {
        let mut out = Vec::new();
        for c in cmds {
            clarion_proto::resp::encode_command(&mut out, c);
        }
        let writer = self.shards.get(shard).map(|s| lock(&s.writer));
        match writer.as_deref().and_then(Option::as_ref) {
            Some(w) => w.write_all(&out),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "no subscriber connection",
            )),
        }
    }

    /// Hands a presence event to this node's workers with a subscriber of its topic.
    pub(crate) fn announce(&self, event: Arc<Published>) {
        let st = lock(&self.state);
        if let Some(t) = st.topics.get(&*event.topic) {
            self.fan_out(t, &[event]);
        }
    }

    /// Hands `msgs` (of one topic, in order) to every worker with a subscriber to it. Called
    /// with the state lock held, which is what orders deliveries with subscriptions.
    fn fan_out(&self, t: &Topic, msgs: &[Arc<Published>]) {
        if self.frozen.load(Relaxed) {
            return;
        }
        for (w, n) in t.per_worker.iter().enumerate() {
            if *n > 0 {
                if let Some(inbox) = self.inboxes.get(w) {
                    inbox.push(msgs.iter().cloned());
                }
            }
        }
    }

    /// A live gap notice for `t`'s subscribers, positioned at `epoch-at`.
    fn notice(
        &self,
        name: &Arc<str>,
        t: &Topic,
        since: String,
        reason: GapReason,
        epoch: Arc<str>,
        at: u64,
    ) {
        self.metrics.broker_live_gaps.fetch_add(1, Relaxed);
        let gap = Gap {
            topic: Arc::clone(name),
            since,
            reason,
        };
        let m = Arc::new(Published::notice(
            Arc::clone(name),
            at,
            epoch,
            self.clock(),
            &gap,
        ));
        self.fan_out(t, &[m]);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn positions_join_per_topic() {
        let names: Vec<Arc<str>> = vec!["a".into(), "b.c".into()];
        assert_eq!(
            joined_position(&names, &[(Some("ab".into()), 3), (None, 0)]),
            "a:ab-3,b.c:0-0"
        );
        assert_eq!(
            joined_position(&names[..1], &[(Some("ab".into()), 3)]),
            "ab-3"
        );
    }
}

#[cfg(test)]
mod size_tests {
    #[test]
    fn a_followed_topic_costs_a_small_fixed_record() {
        // docs/cluster.md quotes this: the record, besides the name and a counter per worker.
        assert!(
            std::mem::size_of::<super::Topic>() <= 112,
            "{}",
            std::mem::size_of::<super::Topic>()
        );
    }
}
