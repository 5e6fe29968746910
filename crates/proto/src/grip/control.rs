//! GRIP WebSocket control messages, and the prefixes that tell them from ordinary messages.
//!
//! When a backend accepts a WebSocket with the `grip` extension (`Sec-WebSocket-Extensions:
//! grip`), each message it sends starts with a prefix: `c:` for a control message meant for the
//! proxy, `m:` (or the extension's `message-prefix`, possibly empty) for a message to relay to the
//! client. The proxy strips the prefix. The same convention applies to `TEXT` events over
//! WebSocket-over-HTTP.
//!
//! A control message is a JSON object whose `type` says what to do: `subscribe` or `unsubscribe`
//! the connection to a `channel`, `detach` the backend while the client stays connected, or set
//! the connection's `keep-alive` (its `content` or base64 `content-bin`, `message-type`, `timeout`
//! and `mode`; without content, keep-alives are turned off). Unknown types are reported, not
//! guessed at, so the caller can ignore them.

use super::headers::{KeepAliveMode, DEFAULT_KEEP_ALIVE_SECS};
use super::params::parse_list;
use super::publish::WsMessage;
use super::BASE64;
use base64::Engine;
use serde::Deserialize;

/// The prefix of a control message.
pub const CONTROL_PREFIX: &[u8] = b"c:";

/// The prefix of an ordinary message when the extension does not set one.
pub const DEFAULT_MESSAGE_PREFIX: &str = "m:";

/// Longest ping or pong keep-alive payload (RFC 6455 control frames carry at most 125 bytes).
const MAX_CONTROL_PAYLOAD: usize = 125;

/// What a backend's message is, by its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefixed<'a> {
    /// A control message: the JSON after `c:`.
    Control(&'a [u8]),
    /// An ordinary message: the payload after the message prefix, to relay to the client.
    Message(&'a [u8]),
    /// Neither prefix: the message is dropped.
    Unprefixed,
}

/// Sorts a backend's message by prefix. `message_prefix` is the one the `grip` extension
/// negotiated ([`DEFAULT_MESSAGE_PREFIX`] unless it set another); when it is empty, everything that
/// is not a control message is an ordinary one.
pub fn split_prefix<'a>(payload: &'a [u8], message_prefix: &str) -> Prefixed<'a> {
    if let Some(json) = payload.strip_prefix(CONTROL_PREFIX) {
        return Prefixed::Control(json);
    }
    match payload.strip_prefix(message_prefix.as_bytes()) {
        Some(message) => Prefixed::Message(message),
        None => Prefixed::Unprefixed,
    }
}

/// Finds the `grip` extension in a `Sec-WebSocket-Extensions` value and returns its message
/// prefix, or `None` if the backend did not accept GRIP (the session is then a plain relay).
pub fn grip_message_prefix(extensions: &str) -> Option<String> {
    let items = parse_list(extensions, true).ok()?;
    let grip = items.into_iter().find(|i| i.value == "grip")?;
    let prefix = grip
        .params
        .into_iter()
        .find(|(name, _)| name == "message-prefix")
        .map(|(_, value)| value.unwrap_or_default());
    Some(prefix.unwrap_or_else(|| DEFAULT_MESSAGE_PREFIX.to_string()))
}

/// A control message from the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Subscribe the connection to a channel.
    Subscribe {
        /// The channel.
        channel: String,
    },
    /// Unsubscribe the connection from a channel.
    Unsubscribe {
        /// The channel.
        channel: String,
    },
    /// The backend leaves; the client stays connected to its channels and whatever it sends is
    /// dropped.
    Detach,
    /// Set the connection's keep-alive; `None` turns it off.
    KeepAlive(Option<KeepAlive>),
}

/// A WebSocket keep-alive: a message sent when the connection is idle (or at an interval).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepAlive {
    /// What to send.
    pub message: WsMessage,
    /// Seconds of idleness (or the interval).
    pub timeout_secs: u32,
    /// When to send it.
    pub mode: KeepAliveMode,
}

/// Why a control message was refused. The fault is the backend's, not the client's: a caller
/// should count and ignore the message rather than close the client's connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Not a JSON object with a string `type`, or a field of the wrong type.
    #[error("invalid control message: {0}")]
    Json(String),
    /// A `type` this implementation does not know.
    #[error("unknown control message type '{0}'")]
    UnknownType(String),
    /// `subscribe` or `unsubscribe` without a non-empty `channel`.
    #[error("control message without a channel")]
    MissingChannel,
    /// A `keep-alive` whose fields do not make a message.
    #[error("invalid keep-alive: {0}")]
    InvalidKeepAlive(&'static str),
}

/// The fields any control message may have; which matter depends on `type`.
#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "type")]
    kind: String,
    channel: Option<String>,
    content: Option<String>,
    #[serde(rename = "content-bin")]
    content_bin: Option<String>,
    #[serde(rename = "message-type")]
    message_type: Option<String>,
    timeout: Option<u32>,
    mode: Option<String>,
}

