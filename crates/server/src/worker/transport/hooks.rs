//! Backend hooks as the transports apply them (`docs/hooks.md`): asking the application's
//! `connect` hook before a request becomes a subscription (any transport), and its `subscribe`
//! and `publish` hooks for WebSocket control messages its grants do not cover.
//!
//! The worker never waits. A request waiting for `connect` sits in the `Proxy` state with its
//! head kept here; when the answer arrives (the worker's hook mailbox, matched by ticket) the
//! verdict is recorded and the head is routed again, so every transport takes its ordinary
//! path with the verdict standing in for the authentication check. A control message waiting
//! for `subscribe`/`publish` is kept likewise and run again with its verdict; the connection's
//! later control messages queue behind it, so a client's messages keep their order.
//!
//! Only servers with hooks fill these tables: without them every entry point is a map lookup
//! on an empty table or a `None` check.
#![deny(clippy::wildcard_enum_match_arm)]

use std::collections::HashMap;
use std::sync::Arc;

use clarion_proto::auth::{pattern::any_matches, Claims};
use clarion_proto::hooks::{self as proto, Check};
use clarion_proto::http1::{self, RequestHead};
use clarion_proto::pubsub::control::Reply;

use crate::grip::backend::Answer;
use crate::hooks::{Hook, NotCalled};
use crate::log;
use crate::worker::socket::Socket;
use crate::worker::state::{Kind, State};
use crate::worker::transport::auth::Checked;
use crate::worker::transport::frame::Framing;
use crate::worker::transport::hook_answers::{
    body_of, connect_verdict, not_called, transport_of, ConnectVerdict, ADDRESS_BUSY,
};
use crate::worker::Engine;

/// Control messages a connection may send while one waits for a hook; past it they are
/// answered with an error. Enough for a page subscribing to its topics at once.
const MAX_QUEUED: usize = 64;

/// What the hooks of one worker's connections are waiting for or were told.
#[derive(Default)]
pub(crate) struct HookTable {
    waits: HashMap<u32, Wait>,
    verdicts: HashMap<u32, Verdict>,
    ids: HashMap<u32, Arc<Ident>>,
    extra: HashMap<u32, Vec<String>>,
    /// Connections the webhook was told about (`connected`), for their `disconnected`.
    live: HashMap<u32, Live>,
    /// The request head being routed, copied only when a `connect` hook is configured (it is
    /// what a waiting request is routed from again).
    pub(crate) head: Vec<u8>,
}

impl HookTable {
    /// Forgets connection `k` (it closed; its slab key will be reused).
    pub(crate) fn forget(&mut self, k: u32) {
        if self.waits.is_empty()
            && self.ids.is_empty()
            && self.extra.is_empty()
            && self.live.is_empty()
        {
            return;
        }
        self.live.remove(&k);
        self.waits.remove(&k);
        self.verdicts.remove(&k);
        self.ids.remove(&k);
        self.extra.remove(&k);
    }

    /// Whether connection `k` waits for a hook's answer (a hand-over cannot carry the call).
    pub(crate) fn waiting_for(&self, k: u32) -> bool {
        self.waits.contains_key(&k)
    }

    /// What the hooks know of connection `k`, for a hand-over: the identity a `connect` hook
    /// gave (`sub`, `info`), and the `connected` webhook's connection id, `sub` and the
    /// worker second it was accepted.
    #[allow(clippy::type_complexity)]
    pub(crate) fn export(
        &self,
        k: u32,
    ) -> (
        Option<(Option<String>, Option<String>)>,
        Option<(Arc<str>, Option<String>, u32)>,
    ) {
        let ident = self.ids.get(&k).map(|i| (i.sub.clone(), i.info.clone()));
        let live = self
            .live
            .get(&k)
            .map(|l| (Arc::clone(&l.conn), l.sub.clone(), l.since));
        (ident, live)
    }

    /// Restores what [`HookTable::export`] gave, for connection `k` arriving in a hand-over.
    pub(crate) fn import(
        &mut self,
        k: u32,
        ident: Option<(Option<String>, Option<String>)>,
        live: Option<(Arc<str>, Option<String>, u32)>,
    ) {
        if let Some((sub, info)) = ident {
            self.ids.insert(k, Arc::new(Ident { sub, info }));
        }
        if let Some((conn, sub, since)) = live {
            self.live.insert(k, Live { conn, sub, since });
        }
    }

