//! The Pusher Channels protocol (version 7) on the client listener: `GET /app/{key}` upgrades
//! to a WebSocket whose messages are Pusher's (`clarion_proto::pusher::client`), answered with
//! Pusher's (`clarion_proto::pusher::server`). A Pusher channel is the Clarion topic of the
//! same name, so subscribing joins the topic and published messages arrive in their shared
//! Pusher encoding (`crate::message::Encoding::Pusher`, built once per message). The
//! connection's own part (socket id, application, user, client-event budget) is its side-table
//! entry (`super::pusher_conn`).
//!
//! Errors a client can cause are answered as Pusher answers them: a connection refused
//! completes its upgrade, then gets `pusher:error` with the code and a Close with the same code
//! (4001 unknown key, 4004 over quota, 4006/4007/4008 protocol version); a refused channel gets
//! `pusher:error` with 4009 on that channel; a refused message gets `pusher:error` without a
//! code. Each is counted in `clarion_pusher_ws_total{outcome}`.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::Arc;

use clarion_proto::http1::{self, RequestHead};
use clarion_proto::pusher::channel::{Access, Kind};
use clarion_proto::pusher::client::{self, ClientMessage, Member, Subscribe};
use clarion_proto::pusher::code::ErrorCode;
use clarion_proto::pusher::server;
use clarion_proto::pusher::signature;
use clarion_proto::pusher::socket_id::SocketId;
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::{CloseCode, DataKind, OpCode};

use crate::broker::{Outgoing, Since, Subscribed};
use crate::log;
use crate::message::{Published, PusherForm, PUSHER_GAP_EVENT};
use crate::metrics::CloseReason;
use crate::pusher::PusherEvent;
use crate::worker::socket::Socket;
use crate::worker::state::{Ext, State, WsMode, WsRole};
use crate::worker::transport::auth::Checked;
use crate::worker::transport::frame::{pick, pusher_form, Form, Framing};
use crate::worker::transport::pusher_conn::{new_socket_id, PusherConn};
use crate::worker::Engine;

/// The path prefix of Pusher connections: `/app/{key}`.
pub const APP_PREFIX: &str = "/app/";

/// The protocol versions spoken: pusher-js sends 7; 5 and 6 differ only in what this server
/// does not send.
const PROTOCOLS: std::ops::RangeInclusive<u32> = 5..=7;

/// The `activity_timeout` a client is told when the server sends no pings of its own.
const DEFAULT_ACTIVITY_SECS: u32 = 120;

/// Why a connection is refused once upgraded, from its URL.
fn refusal(query: &str, key_known: bool) -> Option<ErrorCode> {
    let mut protocol = None;
    for (k, v) in http1::query_pairs(query).flatten() {
        if k == "protocol" {
            protocol = Some(v);
        }
    }
    if !key_known {
        return Some(ErrorCode::AppUnknown);
    }
    let Some(p) = protocol else {
        return Some(ErrorCode::NoVersion);
    };
    match p.parse::<u32>() {
        Err(_) => Some(ErrorCode::InvalidVersion),
        Ok(v) if !PROTOCOLS.contains(&v) => Some(ErrorCode::UnsupportedVersion),
        Ok(_) => None,
    }
}

/// The `pusher:error` for `code` with the channel it is about.
fn channel_error(channel: &str, code: ErrorCode, message: &str) -> String {
    serde_json::json!({
        "event": "pusher:error",
        "channel": channel,
        "data": {"code": code.code(), "message": message},
    })
    .to_string()
}

