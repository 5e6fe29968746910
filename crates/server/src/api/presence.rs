//! `GET /topics/{topic}/presence[/count]`: a presence topic's members and counts
//! (docs/presence.md), for whoever may subscribe to the topic.

use clarion_proto::http1;

use super::access::may_subscribe;
use super::request::Request;
use crate::reply::Answer;
use crate::worker::Shared;

/// `GET /topics/{topic}/presence[?limit=N&after=SUB]` (a page of members with the counts) and
/// `GET /topics/{topic}/presence/count`. Allowed to whoever may subscribe to the topic: the
/// API key, an admin token, or a token (or public topic) that grants it; without
/// authentication, as the rest of the API (the API key when one is set).
pub(super) fn answer(req: &Request, shared: &Shared) -> Answer {
    let rest = req.path.strip_prefix("/topics/").unwrap_or_default();
    let (topic, count_only) = if let Some(t) = rest.strip_suffix("/presence/count") {
        (t, true)
    } else if let Some(t) = rest.strip_suffix("/presence") {
        (t, false)
    } else {
        return Answer::error(404, "not found");
    };
    if let Err(e) = clarion_proto::pubsub::validate_topic(topic) {
        return Answer::error(400, &format!("invalid topic {topic:?}: {e}"));
    }
    if let Err(a) = may_subscribe(req, topic, shared) {
        return a;
    }
    let Some(p) = shared.presence.as_ref() else {
        return Answer::error(404, "presence is not kept on this server (presence_topics)");
    };
    if !p.tracks(topic) {
        return Answer::error(
            404,
            &format!("presence is not kept for {topic:?} (presence_topics)"),
        );
    }
    if count_only {
        let (count, connections) = match p.count(&shared.broker, topic) {
            Ok(c) => c,
            Err(why) => return Answer::error(503, &why),
        };
        let body =
            format!("{{\"topic\":\"{topic}\",\"count\":{count},\"connections\":{connections}}}\n");
        return Answer::new(200, "application/json", body);
    }
    let mut limit = p.max_members;
    let mut after = None;
    for pair in http1::query_pairs(&req.query) {
        let Ok((k, v)) = pair else {
            return Answer::error(400, "invalid query string");
        };
        match &*k {
            "limit" => match v.parse::<usize>() {
                Ok(n) if n >= 1 => limit = n.min(p.max_members),
                _ => {
                    return Answer::error(
                        400,
                        &format!("invalid limit {v:?}: 1 to {}", p.max_members),
                    )
                }
            },
            "after" => after = Some(v.into_owned()),
            _ => {}
        }
    }
    let mut body = match p.list(&shared.broker, topic, after.as_deref(), limit) {
        Ok(listing) => listing.api_json(topic),
        Err(why) => return Answer::error(503, &why),
    };
    body.push('\n');
    Answer::new(200, "application/json", body)
}
