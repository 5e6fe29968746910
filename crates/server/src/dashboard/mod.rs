//! The live dashboard on the API listener: one page, the feed that keeps it current, and the
//! small lookups its actions need.
//!
//! - `GET /dashboard`: the page ([`page`]), one self-contained HTML file compiled into the
//!   binary (no CDN, no build step).
//! - `GET /dashboard/feed`: Server-Sent Events, one `stats` event a second (the page plots and
//!   tables), after one `window` event with the last minutes of samples so plots start full.
//! - `GET /dashboard/topics?q=TEXT&limit=N`: topics whose name contains `q`, busiest first.
//! - `GET /dashboard/sample[?topics=1]`: the latest sample as JSON; the group's dashboard reads
//!   each member's on its private address ([`group`]).
//! - `GET /topics/{topic}?limit=N`: one topic's subscribers, rate and recent history.
//! - Publishing from the page uses the API's own `POST /publish/{topic}`.
//!
//! Every route is behind [`dashboard_allowed`]. What this module owns: the sampler thread
//! ([`sample`]), the busiest-topics computation ([`topics`]), the feed loop ([`feed`]). What it
//! must not touch: the data path. It reads counters and walks the topic table once a second;
//! nothing here runs per message or per delivery.
//!
//! The API listener serves each connection on its own blocking thread, so a feed holds one for
//! as long as a tab is open: feeds are capped by `dashboard_max_feeds`, and a feed notices a
//! closed tab within a second (it waits for the next tick by reading the socket, and a read of
//! 0 bytes is the tab going away).

pub mod feed;
pub mod group;
pub mod page;
pub mod sample;
pub mod topics;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use clarion_proto::http1;
use clarion_proto::pubsub::validate_topic;

use crate::broker::Since;
use crate::reply::Answer;
use crate::worker::Shared;

/// A request for one of the dashboard's routes, as the API listener parsed it.
pub struct Request<'a> {
    /// The method (only `GET` is served).
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query string, without `?`.
    pub query: &'a str,
    /// The `Authorization` header, if any.
    pub authorization: Option<&'a str>,
    /// Whether the credentials pass the API's own check (`api_key`: `Bearer`, a signed JWT, or
    /// `Basic` with the key as password), or no key is configured.
    pub api_key_ok: bool,
    /// Whether the request declared a body (no dashboard route takes one).
    pub has_body: bool,
    /// Whether the client keeps the connection open after the answer.
    pub keep_alive: bool,
}

/// Whether `request` may see the dashboard: its credentials were checked by the API listener
/// (`api::admin_ok`: the API key when one is configured, or, with authentication configured, a
/// token with the `admin` claim; a browser sends either as `Basic` credentials after the prompt
/// our `401` asks for, on every request of the page, the feed included).
pub fn dashboard_allowed(request: &Request<'_>) -> bool {
    request.api_key_ok
}

/// A stream the feed can wait on: the TCP socket under it, to set read timeouts.
pub trait FeedStream: Read + Write {
    /// The socket under this stream.
    fn socket(&self) -> &TcpStream;
}

impl FeedStream for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }
}

impl FeedStream for rustls::StreamOwned<rustls::ServerConnection, TcpStream> {
    fn socket(&self) -> &TcpStream {
        self.get_ref()
    }
}

/// The dashboard's state, one per API listener.
pub struct Dashboard {
    /// The once-a-second samples, shared by every open feed.
    samples: Arc<sample::Sampler>,
    /// Feeds open now (compared with `dashboard_max_feeds`).
    feeds: AtomicUsize,
}

impl Dashboard {
    /// The dashboard for `shared`'s server, with its sampler thread started; `None` when the
    /// `dashboard` setting is off.
    /// With `group` (the shared API port of a `--processes` member), it shows the whole group.
    pub fn start(
        shared: &Arc<Shared>,
        group: Option<Arc<crate::group::Member>>,
    ) -> Option<Arc<Dashboard>> {
        if !shared.config.dashboard {
            return None;
        }
        let samples = sample::Sampler::start(Arc::clone(shared), group)?;
        Some(Arc::new(Dashboard {
            samples,
            feeds: AtomicUsize::new(0),
        }))
    }

