//! Presence: who is in a topic (docs/presence.md).
//!
//! A topic matching `presence_topics` is a *room*. Every connection subscribed to it is counted
//! there; one with an identity (a token's `sub`, or the `sub` a `connect` hook gave) is a
//! *member* under that identity, and several connections of one identity (three tabs) are one
//! member: it joins with the first and leaves with the last. Each change that makes or ends a
//! member is a `join` or `leave` event, handed to the broker's fan-out under this module's
//! lock, so the events of a room reach every subscriber in the order the room changed, and in
//! order with the topic's messages.
//!
//! Each room has a version, raised by every event: a member list carries the version it was
//! read at, and an event at or below that version is already in the list (a subscriber that
//! gets both skips it, see `worker::presence`).
//!
//! Topics that are not rooms pay nothing: the workers ask [`Presence::tracks`] once per
//! subscription, and only connections in rooms have an entry in a worker's side table.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use clarion_proto::auth::Pattern;

use crate::broker::Broker;
use crate::config::Config;
use crate::hub::lock;
use crate::message::Published;
use crate::metrics::Metrics;

/// Who a connection is in the rooms it joins: set once per connection, shared by its rooms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The identity (`sub`).
    pub sub: Arc<str>,
    /// What everyone in the room is shown of it: a JSON object's text, bounded by
    /// `presence_max_info`.
    pub info: Option<Arc<str>>,
}

/// One member of a room.
#[derive(Debug)]
struct Entry {
    /// Its connections in the room (on this process).
    conns: u32,
    /// The info of its first connection.
    info: Option<Arc<str>>,
}

/// One room: its members in identity order (so a listing pages by identity), and the
/// connections without an identity.
#[derive(Debug, Default)]
struct Room {
    members: BTreeMap<Arc<str>, Entry>,
    anonymous: u32,
    connections: u32,
    version: u64,
}

/// A page of a room's member list, as it stood at `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The room's version when read.
    pub version: u64,
    /// Members in all.
    pub count: u64,
    /// Connections in all (members' and anonymous).
    pub connections: u64,
    /// This page: identity, info, connections.
    pub members: Vec<(Arc<str>, Option<Arc<str>>, u32)>,
    /// The identity to continue after, when there are more.
    pub next: Option<Arc<str>>,
}

/// Every room of this process.
pub struct Presence {
    patterns: Vec<Pattern>,
    /// Most members in one listing (`presence_max_members`).
    pub max_members: usize,
    /// Most rooms one connection may be in (`presence_max_topics`).
    pub max_topics: usize,
    rooms: Mutex<HashMap<Arc<str>, Room>>,
    metrics: Arc<Metrics>,
}

impl Presence {
    /// Presence as `config` describes it; `None` when `presence_topics` is empty.
    pub fn from_config(config: &Config, metrics: Arc<Metrics>) -> Result<Option<Presence>, String> {
        if config.presence_topics.is_empty() {
            return Ok(None);
        }
        let patterns = config
            .presence_topics
            .iter()
            .map(|p| Pattern::parse(p).map_err(|e| format!("presence_topics {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Presence {
            patterns,
            max_members: config.presence_max_members,
            max_topics: config.presence_max_topics,
            rooms: Mutex::new(HashMap::new()),
            metrics,
        }))
    }

    /// Whether `topic` is a room.
    pub fn tracks(&self, topic: &str) -> bool {
        clarion_proto::auth::pattern::any_matches(&self.patterns, topic)
    }

    /// A connection (`who`, or anonymous) entered room `topic`. Its identity's first connection
    /// announces a `join` through `broker`.
    pub fn join(&self, broker: &Broker, topic: &Arc<str>, who: Option<&Member>) {
        let mut rooms = lock(&self.rooms);
        let room = rooms.entry(Arc::clone(topic)).or_default();
        room.connections += 1;
        self.metrics.presence_connections.fetch_add(1, Relaxed);
        let Some(who) = who else {
            room.anonymous += 1;
            return;
        };
        if let Some(e) = room.members.get_mut(&who.sub) {
            e.conns += 1;
            return;
        }
        room.members.insert(
            Arc::clone(&who.sub),
            Entry {
                conns: 1,
                info: who.info.clone(),
            },
        );
        room.version += 1;
        self.metrics.presence_members.fetch_add(1, Relaxed);
        self.metrics.presence_joins.fetch_add(1, Relaxed);
        let json = event_json("join", topic, &who.sub, who.info.as_deref());
        broker.announce(Arc::new(Published::presence(
            Arc::clone(topic),
            room.version,
            "join",
            &json,
        )));
    }

