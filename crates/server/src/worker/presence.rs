//! A worker's side of presence ([`crate::presence`]): telling it which connections enter and
//! leave rooms under which identity (it keeps each connection's part), which of them asked for
//! `join`/`leave` events, and writing member lists and events, each connection's transport
//! framing them ([`super::transport::frame`]).
//!
//! Only listeners have entries here; a server without `presence_topics` never touches these
//! tables. A long-poll is not a member (between its requests it is not
//! connected, so it would leave and join again on every poll); it may read the member lists.
#![deny(clippy::wildcard_enum_match_arm)]

use std::collections::HashMap;
use std::sync::Arc;

use clarion_proto::pubsub::Reply;

use super::socket::Socket;
use super::transport::frame::{Event, Form, Framing};
use super::Engine;
use crate::message::Published;

/// One worker's presence tables.
#[derive(Default)]
pub(crate) struct PresenceConns {
    /// Per room, the connections that asked for events, each with the room version its member
    /// list was read at (events up to it are already in that list).
    listeners: HashMap<u32, Vec<(u32, u64)>>,
    /// Held long-polls that watch their rooms' events, with those rooms.
    watching_polls: HashMap<u32, Vec<Arc<str>>>,
}

/// Why a request for presence is refused (`400`, or an error reply in-band).
pub(crate) const NOT_CONFIGURED: &str = "presence is not kept on this server (presence_topics)";
/// Presence events on a transport whose messages carry no type.
const UNTYPED: &str =
    "presence events need typed messages: the clarion.v1 subprotocol, SSE, or JSON lines";

impl<S: Socket> Engine<S> {
    /// Records connection `k`'s identity for the rooms it will join: the `sub` a `connect`
    /// hook gave, else its token's, with the token's `clarion.info`. An identity already used
    /// in rooms stays until the connection leaves them (a refreshed token with another `sub`
    /// does not make it someone else in the middle).
    pub(crate) fn presence_identify(&mut self, k: u32, sub: Option<&str>, info: Option<&str>) {
        if let Some(p) = self.shared.presence.as_ref() {
            p.identify(self.id, k, sub, info);
        }
    }

    /// Forgets connection `k`'s identity if it joined no room with its first subscription
    /// and cannot join one later (an SSE or JSON-lines stream subscribes once): an
    /// authenticated stream to other topics keeps nothing here.
    pub(crate) fn presence_settle(&mut self, k: u32) {
        if let Some(p) = self.shared.presence.as_ref() {
            p.settle(self.id, k);
        }
    }

    /// Whether connection `k` may enter the rooms among `topics` (its room limit). Answers
    /// the refusal itself (an error reply in-band, else `400`) and returns `false`.
    pub(crate) fn presence_admits(&mut self, k: u32, topics: &[&str], in_band: bool) -> bool {
        let Some(p) = self.shared.presence.as_ref() else {
            return true;
        };
        if !self.member_kind(k) {
            return true;
        }
        let new = topics.iter().filter(|t| p.tracks(t)).count();
        if new == 0 || p.rooms_of(self.id, k) + new <= p.max_topics {
            return true;
        }
        let error = format!(
            "too many presence topics: at most {} per connection (presence_max_topics)",
            p.max_topics
        );
        if in_band {
            let topic = topics.first().copied();
            self.reply(
                k,
                &Reply::Error {
                    error: &error,
                    topic,
                },
            );
        } else if let Framing::Pusher(_) = self.framing(k) {
            self.pusher_unavailable(k, &error, topics.first().copied());
        } else {
            self.respond(k, 400, &[], &error, false);
        }
        false
    }

    /// Whether connection `k` is the kind that is a member of the rooms it subscribes to
    /// (WebSockets and streams; not long-polls, not GRIP connections).
    fn member_kind(&self, k: u32) -> bool {
        self.conns
            .get(k as usize)
            .is_some_and(|c| Framing::of(c.state).joins_rooms())
    }

