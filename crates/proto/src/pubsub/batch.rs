//! `POST /publish` bodies:
//! `{"messages":[{"topic":..,"data":..[,"encoding":"base64"][,"event":..][,"tags":{..}]}]}`.
//!
//! A batch is decoded and validated whole before the server publishes any of it, so it is
//! published completely or not at all. Publishing is the server's job.

use base64::Engine as _;
use serde::Deserialize;

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
    /// Filter tags (`docs/filters.md`), string keys and values.
    #[serde(default)]
    tags: std::collections::BTreeMap<String, String>,
}

/// `{"messages": [...]}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    messages: Vec<BatchItem>,
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
    /// Its filter tags, valid by [`crate::filter::validate_tags`] (sorted by key).
    pub tags: Vec<(String, String)>,
}

/// Why a batch was refused; the text is the 400 answer's. `index` is the position of the first
/// bad message in `messages`.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// Not JSON, not `{"messages":[...]}`, or a message with a missing, mistyped or unknown field.
    #[error("invalid batch: {0}; expected {SHAPE}")]
    Json(serde_json::Error),
    /// Valid JSON of another shape: an array of messages without the object around it, say.
    #[error("invalid batch: expected {SHAPE}, not {0}")]
    Shape(&'static str),
    /// A message's topic breaks the topic rules.
    #[error("messages[{index}]: invalid topic {topic:?}: {reason}")]
    Topic {
        /// Which message.
        index: usize,
        /// The topic as sent.
        topic: String,
        /// Which rule it breaks.
        reason: TopicError,
    },
    /// A message's event name breaks the event-name rules.
    #[error("messages[{index}]: invalid event name: {reason}")]
    EventName {
        /// Which message.
        index: usize,
        /// Which rule it breaks.
        reason: EventNameError,
    },
    /// A message's tags break the tag bounds.
    #[error("messages[{index}]: invalid tags: {reason}")]
    Tags {
        /// Which message.
        index: usize,
        /// Which bound they break.
        reason: crate::filter::TagError,
    },
    /// `encoding` is `"base64"` but `data` is not base64.
    #[error("messages[{index}]: data is not valid base64")]
    Base64 {
        /// Which message.
        index: usize,
    },
    /// `encoding` is something other than `"base64"`.
    #[error("messages[{index}]: unknown encoding {encoding:?}")]
    Encoding {
        /// Which message.
        index: usize,
        /// The encoding as sent.
        encoding: String,
    },
}

/// What a batch looks like, as the errors state it.
const SHAPE: &str = r#"an object {"messages": [{"topic": "...", "data": "..."}, ...]}"#;