impl<S: Socket> Engine<S> {
    /// Answers `GET /app/{key}`: a WebSocket upgrade, then `pusher:connection_established`, or
    /// the Pusher error that refuses it.
    pub(crate) fn pusher_upgrade(&mut self, k: u32, head: &RequestHead<'_>, keep: bool) {
        let Some(upgrade) = self.ws_upgrade_request(k, head, keep, "Pusher connections take GET")
        else {
            return;
        };
        let key = head
            .path()
            .strip_prefix(APP_PREFIX)
            .unwrap_or_default()
            .to_owned();
        let app = self.shared.pusher.by_key(&key);
        let refused = refusal(head.query(), app.is_some());
        let (out, deflate) = self.ws_accept(&upgrade, None);
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        conn.last_seen = self.now;
        let mut mode = WsMode::new(WsRole::Pusher);
        mode.deflate = deflate.as_ref().map(|(agreed, _)| Ext::new(agreed));
        self.set_state(k, State::Ws(mode));
        self.send(k, &Arc::from(out));
        let app = match (refused, app) {
            (Some(_), _) | (None, None) => {
                let code = refused.unwrap_or(ErrorCode::AppUnknown);
                let outcome = match code {
                    ErrorCode::AppUnknown => "unknown_app",
                    ErrorCode::TlsOnly
                    | ErrorCode::AppDisabled
                    | ErrorCode::OverConnectionQuota
                    | ErrorCode::PathNotFound
                    | ErrorCode::InvalidVersion
                    | ErrorCode::UnsupportedVersion
                    | ErrorCode::NoVersion
                    | ErrorCode::Unauthorized
                    | ErrorCode::OverCapacity
                    | ErrorCode::ReconnectNow
                    | ErrorCode::PongNotReceived
                    | ErrorCode::Inactive
                    | ErrorCode::ClientEventRateLimit => "protocol",
                };
                self.shared.metrics.pusher.ws(outcome);
                log::debug(format_args!("pusher connection refused: {}", code.code()));
                return self.pusher_close(k, code, CloseReason::ProtocolError);
            }
            (None, Some(app)) => app,
        };
        if !self.shared.pusher.admit(app) {
            self.shared.metrics.pusher.ws("over_quota");
            return self.pusher_close(
                k,
                ErrorCode::OverConnectionQuota,
                CloseReason::ProtocolError,
            );
        }
        self.shared.metrics.pusher.ws("connected");
        // Pusher's own authorization (channel signatures) applies, not Clarion's tokens.
        self.adopt(k, Checked::Allowed(None));
        let socket_id = new_socket_id();
        self.side
            .pusher_mut()
            .insert(k, PusherConn::new(app, socket_id));
        let established =
            server::connection_established(&socket_id.to_string(), self.pusher_activity_secs());
        self.pusher_send(k, &established);
    }

    /// The `activity_timeout` clients are told: the server's ping interval (a client quiet this
    /// long pings, so the server need not), within the idle timeout.
    fn pusher_activity_secs(&self) -> u32 {
        let c = &self.shared.config;
        let secs = if c.ping_interval > 0 {
            c.ping_interval
        } else if c.idle_timeout > 0 {
            c.idle_timeout / 2
        } else {
            u64::from(DEFAULT_ACTIVITY_SECS)
        };
        u32::try_from(secs).unwrap_or(DEFAULT_ACTIVITY_SECS).max(1)
    }

    /// Sends one Pusher message (JSON text) to connection `k`, compressed when it agreed to.
    pub(crate) fn pusher_send(&mut self, k: u32, json: &str) {
        let frame: Arc<[u8]> = encode_frame(OpCode::Text, json.as_bytes()).into();
        let frame = self.compress_for(k, &frame, OpCode::Text);
        self.send(k, &frame);
    }

    /// Ends Pusher connection `k` with `code`: `pusher:error`, then a Close with that code.
    pub(crate) fn pusher_close(&mut self, k: u32, code: ErrorCode, reason: CloseReason) {
        self.pusher_send(k, &server::error(code));
        self.close_ws(k, CloseCode::Other(code.code()), code.message(), reason);
    }

    /// The server's idle ping, in Pusher's form (the client answers `pusher:pong`).
    pub(crate) fn pusher_ping(&mut self, k: u32) {
        self.pusher_send(k, &server::ping());
    }

    /// Connection `k` is gone: its application counts one less.
    pub(crate) fn pusher_left(&mut self, _k: u32, p: PusherConn) {
        self.shared.pusher.release(p.app);
    }

    /// Refuses a client message with `pusher:error` (no code: the connection stays), counted.
    fn pusher_refuse(&mut self, k: u32, outcome: &str, message: &str) {
        self.shared.metrics.pusher.ws(outcome);
        log::debug(format_args!("pusher message refused: {message}"));
        self.pusher_send(k, &server::error_with(None, message));
    }

