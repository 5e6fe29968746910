//! Appendable messages through the API (`docs/protocol.md`, "Appendable messages"):
//! `POST /publish/{topic}?stream=open` opens a stream with the body as its first fragment,
//! `?append_to=ID` appends the body to it, `&done=1` closes it (with or without a last
//! fragment). Each answer is the fragment's receipt: its id, the stream's id and its `seq`.

use std::sync::atomic::Ordering::Relaxed;

use clarion_proto::pubsub::validate_topic;

use super::publish::{key_refusal, unavailable};
use crate::broker::{StreamOp, StreamReceipt, StreamRefusal};
use crate::reply::Answer;
use crate::worker::Shared;

/// What the query string asked of a stream.
#[derive(Debug, Default)]
pub(super) struct StreamQuery {
    /// `stream=open` (or `stream=1`).
    pub open: bool,
    /// `append_to=ID`.
    pub append_to: Option<String>,
    /// `done=1` (or `done=true`).
    pub done: bool,
}

impl StreamQuery {
    /// Takes `k=v` if it is one of the stream's parameters; `Err` words a bad value.
    pub fn take(&mut self, k: &str, v: &str) -> Result<bool, String> {
        let flag = |v: &str| match v {
            "1" | "true" | "open" => Ok(true),
            "0" | "false" => Ok(false),
            other => Err(format!("invalid {k}={other:?}: give 1 or 0")),
        };
        match k {
            "stream" => self.open = flag(v)?,
            "append_to" => self.append_to = Some(v.to_owned()),
            "done" => self.done = flag(v)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Whether the publish is a stream's.
    pub fn asked(&self) -> bool {
        self.open || self.append_to.is_some() || self.done
    }
}

/// Publishes one fragment of an appendable message and answers its receipt, or the refusal:
/// `400` (bad request), `404` (no such open stream), `409` (closed), `413` (past a stream's
/// limits), `429` (too many open on the topic), `503`.
pub(super) fn publish_fragment(
    topic: &str,
    q: &StreamQuery,
    content_type: Option<&str>,
    key: Option<&str>,
    body: &[u8],
    shared: &Shared,
) -> Answer {
    let refuse = |status: u16, why: &str| {
        shared.metrics.stream_refusals.fetch_add(1, Relaxed);
        Answer::error(status, why)
    };
    if let Err(e) = validate_topic(topic) {
        return refuse(400, &format!("invalid topic {topic:?}: {e}"));
    }
    if let Some(refused) = key_refusal(key, shared) {
        return refused;
    }
    let binary = content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/octet-stream"))
    });
    let Some(fragment) = std::str::from_utf8(body).ok().filter(|_| !binary) else {
        return refuse(400, "a stream's fragments are UTF-8 text");
    };
    let op = match (&q.append_to, q.open) {
        (Some(_), true) => return refuse(400, "give stream=open or append_to, not both"),
        (Some(id), false) => StreamOp::Append {
            stream: id,
            done: q.done,
        },
        (None, true) if !q.done => StreamOp::Open,
        (None, true | false) => {
            return refuse(400, "done=1 closes a stream: give it with append_to=ID")
        }
    };
    match shared.broker.stream(topic, op, fragment, key) {
        Ok(r) => Answer::json(200, &fragment_receipt(topic, &r)),
        Err(StreamRefusal::Unavailable(e)) => unavailable(&e),
        Err(refusal) => refusal_answer(topic, q.append_to.as_deref(), refusal, shared),
    }
}

/// The answer to a fragment the broker refused (counted in `clarion_stream_refusals_total`):
/// `404`, `409`, `413`, `429`, or `503` when the broker is unavailable. `append_to` is the
/// stream the fragment named, if any.
pub(super) fn refusal_answer(
    topic: &str,
    append_to: Option<&str>,
    refusal: StreamRefusal,
    shared: &Shared,
) -> Answer {
    let refuse = |status: u16, why: &str| {
        shared.metrics.stream_refusals.fetch_add(1, Relaxed);
        Answer::error(status, why)
    };
    match refusal {
        StreamRefusal::Unknown => refuse(
            404,
            &format!(
                "no open stream {:?} on topic {topic:?} (open one with stream=open)",
                append_to.unwrap_or_default()
            ),
        ),
        StreamRefusal::Closed => refuse(409, "the stream is closed (done, or timed out)"),
        StreamRefusal::TooLarge(why) => refuse(413, &why),
        StreamRefusal::TooManyOpen(n) => refuse(
            429,
            &format!("topic {topic:?} has {n} streams open (stream_max_open): close one first"),
        ),
        StreamRefusal::Unavailable(e) => unavailable(&e),
    }
}

/// A fragment's receipt: `{"topic", "id", "stream", "seq", "subscribers", "done"}`, and
/// `"repeat": true` when it repeated an `Idempotency-Key` (the first attempt's answer; nothing
/// was appended). A key first used by a plain publish is answered as that publish's receipt.
pub(super) fn fragment_receipt(topic: &str, r: &StreamReceipt) -> serde_json::Value {
    if r.repeat && r.stream.is_empty() {
        return serde_json::json!({
            "topic": topic, "id": r.id, "subscribers": r.subscribers, "repeat": true
        });
    }
    let mut j = serde_json::json!({
        "topic": topic, "id": r.id, "stream": r.stream, "seq": r.seq,
        "subscribers": r.subscribers, "done": r.done,
    });
    if r.repeat {
        if let Some(o) = j.as_object_mut() {
            o.insert("repeat".to_owned(), serde_json::Value::Bool(true));
        }
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(stream: &str, repeat: bool) -> StreamReceipt {
        StreamReceipt {
            id: "e-5".into(),
            stream: stream.into(),
            seq: 2,
            subscribers: 0,
            done: true,
            repeat,
        }
    }

    #[test]
    fn a_repeated_fragment_answers_its_first_receipt_marked_repeat() {
        let first = fragment_receipt("t", &receipt("e-3", false));
        assert_eq!(first.get("repeat"), None);
        let again = fragment_receipt("t", &receipt("e-3", true));
        assert_eq!(again["repeat"], true);
        assert_eq!(
            (&again["id"], &again["stream"]),
            (&first["id"], &first["stream"])
        );
        assert_eq!(
            (&again["seq"], &again["done"]),
            (&first["seq"], &first["done"])
        );
        // A key a plain publish used first: that publish's receipt.
        let plain = fragment_receipt("t", &receipt("", true));
        assert_eq!(plain.get("stream"), None);
        assert_eq!(plain["id"], "e-5");
    }
}
