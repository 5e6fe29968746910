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

use crate::redact::Urls;
use std::sync::{Arc, Mutex};

use clarion_proto::nats::SubjectMap;
use clarion_proto::pubsub::wire;

use super::{
    AttachmentDecoder, LocalBroker, Outgoing, Receipt, Since, Subscribed, TopicStatus, Unavailable,
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
        let handler = {
            let local = Arc::clone(&local);
            let subjects = subjects.clone();
            let metrics = Arc::clone(&metrics);
            Box::new(move |event: LinkEvent<'_>| match event {
                LinkEvent::Message { subject, payload } => {
                    receive(&local, &subjects, subject, payload, decode_attachment);
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
        })
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

    /// Trims the local history.
    pub fn expire(&self) {
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

/// A message another node published: into the local broker, as if published here.
fn receive(
    local: &LocalBroker,
    subjects: &SubjectMap,
    subject: &str,
    payload: &[u8],
    decode_attachment: Option<AttachmentDecoder>,
) {
    let Some(topic) = subjects.topic(subject) else {
        return;
    };
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
        topic: &topic,
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