    /// One message from Pusher connection `k`.
    pub(crate) fn pusher_message(&mut self, k: u32, kind: DataKind, payload: &[u8]) {
        let Some(p) = self.side.pusher().get(&k) else {
            return;
        };
        let (app_index, socket_id) = (p.app, p.socket_id);
        let Some(limits) = self.shared.pusher.get(app_index).map(|a| a.config.limits()) else {
            return;
        };
        if kind == DataKind::Binary {
            return self.pusher_refuse(k, "binary", "Pusher messages are JSON text");
        }
        let msg = match client::decode(payload, &limits) {
            Ok(m) => m,
            Err(e) => return self.pusher_refuse(k, e.label(), &e.to_string()),
        };
        match msg {
            ClientMessage::Ping => self.pusher_send(k, &server::pong()),
            // Any byte is activity (the read path clears the ping); nothing to answer.
            ClientMessage::Pong => {}
            ClientMessage::Subscribe(s) => self.pusher_subscribe(k, app_index, socket_id, s),
            ClientMessage::Unsubscribe { channel } => {
                if let Some(tid) = self.subscription(k, &channel) {
                    self.unsubscribe(k, tid);
                }
            }
            ClientMessage::Signin { auth, user_data } => {
                self.pusher_signin(k, app_index, socket_id, &auth, &user_data);
            }
            ClientMessage::ClientEvent {
                event,
                channel,
                data,
            } => self.pusher_client_event(k, app_index, socket_id, &event, &channel, &data),
        }
    }

    /// `pusher:subscribe`: checks the channel's authorization, joins the topic, and answers
    /// `pusher_internal:subscription_succeeded` (and a cache channel's last event).
    fn pusher_subscribe(&mut self, k: u32, app_index: u16, socket_id: SocketId, s: Subscribe) {
        let Some(app) = self.shared.pusher.get(app_index).map(|a| a.config.clone()) else {
            return;
        };
        let channel = s.channel.as_str();
        if s.kind.needs_auth() {
            let data = match s.kind.access {
                Access::Presence => s.channel_data.as_deref(),
                Access::Public | Access::Private | Access::PrivateEncrypted => None,
            };
            let checked = signature::verify_channel(
                s.auth.as_deref().unwrap_or_default(),
                &app.key,
                app.secret.as_bytes(),
                &socket_id.to_string(),
                channel,
                data,
            );
            if let Err(e) = checked {
                self.shared.metrics.pusher.ws("auth");
                let message = format!("Invalid signature for {channel}: {e}");
                let frame = channel_error(channel, ErrorCode::Unauthorized, &message);
                return self.pusher_send(k, &frame);
            }
        }
        if let Err(e) = clarion_proto::pubsub::validate_topic(channel) {
            self.shared.metrics.pusher.ws("channel");
            let message = format!("channel {channel:?} cannot be a Clarion topic: {e}");
            return self.pusher_send(
                k,
                &channel_error(channel, ErrorCode::Unauthorized, &message),
            );
        }
        let presence = match s.kind.access {
            Access::Presence => true,
            Access::Public | Access::Private | Access::PrivateEncrypted => false,
        };
        let mut joins_as = None;
        if presence {
            // The member it joins as: `channel_data`, signed with the channel above.
            let member = s
                .channel_data
                .as_deref()
                .ok_or_else(|| "presence channels need channel_data".to_owned())
                .and_then(|d| Member::parse(d, &app.limits()).map_err(|e| e.to_string()));
            match member {
                Ok(m) => {
                    self.presence_identify(k, Some(&m.user_id), m.user_info.as_deref());
                    joins_as = Some(m.user_id);
                }
                Err(e) => {
                    self.shared.metrics.pusher.ws("channel_data");
                    let message = format!("Invalid channel_data for {channel}: {e}");
                    let frame = channel_error(channel, ErrorCode::Unauthorized, &message);
                    return self.pusher_send(k, &frame);
                }
            }
        }
        if self.subscription(k, channel).is_some() {
            if presence {
                let name: Arc<str> = Arc::from(channel);
                return self.presence_listen(k, &[name]);
            }
            return self.pusher_send(k, &server::subscription_succeeded(channel, None));
        }
        let count = self.conns.get(k as usize).map_or(0, |c| c.subs.len());
        if count >= self.shared.config.max_subscriptions {
            self.shared.metrics.pusher.ws("subscriptions");
            let message = format!(
                "too many subscriptions: at most {} per connection",
                self.shared.config.max_subscriptions
            );
            return self.pusher_send(
                k,
                &channel_error(channel, ErrorCode::OverCapacity, &message),
            );
        }
        // Clarion's resume extension: the id it last received on this channel, if any.
        let resume = s.since.as_deref().filter(|id| !id.is_empty());
        if s.since.is_some() {
            self.pusher_resume_on(k);
        }
        let since_all = format!("{}-0", self.shared.broker.epoch());
        let since = match resume {
            Some(id) => Since::Id(id),
            None if s.kind.cache => Since::Id(&since_all),
            None => Since::Now,
        };
        let Some(sub) = self.subscribe_conn(k, &[channel], since, false) else {
            return;
        };
        if let Some(user_id) = &joins_as {
            self.pusher_hook_member(k, channel, user_id);
        }
        if presence {
            // Its member list, as `subscription_succeeded`, then the joins and leaves.
            self.presence_listen(k, &sub.names);
        } else {
            self.pusher_send(k, &server::subscription_succeeded(channel, None));
        }
        if resume.is_some() {
            self.pusher_replay(k, channel, &sub);
        } else if cached(s.kind) {
            match sub.replay.iter().rev().find(|m| !m.notice) {
                Some(last) => {
                    let settings = self.frames.deflate_settings;
                    let form = Form::Pusher(self.pusher_form_of(k));
                    let frame = Arc::clone(pick(last, form, &settings));
                    self.send(k, &frame);
                    self.scratch.tally.delivered += 1;
                }
                None => {
                    self.pusher_send(k, &server::cache_miss(channel));
                    self.pusher_hook_cache_miss(k, channel);
                }
            }
        }
    }

