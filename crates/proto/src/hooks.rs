//! Backend hooks, sans-IO: the JSON Clarion sends to an application's `connect`, `subscribe`
//! and `publish` hooks, the answers it accepts, and the HMAC-SHA256 signature over each
//! request (`docs/hooks.md`).
//!
//! Nothing here sends a request or reads a clock: the server gives the timestamp and writes
//! the bytes. Decoders never panic on backend bytes, check every field's type and bound every
//! string and list, so a broken backend answer is a [`AnswerError`] (the connection is refused
//! with a logged reason), never a crash or an unbounded allocation.

use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

use crate::auth::{Grants, Pattern};
use crate::pubsub::validate_topic;

/// The request header that carries the signature: `t=<unix seconds>,v1=<hex HMAC-SHA256>`.
pub const SIGNATURE_HEADER: &str = "Clarion-Signature";
/// Longest `sub` an answer may give.
pub const MAX_SUB_LEN: usize = 256;
/// Longest `info` (as JSON text) an answer may give: it rides along to later hook calls.
pub const MAX_INFO_LEN: usize = 4096;
/// Most patterns in one list, and most topics to subscribe at once.
pub const MAX_LIST: usize = 256;
/// Longest `reason` passed to a client (longer ones are cut at a character boundary).
pub const MAX_REASON_LEN: usize = 200;

/// Why a backend answer was not accepted. The text is logged; clients get a generic refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// Not JSON, or not a JSON object.
    #[error("answer is not a JSON object: {0}")]
    NotJson(String),
    /// A field has the wrong type.
    #[error("field {0:?} has the wrong type")]
    Type(&'static str),
    /// A field is missing.
    #[error("field {0:?} is missing")]
    Missing(&'static str),
    /// A string or list is longer than its bound.
    #[error("field {0:?} is too long")]
    TooLong(&'static str),
    /// A topic pattern or topic is not valid.
    #[error("field {0:?}: {1}")]
    Topic(&'static str, String),
}

/// What a `connect` answer decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connect {
    /// The connection is accepted.
    Allow(Box<Accepted>),
    /// The connection is refused with an HTTP status (4xx or 5xx) and a reason for the client.
    Refuse {
        /// The HTTP status (403 unless the backend chose 400–599).
        status: u16,
        /// What the client is told.
        reason: String,
    },
}

/// An accepted connection's identity and grants.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Accepted {
    /// Who it is (`sub`), if the backend says.
    pub sub: Option<String>,
    /// Opaque JSON the backend wants back in later hook calls (`info`), as JSON text.
    pub info: Option<String>,
    /// Topics it may subscribe and publish to (`None`: the answer named none).
    pub grants: Option<Grants>,
    /// Topics to subscribe it to at once, beside those it asked for.
    pub topics: Vec<String>,
    /// When the connection's right ends (Unix seconds), if the backend gives one.
    pub expires_at: Option<u64>,
}

/// What a `subscribe` or `publish` answer decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Allowed; for `publish`, optionally with the data to publish instead.
    Allow {
        /// Replacement data (text) for a publish.
        data: Option<String>,
    },
    /// Refused with a reason for the client.
    Refuse {
        /// What the client is told.
        reason: String,
    },
}

fn object(body: &[u8]) -> Result<Map<String, Value>, AnswerError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(AnswerError::NotJson("not an object".into())),
        Err(e) => Err(AnswerError::NotJson(e.to_string())),
    }
}

fn allow_of(m: &Map<String, Value>) -> Result<bool, AnswerError> {
    match m.get("allow") {
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(AnswerError::Type("allow")),
        None => Err(AnswerError::Missing("allow")),
    }
}

fn opt_str<'m>(
    m: &'m Map<String, Value>,
    key: &'static str,
    max: usize,
) -> Result<Option<&'m str>, AnswerError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() > max => Err(AnswerError::TooLong(key)),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(AnswerError::Type(key)),
    }
}

fn reason_of(m: &Map<String, Value>, default: &str) -> Result<String, AnswerError> {
    let r = match m.get("reason") {
        None | Some(Value::Null) => default,
        Some(Value::String(s)) => s,
        Some(_) => return Err(AnswerError::Type("reason")),
    };
    let mut end = r.len().min(MAX_REASON_LEN);
    while !r.is_char_boundary(end) {
        end -= 1;
    }
    Ok(r.get(..end).unwrap_or_default().to_owned())
}

