//! `POST /publish` bodies: `{"messages":[{"topic":..,"data":..[,"encoding":"base64"][,"event":..]
//! [,"key":..][,"conflation_key":..][,"tags":{..}]}]}`; an item may instead be a fragment of an
//! appendable message (`"stream":"open"`, or `"append_to":ID` with an optional `"done":true`).
//!
//! The body is refused whole only when it is not a batch (not JSON, not that object). Each
//! message is then decoded and validated on its own, so a bad one is answered with its own error
//! in place while the others go on; [`held_back`] is the rule that keeps a topic's messages all
//! or nothing. Publishing is the server's job.

use std::collections::HashMap;

use base64::Engine as _;
use serde::Deserialize;

use super::idempotency::{validate_key, KeyError};
use super::topic::{validate_event_name, validate_topic, EventNameError, TopicError};
use crate::ws::DataKind;

/// One message of a batch, as sent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchItem {
    topic: String,
    data: String,
    #[serde(default)]
    encoding: Option<String>,
    #[serde(default)]
    event: Option<String>,
    #[serde(default)]
    key: Option<String>,
    /// The conflation key (`docs/conflation.md`); `key` is the idempotency key.
    #[serde(default)]
    conflation_key: Option<String>,
    /// Filter tags (`docs/filters.md`), string keys and values.
    #[serde(default)]
    tags: std::collections::BTreeMap<String, String>,
    /// `"open"`: the data opens an appendable message.
    #[serde(default)]
    stream: Option<String>,
    /// The id of the appendable message the data is appended to.
    #[serde(default)]
    append_to: Option<String>,
    /// With `append_to`: the fragment closes the stream.
    #[serde(default)]
    done: bool,
}

/// What a fragment item does to an appendable message (`docs/protocol.md`).
#[derive(Debug, PartialEq, Eq, Clone)]
pub enum FragmentOp {
    /// `"stream":"open"`: opens one, with the data as its first fragment.
    Open,
    /// `"append_to":ID`: appends the data; `done` closes it.
    Append {
        /// The stream's id, as its opening receipt gave it.
        stream: String,
        /// `"done":true`.
        done: bool,
    },
}

/// `{"messages": [...]}`: each message is kept as JSON until it is decoded on its own.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    messages: Vec<serde_json::Value>,
}

/// One message of a batch, decoded and validated.
#[derive(Debug, PartialEq, Eq)]
pub struct BatchMessage {
    /// A valid topic name.
    pub topic: String,
    /// Text (the data was a JSON string) or binary (base64-decoded).
    pub kind: DataKind,
    /// The payload.
    pub payload: Vec<u8>,
    /// A valid SSE event name, if given.
    pub event: Option<String>,
    /// A valid idempotency key (as `Idempotency-Key` for one message), if given.
    pub key: Option<String>,
    /// A valid conflation key ([`crate::conflate::validate_publish_key`]), if given.
    pub conflation_key: Option<String>,
    /// Its filter tags, valid by [`crate::filter::validate_tags`] (sorted by key).
    pub tags: Vec<(String, String)>,
    /// `Some` when the item is a fragment of an appendable message (its data is UTF-8 text,
    /// without event, conflation key or tags), not a message.
    pub fragment: Option<FragmentOp>,
}

/// Why a body was refused whole (it is not a batch); the text is the 400 answer's.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// Not JSON, or not `{"messages":[...]}`.
    #[error("invalid batch: {0}; expected {SHAPE}")]
    Json(serde_json::Error),
    /// Valid JSON of another shape: an array of messages without the object around it, say.
    #[error("invalid batch: expected {SHAPE}, not {0}")]
    Shape(&'static str),
}

/// Why one message of a batch was refused; the text is its `error` in the answer.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    /// Not an object, or a missing, mistyped or unknown field.
    #[error("invalid message: {0}; expected {ITEM_SHAPE}")]
    Json(serde_json::Error),
    /// The topic breaks the topic rules.
    #[error("invalid topic {topic:?}: {reason}")]
    Topic {
        /// The topic as sent.
        topic: String,
        /// Which rule it breaks.
        reason: TopicError,
    },
    /// The event name breaks the event-name rules.
    #[error("invalid event name: {0}")]
    EventName(EventNameError),
    /// The idempotency key breaks the key rules.
    #[error("invalid key: {0}")]
    Key(KeyError),
    /// The conflation key breaks its bounds.
    #[error("invalid conflation_key: {0}")]
    ConflationKey(crate::conflate::PublishKeyError),
    /// The tags break the tag bounds.
    #[error("invalid tags: {0}")]
    Tags(crate::filter::TagError),
    /// `encoding` is `"base64"` but `data` is not base64.
    #[error("data is not valid base64")]
    Base64,
    /// `encoding` is something other than `"base64"`.
    #[error("unknown encoding {0:?}")]
    Encoding(String),
    /// A fragment item that breaks the rules of fragments.
    #[error("invalid fragment: {0}")]
    Fragment(&'static str),
}