    /// Connection `k` asked for the resume extension: from now on its channel events carry
    /// their id (`"clarion_id"`).
    fn pusher_resume_on(&mut self, k: u32) {
        let Some(mut mode) = self.conns.get(k as usize).and_then(|c| c.state.ws()) else {
            return;
        };
        if mode.role == WsRole::Pusher {
            mode.role = WsRole::PusherResume;
            self.set_state(k, State::Ws(mode));
            self.shared.metrics.pusher.ws("resume");
        }
    }

    /// How Pusher connection `k` takes channel events (ids, compression).
    fn pusher_form_of(&self, k: u32) -> PusherForm {
        let mode = self.conns.get(k as usize).and_then(|c| c.state.ws());
        mode.map_or(
            PusherForm {
                ids: false,
                deflate: None,
            },
            pusher_form,
        )
    }

    /// What a resumed subscription to `channel` missed: Clarion's gap notices as `clarion:gap`
    /// events (the messages between could not be replayed), then the missed events, each with
    /// its id.
    fn pusher_replay(&mut self, k: u32, channel: &str, sub: &Subscribed) {
        for g in &sub.gaps {
            let data = server::Data::Text(&g.json());
            self.pusher_send(
                k,
                &server::channel_event(channel, PUSHER_GAP_EVENT, &data, None),
            );
        }
        let settings = self.frames.deflate_settings;
        let form = Form::Pusher(self.pusher_form_of(k));
        let frames: Vec<&Arc<[u8]>> = sub
            .replay
            .iter()
            .map(|m| pick(m, form, &settings))
            .collect();
        if !frames.is_empty() {
            self.deliver_all(k, &frames);
            self.scratch.tally.delivered += frames.len() as u64;
        }
    }