    /// Connections waiting for a hook.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waits.len()
    }
}

/// A connection the webhook was told about.
struct Live {
    conn: Arc<str>,
    sub: Option<String>,
    /// The worker second it was accepted.
    since: u32,
}

/// Who the `connect` hook said a connection is.
struct Ident {
    sub: Option<String>,
    info: Option<String>,
}

struct Wait {
    ticket: u64,
    hook: Hook,
    what: What,
    queued: Vec<Box<[u8]>>,
}

enum What {
    /// A request head to route again, and the question (the cache key).
    Connect { head: Box<[u8]>, question: Vec<u8> },
    /// A control message to run again.
    Control {
        text: Box<[u8]>,
        topic: String,
        question: Vec<u8>,
    },
}

enum Verdict {
    Connect(ConnectVerdict),
    /// `subscribe`/`publish` allowed `topic` (with a publish's replacement data).
    Allowed {
        hook: Hook,
        topic: String,
        data: Option<String>,
    },
    /// The hook failed and the policy is `token`: the ordinary checks decide.
    Fallback,
}

/// What a control message does about the `subscribe`/`publish` hook.
pub(crate) enum Gate {
    /// No hook applies: the ordinary checks decide.
    Pass,
    /// The hook allowed it (a publish may carry replacement data).
    Approved(Option<String>),
    /// The hook was asked; the message runs again with the answer.
    Waiting,
    /// Refused, with the reason for the client.
    Refused(String),
}

impl<S: Socket> Engine<S> {
    /// Copies the head of the request about to be routed, when a `connect` hook may need it.
    pub(crate) fn hook_keep_head(&mut self, head: &[u8]) {
        if self
            .shared
            .hooks
            .as_ref()
            .is_some_and(|h| h.connect.is_some())
        {
            self.side.hooks_mut().head.clear();
            self.side.hooks_mut().head.extend_from_slice(head);
        }
    }

