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
//!
//! **With the Redis broker** the rooms are the cluster's, in Redis
//! ([`crate::broker::redis::presence`]). This process still keeps its own connections' part
//! of each room (to write it again after Redis lost it), but instead of announcing events it
//! queues each change for the presence thread ([`Presence::run`]), which applies them in order
//! in batches; the script publishes the events on the topic's channel, and they come back to
//! every node through the broker's reader, in order with the topic's messages. Member lists
//! and counts are read from Redis. With NATS (or one process) rooms are per process.

mod members;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::auth::Pattern;

use crate::broker::redis::presence::{RoomChange, RoomState, KEEPALIVE};
use crate::broker::Broker;
use crate::config::Config;
use crate::hub::lock;
use crate::message::Published;
use crate::metrics::Metrics;
use members::{Entry, Members};

/// Who a connection is in the rooms it joins: set once per connection, shared by its rooms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The identity (`sub`).
    pub sub: Arc<str>,
    /// What everyone in the room is shown of it: a JSON object's text, bounded by
    /// `presence_max_info`.
    pub info: Option<Arc<str>>,
}

/// One room: its members in identity order (so a listing pages by identity), and the
/// connections without an identity.
#[derive(Debug, Default)]
struct Room {
    members: Members,
    anonymous: u32,
    connections: u32,
    version: u64,
    /// Subscribers on this process that asked for events: without any, no event is made.
    listeners: u32,
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
    /// With the Redis broker: changes waiting for the presence thread.
    cluster: Option<Cluster>,
}

/// The queue between the workers and the presence thread (Redis broker only).
struct Cluster {
    changes: Mutex<Vec<RoomChange>>,
    wake: Condvar,
    /// A change could not be applied (Redis down), or Redis lost this node's part: the next
    /// round writes every room again instead of the queued changes.
    dirty: AtomicBool,
    /// Rounds of the presence thread, for tests and the log.
    rounds: AtomicU64,
}

/// Longest a change waits for others to share its round trip: a connect storm becomes a few
/// pipelines, a single join is seen by others within a few milliseconds.
const BATCH_WAIT: Duration = Duration::from_millis(5);