    /// `pusher:signin`: checks `user_data`'s signature and records the user.
    fn pusher_signin(
        &mut self,
        k: u32,
        app_index: u16,
        socket_id: SocketId,
        auth: &str,
        user_data: &str,
    ) {
        let Some(app) = self.shared.pusher.get(app_index).map(|a| a.config.clone()) else {
            return;
        };
        let limits = app.limits();
        let checked = signature::verify_signin(
            auth,
            &app.key,
            app.secret.as_bytes(),
            &socket_id.to_string(),
            user_data,
        );
        let user = match checked {
            Ok(()) => client::signin_user_id(user_data, &limits).map_err(|e| e.to_string()),
            Err(e) => Err(format!("Invalid signature: {e}")),
        };
        match user {
            Ok(id) => {
                let topic = crate::pusher::user_topic(&app.id, &app.secret, &id);
                if let Some(p) = self.side.pusher_mut().get_mut(&k) {
                    p.user = Some(id.into());
                }
                // Its user's topic: `terminate_connections` reaches it there.
                if self.subscription(k, &topic).is_none()
                    && self
                        .subscribe_conn(k, &[&topic], Since::Now, false)
                        .is_none()
                {
                    return;
                }
                self.pusher_send(k, &server::signin_success(user_data));
            }
            Err(why) => {
                self.shared.metrics.pusher.ws("signin");
                self.pusher_close(k, ErrorCode::Unauthorized, CloseReason::ProtocolError);
                log::debug(format_args!("pusher signin refused: {why}"));
            }
        }
    }

    /// A `client-` event: allowed by the application, on a private or presence channel the
    /// connection is subscribed to, within its rate; published to the channel's topic for every
    /// subscriber but the sender.
    fn pusher_client_event(
        &mut self,
        k: u32,
        app_index: u16,
        socket_id: SocketId,
        event: &str,
        channel: &str,
        data: &str,
    ) {
        let Some(app) = self.shared.pusher.get(app_index).map(|a| a.config.clone()) else {
            return;
        };
        if !app.enable_client_messages {
            return self.pusher_refuse(
                k,
                "client_events_off",
                "To send client events, enable_client_messages must be set for this app",
            );
        }
        let allowed = clarion_proto::pusher::channel::classify(channel)
            .is_ok_and(|kind| kind.allows_client_events());
        if !allowed || self.subscription(k, channel).is_none() {
            return self.pusher_refuse(
                k,
                "client_event_channel",
                "Client events go to a private or presence channel this connection subscribes to",
            );
        }
        if data.len() > app.max_event_bytes {
            return self.pusher_refuse(k, "client_event_size", "Client event data too large");
        }
        let now = self.now;
        let within = self
            .side
            .pusher_mut()
            .get_mut(&k)
            .is_some_and(|p| p.take_client_event(now, app.client_event_rate));
        if !within {
            self.shared.metrics.pusher.ws("client_event_rate");
            let code = ErrorCode::ClientEventRateLimit;
            return self.pusher_send(k, &server::error(code));
        }
        // On a presence channel, the other members learn who sent it (Pusher's `user_id`).
        let user_id = match clarion_proto::pusher::channel::classify(channel).map(|c| c.access) {
            Ok(Access::Presence) => self
                .shared
                .presence
                .as_ref()
                .and_then(|p| p.member_of(self.id, k)),
            Ok(Access::Public | Access::Private | Access::PrivateEncrypted) | Err(_) => None,
        };
        let attachment: Arc<dyn crate::message::Attachment> = Arc::new(PusherEvent {
            name: event.into(),
            exclude: Some(socket_id),
            user_id,
        });
        let out = Outgoing {
            topic: channel,
            kind: DataKind::Text,
            payload: data.as_bytes(),
            event: clarion_proto::pubsub::validate_event_name(event)
                .ok()
                .map(|()| event),
            attachment: Some(attachment),
            key: None,
            tags: &[],
            conflation_key: None,
        };
        match self.shared.broker.publish(&[out]) {
            Ok(_) => {
                let socket_id = socket_id.to_string();
                self.pusher_hook_client_event(k, channel, event, data, &socket_id);
            }
            Err(e) => {
                let message = format!("client event not relayed: {e}");
                self.pusher_send(k, &server::error_with(None, &message));
            }
        }
    }

    /// Whether Pusher connection `k` must not receive `m` (it was its own client event, or the
    /// HTTP API's trigger named it in `socket_id`).
    pub(crate) fn pusher_excluded(&self, k: u32, m: &Published) -> bool {
        let Some(exclude) = m.attachment::<PusherEvent>().and_then(|e| e.exclude) else {
            return false;
        };
        self.side
            .pusher()
            .get(&k)
            .is_some_and(|p| p.socket_id == exclude)
    }