fn list<'m>(
    m: &'m Map<String, Value>,
    key: &'static str,
) -> Result<Option<Vec<&'m str>>, AnswerError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() > MAX_LIST => Err(AnswerError::TooLong(key)),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().ok_or(AnswerError::Type(key)))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(AnswerError::Type(key)),
    }
}

fn patterns(
    m: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<Vec<Pattern>>, AnswerError> {
    let Some(items) = list(m, key)? else {
        return Ok(None);
    };
    items
        .into_iter()
        .map(|p| Pattern::parse(p).map_err(|e| AnswerError::Topic(key, format!("{p:?}: {e}"))))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Decodes a `connect` answer.
pub fn decode_connect(body: &[u8]) -> Result<Connect, AnswerError> {
    let m = object(body)?;
    if !allow_of(&m)? {
        let status = match m.get("status") {
            None | Some(Value::Null) => 403,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(s @ 400..=599) => s as u16,
                _ => 403,
            },
            Some(_) => return Err(AnswerError::Type("status")),
        };
        return Ok(Connect::Refuse {
            status,
            reason: reason_of(&m, "refused by the application")?,
        });
    }
    let sub = opt_str(&m, "sub", MAX_SUB_LEN)?.map(str::to_owned);
    let info = match m.get("info") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let text = v.to_string();
            if text.len() > MAX_INFO_LEN {
                return Err(AnswerError::TooLong("info"));
            }
            Some(text)
        }
    };
    let subscribe = patterns(&m, "subscribe")?;
    let publish = patterns(&m, "publish")?;
    let grants = (subscribe.is_some() || publish.is_some()).then(|| Grants {
        subscribe: subscribe.unwrap_or_default(),
        publish: publish.unwrap_or_default(),
    });
    let topics = list(&m, "topics")?.unwrap_or_default();
    for t in &topics {
        validate_topic(t).map_err(|e| AnswerError::Topic("topics", format!("{t:?}: {e}")))?;
    }
    let expires_at = match m.get("expires_at") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.as_u64().ok_or(AnswerError::Type("expires_at"))?),
        Some(_) => return Err(AnswerError::Type("expires_at")),
    };
    Ok(Connect::Allow(Box::new(Accepted {
        sub,
        info,
        grants,
        topics: topics.into_iter().map(str::to_owned).collect(),
        expires_at,
    })))
}

/// Decodes a `subscribe` or `publish` answer; `max_data` bounds a publish's replacement data.
pub fn decode_check(body: &[u8], max_data: usize) -> Result<Check, AnswerError> {
    let m = object(body)?;
    if !allow_of(&m)? {
        return Ok(Check::Refuse {
            reason: reason_of(&m, "refused by the application")?,
        });
    }
    let data = opt_str(&m, "data", max_data)?.map(str::to_owned);
    Ok(Check::Allow { data })
}

/// The `connect` request's JSON. `info`-like fields are passed through as given.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ConnectRequest<'a> {
    /// `ws`, `sse`, `stream` or `poll`.
    pub transport: &'a str,
    /// The client's address, as the server saw it.
    pub remote_addr: &'a str,
    /// The request path.
    pub path: &'a str,
    /// Query parameters, in order (repeated keys kept).
    pub query: Vec<(String, String)>,
    /// Topics the request names.
    pub topics: Vec<&'a str>,
    /// Every cookie, in order.
    pub cookies: Vec<(&'a str, &'a str)>,
    /// The configured request headers it carried (names lower-case).
    pub headers: Vec<(String, &'a str)>,
    /// The verified token's `sub`, when the request carried a valid token.
    pub token_sub: Option<&'a str>,
}

