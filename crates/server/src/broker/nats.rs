//! The NATS broker: core NATS subjects fan messages out to every node; each node keeps its own
//! ids and history (`docs/cluster.md` says why JetStream is not used).
//!
//! A node is the in-memory broker ([`LocalBroker`]) plus a [`NatsLink`]. A publish on this node
//! goes to NATS (one subject per topic, under `clarion.t`) and to the local broker; a message
//! from NATS (other nodes' publishes: the link connects with `echo` off) is published into the
//! local broker as if made here. So every node's subscribers get every message, in the order
//! each publishing node sent them, and a resume on the node that served the client before is
//! exact as far as that node's history reaches. Ids are the node's own: a resume on another
//! node is answered with an `epoch` gap notice, like a resume after a restart.
//!
//! A node subscribes to a topic's subject while it has a subscriber to it. Core NATS is
//! at-most-once and has no history: what other nodes published while the link was down, or
//! before a subscription reached the server, is not delivered here.
//!
//! Appendable messages (`docs/cluster.md`, "Appendable messages through NATS") ride the same
//! model: the node that opens a stream keeps it in its local broker and sends each fragment to
//! NATS with the stream's identity (its id on the opening node, an
//! [`clarion_proto::pubsub::append_wire`] body); every node that receives the
//! opening fragment opens a stream of its own in its local broker and folds the fragments it
//! receives into it, so its subscribers get them live and its history holds the text so far.
//! [`Foreign`] maps the opening node's ids to this node's.

use crate::redact::Urls;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use clarion_proto::nats::SubjectMap;
use clarion_proto::pubsub::append::CloseReason;
use clarion_proto::pubsub::append_wire::{self, StreamBody};
use clarion_proto::pubsub::wire;

use super::{
    AttachmentDecoder, LocalBroker, Outgoing, Receipt, Since, StreamOp, StreamReceipt,
    StreamRefusal, Subscribed, TopicStatus, Unavailable,
};
use crate::cluster::nats_link::{LinkError, LinkEvent, LinkMetrics, NatsLink};
use crate::hub::{lock, TopicTraffic};
use crate::message::Published;
use crate::metrics::Metrics;

/// The clustered broker over NATS.
pub struct NatsBroker {
    local: Arc<LocalBroker>,
    link: Mutex<Option<NatsLink>>,
    subjects: SubjectMap,
    /// Held while a subscriber count and the NATS subscription change together, so the last
    /// unsubscribe on one worker never races the first subscribe on another.
    interest: Mutex<()>,
    /// Streams other nodes opened that this node folds (shared with the link's handler).
    foreign: Arc<Mutex<Foreign>>,
}

/// Open streams other nodes opened, by topic and their id there, with the id of the stream
/// this node folds them into. Bounded: the oldest is forgotten past [`FOREIGN_REMEMBERED`]
/// (its later fragments are then dropped here, as those of a stream this node never saw open).
#[derive(Default)]
struct Foreign {
    ids: HashMap<(Arc<str>, String), String>,
    order: VecDeque<(Arc<str>, String)>,
}

/// Foreign streams remembered at once (each a few dozen bytes).
const FOREIGN_REMEMBERED: usize = 10_000;

impl Foreign {
    /// This node's id for stream `origin` of `topic`: the mapped one, or `origin` itself when
    /// this node opened it.
    fn local_id(&self, local: &LocalBroker, topic: &str, origin: &str) -> Option<String> {
        if let Some(id) = self.ids.get(&(Arc::from(topic), origin.to_owned())) {
            return Some(id.clone());
        }
        let own = clarion_proto::event_id::parse(origin).is_ok_and(|p| p.epoch == local.epoch());
        own.then(|| origin.to_owned())
    }

    fn insert(&mut self, topic: &str, origin: &str, id: String) {
        let key = (Arc::from(topic), origin.to_owned());
        if self.ids.insert(key.clone(), id).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > FOREIGN_REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }

    fn remove(&mut self, topic: &str, origin: &str) {
        let key = (Arc::from(topic), origin.to_owned());
        if self.ids.remove(&key).is_some() {
            self.order.retain(|k| *k != key);
        }
    }
}

