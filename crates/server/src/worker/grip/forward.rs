//! GRIP forwarding in the event loop: a request on a routed path goes to the backend, and its
//! answer decides what the connection becomes (`docs/grip.md`): no `Grip-Hold` passes the
//! answer through and the connection serves its next request; `Grip-Hold: stream` or
//! `response` makes it a hold ([`super::hold`]); an answer to a WebSocket upgrade's OPEN starts
//! a bridge ([`super::bridge`]).
//!
//! A connection's GRIP state beyond its record is a [`GripConn`] in the engine's `grip` table.
//! Backend exchanges run on the pool in [`crate::grip::backend`]; answers come back through the
//! worker's mailbox, matched by ticket. This module does not deliver published content.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::grip::{self as proto, Event as WsEvent, HoldMode};
use clarion_proto::http1::{self, Body, HeadWriteError, HopByHop, RequestHead, Version};
use clarion_proto::ws::handshake;

use super::conn::{
    client_headers, event_request, Answered, Bridge, GripConn, Phase, Upgrade, Waiting,
};

use crate::grip::backend::{Answer, Failure, Job, Response};
use crate::log;
use crate::worker::socket::Socket;
use crate::worker::state::{Kind, State};
use crate::worker::Engine;
use clarion_proto::pubsub::validate_topic;

/// Client headers never forwarded: hop-by-hop ones (including those the request's `Connection`
/// names), the body framing (set again), the fields Clarion writes on the same request
/// (`ours`), and every field that carries identity or instructions between Clarion and the
/// backend (see [`is_ours_to_set`]).
pub(crate) fn forwardable(hop: &HopByHop<'_>, name: &str, ours: &[(&str, &str)]) -> bool {
    hop.forwards(name)
        && !name.eq_ignore_ascii_case("content-length")
        && !name.eq_ignore_ascii_case("host")
        && !is_ours_to_set(name)
        && !ours.iter().any(|(n, _)| same_field(n, name))
}

/// Fields only Clarion may send a backend: `Meta-*` (a WebSocket-over-HTTP connection's meta),
/// `Connection-Id`, `Grip-*` (`Grip-Sig` proves the request came through Clarion). A backend
/// that takes the first of two values, or a framework that reads `Meta_User` as `Meta-User`
/// (CGI, WSGI and Rack turn both into `HTTP_META_USER`), would otherwise let a client speak
/// for Clarion; so the underscore spellings go too.
fn is_ours_to_set(name: &str) -> bool {
    let starts = |prefix: &str| {
        name.len() > prefix.len()
            && name
                .get(..prefix.len())
                .is_some_and(|p| same_field(p, prefix))
    };
    starts("meta-") || starts("grip-") || same_field(name, "connection-id")
}

/// Whether two field names are the same once case and `_`/`-` are ignored.
fn same_field(a: &str, b: &str) -> bool {
    let norm = |c: u8| {
        if c == b'_' {
            b'-'
        } else {
            c.to_ascii_lowercase()
        }
    };
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| norm(x) == norm(y))
}

