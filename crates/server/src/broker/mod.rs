//! The broker: the one seam between publishing and delivery. It decides where a message gets
//! its id, where history lives, and how a publish reaches the subscribers of every worker
//! (and, for a clustered broker, of every process).
//!
//! The interface is [`Broker`], an enum over implementations, so every call is a static match
//! and a delivery never goes through a `dyn` call. [`local`] is the single-process, in-memory
//! implementation and the default; a Redis or NATS broker is another variant beside it. The
//! workers' side never changes: a worker subscribes, unsubscribes, publishes through the broker,
//! and drains its [`Inbox`], whatever the broker is.
//!
//! What the rest of the server needs beyond publishing is asked of this seam too, each a
//! capability with its one match over the implementations here: the cluster's rooms
//! ([`Broker::shared_rooms`], [`rooms`]), cluster-wide topic occupancy ([`Broker::occupancy`]),
//! a hand-over's refusal, freeze and positions ([`Broker::freeze`]), and opening the broker a
//! configuration names ([`Broker::open`]). No file outside `broker/` names a variant or an
//! implementation (`tests/module_layers.rs` holds it), and `tests/broker_contract.rs` runs the
//! same cases against every implementation.
//!
//! # Contract
//!
//! Every implementation must keep these promises; the workers' delivery code relies on them.
//!
//! - **Ids.** Each published message gets one id, `EPOCH-SEQ` ([`clarion_proto::event_id`]).
//!   `SEQ` is a `u64` that strictly increases in publish order across all topics within an
//!   epoch; ids are never reused. [`Broker::publish`] returns them in [`Receipt`]s, one per
//!   message, in the order given.
//! - **Epochs.** An epoch names one continuous history (for [`local`], one server run). Ids of
//!   another epoch cannot be compared with this one's: a resume from such an id replays
//!   everything held and reports a [`GapReason::Epoch`](crate::message::GapReason) gap. A
//!   syntactically invalid id, or one from this epoch but not issued yet, is treated the same.
//! - **Ordering.** There is one publish order. Every worker's inbox receives the messages it
//!   has subscribers for in that order, so subscribers on different workers see the same
//!   sequence. The messages of one `publish` call are consecutive in it.
//! - **Fan-out.** A message reaches each worker that has a subscriber at most once, as one
//!   shared `Arc<Published>` (encoded once; every worker and every subscriber shares it), and
//!   the worker is woken once per batch. Workers without a subscriber of the topic get nothing.
//! - **Subscribe with since.** [`Broker::subscribe`] counts the subscriber and, in the same
//!   atomic step, takes everything already waiting in that worker's inbox into `pending` (the
//!   worker delivers it to its existing subscribers before adding the new one) and computes
//!   what the subscriber missed since `since`: [`Subscribed::replay`] in publish order, and a
//!   [`Gap`] for each topic where history can no longer serve the whole of it
//!   ([`GapReason::Trimmed`](crate::message::GapReason)). Every message published after the
//!   step reaches the subscriber through the inbox. So a resume is gap-free when no gap is
//!   reported, and never delivers a message twice.
//! - **Unsubscribe** undoes one subscribe of one topic by that worker; extra calls are ignored.
//! - **Read since.** [`Broker::read_since`] computes the same replay and gaps as a subscribe,
//!   without subscribing and without touching any inbox.
//! - **History** is bounded by [`HistoryLimits`](crate::config::HistoryLimits) (count per topic,
//!   age, memory); trimming a message that a later resume asks for must be reported as a gap,
//!   even when its topic has been forgotten meanwhile.
//! - **Locks.** An implementation may hold its own lock while appending to inboxes (that is how
//!   [`local`] keeps one order), so its lock comes before any [`Inbox`] lock; workers never call
//!   the broker while holding their inbox's lock.

pub mod debounce;
mod freeze;
pub mod local;
pub mod nats;
pub mod occupancy;
mod open;
pub mod redis;
mod repeats;
pub mod rooms;

use std::sync::Arc;

use clarion_proto::pubsub::wire;
use clarion_proto::ws::DataKind;