/// Decodes a `POST /publish` body, validating every message.
pub fn decode_batch(body: &[u8]) -> Result<Vec<BatchMessage>, BatchError> {
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
    let mut out = Vec::with_capacity(batch.messages.len());
    for (index, m) in batch.messages.into_iter().enumerate() {
        if let Err(reason) = validate_topic(&m.topic) {
            return Err(BatchError::Topic {
                index,
                topic: m.topic,
                reason,
            });
        }
        if let Some(Err(reason)) = m.event.as_deref().map(validate_event_name) {
            return Err(BatchError::EventName { index, reason });
        }
        if let Err(reason) =
            crate::filter::validate_tags(m.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        {
            return Err(BatchError::Tags { index, reason });
        }
        let (kind, payload) = match m.encoding {
            None => (DataKind::Text, m.data.into_bytes()),
            Some(e) if e == "base64" => {
                match base64::engine::general_purpose::STANDARD.decode(&m.data) {
                    Ok(bytes) => (DataKind::Binary, bytes),
                    Err(_) => return Err(BatchError::Base64 { index }),
                }
            }
            Some(encoding) => return Err(BatchError::Encoding { index, encoding }),
        };
        out.push(BatchMessage {
            topic: m.topic,
            kind,
            payload,
            event: m.event,
            tags: m.tags.into_iter().collect(),
        });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn batch_messages_carry_bounded_tags() {
        let ok =
            decode_batch(br#"{"messages":[{"topic":"a","data":"x","tags":{"s":"1","a":"2"}}]}"#)
                .expect("valid");
        assert_eq!(
            ok[0].tags,
            vec![("a".into(), "2".into()), ("s".into(), "1".into())]
        );
        let bad = decode_batch(br#"{"messages":[{"topic":"a","data":"x"},{"topic":"a","data":"x","tags":{"in":"1"}}]}"#);
        assert!(
            matches!(bad, Err(BatchError::Tags { index: 1, .. })),
            "{:?}",
            bad.err().map(|e| e.to_string())
        );
        assert!(
            decode_batch(br#"{"messages":[{"topic":"a","data":"x","tags":{"a":1}}]}"#).is_err()
        );
    }

    #[test]
    fn batches_are_validated_whole() {
        let ok = decode_batch(
            br#"{"messages":[{"topic":"a","data":"x"},{"topic":"b","data":"AAE=","encoding":"base64","event":"e"}]}"#,
        )
        .expect("valid");
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[1].payload, vec![0, 1]);
        assert_eq!(ok[1].kind, DataKind::Binary);
        for bad in [
            &br#"{"messages":[{"topic":"a b","data":"x"}]}"#[..],
            br#"{"messages":[{"topic":"a","data":"*","encoding":"base64"}]}"#,
            br#"{"messages":[{"topic":"a","data":"x","encoding":"hex"}]}"#,
            br#"{"messages":[{"topic":"a","data":"x","event":"a\nb"}]}"#,
            br#"{"messages":[{"topic":"a","data":"x","extra":1}]}"#,
            b"[]",
            &[0xff][..],
        ] {
            assert!(
                decode_batch(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn errors_name_the_message_and_the_rule() {
        let text = |body: &[u8]| decode_batch(body).unwrap_err().to_string();
        assert_eq!(
            text(br#"{"messages":[{"topic":"a","data":"x"},{"topic":"a b","data":"x"}]}"#),
            r#"messages[1]: invalid topic "a b": topic name may only contain A-Z a-z 0-9 _ . : @ / -"#
        );
        assert_eq!(
            text(br#"{"messages":[{"topic":"a","data":"x","event":""}]}"#),
            "messages[0]: invalid event name: event names are 1 to 64 characters of A-Z a-z 0-9 _ . : @ / -"
        );
        assert_eq!(
            text(br#"{"messages":[{"topic":"a","data":"*","encoding":"base64"}]}"#),
            "messages[0]: data is not valid base64"
        );
        assert_eq!(
            text(br#"{"messages":[{"topic":"a","data":"x","encoding":"hex"}]}"#),
            r#"messages[0]: unknown encoding "hex""#
        );
        assert!(text(b"[]").starts_with("invalid batch: "));
        assert_eq!(
            text(br#" [{"topic":"a","data":"x"}]"#),
            r#"invalid batch: expected an object {"messages": [{"topic": "...", "data": "..."}, ...]}, not an array"#
        );
        assert!(text(b"{").ends_with(
            r#"; expected an object {"messages": [{"topic": "...", "data": "..."}, ...]}"#
        ));
        assert!(text(b"[1").ends_with("not an array"));
        assert!(text(b"\"x\"").ends_with("not a string"));
        assert!(matches!(
            decode_batch(br#"{"messages":[{"topic":"","data":"x"}]}"#),
            Err(BatchError::Topic {
                index: 0,
                reason: TopicError::Empty,
                ..
            })
        ));
    }

    #[test]
    fn text_stays_text_and_an_empty_batch_is_fine() {
        let ok = decode_batch(br#"{"messages":[{"topic":"a","data":"h\u00e9"}]}"#).unwrap();
        assert_eq!(ok[0].kind, DataKind::Text);
        assert_eq!(ok[0].payload, "hé".as_bytes());
        assert_eq!(ok[0].event, None);
        assert!(decode_batch(br#"{"messages":[]}"#).unwrap().is_empty());
    }
}