impl Presence {
    /// Presence as `config` describes it; `None` when `presence_topics` is empty.
    ///
    /// `clustered`: the broker is Redis, which holds the rooms.
    pub fn from_config(
        config: &Config,
        metrics: Arc<Metrics>,
        clustered: bool,
    ) -> Result<Option<Presence>, String> {
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
            cluster: clustered.then(|| Cluster {
                changes: Mutex::new(Vec::new()),
                wake: Condvar::new(),
                dirty: AtomicBool::new(false),
                rounds: AtomicU64::new(0),
            }),
        }))
    }

    /// Queues changes for the presence thread (cluster mode).
    fn queue(&self, changes: impl IntoIterator<Item = RoomChange>) {
        if let Some(c) = &self.cluster {
            lock(&c.changes).extend(changes);
            c.wake.notify_one();
        }
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
        if self.cluster.is_some() {
            let mut changes = vec![RoomChange::Connections {
                topic: Arc::clone(topic),
                n: room.connections,
                listening: room.listeners > 0,
            }];
            if let Some(who) = who {
                changes.push(RoomChange::Add {
                    topic: Arc::clone(topic),
                    sub: Arc::clone(&who.sub),
                    n: 1,
                    info: who.info.clone(),
                });
            }
            self.queue(changes);
        }
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
        if self.cluster.is_some() || room.listeners == 0 {
            // Redis announces it to every node; nobody here listens.
            return;
        }
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
        if self.cluster.is_some() {
            let mut changes = Vec::with_capacity(2);
            if let Some(who) = who.filter(|w| room.members.contains(&w.sub)) {
                changes.push(RoomChange::Remove {
                    topic: Arc::clone(topic),
                    sub: Arc::clone(&who.sub),
                    n: 1,
                });
            }
            changes.push(RoomChange::Connections {
                topic: Arc::clone(topic),
                n: room.connections,
                listening: room.listeners > 0,
            });
            self.queue(changes);
        }
        let announce = self.cluster.is_none() && room.listeners > 0;
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
                        if announce {
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
        }
        if room.connections == 0 && room.listeners == 0 {
            rooms.remove(&**topic);
        }
    }

    /// Room `topic`'s members after identity `after` (from the start when `None`), at most
    /// `limit` of them (capped at `presence_max_members`).
    pub fn list(
        &self,
        broker: &Broker,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Listing, String> {
        self.read(broker, topic, after, limit, false)
    }

    /// A subscriber of this process asks for room `topic`'s events: its first member list,
    /// read once events are sure to be made for it (until [`Presence::unlisten`]).
    pub fn listen(
        &self,
        broker: &Broker,
        topic: &Arc<str>,
        limit: usize,
    ) -> Result<Listing, String> {
        self.watch(topic);
        self.read(broker, topic, None, limit, true)
    }

    /// Events of room `topic` are wanted here from now on (a subscriber, or a held long-poll
    /// that is answered by the next change), until [`Presence::unlisten`].
    pub fn watch(&self, topic: &Arc<str>) {
        let mut rooms = lock(&self.rooms);
        let room = rooms.entry(Arc::clone(topic)).or_default();
        room.listeners += 1;
        if room.listeners == 1 {
            let n = room.connections;
            self.queue([RoomChange::Connections {
                topic: Arc::clone(topic),
                n,
                listening: true,
            }]);
        }
    }

    /// A subscriber (or held poll) that wanted room `topic`'s events is gone.
    pub fn unlisten(&self, topic: &str) {
        let mut rooms = lock(&self.rooms);
        if let Some(room) = rooms.get_mut(topic) {
            room.listeners = room.listeners.saturating_sub(1);
            if room.listeners == 0 && room.connections == 0 {
                rooms.remove(topic);
            }
        }
    }

    fn read(
        &self,
        broker: &Broker,
        topic: &str,
        after: Option<&str>,
        limit: usize,
        listen: bool,
    ) -> Result<Listing, String> {
        let limit = limit.clamp(1, self.max_members);
        if let (Some(_), Broker::Redis(b)) = (&self.cluster, broker) {
            let page = b
                .presence_list(topic, after, limit, listen)
                .map_err(|e| format!("presence unavailable: {e}"))?;
            let next = if page.more {
                page.members.last().map(|(s, _, _)| Arc::clone(s))
            } else {
                None
            };
            return Ok(Listing {
                version: page.version,
                count: page.count,
                connections: page.connections,
                members: page.members,
                next,
            });
        }
        Ok(self.list_here(topic, after, limit))
    }

    /// [`Presence::list`] of this process's own part.
    fn list_here(&self, topic: &str, after: Option<&str>, limit: usize) -> Listing {
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
        let range = room.members.after(after);
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
    pub fn count(&self, broker: &Broker, topic: &str) -> Result<(u64, u64), String> {
        if let (Some(_), Broker::Redis(b)) = (&self.cluster, broker) {
            return b
                .presence_count(topic)
                .map_err(|e| format!("presence unavailable: {e}"));
        }
        let rooms = lock(&self.rooms);
        Ok(rooms.get(topic).map_or((0, 0), |r| {
            (r.members.len() as u64, u64::from(r.connections))
        }))
    }

    /// Whether rooms live in Redis (and [`Presence::run`] must run).
    pub fn clustered(&self) -> bool {
        self.cluster.is_some()
    }

    /// The presence thread (Redis broker only), until `stop`: first takes this node's previous
    /// life out of every room (a restarted process has the same name), then applies queued
    /// changes in batches, refreshes this node's liveness, reaps dead nodes, and writes every
    /// room again whenever Redis lost this node's part or a change could not be applied.
    pub fn run(&self, broker: &Broker, stop: &AtomicBool) {
        let (Some(c), Broker::Redis(b)) = (&self.cluster, broker) else {
            return;
        };
        // Whatever a previous process of this name left behind; then this one's rooms.
        c.dirty.store(true, Relaxed);
        let node = b.node_name().to_owned();
        let mut fresh = b.presence_reap(&node).is_ok();
        let mut next_beat = Instant::now();
        while !stop.load(Relaxed) {
            let batch = {
                let mut q = lock(&c.changes);
                if q.is_empty() {
                    let wait = next_beat.saturating_duration_since(Instant::now());
                    q = c
                        .wake
                        .wait_timeout(q, wait.min(Duration::from_millis(200)))
                        .map_or_else(|p| p.into_inner().0, |(g, _)| g);
                }
                if !q.is_empty() {
                    drop(q);
                    std::thread::sleep(BATCH_WAIT);
                    q = lock(&c.changes);
                }
                std::mem::take(&mut *q)
            };
            if Instant::now() >= next_beat {
                next_beat = Instant::now() + KEEPALIVE;
                match b.presence_keepalive() {
                    Ok(lost) => {
                        if lost && fresh {
                            fresh = false;
                        } else if lost {
                            crate::log::warn(format_args!(
                                "presence: Redis lost this node's rooms (restarted, or this node was cut off); writing them again"
                            ));
                            c.dirty.store(true, Relaxed);
                        }
                        if let Err(e) = b.presence_reap_dead() {
                            crate::log::warn(format_args!("presence: reaping: {e}"));
                        }
                    }
                    Err(e) => {
                        crate::log::warn(format_args!("presence: keepalive: {e}"));
                        c.dirty.store(true, Relaxed);
                    }
                }
            }
            if c.dirty.load(Relaxed) {
                // Every room as it is now covers the changes taken above.
                let rooms = self.states();
                match b.presence_sync(&rooms) {
                    Ok(()) => {
                        c.dirty.store(false, Relaxed);
                        fresh = false;
                    }
                    Err(e) => crate::log::warn(format_args!("presence: writing rooms: {e}")),
                }
            } else if !batch.is_empty() {
                if let Err(e) = b.presence_apply(&batch) {
                    crate::log::warn(format_args!("presence: {e}; will write every room again"));
                    c.dirty.store(true, Relaxed);
                }
            }
            c.rounds.fetch_add(1, Relaxed);
        }
    }

    /// At shutdown (Redis broker): this node leaves every room at once, after its
    /// connections are gone, so other nodes see its members leave now rather than when its
    /// liveness expires.
    pub fn leave_cluster(&self, broker: &Broker) {
        if let (Some(_), Broker::Redis(b)) = (&self.cluster, broker) {
            let node = b.node_name().to_owned();
            if let Err(e) = b.presence_reap(&node) {
                crate::log::warn(format_args!("presence: leaving: {e}"));
            }
        }
    }

    /// This process's part of every room, for a `sync`, and the queue emptied in the same
    /// step: changes are queued under the rooms lock, so every change still queued is in
    /// these states and must not be applied again on top of them.
    fn states(&self) -> Vec<RoomState> {
        let rooms = lock(&self.rooms);
        if let Some(c) = &self.cluster {
            lock(&c.changes).clear();
        }
        rooms
            .iter()
            .map(|(topic, r)| RoomState {
                topic: Arc::clone(topic),
                connections: r.connections,
                listening: r.listeners > 0,
                members: r
                    .members
                    .after(None)
                    .map(|(s, e)| (Arc::clone(s), e.conns, e.info.clone()))
                    .collect(),
            })
            .collect()
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
        let p = Presence::from_config(&config, metrics, false)
            .unwrap()
            .unwrap();
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
        // Without a subscriber asking for events none are made.
        p.join(&broker, &topic, None);
        assert!(events(&inboxes[0]).is_empty());
        p.leave(&broker, &topic, None);
        p.join(&broker, &topic, None);
        p.listen(&broker, &topic, 10).unwrap();
        p.join(&broker, &topic, Some(&alice));
        p.join(&broker, &topic, Some(&alice));
        let got = events(&inboxes[0]);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, 1);
        let v: serde_json::Value = serde_json::from_str(&got[0].1).unwrap();
        assert_eq!(v["type"], "join");
        assert_eq!(v["member"]["sub"], "alice");
        assert_eq!(v["member"]["info"]["name"], "A \"q\"");
        assert_eq!(p.count(&broker, "room.1").unwrap(), (1, 3));
        p.leave(&broker, &topic, Some(&alice));
        assert!(events(&inboxes[0]).is_empty());
        p.leave(&broker, &topic, Some(&alice));
        let got = events(&inboxes[0]);
        assert_eq!(got.len(), 1);
        assert!(got[0].1.contains("\"type\":\"leave\""));
        assert_eq!(got[0].0, 2);
        p.unlisten("room.1");
        p.leave(&broker, &topic, None);
        // Empty rooms are forgotten; extra leaves are harmless.
        p.leave(&broker, &topic, None);
        assert_eq!(p.count(&broker, "room.1").unwrap(), (0, 0));
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
        let first = p.list(&broker, "room.x", None, 100).unwrap();
        let names: Vec<&str> = first.members.iter().map(|m| &*m.0).collect();
        assert_eq!(names, ["alice", "bob"]);
        assert_eq!(first.next.as_deref(), Some("bob"));
        assert_eq!(first.count, 3);
        let second = p
            .list(&broker, "room.x", first.next.as_deref(), 100)
            .unwrap();
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
        assert_eq!(p.list(&broker, "nothing", None, 5).unwrap().count, 0);
    }

    #[test]
    fn events_reach_only_workers_with_subscribers() {
        let (p, broker, inboxes, _polls) = setup(2);
        let topic: Arc<str> = "room.2".into();
        let mut pending = Vec::new();
        broker
            .subscribe(1, &["room.2"], crate::broker::Since::Now, &mut pending)
            .unwrap();
        p.join(&broker, &topic, None);
        p.listen(&broker, &topic, 10).unwrap();
        p.join(&broker, &topic, Some(&member("bob")));
        assert!(events(&inboxes[0]).is_empty());
        assert_eq!(events(&inboxes[1]).len(), 1);
    }
}
