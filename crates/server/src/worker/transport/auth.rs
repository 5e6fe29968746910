//! Authentication as the transports apply it: checking a request before it becomes a
//! subscription (a `401`/`403` with a short JSON reason, before any `101` or stream head),
//! checking WebSocket subscribe and publish messages (an error reply; the connection stays),
//! the `auth` and `refresh` messages, and the sweep's part: warning WebSockets before their
//! token expires and ending connections whose token has expired.
//!
//! Every method is a no-op when authentication is not configured. No token, URL or query
//! string is ever logged here.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::auth::Claims;
use clarion_proto::http1::{self, RequestHead};
use clarion_proto::pubsub::control::Reply;

use crate::auth::{Identity, Refusal};
use crate::log;
use crate::worker::socket::Socket;
use crate::worker::transport::frame::{End, Framing};
use crate::worker::Engine;

/// The outcome of checking a request: who it is, or that it was refused (and answered).
pub(crate) enum Checked {
    /// Allowed; the token's claims if it carried one.
    Allowed(Option<Claims>),
    /// Allowed without topics and without a token, though anonymous access is off: a
    /// WebSocket that will send an `auth` message.
    Pending,
    /// Refused; the answer was sent.
    Refused,
    /// The application's `connect` hook is being asked; the request is routed again with its
    /// answer (`super::hooks`).
    Waiting,
}

impl<S: Socket> Engine<S> {
    /// Checks a subscription request for `topics`. On refusal answers `401`/`403` with a JSON
    /// reason. `ws_without_topics`: a WebSocket upgrade naming no topic, which may authenticate
    /// later with an `auth` message.
    pub(crate) fn check_request(
        &mut self,
        k: u32,
        head: &RequestHead<'_>,
        topics: &[&str],
        ws_without_topics: bool,
        keep: bool,
    ) -> Checked {
        if let Some(checked) = self.hook_connect(k, head, topics, keep) {
            return checked;
        }
        let shared = Arc::clone(&self.shared);
        let Some(auth) = shared.auth.as_ref() else {
            return Checked::Allowed(None);
        };
        let claims = match auth.identify(head, self.unix_now()) {
            Ok(Identity::Token(c)) => Some(c),
            Ok(Identity::Anonymous) => None,
            Err(r) if r == Refusal::MISSING && ws_without_topics => return Checked::Pending,
            Err(r) => {
                self.refuse_http(k, r, keep);
                return Checked::Refused;
            }
        };
        for topic in topics {
            if let Err(r) = auth.may_subscribe(claims.as_ref().map(|c| &c.grants), topic) {
                self.refuse_http(k, r, keep);
                return Checked::Refused;
            }
        }
        Checked::Allowed(claims)
    }

    /// Answers `401` or `403` with `{"error":"..."}` and counts the failure.
    pub(crate) fn refuse_http(&mut self, k: u32, r: Refusal, keep: bool) {
        r.count(&self.shared.metrics);
        self.shared.metrics.http_errors.fetch_add(1, Relaxed);
        log::debug(format_args!("auth: answered {}: {}", r.status, r.reason));
        let body = format!("{}\n", r.json());
        let challenge = if r.status == 403 {
            "Bearer error=\"insufficient_scope\""
        } else if r == Refusal::MISSING {
            "Bearer"
        } else {
            "Bearer error=\"invalid_token\""
        };
        let origin = self.shared.config.cors_allow_origin.clone();
        let mut headers: Vec<(&str, &str)> = vec![
            ("Content-Type", "application/json"),
            ("WWW-Authenticate", challenge),
            ("Cache-Control", "no-store"),
        ];
        if !origin.is_empty() {
            headers.push(("Access-Control-Allow-Origin", &origin));
        }
        if !keep {
            headers.push(("Connection", "close"));
        }
        let mut out = Vec::with_capacity(256);
        http1::write_response_head(&mut out, r.status, &headers, Some(body.len()));
        out.extend_from_slice(body.as_bytes());
        self.finish_answer(k, out.into(), keep, r.status);
    }

    /// Records what connection `k` (now a subscription) was allowed by: its token's expiry
    /// and grants, or the deadline to authenticate by when it is `Pending`.
    pub(crate) fn adopt(&mut self, k: u32, checked: Checked) {
        let (sub, info) = match &checked {
            Checked::Allowed(Some(c)) => (c.sub.clone(), c.info.clone()),
            Checked::Allowed(None) | Checked::Pending | Checked::Refused | Checked::Waiting => {
                (None, None)
            }
        };
        if self.shared.presence.is_some() {
            let sub = self.hook_sub(k).or(sub.as_deref().map(Arc::from));
            self.presence_identify(k, sub.as_deref(), info.as_deref());
        }
        self.hook_adopted(k, sub);
        match checked {
            Checked::Allowed(Some(claims)) => {
                let deadline = self.deadline_of(claims.exp);
                self.side.grants_mut().set(k, deadline, claims.grants);
            }
            Checked::Pending => {
                let by = self
                    .now
                    .saturating_add(self.shared.config.handshake_timeout as u32);
                self.side.grants_mut().require(k, by);
            }
            Checked::Allowed(None) | Checked::Refused | Checked::Waiting => {}
        }
    }