/// A message of a batch that was refused: its topic when it named one (a string), so the rest
/// of that topic is held back with it, and why.
#[derive(Debug)]
pub struct RefusedItem {
    /// The `topic` as sent, if it was a string.
    pub topic: Option<String>,
    /// Why.
    pub error: ItemError,
}

/// What a batch looks like, as the errors state it.
const SHAPE: &str = r#"an object {"messages": [{"topic": "...", "data": "..."}, ...]}"#;
/// What one message looks like, as its errors state it.
const ITEM_SHAPE: &str = r#"{"topic": "...", "data": "..."} with optional "encoding", "event", "key", "conflation_key", "tags"; or a fragment with "stream": "open", or "append_to" and "done""#;

/// Decodes a `POST /publish` body: `Err` when it is not a batch, else one result per message,
/// in order.
pub fn decode_batch(body: &[u8]) -> Result<Vec<Result<BatchMessage, RefusedItem>>, BatchError> {
    // serde would read an array as the struct's fields in order and blame the first element.
    let found = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => Some("an array"),
        Some(b'"') => Some("a string"),
        Some(b'0'..=b'9' | b'-') => Some("a number"),
        _ => None,
    };
    if let Some(found) = found {
        return Err(BatchError::Shape(found));
    }
    let batch: Batch = serde_json::from_slice(body).map_err(BatchError::Json)?;
    Ok(batch.messages.into_iter().map(decode_item).collect())
}