pub use freeze::Frozen;
pub use local::LocalBroker;
pub use nats::NatsBroker;
pub use redis::RedisBroker;

use crate::hub::{Inbox, TopicTraffic};
use crate::message::{Attachment, Gap, Published};

/// Turns the bytes of an attachment back into one (GRIP content travels between nodes and
/// processes this way; the broker cannot name the mode that encoded it).
pub type AttachmentDecoder = fn(&[u8]) -> Option<Arc<dyn Attachment>>;

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
    /// The publisher's `Idempotency-Key` (checked with
    /// [`clarion_proto::pubsub::validate_key`]): within `idempotency_window`, a message with
    /// the same key on the same topic is not published again, and its receipt is the first's.
    pub key: Option<&'a str>,
    /// Filter tags (`docs/filters.md`), checked with [`clarion_proto::filter::validate_tags`].
    pub tags: &'a [(String, String)],
    /// The publisher's conflation key (`docs/conflation.md`), checked with
    /// [`clarion_proto::conflate::validate_publish_key`].
    pub conflation_key: Option<&'a str>,
}

impl Outgoing<'_> {
    /// The message as nodes exchange it through a cluster broker ([`wire`]), its attachment
    /// encoded by its own mode.
    pub fn wire_body(&self) -> Vec<u8> {
        let attachment = self.attachment.as_ref().and_then(|a| a.encode());
        let tags = crate::message::encode_tags(self.tags);
        let mut body = Vec::with_capacity(self.payload.len() + 16);
        wire::Body {
            kind: self.kind,
            event: self.event,
            attachment: attachment.as_deref(),
            tags: tags.as_deref(),
            conflation_key: self.conflation_key,
            payload: self.payload,
        }
        .encode(&mut body);
        body
    }
}

/// What an appendable-message publish does ([`Broker::stream`]).
#[derive(Debug, Clone, Copy)]
pub enum StreamOp<'a> {
    /// Opens a stream: the fragment is its first (`seq` 1).
    Open,
    /// Appends the fragment to the stream of this id; `done` closes it.
    Append {
        /// The stream's id, as its opening publish's receipt gave it.
        stream: &'a str,
        /// The last fragment: the stream is closed with it.
        done: bool,
    },
}

/// One fragment of a run given to [`Broker::stream_many`].
#[derive(Debug, Clone, Copy)]
pub struct Fragment<'a> {
    /// The stream's topic.
    pub topic: &'a str,
    /// Open, or append to which stream.
    pub op: StreamOp<'a>,
    /// The fragment's text.
    pub text: &'a str,
    /// The publisher's idempotency key, if any.
    pub key: Option<&'a str>,
}

/// What a stream publish did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamReceipt {
    /// The fragment's id (its position in the topic).
    pub id: String,
    /// The stream's id.
    pub stream: String,
    /// The fragment's number in the stream.
    pub seq: u32,
    /// Subscribers of the topic in this process when it was published.
    pub subscribers: u64,
    /// The stream is closed.
    pub done: bool,
    /// It repeats an `Idempotency-Key` seen within `idempotency_window`: the first fragment's
    /// answer, and nothing was appended or delivered.
    pub repeat: bool,
}

/// Why a stream publish was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamRefusal {
    /// No stream of that id is open on the topic (never opened, or forgotten).
    Unknown,
    /// The stream is closed (done, or timed out).
    Closed,
    /// Past a stream's fragments or bytes (`stream_max_fragments`, `stream_max_bytes`).
    TooLarge(String),
    /// The topic has `stream_max_open` streams open.
    TooManyOpen(usize),
    /// The broker could not take it (see [`Unavailable`]).
    Unavailable(Unavailable),
}

/// What a publish did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The id given to the message, `EPOCH-SEQ`.
    pub id: String,
    /// How many subscribers it was handed to.
    pub subscribers: u64,
    /// The message repeated an [`Outgoing::key`] published within the window: nothing was
    /// published, and `id` is the first message's.
    pub repeat: bool,
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
    /// The topic's last message, if history still holds one, then everything after it: the
    /// last message is chosen in the same atomic step that starts the subscription, so no
    /// publish falls between it and the live messages (state-then-follow, docs/history.md).
    Latest,
}