/// Decodes a control message's JSON (what follows `c:`).
pub fn decode_control(json: &[u8]) -> Result<Control, ControlError> {
    let raw: Raw = serde_json::from_slice(json).map_err(|e| ControlError::Json(e.to_string()))?;
    let channel = || {
        raw.channel
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or(ControlError::MissingChannel)
    };
    Ok(match raw.kind.as_str() {
        "subscribe" => Control::Subscribe {
            channel: channel()?,
        },
        "unsubscribe" => Control::Unsubscribe {
            channel: channel()?,
        },
        "detach" => Control::Detach,
        "keep-alive" => Control::KeepAlive(keep_alive(&raw)?),
        other => return Err(ControlError::UnknownType(other.to_string())),
    })
}

fn keep_alive(raw: &Raw) -> Result<Option<KeepAlive>, ControlError> {
    let bad = ControlError::InvalidKeepAlive;
    let content = match (&raw.content_bin, &raw.content) {
        (Some(b64), _) => BASE64.decode(b64).map_err(|_| bad("content-bin"))?,
        (None, Some(text)) => text.as_bytes().to_vec(),
        (None, None) => return Ok(None),
    };
    let message = match raw.message_type.as_deref() {
        // Without a type, the field used decides, as in a published ws-message.
        None if raw.content_bin.is_some() => WsMessage::Binary(content),
        None | Some("text") => {
            WsMessage::Text(String::from_utf8(content).map_err(|_| bad("text is not UTF-8"))?)
        }
        Some("binary") => WsMessage::Binary(content),
        Some(kind @ ("ping" | "pong")) => {
            if content.len() > MAX_CONTROL_PAYLOAD {
                return Err(bad("ping or pong payload over 125 bytes"));
            }
            if kind == "ping" {
                WsMessage::Ping(content)
            } else {
                WsMessage::Pong(content)
            }
        }
        Some(_) => return Err(bad("unknown message-type")),
    };
    let mode = match raw.mode.as_deref() {
        None | Some("idle") => KeepAliveMode::Idle,
        Some("interval") => KeepAliveMode::Interval,
        Some(_) => return Err(bad("unknown mode")),
    };
    Ok(Some(KeepAlive {
        message,
        timeout_secs: raw.timeout.unwrap_or(DEFAULT_KEEP_ALIVE_SECS),
        mode,
    }))
}

