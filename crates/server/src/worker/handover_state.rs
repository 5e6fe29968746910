//! What authentication, hooks and presence keep for a connection beside its record, as it
//! moves in a hand-over (`super::handover`): taken out quietly in the old process and put back
//! in the new one, so the connection keeps its rights until the same wall-clock deadline, the
//! backend's webhooks see neither a `disconnected` nor a `connected`, and its presence rooms
//! see neither a `leave` nor a `join`. The format is [`clarion_proto::handover_state`].
//!
//! Times cross as wall-clock (Unix) seconds: each process's coarse clock starts at its own
//! second 0, so a token's deadline is converted on the way out and on the way in.

use std::sync::Arc;

use clarion_proto::auth::{Grants, Pattern};
use clarion_proto::handover_state::{
    AuthState, HookLive, HookState, ModeState, PresenceState, PusherState,
};
use clarion_proto::pusher::socket_id::SocketId;

use super::socket::Socket;
use super::state::{State, WsRole};
use super::transport::pusher_conn::{Membership, PusherConn};
use super::Engine;
use crate::broker::Since;
use crate::log;
use crate::presence::handover::Carried;

/// A connection's authentication as it moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedAuth {
    /// Unix second its token stops counting (or a pending connection's deadline to
    /// authenticate).
    pub deadline: u64,
    /// It has not authenticated yet.
    pub pending: bool,
    /// It was warned of its token's expiry.
    pub warned: bool,
    /// Patterns it may subscribe to, as a claim writes them.
    pub subscribe: Vec<String>,
    /// Patterns it may publish to.
    pub publish: Vec<String>,
}

/// What the hooks know of a connection as it moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedHooks {
    /// The identity a `connect` hook gave: `sub`, `info`.
    pub ident: Option<(Option<String>, Option<String>)>,
    /// The `connected` webhook's connection id and `sub`, and the seconds since.
    pub live: Option<(Arc<str>, Option<String>, u32)>,
}

/// A connection's presence as it moves: its rooms and the rooms whose events it receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedPresence {
    /// Its identity and rooms.
    pub part: Carried,
    /// Rooms it listens to, with the version its member list was read at.
    pub listening: Vec<(Arc<str>, u64)>,
}

/// A Pusher connection's own part as it moves (`docs/pusher.md`): the new process answers
/// to the same socket id (a backend may hold it to exclude the connection from a trigger),
/// with the same signed-in user and presence memberships.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedPusher {
    /// Its application's key: the new process finds the application by it.
    pub app_key: String,
    /// Its socket id.
    pub socket_id: SocketId,
    /// The user it signed in as.
    pub user: Option<String>,
    /// Its presence memberships: channel, user id (for the application's webhook).
    pub members: Vec<(String, String)>,
}

/// Everything the modes keep for one moving connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CarriedMode {
    /// Authentication (or a `connect` hook's grants).
    pub auth: Option<CarriedAuth>,
    /// Backend hooks.
    pub hooks: Option<CarriedHooks>,
    /// Presence.
    pub presence: Option<CarriedPresence>,
    /// Subscription filters (`docs/filters.md`): topic, the filter's canonical text.
    pub filters: Vec<(String, String)>,
    /// A Pusher connection's own part.
    pub pusher: Option<CarriedPusher>,
}

/// A pattern as a token's claim writes it.
fn pattern_text(p: &Pattern) -> String {
    match p {
        Pattern::Exact(t) => t.clone(),
        Pattern::Prefix(p) => format!("{p}*"),
    }
}

/// Patterns back from their text. One that does not parse is left out (the connection keeps
/// less, never more, than it had); it cannot happen between two honest processes.
fn patterns(list: &[String]) -> Vec<Pattern> {
    list.iter()
        .filter_map(|t| match Pattern::parse(t) {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn(format_args!("hand-over: a grant pattern was dropped: {e}"));
                None
            }
        })
        .collect()
}