    /// The `connect` hook's part of checking a request: `None` when it does not apply (no
    /// hook; a token that decides alone), else the outcome (`Checked::Waiting` while the
    /// application is asked).
    pub(crate) fn hook_connect(
        &mut self,
        k: u32,
        head: &RequestHead<'_>,
        topics: &[&str],
        keep: bool,
    ) -> Option<Checked> {
        let shared = Arc::clone(&self.shared);
        let hooks = shared.hooks.as_ref()?;
        hooks.connect.as_ref()?;
        let now = self.unix_now();
        let token = shared.auth.as_ref().and_then(|a| match a.token_of(head) {
            Ok(t) => t.map(|t| a.verify(&t, now)),
            Err(refused) => Some(Err(refused)),
        });
        let valid: Option<Claims> = match token {
            // A bad token is refused by the ordinary check, hook or not.
            Some(Err(_)) => return None,
            Some(Ok(c)) if !hooks.call_with_token => {
                let _ = c;
                return None;
            }
            Some(Ok(c)) => Some(c),
            None => None,
        };
        let verdict = match self.side.hooks_mut().verdicts.remove(&k) {
            Some(Verdict::Connect(v)) => v,
            _ => {
                let question = self.connect_request(k, head, topics, valid.as_ref());
                if let Some(body) = hooks.cached(Hook::Connect, &question, now) {
                    connect_verdict(&body).0
                } else {
                    let ticket = hooks.ticket();
                    let peer = self.conns.get(k as usize).map_or(0, |c| c.peer);
                    match hooks.call(self.id, k, peer, ticket, Hook::Connect, &question, now) {
                        Ok(()) => {
                            let wait = Wait {
                                ticket,
                                hook: Hook::Connect,
                                what: What::Connect {
                                    head: self.side.hooks_mut().head.as_slice().into(),
                                    question,
                                },
                                queued: Vec::new(),
                            };
                            self.side.hooks_mut().waits.insert(k, wait);
                            self.set_state(k, State::Proxy);
                            return Some(Checked::Waiting);
                        }
                        Err(NotCalled::AddressBusy) => ConnectVerdict::AddressBusy,
                        Err(
                            why @ (NotCalled::Busy
                            | NotCalled::Unconfigured
                            | NotCalled::Unwritable),
                        ) => {
                            hooks.count(Hook::Connect, 2, 0);
                            ConnectVerdict::Failed(not_called(why).into())
                        }
                    }
                }
            }
        };
        match verdict {
            ConnectVerdict::Allow(a) => {
                let public = |t: &str| {
                    shared
                        .auth
                        .as_ref()
                        .is_some_and(|auth| any_matches(&auth.public, t))
                };
                if let Some(g) = &a.grants {
                    if topics.iter().any(|t| !g.may_subscribe(t) && !public(t)) {
                        let why = "the application does not grant this topic";
                        self.hook_refuse(k, 403, why, keep);
                        return Some(Checked::Refused);
                    }
                }
                let a = *a;
                if !a.topics.is_empty() {
                    self.side.hooks_mut().extra.insert(k, a.topics);
                }
                if a.sub.is_some() || a.info.is_some() {
                    let ident = Ident {
                        sub: a.sub.clone(),
                        info: a.info,
                    };
                    self.side.hooks_mut().ids.insert(k, Arc::new(ident));
                }
                let claims = match (a.grants, valid) {
                    (Some(grants), token) => Some(Claims {
                        sub: a.sub,
                        exp: a
                            .expires_at
                            .or(token.map(|t| t.exp))
                            .unwrap_or(u64::from(u32::MAX) + self.anchors.unix),
                        nbf: None,
                        iat: None,
                        grants,
                        admin: false,
                        info: None,
                    }),
                    (None, Some(mut token)) => {
                        if let Some(e) = a.expires_at {
                            token.exp = token.exp.min(e);
                        }
                        Some(token)
                    }
                    (None, None) => None,
                };
                Some(Checked::Allowed(claims))
            }
            ConnectVerdict::Refuse { status, reason } => {
                self.hook_refuse(k, status, &reason, keep);
                Some(Checked::Refused)
            }
            ConnectVerdict::Failed(why) => {
                log::warn(format_args!("connect hook failed: {why}"));
                if hooks.fail_to_token && valid.is_some() {
                    return Some(Checked::Allowed(valid));
                }
                let why = "the application could not be asked; retry later";
                if transport_of(head, &shared.config) == "sse" {
                    // An EventSource gives up for good on a 503: tell it when to come back.
                    self.sse_unavailable(k, why);
                } else {
                    self.hook_refuse(k, 503, why, keep);
                }
                Some(Checked::Refused)
            }
            ConnectVerdict::AddressBusy => {
                // The call could not be made, as for any failure; the answer says why.
                if hooks.fail_to_token && valid.is_some() {
                    return Some(Checked::Allowed(valid));
                }
                if transport_of(head, &shared.config) == "sse" {
                    self.sse_unavailable(k, ADDRESS_BUSY);
                } else {
                    self.hook_refuse(k, 429, ADDRESS_BUSY, keep);
                }
                Some(Checked::Refused)
            }
        }
    }

    /// The `connect` request's JSON for `head`.
    fn connect_request(
        &self,
        k: u32,
        head: &RequestHead<'_>,
        topics: &[&str],
        token: Option<&Claims>,
    ) -> Vec<u8> {
        let hooks = self.shared.hooks.as_ref();
        let remote = self.peer_of(k).map(|ip| ip.to_string()).unwrap_or_default();
        let cookies = head
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
            .filter_map(|(_, v)| std::str::from_utf8(v).ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| {
                let (n, v) = pair.split_once('=')?;
                Some((n.trim(), v.trim().trim_matches('"')))
            })
            .collect();
        let headers = head
            .headers
            .iter()
            .filter(|(n, _)| {
                hooks.is_some_and(|h| h.headers.iter().any(|w| w.eq_ignore_ascii_case(n)))
            })
            .filter_map(|(n, v)| Some((n.to_ascii_lowercase(), std::str::from_utf8(v).ok()?)))
            .collect();
        proto::ConnectRequest {
            transport: transport_of(head, &self.shared.config),
            remote_addr: &remote,
            path: head.path(),
            query: http1::query_pairs(head.query())
                .flatten()
                .map(|(a, b)| (a.into_owned(), b.into_owned()))
                .collect(),
            topics: topics.to_vec(),
            cookies,
            headers,
            token_sub: token.and_then(|t| t.sub.as_deref()),
        }
        .encode()
    }

