//! Publishing through the API: one message (`POST /publish/{topic}`), a JSON batch
//! (`POST /publish`) and Pushpin's format (`POST /publish/`), each checked against what the
//! caller may publish to, and their answers.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::pubsub::{validate_event_name, validate_key, validate_topic};
use clarion_proto::ws::DataKind;

use super::access::Permit;
use crate::broker::{Outgoing, Receipt};
use crate::message::Attachment;
use crate::reply::Answer;
use crate::worker::Shared;

/// What a single publish's query string adds to the message besides its event name.
#[derive(Clone, Copy)]
pub(super) struct Labels<'a> {
    /// Filter tags (`tag.K=V`).
    pub tags: &'a [(String, String)],
    /// The conflation key (`conflation_key=K`, docs/conflation.md).
    pub conflation_key: Option<&'a str>,
}

/// The answer to a malformed `Idempotency-Key` (400, counted), for a message and a fragment
/// alike; `None` when there is no key or it is well formed.
pub(super) fn key_refusal(key: Option<&str>, shared: &Shared) -> Option<Answer> {
    let e = key.map(validate_key)?.err()?;
    shared.metrics.idempotency_key_errors.fetch_add(1, Relaxed);
    Some(Answer::error(400, &format!("invalid Idempotency-Key: {e}")))
}

pub(super) fn publish_one(
    topic: &str,
    event: Option<&str>,
    content_type: Option<&str>,
    key: Option<&str>,
    body: &[u8],
    labels: &Labels<'_>,
    shared: &Shared,
) -> Answer {
    let Labels {
        tags,
        conflation_key,
    } = *labels;
    if let Err(e) = validate_topic(topic) {
        return Answer::error(400, &format!("invalid topic {topic:?}: {e}"));
    }
    if let Some(refused) = key_refusal(key, shared) {
        return refused;
    }
    if let Some(Err(e)) = event.map(validate_event_name) {
        return Answer::error(400, &format!("invalid event name: {e}"));
    }
    if let Some(a) = reserved_event(topic, event, shared) {
        return a;
    }
    let named = tags.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    if let Err(e) = clarion_proto::filter::validate_tags(named) {
        shared.metrics.filters.refused("tags");
        return Answer::error(400, &format!("invalid tags: {e}"));
    }
    if let Some(Err(e)) = conflation_key.map(clarion_proto::conflate::validate_publish_key) {
        shared.metrics.conflation_key_refusals.fetch_add(1, Relaxed);
        return Answer::error(400, &format!("invalid conflation_key: {e}"));
    }
    let binary = content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/octet-stream"))
    });
    let kind = if binary {
        DataKind::Binary
    } else if std::str::from_utf8(body).is_ok() {
        DataKind::Text
    } else {
        return Answer::error(
            400,
            "text message is not valid UTF-8 (send binary as application/octet-stream)",
        );
    };
    let receipts = shared.broker.publish(&[Outgoing {
        topic,
        kind,
        payload: body,
        event,
        attachment: None,
        key,
        tags,
        conflation_key,
    }]);
    let receipts = match receipts {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    match receipts.first() {
        Some(r) => Answer::json(200, &receipt_json(topic, r)),
        None => Answer::error(500, "publish produced no receipt"),
    }
}

/// On a presence topic the SSE event names `presence`, `join` and `leave` are the server's
/// (an EventSource listening for `join` must not mistake a message for a member): `400`.
pub(super) fn reserved_event(topic: &str, event: Option<&str>, shared: &Shared) -> Option<Answer> {
    let event = event?;
    let reserved = matches!(event, "presence" | "join" | "leave")
        && shared.presence.as_ref().is_some_and(|p| p.tracks(topic));
    reserved.then(|| {
        Answer::error(
            400,
            &format!("the event name {event:?} is reserved for presence on this topic"),
        )
    })
}

/// Pushpin's publish API: `{"items": [...]}` with `http-stream`, `http-response` and
/// `ws-message` formats. Validated whole before anything is published; answered like Pushpin
/// (`200 Published`).
/// `Err` carries the reason a body that is not a valid Pushpin publish was refused (the caller
/// words the `400`); other refusals are answered here.
pub(super) fn publish_grip(
    body: &[u8],
    shared: &Shared,
    permit: &Permit,
) -> Result<Answer, String> {
    let limits = shared.config.grip_publish_limits();
    let items = clarion_proto::grip::decode_publish(body, &limits).map_err(|e| e.to_string())?;
    let mut contents = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if let Some(why) = crate::grip::unsupported(item) {
            return Ok(Answer::error(400, &format!("item {i}: {why}")));
        }
        if let Err(e) = validate_topic(&item.channel) {
            return Ok(Answer::error(
                400,
                &format!("item {i}: channel {:?}: {e}", item.channel),
            ));
        }
        if let Err(a) = permit.check(&item.channel, shared) {
            return Ok(a);
        }
        let (content, payload, kind) = crate::grip::GripContent::from_item(item);
        let content: Arc<dyn Attachment> = Arc::new(content);
        contents.push((content, payload, kind));
    }
    let outgoing: Vec<Outgoing<'_>> = items
        .iter()
        .zip(&contents)
        .map(|(item, (content, payload, kind))| Outgoing {
            tags: &[],
            topic: &item.channel,
            kind: *kind,
            payload: payload.as_slice(),
            event: None,
            attachment: Some(Arc::clone(content)),
            key: None,
            // Pushpin's items have no conflation key: a pointer rule still applies.
            conflation_key: None,
        })
        .collect();
    if let Err(e) = shared.broker.publish(&outgoing) {
        return Ok(unavailable(&e));
    }
    Ok(Answer::new(200, "text/plain", &b"Published\n"[..]))
}

/// `503` with `Retry-After` for a publish the broker could not take: the message went
/// nowhere, so the publisher may send it again (the project's clients do, for a bounded time).
/// During a hand-over the answer says an upgrade is in progress, and to come back in a second.
pub(super) fn unavailable(e: &crate::broker::Unavailable) -> Answer {
    if e.during_upgrade() {
        crate::log::info(format_args!("publish refused during the hand-over: {e}"));
        return Answer::error(503, &format!("message not published: {e}"))
            .with_header("Retry-After", "1");
    }
    crate::log::warn(format_args!("publish refused: {e}"));
    Answer::error(
        503,
        &format!("broker unavailable, message not published: {e}"),
    )
    .with_header("Retry-After", "5")
}

/// `{"topic", "id", "subscribers"}`, and `"repeat": true` for a publish that repeated an
/// `Idempotency-Key` (its `id` is the first publish's; nothing was delivered).
pub(super) fn receipt_json(topic: &str, r: &Receipt) -> serde_json::Value {
    if r.repeat {
        return serde_json::json!({
            "topic": topic, "id": r.id, "subscribers": r.subscribers, "repeat": true
        });
    }
    serde_json::json!({ "topic": topic, "id": r.id, "subscribers": r.subscribers })
}