    /// Connection `k` subscribed to `name`: if it is a room, `k` enters it.
    pub(crate) fn presence_entered(&mut self, k: u32, name: &Arc<str>) {
        let Some(p) = self.shared.presence.as_ref() else {
            return;
        };
        if self.handing_over {
            // A connection arriving in a hand-over is put back in its rooms quietly.
            return;
        }
        if p.tracks(name) && self.member_kind(k) {
            p.enter(&self.shared.broker, self.id, k, name);
        }
    }

    /// Connection `k` left topic `name` (index id `tid`): it leaves the room, if it was in it,
    /// and stops listening to it.
    pub(crate) fn presence_left(&mut self, k: u32, name: &Arc<str>, tid: u32) {
        let Some(p) = self.shared.presence.as_ref() else {
            return;
        };
        if !p.tracks(name) {
            return;
        }
        p.exit(&self.shared.broker, self.id, k, name);
        if self.handing_over {
            // Lifted out in a hand-over: its listening ends with the others' in one pass
            // (`presence_drop_listeners`).
            return;
        }
        if let Some(list) = self.side.presence_mut().listeners.get_mut(&tid) {
            let before = list.len();
            list.retain(|(c, _)| *c != k);
            if list.len() < before {
                p.unlisten(name);
            }
            if list.is_empty() {
                self.side.presence_mut().listeners.remove(&tid);
            }
        }
    }

    /// The rooms whose events each listening connection receives, each with the version its
    /// member list was read at (for a hand-over: one pass, not one per connection).
    pub(crate) fn presence_listening_all(&self) -> HashMap<u32, Vec<(Arc<str>, u64)>> {
        let mut out: HashMap<u32, Vec<(Arc<str>, u64)>> = HashMap::new();
        for (tid, list) in &self.side.presence().listeners {
            let Some(name) = self.index.name_of(*tid) else {
                continue;
            };
            for (k, seen) in list {
                out.entry(*k).or_default().push((Arc::clone(&name), *seen));
            }
        }
        out
    }

    /// Connections `gone` (lifted out in a hand-over) stop listening, in one pass over the
    /// listener lists.
    pub(crate) fn presence_drop_listeners(&mut self, gone: &std::collections::HashSet<u32>) {
        let Some(p) = self.shared.presence.clone() else {
            return;
        };
        let index = &self.index;
        self.side.presence_mut().listeners.retain(|tid, list| {
            let before = list.len();
            list.retain(|(c, _)| !gone.contains(c));
            if let Some(name) = index.name_of(*tid) {
                for _ in list.len()..before {
                    p.unlisten(&name);
                }
            }
            !list.is_empty()
        });
    }

    /// Connection `k`, arrived in a hand-over, receives room `name`'s events after `seen`
    /// again (it subscribes to the room; its member list is not sent again).
    pub(crate) fn presence_relisten(&mut self, k: u32, name: &Arc<str>, seen: u64) {
        let Some(p) = self.shared.presence.clone() else {
            return;
        };
        let Some(tid) = self.subscription(k, name) else {
            return;
        };
        if !p.tracks(name) {
            return;
        }
        // `k` has just arrived: it is in no list yet.
        p.watch(name);
        self.side
            .presence_mut()
            .listeners
            .entry(tid)
            .or_default()
            .push((k, seen));
    }

    /// Forgets connection `k` (it is gone; it left its rooms already).
    pub(crate) fn presence_forget(&mut self, k: u32) {
        let Some(p) = self.shared.presence.as_ref() else {
            return;
        };
        p.forget(&self.shared.broker, self.id, k);
        if !self.side.presence().watching_polls.is_empty() {
            self.presence_poll_watch(k, &[], false);
        }
    }

