//! The GRIP publish API body: `{"items": [...]}`, as a backend POSTs it to `/publish/`.
//!
//! Each item names a channel, optionally its own `id` and the `prev-id` of the item before it,
//! and carries one or more formats: what to do with each kind of connection subscribed to the
//! channel. `http-response` answers held long-polls, `http-stream` appends to held streams,
//! `ws-message` sends to WebSockets. A format's `action` is `send` (the default), `hint` (the
//! content is not included: fetch it from the backend), `close` (end the stream or close the
//! WebSocket), or, for WebSockets, `refresh` (ask the backend again). Binary content travels in
//! the `-bin` fields as base64. Formats may also sit directly in the item instead of under
//! `formats`, as older publishers send them.
//!
//! Decoding checks everything a connection will later rely on (status codes, close codes, UTF-8
//! for text, control frame sizes) so a bad publish is refused whole, with an error naming the item
//! and field, before any subscriber sees it. Unknown fields are ignored, as Pushpin does.

use super::params::is_token;
use super::BASE64;
use crate::ws::CloseCode;
use base64::Engine;
use serde_json::{Map, Value};

/// Longest payload of a WebSocket ping or pong (RFC 6455 section 5.5: control frames carry at most
/// 125 bytes).
const MAX_CONTROL_PAYLOAD: usize = 125;

/// Longest close reason: a Close frame's 125 bytes less the two of the code.
const MAX_CLOSE_REASON: usize = 123;

/// What a publish body may hold. There is no default: the caller owns these limits (the
/// server's come from its configuration), so this crate cannot disagree with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishLimits {
    /// Largest body, in bytes, checked before parsing.
    pub max_body: usize,
    /// Most items in one body.
    pub max_items: usize,
}

/// One published item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The channel it is published to.
    pub channel: String,
    /// Its id, which subscribers may later pass back as a `prev-id`.
    pub id: Option<String>,
    /// The id of the item published before it on the channel, so gaps can be detected.
    pub prev_id: Option<String>,
    /// What to do with held long-polls.
    pub http_response: Option<HttpResponseFormat>,
    /// What to do with held streams.
    pub http_stream: Option<HttpStreamFormat>,
    /// What to do with WebSockets.
    pub ws_message: Option<WsMessageFormat>,
    /// `meta`: string fields that filters may match on.
    pub meta: Vec<(String, String)>,
}

/// The `http-response` format: the response a held long-poll is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpResponseFormat {
    /// Answer with this response.
    Send(HttpResponse),
    /// The response is not included: the proxy should fetch it from the backend.
    Hint,
}

/// A complete response for a long-poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code, 100 to 999 (200 when not given).
    pub code: u16,
    /// Reason phrase, if given (otherwise the standard one for the code).
    pub reason: Option<String>,
    /// Headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body, from `body` or base64 `body-bin`.
    pub body: Vec<u8>,
    /// `content-filters`, in order.
    pub filters: Vec<String>,
}

/// The `http-stream` format: what happens to held streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpStreamFormat {
    /// Append `content` to the stream.
    Send {
        /// The bytes, from `content` or base64 `content-bin`.
        content: Vec<u8>,
        /// `content-filters`, in order.
        filters: Vec<String>,
    },
    /// The content is not included: the proxy should fetch it from the backend.
    Hint,
    /// End the stream.
    Close,
}

/// The `ws-message` format: what happens to subscribed WebSockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsMessageFormat {
    /// Send a message.
    Send {
        /// The message.
        message: WsMessage,
        /// `content-filters`, in order.
        filters: Vec<String>,
    },
    /// The content is not included: the proxy should fetch it from the backend.
    Hint,
    /// Close the WebSocket, with a code and reason if given.
    Close {
        /// The close code; `None` closes without one.
        code: Option<CloseCode>,
        /// The reason, at most 123 bytes.
        reason: String,
    },
    /// Ask the backend about the connection again (WebSocket-over-HTTP).
    Refresh,
}

