//! The in-band control protocol: small JSON text messages a WebSocket client sends to subscribe,
//! unsubscribe or publish, and the server's replies. Parsing borrows from the message where it
//! can; applying a request (checking the topic, subscribing, publishing) is the server's job.

use std::borrow::Cow;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::ws::DataKind;

/// A request from a client.
#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request<'a> {
    /// Start receiving a topic's messages.
    Subscribe {
        /// The topic.
        #[serde(borrow)]
        topic: Cow<'a, str>,
        /// Resume after this message id: missed messages are replayed first.
        #[serde(default, borrow)]
        since: Option<Cow<'a, str>>,
        /// Also receive the topic's member list now and its `join`/`leave` events (presence
        /// topics only).
        #[serde(default)]
        presence: bool,
        /// Only messages whose tags pass this filter: its JSON form, or its text form as a
        /// string (`docs/filters.md`). Parsed by the server, with its limits.
        #[serde(default)]
        filter: Option<serde_json::Value>,
        /// Receive the topic's messages as deltas of the previous one where possible (topics
        /// of the server's `delta_topics`; `docs/delta.md`).
        #[serde(default)]
        delta: bool,
    },
    /// Stop receiving a topic's messages.
    Unsubscribe {
        /// The topic.
        #[serde(borrow)]
        topic: Cow<'a, str>,
    },
    /// Publish a message (only when the server allows client publishing).
    Publish {
        /// The topic.
        #[serde(borrow)]
        topic: Cow<'a, str>,
        /// The message; base64 when `encoding` is `"base64"` (a binary message).
        #[serde(borrow)]
        data: Cow<'a, str>,
        /// `"base64"` for binary data; absent for text.
        #[serde(default, borrow)]
        encoding: Option<Cow<'a, str>>,
    },
    /// Ask for a presence topic's members (one page, after the identity `after`).
    Presence {
        /// The topic.
        #[serde(borrow)]
        topic: Cow<'a, str>,
        /// Continue after this identity (the `next` of the previous page).
        #[serde(default, borrow)]
        after: Option<Cow<'a, str>>,
    },
    /// Authenticate with a token (JWT), instead of putting it in the URL; only where the
    /// server has authentication configured.
    Auth {
        /// The token.
        #[serde(borrow)]
        token: Cow<'a, str>,
    },
    /// Replace the connection's token with a fresh one before it expires.
    Refresh {
        /// The new token.
        #[serde(borrow)]
        token: Cow<'a, str>,
    },
}

/// Why a control message was refused. Its text is sent back to the client as-is, in an
/// `{"type":"error"}` reply; the connection stays open.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// JSON, but not a request: an unknown `type`, a missing or unknown field, a wrong type.
    #[error("invalid control message: {0}")]
    Invalid(serde_json::Error),
    /// Not a JSON object at all (or truncated JSON).
    #[error("control messages are JSON objects with a \"type\"")]
    NotAnObject(serde_json::Error),
}

/// Parses a control message.
pub fn parse(text: &[u8]) -> Result<Request<'_>, ControlError> {
    serde_json::from_slice(text).map_err(|e| {
        if e.is_data() {
            ControlError::Invalid(e)
        } else {
            ControlError::NotAnObject(e)
        }
    })
}

/// Why a publish request's `data` cannot be used. Sent back in an error reply with the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// `encoding` is `"base64"` but `data` is not base64.
    #[error("data is not valid base64")]
    Base64,
    /// `encoding` is something other than `"base64"`.
    #[error("unknown encoding (only \"base64\" is defined)")]
    Encoding,
}

/// The message a publish request carries: `data` as text when there is no `encoding`, or
/// base64-decoded as binary when `encoding` is `"base64"`.
pub fn decode_data(data: &str, encoding: Option<&str>) -> Result<(DataKind, Vec<u8>), DataError> {
    match encoding {
        None => Ok((DataKind::Text, data.as_bytes().to_vec())),
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(data)
            .map(|bytes| (DataKind::Binary, bytes))
            .map_err(|_| DataError::Base64),
        Some(_) => Err(DataError::Encoding),
    }
}

/// A reply to a client.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Reply<'a> {
    /// The subscription is active: every later message of the topic will arrive.
    Subscribed {
        /// The topic.
        topic: &'a str,
    },
    /// The subscription is gone.
    Unsubscribed {
        /// The topic.
        topic: &'a str,
    },
    /// A client publish was accepted.
    Published {
        /// The topic.
        topic: &'a str,
        /// The message id, as a string (ids may outgrow JavaScript's safe integers).
        id: String,
        /// Subscribers the message was handed to.
        subscribers: u64,
    },
    /// A token was accepted (`auth` or `refresh`): it is valid until `exp`.
    Authenticated {
        /// The token's `sub`, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        sub: Option<&'a str>,
        /// When it expires (seconds since the Unix epoch).
        exp: u64,
    },
    /// The connection's token expires in `seconds`: send a `refresh` before, or the connection
    /// is closed with 4001.
    Expiring {
        /// When it expires (seconds since the Unix epoch).
        exp: u64,
        /// Seconds left.
        seconds: u64,
    },
    /// A request was refused; the connection stays open.
    Error {
        /// Why.
        error: &'a str,
        /// The topic concerned, when there is one.
        #[serde(skip_serializing_if = "Option::is_none")]
        topic: Option<&'a str>,
    },
}