    /// Answers a refused request with `status` and `{"error": reason}` (`Retry-After` on a
    /// `503` or `429`).
    fn hook_refuse(&mut self, k: u32, status: u16, reason: &str, keep: bool) {
        self.shared
            .metrics
            .http_errors
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        log::debug(format_args!("connect hook: answered {status}: {reason}"));
        let body = format!("{}\n", serde_json::json!({ "error": reason }));
        let origin = self.shared.config.cors_allow_origin.clone();
        let mut headers: Vec<(&str, &str)> = vec![
            ("Content-Type", "application/json"),
            ("Cache-Control", "no-store"),
        ];
        if status == 503 || status == 429 {
            headers.push(("Retry-After", "1"));
        }
        if !origin.is_empty() {
            headers.push(("Access-Control-Allow-Origin", &origin));
        }
        if !keep {
            headers.push(("Connection", "close"));
        }
        let mut out = Vec::with_capacity(256);
        http1::write_response_head(&mut out, status, &headers, Some(body.len()));
        out.extend_from_slice(body.as_bytes());
        self.finish_answer(k, out.into(), keep, status);
    }

    /// Topics the `connect` answer said to subscribe connection `k` to at once.
    pub(crate) fn hook_topics(&mut self, k: u32) -> Vec<String> {
        if self.side.hooks().extra.is_empty() {
            return Vec::new();
        }
        self.side.hooks_mut().extra.remove(&k).unwrap_or_default()
    }

    /// Whether connection `k`'s control message must wait behind a hook call; if so it is
    /// queued (or refused when too many wait).
    pub(crate) fn hook_queue(&mut self, k: u32, text: &[u8]) -> bool {
        let Some(w) = self.side.hooks_mut().waits.get_mut(&k) else {
            return false;
        };
        if w.queued.len() >= MAX_QUEUED {
            let error = "too many messages waiting for the application's answer";
            self.reply(k, &Reply::Error { error, topic: None });
        } else {
            w.queued.push(text.into());
        }
        true
    }

    /// The `subscribe`/`publish` hook's part of a control message for `topic` (`text` is the
    /// whole message, run again when the answer arrives).
    pub(crate) fn hook_gate(
        &mut self,
        k: u32,
        hook: Hook,
        topic: &str,
        text: &[u8],
        data: Option<(&str, Option<&str>)>,
    ) -> Gate {
        let shared = Arc::clone(&self.shared);
        let Some(hooks) = shared.hooks.as_ref() else {
            return Gate::Pass;
        };
        if hooks.target(hook).is_none() {
            return Gate::Pass;
        }
        match self.side.hooks_mut().verdicts.remove(&k) {
            Some(Verdict::Allowed {
                hook: h,
                topic: t,
                data,
            }) if h == hook && t == topic => return Gate::Approved(data),
            Some(Verdict::Fallback) => return Gate::Pass,
            _ => {}
        }
        let granted = self.side.grants().grants(k).is_some_and(|g| match hook {
            Hook::Subscribe => g.may_subscribe(topic),
            Hook::Connect | Hook::Publish => g.may_publish(topic),
        });
        let public = hook == Hook::Subscribe
            && shared
                .auth
                .as_ref()
                .is_some_and(|a| any_matches(&a.public, topic));
        if granted || public {
            return Gate::Pass;
        }
        let ident = self.side.hooks().ids.get(&k).cloned();
        let sub = ident.as_ref().and_then(|i| i.sub.as_deref());
        let info = ident.as_ref().and_then(|i| i.info.as_deref());
        let mut question = Vec::with_capacity(64);
        question.extend_from_slice(sub.unwrap_or_default().as_bytes());
        question.push(0);
        question.extend_from_slice(topic.as_bytes());
        let now = self.unix_now();
        if let Some(body) = hooks.cached(hook, &question, now) {
            return match proto::decode_check(&body, hooks.max_answer) {
                Ok(Check::Allow { data }) => Gate::Approved(data),
                Ok(Check::Refuse { reason }) => Gate::Refused(reason),
                Err(_) => Gate::Pass,
            };
        }
        let kind = if hook == Hook::Subscribe {
            "subscribe"
        } else {
            "publish"
        };
        let body = proto::encode_check(kind, sub, info, topic, data);
        let ticket = hooks.ticket();
        let peer = self.conns.get(k as usize).map_or(0, |c| c.peer);
        if let Err(why) = hooks.call(self.id, k, peer, ticket, hook, &body, now) {
            let refused = match why {
                // One client's burst: its own answer says so, without a warning per message.
                NotCalled::AddressBusy => ADDRESS_BUSY,
                NotCalled::Busy | NotCalled::Unconfigured | NotCalled::Unwritable => {
                    hooks.count(hook, 2, 0);
                    log::warn(format_args!("{kind} hook: {}", not_called(why)));
                    "the application could not be asked; retry later"
                }
            };
            return if hooks.fail_to_token {
                Gate::Pass
            } else {
                Gate::Refused(refused.into())
            };
        }
        let what = What::Control {
            text: text.into(),
            topic: topic.to_owned(),
            question,
        };
        let wait = Wait {
            ticket,
            hook,
            what,
            queued: Vec::new(),
        };
        self.side.hooks_mut().waits.insert(k, wait);
        Gate::Waiting
    }