/// One message, decoded and validated on its own.
fn decode_item(v: serde_json::Value) -> Result<BatchMessage, RefusedItem> {
    let topic = v.get("topic").and_then(|t| t.as_str()).map(str::to_owned);
    let refuse = |error| RefusedItem {
        topic: topic.clone(),
        error,
    };
    let m: BatchItem = serde_json::from_value(v).map_err(|e| refuse(ItemError::Json(e)))?;
    if let Err(reason) = validate_topic(&m.topic) {
        return Err(refuse(ItemError::Topic {
            topic: m.topic,
            reason,
        }));
    }
    if let Some(Err(reason)) = m.event.as_deref().map(validate_event_name) {
        return Err(refuse(ItemError::EventName(reason)));
    }
    if let Some(Err(reason)) = m.key.as_deref().map(validate_key) {
        return Err(refuse(ItemError::Key(reason)));
    }
    if let Some(Err(reason)) = m
        .conflation_key
        .as_deref()
        .map(crate::conflate::validate_publish_key)
    {
        return Err(refuse(ItemError::ConflationKey(reason)));
    }
    if let Err(reason) =
        crate::filter::validate_tags(m.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    {
        return Err(refuse(ItemError::Tags(reason)));
    }
    let fragment = fragment_op(&m).map_err(|why| refuse(ItemError::Fragment(why)))?;
    let (kind, payload) = match m.encoding {
        None => (DataKind::Text, m.data.into_bytes()),
        Some(e) if e == "base64" => {
            match base64::engine::general_purpose::STANDARD.decode(&m.data) {
                Ok(bytes) => (DataKind::Binary, bytes),
                Err(_) => return Err(refuse(ItemError::Base64)),
            }
        }
        Some(encoding) => return Err(refuse(ItemError::Encoding(encoding))),
    };
    Ok(BatchMessage {
        topic: m.topic,
        kind,
        payload,
        event: m.event,
        key: m.key,
        conflation_key: m.conflation_key,
        tags: m.tags.into_iter().collect(),
        fragment,
    })
}

/// The fragment an item asks for, if any, with the rules `POST /publish/{topic}?stream=open`
/// and `?append_to=ID` follow, plus: no event, conflation key or tags (a fragment is part of
/// one message, which has none), and no `encoding` (its data is text).
fn fragment_op(m: &BatchItem) -> Result<Option<FragmentOp>, &'static str> {
    if m.done && m.append_to.is_none() {
        return Err(r#""done" closes a stream: give it with "append_to""#);
    }
    let op = match (m.stream.as_deref(), &m.append_to) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => return Err(r#"give "stream": "open" or "append_to", not both"#),
        (Some("open"), None) => FragmentOp::Open,
        (Some(_), None) => return Err(r#""stream" can only be "open""#),
        (None, Some(id)) => FragmentOp::Append {
            stream: id.clone(),
            done: m.done,
        },
    };
    if m.encoding.is_some() {
        return Err("a stream's fragments are UTF-8 text (no encoding)");
    }
    if m.event.is_some() || m.conflation_key.is_some() || !m.tags.is_empty() {
        return Err(r#"a fragment takes no "event", "conflation_key" or "tags""#);
    }
    Ok(Some(op))
}

/// All or nothing per topic. Given each message's topic (`None`: it named none) and whether it
/// was refused, answers for each message that was not: `Some(j)` when message `j`, the first
/// refused one of its topic, holds it back (it is not published either), `None` when it may be
/// published. Refused messages get `None` (they have their own error).
pub fn held_back(topics: &[Option<&str>], refused: &[bool]) -> Vec<Option<usize>> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (j, (t, r)) in topics.iter().zip(refused).enumerate() {
        if let (Some(t), true) = (t, r) {
            first.entry(t).or_insert(j);
        }
    }
    topics
        .iter()
        .zip(refused)
        .map(|(t, r)| match (t, r) {
            (Some(t), false) => first.get(t).copied(),
            (None, false) | (_, true) => None,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn one(body: &[u8]) -> Result<BatchMessage, RefusedItem> {
        let mut all = decode_batch(body).unwrap();
        assert_eq!(all.len(), 1);
        all.remove(0)
    }

    #[test]
    fn batch_messages_carry_a_bounded_conflation_key() {
        let ok =
            one(br#"{"messages":[{"topic":"a","data":"x","conflation_key":"EURUSD"}]}"#).unwrap();
        assert_eq!(ok.conflation_key.as_deref(), Some("EURUSD"));
        let long = format!(
            r#"{{"messages":[{{"topic":"a","data":"x","conflation_key":"{}"}}]}}"#,
            "k".repeat(257)
        );
        for bad in [
            long.as_bytes(),
            br#"{"messages":[{"topic":"a","data":"x","conflation_key":""}]}"#,
        ] {
            assert!(matches!(
                one(bad),
                Err(RefusedItem {
                    error: ItemError::ConflationKey(_),
                    ..
                })
            ));
        }
    }

    #[test]
    fn batch_messages_carry_bounded_tags() {
        let ok = one(br#"{"messages":[{"topic":"a","data":"x","tags":{"s":"1","a":"2"}}]}"#)
            .expect("valid");
        assert_eq!(
            ok.tags,
            vec![("a".into(), "2".into()), ("s".into(), "1".into())]
        );
        let all = decode_batch(
            br#"{"messages":[{"topic":"a","data":"x"},{"topic":"a","data":"x","tags":{"in":"1"}}]}"#,
        )
        .expect("a batch");
        assert!(all[0].is_ok());
        assert!(
            matches!(
                all[1],
                Err(RefusedItem {
                    error: ItemError::Tags(_),
                    ..
                })
            ),
            "{:?}",
            all[1].as_ref().err()
        );
        assert!(one(br#"{"messages":[{"topic":"a","data":"x","tags":{"a":1}}]}"#).is_err());
    }

    #[test]
    fn each_message_is_validated_on_its_own() {
        let all = decode_batch(
            br#"{"messages":[{"topic":"a","data":"x"},{"topic":"a b","data":"x"},{"topic":"b","data":"AAE=","encoding":"base64","event":"e","key":"k1"}]}"#,
        )
        .expect("a batch");
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].as_ref().unwrap().payload, b"x");
        let bad = all[1].as_ref().unwrap_err();
        assert_eq!(bad.topic.as_deref(), Some("a b"));
        let ok = all[2].as_ref().unwrap();
        assert_eq!(ok.payload, vec![0, 1]);
        assert_eq!(ok.kind, DataKind::Binary);
        assert_eq!(ok.key.as_deref(), Some("k1"));
        for bad in [
            &br#"{"messages":[{"topic":"a","data":"*","encoding":"base64"}]}"#[..],
            br#"{"messages":[{"topic":"a","data":"x","encoding":"hex"}]}"#,
            br#"{"messages":[{"topic":"a","data":"x","event":"a\nb"}]}"#,
            br#"{"messages":[{"topic":"a","data":"x","key":""}]}"#,
            br#"{"messages":[{"topic":"a","data":"x","extra":1}]}"#,
            br#"{"messages":[{"topic":"a","data":5}]}"#,
            br#"{"messages":[7]}"#,
        ] {
            assert!(one(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn only_a_body_that_is_not_a_batch_is_refused_whole() {
        for bad in [
            &b"[]"[..],
            &[0xff][..],
            b"{",
            br#"{"messages":{}}"#,
            br#"{"messages":[],"extra":1}"#,
        ] {
            assert!(
                decode_batch(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn errors_name_the_rule() {
        let text = |body: &[u8]| one(body).unwrap_err().error.to_string();
        assert_eq!(
            text(br#"{"messages":[{"topic":"a b","data":"x"}]}"#),
            r#"invalid topic "a b": topic name may only contain A-Z a-z 0-9 _ . : @ / -"#
        );
        assert_eq!(
            text(br#"{"messages":[{"topic":"a","data":"x","event":""}]}"#),
            "invalid event name: event names are 1 to 64 characters of A-Z a-z 0-9 _ . : @ / -"
        );
        assert_eq!(
            text(br#"{"messages":[{"topic":"a","data":"*","encoding":"base64"}]}"#),
            "data is not valid base64"
        );
        assert_eq!(
            text(br#"{"messages":[{"topic":"a","data":"x","encoding":"hex"}]}"#),
            r#"unknown encoding "hex""#
        );
        assert!(text(br#"{"messages":[{"data":"x"}]}"#).starts_with("invalid message: "));
        let whole = |body: &[u8]| decode_batch(body).unwrap_err().to_string();
        assert!(whole(b"[]").starts_with("invalid batch: "));
        assert_eq!(
            whole(br#" [{"topic":"a","data":"x"}]"#),
            r#"invalid batch: expected an object {"messages": [{"topic": "...", "data": "..."}, ...]}, not an array"#
        );
        assert!(whole(b"{").ends_with(
            r#"; expected an object {"messages": [{"topic": "...", "data": "..."}, ...]}"#
        ));
        assert!(whole(b"[1").ends_with("not an array"));
        assert!(whole(b"\"x\"").ends_with("not a string"));
        assert!(matches!(
            one(br#"{"messages":[{"topic":"","data":"x"}]}"#),
            Err(RefusedItem {
                error: ItemError::Topic {
                    reason: TopicError::Empty,
                    ..
                },
                ..
            })
        ));
    }

    #[test]
    fn text_stays_text_and_an_empty_batch_is_fine() {
        let ok = one(br#"{"messages":[{"topic":"a","data":"h\u00e9"}]}"#).unwrap();
        assert_eq!(ok.kind, DataKind::Text);
        assert_eq!(ok.payload, "hé".as_bytes());
        assert_eq!(ok.event, None);
        assert!(decode_batch(br#"{"messages":[]}"#).unwrap().is_empty());
    }

    #[test]
    fn a_refused_message_holds_back_its_topic_only() {
        let topics = [
            Some("a"),
            Some("b"),
            Some("a"),
            None,
            Some("b"),
            Some("c"),
            Some("a"),
        ];
        let refused = [false, false, true, true, false, false, true];
        assert_eq!(
            held_back(&topics, &refused),
            vec![Some(2), None, None, None, None, None, None]
        );
        assert_eq!(held_back(&[Some("a"); 3], &[false; 3]), vec![None; 3]);
    }

    #[test]
    fn fragments_follow_the_rules_of_fragments() {
        let all = decode_batch(
            br#"{"messages":[{"topic":"a","data":"He","stream":"open"},{"topic":"a","data":"llo","append_to":"e-1","done":true},{"topic":"a","data":"x"}]}"#,
        )
        .expect("a batch");
        assert_eq!(all[0].as_ref().unwrap().fragment, Some(FragmentOp::Open));
        assert_eq!(
            all[1].as_ref().unwrap().fragment,
            Some(FragmentOp::Append {
                stream: "e-1".into(),
                done: true
            })
        );
        assert_eq!(all[1].as_ref().unwrap().payload, b"llo");
        assert_eq!(all[2].as_ref().unwrap().fragment, None);
        let text = |body: &[u8]| one(body).unwrap_err().error.to_string();
        for (bad, why) in [
            (
                &br#"{"messages":[{"topic":"a","data":"x","done":true}]}"#[..],
                "closes a stream",
            ),
            (
                br#"{"messages":[{"topic":"a","data":"x","stream":"open","done":true}]}"#,
                "closes a stream",
            ),
            (
                br#"{"messages":[{"topic":"a","data":"x","stream":"open","append_to":"e-1"}]}"#,
                "not both",
            ),
            (
                br#"{"messages":[{"topic":"a","data":"x","stream":"yes"}]}"#,
                "only be",
            ),
            (
                br#"{"messages":[{"topic":"a","data":"AAE=","encoding":"base64","append_to":"e-1"}]}"#,
                "UTF-8",
            ),
            (
                br#"{"messages":[{"topic":"a","data":"x","event":"e","stream":"open"}]}"#,
                "takes no",
            ),
            (
                br#"{"messages":[{"topic":"a","data":"x","tags":{"k":"v"},"append_to":"e-1"}]}"#,
                "takes no",
            ),
        ] {
            let t = text(bad);
            assert!(t.starts_with("invalid fragment: ") && t.contains(why), "{t}");
        }
        assert!(one(br#"{"messages":[{"topic":"a","data":"x","done":1}]}"#).is_err());
    }
}