    /// Pusher connection `k`'s answer to subscribing to presence channel `name`: its member
    /// list as `pusher_internal:subscription_succeeded`, or why it could not be read.
    pub(crate) fn pusher_presence_list(
        &mut self,
        k: u32,
        name: &str,
        read: Result<crate::presence::Listing, String>,
    ) {
        let json = match read {
            Ok(l) => {
                let members = l
                    .members
                    .iter()
                    .map(|(id, info, _)| (&**id, info.as_deref()))
                    .collect();
                server::subscription_succeeded(name, Some(&server::Presence { members }))
            }
            Err(e) => channel_error(name, ErrorCode::OverCapacity, &e),
        };
        self.pusher_send(k, &json);
    }

    /// Delivers `run` to `k` leaving out what it must not receive, when it is a Pusher
    /// connection and some message of `run` excludes a socket; `false` (nothing done) otherwise:
    /// the fan-out's ordinary delivery then applies.
    pub(crate) fn pusher_deliver_excluding(&mut self, k: u32, run: &[Arc<Published>]) -> bool {
        let excludes = |m: &Arc<Published>| {
            m.attachment::<PusherEvent>()
                .is_some_and(|e| e.exclude.is_some())
        };
        let pusher = match self.framing(k) {
            Framing::Pusher(_) => true,
            Framing::Ws(_)
            | Framing::Sse(_)
            | Framing::Lines { .. }
            | Framing::Poll(_)
            | Framing::Grip
            | Framing::H2
            | Framing::Request
            | Framing::Closing => false,
        };
        if !pusher {
            return false;
        }
        if let Some(first) = run.first() {
            if first.topic.starts_with(crate::pusher::USER_TOPIC_PREFIX) {
                // Its user's topic carries only the API's orders to it.
                let terminate = run
                    .iter()
                    .any(|m| m.event.as_deref() == Some(crate::pusher::TERMINATE_EVENT));
                if terminate {
                    self.shared.metrics.pusher.ws("terminated");
                    self.pusher_close(k, ErrorCode::Unauthorized, CloseReason::ProtocolError);
                }
                return true;
            }
        }
        if !run.iter().any(excludes) {
            return false;
        }
        let settings = self.frames.deflate_settings;
        let form = Form::Pusher(self.pusher_form_of(k));
        let frames: Vec<&Arc<[u8]>> = run
            .iter()
            .filter(|m| !self.pusher_excluded(k, m))
            .map(|m| pick(m, form, &settings))
            .collect();
        if !frames.is_empty() {
            self.deliver_all(k, &frames);
            self.scratch.tally.delivered += frames.len() as u64;
        }
        true
    }

    /// Tells Pusher connection `k` that `channel` could not be subscribed: the broker is
    /// unavailable (reconnecting later may help).
    pub(crate) fn pusher_unavailable(&mut self, k: u32, error: &str, channel: Option<&str>) {
        let frame = match channel {
            Some(c) => channel_error(c, ErrorCode::OverCapacity, error),
            None => server::error_with(Some(ErrorCode::OverCapacity.code()), error),
        };
        self.pusher_send(k, &frame);
    }
}

/// Whether a channel of `kind` gets its last event on subscribing.
fn cached(kind: Kind) -> bool {
    kind.cache
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_refused_with_pushers_codes() {
        assert_eq!(refusal("protocol=7&client=js", true), None);
        assert_eq!(refusal("protocol=5", true), None);
        assert_eq!(
            refusal("protocol=7", false),
            Some(ErrorCode::AppUnknown),
            "an unknown key first"
        );
        assert_eq!(refusal("client=js", true), Some(ErrorCode::NoVersion));
        assert_eq!(refusal("protocol=x", true), Some(ErrorCode::InvalidVersion));
        assert_eq!(
            refusal("protocol=8", true),
            Some(ErrorCode::UnsupportedVersion)
        );
        assert_eq!(
            refusal("protocol=4", true),
            Some(ErrorCode::UnsupportedVersion)
        );
    }

    #[test]
    fn channel_errors_name_their_channel_and_code() {
        let v: serde_json::Value =
            serde_json::from_str(&channel_error("private-a", ErrorCode::Unauthorized, "no"))
                .expect("JSON");
        assert_eq!(v["event"], "pusher:error");
        assert_eq!(v["channel"], "private-a");
        assert_eq!(v["data"]["code"], 4009);
    }
}