    /// Tells the webhook that connection `k` was accepted as `sub` (WebSockets and streams;
    /// a long-poll is a request, not a connection, and is not reported).
    pub(crate) fn hook_adopted(&mut self, k: u32, sub: Option<String>) {
        let Some(w) = self.shared.hooks.as_ref().and_then(|h| h.webhooks.as_ref()) else {
            return;
        };
        let Some(transport) = self
            .conns
            .get(k as usize)
            .and_then(|c| Framing::of_transport(c.state).hook_name())
        else {
            return;
        };
        let sub = self
            .side
            .hooks()
            .ids
            .get(&k)
            .and_then(|i| i.sub.clone())
            .or(sub);
        let conn = w.conn_id();
        let event = clarion_proto::hooks::Event::Connected {
            conn: &conn,
            sub: sub.as_deref(),
            transport,
        };
        w.emit(&event, self.unix_now());
        let since = self.now;
        self.side
            .hooks_mut()
            .live
            .insert(k, Live { conn, sub, since });
    }

    /// The identity a `connect` hook gave connection `k`, if any.
    pub(crate) fn hook_sub(&self, k: u32) -> Option<Arc<str>> {
        if self.side.hooks().ids.is_empty() {
            return None;
        }
        self.side.hooks().ids.get(&k)?.sub.as_deref().map(Arc::from)
    }

    /// Tells the webhook that connection `k` ended, if it was told it began.
    pub(crate) fn hook_gone(&mut self, k: u32, reason: crate::metrics::CloseReason) {
        if self.side.hooks().live.is_empty() {
            return;
        }
        let Some(live) = self.side.hooks_mut().live.remove(&k) else {
            return;
        };
        let Some(w) = self.shared.hooks.as_ref().and_then(|h| h.webhooks.as_ref()) else {
            return;
        };
        let event = clarion_proto::hooks::Event::Disconnected {
            conn: &live.conn,
            sub: live.sub.as_deref(),
            reason: reason.label(),
            duration: u64::from(self.now.saturating_sub(live.since)),
        };
        w.emit(&event, self.unix_now());
    }

    /// Connection `k` of this worker joined or left `topic` (occupancy webhooks; Pusher's for a
    /// Pusher connection).
    pub(crate) fn hook_topic(&mut self, k: u32, topic: &Arc<str>, joined: bool) {
        if self
            .shared
            .hooks
            .as_ref()
            .is_some_and(|h| h.pusher.is_some())
        {
            self.pusher_hook_topic(k, topic, joined);
        }
        if let Some(w) = self.shared.hooks.as_ref().and_then(|h| h.webhooks.as_ref()) {
            if self.handing_over {
                // A hand-over moves subscribers, it does not make or end them: the old
                // process forgets them without `topic_vacated`, the new one counts them
                // without `topic_occupied`.
                if joined {
                    w.count_topic(topic);
                }
                return;
            }
            w.topic(topic, joined, self.unix_now());
        }
    }

