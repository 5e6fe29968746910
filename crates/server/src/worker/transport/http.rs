//! Request heads on the client listener: routing, error answers, the WebSocket upgrade, and the
//! start of the HTTP subscription transports (Server-Sent Events, newline-delimited streaming,
//! long-polling).
//!
//! Every request is answered: a parse error or a limit maps to its status (400, 414, 431, 505),
//! an unknown path to 404, a wrong method to 405, a plain GET on a WebSocket path to 426, and a
//! connection over the cap to 503. Ordinary answers keep the connection alive when the client
//! allows it; answers to broken heads close it. GRIP routes are handed to [`crate::grip`]
//! before routing.
#![deny(clippy::wildcard_enum_match_arm)]

use std::borrow::Cow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::event_id;
use clarion_proto::filter::Filter;
use clarion_proto::http1::{self, Body, RequestHead};
use clarion_proto::pubsub::validate_topic;
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::handshake::{self, HandshakeError};
use clarion_proto::ws::{deflate, OpCode};

use crate::broker::Since;
use crate::log;
use crate::metrics::CloseReason;
use crate::worker::filters::{keep_passing, read_filter_text};
use crate::worker::socket::Socket;
use crate::worker::state::Ext;
use crate::worker::state::{PollMode, SseMode, State, StreamMode, WsMode, WsRole};
use crate::worker::transport::auth::Checked;
use crate::worker::transport::pages;
use crate::worker::transport::stream::Asks;
use crate::worker::Engine;

/// The subprotocol that wraps deliveries in a JSON envelope (`docs/protocol.md`).
pub const ENVELOPE_PROTOCOL: &str = "clarion.v1";

/// What an endpoint does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Endpoint {
    PubSub,
    Echo,
    Sse,
    Poll,
    Stream,
}

/// The subscription parameters of a request.
struct Params<'q> {
    topics: Vec<Cow<'q, str>>,
    /// Where to resume, as the client sent it.
    since: Option<Cow<'q, str>>,
    /// `format=`.
    format: Option<Cow<'q, str>>,
    /// `timeout=` (long-poll), in seconds.
    timeout: Option<u64>,
    /// `presence=1`: member lists and `join`/`leave` events of the presence topics.
    presence: bool,
    /// `filter=`: only messages whose tags pass it (`docs/filters.md`).
    filter: Option<Filter>,
    /// `delta=1`: messages of `delta_topics` as deltas of the previous one (`docs/delta.md`).
    delta: bool,
}