impl CarriedMode {
    /// The record's section, borrowing from `self`.
    pub fn wire(&self) -> ModeState<'_> {
        ModeState {
            auth: self.auth.as_ref().map(|a| AuthState {
                deadline: a.deadline,
                pending: a.pending,
                warned: a.warned,
                subscribe: a.subscribe.iter().map(String::as_str).collect(),
                publish: a.publish.iter().map(String::as_str).collect(),
            }),
            hooks: self.hooks.as_ref().map(|h| HookState {
                ident: h.ident.as_ref().map(|(s, i)| (s.as_deref(), i.as_deref())),
                live: h.live.as_ref().map(|(conn, sub, age)| HookLive {
                    conn,
                    sub: sub.as_deref(),
                    age: *age,
                }),
            }),
            presence: self.presence.as_ref().map(|p| PresenceState {
                ident: p
                    .part
                    .ident
                    .as_ref()
                    .map(|(s, i)| (s.as_str(), i.as_deref())),
                rooms: p.part.rooms.iter().map(|(n, v)| (&**n, *v)).collect(),
                listening: p.listening.iter().map(|(n, v)| (&**n, *v)).collect(),
            }),
            filters: self
                .filters
                .iter()
                .map(|(t, f)| (t.as_str(), f.as_str()))
                .collect(),
            pusher: self.pusher.as_ref().map(|p| PusherState {
                app_key: &p.app_key,
                socket_id: (p.socket_id.high, p.socket_id.low),
                user: p.user.as_deref(),
                members: p
                    .members
                    .iter()
                    .map(|(c, u)| (c.as_str(), u.as_str()))
                    .collect(),
            }),
        }
    }

    /// The section as read from the old process.
    pub fn from_wire(m: &ModeState<'_>) -> CarriedMode {
        let owned = |s: Option<&str>| s.map(str::to_owned);
        CarriedMode {
            auth: m.auth.as_ref().map(|a| CarriedAuth {
                deadline: a.deadline,
                pending: a.pending,
                warned: a.warned,
                subscribe: a.subscribe.iter().map(|s| (*s).to_owned()).collect(),
                publish: a.publish.iter().map(|s| (*s).to_owned()).collect(),
            }),
            hooks: m.hooks.as_ref().map(|h| CarriedHooks {
                ident: h.ident.map(|(s, i)| (owned(s), owned(i))),
                live: h
                    .live
                    .as_ref()
                    .map(|l| (Arc::from(l.conn), owned(l.sub), l.age)),
            }),
            presence: m.presence.as_ref().map(|p| CarriedPresence {
                part: Carried {
                    ident: p.ident.map(|(s, i)| (s.to_owned(), owned(i))),
                    rooms: p.rooms.iter().map(|(n, v)| (Arc::from(*n), *v)).collect(),
                },
                listening: p
                    .listening
                    .iter()
                    .map(|(n, v)| (Arc::from(*n), *v))
                    .collect(),
            }),
            filters: m
                .filters
                .iter()
                .map(|(t, f)| ((*t).to_owned(), (*f).to_owned()))
                .collect(),
            pusher: m.pusher.as_ref().map(|p| CarriedPusher {
                app_key: p.app_key.to_owned(),
                socket_id: SocketId {
                    high: p.socket_id.0,
                    low: p.socket_id.1,
                },
                user: owned(p.user),
                members: p
                    .members
                    .iter()
                    .map(|(c, u)| ((*c).to_owned(), (*u).to_owned()))
                    .collect(),
            }),
        }
    }
}

impl<S: Socket> Engine<S> {
    /// The old process's side for connection `k`, about to be lifted out: takes what the
    /// modes keep for it, then leaves its topics and forgets it quietly (no presence `leave`,
    /// no `topic_vacated`, no `disconnected`).
    ///
    /// `listening`: the rooms it listens to (from [`Engine::presence_listening_all`]); the
    /// caller ends the listening of every released connection at once
    /// ([`Engine::presence_drop_listeners`]).
    pub(crate) fn release(
        &mut self,
        k: u32,
        listening: Vec<(Arc<str>, u64)>,
    ) -> Option<CarriedMode> {
        let mode = self.take_mode(k, listening);
        self.handing_over = true;
        self.leave_all_topics(k);
        self.forget_side_state(k, super::state::Exit::Moved);
        self.handing_over = false;
        mode
    }