    /// Applies the hook answers this worker received.
    pub(crate) fn hook_answers(&mut self) {
        let Some(mailbox) = self
            .shared
            .hooks
            .as_ref()
            .and_then(|h| h.mailboxes.get(self.id).cloned())
        else {
            return;
        };
        for answer in mailbox.take() {
            if let Some(h) = self.shared.hooks.as_ref() {
                h.done(answer.ticket);
            }
            self.on_hook_answer(answer);
        }
    }

    /// One hook answer: the verdict is recorded and the waiting request or message runs again.
    pub(crate) fn on_hook_answer(&mut self, a: Answer) {
        let shared = Arc::clone(&self.shared);
        let Some(hooks) = shared.hooks.as_ref() else {
            return;
        };
        let k = a.key;
        if self
            .side
            .hooks()
            .waits
            .get(&k)
            .is_none_or(|w| w.ticket != a.ticket)
        {
            return;
        }
        let Some(w) = self.side.hooks_mut().waits.remove(&k) else {
            return;
        };
        let now = self.unix_now();
        let body = body_of(a.result);
        match w.what {
            What::Connect { head, question } => {
                let verdict = match body {
                    Ok(b) => {
                        let (v, outcome) = connect_verdict(&b);
                        if outcome < 2 {
                            hooks.remember(Hook::Connect, question, &b, outcome == 1, now);
                        }
                        hooks.count(Hook::Connect, outcome, a.elapsed_us);
                        v
                    }
                    Err(why) => {
                        hooks.count(Hook::Connect, 2, a.elapsed_us);
                        ConnectVerdict::Failed(why)
                    }
                };
                if self.conns.get(k as usize).map(|c| c.state.kind()) != Some(Kind::Proxy) {
                    return;
                }
                self.set_state(k, State::Http);
                self.side
                    .hooks_mut()
                    .verdicts
                    .insert(k, Verdict::Connect(verdict));
                let _ = self.on_http(k, &head);
                self.side.hooks_mut().verdicts.remove(&k);
                // Bytes the client sent meanwhile wait in its input; no read event will come.
                let waiting = self.conns.get(k as usize).is_some_and(|c| {
                    c.input.is_some() && matches!(c.state.kind(), Kind::Http | Kind::Ws)
                });
                if waiting {
                    self.consume(k, &mut []);
                }
            }
            What::Control {
                text,
                topic,
                question,
            } => {
                let kind = if w.hook == Hook::Subscribe {
                    "subscribe"
                } else {
                    "publish"
                };
                let decoded = body.and_then(|b| {
                    proto::decode_check(&b, hooks.max_answer)
                        .map(|c| (c, b))
                        .map_err(|e| format!("the hook's answer is invalid: {e}"))
                });
                match decoded {
                    Ok((Check::Allow { data }, b)) => {
                        hooks.count(w.hook, 0, a.elapsed_us);
                        if data.is_none() {
                            hooks.remember(w.hook, question, &b, false, now);
                        }
                        let hook = w.hook;
                        self.side
                            .hooks_mut()
                            .verdicts
                            .insert(k, Verdict::Allowed { hook, topic, data });
                        self.on_control(k, &text);
                    }
                    Ok((Check::Refuse { reason }, b)) => {
                        hooks.count(w.hook, 1, a.elapsed_us);
                        hooks.remember(w.hook, question, &b, true, now);
                        let reply = Reply::Error {
                            error: &reason,
                            topic: Some(&topic),
                        };
                        self.reply(k, &reply);
                    }
                    Err(why) => {
                        hooks.count(w.hook, 2, a.elapsed_us);
                        log::warn(format_args!("{kind} hook failed: {why}"));
                        if hooks.fail_to_token {
                            self.side.hooks_mut().verdicts.insert(k, Verdict::Fallback);
                            self.on_control(k, &text);
                        } else {
                            let error = "the application could not be asked; retry later";
                            let reply = Reply::Error {
                                error,
                                topic: Some(&topic),
                            };
                            self.reply(k, &reply);
                        }
                    }
                }
                self.side.hooks_mut().verdicts.remove(&k);
                for (i, t) in w.queued.iter().enumerate() {
                    if let Some(again) = self.side.hooks_mut().waits.get_mut(&k) {
                        // A queued message is waiting again: the rest stay behind it.
                        again.queued.extend(w.queued.iter().skip(i).cloned());
                        break;
                    }
                    self.on_control(k, t);
                }
            }
        }
    }
}
