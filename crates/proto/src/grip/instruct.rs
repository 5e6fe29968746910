//! `application/grip-instruct`: GRIP instructions as a JSON body instead of `Grip-*` headers,
//! which `gripcontrol`'s `create_hold_*` helpers produce.
//!
//! ```json
//! {"hold": {"mode": "stream", "channels": [{"name": "c", "prev-id": "7"}], "timeout": 55,
//!           "keep-alive": {"content": ":\n\n", "timeout": 20}},
//!  "response": {"code": 200, "headers": {"Content-Type": "text/plain"}, "body": "hi\n"}}
//! ```
//!
//! The result is the same [`Instruct`] the headers give, plus the response the client gets in
//! place of the instruct body (its head for a stream, its whole self when a long-poll times out).

use serde_json::{Map, Value};

use super::headers::{
    Channel, HoldMode, Instruct, KeepAlive, KeepAliveMode, DEFAULT_KEEP_ALIVE_SECS, MAX_CHANNELS,
};
use super::publish::{binary_or_text, headers, opt_str, HttpResponse};

/// The content type of an instruct body.
pub const INSTRUCT_CONTENT_TYPE: &str = "application/grip-instruct";

/// Why an instruct body was refused (the proxy answers 502).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid grip-instruct body: {0}")]
pub struct InstructBodyError(pub String);

fn bad(why: impl Into<String>) -> InstructBodyError {
    InstructBodyError(why.into())
}

/// Decodes an instruct body: the instructions, and the response to use (200 with an empty body
/// when it has none).
pub fn decode_instruct_body(body: &[u8]) -> Result<(Instruct, HttpResponse), InstructBodyError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let top = v.as_object().ok_or_else(|| bad("not a JSON object"))?;
    let mut out = Instruct::default();
    if let Some(hold) = top.get("hold").filter(|h| !h.is_null()) {
        let hold = hold
            .as_object()
            .ok_or_else(|| bad("hold is not an object"))?;
        out.hold = Some(match opt_str(hold, "mode").map_err(bad)? {
            None | Some("response") => HoldMode::Response,
            Some("stream") => HoldMode::Stream,
            Some(m) => return Err(bad(format!("unknown hold mode {m:?}"))),
        });
        let channels = hold
            .get("channels")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("hold.channels is not a list"))?;
        if channels.is_empty() || channels.len() > MAX_CHANNELS {
            return Err(bad(format!("hold needs 1 to {MAX_CHANNELS} channels")));
        }
        for c in channels {
            out.channels.push(channel(c)?);
        }
        out.timeout_secs = match hold.get("timeout") {
            None | Some(Value::Null) => None,
            Some(t) => Some(
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| bad("hold.timeout is not a whole number of seconds"))?,
            ),
        };
        if let Some(ka) = hold.get("keep-alive").filter(|k| !k.is_null()) {
            out.keep_alive = Some(keep_alive(ka)?);
        }
    }
    let response = match top.get("response").filter(|r| !r.is_null()) {
        None => HttpResponse {
            code: 200,
            reason: None,
            headers: Vec::new(),
            body: Vec::new(),
            filters: Vec::new(),
        },
        Some(r) => response(r)?,
    };
    Ok((out, response))
}

fn channel(c: &Value) -> Result<Channel, InstructBodyError> {
    let c = c
        .as_object()
        .ok_or_else(|| bad("a channel is not an object"))?;
    let name = opt_str(c, "name")
        .map_err(bad)?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("a channel has no name"))?;
    Ok(Channel {
        name: name.to_string(),
        prev_id: opt_str(c, "prev-id").map_err(bad)?.map(str::to_string),
        filters: Vec::new(),
    })
}

