//! Messages a Pusher client sends over its WebSocket, decoded and checked: `pusher:ping`,
//! `pusher:pong`, `pusher:subscribe`, `pusher:unsubscribe`, `pusher:signin` and `client-*`
//! events. The frame is bounded in size and nesting before it is parsed; the channel name is
//! checked ([`super::channel`]); a presence member (`channel_data`) and a signed-in user
//! (`user_data`) are read with their own bounds. Authorization is [`super::signature`]'s.

use serde_json::Value;

use super::channel::{classify, ChannelError, Kind};
use super::json_depth;
use super::Limits;

/// A decoded client message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMessage {
    /// `pusher:ping`: answer `pusher:pong`.
    Ping,
    /// `pusher:pong`: the answer to the server's ping.
    Pong,
    /// `pusher:subscribe`.
    Subscribe(Subscribe),
    /// `pusher:unsubscribe`.
    Unsubscribe {
        /// The channel (valid).
        channel: String,
    },
    /// `pusher:signin`.
    Signin {
        /// `key:signature` over the socket id and `user_data`.
        auth: String,
        /// The JSON text the signature covers, with the user's `id`.
        user_data: String,
    },
    /// A `client-` event to relay to the channel's other subscribers.
    ClientEvent {
        /// Its name (`client-...`).
        event: String,
        /// The channel (valid).
        channel: String,
        /// Its `data`, as compact JSON text (relayed as JSON, not re-quoted).
        data: String,
    },
}

/// A `pusher:subscribe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// The channel (valid).
    pub channel: String,
    /// What its name makes it.
    pub kind: Kind,
    /// `key:signature`, for private and presence channels.
    pub auth: Option<String>,
    /// For presence channels: the member JSON the signature covers ([`Member::parse`]).
    pub channel_data: Option<String>,
    /// Clarion's resume extension (`docs/pusher.md`): `"clarion_since"`, the id of the last
    /// event the client received on this channel (empty: none yet, from now). Present, it
    /// asks for every later event's id (`"clarion_id"`); stock clients never send it.
    pub since: Option<String>,
}

/// Longest `"clarion_since"`: an id is `EPOCH-SEQ`, far shorter.
pub const MAX_SINCE: usize = 256;

/// Why a client message was refused. None of these closes the connection: the server answers
/// `pusher:error` with the message (and counts it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Larger than the limit.
    #[error("message larger than {0} bytes")]
    TooLarge(usize),
    /// Nested deeper than the limit.
    #[error("message nested deeper than {0} levels")]
    TooDeep(usize),
    /// Not a JSON object with a string `event`.
    #[error("invalid JSON: expected an object with a string \"event\"")]
    Malformed,
    /// A field the event needs is missing or of the wrong type.
    #[error("{event}: missing or invalid {field:?}")]
    Field {
        /// The event.
        event: &'static str,
        /// The field.
        field: &'static str,
    },
    /// The channel name is invalid.
    #[error("invalid channel name: {0}")]
    Channel(#[from] ChannelError),
    /// An event name that is neither a `pusher:` event this server knows nor `client-`.
    #[error("unknown event (client events are named client-*)")]
    UnknownEvent,
    /// A client event name over the limit.
    #[error("client event name longer than {0} bytes")]
    EventNameTooLong(usize),
}

impl ClientError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ClientError::TooLarge(_) => "too_large",
            ClientError::TooDeep(_) => "too_deep",
            ClientError::Malformed => "malformed",
            ClientError::Field { .. } => "field",
            ClientError::Channel(_) => "channel",
            ClientError::UnknownEvent => "unknown_event",
            ClientError::EventNameTooLong(_) => "event_name",
        }
    }
}