impl<S: Socket> Engine<S> {
    /// Checks a WebSocket upgrade request (its method, then the handshake's headers). A refused
    /// one is answered here (`405` saying `wrong_method`, or the handshake's status with what to
    /// send instead) and gives `None`.
    pub(crate) fn ws_upgrade_request<'h>(
        &mut self,
        k: u32,
        head: &RequestHead<'h>,
        keep: bool,
        wrong_method: &str,
    ) -> Option<handshake::Upgrade<'h>> {
        if head.method != "GET" {
            self.respond(k, 405, &[("Allow", "GET")], wrong_method, keep);
            return None;
        }
        match handshake::validate(head) {
            Ok(u) => Some(u),
            Err(e) => {
                let headers: &[(&str, &str)] = match e {
                    HandshakeError::UnsupportedVersion => {
                        &[("Sec-WebSocket-Version", "13"), ("Upgrade", "websocket")]
                    }
                    HandshakeError::NotUpgrade => &[("Upgrade", "websocket")],
                    HandshakeError::MethodNotAllowed
                    | HandshakeError::BadVersion
                    | HandshakeError::MissingConnectionUpgrade
                    | HandshakeError::BadKey => &[],
                };
                self.respond(k, e.status(), headers, &e.to_string(), keep);
                None
            }
        }
    }

    /// The `101` answer to a checked upgrade (with `protocol`, and permessage-deflate when the
    /// configuration allows it and the client offered it), and the deflate agreed.
    pub(crate) fn ws_accept(
        &self,
        upgrade: &handshake::Upgrade<'_>,
        protocol: Option<&str>,
    ) -> (Vec<u8>, Option<(deflate::Agreed, String)>) {
        let deflate = self
            .shared
            .config
            .deflate_policy()
            .and_then(|policy| deflate::negotiate(&upgrade.extensions, &policy));
        let mut out = Vec::with_capacity(256);
        handshake::write_accept(
            &mut out,
            upgrade.key,
            protocol,
            deflate.as_ref().map(|(_, answer)| answer.as_str()),
        );
        (out, deflate)
    }

    /// Parses one request head from `data` and answers it. Returns the bytes used, or `None` when
    /// the head is incomplete.
    pub(crate) fn on_http(&mut self, k: u32, data: &[u8]) -> Option<usize> {
        let limits = self.shared.config.head_limits();
        match http1::parse_head(data, &limits) {
            Ok(None) => None,
            Err(e) if !claims_http(data) => {
                // Not HTTP at all (a TLS handshake on the clear port, an HTTP/2 client with a
                // broken preface, another protocol): no answer could be read, so the
                // connection just closes.
                log::debug(format_args!("not an HTTP request: {e}"));
                self.shared.metrics.http_errors.fetch_add(1, Relaxed);
                self.start_closing(k, None, CloseReason::HttpError);
                Some(data.len())
            }
            Err(e) => {
                log::debug(format_args!("bad request head: {e}"));
                self.respond(k, e.status(), &[], &e.to_string(), false);
                Some(data.len())
            }
            Ok(Some(head)) => {
                if let Some(used) = self.grip_intercept(k, &head, data) {
                    return used;
                }
                let used = head.head_len;
                self.hook_keep_head(data.get(..used).unwrap_or_default());
                self.route(k, &head);
                Some(used)
            }
        }
    }

    fn route(&mut self, k: u32, head: &RequestHead<'_>) {
        let keep = head.keep_alive();
        let path = head.path();
        match head.body() {
            Ok(Body::None) => {}
            // Publishing (or any request with a body) sent here instead of to the API: say
            // which listener this is. Closing avoids reading the body.
            Ok(_) if !self.is_client_endpoint(path) => {
                self.respond(k, 404, &[], WRONG_LISTENER, false);
                return;
            }
            Ok(_) => {
                // Nothing on the client listener takes a body; closing avoids reading it.
                self.respond(k, 413, &[], "request bodies are not accepted here", false);
                return;
            }
            Err(e) => {
                self.respond(k, e.status(), &[], &e.to_string(), false);
                return;
            }
        }
        let cfg = &self.shared.config;
        let wants_sse = head
            .header_str("accept")
            .is_some_and(|a| a.contains("text/event-stream"));
        let endpoint = if path == cfg.ws_path {
            if wants_sse && !head.has_token("upgrade", "websocket") {
                Endpoint::Sse
            } else {
                Endpoint::PubSub
            }
        } else if path == cfg.sse_path {
            Endpoint::Sse
        } else if path == cfg.poll_path {
            Endpoint::Poll
        } else if path == cfg.stream_path {
            if wants_sse {
                Endpoint::Sse
            } else {
                Endpoint::Stream
            }
        } else if cfg.echo_path.as_deref() == Some(path) {
            Endpoint::Echo
        } else if path.starts_with(super::pusher::APP_PREFIX) && self.shared.pusher.any() {
            self.pusher_upgrade(k, head, keep);
            return;
        } else if path == pages::INDEX_PATH
            || path == pages::CLIENT_JS_PATH
            || path == pages::CLIENT_DELTA_JS_PATH
        {
            self.serve_page(k, head.method, path, head.header_str("if-none-match"), keep);
            return;
        } else if let Some(topic) = latest_topic(path) {
            match head.method {
                "GET" => self.answer_latest(k, head, topic, keep),
                "OPTIONS" => self.preflight(k, keep),
                _ => self.respond(
                    k,
                    405,
                    &[("Allow", "GET, OPTIONS")],
                    "/topics/{t}/latest takes GET",
                    keep,
                ),
            }
            return;
        } else if is_api_path(path) {
            self.respond(k, 404, &[], WRONG_LISTENER, keep);
            return;
        } else {
            self.respond(k, 404, &[], "not found", keep);
            return;
        };
        if matches!(endpoint, Endpoint::Sse | Endpoint::Poll | Endpoint::Stream) {
            match head.method {
                "GET" => self.open_http_subscription(k, head, endpoint, keep),
                "OPTIONS" => self.preflight(k, keep),
                _ => self.respond(
                    k,
                    405,
                    &[("Allow", "GET, OPTIONS")],
                    "subscription endpoints take GET",
                    keep,
                ),
            }
            return;
        }
        let Some(upgrade) = self.ws_upgrade_request(k, head, keep, "WebSocket endpoints take GET")
        else {
            return;
        };
        let envelope =
            endpoint == Endpoint::PubSub && upgrade.protocols.contains(&ENVELOPE_PROTOCOL);
        let params = match endpoint {
            Endpoint::PubSub => match self.params(head, false) {
                Ok(p) if p.since.is_some() && !envelope => {
                    let why =
                        "resuming (since=) needs the clarion.v1 subprotocol, which carries ids";
                    self.respond(k, 400, &[], why, keep);
                    return;
                }
                Ok(p) if p.presence && self.presence_url_refusal(&p.topics, envelope).is_some() => {
                    let why = self
                        .presence_url_refusal(&p.topics, envelope)
                        .unwrap_or_default();
                    self.respond(k, 400, &[], why, keep);
                    return;
                }
                Ok(p) if p.delta => {
                    let topics = p.topics.iter().map(|t| &**t);
                    if let Some(why) = self.delta_refusal(topics, envelope) {
                        self.respond(k, 400, &[], &why, keep);
                        return;
                    }
                    p
                }
                Ok(p) => p,
                Err(why) => {
                    self.respond(k, 400, &[], &why, keep);
                    return;
                }
            },
            Endpoint::Echo | Endpoint::Sse | Endpoint::Poll | Endpoint::Stream => Params {
                topics: Vec::new(),
                since: None,
                format: None,
                timeout: None,
                presence: false,
                filter: None,
                delta: false,
            },
        };
        // Authentication before the 101: a refused upgrade gets its status instead.
        let checked = if endpoint == Endpoint::PubSub {
            let topics: Vec<&str> = params.topics.iter().map(|t| &**t).collect();
            match self.check_request(k, head, &topics, topics.is_empty(), keep) {
                Checked::Refused | Checked::Waiting => return,
                c @ (Checked::Allowed(_) | Checked::Pending) => c,
            }
        } else {
            Checked::Allowed(None)
        };
        let (out, deflate) = self.ws_accept(&upgrade, envelope.then_some(ENVELOPE_PROTOCOL));
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        conn.last_seen = self.now;
        let role = match endpoint {
            Endpoint::Echo => WsRole::Echo,
            Endpoint::PubSub | Endpoint::Sse | Endpoint::Poll | Endpoint::Stream if envelope => {
                WsRole::Envelope
            }
            Endpoint::PubSub | Endpoint::Sse | Endpoint::Poll | Endpoint::Stream => WsRole::PubSub,
        };
        let mut mode = WsMode::new(role);
        mode.deflate = deflate.as_ref().map(|(agreed, _)| Ext::new(agreed));
        self.set_state(k, State::Ws(mode));
        self.adopt(k, checked);
        let extra = self.hook_topics(k);
        let mut topics: Vec<&str> = params.topics.iter().map(|t| &**t).collect();
        with_hook_topics(&mut topics, &extra, self.shared.config.max_subscriptions);
        if topics.is_empty() {
            self.send(k, &Arc::from(out));
            return;
        }
        // Subscribe before the 101 goes out: a client that has read it may publish at once
        // and must receive its own message.
        let since = Since::from_cursor(params.since.as_deref());
        let filter = params.filter.as_ref();
        let Some(mut sub) = self.subscribe_filtered(k, &topics, since, false, filter) else {
            return;
        };
        keep_passing(filter, &mut sub.replay);
        let mut frames: Vec<Arc<[u8]>> = vec![out.into()];
        for g in &sub.gaps {
            frames.push(encode_frame(OpCode::Text, g.json().as_bytes()).into());
        }
        let form = self.framing(k).replay_form();
        self.send_resume(k, frames, &sub.replay, form);
        if params.delta {
            self.delta_join(k, &sub.names, &sub.replay);
        }
        if params.presence {
            self.presence_listen(k, &sub.names);
        }
    }

    /// The `topic=`, `since=`/`lastEventId=` (or `Last-Event-ID`), `format=` and `timeout=`
    /// parameters, validated. Other parameters are ignored (cache busters such as `_=123`).
    /// Whether `path` is one of the client listener's endpoints.
    fn is_client_endpoint(&self, path: &str) -> bool {
        let c = &self.shared.config;
        [&c.ws_path, &c.sse_path, &c.poll_path, &c.stream_path]
            .iter()
            .any(|p| p.as_str() == path)
            || c.echo_path.as_deref() == Some(path)
    }

    fn params<'q>(
        &self,
        head: &RequestHead<'q>,
        lenient_since: bool,
    ) -> Result<Params<'q>, String> {
        let mut p = Params {
            topics: Vec::new(),
            since: None,
            format: None,
            timeout: None,
            presence: false,
            filter: None,
            delta: false,
        };
        let mut last_event_id = None;
        for pair in http1::query_pairs(head.query()) {
            let (key, value) = pair.map_err(|e| format!("invalid query string: {e}"))?;
            match &*key {
                "topic" => {
                    validate_topic(&value).map_err(|e| format!("invalid topic {value:?}: {e}"))?;
                    if !p.topics.contains(&value) {
                        p.topics.push(value);
                    }
                }
                "since" if value == event_id::LATEST => p.since = Some(value),
                "since" => {
                    event_id::validate_cursor(&value)
                        .map_err(|e| format!("invalid since {value:?}: {e}"))?;
                    p.since = Some(value);
                }
                "lastEventId" | "last-event-id" => last_event_id = Some(value),
                "presence" => {
                    p.presence = match &*value {
                        "1" | "true" => true,
                        "0" | "false" => false,
                        _ => return Err(format!("invalid presence {value:?}: 1 or 0")),
                    }
                }
                "delta" => {
                    p.delta = match &*value {
                        "1" | "true" => true,
                        "0" | "false" => false,
                        _ => return Err(format!("invalid delta {value:?}: 1 or 0")),
                    }
                }
                "format" => p.format = Some(value),
                "filter" => {
                    p.filter = Some(read_filter_text(&value, &self.shared.metrics.filters)?);
                }
                "timeout" => {
                    let secs = value
                        .parse::<u64>()
                        .map_err(|_| format!("invalid timeout {value:?}: whole seconds"))?;
                    p.timeout = Some(secs);
                }
                _ => {}
            }
        }
        if p.topics.len() > self.shared.config.max_subscriptions {
            return Err(format!(
                "too many topics: at most {} per connection",
                self.shared.config.max_subscriptions
            ));
        }
        // A reconnecting EventSource sends the header while its URL still carries the first
        // position, so the header wins. Neither is checked strictly: an id this server cannot
        // place is answered with a gap notice, not an error that would stop the EventSource.
        let header = head
            .header_str("last-event-id")
            .map(str::trim)
            .filter(|v| !v.is_empty());
        if lenient_since {
            if let Some(h) = header {
                p.since = Some(Cow::Borrowed(h));
            } else if let Some(q) = last_event_id.filter(|v| !v.is_empty()) {
                p.since = Some(q);
            }
        }
        Ok(p)
    }

    /// Answers a CORS preflight for the subscription endpoints.
    fn preflight(&mut self, k: u32, keep: bool) {
        let origin = self.shared.config.cors_allow_origin.clone();
        let mut headers: Vec<(&str, &str)> = vec![
            ("Access-Control-Allow-Methods", "GET, OPTIONS"),
            (
                "Access-Control-Allow-Headers",
                "Last-Event-ID, Cache-Control, Accept",
            ),
            ("Access-Control-Max-Age", "86400"),
        ];
        if !origin.is_empty() {
            headers.push(("Access-Control-Allow-Origin", &origin));
        }
        if !keep {
            headers.push(("Connection", "close"));
        }
        let mut out = Vec::with_capacity(256);
        http1::write_response_head(&mut out, 204, &headers, None);
        self.finish_answer(k, out.into(), keep, 204);
    }

    /// Starts an SSE stream, an NDJSON stream or a long-poll.
    fn open_http_subscription(
        &mut self,
        k: u32,
        head: &RequestHead<'_>,
        endpoint: Endpoint,
        keep: bool,
    ) {
        let params = match self.params(head, true) {
            Ok(p) => p,
            Err(why) => return self.respond(k, 400, &[], &why, keep),
        };
        if params.topics.is_empty() {
            return self.respond(k, 400, &[], "give at least one topic= parameter", keep);
        }
        let format = params.format.as_deref();
        let state = match (endpoint, format) {
            (Endpoint::Sse, None | Some("data")) => State::Sse(SseMode::Payload),
            (Endpoint::Sse, Some("json")) => State::Sse(SseMode::Json),
            (Endpoint::Stream, None | Some("json")) => State::Stream(StreamMode::Ndjson),
            (Endpoint::Stream, Some("raw")) => State::Stream(StreamMode::Raw),
            (Endpoint::Poll, None | Some("json")) => State::Poll(PollMode { keep, grip: false }),
            (_, f) => {
                let f = f.unwrap_or_default();
                let why = format!("unknown format {f:?} (sse: data, json; stream: json, raw)");
                return self.respond(k, 400, &[], &why, keep);
            }
        };
        if state == State::Stream(StreamMode::Raw) && params.since.is_some() {
            let why = "format=raw carries no ids, so it cannot resume; use the default json lines";
            return self.respond(k, 400, &[], why, keep);
        }
        if params.delta {
            // A long-poll answers with full messages (its answer is a batch, not a stream the
            // client keeps the last message of).
            let shaped = matches!(
                state,
                State::Sse(SseMode::Json) | State::Stream(StreamMode::Ndjson) | State::Poll(_)
            );
            let topics = params.topics.iter().map(|t| &**t);
            if let Some(why) = self.delta_refusal(topics, shaped) {
                return self.respond(k, 400, &[], &why, keep);
            }
        }
        if params.presence {
            let typed = state != State::Stream(StreamMode::Raw);
            if let Some(why) = self.presence_url_refusal(&params.topics, typed) {
                return self.respond(k, 400, &[], why, keep);
            }
        }
        if endpoint == Endpoint::Stream && head.minor_version == 0 {
            return self.respond(
                k,
                505,
                &[],
                "streaming uses chunked transfer, which needs HTTP/1.1",
                false,
            );
        }
        let cfg = &self.shared.config;
        let hold = params
            .timeout
            .unwrap_or(cfg.poll_timeout)
            .min(cfg.poll_max_timeout) as u32;
        let mut topics: Vec<&str> = params.topics.iter().map(|t| &**t).collect();
        let checked = match self.check_request(k, head, &topics, false, keep) {
            Checked::Refused | Checked::Waiting => return,
            c @ (Checked::Allowed(_) | Checked::Pending) => c,
        };
        let extra = self.hook_topics(k);
        with_hook_topics(&mut topics, &extra, self.shared.config.max_subscriptions);
        let since = Since::from_cursor(params.since.as_deref());
        match state {
            State::Poll(mode) => {
                let wait = crate::worker::transport::poll::PollWait {
                    hold,
                    presence: params.presence,
                    filter: params.filter.as_ref(),
                };
                self.open_poll(k, &topics, since, wait, mode, checked);
                self.presence_settle(k);
            }
            State::Sse(_)
            | State::Stream(_)
            | State::Http
            | State::Ws(_)
            | State::H2
            | State::Proxy
            | State::Closing { .. } => {
                let asks = Asks {
                    filter: params.filter.as_ref(),
                    delta: params.delta,
                };
                self.open_stream(k, &topics, since, state, checked, asks);
                if params.presence {
                    let names: Vec<Arc<str>> = topics.iter().map(|t| Arc::from(*t)).collect();
                    self.presence_listen(k, &names);
                }
                self.presence_settle(k);
            }
        }
    }

    /// Sends a complete answer, then keeps the connection for the next request or closes it.
    pub(crate) fn finish_answer(&mut self, k: u32, out: Arc<[u8]>, keep: bool, status: u16) {
        if keep {
            if let Some(conn) = self.conns.get_mut(k as usize) {
                conn.last_seen = self.now;
            }
            self.send(k, &out);
        } else {
            let reason = if status >= 400 {
                CloseReason::HttpError
            } else {
                CloseReason::HttpDone
            };
            self.start_closing(k, Some(out), reason);
        }
    }

    /// `GET /topics/{topic}/latest` on the client listener: the topic's last message with its id
    /// for whoever may subscribe to it here (the connect hook, the token's grants, anonymous
    /// access: the checks of a long-poll), `404` when history holds none. Read like a
    /// subscription's `since=latest` without subscribing (docs/history.md, "The latest value").
    fn answer_latest(&mut self, k: u32, head: &RequestHead<'_>, raw: &str, keep: bool) {
        // Percent-decoded once, as the API listener decodes its paths.
        let topic = match http1::decode_path(raw) {
            Ok(t) => t,
            Err(e) => return self.respond(k, 400, &[], &e.to_string(), keep),
        };
        let topic = &*topic;
        if let Err(e) = validate_topic(topic) {
            return self.respond(k, 400, &[], &format!("invalid topic {topic:?}: {e}"), keep);
        }
        match self.check_request(k, head, &[topic], false, keep) {
            Checked::Refused | Checked::Waiting => return,
            Checked::Allowed(_) | Checked::Pending => {}
        }
        let read = self.shared.broker.read_since(&[topic], Since::Latest);
        let Some(m) = read.replay.last() else {
            let why = format!("no message on {topic:?} in history (none published, or trimmed)");
            return self.respond(k, 404, &[], &why, keep);
        };
        let origin = self.shared.config.cors_allow_origin.clone();
        let mut headers: Vec<(&str, &str)> = vec![
            ("Content-Type", "application/json"),
            ("Cache-Control", "no-store"),
        ];
        if !origin.is_empty() {
            headers.push(("Access-Control-Allow-Origin", &origin));
        }
        if !keep {
            headers.push(("Connection", "close"));
        }
        let json = m.json();
        let mut out = Vec::with_capacity(256 + json.len());
        http1::write_response_head(&mut out, 200, &headers, Some(json.len() + 1));
        out.extend_from_slice(json);
        out.push(b'\n');
        self.finish_answer(k, out.into(), keep, 200);
    }

    /// Answers with `status` and a short plain-text body; closes afterwards unless `keep`.
    pub(crate) fn respond(
        &mut self,
        k: u32,
        status: u16,
        headers: &[(&str, &str)],
        body: &str,
        keep: bool,
    ) {
        if status >= 400 {
            self.shared.metrics.http_errors.fetch_add(1, Relaxed);
            log::debug(format_args!("answered {status}: {body}"));
        }
        let mut all: Vec<(&str, &str)> = Vec::with_capacity(headers.len() + 2);
        all.extend_from_slice(headers);
        all.push(("Content-Type", "text/plain; charset=utf-8"));
        if !keep {
            all.push(("Connection", "close"));
        }
        let mut out = Vec::with_capacity(128 + body.len());
        http1::write_response_head(&mut out, status, &all, Some(body.len() + 1));
        out.extend_from_slice(body.as_bytes());
        out.push(b'\n');
        self.finish_answer(k, out.into(), keep, status);
    }
}

