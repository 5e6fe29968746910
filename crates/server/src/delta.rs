//! Delta compression of a topic's publications (`docs/delta.md`): which topics have deltas,
//! each topic's previous publication as this node received it, and the delta of a publication
//! against it, computed once per publication on each node.
//!
//! The broker steps a topic's [`Chain`] under the lock that orders the topic's deliveries
//! (so "previous" means the message this node handed its workers just before, on every node
//! of a cluster), and the message carries the resulting [`Delta`] to every worker. Which
//! subscriber gets the delta and which the full message is the worker's decision
//! (`worker::delta`); the bytes on the wire are built once per message in [`crate::message`].
//! This module names neither: it holds ids and bytes only.

use std::sync::{Arc, OnceLock};

use clarion_proto::auth::Pattern;
use clarion_proto::pubsub::Envelope;
use clarion_proto::ws::DataKind;

use crate::config::Config;

/// The topics whose publications are sent as deltas (`delta_topics`).
#[derive(Debug, Default, Clone)]
pub struct DeltaTopics {
    patterns: Vec<Pattern>,
}

impl DeltaTopics {
    /// The configuration's `delta_topics` (validated when the configuration was loaded; a
    /// pattern that does not parse matches nothing).
    pub fn from_config(config: &Config) -> DeltaTopics {
        DeltaTopics {
            patterns: config
                .delta_topics
                .iter()
                .filter_map(|p| Pattern::parse(p).ok())
                .collect(),
        }
    }

    /// Whether `topic` has deltas.
    pub fn matches(&self, topic: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(topic))
    }

    /// Whether no topic has deltas (nothing to compute, nothing to keep).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }
}

/// A message's position: the epoch and sequence number of its id (`EPOCH-SEQ`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The `EPOCH` of the id.
    pub epoch: Arc<str>,
    /// The `SEQ` of the id.
    pub seq: u64,
}

impl Position {
    /// The id as clients see it.
    pub fn id_string(&self) -> String {
        format!("{}-{}", self.epoch, self.seq)
    }
}

/// A topic's previous publication on this node: what the next one's delta is taken against.
/// Holds one shared frame (the previous message's, which history usually holds anyway).
#[derive(Default)]
pub struct Chain {
    prev: Option<Prev>,
}

struct Prev {
    at: Position,
    kind: DataKind,
    /// The previous message's frame, and where its payload starts in it.
    frame: Arc<[u8]>,
    start: usize,
}

/// One publication as [`Chain::step`] needs it.
pub struct Step<'a> {
    /// Its id.
    pub at: Position,
    /// Text or binary.
    pub kind: DataKind,
    /// Its frame (shared) and where the payload starts in it.
    pub frame: &'a Arc<[u8]>,
    /// Offset of the payload in `frame`.
    pub start: usize,
}

impl Chain {
    /// Makes `next` the topic's previous publication, and returns its delta against the one
    /// before when there is one worth sending: the same kind (a text delta of text is text),
    /// and smaller than the message. `compute`: someone on this node may want it (the topic
    /// has subscribers here); otherwise only the chain moves.
    pub fn step(&mut self, next: Step<'_>, compute: bool) -> Option<Delta> {
        let Step {
            at,
            kind,
            frame,
            start,
        } = next;
        let target = frame.get(start..).unwrap_or_default();
        let delta = match &self.prev {
            Some(p) if compute && p.kind == kind => {
                let base = p.frame.get(p.start..).unwrap_or_default();
                clarion_proto::delta::encode(base, target)
                    .filter(|d| d.len() < target.len())
                    .map(|bytes| Delta {
                        base: p.at.clone(),
                        base_id: p.at.id_string(),
                        bytes: bytes.into(),
                        encoded: Default::default(),
                    })
            }
            Some(_) | None => None,
        };
        self.prev = Some(Prev {
            at,
            kind,
            frame: Arc::clone(frame),
            start,
        });
        delta
    }
}

/// A publication's delta against its topic's previous publication on this node, and its wire
/// encodings (built on first use, shared by every subscriber that gets it).
pub struct Delta {
    /// The previous publication's position: a subscriber gets the delta only if the last
    /// message it was sent on the topic is exactly this one.
    pub base: Position,
    /// `base` as clients see it (the envelope's `delta` field).
    pub base_id: String,
    /// The Fossil delta (UTF-8 text when both messages are text).
    pub bytes: Box<[u8]>,
    /// Frames and events of the delta, built by [`crate::message`] on first use.
    pub encoded: DeltaEncoded,
}