/// A WebSocket message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsMessage {
    /// A text message (`content`, or `type: "text"`).
    Text(String),
    /// A binary message (`content-bin`, or `type: "binary"`).
    Binary(Vec<u8>),
    /// A ping, at most 125 bytes.
    Ping(Vec<u8>),
    /// A pong, at most 125 bytes.
    Pong(Vec<u8>),
}

/// Why a publish body was refused. The publish API answers 400 with its text (413 for
/// [`PublishError::TooLarge`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The body is larger than [`PublishLimits::max_body`].
    #[error("publish body too large")]
    TooLarge,
    /// The body is not JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// The body is not an object with an `items` array.
    #[error("body must be an object with an 'items' array")]
    NotItems,
    /// More items than [`PublishLimits::max_items`].
    #[error("too many items")]
    TooManyItems,
    /// One item is invalid; `index` counts from 0.
    #[error("item {index}: {why}")]
    Item {
        /// Which item.
        index: usize,
        /// What is wrong with it.
        why: ItemError,
    },
}

/// Why one item was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    /// The item is not a JSON object.
    #[error("not an object")]
    NotObject,
    /// `channel` is missing or empty.
    #[error("missing 'channel'")]
    MissingChannel,
    /// A field has the wrong JSON type.
    #[error("'{0}' has the wrong type")]
    WrongType(&'static str),
    /// None of `http-response`, `http-stream` or `ws-message` is present.
    #[error("no formats")]
    NoFormats,
    /// One format is invalid.
    #[error("'{format}': {why}")]
    Format {
        /// The format's name.
        format: &'static str,
        /// What is wrong with it.
        why: FormatError,
    },
}

/// Why one format of an item was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The format is not a JSON object.
    #[error("not an object")]
    NotObject,
    /// A field has the wrong JSON type.
    #[error("'{0}' has the wrong type")]
    WrongType(&'static str),
    /// `action` is not one of `send`, `hint`, `close`, `refresh`.
    #[error("unknown action")]
    UnknownAction,
    /// `action` is known but means nothing for this format.
    #[error("action not supported by this format")]
    UnsupportedAction,
    /// A `send` without content (`content`/`content-bin`, or `body`/`body-bin`).
    #[error("no content")]
    MissingContent,
    /// A `-bin` field is not base64.
    #[error("'{0}' is not base64")]
    InvalidBase64(&'static str),
    /// A text message's content is not UTF-8.
    #[error("text content is not UTF-8")]
    InvalidUtf8,
    /// `type` is not `text`, `binary`, `ping` or `pong`.
    #[error("unknown message type")]
    UnknownType,
    /// An HTTP status code outside 100-999.
    #[error("invalid status code")]
    InvalidStatus,
    /// A close code a WebSocket endpoint may not send.
    #[error("invalid close code")]
    InvalidCloseCode,
    /// A ping or pong payload over 125 bytes, or a close reason over 123.
    #[error("control payload too large")]
    ControlTooLarge,
    /// `headers` is neither an object of strings nor a list of `[name, value]` pairs, or a name
    /// or value is not valid in a header.
    #[error("invalid headers")]
    InvalidHeaders,
    /// `body-patch` (JSON Patch bodies) is not supported.
    #[error("'body-patch' is not supported")]
    BodyPatch,
}

/// Decodes a publish body into its items.
pub fn decode_publish(body: &[u8], limits: &PublishLimits) -> Result<Vec<Item>, PublishError> {
    if body.len() > limits.max_body {
        return Err(PublishError::TooLarge);
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| PublishError::Json(e.to_string()))?;
    let items = value
        .get("items")
        .and_then(Value::as_array)
        .ok_or(PublishError::NotItems)?;
    if items.len() > limits.max_items {
        return Err(PublishError::TooManyItems);
    }
    items
        .iter()
        .enumerate()
        .map(|(index, v)| decode_item(v).map_err(|why| PublishError::Item { index, why }))
        .collect()
}

/// Decodes one item (an element of `items`).
pub fn decode_item(value: &Value) -> Result<Item, ItemError> {
    let item = value.as_object().ok_or(ItemError::NotObject)?;
    let field = |key: &'static str| opt_str(item, key).map_err(ItemError::WrongType);
    let channel = field("channel")?
        .filter(|c| !c.is_empty())
        .ok_or(ItemError::MissingChannel)?;
    let formats = match item.get("formats") {
        None | Some(Value::Null) => item,
        Some(Value::Object(formats)) => formats,
        Some(_) => return Err(ItemError::WrongType("formats")),
    };
    let in_format = |format: &'static str| move |why| ItemError::Format { format, why };
    let http_response = formats
        .get("http-response")
        .map(|v| http_response(v).map_err(in_format("http-response")))
        .transpose()?;
    let http_stream = formats
        .get("http-stream")
        .map(|v| http_stream(v).map_err(in_format("http-stream")))
        .transpose()?;
    let ws_message = formats
        .get("ws-message")
        .map(|v| ws_message(v).map_err(in_format("ws-message")))
        .transpose()?;
    if http_response.is_none() && http_stream.is_none() && ws_message.is_none() {
        return Err(ItemError::NoFormats);
    }
    let meta = match item.get("meta") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(meta)) => meta
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(ItemError::WrongType("meta")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ItemError::WrongType("meta")),
    };
    Ok(Item {
        channel: channel.to_string(),
        id: field("id")?.map(str::to_string),
        prev_id: field("prev-id")?.map(str::to_string),
        http_response,
        http_stream,
        ws_message,
        meta,
    })
}

