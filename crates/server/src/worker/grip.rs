//! GRIP proxy mode in the event loop: requests on routed paths go to the backend, and its answer
//! decides what the connection becomes (`docs/grip.md`):
//!
//! - no `Grip-Hold`: the answer is passed through and the connection serves its next request;
//! - `Grip-Hold: stream`: the answer's head and body start a stream (chunked for HTTP/1.1
//!   clients, close-delimited for HTTP/1.0) that receives the `http-stream` content published
//!   to its channels, and the backend's `Grip-Keep-Alive` data when it is quiet;
//! - `Grip-Hold: response`: a long-poll, answered by the first `http-response` published to its
//!   channels, or with the backend's own answer at `Grip-Timeout`;
//! - a WebSocket upgrade on an `over_http` route: bridged with WebSocket-over-HTTP. The client's
//!   messages become `TEXT`/`BINARY` events POSTed to the backend (one request at a time per
//!   connection, later events batched behind it); the backend's answers carry events for the
//!   client and `c:` control messages (subscribe, unsubscribe, detach, keep-alive).
//!
//! Held connections are ordinary `Stream`, `Poll` and `Ws` records with the `GRIP` flag; what
//! they need beyond the record (keep-alive data, the timeout answer, the bridge's meta and
//! queue) is in the worker's `grip` table. Backend exchanges run on the pool in
//! [`crate::grip::backend`]; answers come back through the worker's mailbox, matched by ticket.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::grip::headers::KeepAliveMode;
use clarion_proto::grip::publish::WsMessage;
use clarion_proto::grip::{
    self as proto, Control, Event as WsEvent, EventLimits, HoldMode, Prefixed,
};
use clarion_proto::http1::{self, Body, HeadWriteError, HopByHop, RequestHead, Version};
use clarion_proto::pubsub::validate_topic;
use clarion_proto::ws::close::encode_close_frame;
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::handshake;
use clarion_proto::ws::{CloseCode, DataKind, OpCode};

use super::conn::{State, CHUNKED, GRIP, KEEP};
use super::Worker;
use crate::broker::Since;
use crate::grip::backend::{Answer, Failure, Job, Response};
use crate::grip::{is_grip_header, response_bytes, GripContent, StreamPart, WsPart};
use crate::log;
use crate::message::Published;
use crate::metrics::CloseReason;

/// A GRIP connection's state beyond its record.
pub(super) struct GripConn {
    /// Matches backend answers to this connection (slab keys are reused).
    ticket: u64,
    /// Index of its route in the proxy's table.
    route: u32,
    phase: Phase,
}

enum Phase {
    /// A forwarded request waits for the backend.
    Waiting(Box<Waiting>),
    /// A held stream's keep-alive (a stream without one has no entry at all: the record's
    /// `GRIP` flag says everything it needs).
    Stream(Box<KeepAlive>),
    /// A held long-poll.
    Response(Box<ResponseHold>),
    /// A WebSocket bridged with WebSocket-over-HTTP.
    Ws(Box<Bridge>),
}

struct Waiting {
    keep: bool,
    head_only: bool,
    http10: bool,
    /// For a WebSocket upgrade: what accepting it needs.
    upgrade: Option<Upgrade>,
}

/// A WebSocket upgrade waiting for the backend's OPEN: the client's key and offered
/// subprotocols, and the bridge to start.
struct Upgrade {
    key: Box<[u8]>,
    offered: Vec<String>,
    bridge: Box<Bridge>,
}

/// When a held long-poll times out, what it then answers, and the backend's headers (a
/// published `http-response` is sent with them, its own headers overriding).
struct ResponseHold {
    deadline: u32,
    timeout: Arc<[u8]>,
    headers: Box<[(Box<str>, Box<str>)]>,
}

struct KeepAlive {
    data: Arc<[u8]>,
    every: u32,
    interval: bool,
    last: u32,
}

struct Bridge {
    /// The request line and fixed headers of every event request, up to the meta.
    head: Box<[u8]>,
    meta: Vec<(String, String)>,
    /// The `grip` extension's message prefix, when the backend accepted it.
    prefix: Option<Box<str>>,
    /// Events waiting for the request in flight to finish.
    pending: Vec<u8>,
    in_flight: bool,
    detached: bool,
    /// The backend has been told the connection ended (CLOSE or DISCONNECT sent).
    told: bool,
    /// The client sent a Close frame (a CLOSE event is queued for the backend).
    client_closed: bool,
    /// `Keep-Alive-Interval`: seconds between requests when nothing else is sent.
    interval: u32,
    last_request: u32,
    /// A keep-alive the backend set with a control message: frame and seconds.
    keep_alive: Option<(Arc<[u8]>, u32, u32)>,
}

/// Limits on a backend's websocket-events body: message size is bounded by `grip_max_body`.
fn event_limits(max: usize) -> EventLimits {
    EventLimits {
        max_content: max,
        max_events: crate::config::limits::GRIP_WS_MAX_EVENTS,
    }
}

/// Client headers never forwarded: hop-by-hop ones (including those the request's `Connection`
/// names), the body framing (set again), and any `Grip-Sig` a client made up.
fn forwardable(hop: &HopByHop<'_>, name: &str) -> bool {
    hop.forwards(name)
        && !name.eq_ignore_ascii_case("content-length")
        && !name.eq_ignore_ascii_case("host")
        && !name.eq_ignore_ascii_case("grip-sig")
}