/// Decodes one text frame.
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<ClientMessage, ClientError> {
    if bytes.len() > limits.max_client_message {
        return Err(ClientError::TooLarge(limits.max_client_message));
    }
    if !json_depth::within(bytes, limits.max_depth) {
        return Err(ClientError::TooDeep(limits.max_depth));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|_| ClientError::Malformed)?;
    let Value::Object(mut map) = value else {
        return Err(ClientError::Malformed);
    };
    let Some(Value::String(event)) = map.remove("event") else {
        return Err(ClientError::Malformed);
    };
    let data = map.remove("data");
    match event.as_str() {
        "pusher:ping" => Ok(ClientMessage::Ping),
        "pusher:pong" => Ok(ClientMessage::Pong),
        "pusher:subscribe" => subscribe(data),
        "pusher:unsubscribe" => {
            const EV: &str = "pusher:unsubscribe";
            let data = object(data, EV)?;
            let channel = string_field(&data, EV, "channel")?;
            classify(&channel)?;
            Ok(ClientMessage::Unsubscribe { channel })
        }
        "pusher:signin" => {
            const EV: &str = "pusher:signin";
            let data = object(data, EV)?;
            Ok(ClientMessage::Signin {
                auth: string_field(&data, EV, "auth")?,
                user_data: string_field(&data, EV, "user_data")?,
            })
        }
        name if name.starts_with("client-") => {
            if name.len() > limits.max_event_name {
                return Err(ClientError::EventNameTooLong(limits.max_event_name));
            }
            let Some(Value::String(channel)) = map.remove("channel") else {
                return Err(ClientError::Field {
                    event: "client event",
                    field: "channel",
                });
            };
            classify(&channel)?;
            let data = data.unwrap_or(Value::Null).to_string();
            Ok(ClientMessage::ClientEvent {
                event,
                channel,
                data,
            })
        }
        _ => Err(ClientError::UnknownEvent),
    }
}

fn subscribe(data: Option<Value>) -> Result<ClientMessage, ClientError> {
    const EV: &str = "pusher:subscribe";
    let data = object(data, EV)?;
    let channel = string_field(&data, EV, "channel")?;
    let kind = classify(&channel)?;
    let optional = |field: &'static str| match data.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ClientError::Field { event: EV, field }),
    };
    let since = optional("clarion_since")?;
    if since.as_ref().is_some_and(|s| s.len() > MAX_SINCE) {
        return Err(ClientError::Field {
            event: EV,
            field: "clarion_since",
        });
    }
    Ok(ClientMessage::Subscribe(Subscribe {
        auth: optional("auth")?,
        channel_data: optional("channel_data")?,
        since,
        channel,
        kind,
    }))
}

/// `data` as an object: pusher-js sends one, some clients send it JSON-encoded in a string.
fn object(
    data: Option<Value>,
    event: &'static str,
) -> Result<serde_json::Map<String, Value>, ClientError> {
    let bad = ClientError::Field {
        event,
        field: "data",
    };
    match data {
        Some(Value::Object(m)) => Ok(m),
        Some(Value::String(s)) => match serde_json::from_str(&s) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) | Err(_) => Err(bad),
        },
        Some(_) | None => Err(bad),
    }
}

fn string_field(
    data: &serde_json::Map<String, Value>,
    event: &'static str,
    field: &'static str,
) -> Result<String, ClientError> {
    match data.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) | None => Err(ClientError::Field { event, field }),
    }
}

/// A presence member, from `channel_data`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// `user_id` as a string (a number is accepted and written in decimal, as Pusher does).
    pub user_id: String,
    /// `user_info` as compact JSON text, when given.
    pub user_info: Option<String>,
}

/// Why a presence member or signed-in user was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    /// Not a JSON object.
    #[error("channel_data/user_data is not a JSON object")]
    Malformed,
    /// No `user_id` (`id` for a user) string or number, or an empty one.
    #[error("missing user id")]
    NoId,
    /// The id is longer than the limit.
    #[error("user id too long")]
    IdTooLong,
    /// `user_info` is larger than the limit.
    #[error("user_info too large")]
    InfoTooLarge,
}

impl Member {
    /// Reads `channel_data` (`{"user_id": ..., "user_info": {...}}`).
    pub fn parse(channel_data: &str, limits: &Limits) -> Result<Member, MemberError> {
        let Ok(Value::Object(mut map)) = parse_bounded(channel_data, limits) else {
            return Err(MemberError::Malformed);
        };
        let user_id = id_of(map.remove("user_id"), limits)?;
        let user_info = match map.remove("user_info") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let text = v.to_string();
                if text.len() > limits.max_user_info {
                    return Err(MemberError::InfoTooLarge);
                }
                Some(text)
            }
        };
        Ok(Member { user_id, user_info })
    }
}