/// A format's `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Send,
    Hint,
    Close,
    Refresh,
}

/// The format's fields and its action.
fn format_object(value: &Value) -> Result<(&Map<String, Value>, Action), FormatError> {
    let f = value.as_object().ok_or(FormatError::NotObject)?;
    let action = match opt_str(f, "action").map_err(FormatError::WrongType)? {
        None | Some("send") => Action::Send,
        Some("hint") => Action::Hint,
        Some("close") => Action::Close,
        Some("refresh") => Action::Refresh,
        Some(_) => return Err(FormatError::UnknownAction),
    };
    Ok((f, action))
}

fn http_response(value: &Value) -> Result<HttpResponseFormat, FormatError> {
    let (f, action) = format_object(value)?;
    match action {
        Action::Send => {}
        Action::Hint => return Ok(HttpResponseFormat::Hint),
        Action::Close | Action::Refresh => return Err(FormatError::UnsupportedAction),
    }
    let code = match f.get("code") {
        None | Some(Value::Null) => 200,
        Some(v) => v
            .as_u64()
            .ok_or(FormatError::WrongType("code"))?
            .try_into()
            .ok()
            .filter(|c| (100..=999).contains(c))
            .ok_or(FormatError::InvalidStatus)?,
    };
    let reason = opt_str(f, "reason")
        .map_err(FormatError::WrongType)?
        .filter(|r| !r.is_empty());
    if reason.is_some_and(|r| r.chars().any(char::is_control)) {
        return Err(FormatError::InvalidStatus);
    }
    let body = match binary_or_text(f, "body-bin", "body")? {
        Some(body) => body,
        None if f.contains_key("body-patch") => return Err(FormatError::BodyPatch),
        None => return Err(FormatError::MissingContent),
    };
    Ok(HttpResponseFormat::Send(HttpResponse {
        code,
        reason: reason.map(str::to_string),
        headers: headers(f.get("headers"))?,
        body,
        filters: filters(f)?,
    }))
}

fn http_stream(value: &Value) -> Result<HttpStreamFormat, FormatError> {
    let (f, action) = format_object(value)?;
    match action {
        Action::Send => Ok(HttpStreamFormat::Send {
            content: binary_or_text(f, "content-bin", "content")?
                .ok_or(FormatError::MissingContent)?,
            filters: filters(f)?,
        }),
        Action::Hint => Ok(HttpStreamFormat::Hint),
        Action::Close => Ok(HttpStreamFormat::Close),
        Action::Refresh => Err(FormatError::UnsupportedAction),
    }
}