impl ConnectRequest<'_> {
    /// The JSON body: `{"type":"connect", ...}` with `query`, `cookies` and `headers` as
    /// objects (a repeated key keeps its last value).
    pub fn encode(&self) -> Vec<u8> {
        let obj = |pairs: &mut dyn Iterator<Item = (&str, &str)>| {
            let mut m = Map::new();
            for (k, v) in pairs {
                m.insert(k.to_owned(), Value::String(v.to_owned()));
            }
            Value::Object(m)
        };
        let v = serde_json::json!({
            "type": "connect",
            "transport": self.transport,
            "remote_addr": self.remote_addr,
            "path": self.path,
            "query": obj(&mut self.query.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            "topics": self.topics,
            "cookies": obj(&mut self.cookies.iter().copied()),
            "headers": obj(&mut self.headers.iter().map(|(k, v)| (k.as_str(), *v))),
            "token_sub": self.token_sub,
        });
        v.to_string().into_bytes()
    }
}

/// The `subscribe` or `publish` request's JSON. `info` is the JSON text the `connect` answer
/// gave (passed back verbatim); `data` is a publish's text (base64 for binary data, with
/// `encoding`).
pub fn encode_check(
    kind: &str,
    sub: Option<&str>,
    info: Option<&str>,
    topic: &str,
    data: Option<(&str, Option<&str>)>,
) -> Vec<u8> {
    let info: Value = info
        .and_then(|i| serde_json::from_str(i).ok())
        .unwrap_or(Value::Null);
    let mut v = serde_json::json!({
        "type": kind,
        "sub": sub,
        "info": info,
        "topic": topic,
    });
    if let (Some((d, enc)), Some(m)) = (data, v.as_object_mut()) {
        m.insert("data".into(), Value::String(d.to_owned()));
        if let Some(e) = enc {
            m.insert("encoding".into(), Value::String(e.to_owned()));
        }
    }
    v.to_string().into_bytes()
}

/// The `Clarion-Signature` value for `body` sent at `timestamp` (Unix seconds):
/// `t=<timestamp>,v1=<hex of HMAC-SHA256(secret, "<timestamp>." + body)>`.
pub fn signature(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    // HMAC accepts keys of any length (long ones are hashed first): this never fails.
    let mut mac = <Hmac<Sha256>>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = format!("t={timestamp},v1=");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Whether `header` is a valid signature of `body` under `secret`, no older than `max_age`
/// seconds at `now` (what a backend does; used by Clarion's own tests and documented).
pub fn verify_signature(secret: &[u8], header: &str, body: &[u8], now: u64, max_age: u64) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", x)) => t = x.parse::<u64>().ok(),
            Some(("v1", x)) => v1 = Some(x),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    if now.abs_diff(t) > max_age {
        return false;
    }
    let Some(want) = signature(secret, t, body)
        .split_once(",v1=")
        .map(|(_, h)| h.to_owned())
    else {
        return false;
    };
    // Constant time over equal lengths.
    want.len() == v1.len()
        && want
            .bytes()
            .zip(v1.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// An event for the application's webhook (`webhook_url`). Each is sent once encoded with an
/// id for deduplication and the Unix time it happened. New kinds (presence `join`/`leave`)
/// are new variants: receivers ignore types they do not know, as the docs ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<'a> {
    /// A connection was accepted (WebSocket, SSE or NDJSON stream).
    Connected {
        /// The connection's id, the same in its `disconnected` event.
        conn: &'a str,
        /// Who it is (token or `connect` hook), if known.
        sub: Option<&'a str>,
        /// `ws`, `sse` or `stream`.
        transport: &'a str,
    },
    /// That connection ended.
    Disconnected {
        /// See [`Event::Connected`].
        conn: &'a str,
        /// See [`Event::Connected`].
        sub: Option<&'a str>,
        /// Why (`client_close`, `disconnected`, `idle_timeout`, `token_expired`, `shutdown`, ...).
        reason: &'a str,
        /// Seconds it was connected.
        duration: u64,
    },
    /// A topic got its first subscriber (cluster-wide with the Redis broker).
    TopicOccupied {
        /// The topic.
        topic: &'a str,
    },
    /// A topic lost its last subscriber (cluster-wide with the Redis broker).
    TopicVacated {
        /// The topic.
        topic: &'a str,
    },
}

impl Event<'_> {
    /// The event as one JSON object: `{"id":..,"type":..,"time":..,...}`.
    pub fn encode(&self, id: &str, time: u64) -> String {
        let v = match self {
            Event::Connected {
                conn,
                sub,
                transport,
            } => serde_json::json!({
                "id": id, "type": "connected", "time": time,
                "conn": conn, "sub": sub, "transport": transport,
            }),
            Event::Disconnected {
                conn,
                sub,
                reason,
                duration,
            } => serde_json::json!({
                "id": id, "type": "disconnected", "time": time,
                "conn": conn, "sub": sub, "reason": reason, "duration": duration,
            }),
            Event::TopicOccupied { topic } => serde_json::json!({
                "id": id, "type": "topic_occupied", "time": time, "topic": topic,
            }),
            Event::TopicVacated { topic } => serde_json::json!({
                "id": id, "type": "topic_vacated", "time": time, "topic": topic,
            }),
        };
        v.to_string()
    }
}