/// The answer to an API request (publishing, health, metrics, the dashboard) sent to the client
/// listener: which listener this is and where to go instead.
const WRONG_LISTENER: &str = "this is the client listener; publish to the API listener \
                              (api_listen, 127.0.0.1:8081 by default)";

/// Whether `path` is one the API listener serves (and the client listener does not).
/// The topic of a `/topics/{topic}/latest` request (the same path as on the API listener).
pub(crate) fn latest_topic(path: &str) -> Option<&str> {
    path.strip_prefix("/topics/")?.strip_suffix("/latest")
}

fn is_api_path(path: &str) -> bool {
    let under = |p: &str| path == p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/'));
    under("/publish")
        || under("/topics")
        || under("/dashboard")
        || path == "/healthz"
        || path == "/metrics"
}

/// Adds the topics a `connect` hook subscribed the connection to (`extra`) to those it asked
/// for, without duplicates and within `max` subscriptions.
fn with_hook_topics<'t>(topics: &mut Vec<&'t str>, extra: &'t [String], max: usize) {
    for t in extra {
        if topics.len() >= max {
            break;
        }
        if !topics.contains(&t.as_str()) {
            topics.push(t);
        }
    }
}

/// Whether a request head whose parse failed at least claims to be HTTP: its first line holds
/// only printable ASCII and, once complete, ends with an `HTTP/` version (a wrong one gets its
/// `505`). A TLS handshake on the clear port or another binary protocol does not.
fn claims_http(data: &[u8]) -> bool {
    let end = data.iter().position(|&b| b == b'\n');
    let line = data.get(..end.unwrap_or(data.len())).unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line
        .iter()
        .any(|&b| !(b == b'\t' || (0x20..0x7f).contains(&b)))
    {
        return false;
    }
    end.is_none()
        || line
            .rsplit(|&b| b == b' ')
            .next()
            .is_some_and(|v| v.starts_with(b"HTTP/"))
}

#[cfg(test)]
mod claims_http_tests {
    use super::claims_http;

    #[test]
    fn only_what_claims_http_gets_an_http_answer() {
        assert!(claims_http(b"GET /ws HTTP/2.0\r\n\r\n"));
        assert!(claims_http(b"GET /ws HTTP/1.1\r\nBad header\r\n\r\n"));
        assert!(claims_http(b"GET /unfinished"));
        assert!(!claims_http(b"NOT HTTP AT ALL\r\n\r\n"));
        assert!(!claims_http(b"INVALID CONNECTION PREFACE\r\n\r\n"));
        assert!(!claims_http(b"\x16\x03\x01\x02\x00\x01\x00"));
    }
}