impl<'a> Since<'a> {
    /// The start a client asked for with `since=` (URL) or `"since"` (clarion.v1):
    /// [`clarion_proto::event_id::LATEST`] or an id; none is [`Since::Now`].
    pub fn from_cursor(given: Option<&'a str>) -> Since<'a> {
        match given {
            None => Since::Now,
            Some(clarion_proto::event_id::LATEST) => Since::Latest,
            Some(id) => Since::Id(id),
        }
    }
}

/// What [`Broker::subscribe`] (or [`Broker::read_since`]) found.
pub struct Subscribed {
    /// The topic names, shared with the broker (same order as requested).
    pub names: Vec<Arc<str>>,
    /// Messages the subscriber missed, in publish order, across all its topics.
    pub replay: Vec<Arc<Published>>,
    /// Topics for which the replay is incomplete.
    pub gaps: Vec<Gap>,
    /// The id of the last message published before the subscription began.
    pub position: String,
}

/// One topic as [`Broker::topic_status`] sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopicStatus {
    /// Subscribers across workers (in this process).
    pub subscribers: u64,
    /// Its publish counter and last sampled rate.
    pub traffic: TopicTraffic,
    /// Messages held in its history.
    pub held: usize,
}

/// The broker cannot take the request now (a clustered broker that is unreachable or stalled):
/// a publish is answered `503` with this reason, never `200` for a message that went nowhere.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

impl Unavailable {
    /// The reason while a hand-over is frozen (an upgrade: `SIGUSR1`, `--upgrade-from`): the
    /// publish went nowhere and the new process takes publishes within a second or so.
    pub const UPGRADING: &'static str =
        "an upgrade is in progress: this process is handing its connections to the new one; \
         publish again in a moment";

    /// Refused because a hand-over froze this process.
    pub fn upgrading() -> Unavailable {
        Unavailable(Self::UPGRADING.to_owned())
    }

    /// Whether this is the refusal of a frozen process ([`Unavailable::upgrading`]).
    pub fn during_upgrade(&self) -> bool {
        self.0 == Self::UPGRADING
    }
}

/// The broker in use: shared by the API, every worker, and in-band publishers.
pub enum Broker {
    /// One process, in memory: ids from a counter, history in this process.
    Local(LocalBroker),
    /// Many processes through Redis: ids and history per topic in Redis (`docs/cluster.md`).
    Redis(RedisBroker),
    /// Many processes through NATS: fan-out only; ids and history per node.
    Nats(NatsBroker),
}

impl Broker {
    /// The in-memory broker for workers `0..inboxes.len()`.
    pub fn local(
        inboxes: Vec<Arc<Inbox>>,
        metrics: Arc<crate::metrics::Metrics>,
        limits: crate::config::HistoryLimits,
    ) -> Broker {
        Broker::Local(LocalBroker::new(inboxes, metrics, limits))
    }

    /// Computes deltas for the publications of `topics` from now on (`delta_topics`; once,
    /// at start).
    pub fn set_delta_topics(&self, topics: crate::delta::DeltaTopics) {
        match self {
            Broker::Local(b) => b.set_delta_topics(topics),
            Broker::Redis(b) => b.set_delta_topics(topics),
            Broker::Nats(b) => b.set_delta_topics(topics),
        }
    }

    /// Debounces the live delivery of `max_rate` topics from now on (once, at start).
    pub fn set_debounce(&self, d: Arc<debounce::Debouncer>) {
        match self {
            Broker::Local(b) => b.set_debounce(d),
            Broker::Redis(b) => b.set_debounce(d),
            Broker::Nats(b) => b.set_debounce(d),
        }
    }

    /// The current epoch, the first part of every id issued now. A clustered broker's epochs
    /// are per topic; its process has its own (unique per process, so it can prefix GRIP
    /// connection ids), and `EPOCH-0` asks for a topic's history from its start.
    pub fn epoch(&self) -> &str {
        match self {
            Broker::Local(b) => b.epoch(),
            Broker::Redis(b) => b.epoch(),
            Broker::Nats(b) => b.epoch(),
        }
    }