    /// The new process's side for connection `k`, just put in the slab: its rights first,
    /// then its topics again (without `topic_occupied` or presence `join`: it was there), then
    /// its rooms and the events it listens to. Its topics continue from now, or, with a
    /// clustered broker, from the ids `from` (`topic:EPOCH-SEQ,...`) where the old process
    /// stopped delivering, with what was published since written to it alone first.
    pub(crate) fn resume(
        &mut self,
        k: u32,
        topics: &[String],
        from: Option<&str>,
        mode: Option<&CarriedMode>,
    ) {
        if let Some(m) = mode {
            self.restore_rights(k, m);
        }
        if let Some(p) = mode.and_then(|m| m.pusher.as_ref()) {
            if !self.restore_pusher(k, p) {
                return;
            }
        }
        let mut joined = Vec::new();
        if !topics.is_empty() {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            self.handing_over = true;
            let since = from.map_or(Since::Now, Since::Id);
            let sub = self.subscribe_conn(k, &names, since, false);
            self.handing_over = false;
            if let Some(sub) = sub {
                joined = sub.names.clone();
                // Before the catch-up, which its filters apply to.
                self.restore_filters(k, mode);
                if from.is_some() {
                    self.catch_up_arriving(k, sub);
                } else if !sub.replay.is_empty() {
                    log::warn(format_args!("hand-over: unexpected replay on adoption"));
                }
            }
        }
        self.restore_rooms(k, mode, &joined);
        if mode.is_some_and(|m| m.pusher.is_some()) {
            self.pusher_count_members(k);
        }
    }

    /// Whether connection `k`, in `state`, is a Pusher WebSocket without its own part and
    /// application (one refused before it was established, which is closing): its record
    /// would name a Pusher role with no Pusher part, which the new process could not serve.
    pub(super) fn pusher_part_missing(&self, k: u32, state: State) -> bool {
        let pusher_role = state
            .ws()
            .is_some_and(|m| matches!(m.role, WsRole::Pusher | WsRole::PusherResume));
        let part = self
            .side
            .pusher()
            .get(&k)
            .and_then(|p| self.shared.pusher.get(p.app));
        pusher_role && part.is_none()
    }

    /// Puts Pusher connection `k`'s own part back, before it subscribes again (its channels'
    /// webhook counts need its application). `false` when this process's configuration has no
    /// application with its key: it is then told to reconnect at once (4200), as a restart
    /// would, and its client meets the new configuration.
    fn restore_pusher(&mut self, k: u32, p: &CarriedPusher) -> bool {
        let Some(app) = self.shared.pusher.by_key(&p.app_key) else {
            self.shared.metrics.pusher.ws("handover_app_gone");
            log::info(format_args!(
                "hand-over: a Pusher connection's application is not configured here; told to reconnect"
            ));
            self.pusher_close(
                k,
                clarion_proto::pusher::code::ErrorCode::ReconnectNow,
                crate::metrics::CloseReason::Shutdown,
            );
            return false;
        };
        self.shared.pusher.count_arrived(app);
        let members = p
            .members
            .iter()
            .map(|(channel, user_id)| Membership {
                channel: channel.as_str().into(),
                user_id: user_id.as_str().into(),
            })
            .collect();
        let user = p.user.as_deref().map(Box::from);
        self.side
            .pusher_mut()
            .insert(k, PusherConn::arrived(app, p.socket_id, user, members));
        true
    }

    /// Takes what the modes keep for connection `k` out, quietly (no event, no webhook): call
    /// before its topics are left. `None` when no mode keeps anything for it.
    fn take_mode(&mut self, k: u32, listening: Vec<(Arc<str>, u64)>) -> Option<CarriedMode> {
        let auth = self
            .side
            .grants_mut()
            .export(k)
            .map(|(deadline, pending, warned, grants)| {
                let list = |l: Option<&[Pattern]>| {
                    l.unwrap_or_default().iter().map(pattern_text).collect()
                };
                CarriedAuth {
                    deadline: self.anchors.unix + u64::from(deadline),
                    pending,
                    warned,
                    subscribe: list(grants.as_ref().map(|g| &g.subscribe[..])),
                    publish: list(grants.as_ref().map(|g| &g.publish[..])),
                }
            });
        let (ident, live) = self.side.hooks_mut().export(k);
        let hooks = (ident.is_some() || live.is_some()).then(|| CarriedHooks {
            ident,
            live: live.map(|(conn, sub, since)| (conn, sub, self.now.saturating_sub(since))),
        });
        let presence = match self.shared.presence.clone() {
            Some(p) => {
                let part = p.detach(self.id, k);
                (part.is_some() || !listening.is_empty()).then(|| CarriedPresence {
                    part: part.unwrap_or(Carried {
                        ident: None,
                        rooms: Vec::new(),
                    }),
                    listening,
                })
            }
            None => None,
        };
        let filters = self.filters_of(k);
        let pusher = self.side.pusher().get(&k).and_then(|p| {
            Some(CarriedPusher {
                app_key: self.shared.pusher.get(p.app)?.config.key.clone(),
                socket_id: p.socket_id,
                user: p.user.as_deref().map(str::to_owned),
                members: p
                    .members
                    .iter()
                    .map(|m| (m.channel.to_string(), m.user_id.to_string()))
                    .collect(),
            })
        });
        let m = CarriedMode {
            auth,
            hooks,
            presence,
            filters,
            pusher,
        };
        (m != CarriedMode::default()).then_some(m)
    }