    /// A connection left room `topic`. Its identity's last connection announces a `leave`;
    /// the room is forgotten when empty.
    pub fn leave(&self, broker: &Broker, topic: &Arc<str>, who: Option<&Member>) {
        let mut rooms = lock(&self.rooms);
        let Some(room) = rooms.get_mut(topic) else {
            return;
        };
        let name = topic;
        if room.connections == 0 {
            return;
        }
        room.connections -= 1;
        self.metrics.presence_connections.fetch_sub(1, Relaxed);
        match who {
            None => room.anonymous = room.anonymous.saturating_sub(1),
            Some(who) => {
                if let Some(e) = room.members.get_mut(&who.sub) {
                    e.conns = e.conns.saturating_sub(1);
                    if e.conns == 0 {
                        let info = room.members.remove(&who.sub).and_then(|e| e.info);
                        room.version += 1;
                        self.metrics.presence_members.fetch_sub(1, Relaxed);
                        self.metrics.presence_leaves.fetch_add(1, Relaxed);
                        let json = event_json("leave", name, &who.sub, info.as_deref());
                        broker.announce(Arc::new(Published::presence(
                            Arc::clone(name),
                            room.version,
                            "leave",
                            &json,
                        )));
                    }
                }
            }
        }
        if room.connections == 0 {
            rooms.remove(&**topic);
        }
    }

    /// Room `topic`'s members after identity `after` (from the start when `None`), at most
    /// `limit` of them (capped at `presence_max_members`).
    pub fn list(&self, topic: &str, after: Option<&str>, limit: usize) -> Listing {
        let limit = limit.clamp(1, self.max_members);
        let rooms = lock(&self.rooms);
        let Some(room) = rooms.get(topic) else {
            return Listing {
                version: 0,
                count: 0,
                connections: 0,
                members: Vec::new(),
                next: None,
            };
        };
        let range = match after {
            Some(a) => room
                .members
                .range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            None => room.members.range::<str, _>(..),
        };
        let mut members = Vec::with_capacity(limit.min(room.members.len()));
        let mut next = None;
        for (sub, e) in range {
            if members.len() == limit {
                next = members
                    .last()
                    .map(|(s, _, _): &(Arc<str>, _, _)| Arc::clone(s));
                break;
            }
            members.push((Arc::clone(sub), e.info.clone(), e.conns));
        }
        Listing {
            version: room.version,
            count: room.members.len() as u64,
            connections: u64::from(room.connections),
            members,
            next,
        }
    }

    /// Room `topic`'s counts: members and connections.
    pub fn count(&self, topic: &str) -> (u64, u64) {
        let rooms = lock(&self.rooms);
        rooms.get(topic).map_or((0, 0), |r| {
            (r.members.len() as u64, u64::from(r.connections))
        })
    }
}

/// The JSON of a `join` or `leave` event:
/// `{"type":"join","topic":"room","member":{"sub":"alice","info":{...}}}`.
pub fn event_json(kind: &str, topic: &str, sub: &str, info: Option<&str>) -> String {
    let mut out = String::with_capacity(64 + sub.len() + info.map_or(0, str::len));
    let _ = write!(
        out,
        "{{\"type\":\"{kind}\",\"topic\":\"{topic}\",\"member\":"
    );
    member_json(&mut out, sub, info, None);
    out.push('}');
    out
}

/// `{"sub":..,"info":..[,"connections":n]}` (topic names need no escaping; identities do).
fn member_json(out: &mut String, sub: &str, info: Option<&str>, conns: Option<u32>) {
    out.push_str("{\"sub\":");
    out.push_str(&serde_json::to_string(sub).unwrap_or_else(|_| "\"\"".into()));
    if let Some(info) = info {
        out.push_str(",\"info\":");
        out.push_str(info);
    }
    if let Some(n) = conns {
        let _ = write!(out, ",\"connections\":{n}");
    }
    out.push('}');
}

impl Listing {
    /// The in-band form (a subscriber's list, the answer to a `presence` message):
    /// `{"type":"presence","topic":..,"count":..,"connections":..,"members":[..],"more":..}`
    /// with `"next"` when there are more.
    pub fn message_json(&self, topic: &str) -> String {
        self.json(topic, true)
    }

    /// The API's form: `{"topic":..,"count":..,"connections":..,"members":[..]}` with each
    /// member's connections, and `"next"` when there are more.
    pub fn api_json(&self, topic: &str) -> String {
        self.json(topic, false)
    }