    /// Publishes messages in order and returns one receipt per message. The in-memory broker
    /// always can; a clustered one answers [`Unavailable`] when its broker is not reachable.
    pub fn publish(&self, msgs: &[Outgoing<'_>]) -> Result<Vec<Receipt>, Unavailable> {
        match self {
            Broker::Local(b) => b.try_publish(msgs),
            Broker::Redis(b) => b.refuse_if_frozen().and_then(|()| b.publish(msgs)),
            Broker::Nats(b) => b.publish(msgs),
        }
    }

    /// [`Broker::publish`] at hub time `now` ([`Broker::clock`] as the caller read it), for a
    /// caller that must not read a clock (a worker engine: its shell passes the time in).
    /// Redis stamps its messages where its reader threads receive them, so `now` is not used.
    pub fn publish_at(&self, msgs: &[Outgoing<'_>], now: u32) -> Result<Vec<Receipt>, Unavailable> {
        match self {
            Broker::Local(b) => b.try_publish_at(msgs, now),
            Broker::Redis(b) => b.refuse_if_frozen().and_then(|()| b.publish(msgs)),
            Broker::Nats(b) => b.publish_at(msgs, now),
        }
    }

    /// Opens or appends to an appendable message (`docs/protocol.md`, "Appendable messages")
    /// with one fragment: in memory, in Redis for the whole cluster, or through NATS into each
    /// node's own copy (`docs/cluster.md`). A fragment repeating an `Idempotency-Key` `key`
    /// is answered its first attempt's receipt (`repeat`), as a repeated publish is.
    pub fn stream(
        &self,
        topic: &str,
        op: StreamOp<'_>,
        fragment: &str,
        key: Option<&str>,
    ) -> Result<StreamReceipt, StreamRefusal> {
        match self {
            Broker::Local(b) => b.stream_keyed(topic, op, fragment, key, b.clock()),
            Broker::Redis(b) => b.stream(topic, op, fragment, key),
            Broker::Nats(b) => b.stream(topic, op, fragment, key),
        }
    }

    /// [`Broker::stream`] for each fragment of a run, in order, with one answer each. No stream
    /// may appear twice in a run (the caller cuts runs so): Redis pipelines the run in one
    /// round trip, so a fragment's refusal cannot stop a later one of its stream within it.
    pub fn stream_many(&self, run: &[Fragment<'_>]) -> Vec<Result<StreamReceipt, StreamRefusal>> {
        match self {
            Broker::Redis(b) => b.stream_many(run),
            Broker::Local(_) | Broker::Nats(_) => run
                .iter()
                .map(|f| self.stream(f.topic, f.op, f.text, f.key))
                .collect(),
        }
    }

    /// The hub clock in seconds (history ages are counted on it): read by the worker shell
    /// once per loop iteration and passed into its engine.
    pub fn clock(&self) -> u32 {
        match self {
            Broker::Local(b) => b.clock(),
            Broker::Redis(b) => b.clock(),
            Broker::Nats(b) => b.clock(),
        }
    }

    /// Whether the broker is reachable (always, for the in-memory one): `/healthz` says so.
    pub fn healthy(&self) -> bool {
        match self {
            Broker::Local(_) => true,
            Broker::Redis(b) => b.connected(),
            Broker::Nats(b) => b.connected(),
        }
    }

    /// Stops a clustered broker's threads and connections; closes the in-memory one's durable
    /// log (`history_dir`). Called once every worker has stopped.
    pub fn shutdown(&self) {
        match self {
            // With `history_dir`: sync the log and record the clean stop.
            Broker::Local(b) => b.close(),
            Broker::Redis(b) => b.shutdown(),
            Broker::Nats(b) => b.shutdown(),
        }
    }

    /// Subscribes one connection of `worker` to `topics` (valid, distinct names), moves what
    /// waits in the worker's inbox into `pending`, and computes what it missed since `since`.
    pub fn subscribe(
        &self,
        worker: usize,
        topics: &[&str],
        since: Since<'_>,
        pending: &mut Vec<Arc<Published>>,
    ) -> Result<Subscribed, Unavailable> {
        match self {
            Broker::Local(b) => Ok(b.subscribe(worker, topics, since, pending)),
            Broker::Redis(b) => b.subscribe(worker, topics, since, pending),
            Broker::Nats(b) => Ok(b.subscribe(worker, topics, since, pending)),
        }
    }

    /// Records that `worker` lost a subscriber to `topic`.
    pub fn unsubscribe(&self, worker: usize, topic: &str) {
        match self {
            Broker::Local(b) => b.unsubscribe(worker, topic),
            Broker::Redis(b) => b.unsubscribe(worker, topic),
            Broker::Nats(b) => b.unsubscribe(worker, topic),
        }
    }

    /// Hands a presence event ([`Published::presence`]) to this process's workers that have a
    /// subscriber of its topic, behind every message already handed to them: so it arrives in
    /// order with the topic's messages. Not kept in history, never sent to other nodes (the
    /// caller orders events; see `crate::presence`).
    pub fn announce(&self, event: Arc<Published>) {
        match self {
            Broker::Local(b) => b.announce(event),
            Broker::Redis(b) => b.announce(event),
            Broker::Nats(b) => b.announce(event),
        }
    }

    /// What a subscriber to `topics` would be replayed since `since`, without subscribing.
    pub fn read_since(&self, topics: &[&str], since: Since<'_>) -> Subscribed {
        match self {
            Broker::Local(b) => b.read_since(topics, since),
            Broker::Redis(b) => b.read_since(topics, since),
            Broker::Nats(b) => b.read_since(topics, since),
        }
    }

    /// Calls `visit` with every topic this process knows (name, subscribers, traffic counters)
    /// under the broker's lock, so a visit must be short: the dashboard's once-a-second
    /// sampler is its one caller.
    pub fn visit_topics(&self, visit: impl FnMut(&Arc<str>, u64, &mut TopicTraffic)) {
        match self {
            Broker::Local(b) => b.visit_topics(visit),
            Broker::Redis(b) => b.visit_topics(visit),
            Broker::Nats(b) => b.visit_topics(visit),
        }
    }

    /// A topic's subscriber count, traffic and history length, if it is known.
    pub fn topic_status(&self, topic: &str) -> Option<TopicStatus> {
        match self {
            Broker::Local(b) => b.topic_status(topic),
            Broker::Redis(b) => b.topic_status(topic),
            Broker::Nats(b) => b.topic_status(topic),
        }
    }

    /// Trims history by age and memory; a worker calls it about once a second.
    pub fn expire(&self) {
        match self {
            Broker::Local(b) => {
                b.close_stale_streams(b.clock());
                b.expire()
            }
            // Redis trims each stream itself (MAXLEN, EXPIRE); stale appendable messages are
            // closed once across the cluster by whichever node sweeps first.
            Broker::Redis(b) => b.close_stale_streams(),
            Broker::Nats(b) => b.expire(),
        }
    }

    /// The cluster's shared rooms, when this broker keeps them (see [`rooms`]).
    pub fn shared_rooms(&self) -> Option<rooms::SharedRooms<'_>> {
        match self {
            Broker::Local(_) | Broker::Nats(_) => None,
            Broker::Redis(b) => Some(rooms::SharedRooms::redis(b)),
        }
    }

    /// Cluster-wide topic occupancy for node `node`, when this broker can decide it (see
    /// [`occupancy`]).
    pub fn occupancy(&self, node: &str) -> Option<Box<dyn occupancy::Occupancy>> {
        match self {
            Broker::Local(_) | Broker::Nats(_) => None,
            Broker::Redis(b) => Some(Box::new(redis::occupancy::RedisOccupancy::new(
                b.router(),
                node.to_owned(),
            ))),
        }
    }

    /// Wakes every worker (used to announce shutdown).
    pub fn wake_all(&self) {
        match self {
            Broker::Local(b) => b.wake_all(),
            Broker::Redis(b) => b.wake_all(),
            Broker::Nats(b) => b.wake_all(),
        }
    }
}
