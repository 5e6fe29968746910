//! Pusher's HTTP API on the API listener (docs/pusher.md): `POST /apps/{id}/events` and
//! `/batch_events` publish, `GET /apps/{id}/channels`, `/channels/{name}` and
//! `/channels/{name}/users` describe channels, `POST /apps/{id}/users/{user}/terminate_connections`
//! is accepted. Every request carries Pusher's signature ([`SignedQuery`]), checked against the
//! application's secret before anything is done; answers and errors are shaped as Pusher's
//! (JSON on success, a plain-text reason with Pusher's status otherwise).
//!
//! A Pusher channel is the Clarion topic of the same name: a trigger publishes the event's
//! `data` string, unchanged, as a text message on that topic, with the event name as the SSE
//! event name when it fits Clarion's event-name rule. So Clarion's own subscribers
//! (`/ws?topic=`, `/sse?topic=`, long-poll) receive what a Pusher library triggers.

use clarion_proto::pubsub::{validate_event_name, validate_topic};
use clarion_proto::pusher::channel::{classify, Access};
use clarion_proto::pusher::signed_request::SignedQuery;
use clarion_proto::pusher::trigger::{decode_batch, decode_event, Trigger};
use clarion_proto::ws::DataKind;
use serde_json::{json, Map, Value};

use super::request::Request;
use crate::broker::{Outgoing, Receipt};
use crate::config::pusher_apps::AppConfig;
use crate::message::Attachment;
use crate::pusher::PusherEvent;
use crate::reply::Answer;
use crate::worker::Shared;
use std::sync::Arc;

/// Most channels `GET /apps/{id}/channels` lists: the walk holds the broker's topic table, and
/// an answer of this many names is a few hundred kilobytes.
pub const MAX_LISTED_CHANNELS: usize = 10_000;

/// Whether `path` is the Pusher API's: `/apps/...`, and `/users/{user}/terminate_connections`
/// without the `/apps/{id}` prefix, as PyPI `pusher` (3.3) sends it (the application is then
/// the one whose key signed the request).
pub(super) fn owns(path: &str) -> bool {
    path.starts_with("/apps/") || unprefixed_terminate(path).is_some()
}

/// The user of `/users/{user}/terminate_connections`.
fn unprefixed_terminate(path: &str) -> Option<&str> {
    let user = path
        .strip_prefix("/users/")?
        .strip_suffix("/terminate_connections")?;
    (!user.contains('/')).then_some(user)
}

/// The methods a Pusher path takes, or `None` for a path that is not one of its endpoints.
pub(super) fn methods(path: &str) -> Option<&'static [&'static str]> {
    if unprefixed_terminate(path).is_some() {
        return Some(&["POST"]);
    }
    let rest = path.strip_prefix("/apps/")?;
    let (_, route) = rest.split_once('/')?;
    match route.split('/').collect::<Vec<_>>().as_slice() {
        ["events"] | ["batch_events"] => Some(&["POST"]),
        ["channels"] | ["channels", _] | ["channels", _, "users"] => Some(&["GET"]),
        ["users", _, "terminate_connections"] => Some(&["POST"]),
        _ => None,
    }
}

/// A plain-text error, as Pusher answers, counted by `outcome`.
fn refuse(shared: &Shared, status: u16, outcome: &str, why: &str) -> Answer {
    shared.metrics.pusher.api(outcome);
    Answer::new(status, "text/plain; charset=utf-8", format!("{why}\n"))
}