    fn json(&self, topic: &str, in_band: bool) -> String {
        let mut out = String::with_capacity(96 + self.members.len() * 48);
        if in_band {
            out.push_str("{\"type\":\"presence\",");
        } else {
            out.push('{');
        }
        let _ = write!(
            out,
            "\"topic\":\"{topic}\",\"count\":{},\"connections\":{},\"members\":[",
            self.count, self.connections
        );
        for (i, (sub, info, conns)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            member_json(&mut out, sub, info.as_deref(), (!in_band).then_some(*conns));
        }
        out.push(']');
        if in_band {
            let _ = write!(out, ",\"more\":{}", self.next.is_some());
        }
        if let Some(next) = &self.next {
            out.push_str(",\"next\":");
            out.push_str(&serde_json::to_string(&**next).unwrap_or_else(|_| "\"\"".into()));
        }
        out.push('}');
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::hub::Inbox;

    fn setup(workers: usize) -> (Presence, Broker, Vec<Arc<Inbox>>, Vec<mio::Poll>) {
        let metrics = Arc::new(Metrics::default());
        let mut polls = Vec::new();
        let mut inboxes = Vec::new();
        for _ in 0..workers {
            let poll = mio::Poll::new().unwrap();
            let waker = mio::Waker::new(poll.registry(), mio::Token(0)).unwrap();
            inboxes.push(Arc::new(Inbox::new(waker)));
            polls.push(poll);
        }
        let config = Config {
            presence_topics: vec!["room.*".into()],
            presence_max_members: 2,
            ..Config::default()
        };
        let broker = Broker::local(
            inboxes.clone(),
            Arc::clone(&metrics),
            config.history_limits(),
        );
        let p = Presence::from_config(&config, metrics).unwrap().unwrap();
        (p, broker, inboxes, polls)
    }

    fn member(sub: &str) -> Member {
        Member {
            sub: sub.into(),
            info: Some("{\"name\":\"A \\\"q\\\"\"}".into()),
        }
    }

    fn events(inbox: &Inbox) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        inbox.take(&mut out);
        out.iter()
            .filter(|m| m.presence)
            .map(|m| (m.id, String::from_utf8_lossy(m.payload()).into_owned()))
            .collect()
    }

    #[test]
    fn one_identity_is_one_member_joining_first_and_leaving_last() {
        let (p, broker, inboxes, _polls) = setup(1);
        assert!(p.tracks("room.1") && !p.tracks("news"));
        let topic: Arc<str> = "room.1".into();
        let mut pending = Vec::new();
        broker
            .subscribe(0, &["room.1"], crate::broker::Since::Now, &mut pending)
            .unwrap();
        let alice = member("alice");
        p.join(&broker, &topic, Some(&alice));
        p.join(&broker, &topic, Some(&alice));
        p.join(&broker, &topic, None);
        let got = events(&inboxes[0]);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, 1);
        let v: serde_json::Value = serde_json::from_str(&got[0].1).unwrap();
        assert_eq!(v["type"], "join");
        assert_eq!(v["member"]["sub"], "alice");
        assert_eq!(v["member"]["info"]["name"], "A \"q\"");
        assert_eq!(p.count("room.1"), (1, 3));
        p.leave(&broker, &topic, Some(&alice));
        assert!(events(&inboxes[0]).is_empty());
        p.leave(&broker, &topic, Some(&alice));
        let got = events(&inboxes[0]);
        assert_eq!(got.len(), 1);
        assert!(got[0].1.contains("\"type\":\"leave\""));
        assert_eq!(got[0].0, 2);
        p.leave(&broker, &topic, None);
        // Empty rooms are forgotten; extra leaves are harmless.
        p.leave(&broker, &topic, None);
        assert_eq!(p.count("room.1"), (0, 0));
        assert_eq!(p.metrics.presence_members.load(Relaxed), 0);
        assert_eq!(p.metrics.presence_connections.load(Relaxed), 0);
    }

    #[test]
    fn listings_page_in_identity_order() {
        let (p, broker, _inboxes, _polls) = setup(1);
        let topic: Arc<str> = "room.x".into();
        for s in ["carol", "alice", "bob"] {
            p.join(&broker, &topic, Some(&member(s)));
        }
        let first = p.list("room.x", None, 100);
        let names: Vec<&str> = first.members.iter().map(|m| &*m.0).collect();
        assert_eq!(names, ["alice", "bob"]);
        assert_eq!(first.next.as_deref(), Some("bob"));
        assert_eq!(first.count, 3);
        let second = p.list("room.x", first.next.as_deref(), 100);
        assert_eq!(second.members.len(), 1);
        assert_eq!(second.next, None);
        let v: serde_json::Value = serde_json::from_str(&first.message_json("room.x")).unwrap();
        assert_eq!(v["type"], "presence");
        assert_eq!(v["more"], true);
        assert_eq!(v["next"], "bob");
        let v: serde_json::Value = serde_json::from_str(&second.api_json("room.x")).unwrap();
        assert_eq!(v["members"][0]["sub"], "carol");
        assert_eq!(v["members"][0]["connections"], 1);
        assert_eq!(v["count"], 3);
        assert!(v.get("next").is_none());
        assert_eq!(p.list("nothing", None, 5).count, 0);
    }

    #[test]
    fn events_reach_only_workers_with_subscribers() {
        let (p, broker, inboxes, _polls) = setup(2);
        let topic: Arc<str> = "room.2".into();
        let mut pending = Vec::new();
        broker
            .subscribe(1, &["room.2"], crate::broker::Since::Now, &mut pending)
            .unwrap();
        p.join(&broker, &topic, Some(&member("bob")));
        assert!(events(&inboxes[0]).is_empty());
        assert_eq!(events(&inboxes[1]).len(), 1);
    }
}