fn ws_message(value: &Value) -> Result<WsMessageFormat, FormatError> {
    let (f, action) = format_object(value)?;
    match action {
        Action::Send => {}
        Action::Hint => return Ok(WsMessageFormat::Hint),
        Action::Refresh => return Ok(WsMessageFormat::Refresh),
        Action::Close => {
            let code = match f.get("code") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    let code = v.as_u64().ok_or(FormatError::WrongType("code"))?;
                    let code = u16::try_from(code)
                        .map(CloseCode::from_u16)
                        .ok()
                        .filter(|c| c.is_sendable())
                        .ok_or(FormatError::InvalidCloseCode)?;
                    Some(code)
                }
            };
            let reason = opt_str(f, "reason").map_err(FormatError::WrongType)?;
            let reason = reason.unwrap_or_default();
            if reason.len() > MAX_CLOSE_REASON {
                return Err(FormatError::ControlTooLarge);
            }
            if code.is_none() && !reason.is_empty() {
                // A Close frame cannot carry a reason without a code.
                return Err(FormatError::InvalidCloseCode);
            }
            return Ok(WsMessageFormat::Close {
                code,
                reason: reason.to_string(),
            });
        }
    }
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Type {
        Text,
        Binary,
        Ping,
        Pong,
    }
    let declared = match opt_str(f, "type").map_err(FormatError::WrongType)? {
        None => None,
        Some("text") => Some(Type::Text),
        Some("binary") => Some(Type::Binary),
        Some("ping") => Some(Type::Ping),
        Some("pong") => Some(Type::Pong),
        Some(_) => return Err(FormatError::UnknownType),
    };
    let is_bin = f.get("content-bin").is_some_and(|v| !v.is_null());
    let content = binary_or_text(f, "content-bin", "content")?;
    // Without a type, the field used decides: `content-bin` is binary, `content` text.
    let kind = declared.unwrap_or(if is_bin { Type::Binary } else { Type::Text });
    let message = match (kind, content) {
        (Type::Text, Some(c)) => {
            WsMessage::Text(String::from_utf8(c).map_err(|_| FormatError::InvalidUtf8)?)
        }
        (Type::Binary, Some(c)) => WsMessage::Binary(c),
        (Type::Text | Type::Binary, None) => return Err(FormatError::MissingContent),
        (Type::Ping | Type::Pong, c) => {
            let c = c.unwrap_or_default();
            if c.len() > MAX_CONTROL_PAYLOAD {
                return Err(FormatError::ControlTooLarge);
            }
            if kind == Type::Ping {
                WsMessage::Ping(c)
            } else {
                WsMessage::Pong(c)
            }
        }
    };
    Ok(WsMessageFormat::Send {
        message,
        filters: filters(f)?,
    })
}

/// The content of a format: base64 `bin` if present (it wins, as in Pushpin), else `text`.
pub(super) fn binary_or_text(
    f: &Map<String, Value>,
    bin: &'static str,
    text: &'static str,
) -> Result<Option<Vec<u8>>, FormatError> {
    if let Some(b64) = opt_str(f, bin).map_err(FormatError::WrongType)? {
        return BASE64
            .decode(b64)
            .map(Some)
            .map_err(|_| FormatError::InvalidBase64(bin));
    }
    Ok(opt_str(f, text)
        .map_err(FormatError::WrongType)?
        .map(|t| t.as_bytes().to_vec()))
}

/// `headers`: an object of strings, or a list of `[name, value]` pairs (which keeps order and
/// allows repeats). Names must be tokens and values free of CR, LF and NUL, since they are
/// written into a response head.
pub(super) fn headers(value: Option<&Value>) -> Result<Vec<(String, String)>, FormatError> {
    let pairs: Vec<(&str, &str)> = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
            .collect::<Option<_>>()
            .ok_or(FormatError::InvalidHeaders)?,
        Some(Value::Array(list)) => list
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([Value::String(k), Value::String(v)]) => Some((k.as_str(), v.as_str())),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or(FormatError::InvalidHeaders)?,
        Some(_) => return Err(FormatError::InvalidHeaders),
    };
    pairs
        .into_iter()
        .map(|(k, v)| {
            (is_token(k) && !v.contains(['\r', '\n', '\0']))
                .then(|| (k.to_string(), v.to_string()))
                .ok_or(FormatError::InvalidHeaders)
        })
        .collect()
}