    /// Connection `k` asked for events of the rooms among `names`: each room's member list is
    /// written now (in the transport's format), and its later events follow in order.
    pub(crate) fn presence_listen(&mut self, k: u32, names: &[Arc<str>]) {
        let Some(p) = self.shared.presence.clone() else {
            return;
        };
        let mut out: Vec<Arc<[u8]>> = Vec::new();
        for name in names {
            let Some(tid) = self.subscription(k, name) else {
                continue;
            };
            if !p.tracks(name) {
                continue;
            }
            // Without a list (Redis unreachable) the subscriber is told, and gets every event.
            let new = !self
                .side
                .presence()
                .listeners
                .get(&tid)
                .is_some_and(|l| l.iter().any(|(c, _)| *c == k));
            let read = if new {
                p.listen(&self.shared.broker, name, p.max_members)
            } else {
                p.list(&self.shared.broker, name, None, p.max_members)
            };
            if let Framing::Pusher(_) = self.framing(k) {
                // Pusher's member list is its `subscription_succeeded`.
                let version = read.as_ref().map_or(0, |l| l.version);
                let list = self.side.presence_mut().listeners.entry(tid).or_default();
                match list.iter_mut().find(|(c, _)| *c == k) {
                    Some(entry) => entry.1 = version,
                    None => list.push((k, version)),
                }
                self.pusher_presence_list(k, name, read);
                continue;
            }
            let (version, kind, json) = match read {
                Ok(listing) => (listing.version, "presence", listing.message_json(name)),
                Err(error) => {
                    let reply = Reply::Error {
                        error: &error,
                        topic: Some(name),
                    };
                    (0, "error", reply.to_json())
                }
            };
            let list = self.side.presence_mut().listeners.entry(tid).or_default();
            match list.iter_mut().find(|(c, _)| *c == k) {
                Some(entry) => entry.1 = version,
                None => list.push((k, version)),
            }
            if let Some(bytes) = self.presence_encode(k, kind, &json) {
                out.push(bytes);
            }
        }
        if !out.is_empty() {
            let refs: Vec<&Arc<[u8]>> = out.iter().collect();
            self.write_all_to(k, &refs, None);
        }
    }