    /// Whether `path` is one of the dashboard's routes.
    pub fn owns(path: &str) -> bool {
        // A topic's presence and latest message are the API's (for subscribers' rights).
        let api = path.ends_with("/presence")
            || path.ends_with("/presence/count")
            || path.ends_with("/latest");
        path == "/dashboard"
            || path.starts_with("/dashboard/")
            || (path.starts_with("/topics/") && !api)
    }

    /// Answers one request on a dashboard route. `Ok(false)` when the connection must close
    /// after it (an error that leaves unread bytes, a finished feed).
    pub fn serve<S: FeedStream>(
        &self,
        stream: &mut S,
        req: &Request<'_>,
        shared: &Shared,
    ) -> io::Result<bool> {
        let keep = req.keep_alive && !req.has_body;
        if !dashboard_allowed(req) {
            return error(
                401,
                "missing or wrong credentials (the API key or an admin token)",
            )
            .with_header("WWW-Authenticate", "Basic realm=\"Clarion dashboard\"")
            .send(stream, keep)
            .map(|()| keep);
        }
        if req.method != "GET" {
            return error(405, "use GET").send(stream, keep).map(|()| keep);
        }
        if req.has_body {
            return error(400, "dashboard routes take no body")
                .send(stream, false)
                .map(|()| false);
        }
        let answer = match req.path {
            "/dashboard" | "/dashboard/" => page::answer(),
            "/dashboard/feed" => return self.feed(stream, shared),
            group::SAMPLE_PATH => {
                let topics = http1::query_pairs(req.query)
                    .flatten()
                    .any(|(k, v)| k == "topics" && v == "1");
                match self.samples.first(sample::PERIOD, topics) {
                    Some((_, json)) => Answer::new(200, "application/json", format!("{json}\n"))
                        .with_header("Cache-Control", "no-store"),
                    None => error(503, "no sample yet"),
                }
            }
            "/dashboard/topics" => {
                let q = Query::parse(req.query);
                match q {
                    Ok(q) => json(
                        200,
                        &topics::search(&shared.broker, &q.text, q.limit(topics::SEARCH_LIMIT)),
                    ),
                    Err(a) => a,
                }
            }
            path => match path.strip_prefix("/topics/") {
                Some(topic) => match Query::parse(req.query) {
                    Ok(q) => topic_answer(topic, q.limit(HISTORY_SHOWN), shared),
                    Err(a) => a,
                },
                None => error(404, "not found"),
            },
        };
        answer.send(stream, req.keep_alive).map(|()| req.keep_alive)
    }

    /// Serves one feed until the client goes away or the server stops.
    fn feed<S: FeedStream>(&self, stream: &mut S, shared: &Shared) -> io::Result<bool> {
        let max = shared.config.dashboard_max_feeds;
        if self.feeds.fetch_add(1, Relaxed) >= max {
            self.feeds.fetch_sub(1, Relaxed);
            return error(503, "too many dashboard feeds open (dashboard_max_feeds)")
                .with_header("Retry-After", "5")
                .send(stream, false)
                .map(|()| false);
        }
        shared.metrics.dashboard_feeds.fetch_add(1, Relaxed);
        let res = feed::run(stream, &self.samples, shared);
        shared.metrics.dashboard_feeds.fetch_sub(1, Relaxed);
        self.feeds.fetch_sub(1, Relaxed);
        res.map(|()| false)
    }
}

/// History messages `GET /topics/{topic}` shows by default (`limit` up to [`HISTORY_MAX`]).
const HISTORY_SHOWN: usize = 20;
/// Most history messages one lookup returns: a page of them, not a dump of the history.
const HISTORY_MAX: usize = 200;

/// `q` and `limit` from a query string.
struct Query {
    text: String,
    limit: Option<usize>,
}

impl Query {
    fn parse(query: &str) -> Result<Query, Answer> {
        let mut out = Query {
            text: String::new(),
            limit: None,
        };
        for pair in http1::query_pairs(query) {
            match pair {
                Ok((k, v)) if k == "q" => out.text = v.into_owned(),
                Ok((k, v)) if k == "limit" => match v.parse::<usize>() {
                    Ok(n) => out.limit = Some(n),
                    Err(_) => return Err(error(400, "limit is a whole number")),
                },
                Ok(_) => {}
                Err(e) => return Err(error(400, &format!("invalid query string: {e}"))),
            }
        }
        Ok(out)
    }