/// `content-filters`: a list of filter names.
fn filters(f: &Map<String, Value>) -> Result<Vec<String>, FormatError> {
    match f.get("content-filters") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or(FormatError::WrongType("content-filters")),
        Some(_) => Err(FormatError::WrongType("content-filters")),
    }
}

/// An optional string field; `null` counts as absent.
pub(super) fn opt_str<'a>(
    obj: &'a Map<String, Value>,
    key: &'static str,
) -> Result<Option<&'a str>, &'static str> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(key),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Limits roomy enough for every body these tests build.
    const ROOMY: PublishLimits = PublishLimits {
        max_body: 1 << 20,
        max_items: 100,
    };

    fn decode(json: &str) -> Result<Vec<Item>, PublishError> {
        decode_publish(json.as_bytes(), &ROOMY)
    }

    /// Decodes a body holding one item whose `formats` are `formats`.
    fn one(formats: &str) -> Result<Item, PublishError> {
        decode(&format!(
            r#"{{"items":[{{"channel":"c","formats":{formats}}}]}}"#
        ))
        .map(|mut items| items.remove(0))
    }

    fn format_err(format: &'static str, why: FormatError) -> PublishError {
        PublishError::Item {
            index: 0,
            why: ItemError::Format { format, why },
        }
    }

    #[test]
    fn the_documented_example_decodes() {
        let items = decode(
            r#"{"items":[{"channel":"mychannel","id":"an-item-id","prev-id":"p",
                "formats":{"http-stream":{"content":"a chunk of data\n"}}}]}"#,
        )
        .unwrap();
        assert_eq!(
            items,
            vec![Item {
                channel: "mychannel".into(),
                id: Some("an-item-id".into()),
                prev_id: Some("p".into()),
                http_response: None,
                http_stream: Some(HttpStreamFormat::Send {
                    content: b"a chunk of data\n".to_vec(),
                    filters: vec![]
                }),
                ws_message: None,
                meta: vec![],
            }]
        );
    }

    #[test]
    fn all_three_formats_and_the_legacy_layout() {
        let item = one(r#"{"http-response":{"code":404,"reason":"Gone Fishing",
                   "headers":[["X-A","1"],["X-A","2"]],"body-bin":"AP8="},
               "http-stream":{"content-bin":"aGk","content-filters":["skip-self"]},
               "ws-message":{"content":"hello"}}"#)
        .unwrap();
        assert_eq!(
            item.http_response,
            Some(HttpResponseFormat::Send(HttpResponse {
                code: 404,
                reason: Some("Gone Fishing".into()),
                headers: vec![("X-A".into(), "1".into()), ("X-A".into(), "2".into())],
                body: vec![0, 255],
                filters: vec![],
            }))
        );
        assert_eq!(
            item.http_stream,
            Some(HttpStreamFormat::Send {
                content: b"hi".to_vec(),
                filters: vec!["skip-self".into()]
            })
        );
        assert_eq!(
            item.ws_message,
            Some(WsMessageFormat::Send {
                message: WsMessage::Text("hello".into()),
                filters: vec![]
            })
        );

        // Formats directly in the item, headers as an object, defaults filled in.
        let legacy = decode(
            r#"{"items":[{"channel":"c","meta":{"user":"alice"},
                "http-response":{"body":"ok","headers":{"Content-Type":"text/plain"}}}]}"#,
        )
        .unwrap();
        assert_eq!(legacy[0].meta, vec![("user".into(), "alice".into())]);
        let Some(HttpResponseFormat::Send(r)) = &legacy[0].http_response else {
            panic!("{legacy:?}")
        };
        assert_eq!((r.code, r.reason.as_deref()), (200, None));
        assert_eq!(
            r.headers,
            vec![("Content-Type".into(), "text/plain".into())]
        );
    }

    #[test]
    fn actions() {
        assert_eq!(
            one(r#"{"http-stream":{"action":"close"}}"#)
                .unwrap()
                .http_stream,
            Some(HttpStreamFormat::Close)
        );
        assert_eq!(
            one(r#"{"http-response":{"action":"hint"}}"#)
                .unwrap()
                .http_response,
            Some(HttpResponseFormat::Hint)
        );
        assert_eq!(
            one(r#"{"ws-message":{"action":"close","code":4001,"reason":"bye"}}"#)
                .unwrap()
                .ws_message,
            Some(WsMessageFormat::Close {
                code: Some(CloseCode::Other(4001)),
                reason: "bye".into()
            })
        );
        assert_eq!(
            one(r#"{"ws-message":{"action":"close"}}"#)
                .unwrap()
                .ws_message,
            Some(WsMessageFormat::Close {
                code: None,
                reason: String::new()
            })
        );
        assert_eq!(
            one(r#"{"ws-message":{"action":"refresh"}}"#)
                .unwrap()
                .ws_message,
            Some(WsMessageFormat::Refresh)
        );
        assert_eq!(
            one(r#"{"http-stream":{"action":"refresh"}}"#),
            Err(format_err("http-stream", FormatError::UnsupportedAction))
        );
        assert_eq!(
            one(r#"{"http-stream":{"action":"explode"}}"#),
            Err(format_err("http-stream", FormatError::UnknownAction))
        );
    }

    #[test]
    fn websocket_message_types() {
        let msg = |f: &str| match one(&format!(r#"{{"ws-message":{f}}}"#))?.ws_message {
            Some(WsMessageFormat::Send { message, .. }) => Ok(message),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            msg(r#"{"content-bin":"AP8="}"#),
            Ok(WsMessage::Binary(vec![0, 255]))
        );
        assert_eq!(
            msg(r#"{"content":"x","type":"binary"}"#),
            Ok(WsMessage::Binary(b"x".to_vec()))
        );
        assert_eq!(
            msg(r#"{"content-bin":"aGk=","type":"text"}"#),
            Ok(WsMessage::Text("hi".into()))
        );
        assert_eq!(msg(r#"{"type":"ping"}"#), Ok(WsMessage::Ping(vec![])));
        assert_eq!(
            msg(r#"{"type":"pong","content":"p"}"#),
            Ok(WsMessage::Pong(b"p".to_vec()))
        );
        let ws = |why| Err(format_err("ws-message", why));
        assert_eq!(
            msg(r#"{"content-bin":"/w==","type":"text"}"#),
            ws(FormatError::InvalidUtf8)
        );
        assert_eq!(msg(r#"{"type":"text"}"#), ws(FormatError::MissingContent));
        assert_eq!(msg("{}"), ws(FormatError::MissingContent));
        assert_eq!(
            msg(r#"{"content":"x","type":"frame"}"#),
            ws(FormatError::UnknownType)
        );
        assert_eq!(
            msg(&format!(
                r#"{{"type":"ping","content":"{}"}}"#,
                "x".repeat(126)
            )),
            ws(FormatError::ControlTooLarge)
        );
        assert_eq!(
            msg(r#"{"content-bin":"!!"}"#),
            ws(FormatError::InvalidBase64("content-bin"))
        );
        assert_eq!(
            msg(r#"{"content":5}"#),
            ws(FormatError::WrongType("content"))
        );
    }

    #[test]
    fn invalid_formats_are_refused() {
        let cases = [
            (
                r#"{"http-response":{"code":99,"body":""}}"#,
                format_err("http-response", FormatError::InvalidStatus),
            ),
            (
                r#"{"http-response":{"code":"200","body":""}}"#,
                format_err("http-response", FormatError::WrongType("code")),
            ),
            (
                r#"{"http-response":{}}"#,
                format_err("http-response", FormatError::MissingContent),
            ),
            (
                r#"{"http-response":{"body-patch":[]}}"#,
                format_err("http-response", FormatError::BodyPatch),
            ),
            (
                r#"{"http-response":{"body":"","headers":[["a"]]}}"#,
                format_err("http-response", FormatError::InvalidHeaders),
            ),
            (
                r#"{"http-response":{"body":"","headers":{"X":"a\r\nB: c"}}}"#,
                format_err("http-response", FormatError::InvalidHeaders),
            ),
            (
                r#"{"http-response":{"body":"","headers":{"Bad Name":"v"}}}"#,
                format_err("http-response", FormatError::InvalidHeaders),
            ),
            (
                r#"{"http-stream":{}}"#,
                format_err("http-stream", FormatError::MissingContent),
            ),
            (
                r#"{"http-stream":"text"}"#,
                format_err("http-stream", FormatError::NotObject),
            ),
            (
                r#"{"http-stream":{"content":"x","content-filters":"f"}}"#,
                format_err("http-stream", FormatError::WrongType("content-filters")),
            ),
            (
                r#"{"ws-message":{"action":"close","code":1005}}"#,
                format_err("ws-message", FormatError::InvalidCloseCode),
            ),
            (
                r#"{"ws-message":{"action":"close","code":70000}}"#,
                format_err("ws-message", FormatError::InvalidCloseCode),
            ),
            (
                r#"{"ws-message":{"action":"close","reason":"no code"}}"#,
                format_err("ws-message", FormatError::InvalidCloseCode),
            ),
            (
                r#"{"other":{}}"#,
                PublishError::Item {
                    index: 0,
                    why: ItemError::NoFormats,
                },
            ),
        ];
        for (formats, want) in cases {
            assert_eq!(one(formats), Err(want), "{formats}");
        }
    }

    #[test]
    fn invalid_bodies_and_items_are_refused() {
        assert!(matches!(decode("{"), Err(PublishError::Json(_))));
        assert_eq!(decode("[]"), Err(PublishError::NotItems));
        assert_eq!(decode(r#"{"items":{}}"#), Err(PublishError::NotItems));
        assert_eq!(decode(r#"{"items":[]}"#), Ok(vec![]));
        let item_err = |json: &str| match decode(json) {
            Err(PublishError::Item { index, why }) => (index, why),
            other => panic!("{json}: {other:?}"),
        };
        let ok = r#"{"channel":"c","formats":{"http-stream":{"content":"x"}}}"#;
        assert_eq!(
            item_err(&format!(r#"{{"items":[{ok},5]}}"#)),
            (1, ItemError::NotObject)
        );
        assert_eq!(
            item_err(r#"{"items":[{"channel":"","http-stream":{"content":"x"}}]}"#),
            (0, ItemError::MissingChannel)
        );
        assert_eq!(
            item_err(r#"{"items":[{"channel":1}]}"#),
            (0, ItemError::WrongType("channel"))
        );
        assert_eq!(
            item_err(r#"{"items":[{"channel":"c","id":1,"http-stream":{"content":"x"}}]}"#),
            (0, ItemError::WrongType("id"))
        );
        assert_eq!(
            item_err(r#"{"items":[{"channel":"c","formats":[]}]}"#),
            (0, ItemError::WrongType("formats"))
        );
        assert_eq!(
            item_err(r#"{"items":[{"channel":"c","meta":{"k":1},"http-stream":{"content":"x"}}]}"#),
            (0, ItemError::WrongType("meta"))
        );
    }

    #[test]
    fn limits() {
        let item = r#"{"channel":"c","formats":{"http-stream":{"content":"x"}}}"#;
        let body = |n: usize| format!(r#"{{"items":[{}]}}"#, vec![item; n].join(","));
        let limits = PublishLimits {
            max_body: 4096,
            max_items: 3,
        };
        assert_eq!(
            decode_publish(body(3).as_bytes(), &limits).map(|v| v.len()),
            Ok(3)
        );
        assert_eq!(
            decode_publish(body(4).as_bytes(), &limits),
            Err(PublishError::TooManyItems)
        );
        assert_eq!(
            decode_publish(body(100).as_bytes(), &limits),
            Err(PublishError::TooLarge)
        );
        // Deep nesting is refused by the JSON parser, not by the stack.
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(matches!(decode(&deep), Err(PublishError::Json(_))));
    }

    #[test]
    fn errors_read_well() {
        let err = one(r#"{"ws-message":{"action":"close","code":1005}}"#).unwrap_err();
        assert_eq!(err.to_string(), "item 0: 'ws-message': invalid close code");
    }
}