impl NatsBroker {
    /// Starts the link (it connects in the background) over `local`.
    pub fn start(
        url: &str,
        node: &str,
        local: LocalBroker,
        metrics: Arc<Metrics>,
        decode_attachment: Option<AttachmentDecoder>,
    ) -> Result<NatsBroker, String> {
        let local = Arc::new(local);
        let subjects = SubjectMap::default();
        let link_metrics = Arc::new(LinkMetrics::default());
        let foreign = Arc::new(Mutex::new(Foreign::default()));
        let handler = {
            let local = Arc::clone(&local);
            let subjects = subjects.clone();
            let metrics = Arc::clone(&metrics);
            let foreign = Arc::clone(&foreign);
            Box::new(move |event: LinkEvent<'_>| match event {
                LinkEvent::Message { subject, payload } => {
                    let Some(topic) = subjects.topic(subject) else {
                        return;
                    };
                    if append_wire::is_stream_body(payload) {
                        receive_fragment(&local, &foreign, &topic, payload);
                    } else {
                        receive(&local, &topic, payload, decode_attachment);
                    }
                }
                LinkEvent::Connected => {
                    metrics
                        .broker_connected
                        .store(1, std::sync::atomic::Ordering::Relaxed);
                }
                LinkEvent::Disconnected { reason } => {
                    metrics
                        .broker_connected
                        .store(0, std::sync::atomic::Ordering::Relaxed);
                    metrics
                        .broker_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    crate::log::warn(format_args!("broker: NATS connection lost: {reason}"));
                }
                // A clean shutdown is no loss: nothing to warn about.
                LinkEvent::Stopped => {
                    metrics
                        .broker_connected
                        .store(0, std::sync::atomic::Ordering::Relaxed);
                }
            })
        };
        let link = NatsLink::start(url, node, handler, link_metrics)
            .map_err(|e| format!("broker {}: {e}", Urls(url)))?;
        metrics
            .broker_configured
            .store(1, std::sync::atomic::Ordering::Relaxed);
        Ok(NatsBroker {
            local,
            link: Mutex::new(Some(link)),
            subjects,
            interest: Mutex::new(()),
            foreign,
        })
    }

    /// Opens or appends to a stream with one fragment: in the local broker (its limits and
    /// answers), then to the other nodes through NATS. An append names the stream by the id
    /// its opening receipt gave, on any node that folds it (the opening node, or one that
    /// received its opening fragment). Refused when NATS is not connected, as a publish is.
    pub fn stream(
        &self,
        topic: &str,
        op: StreamOp<'_>,
        fragment: &str,
        key: Option<&str>,
    ) -> Result<StreamReceipt, StreamRefusal> {
        let link = lock(&self.link);
        let Some(link) = link.as_ref() else {
            return Err(StreamRefusal::Unavailable(Unavailable(
                "the broker is shutting down".to_owned(),
            )));
        };
        if !link.connected() {
            return Err(StreamRefusal::Unavailable(Unavailable(
                "NATS is unreachable (reconnecting)".to_owned(),
            )));
        }
        let subject = self
            .subjects
            .subject(topic)
            .map_err(|e| StreamRefusal::Unavailable(Unavailable(e.to_string())))?;
        // A key this node remembers: the first answer, nothing sent. Checked and remembered
        // under the link's lock, as a publish's key is; keys are per node, as theirs are.
        if let Some(first) = self.local.repeated_fragment(topic, key) {
            return Ok(first);
        }
        let now = self.local.clock();
        let mut receipt = match op {
            StreamOp::Open => self.local.stream(topic, op, fragment, now)?,
            StreamOp::Append { stream, done } => {
                let local_id = lock(&self.foreign).local_id(&self.local, topic, stream);
                let Some(local_id) = local_id else {
                    return Err(StreamRefusal::Unknown);
                };
                let op = StreamOp::Append {
                    stream: &local_id,
                    done,
                };
                let mut r = self.local.stream(topic, op, fragment, now)?;
                // The publisher goes on naming the stream as it did.
                r.stream = stream.to_owned();
                r
            }
        };
        if let Some(k) = key {
            self.local.remember_fragment(topic, k, &receipt);
        }
        if receipt.done {
            lock(&self.foreign).remove(topic, &receipt.stream);
        }
        let mut body = Vec::with_capacity(fragment.len() + 48);
        StreamBody {
            folded: false,
            stream: &receipt.stream,
            seq: receipt.seq,
            closed: receipt.done.then_some(CloseReason::Done),
            data: fragment,
        }
        .encode(&mut body);
        // Taken here already: a failure now means only this node has the fragment.
        if let Err(e) = link.publish(&subject, &body) {
            crate::log::warn(format_args!(
                "broker: fragment {} of {topic} not sent to NATS: {e}",
                receipt.id
            ));
            receipt.subscribers = 0;
        }
        Ok(receipt)
    }

    /// Sends the topics of `topics` as deltas (computed by the local broker, which every
    /// message of the node goes through in order).
    pub fn set_delta_topics(&self, topics: crate::delta::DeltaTopics) {
        self.local.set_delta_topics(topics);
    }

    /// Debounces `max_rate` topics (the local broker delivers what NATS brings).
    pub fn set_debounce(&self, d: Arc<super::debounce::Debouncer>) {
        self.local.set_debounce(d);
    }

    /// The local broker's epoch.
    pub fn epoch(&self) -> &str {
        self.local.epoch()
    }

    /// Sends `msgs` to the other nodes, then publishes them here. Refused whole when NATS is
    /// not connected, so a `200` always means the message left for every node.
    ///
    /// A message repeating an `Idempotency-Key` this node remembers is neither sent nor
    /// published. The link's lock is held from that check to the local publish that claims the
    /// key, so two publishes with one key on this node cannot both leave; keys are per node.
    pub fn publish(&self, msgs: &[Outgoing<'_>]) -> Result<Vec<Receipt>, Unavailable> {
        self.publish_at(msgs, self.local.clock())
    }

    /// [`NatsBroker::publish`] at hub time `now` (see [`LocalBroker::try_publish_at`]).
    pub fn publish_at(&self, msgs: &[Outgoing<'_>], now: u32) -> Result<Vec<Receipt>, Unavailable> {
        let link = lock(&self.link);
        {
            let Some(link) = link.as_ref() else {
                return Err(Unavailable("the broker is shutting down".to_owned()));
            };
            if !link.connected() {
                return Err(Unavailable("NATS is unreachable (reconnecting)".to_owned()));
            }
            let repeated = self.local.repeated(msgs);
            for (i, m) in msgs.iter().enumerate() {
                if repeated.get(i).copied().unwrap_or(false) {
                    continue;
                }
                let subject = self
                    .subjects
                    .subject(m.topic)
                    .map_err(|e| Unavailable(e.to_string()))?;
                link.publish(&subject, &m.wire_body())
                    .map_err(|e| match e {
                        LinkError::Down => Unavailable("NATS is unreachable".to_owned()),
                        other => Unavailable(format!("NATS refused the publish: {other}")),
                    })?;
            }
        }
        let receipts = self.local.try_publish_at(msgs, now);
        drop(link);
        receipts
    }

    /// The local broker's hub clock (see [`LocalBroker::clock`]).
    pub fn clock(&self) -> u32 {
        self.local.clock()
    }

    /// Subscribes locally, and at NATS for topics that had no subscriber in this process.
    pub fn subscribe(
        &self,
        worker: usize,
        topics: &[&str],
        since: Since<'_>,
        pending: &mut Vec<Arc<Published>>,
    ) -> Subscribed {
        let _interest = lock(&self.interest);
        let fresh: Vec<&str> = topics
            .iter()
            .copied()
            .filter(|t| {
                self.local
                    .topic_status(t)
                    .is_none_or(|s| s.subscribers == 0)
            })
            .collect();
        let sub = self.local.subscribe(worker, topics, since, pending);
        if let Some(link) = lock(&self.link).as_ref() {
            for t in fresh {
                if let Ok(subject) = self.subjects.subject(t) {
                    if let Err(e) = link.subscribe(&subject) {
                        crate::log::warn(format_args!("broker: NATS subscribe {t}: {e}"));
                    }
                }
            }
        }
        sub
    }

    /// Unsubscribes locally, and at NATS when that was the process's last subscriber.
    pub fn unsubscribe(&self, worker: usize, topic: &str) {
        let _interest = lock(&self.interest);
        self.local.unsubscribe(worker, topic);
        if self
            .local
            .topic_status(topic)
            .is_none_or(|s| s.subscribers == 0)
        {
            if let (Some(link), Ok(subject)) =
                (lock(&self.link).as_ref(), self.subjects.subject(topic))
            {
                link.unsubscribe(&subject);
            }
        }
    }

    /// Hands a presence event to this node's subscribers of its topic.
    pub fn announce(&self, event: Arc<Published>) {
        self.local.announce(event);
    }

    /// The local history's answer.
    pub fn read_since(&self, topics: &[&str], since: Since<'_>) -> Subscribed {
        self.local.read_since(topics, since)
    }

    /// The local broker's topics.
    pub fn visit_topics(&self, visit: impl FnMut(&Arc<str>, u64, &mut TopicTraffic)) {
        self.local.visit_topics(visit);
    }

    /// A local topic's status.
    pub fn topic_status(&self, topic: &str) -> Option<TopicStatus> {
        self.local.topic_status(topic)
    }

    /// Closes the local streams left idle past `stream_timeout` (each node its own copies)
    /// and trims the local history.
    pub fn expire(&self) {
        self.local.close_stale_streams(self.local.clock());
        self.local.expire();
    }

    /// Wakes every worker.
    pub fn wake_all(&self) {
        self.local.wake_all();
    }

    /// Whether NATS is connected.
    pub fn connected(&self) -> bool {
        lock(&self.link).as_ref().is_some_and(NatsLink::connected)
    }

    /// Stops the link thread.
    pub fn shutdown(&self) {
        if let Some(link) = lock(&self.link).take() {
            link.shutdown();
        }
    }
}

/// A fragment another node took: opens this node's copy of the stream, or folds it into it.
/// A fragment of a stream this node never saw open (it had no subscriber to the topic then)
/// is dropped, as is one its own limits or timeout refuse.
fn receive_fragment(local: &LocalBroker, foreign: &Mutex<Foreign>, topic: &str, payload: &[u8]) {
    let b = match append_wire::decode(payload) {
        Ok(b) => b,
        Err(e) => {
            crate::log::warn(format_args!("broker: a NATS fragment on {topic}: {e}"));
            return;
        }
    };
    let now = local.clock();
    let mut foreign = lock(foreign);
    let done = b.closed.is_some();
    let answer = if b.seq == 1 {
        local
            .stream(topic, StreamOp::Open, b.data, now)
            .inspect(|r| foreign.insert(topic, b.stream, r.stream.clone()))
    } else {
        match foreign.local_id(local, topic, b.stream) {
            Some(id) => local.stream(topic, StreamOp::Append { stream: &id, done }, b.data, now),
            None => Err(StreamRefusal::Unknown),
        }
    };
    if done {
        foreign.remove(topic, b.stream);
    }
    // Unknown: opened before this node followed the topic (its subscribers see the stream
    // from its next opening on); anything else is worth a line.
    match answer {
        Ok(_) | Err(StreamRefusal::Unknown) => {}
        Err(
            e @ (StreamRefusal::Closed
            | StreamRefusal::TooLarge(_)
            | StreamRefusal::TooManyOpen(_)
            | StreamRefusal::Unavailable(_)),
        ) => crate::log::warn(format_args!(
            "broker: fragment {} of stream {} on {topic} not kept here: {e:?}",
            b.seq, b.stream
        )),
    }
}

/// A message another node published: into the local broker, as if published here.
fn receive(
    local: &LocalBroker,
    topic: &str,
    payload: &[u8],
    decode_attachment: Option<AttachmentDecoder>,
) {
    let body = match wire::decode(payload) {
        Ok(b) => b,
        Err(e) => {
            crate::log::warn(format_args!("broker: a NATS message on {topic}: {e}"));
            return;
        }
    };
    let attachment = match (body.attachment, decode_attachment) {
        (Some(bytes), Some(decode)) => decode(bytes),
        _ => None,
    };
    let tags = crate::message::decode_tags(body.tags);
    // A NATS node's broker has no `history_dir` (the configuration refuses it), so this
    // cannot fail.
    let _ = local.try_publish(&[Outgoing {
        topic,
        tags: &tags,
        conflation_key: body.conflation_key,
        kind: body.kind,
        payload: body.payload,
        event: body.event,
        attachment,
        // The publishing node checked the key; each node keeps its own.
        key: None,
    }]);
}
