//! Messages the server sends a Pusher client, as the text of a WebSocket frame. Pusher encodes
//! the `data` of its own events and of published events as a JSON string holding JSON (the
//! client parses it a second time); a client event's `data` is relayed as the JSON value the
//! sender gave. `pusher:error` carries an object.

use serde_json::json;

use super::code::ErrorCode;

/// A JSON string literal of `s`.
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// `pusher:connection_established` with the socket id and the activity timeout (seconds of
/// silence after which the client pings).
pub fn connection_established(socket_id: &str, activity_timeout_secs: u32) -> String {
    let data = json!({"socket_id": socket_id, "activity_timeout": activity_timeout_secs});
    event(
        "pusher:connection_established",
        None,
        &Data::Text(&data.to_string()),
    )
}

/// `pusher:error` for one of the protocol's codes (sent before the close it names).
pub fn error(code: ErrorCode) -> String {
    error_with(Some(code.code()), code.message())
}

/// `pusher:error` with a code (or `null`) and a message: the answer to a refused request that
/// does not end the connection.
pub fn error_with(code: Option<u16>, message: &str) -> String {
    json!({"event": "pusher:error", "data": {"code": code, "message": message}}).to_string()
}

/// `pusher:subscription_error` on a channel whose subscription was refused (`status` as an HTTP
/// status: 401 for a bad signature, 403 for a refused member).
pub fn subscription_error(channel: &str, status: u16, message: &str) -> String {
    let data = json!({"type": "AuthError", "error": message, "status": status});
    event(
        "pusher:subscription_error",
        Some(channel),
        &Data::Text(&data.to_string()),
    )
}

/// `pusher:pong`.
pub fn pong() -> String {
    r#"{"event":"pusher:pong","data":"{}"}"#.to_owned()
}

/// `pusher:ping` (the server's, after the activity timeout).
pub fn ping() -> String {
    r#"{"event":"pusher:ping","data":"{}"}"#.to_owned()
}

/// The members of a presence channel, as `pusher_internal:subscription_succeeded` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Presence<'a> {
    /// `(user_id, user_info as JSON text)` per member, each once.
    pub members: Vec<(&'a str, Option<&'a str>)>,
}

/// `pusher_internal:subscription_succeeded`, with the member list on a presence channel
/// (`{"presence":{"ids":[...],"hash":{id: info},"count":n}}`).
pub fn subscription_succeeded(channel: &str, presence: Option<&Presence<'_>>) -> String {
    let data = match presence {
        None => "{}".to_owned(),
        Some(p) => {
            let ids: Vec<&str> = p.members.iter().map(|(id, _)| *id).collect();
            let mut hash = serde_json::Map::new();
            for (id, info) in &p.members {
                let info = info
                    .and_then(|i| serde_json::from_str(i).ok())
                    .unwrap_or(serde_json::Value::Null);
                hash.insert((*id).to_owned(), info);
            }
            json!({"presence": {"ids": ids, "hash": hash, "count": ids.len()}}).to_string()
        }
    };
    event(
        "pusher_internal:subscription_succeeded",
        Some(channel),
        &Data::Text(&data),
    )
}

/// `pusher_internal:member_added`.
pub fn member_added(channel: &str, user_id: &str, user_info: Option<&str>) -> String {
    let info = user_info
        .and_then(|i| serde_json::from_str(i).ok())
        .unwrap_or(serde_json::Value::Null);
    let data = json!({"user_id": user_id, "user_info": info}).to_string();
    event(
        "pusher_internal:member_added",
        Some(channel),
        &Data::Text(&data),
    )
}

/// `pusher_internal:member_removed`.
pub fn member_removed(channel: &str, user_id: &str) -> String {
    let data = json!({"user_id": user_id}).to_string();
    event(
        "pusher_internal:member_removed",
        Some(channel),
        &Data::Text(&data),
    )
}

/// `pusher:cache_miss` on a cache channel with no last event.
pub fn cache_miss(channel: &str) -> String {
    event("pusher:cache_miss", Some(channel), &Data::Text("{}"))
}

/// `pusher:signin_success`, echoing the `user_data` the client signed in with.
pub fn signin_success(user_data: &str) -> String {
    let data = json!({"user_data": user_data}).to_string();
    event("pusher:signin_success", None, &Data::Text(&data))
}