/// Answers a request to `/apps/...` with its body.
pub(super) fn answer(req: &Request, body: &[u8], shared: &Shared) -> Answer {
    let query = match SignedQuery::parse(&req.query) {
        Ok(q) => q,
        Err(e) => return refuse(shared, e.status(), e.label(), &e.to_string()),
    };
    let (app, route) = if let Some(user) = unprefixed_terminate(&req.path) {
        let key = query.auth_key().unwrap_or_default();
        match shared.config.pusher_app_by_key(key) {
            Some(app) => (app, format!("users/{user}/terminate_connections")),
            None => return refuse(shared, 401, "key", "unknown auth_key"),
        }
    } else {
        let rest = req.path.strip_prefix("/apps/").unwrap_or_default();
        let (app_id, route) = rest.split_once('/').unwrap_or((rest, ""));
        match shared.config.pusher_app(app_id) {
            Some(app) => (app, route.to_owned()),
            None => {
                return refuse(
                    shared,
                    404,
                    "unknown_app",
                    &format!("Unknown app {app_id:?}"),
                )
            }
        }
    };
    let app_id = app.id.as_str();
    let now = crate::auth::unix_now();
    if let Err(e) = query.verify(
        &req.method,
        &req.path,
        body,
        &app.key,
        app.secret.as_bytes(),
        now,
    ) {
        crate::log::debug(format_args!("pusher api: app {app_id}: {}", e.label()));
        return refuse(shared, e.status(), e.label(), &e.to_string());
    }
    let parts: Vec<&str> = route.split('/').collect();
    let answer = match parts.as_slice() {
        ["events"] => match decode_event(body, &app.limits()) {
            Ok(t) => publish(shared, &[t]).map(|receipts| info_answer(shared, &receipts, None)),
            Err(e) => Err(refuse(shared, e.status(), "body", &e.to_string())),
        },
        ["batch_events"] => match decode_batch(body, &app.limits()) {
            Ok(batch) => publish(shared, &batch)
                .map(|receipts| info_answer(shared, &receipts, Some(batch.len()))),
            Err(e) => Err(refuse(shared, e.status(), "body", &e.to_string())),
        },
        ["channels"] => channels(&query, shared),
        ["channels", name] => channel(name, &query, shared),
        ["channels", name, "users"] => users(name, shared),
        ["users", user, "terminate_connections"] => terminate(&app, user, shared),
        _ => Err(refuse(shared, 404, "not_found", "Not found")),
    };
    match answer {
        Ok(a) => {
            shared.metrics.pusher.api("ok");
            a
        }
        Err(a) => a,
    }
}

/// What one published (event, channel) asked for in its answer.
struct Published {
    channel: String,
    info: Option<String>,
    /// Which event of a batch (for the batch answer's order).
    index: usize,
    receipt: Receipt,
}

/// Publishes every (event, channel) pair of `events`: all are checked first (all or nothing).
fn publish(shared: &Shared, events: &[Trigger]) -> Result<Vec<Published>, Answer> {
    let mut out: Vec<Outgoing<'_>> = Vec::new();
    let mut meta: Vec<(String, Option<String>, usize)> = Vec::new();
    for (index, t) in events.iter().enumerate() {
        // A Pusher name that is not a Clarion event name (`App\Events\Shipped`) is published
        // without one: the data still reaches the topic's subscribers.
        let event = validate_event_name(&t.name).ok().map(|()| t.name.as_str());
        for c in &t.channels {
            if let Err(e) = validate_topic(c) {
                return Err(refuse(
                    shared,
                    400,
                    "channel",
                    &format!(
                        "channel {c:?} cannot be a Clarion topic ({e}); see docs/pusher.md, \
                         \"Channels and topics\""
                    ),
                ));
            }
            out.push(Outgoing {
                tags: &[],
                conflation_key: None,
                topic: c,
                kind: DataKind::Text,
                payload: t.data.as_bytes(),
                event,
                attachment: attachment(t, event),
                key: None,
            });
            meta.push((c.clone(), t.info.clone(), index));
        }
    }
    let receipts = shared.broker.publish(&out).map_err(|e| {
        shared.metrics.pusher.api("unavailable");
        super::publish::unavailable(&e)
    })?;
    Ok(meta
        .into_iter()
        .zip(receipts)
        .map(|((channel, info, index), receipt)| Published {
            channel,
            info,
            index,
            receipt,
        })
        .collect())
}

/// What Pusher connections need of a trigger besides its data: the event name when it is not
/// a Clarion event name (else the message's own), and the `socket_id` to leave out. `None`
/// when neither applies, so the usual trigger costs nothing more.
fn attachment(t: &Trigger, event: Option<&str>) -> Option<Arc<dyn Attachment>> {
    let exclude = t
        .socket_id
        .as_deref()
        .and_then(|s| clarion_proto::pusher::socket_id::parse(s).ok());
    if event.is_some() && exclude.is_none() {
        return None;
    }
    Some(Arc::new(PusherEvent {
        name: t.name.as_str().into(),
        exclude,
        user_id: None,
    }))
}

