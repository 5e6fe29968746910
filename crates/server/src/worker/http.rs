//! Request heads on the client listener: routing, error answers, and the WebSocket upgrade.
//!
//! Every request is answered: a parse error or a limit maps to its status (400, 414, 431, 505),
//! an unknown path to 404, a wrong method to 405, a plain GET on a WebSocket path to 426, and a
//! connection over the cap to 503. Ordinary answers keep the connection alive when the client
//! allows it; answers to broken heads close it.

use std::borrow::Cow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::http1::{self, Body, RequestHead};
use clarion_proto::ws::handshake::{self, HandshakeError};

use super::conn::{State, ECHO, ENVELOPE};
use super::Worker;
use crate::hub::validate_topic;
use crate::log;
use crate::metrics::CloseReason;

/// The subprotocol that wraps deliveries in a JSON envelope (`docs/protocol.md`).
pub const ENVELOPE_PROTOCOL: &str = "clarion.v1";

/// What a WebSocket endpoint does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    PubSub,
    Echo,
}

impl Worker {
    /// Parses one request head from `data` and answers it. Returns the bytes used, or `None` when
    /// the head is incomplete.
    pub(super) fn on_http(&mut self, k: u32, data: &[u8]) -> Option<usize> {
        let limits = self.shared.config.head_limits();
        match http1::parse_head(data, &limits) {
            Ok(None) => None,
            Err(e) => {
                log::debug(format_args!("bad request head: {e}"));
                self.respond(k, e.status(), &[], &e.to_string(), false);
                Some(data.len())
            }
            Ok(Some(head)) => {
                let used = head.head_len;
                self.route(k, &head);
                Some(used)
            }
        }
    }

    fn route(&mut self, k: u32, head: &RequestHead<'_>) {
        let refusing = self
            .conns
            .get(k as usize)
            .is_some_and(|c| c.state == State::Refusing);
        if refusing {
            self.respond(
                k,
                503,
                &[("Retry-After", "5")],
                "server at its connection limit",
                false,
            );
            return;
        }
        let keep = head.keep_alive();
        match head.body() {
            Ok(Body::None) => {}
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
        let path = head.path();
        let cfg = &self.shared.config;
        let endpoint = if path == cfg.ws_path {
            Endpoint::PubSub
        } else if cfg.echo_path.as_deref() == Some(path) {
            Endpoint::Echo
        } else {
            self.respond(k, 404, &[], "not found", keep);
            return;
        };
        if head.method != "GET" {
            self.respond(
                k,
                405,
                &[("Allow", "GET")],
                "WebSocket endpoints take GET",
                keep,
            );
            return;
        }
        let upgrade = match handshake::validate(head) {
            Ok(u) => u,
            Err(e) => {
                let headers: &[(&str, &str)] = match e {
                    HandshakeError::UnsupportedVersion => {
                        &[("Sec-WebSocket-Version", "13"), ("Upgrade", "websocket")]
                    }
                    HandshakeError::NotUpgrade => &[("Upgrade", "websocket")],
                    _ => &[],
                };
                self.respond(k, e.status(), headers, &e.to_string(), keep);
                return;
            }
        };
        let topics = match endpoint {
            Endpoint::PubSub => match self.url_topics(head.query()) {
                Ok(t) => t,
                Err(why) => {
                    self.respond(k, 400, &[], &why, keep);
                    return;
                }
            },
            Endpoint::Echo => Vec::new(),
        };
        let envelope =
            endpoint == Endpoint::PubSub && upgrade.protocols.contains(&ENVELOPE_PROTOCOL);
        let mut out = Vec::with_capacity(160);
        handshake::write_accept(&mut out, upgrade.key, envelope.then_some(ENVELOPE_PROTOCOL));
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        conn.state = State::Ws;
        conn.last_seen = self.now;
        conn.flags |= match endpoint {
            Endpoint::Echo => ECHO,
            Endpoint::PubSub if envelope => ENVELOPE,
            Endpoint::PubSub => 0,
        };
        let m = &self.shared.metrics;
        m.http_connections.fetch_sub(1, Relaxed);
        m.ws_connections.fetch_add(1, Relaxed);
        self.send(k, &Arc::from(out));
        for t in topics {
            self.subscribe(k, &t);
        }
    }

    /// The `topic=` parameters of a query string, validated and without duplicates.
    fn url_topics<'q>(&self, query: &'q str) -> Result<Vec<Cow<'q, str>>, String> {
        let mut topics: Vec<Cow<'q, str>> = Vec::new();
        for pair in http1::query_pairs(query) {
            let (key, value) = pair.map_err(|e| format!("invalid query string: {e}"))?;
            if key != "topic" {
                continue;
            }
            validate_topic(&value).map_err(|e| format!("invalid topic {value:?}: {e}"))?;
            if !topics.contains(&value) {
                topics.push(value);
            }
        }
        if topics.len() > self.shared.config.max_subscriptions {
            return Err(format!(
                "too many topics: at most {} per connection",
                self.shared.config.max_subscriptions
            ));
        }
        Ok(topics)
    }

    /// Answers with `status` and a short plain-text body; closes afterwards unless `keep`.
    pub(super) fn respond(
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
        let out: Arc<[u8]> = out.into();
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
}