    /// Why a request for `topic`'s presence events is refused, if it is: presence off, not a
    /// presence topic, or a transport that carries no types (plain WebSockets, raw streams).
    pub(crate) fn presence_refusal(&self, topic: &str, typed: bool) -> Option<&'static str> {
        match self.shared.presence.as_ref() {
            None => Some(NOT_CONFIGURED),
            Some(p) if !p.tracks(topic) => Some("presence is not kept for this topic"),
            Some(_) if !typed => Some(UNTYPED),
            Some(_) => None,
        }
    }

    /// Why `presence=1` on a request for `topics` is refused, if it is: as
    /// [`Engine::presence_refusal`], and at least one of the topics must be a presence topic.
    pub(crate) fn presence_url_refusal(
        &self,
        topics: &[std::borrow::Cow<'_, str>],
        typed: bool,
    ) -> Option<&'static str> {
        let p = match self.shared.presence.as_ref() {
            None => return Some(NOT_CONFIGURED),
            Some(p) => p,
        };
        if !typed {
            return Some(UNTYPED);
        }
        if !topics.iter().any(|t| p.tracks(t)) {
            return Some("presence is not kept for any of these topics (presence_topics)");
        }
        None
    }

    /// Long-poll `k`'s answer `body` with the member lists of its presence topics added
    /// (`"presence":[{"type":"presence",...},...]`), read now.
    pub(crate) fn presence_in_poll(&self, k: u32, body: &Arc<[u8]>) -> Arc<[u8]> {
        let Some(p) = self.shared.presence.as_ref() else {
            return Arc::clone(body);
        };
        let names: Vec<Arc<str>> = self
            .conns
            .get(k as usize)
            .map(|c| c.subs.ids())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|tid| self.index.name_of(tid))
            .filter(|n| p.tracks(n))
            .collect();
        let Some(open) = body.strip_suffix(b"}\n") else {
            return Arc::clone(body);
        };
        let mut out = open.to_vec();
        out.extend_from_slice(b",\"presence\":[");
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let json = match p.list(&self.shared.broker, name, None, p.max_members) {
                Ok(listing) => listing.message_json(name),
                Err(error) => Reply::Error {
                    error: &error,
                    topic: Some(name),
                }
                .to_json(),
            };
            out.extend_from_slice(json.as_bytes());
        }
        out.extend_from_slice(b"]}\n");
        out.into()
    }

    /// A held long-poll with `presence=1` starts (`on`) or stops wanting the events of the
    /// rooms among `names`. Only a poll that was held counts: one answered at once never
    /// watched.
    pub(crate) fn presence_poll_watch(&mut self, k: u32, names: &[Arc<str>], on: bool) {
        let Some(p) = self.shared.presence.clone() else {
            return;
        };
        if on {
            let rooms: Vec<Arc<str>> = names.iter().filter(|n| p.tracks(n)).cloned().collect();
            for name in &rooms {
                p.watch(name);
            }
            self.side.presence_mut().watching_polls.insert(k, rooms);
        } else if let Some(rooms) = self.side.presence_mut().watching_polls.remove(&k) {
            for name in &rooms {
                p.unlisten(name);
            }
        }
    }

    /// An in-band `presence` message: room `topic`'s members after `after`.
    pub(crate) fn presence_query(&mut self, k: u32, topic: &str, after: Option<&str>) {
        let error = match self.shared.presence.clone() {
            None => NOT_CONFIGURED,
            Some(p) if !p.tracks(topic) => "presence is not kept for this topic",
            Some(p) => {
                if let Err(r) = self.ws_may_subscribe(k, topic) {
                    r.count(&self.shared.metrics);
                    let topic = Some(topic);
                    return self.reply(
                        k,
                        &Reply::Error {
                            error: r.reason,
                            topic,
                        },
                    );
                }
                let json = match p.list(&self.shared.broker, topic, after, p.max_members) {
                    Ok(listing) => listing.message_json(topic),
                    Err(error) => {
                        let topic = Some(topic);
                        return self.reply(
                            k,
                            &Reply::Error {
                                error: &error,
                                topic,
                            },
                        );
                    }
                };
                let typed = Event::Typed {
                    kind: "presence",
                    json: &json,
                };
                if let Some(frame) = self.framing(k).framed(typed) {
                    self.send(k, &frame);
                }
                return;
            }
        };
        let topic = Some(topic);
        self.reply(k, &Reply::Error { error, topic });
    }

    /// `json` (a member list or an event of type `kind`) in connection `k`'s format (see
    /// [`Framing::frame`]); `None` for a connection that does not take them.
    fn presence_encode(&self, k: u32, kind: &str, json: &str) -> Option<Arc<[u8]>> {
        self.framing(k).framed(Event::Typed { kind, json })
    }

    /// Delivers a run of presence events of one room to the connections that asked for them,
    /// each getting those after the version its member list was read at.
    pub(crate) fn deliver_presence(&mut self, run: &[Arc<Published>]) {
        let Some(first) = run.first() else {
            return;
        };
        let Some(tid) = self.index.id_of(&first.topic) else {
            return;
        };
        if !self.side.polls().is_empty() {
            // Held long-polls that asked for presence are answered with the new member lists.
            let polls: Vec<u32> = self
                .index
                .subscribers(&first.topic)
                .iter()
                .copied()
                .filter(|k| self.side.polls().get(k).is_some_and(|h| h.presence))
                .collect();
            for k in polls {
                self.answer_poll_empty(k);
            }
        }
        let Some(listeners) = self.side.presence().listeners.get(&tid).cloned() else {
            return;
        };
        let settings = self.frames.deflate_settings;
        let mut frames: Vec<&Arc<[u8]>> = Vec::with_capacity(run.len());
        for (k, seen) in listeners {
            frames.clear();
            let Some(form) = self.framing(k).presence_form() else {
                continue;
            };
            for m in run.iter().filter(|m| m.id > seen) {
                frames.push(match form {
                    Form::Shared(e) => m.encoded(e),
                    Form::Pusher(form) => m.pusher(form, &settings),
                    Form::Deflated {
                        envelope,
                        small_window,
                    } => m.deflated(envelope, small_window, &settings),
                    Form::Frame | Form::Dedicated { .. } => &m.frame,
                });
            }
            if !frames.is_empty() {
                self.deliver_all(k, &frames);
            }
        }
    }
}