    fn limit(&self, default: usize) -> usize {
        self.limit.unwrap_or(default).min(HISTORY_MAX)
    }
}

/// One topic: subscribers, rate, and its most recent `limit` messages from history.
fn topic_answer(topic: &str, limit: usize, shared: &Shared) -> Answer {
    if let Err(e) = validate_topic(topic) {
        return error(400, &format!("invalid topic {topic:?}: {e}"));
    }
    let status = shared.broker.topic_status(topic);
    // Everything the broker holds: "after message 0 of this epoch".
    let from = format!("{}-0", shared.broker.epoch());
    let held = shared.broker.read_since(&[topic], Since::Id(&from));
    let skip = held.replay.len().saturating_sub(limit);
    let history: Vec<serde_json::Value> = held
        .replay
        .iter()
        .skip(skip)
        .rev()
        .map(|m| {
            let payload = m.payload();
            let (encoding, data) = match (m.kind, std::str::from_utf8(payload)) {
                (clarion_proto::ws::DataKind::Text, Ok(s)) => ("text", s.to_owned()),
                _ => {
                    use base64::Engine as _;
                    (
                        "base64",
                        base64::engine::general_purpose::STANDARD.encode(payload),
                    )
                }
            };
            serde_json::json!({
                "id": m.id_string(),
                "event": m.event.as_deref(),
                "encoding": encoding,
                "data": data,
                "bytes": payload.len(),
            })
        })
        .collect();
    // A presence topic's occupancy and first members (docs/presence.md).
    let presence = shared
        .presence
        .as_ref()
        .filter(|p| p.tracks(topic))
        .map(|p| match p.list(&shared.broker, topic, None, 20) {
            Ok(l) => serde_json::json!({
                "count": l.count,
                "connections": l.connections,
                "members": l.members.iter().map(|(sub, _, n)| {
                    serde_json::json!({"sub": &**sub, "connections": n})
                }).collect::<Vec<_>>(),
            }),
            Err(why) => serde_json::json!({ "error": why }),
        });
    json(
        200,
        &serde_json::json!({
            "topic": topic,
            "presence": presence,
            "known": status.is_some(),
            "subscribers": status.map_or(0, |s| s.subscribers),
            "published": status.map_or(0, |s| s.traffic.published),
            "rate": status.map_or(0.0, |s| s.traffic.rate),
            "held": status.map_or(0, |s| s.held),
            "position": held.position,
            "history": history,
        }),
    )
}

/// A JSON answer of the dashboard's: never cached, since every one is a live figure.
fn json(status: u16, value: &serde_json::Value) -> Answer {
    Answer::json(status, value).with_header("Cache-Control", "no-store")
}

/// A JSON error of the dashboard's.
fn error(status: u16, why: &str) -> Answer {
    json(status, &serde_json::json!({ "error": why }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(api_key_ok: bool) -> Request<'static> {
        Request {
            method: "GET",
            path: "/dashboard",
            query: "",
            authorization: None,
            api_key_ok,
            has_body: false,
            keep_alive: true,
        }
    }

    #[test]
    fn the_gate_follows_the_api_credentials() {
        assert!(dashboard_allowed(&req(true)));
        assert!(!dashboard_allowed(&req(false)));
    }

    #[test]
    fn routes_and_queries() {
        assert!(Dashboard::owns("/dashboard"));
        assert!(Dashboard::owns("/dashboard/feed"));
        assert!(Dashboard::owns("/topics/news"));
        assert!(!Dashboard::owns("/topics/news/latest"));
        assert!(!Dashboard::owns("/dashboards"));
        assert!(!Dashboard::owns("/publish/x"));
        let q = Query::parse("q=ne%20ws&limit=5")
            .ok()
            .map(|q| (q.limit(9), q.text));
        assert_eq!(q, Some((5, "ne ws".to_owned())));
        assert!(Query::parse("limit=x").is_err());
        assert_eq!(
            Query::parse("limit=100000").ok().map(|q| q.limit(1)),
            Some(HISTORY_MAX)
        );
    }
}