/// The shared encodings of a delta message.
#[derive(Default)]
pub struct DeltaEncoded {
    /// The `clarion.v1` text frame.
    pub ws: OnceLock<Arc<[u8]>>,
    /// The SSE event (`format=json`).
    pub sse_json: OnceLock<Arc<[u8]>>,
    /// The stream chunk (NDJSON line).
    pub ndjson: OnceLock<Arc<[u8]>>,
    /// The permessage-deflate frame of the envelope, 15-bit and 9-bit windows.
    pub deflated15: OnceLock<Arc<[u8]>>,
    /// See `deflated15`.
    pub deflated9: OnceLock<Arc<[u8]>>,
}

impl Delta {
    /// The `clarion.v1` envelope of the delta message `id` of `topic`:
    /// `{"type":"message","topic":..,"id":..,"delta":BASE,..,"data":DELTA}`.
    pub fn envelope_json(
        &self,
        topic: &str,
        id: &str,
        event: Option<&str>,
        kind: DataKind,
        tags: &[(String, String)],
    ) -> String {
        Envelope {
            topic,
            id,
            delta: Some(&self.base_id),
            event,
            kind,
            tags,
            payload: &self.bytes,
        }
        .to_json()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn step<'a>(seq: u64, kind: DataKind, frame: &'a Arc<[u8]>) -> Step<'a> {
        Step {
            at: Position {
                epoch: "e".into(),
                seq,
            },
            kind,
            frame,
            start: 2,
        }
    }

    fn framed(payload: &str) -> Arc<[u8]> {
        let mut f = vec![0x81, 0];
        f.extend_from_slice(payload.as_bytes());
        f.into()
    }

    #[test]
    fn each_delta_is_against_the_previous_publication_and_applies_to_it() {
        let mut chain = Chain::default();
        let a = framed(r#"{"bids":[[100.25,3],[100.20,7],[100.15,2]],"asks":[[100.30,1]]}"#);
        let b = framed(r#"{"bids":[[100.25,4],[100.20,7],[100.15,2]],"asks":[[100.30,1]]}"#);
        let c = framed(r#"{"bids":[[100.25,4],[100.20,9],[100.15,2]],"asks":[[100.35,1]]}"#);
        assert!(chain.step(step(1, DataKind::Text, &a), true).is_none());
        let d = chain.step(step(2, DataKind::Text, &b), true).unwrap();
        assert_eq!(d.base_id, "e-1");
        let got = clarion_proto::delta::apply(&a[2..], &d.bytes, 1 << 20).unwrap();
        assert_eq!(got, &b[2..]);
        let d = chain.step(step(3, DataKind::Text, &c), true).unwrap();
        assert_eq!(d.base.seq, 2);
        let got = clarion_proto::delta::apply(&b[2..], &d.bytes, 1 << 20).unwrap();
        assert_eq!(got, &c[2..]);
        // Applied to anything but its base, it is refused, never a wrong message.
        assert!(clarion_proto::delta::apply(&a[2..], &d.bytes, 1 << 20).is_err());
    }

    #[test]
    fn no_delta_across_kinds_when_not_smaller_or_when_nobody_listens() {
        let mut chain = Chain::default();
        let a = framed("abcdefghijklmnopqrstuvwxyz0123456789");
        let b = framed("abcdefghijklmnopqrstuvwxyz0123456780");
        chain.step(step(1, DataKind::Text, &a), true);
        assert!(chain.step(step(2, DataKind::Binary, &b), true).is_none());
        assert!(chain.step(step(3, DataKind::Binary, &a), false).is_none());
        // The chain moved on regardless: the next delta is against message 3.
        let d = chain.step(step(4, DataKind::Binary, &b), true).unwrap();
        assert_eq!(d.base.seq, 3);
        let short = framed("x");
        assert!(chain
            .step(step(5, DataKind::Binary, &short), true)
            .is_none());
    }

    #[test]
    fn delta_topics_match_like_the_other_topic_settings() {
        let cfg = Config {
            delta_topics: vec!["book.*".into(), "tick".into()],
            ..Config::default()
        };
        let t = DeltaTopics::from_config(&cfg);
        assert!(t.matches("book.btc") && t.matches("tick"));
        assert!(!t.matches("book") && !t.matches("ticks"));
        assert!(DeltaTopics::default().is_empty());
    }
}