impl Worker {
    /// If the request matches a GRIP route, forwards it and returns the bytes used (`Some(None)`
    /// while its body is incomplete); `None` when no route matches.
    pub(super) fn grip_intercept(
        &mut self,
        k: u32,
        head: &RequestHead<'_>,
        data: &[u8],
    ) -> Option<Option<usize>> {
        let shared = Arc::clone(&self.shared);
        let proxy = shared.grip.as_ref()?;
        let host = head.header_str("host").unwrap_or_default();
        let ws = head.has_token("upgrade", "websocket");
        let route = proto::find_route(&proxy.routes, host, head.path(), ws)?;
        let route_index = proxy
            .routes
            .iter()
            .position(|r| std::ptr::eq(r, route))
            .unwrap_or_default() as u32;
        let keep = head.keep_alive();
        let max = shared.config.grip_max_body;
        // The body: `Content-Length` bytes, or a chunked body decoded whole (it is forwarded
        // with a length). Until it is all here, the bytes wait in the connection's input.
        let (total, body): (usize, std::borrow::Cow<'_, [u8]>) = match head.body() {
            Ok(Body::None) => (head.head_len, std::borrow::Cow::Borrowed(&[])),
            Ok(Body::Length(n)) if n > max as u64 => {
                self.respond(k, 413, &[], "request body larger than grip_max_body", false);
                return Some(Some(data.len()));
            }
            Ok(Body::Length(n)) => {
                let total = head.head_len + n as usize;
                match data.get(head.head_len..total) {
                    Some(b) => (total, std::borrow::Cow::Borrowed(b)),
                    None => {
                        self.continue_if_expected(k, head, data);
                        return Some(None);
                    }
                }
            }
            Ok(Body::Chunked) => {
                let mut decoder = http1::ChunkedDecoder::new(max);
                let mut body = Vec::new();
                let rest = data.get(head.head_len..).unwrap_or_default();
                match decoder.decode(rest, &mut body) {
                    Ok((used, true)) => (head.head_len + used, std::borrow::Cow::Owned(body)),
                    Ok((_, false)) => {
                        self.continue_if_expected(k, head, data);
                        return Some(None);
                    }
                    Err(http1::BodyError::TooLarge) => {
                        self.respond(k, 413, &[], "request body larger than grip_max_body", false);
                        return Some(Some(data.len()));
                    }
                    Err(http1::BodyError::Malformed) => {
                        self.respond(k, 400, &[], "malformed chunked request body", false);
                        return Some(Some(data.len()));
                    }
                }
            }
            Err(e) => {
                self.respond(k, e.status(), &[], &e.to_string(), false);
                return Some(Some(data.len()));
            }
        };
        let body_len = body.len();
        let Some(target) = route.targets.first() else {
            self.respond(k, 502, &[], "route has no backend", keep);
            return Some(Some(total));
        };
        let Some(conn) = self.conns.get(k as usize) else {
            return Some(Some(total));
        };
        let tls = conn.tls.is_some();
        let client_ip = conn
            .stream
            .peer_addr()
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        let path = route.backend_path(head.target);
        let host_header = target.host_header.as_deref().unwrap_or(host);
        let scheme = match (tls, ws) {
            (true, true) => "wss",
            (true, false) => "https",
            (false, true) => "ws",
            (false, false) => "http",
        };
        // The start of every request for this client: request line and header fields, with
        // `extra` fields after the client's.
        let request_start = |method: &str, extra: &[(&str, &str)]| {
            let mut out = Vec::with_capacity(512);
            http1::write_request_line(&mut out, method, &path, Version::Http11)?;
            write_client_headers(&mut out, head, host_header, &client_ip, scheme)?;
            for (name, value) in extra {
                http1::write_header(&mut out, name, value.as_bytes())?;
            }
            Ok::<_, HeadWriteError>(out)
        };
        let ticket = proxy.ticket();
        let (request, upgrade) = if ws {
            if !target.over_http {
                let why = "this route relays WebSockets only with over_http (WebSocket-over-HTTP)";
                self.respond(k, 501, &[], why, keep);
                return Some(Some(total));
            }
            let upgrade = match handshake::validate(head) {
                Ok(u) => u,
                Err(e) => {
                    self.respond(k, e.status(), &[], &e.to_string(), keep);
                    return Some(Some(total));
                }
            };
            let conn_id = format!("{}-{ticket:x}", shared.broker.epoch());
            let bridge_head = match request_start(
                "POST",
                &[
                    ("Sec-WebSocket-Extensions", "grip"),
                    ("Connection-Id", &conn_id),
                    ("Content-Type", "application/websocket-events"),
                    ("Accept", "application/websocket-events"),
                ],
            ) {
                Ok(h) => h,
                Err(e) => {
                    self.respond(k, 502, &[], &cannot_forward(e), keep);
                    return Some(Some(total));
                }
            };
            let bridge = Box::new(Bridge {
                head: bridge_head.into(),
                meta: Vec::new(),
                prefix: None,
                pending: Vec::new(),
                in_flight: true,
                detached: false,
                told: false,
                client_closed: false,
                interval: 0,
                last_request: self.now,
                keep_alive: None,
            });
            let mut open = Vec::new();
            proto::write_event(&mut open, &WsEvent::Open);
            let request = event_request(&bridge, proxy.signature(route).as_deref(), &open);
            let protocols = upgrade.protocols.iter().map(|p| p.to_string()).collect();
            (
                request,
                Some(Upgrade {
                    key: upgrade.key.into(),
                    offered: protocols,
                    bridge,
                }),
            )
        } else {
            let sig = proxy.signature(route);
            let sig: Vec<(&str, &str)> = sig.iter().map(|s| ("Grip-Sig", s.as_str())).collect();
            let mut request = match request_start(head.method, &sig) {
                Ok(r) => r,
                Err(e) => {
                    self.respond(k, 502, &[], &cannot_forward(e), keep);
                    return Some(Some(total));
                }
            };
            if body_len > 0 || matches!(head.method, "POST" | "PUT" | "PATCH") {
                http1::write_content_length(&mut request, body_len);
            }
            http1::end_head(&mut request);
            request.extend_from_slice(&body);
            (request, None)
        };
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return Some(Some(total));
        };
        conn.state = State::Proxy;
        conn.last_seen = self.now;
        self.grip.insert(
            k,
            GripConn {
                ticket,
                route: route_index,
                phase: Phase::Waiting(Box::new(Waiting {
                    keep,
                    head_only: head.method == "HEAD",
                    http10: head.minor_version == 0,
                    upgrade,
                })),
            },
        );
        shared.metrics.grip_requests.fetch_add(1, Relaxed);
        self.submit(k, ticket, route_index, request, head.method == "HEAD", true);
        Some(Some(total))
    }

    /// Sends `100 Continue` to a client that waits for it before its body, once: the head is
    /// parsed again only when body bytes arrive.
    fn continue_if_expected(&mut self, k: u32, head: &RequestHead<'_>, data: &[u8]) {
        if data.len() == head.head_len && head.has_token("expect", "100-continue") {
            self.send(k, &Arc::from(&b"HTTP/1.1 100 Continue\r\n\r\n"[..]));
        }
    }

    /// Hands a request for connection `k` to the backend pool; its answer comes back to this
    /// worker unless `answer` is false (a notice nobody waits for).
    fn submit(
        &self,
        k: u32,
        ticket: u64,
        route: u32,
        request: Vec<u8>,
        head_only: bool,
        answer: bool,
    ) {
        let Some(proxy) = self.shared.grip.as_ref() else {
            return;
        };
        let Some(targets) = proxy.targets.get(route as usize) else {
            return;
        };
        proxy.backend.submit(Job {
            reply: answer
                .then(|| proxy.mailboxes.get(self.id).cloned())
                .flatten(),
            key: k,
            ticket,
            targets: Arc::clone(targets),
            request,
            head_only,
        });
    }

    /// Applies every backend answer that arrived.
    pub(super) fn grip_answers(&mut self) {
        let Some(mailbox) = self
            .shared
            .grip
            .as_ref()
            .and_then(|p| p.mailboxes.get(self.id).cloned())
        else {
            return;
        };
        for answer in mailbox.take() {
            self.on_answer(answer);
        }
    }

    fn on_answer(&mut self, a: Answer) {
        let Some(g) = self.grip.get_mut(&a.key) else {
            return;
        };
        if g.ticket != a.ticket {
            return;
        }
        let k = a.key;
        self.apply_answer(k, a);
        // Bytes the client sent meanwhile (a pipelined request, a first frame) waited in its
        // input; no read event will come for them, so read them now.
        let waiting = self
            .conns
            .get(k as usize)
            .is_some_and(|c| c.input.is_some() && matches!(c.state, State::Http | State::Ws));
        if waiting {
            self.consume(k, &mut []);
        }
    }

    fn apply_answer(&mut self, k: u32, a: Answer) {
        let Some(g) = self.grip.get_mut(&k) else {
            return;
        };
        match &mut g.phase {
            Phase::Waiting(_) => {
                let Some(GripConn {
                    phase: Phase::Waiting(w),
                    route,
                    ticket,
                }) = self.grip.remove(&k)
                else {
                    return;
                };
                self.on_first_answer(k, *w, route, ticket, a.result);
            }
            Phase::Ws(bridge) => {
                bridge.in_flight = false;
                self.on_bridge_answer(k, a.result);
            }
            Phase::Stream(_) | Phase::Response(_) => {}
        }
    }

    /// Leaves `Proxy` for `Http` (the connection is then answered like any other request).
    fn back_to_http(&mut self, k: u32) {
        if let Some(conn) = self.conns.get_mut(k as usize) {
            if conn.state == State::Proxy {
                conn.state = State::Http;
                conn.last_seen = self.now;
            }
        }
    }

    /// Answers a request whose backend exchange failed. The client gets Pushpin's words (a 502
    /// body that names no backend address); the log gets the reason.
    fn backend_failed(&mut self, k: u32, f: &Failure, keep: bool) {
        let m = &self.shared.metrics;
        m.grip_backend_errors.fetch_add(1, Relaxed);
        m.http_errors.fetch_add(1, Relaxed);
        let (status, body) = match f {
            Failure::Timeout => {
                log::info(format_args!("GRIP: backend did not answer in time"));
                (504, "Timeout while proxying to origin.\n")
            }
            Failure::Unreachable(e) => {
                log::info(format_args!("GRIP: backend unreachable: {e}"));
                (502, "Error while proxying to origin.\n")
            }
            Failure::Invalid(e) => {
                log::info(format_args!("GRIP: invalid backend answer: {e}"));
                (502, "Error while proxying to origin.\n")
            }
        };
        self.back_to_http(k);
        let mut out = Vec::with_capacity(160);
        let mut headers = vec![("Content-Type", "text/plain")];
        if !keep {
            headers.push(("Connection", "close"));
        }
        http1::write_status_head(
            &mut out,
            Version::Http11,
            status,
            None,
            &headers,
            Some(body.len()),
        );
        out.extend_from_slice(body.as_bytes());
        self.finish_answer(k, out.into(), keep, status);
    }

    fn on_first_answer(
        &mut self,
        k: u32,
        w: Waiting,
        route: u32,
        ticket: u64,
        result: Result<Response, Failure>,
    ) {
        let r = match result {
            Ok(r) => r,
            Err(f) => return self.backend_failed(k, &f, w.keep),
        };
        if let Some(upgrade) = w.upgrade {
            return self.accept_bridge(k, r, w.keep, route, ticket, upgrade);
        }
        let mut r = r;
        let is_instruct_body = r
            .header("content-type")
            .is_some_and(|t| t.trim().starts_with(proto::INSTRUCT_CONTENT_TYPE));
        let instruct = if is_instruct_body {
            // Instructions in a JSON body; the body also says what the client gets.
            match proto::decode_instruct_body(&r.body) {
                Ok((i, resp)) => {
                    r.status = resp.code;
                    r.reason = resp.reason.unwrap_or_default();
                    r.headers = resp
                        .headers
                        .into_iter()
                        .map(|(n, v)| (n, v.into_bytes()))
                        .collect();
                    r.body = resp.body;
                    i
                }
                Err(e) => {
                    let f = Failure::Invalid(e.to_string());
                    return self.backend_failed(k, &f, w.keep);
                }
            }
        } else {
            let headers: Vec<(&str, &[u8])> = r
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_slice()))
                .collect();
            match proto::parse_instruct(&headers) {
                Ok(i) => i,
                Err(e) => {
                    let f = Failure::Invalid(format!("GRIP instructions: {e}"));
                    return self.backend_failed(k, &f, w.keep);
                }
            }
        };
        for c in &instruct.channels {
            if let Err(e) = validate_topic(&c.name) {
                let f = Failure::Invalid(format!("channel {:?}: {e}", c.name));
                return self.backend_failed(k, &f, w.keep);
            }
        }
        self.back_to_http(k);
        let (status, reason) = match &instruct.status {
            Some(s) => (s.code, s.reason.clone().unwrap_or_default()),
            None => (r.status, r.reason.clone()),
        };
        let passed = client_headers(&r);
        let mut hdrs: Vec<(&str, &str)> = passed.iter().map(|(n, v)| (*n, v.as_str())).collect();
        // An HTTP/1.0 client is answered with an HTTP/1.0 status line, as Pushpin does.
        let version = if w.http10 {
            Version::Http10
        } else {
            Version::Http11
        };
        match instruct.hold {
            None => {
                if !w.keep {
                    hdrs.push(("Connection", "close"));
                }
                let mut out = Vec::with_capacity(256 + r.body.len());
                // An answer to HEAD keeps the backend's Content-Length: it describes the body a
                // GET would have had.
                let length = r
                    .header("content-length")
                    .filter(|_| w.head_only)
                    .map(str::trim);
                if let Some(l) = length {
                    hdrs.push(("Content-Length", l));
                }
                let own_length = length.is_none().then_some(r.body.len());
                http1::write_status_head(
                    &mut out,
                    version,
                    status,
                    Some(&reason),
                    &hdrs,
                    own_length,
                );
                if !w.head_only {
                    out.extend_from_slice(&r.body);
                }
                self.finish_answer(k, out.into(), w.keep, status);
            }
            Some(HoldMode::Stream) => {
                let chunked = !w.http10;
                if chunked {
                    hdrs.push(("Transfer-Encoding", "chunked"));
                }
                if !chunked {
                    hdrs.push(("Connection", "close"));
                }
                let mut out = Vec::with_capacity(256 + r.body.len());
                http1::write_status_head(&mut out, version, status, Some(&reason), &hdrs, None);
                if !r.body.is_empty() {
                    if chunked {
                        http1::write_chunk(&mut out, &r.body);
                    } else {
                        out.extend_from_slice(&r.body);
                    }
                }
                let keep_alive = instruct.keep_alive.as_ref().map(|ka| {
                    let data: Arc<[u8]> = if chunked {
                        let mut c = Vec::new();
                        http1::write_chunk(&mut c, &ka.data);
                        c.into()
                    } else {
                        ka.data.clone().into()
                    };
                    Box::new(KeepAlive {
                        data,
                        every: ka.timeout_secs.max(1),
                        interval: ka.mode == KeepAliveMode::Interval,
                        last: self.now,
                    })
                });
                let mut flags = if chunked { CHUNKED } else { 0 };
                if chunked && w.keep {
                    flags |= KEEP;
                }
                let entry = keep_alive.map(|ka| GripConn {
                    ticket,
                    route,
                    phase: Phase::Stream(ka),
                });
                if !self.enter_hold(k, State::Stream, flags, entry) {
                    return;
                }
                let replay = self.subscribe_channels(k, &instruct.channels);
                self.write_all_to(k, &[&Arc::from(out)], None);
                if !replay.is_empty() {
                    self.deliver_grip(k, &replay);
                }
            }
            Some(HoldMode::Response) => {
                if !w.keep {
                    hdrs.push(("Connection", "close"));
                }
                let mut timeout = Vec::with_capacity(256 + r.body.len());
                http1::write_status_head(
                    &mut timeout,
                    version,
                    status,
                    Some(&reason),
                    &hdrs,
                    Some(r.body.len()),
                );
                timeout.extend_from_slice(&r.body);
                let secs = instruct
                    .timeout_secs
                    .map_or(self.shared.config.grip_default_timeout, u64::from)
                    as u32;
                let entry = GripConn {
                    ticket,
                    route,
                    phase: Phase::Response(Box::new(ResponseHold {
                        deadline: self.now.saturating_add(secs.max(1)),
                        timeout: timeout.into(),
                        headers: passed
                            .iter()
                            .map(|(n, v)| (Box::from(*n), Box::from(v.as_str())))
                            .collect(),
                    })),
                };
                let flags = if w.keep { KEEP } else { 0 };
                if !self.enter_hold(k, State::Poll, flags, Some(entry)) {
                    return;
                }
                let replay = self.subscribe_channels(k, &instruct.channels);
                if !replay.is_empty() {
                    self.deliver_grip(k, &replay);
                }
            }
        }
    }

    /// Subscribes a held connection to each channel (from its `prev-id` when given) and returns
    /// what it missed, in publish order.
    fn subscribe_channels(&mut self, k: u32, channels: &[proto::Channel]) -> Vec<Arc<Published>> {
        let mut replay = Vec::new();
        for c in channels {
            let since = c.prev_id.as_deref().map_or(Since::Now, Since::PublisherId);
            if self.subscription(k, &c.name).is_some() {
                continue;
            }
            match self.subscribe_conn(k, &[c.name.as_str()], since) {
                Some(sub) => replay.extend(sub.replay),
                None => return Vec::new(),
            }
        }
        replay.sort_by_key(|m| m.id);
        replay.dedup_by_key(|m| m.id);
        replay
    }

    /// Accepts (or refuses) a bridged WebSocket after the backend answered its OPEN.
    fn accept_bridge(
        &mut self,
        k: u32,
        r: Response,
        keep: bool,
        route: u32,
        ticket: u64,
        upgrade: Upgrade,
    ) {
        let Upgrade {
            key,
            offered,
            mut bridge,
        } = upgrade;
        let is_events = r
            .header("content-type")
            .is_some_and(|t| t.trim().starts_with("application/websocket-events"));
        if r.status != 200 || !is_events {
            // The backend refused the connection: its answer goes to the client as is.
            self.back_to_http(k);
            let passed = client_headers(&r);
            let mut hdrs: Vec<(&str, &str)> =
                passed.iter().map(|(n, v)| (*n, v.as_str())).collect();
            if !keep {
                hdrs.push(("Connection", "close"));
            }
            let status = if r.status == 200 { 502 } else { r.status };
            let mut out = Vec::new();
            let length = Some(r.body.len());
            http1::write_status_head(
                &mut out,
                Version::Http11,
                status,
                Some(&r.reason),
                &hdrs,
                length,
            );
            out.extend_from_slice(&r.body);
            return self.finish_answer(k, out.into(), keep, status);
        }
        let limits = event_limits(self.shared.config.grip_max_body);
        let events = match proto::decode_body(&r.body, &limits) {
            Ok(e) => e,
            Err(e) => {
                let f = Failure::Invalid(format!("websocket-events: {e}"));
                return self.backend_failed(k, &f, keep);
            }
        };
        if !matches!(events.first(), Some(WsEvent::Open)) {
            let f = Failure::Invalid("the backend's answer does not start with OPEN".into());
            return self.backend_failed(k, &f, keep);
        }
        bridge.prefix = r
            .header("sec-websocket-extensions")
            .and_then(proto::grip_message_prefix)
            .map(Into::into);
        apply_meta(&mut bridge, &r);
        bridge.in_flight = false;
        let protocol = r
            .header("sec-websocket-protocol")
            .map(str::trim)
            .filter(|p| offered.iter().any(|o| o == p));
        let mut out = Vec::with_capacity(256);
        handshake::write_accept(&mut out, &key, protocol, None);
        let entry = GripConn {
            ticket,
            route,
            phase: Phase::Ws(bridge),
        };
        if !self.enter_hold(k, State::Ws, 0, Some(entry)) {
            return;
        }
        self.send(k, &Arc::from(out));
        let rest: Vec<WsEvent<'_>> = events.into_iter().skip(1).collect();
        self.apply_events(k, &rest);
        self.flush_bridge(k);
    }

    /// The backend's answer to an event request.
    fn on_bridge_answer(&mut self, k: u32, result: Result<Response, Failure>) {
        let r = match result {
            Ok(r) if r.status == 200 => r,
            Ok(r) => {
                log::info(format_args!(
                    "GRIP: backend answered {} to events",
                    r.status
                ));
                self.shared
                    .metrics
                    .grip_backend_errors
                    .fetch_add(1, Relaxed);
                return self.close_bridge(k, CloseCode::Internal, "backend error");
            }
            Err(f) => {
                log::info(format_args!("GRIP: websocket events: {f:?}"));
                self.shared
                    .metrics
                    .grip_backend_errors
                    .fetch_add(1, Relaxed);
                return self.close_bridge(k, CloseCode::Internal, "backend unavailable");
            }
        };
        if let Some(b) = bridge(&mut self.grip, k) {
            apply_meta(b, &r);
        }
        let limits = event_limits(self.shared.config.grip_max_body);
        match proto::decode_body(&r.body, &limits) {
            Ok(events) => self.apply_events(k, &events),
            Err(e) => {
                log::info(format_args!("GRIP: backend sent bad websocket-events: {e}"));
                return self.close_bridge(k, CloseCode::Internal, "backend error");
            }
        }
        self.flush_bridge(k);
    }

    /// Closes a bridged WebSocket because of its backend; the backend is not told again.
    fn close_bridge(&mut self, k: u32, code: CloseCode, why: &str) {
        if let Some(b) = bridge(&mut self.grip, k) {
            b.told = true;
        }
        self.close_ws(k, code, why, CloseReason::Backend);
    }

    /// Carries out the events a backend sent for a bridged connection.
    fn apply_events(&mut self, k: u32, events: &[WsEvent<'_>]) {
        let Some(prefix) = bridge(&mut self.grip, k).map(|b| b.prefix.clone()) else {
            return;
        };
        for ev in events {
            let alive = self
                .conns
                .get(k as usize)
                .is_some_and(|c| c.state == State::Ws);
            if !alive {
                return;
            }
            match ev {
                WsEvent::Text(t) => {
                    let message = match prefix.as_deref() {
                        None => Some(t.as_bytes()),
                        Some(p) => match proto::split_prefix(t.as_bytes(), p) {
                            Prefixed::Control(json) => {
                                self.on_backend_control(k, json);
                                None
                            }
                            Prefixed::Message(m) => Some(m),
                            Prefixed::Unprefixed => {
                                log::debug(format_args!("GRIP: unprefixed message dropped"));
                                None
                            }
                        },
                    };
                    if let Some(m) = message {
                        self.send(k, &Arc::from(encode_frame(OpCode::Text, m)));
                    }
                }
                WsEvent::Binary(b) => {
                    // With the grip extension, binary messages carry the prefix too.
                    let data = match prefix.as_deref() {
                        Some(p) => b.strip_prefix(p.as_bytes()).unwrap_or(b),
                        None => b,
                    };
                    self.send(k, &Arc::from(encode_frame(OpCode::Binary, data)));
                }
                WsEvent::Ping(p) => self.send(k, &Arc::from(encode_frame(OpCode::Ping, p))),
                WsEvent::Pong(p) => self.send(k, &Arc::from(encode_frame(OpCode::Pong, p))),
                WsEvent::Close(c) => {
                    let frame: Arc<[u8]> = match c {
                        Some((code, reason)) => encode_close_frame(*code, reason).into(),
                        None => encode_frame(OpCode::Close, b"").into(),
                    };
                    if let Some(b) = bridge(&mut self.grip, k) {
                        b.told = true;
                    }
                    self.start_closing(k, Some(frame), CloseReason::Backend);
                    return;
                }
                WsEvent::Disconnect => {
                    if let Some(b) = bridge(&mut self.grip, k) {
                        b.told = true;
                    }
                    self.drop_conn(k, CloseReason::Backend);
                    return;
                }
                WsEvent::Open => {}
            }
        }
    }

    fn on_backend_control(&mut self, k: u32, json: &[u8]) {
        let control = match proto::decode_control(json) {
            Ok(c) => c,
            Err(e) => {
                log::info(format_args!("GRIP: control message ignored: {e}"));
                return;
            }
        };
        match control {
            Control::Subscribe { channel } => {
                if let Err(e) = validate_topic(&channel) {
                    log::info(format_args!("GRIP: cannot subscribe to {channel:?}: {e}"));
                    return;
                }
                let over = self
                    .conns
                    .get(k as usize)
                    .is_some_and(|c| c.subs.len() >= self.shared.config.max_subscriptions);
                if over {
                    log::info(format_args!("GRIP: subscription limit reached"));
                    return;
                }
                let ch = proto::Channel {
                    name: channel,
                    prev_id: None,
                    filters: Vec::new(),
                };
                self.subscribe_channels(k, std::slice::from_ref(&ch));
            }
            Control::Unsubscribe { channel } => {
                if let Some(tid) = self.subscription(k, &channel) {
                    self.unsubscribe(k, tid);
                }
            }
            Control::Detach => {
                if let Some(b) = bridge(&mut self.grip, k) {
                    b.detached = true;
                    b.pending.clear();
                }
            }
            Control::KeepAlive(ka) => {
                if let Some(b) = bridge(&mut self.grip, k) {
                    b.keep_alive = ka.map(|ka| {
                        let (op, data): (OpCode, &[u8]) = match &ka.message {
                            WsMessage::Text(t) => (OpCode::Text, t.as_bytes()),
                            WsMessage::Binary(d) => (OpCode::Binary, d),
                            WsMessage::Ping(d) => (OpCode::Ping, d),
                            WsMessage::Pong(d) => (OpCode::Pong, d),
                        };
                        (
                            Arc::from(encode_frame(op, data)),
                            ka.timeout_secs.max(1),
                            self.now,
                        )
                    });
                }
            }
        }
    }

    /// A message from a bridged client: queued as an event for the backend.
    pub(super) fn grip_client_message(&mut self, k: u32, kind: DataKind, payload: &[u8]) {
        let Some(b) = bridge(&mut self.grip, k) else {
            return;
        };
        if b.detached {
            return;
        }
        if b.pending.len() + payload.len() > self.shared.config.grip_max_body {
            // The backend is not keeping up with this client.
            self.close_bridge(k, CloseCode::TryAgainLater, "backend too slow");
            return;
        }
        match kind {
            DataKind::Text => {
                let text = std::str::from_utf8(payload).unwrap_or_default();
                proto::write_event(&mut b.pending, &WsEvent::Text(text));
            }
            DataKind::Binary => proto::write_event(&mut b.pending, &WsEvent::Binary(payload)),
        }
        self.flush_bridge(k);
    }

    /// A Ping from a bridged client (already answered): the backend gets a PING event, as
    /// Pushpin sends it.
    pub(super) fn grip_client_ping(&mut self, k: u32, payload: &[u8]) {
        let Some(b) = bridge(&mut self.grip, k) else {
            return;
        };
        if b.detached || b.pending.len() + payload.len() > self.shared.config.grip_max_body {
            return;
        }
        proto::write_event(&mut b.pending, &WsEvent::Ping(payload));
        self.flush_bridge(k);
    }

    /// A Close frame from a bridged client: the backend gets a CLOSE event.
    pub(super) fn grip_client_close(&mut self, k: u32, close: Option<(CloseCode, &str)>) {
        let Some(b) = bridge(&mut self.grip, k) else {
            return;
        };
        if !b.told && !b.client_closed {
            b.client_closed = true;
            proto::write_event(&mut b.pending, &WsEvent::Close(close));
        }
    }

    /// Sends the queued events if no request is in flight.
    fn flush_bridge(&mut self, k: u32) {
        self.post_events(k, false);
    }

    /// Sends the queued events in one request, unless one is in flight; with `even_empty`, an
    /// empty request too (`Keep-Alive-Interval`: the backend learns the connection is alive,
    /// and may answer with events).
    fn post_events(&mut self, k: u32, even_empty: bool) {
        let shared = Arc::clone(&self.shared);
        let Some(proxy) = shared.grip.as_ref() else {
            return;
        };
        let Some(g) = self.grip.get_mut(&k) else {
            return;
        };
        let (ticket, route) = (g.ticket, g.route);
        let Phase::Ws(b) = &mut g.phase else {
            return;
        };
        if b.in_flight || b.detached || (b.pending.is_empty() && !even_empty) {
            return;
        }
        let events = std::mem::take(&mut b.pending);
        let request = event_request(b, proxy.route_signature(route).as_deref(), &events);
        b.in_flight = true;
        b.last_request = self.now;
        self.submit(k, ticket, route, request, false, true);
    }

    /// Delivers the GRIP content of `run` (in publish order) to held connection `k`.
    pub(super) fn deliver_grip(&mut self, k: u32, run: &[Arc<Published>]) {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let (state, chunked) = (conn.state, conn.has(CHUNKED));
        match state {
            State::Stream => {
                conn.last_seen = self.now;
                let mut frames: Vec<&Arc<[u8]>> = Vec::new();
                let mut close = false;
                for m in run {
                    match GripContent::of(m).and_then(|g| g.stream.as_ref()) {
                        Some(StreamPart::Send { raw, chunk }) => {
                            frames.push(if chunked { chunk } else { raw })
                        }
                        Some(StreamPart::Close) => {
                            close = true;
                            break;
                        }
                        None => {}
                    }
                }
                let n = frames.len() as u64;
                if !frames.is_empty() {
                    self.deliver_all(k, &frames);
                    self.tally.delivered += n;
                }
                if close {
                    self.end_grip_stream(k);
                }
            }
            State::Poll => {
                let found = run
                    .iter()
                    .find_map(|m| GripContent::of(m).and_then(|g| g.response.as_ref()));
                if let Some(r) = found {
                    let keep = conn.has(KEEP) && !self.shared.stopping.load(Relaxed);
                    let mut merged = (**r).clone();
                    if let Some(GripConn {
                        phase: Phase::Response(hold),
                        ..
                    }) = self.grip.get(&k)
                    {
                        let headers = &hold.headers;
                        let own = std::mem::take(&mut merged.headers);
                        let mut all: Vec<(String, String)> = headers
                            .iter()
                            .filter(|(n, _)| !own.iter().any(|(o, _)| o.eq_ignore_ascii_case(n)))
                            .map(|(n, v)| (n.to_string(), v.to_string()))
                            .collect();
                        all.extend(own);
                        merged.headers = all;
                    }
                    let bytes: Arc<[u8]> = response_bytes(&merged, keep).into();
                    self.tally.delivered += 1;
                    self.finish_grip_poll(k, &bytes, keep);
                }
            }
            State::Ws => {
                let mut frames: Vec<&Arc<[u8]>> = Vec::new();
                let mut close = None;
                for m in run {
                    match GripContent::of(m).and_then(|g| g.ws.as_ref()) {
                        Some(WsPart::Frame(f)) => frames.push(f),
                        Some(WsPart::Close(f)) => {
                            close = Some(Arc::clone(f));
                            break;
                        }
                        None => {}
                    }
                }
                let n = frames.len() as u64;
                if !frames.is_empty() {
                    self.deliver_all(k, &frames);
                    self.tally.delivered += n;
                }
                if let Some(frame) = close {
                    // The client's Close reply ends the session; the backend hears a CLOSE, as
                    // Pushpin reports it.
                    if let Some(b) = bridge(&mut self.grip, k) {
                        if !b.told && !b.client_closed {
                            b.client_closed = true;
                            proto::write_event(&mut b.pending, &WsEvent::Close(None));
                        }
                    }
                    self.start_closing(k, Some(frame), CloseReason::Backend);
                }
            }
            _ => {}
        }
    }

    /// Turns connection `k`, whose backend just answered, into a held one: `state`, the `GRIP`
    /// flag and `flags`, gauges moved from `http` to the state's, and its side entry when it
    /// needs one. False if the connection is gone.
    fn enter_hold(&mut self, k: u32, state: State, flags: u16, entry: Option<GripConn>) -> bool {
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return false;
        };
        conn.state = state;
        conn.flags |= GRIP | flags;
        conn.last_seen = self.now;
        let m = &self.shared.metrics;
        m.http_connections.fetch_sub(1, Relaxed);
        if let Some(g) = super::gauge(m, state) {
            g.fetch_add(1, Relaxed);
        }
        m.grip_holds.fetch_add(1, Relaxed);
        if let Some(e) = entry {
            self.grip.insert(k, e);
        }
        true
    }

    /// Ends the hold of connection `k` (which leaves its channels) and, if it is still held in
    /// state `from`, returns it to `Http` for the client's next request. False otherwise.
    fn leave_hold(&mut self, k: u32, from: State) -> bool {
        self.leave_all_topics(k);
        self.grip.remove(&k);
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return false;
        };
        if conn.state != from {
            return false;
        }
        conn.state = State::Http;
        conn.flags &= !(KEEP | GRIP | CHUNKED);
        conn.last_seen = self.now;
        let m = &self.shared.metrics;
        if let Some(g) = super::gauge(m, from) {
            g.fetch_sub(1, Relaxed);
        }
        m.grip_holds.fetch_sub(1, Relaxed);
        m.http_connections.fetch_add(1, Relaxed);
        true
    }

    /// Ends a held stream (a published `close`): the last chunk, then the connection serves
    /// the client's next request if it allows keep-alive, else it closes.
    fn end_grip_stream(&mut self, k: u32) {
        let Some(conn) = self.conns.get(k as usize) else {
            return;
        };
        let (chunked, keep) = (conn.has(CHUNKED), conn.has(KEEP));
        if !(chunked && keep) || self.shared.stopping.load(Relaxed) {
            let last: Option<Arc<[u8]>> = chunked.then(|| Arc::from(http1::LAST_CHUNK));
            return self.start_closing(k, last, CloseReason::Backend);
        }
        if self.leave_hold(k, State::Stream) {
            self.write_all_to(k, &[&Arc::from(http1::LAST_CHUNK)], None);
        }
    }

    /// Answers a held GRIP long-poll with `bytes` (a complete response) and returns the
    /// connection to `Http`, or closes it.
    fn finish_grip_poll(&mut self, k: u32, bytes: &Arc<[u8]>, keep: bool) {
        if !self.leave_hold(k, State::Poll) {
            return;
        }
        self.write_all_to(k, &[bytes], None);
        if !keep {
            self.start_closing(k, None, CloseReason::HttpDone);
        }
    }

    /// Once a second: stream keep-alives, long-poll timeouts, bridge keep-alives.
    pub(super) fn grip_sweep(&mut self) {
        if self.grip.is_empty() {
            return;
        }
        let now = self.now;
        let mut sends: Vec<(u32, Arc<[u8]>)> = Vec::new();
        let mut timeouts: Vec<(u32, Arc<[u8]>)> = Vec::new();
        let mut pings: Vec<u32> = Vec::new();
        let mut stuck: Vec<u32> = Vec::new();
        // A request can also wait in the pool's queue behind slow backends; the worker gives
        // up a little after the backend's own deadline would have passed.
        let patience = (self.shared.config.grip_backend_timeout as u32).saturating_add(5);
        for (&k, g) in self.grip.iter_mut() {
            match &mut g.phase {
                Phase::Waiting(_) => {
                    let waited = self
                        .conns
                        .get(k as usize)
                        .map_or(0, |c| now.saturating_sub(c.last_seen));
                    if waited >= patience {
                        stuck.push(k);
                    }
                }
                Phase::Stream(ka) => {
                    let quiet = self
                        .conns
                        .get(k as usize)
                        .map_or(0, |c| now.saturating_sub(c.last_seen));
                    let due = if ka.interval {
                        now.saturating_sub(ka.last) >= ka.every
                    } else {
                        quiet >= ka.every
                    };
                    if due {
                        ka.last = now;
                        sends.push((k, Arc::clone(&ka.data)));
                    }
                }
                Phase::Response(hold) if now >= hold.deadline => {
                    timeouts.push((k, Arc::clone(&hold.timeout)));
                }
                Phase::Ws(b) => {
                    if let Some((frame, every, last)) = &mut b.keep_alive {
                        if now.saturating_sub(*last) >= *every {
                            *last = now;
                            sends.push((k, Arc::clone(frame)));
                        }
                    }
                    if b.interval > 0
                        && !b.in_flight
                        && !b.detached
                        && now.saturating_sub(b.last_request) >= b.interval
                    {
                        pings.push(k);
                    }
                }
                _ => {}
            }
        }
        for k in stuck {
            if let Some(GripConn {
                phase: Phase::Waiting(w),
                ..
            }) = self.grip.remove(&k)
            {
                self.backend_failed(k, &Failure::Timeout, w.keep);
            }
        }
        for (k, data) in sends {
            if let Some(conn) = self.conns.get_mut(k as usize) {
                if conn.state == State::Stream {
                    conn.last_seen = now;
                }
            }
            self.deliver(k, &data);
        }
        for (k, answer) in timeouts {
            let keep = self.conns.get(k as usize).is_some_and(|c| c.has(KEEP));
            self.finish_grip_poll(k, &answer, keep);
        }
        for k in pings {
            self.post_events(k, true);
        }
    }

    /// A GRIP connection is leaving (closing or dropped): forget its state; a bridged
    /// WebSocket's backend is told with CLOSE (sent earlier by the client) or DISCONNECT.
    pub(super) fn grip_forget(&mut self, k: u32) {
        if let Some(conn) = self.conns.get_mut(k as usize) {
            if conn.has(GRIP) {
                conn.flags &= !GRIP;
                self.shared.metrics.grip_holds.fetch_sub(1, Relaxed);
            }
        }
        let Some(g) = self.grip.remove(&k) else {
            return;
        };
        let mut b = match g.phase {
            Phase::Ws(b) => b,
            // The client left while the backend was deciding on its OPEN: the backend may
            // already count the connection, so it hears DISCONNECT too.
            Phase::Waiting(w) => match w.upgrade {
                Some(u) => u.bridge,
                None => return,
            },
            Phase::Stream(_) | Phase::Response(_) => return,
        };
        if b.told || b.detached {
            return;
        }
        if !b.client_closed {
            proto::write_event(&mut b.pending, &WsEvent::Disconnect);
        }
        let sig = self
            .shared
            .grip
            .as_ref()
            .and_then(|p| p.route_signature(g.route));
        let request = event_request(&b, sig.as_deref(), &b.pending);
        self.submit(k, g.ticket, g.route, request, false, false);
    }

    /// Shutdown: held streams end (with their last chunk), long-polls get their timeout answer,
    /// bridged WebSockets close with 1001.
    pub(super) fn grip_shutdown(&mut self, k: u32) {
        let Some(state) = self.conns.get(k as usize).map(|c| c.state) else {
            return;
        };
        match state {
            State::Stream => {
                let chunked = self.conns.get(k as usize).is_some_and(|c| c.has(CHUNKED));
                let last: Option<Arc<[u8]>> = chunked.then(|| Arc::from(http1::LAST_CHUNK));
                self.start_closing(k, last, CloseReason::Shutdown);
            }
            State::Poll => {
                let answer = match self.grip.get(&k) {
                    Some(GripConn {
                        phase: Phase::Response(hold),
                        ..
                    }) => Arc::clone(&hold.timeout),
                    _ => return self.drop_conn(k, CloseReason::Shutdown),
                };
                self.finish_grip_poll(k, &answer, false);
            }
            State::Ws => self.close_ws(
                k,
                CloseCode::GoingAway,
                "server shutting down",
                CloseReason::Shutdown,
            ),
            _ => self.drop_conn(k, CloseReason::Shutdown),
        }
    }
}