impl Reply<'_> {
    /// The reply as JSON text.
    pub fn to_json(&self) -> String {
        // Serializing these plain structs cannot fail; an empty object is a safe fallback.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests() {
        assert_eq!(
            parse(br#"{"type":"subscribe","topic":"a"}"#).unwrap(),
            Request::Subscribe {
                topic: "a".into(),
                since: None,
                presence: false,
                filter: None,
                delta: false,
            }
        );
        assert_eq!(
            parse(br#"{"type":"subscribe","topic":"a","presence":true}"#).unwrap(),
            Request::Subscribe {
                topic: "a".into(),
                since: None,
                presence: true,
                filter: None,
                delta: false,
            }
        );
        assert_eq!(
            parse(br#"{"type":"presence","topic":"a","after":"bob"}"#).unwrap(),
            Request::Presence {
                topic: "a".into(),
                after: Some("bob".into()),
            }
        );
        assert!(parse(br#"{"type":"subscribe","topic":"a","presence":"yes"}"#).is_err());
        assert_eq!(
            parse(br#"{"type":"subscribe","topic":"a","filter":{"eq":["k","v"]}}"#).unwrap(),
            Request::Subscribe {
                topic: "a".into(),
                since: None,
                presence: false,
                filter: Some(serde_json::json!({"eq": ["k", "v"]})),
                delta: false,
            }
        );
        assert_eq!(
            parse(br#"{"type":"subscribe","topic":"a","delta":true}"#).unwrap(),
            Request::Subscribe {
                topic: "a".into(),
                since: None,
                presence: false,
                filter: None,
                delta: true,
            }
        );
        assert!(parse(br#"{"type":"subscribe","topic":"a","delta":1}"#).is_err());
        assert_eq!(
            parse(br#"{"type":"subscribe","topic":"a","since":"e-5"}"#).unwrap(),
            Request::Subscribe {
                topic: "a".into(),
                since: Some("e-5".into()),
                presence: false,
                filter: None,
                delta: false,
            }
        );
        assert_eq!(
            parse(br#"{"topic":"a\u0062","type":"unsubscribe"}"#).unwrap(),
            Request::Unsubscribe { topic: "ab".into() }
        );
        assert!(matches!(
            parse(br#"{"type":"publish","topic":"a","data":"AAE=","encoding":"base64"}"#),
            Ok(Request::Publish {
                encoding: Some(_),
                ..
            })
        ));
        assert!(parse(b"hello").is_err());
        assert!(parse(br#"{"type":"dance"}"#).is_err());
        assert!(parse(br#"{"type":"subscribe"}"#).is_err());
        assert!(parse(br#"{"type":"subscribe","topic":"a","x":1}"#).is_err());
    }

    #[test]
    fn refusals_say_why() {
        for not_json in [&b"hello"[..], b"", b"{\"type\":", b"[1]"] {
            let e = parse(not_json).unwrap_err();
            let text = e.to_string();
            if matches!(e, ControlError::NotAnObject(_)) {
                assert_eq!(text, "control messages are JSON objects with a \"type\"");
            } else {
                assert!(text.starts_with("invalid control message: "), "{text}");
            }
        }
        assert!(matches!(parse(b"hello"), Err(ControlError::NotAnObject(_))));
        let e = parse(br#"{"type":"dance"}"#).unwrap_err();
        assert!(matches!(e, ControlError::Invalid(_)));
        assert!(e
            .to_string()
            .starts_with("invalid control message: unknown variant `dance`"));
    }

    #[test]
    fn publish_data_is_text_or_base64() {
        assert_eq!(
            decode_data("hé", None),
            Ok((DataKind::Text, "hé".as_bytes().to_vec()))
        );
        assert_eq!(
            decode_data("AAH/", Some("base64")),
            Ok((DataKind::Binary, vec![0, 1, 255]))
        );
        assert_eq!(decode_data("*", Some("base64")), Err(DataError::Base64));
        assert_eq!(decode_data("x", Some("hex")), Err(DataError::Encoding));
        assert_eq!(
            DataError::Encoding.to_string(),
            "unknown encoding (only \"base64\" is defined)"
        );
    }

    #[test]
    fn encodes_replies() {
        assert_eq!(
            Reply::Subscribed { topic: "a" }.to_json(),
            r#"{"type":"subscribed","topic":"a"}"#
        );
        assert_eq!(
            Reply::Error {
                error: "no",
                topic: None
            }
            .to_json(),
            r#"{"type":"error","error":"no"}"#
        );
        assert_eq!(
            Reply::Published {
                topic: "a",
                id: "5".into(),
                subscribers: 2
            }
            .to_json(),
            r#"{"type":"published","topic":"a","id":"5","subscribers":2}"#
        );
    }
}