/// An event's `data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data<'a> {
    /// A string (what the HTTP API publishes): written as a JSON string.
    Text(&'a str),
    /// JSON text that was checked as JSON (a client event's data): written as it is.
    Json(&'a str),
}

/// An event on a channel: published through the API (`Data::Text`) or relayed from a client
/// (`Data::Json`, with the sender's `user_id` on a presence channel).
pub fn channel_event(channel: &str, name: &str, data: &Data<'_>, user_id: Option<&str>) -> String {
    let mut out = event(name, Some(channel), data);
    if let Some(u) = user_id {
        out.pop();
        out.push_str(",\"user_id\":");
        out.push_str(&quoted(u));
        out.push('}');
    }
    out
}

/// `json`, an object as the functions here write it, with one more string member `key`: how
/// Clarion's extensions ride on Pusher's messages (`clarion_id`); clients that do not know a
/// member ignore it.
pub fn with_member(json: &str, key: &str, value: &str) -> String {
    let body = json.strip_suffix('}').unwrap_or(json);
    let mut out = String::with_capacity(json.len() + key.len() + value.len() + 8);
    out.push_str(body);
    out.push(',');
    out.push_str(&quoted(key));
    out.push(':');
    out.push_str(&quoted(value));
    out.push('}');
    out
}

fn event(name: &str, channel: Option<&str>, data: &Data<'_>) -> String {
    let mut out = String::with_capacity(64 + name.len());
    out.push_str("{\"event\":");
    out.push_str(&quoted(name));
    if let Some(c) = channel {
        out.push_str(",\"channel\":");
        out.push_str(&quoted(c));
    }
    out.push_str(",\"data\":");
    match data {
        Data::Text(t) => out.push_str(&quoted(t)),
        Data::Json(j) => out.push_str(j),
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn a_member_added_to_an_event_keeps_it_valid_json() {
        let e = channel_event("c", "e", &Data::Text("d\"x"), Some("u"));
        let v: Value =
            serde_json::from_str(&with_member(&e, "clarion_id", "ab-1\"")).expect("JSON");
        assert_eq!(v["clarion_id"], "ab-1\"");
        assert_eq!(v["event"], "e");
        assert_eq!(v["data"], "d\"x");
        assert_eq!(v["user_id"], "u");
    }

    /// The frame parsed, and its `data` parsed a second time when it is a string.
    fn parse(frame: &str) -> (Value, Value) {
        let v: Value = serde_json::from_str(frame).expect("JSON");
        let data = match &v["data"] {
            Value::String(s) => serde_json::from_str(s).expect("inner JSON"),
            other => other.clone(),
        };
        (v, data)
    }

    #[test]
    fn connection_established_double_encodes_its_data() {
        let f = connection_established("1234.1234", 120);
        assert_eq!(
            f,
            r#"{"event":"pusher:connection_established","data":"{\"activity_timeout\":120,\"socket_id\":\"1234.1234\"}"}"#
        );
    }

    #[test]
    fn errors_carry_code_and_message() {
        let (v, data) = parse(&error(ErrorCode::AppUnknown));
        assert_eq!(v["event"], "pusher:error");
        assert_eq!(
            data,
            json!({"code": 4001, "message": "Application does not exist"})
        );
        let (_, data) = parse(&error_with(None, "bad"));
        assert_eq!(data, json!({"code": null, "message": "bad"}));
        let (v, data) = parse(&subscription_error("private-a", 401, "Invalid signature"));
        assert_eq!(v["channel"], "private-a");
        assert_eq!(data["status"], 401);
    }

    #[test]
    fn presence_subscription_lists_ids_hash_and_count() {
        let p = Presence {
            members: vec![("1", Some(r#"{"name":"a"}"#)), ("2", None)],
        };
        let (v, data) = parse(&subscription_succeeded("presence-r", Some(&p)));
        assert_eq!(v["event"], "pusher_internal:subscription_succeeded");
        assert_eq!(v["channel"], "presence-r");
        assert_eq!(
            data,
            json!({"presence": {"ids": ["1", "2"], "hash": {"1": {"name": "a"}, "2": null}, "count": 2}})
        );
        let (_, data) = parse(&subscription_succeeded("a", None));
        assert_eq!(data, json!({}));
    }

    #[test]
    fn member_cache_signin_and_channel_events_have_their_shapes() {
        let (v, data) = parse(&member_added("presence-r", "7", Some(r#"{"n":1}"#)));
        assert_eq!(v["event"], "pusher_internal:member_added");
        assert_eq!(data, json!({"user_id": "7", "user_info": {"n": 1}}));
        let (_, data) = parse(&member_removed("presence-r", "7"));
        assert_eq!(data, json!({"user_id": "7"}));
        let (v, _) = parse(&cache_miss("cache-a"));
        assert_eq!(
            (v["event"].as_str(), v["channel"].as_str()),
            (Some("pusher:cache_miss"), Some("cache-a"))
        );
        let (_, data) = parse(&signin_success(r#"{"id":"1"}"#));
        assert_eq!(data, json!({"user_data": r#"{"id":"1"}"#}));
        let published = channel_event("a", "my-event", &Data::Text(r#"{"x":1}"#), None);
        assert_eq!(
            published,
            r#"{"event":"my-event","channel":"a","data":"{\"x\":1}"}"#
        );
        let relayed = channel_event(
            "presence-a",
            "client-t",
            &Data::Json(r#"{"x":1}"#),
            Some("u\"1"),
        );
        let v: Value = serde_json::from_str(&relayed).expect("JSON");
        assert_eq!(
            v,
            json!({"event": "client-t", "channel": "presence-a", "data": {"x": 1}, "user_id": "u\"1"})
        );
    }
}
