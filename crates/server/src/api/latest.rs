//! `GET /topics/{topic}/latest`: a topic's last message with its id, for whoever may subscribe
//! to the topic (docs/history.md, "The latest value"). The body is the message as a clarion.v1
//! subscriber receives it, so an app can load it and then subscribe with `since=` its id.
//!
//! It reads through the broker's `read_since` with [`Since::Latest`]: from this process's
//! history in memory (or NATS mode's node history), from the topic's stream in Redis on a
//! cluster, exactly.

use super::access::may_subscribe;
use super::request::Request;
use crate::broker::Since;
use crate::reply::Answer;
use crate::worker::Shared;

/// The suffix after the topic name.
pub(super) const SUFFIX: &str = "/latest";

/// Whether `path` asks for a topic's latest message.
pub(super) fn owns(path: &str) -> bool {
    path.starts_with("/topics/") && path.ends_with(SUFFIX)
}

/// `200` with `{"type":"message","topic","id"[,"event"][,"encoding"],"data"}`; `404` when the
/// topic has no message in history (never published, or trimmed); `400` for a bad name;
/// `401`/`403` as a subscription would be refused.
pub(super) fn answer(req: &Request, shared: &Shared) -> Answer {
    let topic = req
        .path
        .strip_prefix("/topics/")
        .and_then(|rest| rest.strip_suffix(SUFFIX))
        .unwrap_or_default();
    if let Err(e) = clarion_proto::pubsub::validate_topic(topic) {
        return Answer::error(400, &format!("invalid topic {topic:?}: {e}"));
    }
    if let Err(a) = may_subscribe(req, topic, shared) {
        return a;
    }
    let read = shared.broker.read_since(&[topic], Since::Latest);
    match read.replay.last() {
        Some(m) => {
            let mut body = m.json().to_vec();
            body.push(b'\n');
            Answer::new(200, "application/json", body)
        }
        None => Answer::error(
            404,
            &format!("no message on {topic:?} in history (none published, or trimmed)"),
        ),
    }
}