fn keep_alive(v: &Value) -> Result<KeepAlive, InstructBodyError> {
    let k = v
        .as_object()
        .ok_or_else(|| bad("keep-alive is not an object"))?;
    let data = binary_or_text(k, "content-bin", "content")
        .map_err(|e| bad(format!("keep-alive: {e}")))?
        .ok_or_else(|| bad("keep-alive has no content"))?;
    let timeout = match k.get("timeout") {
        None | Some(Value::Null) => DEFAULT_KEEP_ALIVE_SECS,
        Some(t) => t
            .as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .ok_or_else(|| bad("keep-alive timeout is not a positive number"))?,
    };
    Ok(KeepAlive {
        data,
        timeout_secs: timeout,
        mode: KeepAliveMode::Idle,
    })
}

fn response(v: &Value) -> Result<HttpResponse, InstructBodyError> {
    let r: &Map<String, Value> = v
        .as_object()
        .ok_or_else(|| bad("response is not an object"))?;
    let code = match r.get("code") {
        None | Some(Value::Null) => 200,
        Some(c) => c
            .as_u64()
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| (200..=999).contains(c))
            .ok_or_else(|| bad("response.code is not a status"))?,
    };
    let reason = opt_str(r, "reason").map_err(bad)?.filter(|s| !s.is_empty());
    if reason.is_some_and(|r| r.chars().any(char::is_control)) {
        return Err(bad("response.reason has control characters"));
    }
    Ok(HttpResponse {
        code,
        reason: reason.map(str::to_string),
        headers: headers(r.get("headers")).map_err(|e| bad(format!("response.headers: {e}")))?,
        body: binary_or_text(r, "body-bin", "body")
            .map_err(|e| bad(format!("response: {e}")))?
            .unwrap_or_default(),
        filters: Vec::new(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn gripcontrol_shapes() {
        let (i, r) = decode_instruct_body(
            br#"{"hold": {"mode": "response", "channels": [{"name": "c", "prev-id": "5"}], "timeout": 1},
                 "response": {"body": "instruct-timeout\n"}}"#,
        )
        .unwrap();
        assert_eq!(i.hold, Some(HoldMode::Response));
        assert_eq!(i.channels[0].name, "c");
        assert_eq!(i.channels[0].prev_id.as_deref(), Some("5"));
        assert_eq!(i.timeout_secs, Some(1));
        assert_eq!(
            (r.code, r.body.as_slice()),
            (200, &b"instruct-timeout\n"[..])
        );
        let (i, r) = decode_instruct_body(
            br#"{"hold": {"mode": "stream", "channels": [{"name": "s"}],
                 "keep-alive": {"content-bin": "Ojpcbg==", "timeout": 3}},
                 "response": {"code": 201, "reason": "Made", "headers": {"Content-Type": "text/plain"}}}"#,
        )
        .unwrap();
        assert_eq!(i.hold, Some(HoldMode::Stream));
        assert_eq!(i.keep_alive.unwrap().timeout_secs, 3);
        assert_eq!((r.code, r.reason.as_deref()), (201, Some("Made")));
        assert_eq!(
            r.headers,
            vec![("Content-Type".into(), "text/plain".into())]
        );
        let (i, r) = decode_instruct_body(br#"{"response": {"body": "plain"}}"#).unwrap();
        assert!(i.hold.is_none() && r.body == b"plain");
    }

    #[test]
    fn refusals() {
        for body in [
            &b"[]"[..],
            b"{",
            br#"{"hold": {"mode": "forever", "channels": [{"name": "c"}]}}"#,
            br#"{"hold": {"channels": []}}"#,
            br#"{"hold": {"channels": [{"prev-id": "1"}]}}"#,
            br#"{"hold": {"channels": [{"name": "c"}], "timeout": -1}}"#,
            br#"{"hold": {"channels": [{"name": "c"}], "keep-alive": {"timeout": 1}}}"#,
            br#"{"response": {"code": 99}}"#,
            br#"{"response": {"headers": {"Bad Name": "x"}}}"#,
            br#"{"response": {"headers": {"X": "a\r\nb"}}}"#,
        ] {
            assert!(
                decode_instruct_body(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