    /// The worker second at which a token expiring at Unix time `exp` stops being accepted.
    fn deadline_of(&self, exp: u64) -> u32 {
        let leeway = self.shared.auth.as_ref().map_or(0, |a| a.verifier.leeway);
        let secs = exp.saturating_add(leeway).saturating_sub(self.anchors.unix);
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// Whether WebSocket `k` may subscribe to `topic` now.
    pub(crate) fn ws_may_subscribe(&self, k: u32, topic: &str) -> Result<(), Refusal> {
        let Some(auth) = self.shared.auth.as_ref() else {
            // Without JWTs, only grants a `connect` hook gave limit a connection.
            return match self.side.grants().grants(k) {
                Some(g) if !g.may_subscribe(topic) => Err(Refusal::FORBIDDEN),
                _ => Ok(()),
            };
        };
        if self.side.grants().pending(k) {
            return Err(Refusal::MISSING);
        }
        auth.may_subscribe(self.side.grants().grants(k).map(|g| &**g), topic)
    }

    /// Whether WebSocket `k` may publish to `topic` in-band (client publishing is on).
    pub(crate) fn ws_may_publish(&self, k: u32, topic: &str) -> Result<(), Refusal> {
        if self.shared.auth.is_none() {
            // Without JWTs, only grants a `connect` hook gave limit a connection.
            return match self.side.grants().grants(k) {
                Some(g) if !g.may_publish(topic) => Err(Refusal::FORBIDDEN),
                _ => Ok(()),
            };
        }
        match self.side.grants().grants(k) {
            Some(g) if g.may_publish(topic) => Ok(()),
            Some(_) => Err(Refusal::FORBIDDEN),
            None => Err(Refusal::MISSING),
        }
    }

    /// An `auth` or `refresh` message: verifies the token and replaces the connection's. A
    /// refused token leaves the connection as it was (its current token, if any, still runs
    /// out at its own `exp`). Subscriptions the new token no longer grants are dropped.
    pub(crate) fn on_token_message(&mut self, k: u32, token: &str) {
        let shared = Arc::clone(&self.shared);
        let Some(auth) = shared.auth.as_ref() else {
            let error = "authentication is not configured on this server";
            return self.reply(k, &Reply::Error { error, topic: None });
        };
        let claims = match auth.verify(token, self.unix_now()) {
            Ok(c) => c,
            Err(r) => {
                r.count(&self.shared.metrics);
                return self.reply(
                    k,
                    &Reply::Error {
                        error: r.reason,
                        topic: None,
                    },
                );
            }
        };
        let (sub, exp) = (claims.sub.clone(), claims.exp);
        let grants = claims.grants.clone();
        self.adopt(k, Checked::Allowed(Some(claims)));
        self.reply(
            k,
            &Reply::Authenticated {
                sub: sub.as_deref(),
                exp,
            },
        );
        let held: Vec<(u32, Arc<str>)> = self
            .conns
            .get(k as usize)
            .map(|c| c.subs.ids())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|tid| Some((tid, self.index.name_of(tid)?)))
            .collect();
        for (tid, name) in held {
            let public = clarion_proto::auth::pattern::any_matches(&auth.public, &name);
            if !grants.may_subscribe(&name) && !public {
                self.unsubscribe(k, tid);
                let error = "the new token does not grant this topic: unsubscribed";
                self.reply(
                    k,
                    &Reply::Error {
                        error,
                        topic: Some(&name),
                    },
                );
            }
        }
    }

    /// The sweep's part: warns WebSockets whose token expires within `auth_expiry_warning`
    /// seconds, and ends connections whose token expired (WebSocket: close 4001, or 4002 when
    /// it never authenticated; SSE: an `expired` event; NDJSON: an `{"type":"expired"}` line;
    /// a held long-poll: `401`).
    pub(crate) fn auth_timers(&mut self) {
        let shared = Arc::clone(&self.shared);
        // A `connect` hook's `expires_at` ends connections as a token's `exp` does.
        if shared.auth.is_none() && shared.hooks.is_none() {
            return;
        }
        let warning = u32::try_from(shared.config.auth_expiry_warning).unwrap_or(u32::MAX);
        let due = self.side.grants_mut().due(self.now, warning);
        for (k, deadline) in due.warn {
            let takes_warning = self
                .conns
                .get(k as usize)
                .is_some_and(|c| Framing::of_transport(c.state).in_band());
            if !takes_warning {
                continue;
            }
            self.side.grants_mut().warned(k);
            let exp = self.anchors.unix + u64::from(deadline);
            let seconds = u64::from(deadline.saturating_sub(self.now));
            self.reply(k, &Reply::Expiring { exp, seconds });
        }
        for (k, pending) in due.expired {
            self.side.grants_mut().clear(k);
            let Some(state) = self.conns.get(k as usize).map(|c| c.state) else {
                continue;
            };
            self.shared.metrics.auth_failed("expired_connection");
            self.end_as(k, state, End::TokenExpired { pending });
        }
    }
}