/// A webhook request body from encoded events: `{"events":[e1,e2,...]}`.
pub fn encode_batch<'e>(events: impl IntoIterator<Item = &'e str>) -> Vec<u8> {
    events_body("", events)
}

/// `{` then `head` (fields that come before the events, each ending in a comma), then
/// `"events":[e1,e2,...]}`: the body of a webhook request in Clarion's format (no `head`) or
/// Pusher's (`"time_ms":T,`).
pub fn events_body<'e>(head: &str, events: impl IntoIterator<Item = &'e str>) -> Vec<u8> {
    let mut out = format!("{{{head}\"events\":[").into_bytes();
    for (i, e) in events.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e.as_bytes());
    }
    out.extend_from_slice(b"]}");
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn connect_allow_with_everything() {
        let a = decode_connect(
            br#"{"allow":true,"sub":"alice","info":{"name":"Alice"},"subscribe":["chat.*"],
                "publish":["chat.lobby"],"topics":["news"],"expires_at":1900000000}"#,
        )
        .unwrap();
        let Connect::Allow(a) = a else { panic!() };
        assert_eq!(a.sub.as_deref(), Some("alice"));
        assert_eq!(a.info.as_deref(), Some(r#"{"name":"Alice"}"#));
        let g = a.grants.unwrap();
        assert!(g.may_subscribe("chat.x") && !g.may_subscribe("news"));
        assert!(g.may_publish("chat.lobby") && !g.may_publish("chat.x"));
        assert_eq!(a.topics, vec!["news"]);
        assert_eq!(a.expires_at, Some(1900000000));
    }

    #[test]
    fn connect_allow_minimal_and_refusals() {
        assert_eq!(
            decode_connect(br#"{"allow":true}"#).unwrap(),
            Connect::Allow(Box::default())
        );
        assert_eq!(
            decode_connect(br#"{"allow":false}"#).unwrap(),
            Connect::Refuse {
                status: 403,
                reason: "refused by the application".into()
            }
        );
        assert_eq!(
            decode_connect(br#"{"allow":false,"status":401,"reason":"log in"}"#).unwrap(),
            Connect::Refuse {
                status: 401,
                reason: "log in".into()
            }
        );
        // A status outside 400-599 is not passed on.
        let Connect::Refuse { status, .. } =
            decode_connect(br#"{"allow":false,"status":200}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!(status, 403);
        let long = format!(r#"{{"allow":false,"reason":"{}"}}"#, "é".repeat(300));
        let Connect::Refuse { reason, .. } = decode_connect(long.as_bytes()).unwrap() else {
            panic!()
        };
        assert!(reason.len() <= MAX_REASON_LEN);
    }

    #[test]
    fn bad_answers_are_errors() {
        for (body, want) in [
            (&b"not json"[..], "not a JSON object"),
            (b"[1]", "not a JSON object"),
            (b"{}", "missing"),
            (br#"{"allow":"yes"}"#, "wrong type"),
            (br#"{"allow":true,"sub":5}"#, "wrong type"),
            (br#"{"allow":true,"subscribe":"chat.*"}"#, "wrong type"),
            (br#"{"allow":true,"subscribe":[1]}"#, "wrong type"),
            (br#"{"allow":true,"subscribe":["a*b"]}"#, "subscribe"),
            (br#"{"allow":true,"topics":["bad topic"]}"#, "topics"),
            (br#"{"allow":true,"expires_at":-1}"#, "wrong type"),
            (br#"{"allow":false,"status":"x"}"#, "wrong type"),
        ] {
            let e = decode_connect(body).unwrap_err().to_string();
            assert!(e.contains(want), "{body:?}: {e}");
        }
        let big = format!(
            r#"{{"allow":true,"sub":"{}"}}"#,
            "a".repeat(MAX_SUB_LEN + 1)
        );
        assert_eq!(
            decode_connect(big.as_bytes()),
            Err(AnswerError::TooLong("sub"))
        );
        let many = format!(
            r#"{{"allow":true,"topics":[{}"a"]}}"#,
            "\"a\",".repeat(MAX_LIST)
        );
        assert_eq!(
            decode_connect(many.as_bytes()),
            Err(AnswerError::TooLong("topics"))
        );
    }

    #[test]
    fn check_answers() {
        assert_eq!(
            decode_check(br#"{"allow":true}"#, 10).unwrap(),
            Check::Allow { data: None }
        );
        assert_eq!(
            decode_check(br#"{"allow":true,"data":"hi"}"#, 10).unwrap(),
            Check::Allow {
                data: Some("hi".into())
            }
        );
        assert_eq!(
            decode_check(br#"{"allow":true,"data":"0123456789x"}"#, 10),
            Err(AnswerError::TooLong("data"))
        );
        assert_eq!(
            decode_check(br#"{"allow":false,"reason":"no"}"#, 10).unwrap(),
            Check::Refuse {
                reason: "no".into()
            }
        );
    }

    #[test]
    fn requests_encode() {
        let r = ConnectRequest {
            transport: "ws",
            remote_addr: "127.0.0.1",
            path: "/ws",
            query: vec![("topic".into(), "a".into())],
            topics: vec!["a"],
            cookies: vec![("session", "s1")],
            headers: vec![("user-agent".into(), "t")],
            token_sub: None,
        };
        let v: Value = serde_json::from_slice(&r.encode()).unwrap();
        assert_eq!(v["type"], "connect");
        assert_eq!(v["cookies"]["session"], "s1");
        assert_eq!(v["query"]["topic"], "a");
        assert_eq!(v["headers"]["user-agent"], "t");
        assert_eq!(v["token_sub"], Value::Null);
        let c = encode_check(
            "publish",
            Some("u"),
            Some(r#"{"a":1}"#),
            "t",
            Some(("d", None)),
        );
        let v: Value = serde_json::from_slice(&c).unwrap();
        assert_eq!(v["info"]["a"], 1);
        assert_eq!(v["data"], "d");
        assert_eq!(v["sub"], "u");
    }

    #[test]
    fn events_encode_into_batches() {
        let a = Event::Connected {
            conn: "n-1",
            sub: Some("alice"),
            transport: "ws",
        }
        .encode("n-7", 1700);
        let b = Event::Disconnected {
            conn: "n-1",
            sub: None,
            reason: "client_close",
            duration: 3,
        }
        .encode("n-8", 1703);
        let c = Event::TopicVacated { topic: "t" }.encode("n-9", 1703);
        let v: Value = serde_json::from_slice(&encode_batch([&*a, &*b, &*c])).unwrap();
        let e = v["events"].as_array().unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0]["type"], "connected");
        assert_eq!(e[0]["sub"], "alice");
        assert_eq!(e[1]["reason"], "client_close");
        assert_eq!(e[1]["duration"], 3);
        assert_eq!(e[1]["sub"], Value::Null);
        assert_eq!(e[2]["type"], "topic_vacated");
        assert_eq!(e[2]["id"], "n-9");
        assert_eq!(encode_batch([]), b"{\"events\":[]}");
    }

    #[test]
    fn signature_matches_an_independent_computation() {
        // python3 -c 'import hmac,hashlib;print(hmac.new(b"secret",b"1700000000.{}",hashlib.sha256).hexdigest())'
        let s = signature(b"secret", 1_700_000_000, b"{}");
        assert_eq!(
            s,
            "t=1700000000,v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
        );
        assert!(verify_signature(b"secret", &s, b"{}", 1_700_000_010, 300));
        assert!(!verify_signature(b"other", &s, b"{}", 1_700_000_010, 300));
        assert!(!verify_signature(b"secret", &s, b"{ }", 1_700_000_010, 300));
        assert!(!verify_signature(b"secret", &s, b"{}", 1_700_001_000, 300));
        assert!(!verify_signature(
            b"secret",
            "garbage",
            b"{}",
            1_700_000_000,
            300
        ));
    }
}