/// The attributes of one channel that `info` asked for (`subscription_count`, `user_count`).
fn attributes(shared: &Shared, channel: &str, info: &str, subscribers: u64) -> Map<String, Value> {
    let mut m = Map::new();
    for attr in info.split(',').map(str::trim) {
        match attr {
            "subscription_count" => {
                m.insert(attr.into(), json!(subscribers));
            }
            "user_count" => {
                if let Some(n) = user_count(shared, channel) {
                    m.insert(attr.into(), json!(n));
                }
            }
            _ => {}
        }
    }
    m
}

/// The trigger's answer: `{}`, or the attributes `info` asked for per channel (per event in a
/// batch).
fn info_answer(shared: &Shared, published: &[Published], batch: Option<usize>) -> Answer {
    let asked = published.iter().any(|p| p.info.is_some());
    let body = match batch {
        None if !asked => json!({}),
        None => {
            let mut channels = Map::new();
            for p in published {
                let info = p.info.as_deref().unwrap_or_default();
                let attrs = attributes(shared, &p.channel, info, p.receipt.subscribers);
                channels.insert(p.channel.clone(), Value::Object(attrs));
            }
            json!({ "channels": channels })
        }
        Some(_) if !asked => json!({}),
        Some(n) => {
            let mut items = vec![Value::Object(Map::new()); n];
            for p in published {
                if let (Some(info), Some(slot)) = (p.info.as_deref(), items.get_mut(p.index)) {
                    *slot =
                        Value::Object(attributes(shared, &p.channel, info, p.receipt.subscribers));
                }
            }
            json!({ "batch": items })
        }
    };
    Answer::json(200, &body)
}

/// Members of a presence channel that Clarion's presence tracks (`presence_topics`); `None`
/// when it is not tracked or presence is unavailable.
fn user_count(shared: &Shared, channel: &str) -> Option<u64> {
    let p = shared.presence.as_ref().filter(|p| p.tracks(channel))?;
    p.count(&shared.broker, channel)
        .ok()
        .map(|(members, _)| members)
}

/// `GET /apps/{id}/channels[?filter_by_prefix=P&info=user_count]`: the occupied channels.
fn channels(query: &SignedQuery, shared: &Shared) -> Result<Answer, Answer> {
    let prefix = query.get("filter_by_prefix").unwrap_or_default();
    let info = query.get("info").unwrap_or_default();
    let wants_users = info.split(',').any(|a| a.trim() == "user_count");
    if wants_users && !prefix.starts_with("presence-") {
        return Err(refuse(
            shared,
            400,
            "query",
            "user_count may only be requested with filter_by_prefix=presence-",
        ));
    }
    let mut names: Vec<String> = Vec::new();
    let mut more = false;
    shared.broker.visit_topics(|name, subscribers, _| {
        if subscribers == 0 || !name.starts_with(prefix) || classify(name).is_err() {
            return;
        }
        if names.len() == MAX_LISTED_CHANNELS {
            more = true;
            return;
        }
        names.push(name.to_string());
    });
    if more {
        crate::log::info(format_args!(
            "pusher api: channel list cut at {MAX_LISTED_CHANNELS} (filter_by_prefix narrows it)"
        ));
    }
    names.sort();
    let mut channels = Map::new();
    for n in names {
        let mut attrs = Map::new();
        if wants_users {
            attrs.insert(
                "user_count".into(),
                json!(user_count(shared, &n).unwrap_or(0)),
            );
        }
        channels.insert(n, Value::Object(attrs));
    }
    Ok(Answer::json(200, &json!({ "channels": channels })))
}