    /// The filters connection `k`'s subscriptions hold, by topic, in canonical text.
    fn filters_of(&self, k: u32) -> Vec<(String, String)> {
        let Some(conn) = self.conns.get(k as usize) else {
            return Vec::new();
        };
        conn.subs
            .ids()
            .into_iter()
            .filter_map(|tid| {
                let f = self.filters.of(k, tid)?;
                Some((self.index.name_of(tid)?.to_string(), f.to_string()))
            })
            .collect()
    }

    /// Puts the filters connection `k` held back on its subscriptions (just made again). One
    /// that does not parse (it cannot happen between two honest processes) leaves that
    /// subscription unfiltered, said in the log.
    fn restore_filters(&mut self, k: u32, mode: Option<&CarriedMode>) {
        for (topic, text) in mode.map(|m| &m.filters[..]).unwrap_or_default() {
            let Some(tid) = self.subscription(k, topic) else {
                continue;
            };
            match clarion_proto::filter::parse(text, &clarion_proto::filter::Limits::default()) {
                Ok(f) => self
                    .filters
                    .set(k, tid, Some(&f), &self.shared.metrics.filters),
                Err(e) => log::warn(format_args!(
                    "hand-over: the filter of a subscription to {topic} was dropped: {e}"
                )),
            }
        }
    }

    /// Puts back what authentication and hooks kept for connection `k`, arriving from the old
    /// process: before it subscribes again (its rights are checked from then on).
    fn restore_rights(&mut self, k: u32, m: &CarriedMode) {
        if let Some(a) = &m.auth {
            let deadline =
                u32::try_from(a.deadline.saturating_sub(self.anchors.unix)).unwrap_or(u32::MAX);
            if a.pending {
                self.side.grants_mut().require(k, deadline);
            } else {
                let grants = Grants {
                    subscribe: patterns(&a.subscribe),
                    publish: patterns(&a.publish),
                };
                self.side.grants_mut().set(k, deadline, grants);
                if a.warned {
                    self.side.grants_mut().warned(k);
                }
            }
        }
        if let Some(h) = &m.hooks {
            let now = self.now;
            let live = h
                .live
                .clone()
                .map(|(conn, sub, age)| (conn, sub, now.saturating_sub(age)));
            self.side.hooks_mut().import(k, h.ident.clone(), live);
        }
    }

    /// Puts connection `k` back in its presence rooms (quietly) and lets it listen to their
    /// events again: after it subscribed to `topics` again. A room this process keeps that the
    /// old one did not (`presence_topics` changed) is entered as a subscription would.
    fn restore_rooms(&mut self, k: u32, m: Option<&CarriedMode>, topics: &[Arc<str>]) {
        let Some(p) = self.shared.presence.clone() else {
            return;
        };
        let carried = m.and_then(|m| m.presence.as_ref());
        if let Some(c) = carried {
            p.attach(self.id, k, &c.part);
        }
        for name in topics {
            if p.tracks(name) && !p.is_in(self.id, k, name) && self.subscription(k, name).is_some()
            {
                self.presence_entered(k, name);
            }
        }
        for (name, seen) in carried.map(|c| &c.listening[..]).unwrap_or_default() {
            self.presence_relisten(k, name, *seen);
        }
    }
}