/// The backend's headers a client may see: not hop-by-hop, not GRIP instructions, not the
/// length (set again for what is sent).
fn client_headers(r: &Response) -> Vec<(&str, String)> {
    let hop = HopByHop::new(&r.headers);
    r.headers
        .iter()
        .filter(|(n, _)| {
            hop.forwards(n) && !is_grip_header(n) && !n.eq_ignore_ascii_case("content-length")
        })
        .map(|(n, v)| (n.as_str(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

/// The bridge of connection `k`, if it is a bridged WebSocket (a function of the table, not of
/// the worker, so the rest of the worker stays usable while it is borrowed).
fn bridge(grip: &mut std::collections::HashMap<u32, GripConn>, k: u32) -> Option<&mut Bridge> {
    match grip.get_mut(&k) {
        Some(GripConn {
            phase: Phase::Ws(b),
            ..
        }) => Some(b),
        _ => None,
    }
}

/// `Set-Meta-*` headers update the connection's meta (an empty value removes it).
fn apply_meta(b: &mut Bridge, r: &Response) {
    for (name, value) in &r.headers {
        let Some(key) = name
            .get(..9)
            .filter(|p| p.eq_ignore_ascii_case("set-meta-"))
            .and_then(|_| name.get(9..))
        else {
            if name.eq_ignore_ascii_case("keep-alive-interval") {
                b.interval = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .unwrap_or(0);
            }
            continue;
        };
        let value = String::from_utf8_lossy(value).trim().to_string();
        if value.contains(['\r', '\n']) || key.is_empty() {
            continue;
        }
        b.meta.retain(|(n, _)| !n.eq_ignore_ascii_case(key));
        if !value.is_empty() {
            b.meta.push((key.to_string(), value));
        }
    }
}

/// The answer's body when a request cannot be forwarded.
fn cannot_forward(e: HeadWriteError) -> String {
    format!("cannot forward the request: {e}")
}

/// Appends the header fields every backend request for this client carries: `Host`, the
/// client's own fields that may be forwarded, the forwarding fields with the client's address
/// appended, and `Grip-Feature`.
fn write_client_headers(
    out: &mut Vec<u8>,
    head: &RequestHead<'_>,
    host: &str,
    client_ip: &str,
    scheme: &str,
) -> Result<(), HeadWriteError> {
    http1::write_header(out, "Host", host.as_bytes())?;
    let hop = HopByHop::new(&head.headers);
    for (name, value) in &head.headers {
        // Replaced below: the extension offer by the `grip` one, the forwarding headers by
        // ours (the client's address appended).
        let replaced = [
            "sec-websocket-extensions",
            "x-forwarded-for",
            "x-forwarded-proto",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h));
        if forwardable(&hop, name) && !replaced {
            http1::write_header(out, name, String::from_utf8_lossy(value).as_bytes())?;
        }
    }
    let forwarded_for = match head.header_str("x-forwarded-for") {
        Some(prev) => format!("{prev}, {client_ip}"),
        None => client_ip.to_string(),
    };
    http1::write_header(out, "X-Forwarded-For", forwarded_for.as_bytes())?;
    http1::write_header(out, "X-Forwarded-Proto", scheme.as_bytes())?;
    http1::write_header(out, "Grip-Feature", b"status")?;
    Ok(())
}

/// A WebSocket-over-HTTP request carrying `events`.
fn event_request(b: &Bridge, sig: Option<&str>, events: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.head.len() + 128 + events.len());
    out.extend_from_slice(&b.head);
    for (name, value) in &b.meta {
        // `apply_meta` keeps only values without line breaks; a field that is still not valid
        // is left out rather than written.
        let _ = http1::write_header(&mut out, &format!("Meta-{name}"), value.as_bytes());
    }
    if let Some(sig) = sig {
        // A JWT is base64url and dots: always a valid value.
        let _ = http1::write_header(&mut out, "Grip-Sig", sig.as_bytes());
    }
    http1::write_content_length(&mut out, events.len());
    http1::end_head(&mut out);
    out.extend_from_slice(events);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn client_headers_for_the_backend() {
        let raw = b"GET /x HTTP/1.1\r\nHost: front\r\nConnection: keep-alive, X-Secret\r\n\
                    X-Secret: s\r\nX-Kept: k\r\nGrip-Sig: forged\r\nContent-Length: 0\r\n\
                    Keep-Alive: timeout=5\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n";
        let head = http1::parse_head(raw, &http1::HeadLimits::default())
            .unwrap()
            .unwrap();
        let mut out = Vec::new();
        write_client_headers(&mut out, &head, "back", "127.0.0.1", "http").unwrap();
        assert_eq!(
            out,
            b"Host: back\r\nX-Kept: k\r\nX-Forwarded-For: 10.0.0.1, 127.0.0.1\r\n\
              X-Forwarded-Proto: http\r\nGrip-Feature: status\r\n"
        );
        // A host_header that would inject a header is refused, not written.
        let mut out = Vec::new();
        assert_eq!(
            write_client_headers(&mut out, &head, "back\r\nX-Evil: 1", "127.0.0.1", "http"),
            Err(HeadWriteError::Value)
        );
        assert!(out.is_empty());
    }
}