impl<S: Socket> Engine<S> {
    /// If the request matches a GRIP route, forwards it and returns the bytes used (`Some(None)`
    /// while its body is incomplete); `None` when no route matches.
    pub(crate) fn grip_intercept(
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
        if !self.conns.contains(k as usize) {
            return Some(Some(total));
        }
        // An HTTP/2 stream has no socket: both come from its connection.
        let tls = self.is_tls(k);
        let client_ip = self.peer_of(k).map(|ip| ip.to_string()).unwrap_or_default();
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
            write_client_headers(&mut out, head, host_header, &client_ip, scheme, extra)?;
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
            let request = event_request(
                &bridge,
                proxy.signature(route, self.unix_now()).as_deref(),
                &open,
            );
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
            let sig = proxy.signature(route, self.unix_now());
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
        conn.last_seen = self.now;
        self.set_state(k, State::Proxy);
        self.side.grip_mut().insert(
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
    pub(crate) fn continue_if_expected(&mut self, k: u32, head: &RequestHead<'_>, data: &[u8]) {
        if data.len() == head.head_len && head.has_token("expect", "100-continue") {
            self.send(k, &Arc::from(&b"HTTP/1.1 100 Continue\r\n\r\n"[..]));
        }
    }

    /// Hands a request for connection `k` to the backend pool; its answer comes back to this
    /// worker unless `answer` is false (a notice nobody waits for).
    pub(crate) fn submit(
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
    pub(crate) fn grip_answers(&mut self) {
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

    pub(crate) fn on_answer(&mut self, a: Answer) {
        let Some(g) = self.side.grip_mut().get_mut(&a.key) else {
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
            .is_some_and(|c| c.input.is_some() && matches!(c.state.kind(), Kind::Http | Kind::Ws));
        if waiting {
            self.consume(k, &mut []);
        }
    }

    pub(crate) fn apply_answer(&mut self, k: u32, a: Answer) {
        let Some(g) = self.side.grip_mut().get_mut(&k) else {
            return;
        };
        match &mut g.phase {
            Phase::Waiting(_) => {
                let Some(GripConn {
                    phase: Phase::Waiting(w),
                    route,
                    ticket,
                }) = self.side.grip_mut().remove(&k)
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
    pub(crate) fn back_to_http(&mut self, k: u32) {
        if let Some(conn) = self.conns.get_mut(k as usize) {
            if conn.state.kind() == Kind::Proxy {
                conn.last_seen = self.now;
                self.set_state(k, State::Http);
            }
        }
    }

    /// Answers a request whose backend exchange failed. The client gets Pushpin's words (a 502
    /// body that names no backend address); the log gets the reason.
    pub(crate) fn backend_failed(&mut self, k: u32, f: &Failure, keep: bool) {
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

    pub(crate) fn on_first_answer(
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
        // An HTTP/1.0 client is answered with an HTTP/1.0 status line, as Pushpin does.
        let version = if w.http10 {
            Version::Http10
        } else {
            Version::Http11
        };
        match instruct.hold {
            None => {
                let mut hdrs: Vec<(&str, &str)> =
                    passed.iter().map(|(n, v)| (*n, v.as_str())).collect();
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
            Some(mode) => {
                let answered = Answered {
                    status,
                    reason: &reason,
                    passed: &passed,
                    body: &r.body,
                    ticket,
                    route,
                    keep: w.keep,
                    version,
                };
                match mode {
                    HoldMode::Stream => self.hold_stream(k, &answered, &instruct),
                    HoldMode::Response => self.hold_response(k, &answered, &instruct),
                }
            }
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
    ours: &[(&str, &str)],
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
        if forwardable(&hop, name, ours) && !replaced {
            http1::write_header(out, name, String::from_utf8_lossy(value).as_bytes())?;
        }
    }
    // Never an empty last entry: a backend that trusts one proxy reads the last one, and an
    // empty one would hand it the client's own (forgeable) value.
    let client_ip = if client_ip.is_empty() {
        "unknown"
    } else {
        client_ip
    };
    let forwarded_for = match head.header_str("x-forwarded-for") {
        Some(prev) => format!("{prev}, {client_ip}"),
        None => client_ip.to_string(),
    };
    http1::write_header(out, "X-Forwarded-For", forwarded_for.as_bytes())?;
    http1::write_header(out, "X-Forwarded-Proto", scheme.as_bytes())?;
    http1::write_header(out, "Grip-Feature", b"status")?;
    Ok(())
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
        write_client_headers(&mut out, &head, "back", "127.0.0.1", "http", &[]).unwrap();
        assert_eq!(
            out,
            b"Host: back\r\nX-Kept: k\r\nX-Forwarded-For: 10.0.0.1, 127.0.0.1\r\n\
              X-Forwarded-Proto: http\r\nGrip-Feature: status\r\n"
        );
        // A host_header that would inject a header is refused, not written.
        let mut out = Vec::new();
        assert_eq!(
            write_client_headers(
                &mut out,
                &head,
                "back\r\nX-Evil: 1",
                "127.0.0.1",
                "http",
                &[]
            ),
            Err(HeadWriteError::Value)
        );
        assert!(out.is_empty());
    }

    #[test]
    fn an_unknown_client_address_is_never_an_empty_last_entry() {
        let raw = b"GET /x HTTP/1.1\r\nHost: front\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n";
        let head = http1::parse_head(raw, &http1::HeadLimits::default())
            .unwrap()
            .unwrap();
        let mut out = Vec::new();
        write_client_headers(&mut out, &head, "back", "", "https", &[]).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("X-Forwarded-For: 6.6.6.6, unknown\r\n"),
            "{out}"
        );
    }

    #[test]
    fn a_client_cannot_speak_for_clarion() {
        let raw = b"GET /ws HTTP/1.1\r\nHost: front\r\nMeta-User: admin\r\nmeta_role: root\r\n\
                    Connection-Id: victim-42\r\nConnection_ID: victim-43\r\nGrip_Sig: forged\r\n\
                    grip-last: x\r\nContent-Type: text/evil\r\nAccept: a/b\r\n\
                    Metadata: kept\r\nX-Meta-Kept: k\r\n\r\n";
        let head = http1::parse_head(raw, &http1::HeadLimits::default())
            .unwrap()
            .unwrap();
        // What a WebSocket-over-HTTP request writes itself goes out once, with its value.
        let ours = [
            ("Connection-Id", "real"),
            ("Content-Type", "application/websocket-events"),
            ("Accept", "application/websocket-events"),
        ];
        let mut out = Vec::new();
        write_client_headers(&mut out, &head, "back", "127.0.0.1", "http", &ours).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Host: back\r\nMetadata: kept\r\nX-Meta-Kept: k\r\nX-Forwarded-For: 127.0.0.1\r\n\
             X-Forwarded-Proto: http\r\nGrip-Feature: status\r\n"
        );
        // A plain forwarded request keeps the client's own Content-Type and Accept.
        let mut out = Vec::new();
        write_client_headers(&mut out, &head, "back", "127.0.0.1", "http", &[]).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("Content-Type: text/evil\r\nAccept: a/b\r\n"),
            "{out}"
        );
        assert!(!out.to_ascii_lowercase().contains("meta-user") && !out.contains("meta_role"));
        assert!(!out.contains("victim") && !out.contains("forged") && !out.contains("grip-last"));
    }
}