/// `GET /apps/{id}/channels/{name}[?info=user_count,subscription_count]`.
fn channel(name: &str, query: &SignedQuery, shared: &Shared) -> Result<Answer, Answer> {
    let kind = classify(name).map_err(|e| {
        refuse(
            shared,
            400,
            "channel",
            &format!("Invalid channel name {name:?}: {e}"),
        )
    })?;
    let info = query.get("info").unwrap_or_default();
    let presence = matches!(kind.access, Access::Presence);
    if info.split(',').any(|a| a.trim() == "user_count") && !presence {
        return Err(refuse(
            shared,
            400,
            "query",
            "user_count may only be requested for presence channels",
        ));
    }
    let subscribers = shared
        .broker
        .topic_status(name)
        .map_or(0, |s| s.subscribers);
    let mut body = Map::new();
    body.insert("occupied".into(), json!(subscribers > 0));
    for attr in info.split(',').map(str::trim) {
        match attr {
            "subscription_count" => {
                body.insert(attr.into(), json!(subscribers));
            }
            "user_count" => {
                body.insert(attr.into(), json!(user_count(shared, name).unwrap_or(0)));
            }
            _ => {}
        }
    }
    Ok(Answer::json(200, &Value::Object(body)))
}

/// `GET /apps/{id}/channels/{name}/users`: the members of a presence channel.
fn users(name: &str, shared: &Shared) -> Result<Answer, Answer> {
    let kind = classify(name).map_err(|e| {
        refuse(
            shared,
            400,
            "channel",
            &format!("Invalid channel name {name:?}: {e}"),
        )
    })?;
    if !matches!(kind.access, Access::Presence) {
        return Err(refuse(
            shared,
            400,
            "channel",
            "users may only be requested for presence channels",
        ));
    }
    let mut users: Vec<Value> = Vec::new();
    if let Some(p) = shared.presence.as_ref().filter(|p| p.tracks(name)) {
        let listing = p
            .list(&shared.broker, name, None, p.max_members)
            .map_err(|why| refuse(shared, 503, "unavailable", &why))?;
        users = listing
            .members
            .iter()
            .map(|(id, _, _)| json!({ "id": &**id }))
            .collect();
    }
    Ok(Answer::json(200, &json!({ "users": users })))
}

/// `POST /apps/{id}/users/{user}/terminate_connections`: the Pusher WebSocket connections
/// signed in as the user are closed, on every node (they follow the user's topic).
fn terminate(app: &AppConfig, user: &str, shared: &Shared) -> Result<Answer, Answer> {
    if user.is_empty() || user.len() > app.limits().max_user_id {
        return Err(refuse(shared, 400, "query", "Invalid user id"));
    }
    // The user's signed-in connections subscribe to its topic; on every node of a cluster.
    let topic = crate::pusher::user_topic(&app.id, &app.secret, user);
    let out = Outgoing {
        topic: &topic,
        kind: DataKind::Text,
        payload: b"{}",
        event: Some(crate::pusher::TERMINATE_EVENT),
        attachment: None,
        key: None,
        tags: &[],
        conflation_key: None,
    };
    shared.broker.publish(&[out]).map_err(|e| {
        shared.metrics.pusher.api("unavailable");
        super::publish::unavailable(&e)
    })?;
    Ok(Answer::json(200, &json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pusher_endpoints_have_methods() {
        assert_eq!(methods("/apps/1/events"), Some(&["POST"][..]));
        assert_eq!(methods("/apps/1/batch_events"), Some(&["POST"][..]));
        assert_eq!(methods("/apps/1/channels"), Some(&["GET"][..]));
        assert_eq!(methods("/apps/1/channels/presence-a"), Some(&["GET"][..]));
        assert_eq!(
            methods("/apps/1/channels/presence-a/users"),
            Some(&["GET"][..])
        );
        assert_eq!(
            methods("/apps/1/users/u1/terminate_connections"),
            Some(&["POST"][..])
        );
        assert_eq!(methods("/apps/1"), None);
        assert_eq!(methods("/apps/1/other"), None);
        assert_eq!(methods("/apps/1/channels/a/b"), None);
        assert!(owns("/apps/1/events") && !owns("/publish/apps"));
        assert_eq!(
            methods("/users/u1/terminate_connections"),
            Some(&["POST"][..])
        );
        assert!(!owns("/users/u1/other") && !owns("/users/a/b/terminate_connections"));
    }
}