/// Encodes a control message as a backend would send it, `c:` prefix included.
pub fn encode_control(control: &Control) -> Vec<u8> {
    use serde_json::json;
    let value = match control {
        Control::Subscribe { channel } => json!({"type": "subscribe", "channel": channel}),
        Control::Unsubscribe { channel } => json!({"type": "unsubscribe", "channel": channel}),
        Control::Detach => json!({"type": "detach"}),
        Control::KeepAlive(None) => json!({"type": "keep-alive"}),
        Control::KeepAlive(Some(ka)) => {
            let (kind, data): (&str, &[u8]) = match &ka.message {
                WsMessage::Text(t) => ("text", t.as_bytes()),
                WsMessage::Binary(b) => ("binary", b),
                WsMessage::Ping(b) => ("ping", b),
                WsMessage::Pong(b) => ("pong", b),
            };
            let mode = match ka.mode {
                KeepAliveMode::Idle => "idle",
                KeepAliveMode::Interval => "interval",
            };
            json!({
                "type": "keep-alive",
                "content-bin": BASE64.encode(data),
                "message-type": kind,
                "timeout": ka.timeout_secs,
                "mode": mode,
            })
        }
    };
    let mut out = CONTROL_PREFIX.to_vec();
    out.extend_from_slice(value.to_string().as_bytes());
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_sort_messages() {
        assert_eq!(
            split_prefix(br#"c:{"type":"detach"}"#, "m:"),
            Prefixed::Control(br#"{"type":"detach"}"#)
        );
        assert_eq!(split_prefix(b"m:hello", "m:"), Prefixed::Message(b"hello"));
        assert_eq!(split_prefix(b"m:", "m:"), Prefixed::Message(b""));
        assert_eq!(split_prefix(b"hello", "m:"), Prefixed::Unprefixed);
        assert_eq!(split_prefix(b"m", "m:"), Prefixed::Unprefixed);
        assert_eq!(
            split_prefix(b"{\"a\":1}", ""),
            Prefixed::Message(b"{\"a\":1}")
        );
        assert_eq!(split_prefix(b"c:{}", ""), Prefixed::Control(b"{}"));
        assert_eq!(split_prefix(b">>x", ">>"), Prefixed::Message(b"x"));
    }

    #[test]
    fn the_grip_extension_sets_the_prefix() {
        assert_eq!(grip_message_prefix("grip"), Some("m:".into()));
        assert_eq!(
            grip_message_prefix(r#"grip; message-prefix="""#),
            Some(String::new())
        );
        assert_eq!(
            grip_message_prefix(r#"permessage-deflate, grip; message-prefix="x;y""#),
            Some("x;y".into())
        );
        assert_eq!(
            grip_message_prefix("grip; message-prefix=>"),
            Some(">".into())
        );
        assert_eq!(grip_message_prefix("permessage-deflate"), None);
        assert_eq!(grip_message_prefix(""), None);
        assert_eq!(grip_message_prefix("\"grip"), None);
    }

    #[test]
    fn documented_control_messages_decode() {
        assert_eq!(
            decode_control(br#"{"type": "subscribe", "channel": "mychannel"}"#),
            Ok(Control::Subscribe {
                channel: "mychannel".into()
            })
        );
        assert_eq!(
            decode_control(br#"{"type":"unsubscribe","channel":"c","extra":[1]}"#),
            Ok(Control::Unsubscribe {
                channel: "c".into()
            })
        );
        assert_eq!(decode_control(br#"{"type":"detach"}"#), Ok(Control::Detach));
        assert_eq!(
            decode_control(br#"{"type": "keep-alive", "content": "{}", "timeout": 30}"#),
            Ok(Control::KeepAlive(Some(KeepAlive {
                message: WsMessage::Text("{}".into()),
                timeout_secs: 30,
                mode: KeepAliveMode::Idle,
            })))
        );
        assert_eq!(
            decode_control(br#"{"type":"keep-alive"}"#),
            Ok(Control::KeepAlive(None))
        );
    }

    #[test]
    fn keep_alive_variants() {
        let ka = |json: &str| match decode_control(json.as_bytes()) {
            Ok(Control::KeepAlive(Some(ka))) => Ok(ka),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        let got = ka(r#"{"type":"keep-alive","content-bin":"AP8="}"#).unwrap();
        assert_eq!(got.message, WsMessage::Binary(vec![0, 255]));
        assert_eq!(got.timeout_secs, DEFAULT_KEEP_ALIVE_SECS);
        let got =
            ka(r#"{"type":"keep-alive","content":"","message-type":"ping","mode":"interval"}"#)
                .unwrap();
        assert_eq!(
            (got.message, got.mode),
            (WsMessage::Ping(vec![]), KeepAliveMode::Interval)
        );
        for (json, why) in [
            (r#"{"type":"keep-alive","content-bin":"!"}"#, "content-bin"),
            (
                r#"{"type":"keep-alive","content-bin":"/w==","message-type":"text"}"#,
                "text is not UTF-8",
            ),
            (
                r#"{"type":"keep-alive","content":"x","message-type":"close"}"#,
                "unknown message-type",
            ),
            (
                r#"{"type":"keep-alive","content":"x","mode":"often"}"#,
                "unknown mode",
            ),
        ] {
            assert_eq!(ka(json), Err(ControlError::InvalidKeepAlive(why)), "{json}");
        }
        let long = format!(
            r#"{{"type":"keep-alive","content":"{}","message-type":"pong"}}"#,
            "x".repeat(126)
        );
        assert!(matches!(ka(&long), Err(ControlError::InvalidKeepAlive(_))));
    }

    #[test]
    fn bad_control_messages_are_reported() {
        assert_eq!(
            decode_control(br#"{"type":"subscribe"}"#),
            Err(ControlError::MissingChannel)
        );
        assert_eq!(
            decode_control(br#"{"type":"subscribe","channel":""}"#),
            Err(ControlError::MissingChannel)
        );
        assert_eq!(
            decode_control(br#"{"type":"set-meta","name":"a","value":"b"}"#),
            Err(ControlError::UnknownType("set-meta".into()))
        );
        for bad in [
            &br#"{"channel":"c"}"#[..],
            br#"{"type":1}"#,
            br#"{"type":"subscribe","channel":5}"#,
            br#"{"type":"keep-alive","timeout":-1}"#,
            b"[]",
            b"",
            b"{",
        ] {
            assert!(
                matches!(decode_control(bad), Err(ControlError::Json(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn encoded_control_messages_round_trip() {
        for control in [
            Control::Subscribe {
                channel: "a \"quoted\" channel".into(),
            },
            Control::Unsubscribe {
                channel: "b".into(),
            },
            Control::Detach,
            Control::KeepAlive(None),
            Control::KeepAlive(Some(KeepAlive {
                message: WsMessage::Text("{}".into()),
                timeout_secs: 20,
                mode: KeepAliveMode::Idle,
            })),
            Control::KeepAlive(Some(KeepAlive {
                message: WsMessage::Pong(vec![1, 2]),
                timeout_secs: 0,
                mode: KeepAliveMode::Interval,
            })),
        ] {
            let wire = encode_control(&control);
            let Prefixed::Control(json) = split_prefix(&wire, DEFAULT_MESSAGE_PREFIX) else {
                panic!("{wire:?}")
            };
            assert_eq!(decode_control(json), Ok(control));
        }
    }
}