/// The user id of a `pusher:signin`'s `user_data` (`{"id": "...", ...}`).
pub fn signin_user_id(user_data: &str, limits: &Limits) -> Result<String, MemberError> {
    let Ok(Value::Object(mut map)) = parse_bounded(user_data, limits) else {
        return Err(MemberError::Malformed);
    };
    match map.remove("id") {
        Some(Value::String(s)) => id_of(Some(Value::String(s)), limits),
        Some(_) | None => Err(MemberError::NoId),
    }
}

fn parse_bounded(text: &str, limits: &Limits) -> Result<Value, ()> {
    if text.len() > limits.max_client_message
        || !json_depth::within(text.as_bytes(), limits.max_depth)
    {
        return Err(());
    }
    serde_json::from_str(text).map_err(|_| ())
}

fn id_of(v: Option<Value>, limits: &Limits) -> Result<String, MemberError> {
    let id = match v {
        Some(Value::String(s)) => s,
        Some(Value::Number(n)) => n.to_string(),
        Some(_) | None => return Err(MemberError::NoId),
    };
    if id.is_empty() {
        return Err(MemberError::NoId);
    }
    if id.len() > limits.max_user_id {
        return Err(MemberError::IdTooLong);
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::super::channel::Access;
    use super::*;

    fn d(text: &str) -> Result<ClientMessage, ClientError> {
        decode(text.as_bytes(), &Limits::default())
    }

    #[test]
    fn the_resume_extensions_since_is_read_bounded_and_typed() {
        let sub = |since: &str| {
            d(&format!(
                r#"{{"event":"pusher:subscribe","data":{{"channel":"c","clarion_since":{since}}}}}"#
            ))
        };
        match sub(r#""ab12-7""#) {
            Ok(ClientMessage::Subscribe(s)) => assert_eq!(s.since.as_deref(), Some("ab12-7")),
            other => panic!("{other:?}"),
        }
        match sub(r#""""#) {
            Ok(ClientMessage::Subscribe(s)) => assert_eq!(s.since.as_deref(), Some("")),
            other => panic!("{other:?}"),
        }
        let field = Err(ClientError::Field {
            event: "pusher:subscribe",
            field: "clarion_since",
        });
        assert_eq!(sub("7"), field);
        assert_eq!(sub(&format!("\"{}\"", "1".repeat(MAX_SINCE + 1))), field);
    }

    #[test]
    fn pusher_js_subscribe_messages_decode() {
        assert_eq!(
            d(r#"{"event":"pusher:subscribe","data":{"auth":"","channel":"my-channel"}}"#),
            Ok(ClientMessage::Subscribe(Subscribe {
                channel: "my-channel".into(),
                kind: Kind {
                    access: Access::Public,
                    cache: false
                },
                auth: Some(String::new()),
                channel_data: None,
                since: None,
            }))
        );
        let presence = r#"{"event":"pusher:subscribe","data":{"channel":"presence-cache-r","auth":"k:s","channel_data":"{\"user_id\":1}"}}"#;
        match d(presence) {
            Ok(ClientMessage::Subscribe(s)) => {
                assert_eq!(
                    s.kind,
                    Kind {
                        access: Access::Presence,
                        cache: true
                    }
                );
                assert_eq!(s.channel_data.as_deref(), Some(r#"{"user_id":1}"#));
                assert_eq!(s.auth.as_deref(), Some("k:s"));
            }
            other => panic!("{other:?}"),
        }
        // `data` JSON-encoded in a string, as some clients send it.
        assert!(matches!(
            d(r#"{"event":"pusher:subscribe","data":"{\"channel\":\"a\"}"}"#),
            Ok(ClientMessage::Subscribe(_))
        ));
    }

    #[test]
    fn ping_unsubscribe_signin_and_client_events_decode() {
        assert_eq!(
            d(r#"{"event":"pusher:ping","data":{}}"#),
            Ok(ClientMessage::Ping)
        );
        assert_eq!(d(r#"{"event":"pusher:pong"}"#), Ok(ClientMessage::Pong));
        assert_eq!(
            d(r#"{"event":"pusher:unsubscribe","data":{"channel":"a"}}"#),
            Ok(ClientMessage::Unsubscribe {
                channel: "a".into()
            })
        );
        assert_eq!(
            d(r#"{"event":"pusher:signin","data":{"auth":"k:s","user_data":"{\"id\":\"1\"}"}}"#),
            Ok(ClientMessage::Signin {
                auth: "k:s".into(),
                user_data: r#"{"id":"1"}"#.into()
            })
        );
        assert_eq!(
            d(r#"{"event":"client-typing","channel":"private-a","data":{"who": "x"}}"#),
            Ok(ClientMessage::ClientEvent {
                event: "client-typing".into(),
                channel: "private-a".into(),
                data: r#"{"who":"x"}"#.into()
            })
        );
    }

    #[test]
    fn malformed_unknown_oversized_and_deep_messages_are_refused_with_reasons() {
        assert_eq!(d("not json"), Err(ClientError::Malformed));
        assert_eq!(d("[]"), Err(ClientError::Malformed));
        assert_eq!(d(r#"{"event":1}"#), Err(ClientError::Malformed));
        assert_eq!(
            d(r#"{"event":"pusher:nope"}"#),
            Err(ClientError::UnknownEvent)
        );
        assert_eq!(d(r#"{"event":"hello"}"#), Err(ClientError::UnknownEvent));
        assert_eq!(
            d(r#"{"event":"pusher:subscribe","data":{}}"#),
            Err(ClientError::Field {
                event: "pusher:subscribe",
                field: "channel"
            })
        );
        assert_eq!(
            d(r#"{"event":"pusher:subscribe","data":{"channel":"a b"}}"#),
            Err(ClientError::Channel(ChannelError::BadChar))
        );
        assert_eq!(
            d(r#"{"event":"client-x","data":{}}"#),
            Err(ClientError::Field {
                event: "client event",
                field: "channel"
            })
        );
        let limits = Limits::default();
        let big = format!(
            r#"{{"event":"client-x","channel":"private-a","data":"{}"}}"#,
            "x".repeat(limits.max_client_message)
        );
        assert_eq!(
            d(&big),
            Err(ClientError::TooLarge(limits.max_client_message))
        );
        let deep = format!(
            r#"{{"event":"client-x","channel":"private-a","data":{}1{}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        assert_eq!(d(&deep), Err(ClientError::TooDeep(limits.max_depth)));
        let long = format!(
            r#"{{"event":"client-{}","channel":"private-a"}}"#,
            "x".repeat(200)
        );
        assert_eq!(
            d(&long),
            Err(ClientError::EventNameTooLong(limits.max_event_name))
        );
    }

    #[test]
    fn presence_members_and_signin_users_are_read_with_bounds() {
        let l = Limits::default();
        assert_eq!(
            Member::parse(r#"{"user_id":10,"user_info":{"name":"Mr. Channels"}}"#, &l),
            Ok(Member {
                user_id: "10".into(),
                user_info: Some(r#"{"name":"Mr. Channels"}"#.into())
            })
        );
        assert_eq!(
            Member::parse(r#"{"user_id":"a"}"#, &l),
            Ok(Member {
                user_id: "a".into(),
                user_info: None
            })
        );
        assert_eq!(
            Member::parse(r#"{"user_id":""}"#, &l),
            Err(MemberError::NoId)
        );
        assert_eq!(
            Member::parse(r#"{"user_id":[1]}"#, &l),
            Err(MemberError::NoId)
        );
        assert_eq!(Member::parse("1", &l), Err(MemberError::Malformed));
        let long = format!(r#"{{"user_id":"{}"}}"#, "u".repeat(l.max_user_id + 1));
        assert_eq!(Member::parse(&long, &l), Err(MemberError::IdTooLong));
        let info = format!(
            r#"{{"user_id":"u","user_info":"{}"}}"#,
            "i".repeat(l.max_user_info)
        );
        assert_eq!(Member::parse(&info, &l), Err(MemberError::InfoTooLarge));
        assert_eq!(signin_user_id(r#"{"id":"12345"}"#, &l), Ok("12345".into()));
        assert_eq!(
            signin_user_id(r#"{"id":12345}"#, &l),
            Err(MemberError::NoId)
        );
    }
}
