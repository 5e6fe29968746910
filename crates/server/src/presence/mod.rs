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
//! subscription, and only connections in rooms (or identified ones that may join one) have a
//! slot in this module's per-worker tables ([`conns`]).
//!
//! **With the Redis broker** the rooms are the cluster's, in Redis
//! ([`crate::broker::rooms`]): member lists, counts, versions and events are Redis's,
//! and this process keeps per member only its connections' slots (identity and rooms), plus per
//! room its connection and listener counts. Instead of announcing events it queues each change
//! for the presence thread ([`Presence::run`]), which applies them in order in batches; the
//! script publishes the events on the topic's channel, and they come back to every node through
//! the broker's reader, in order with the topic's messages. When Redis lost this node's part,
//! the thread rebuilds it from the slots. With NATS (or one process) rooms are per process,
//! with their members kept here.

mod conns;
pub mod handover;
mod ident;
mod members;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::auth::Pattern;

use crate::broker::rooms::{RoomChange, RoomState, KEEPALIVE};
use crate::broker::Broker;
use crate::config::Config;
use crate::hub::lock;
use crate::message::Published;
use crate::metrics::Metrics;
pub use ident::Ident;
use members::{Entry, Members};

/// One room on this process: its connections and the subscribers here that asked for events;
/// without Redis also its members and version (with Redis those are Redis's).
#[derive(Debug, Default)]
struct Room {
    connections: u32,
    /// Subscribers on this process that asked for events: without any, no event is made.
    listeners: u32,
    local: Option<Box<Local>>,
}

/// A room's members in identity order (so a listing pages by identity), and its version.
#[derive(Debug, Default)]
struct Local {
    members: Members,
    version: u64,
}

/// What the lock guards: the rooms, and each connection's part.
struct Tables {
    rooms: HashMap<Arc<str>, Room>,
    conns: conns::Conns,
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

/// The rooms Pusher presence channels are (`docs/pusher.md`).
pub const PUSHER_PRESENCE_PATTERN: &str = "presence-*";

/// Every room of this process.
pub struct Presence {
    patterns: Vec<Pattern>,
    /// Most members in one listing (`presence_max_members`).
    pub max_members: usize,
    /// Most rooms one connection may be in (`presence_max_topics`).
    pub max_topics: usize,
    tables: Mutex<Tables>,
    metrics: Arc<Metrics>,
    /// With the Redis broker: changes waiting for the presence thread.
    cluster: Option<Cluster>,
    /// `presence_list_anonymous`: the identities made for connections without one, a
    /// random prefix for this process and a counter.
    anonymous: Option<(u32, AtomicU64)>,
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
        // Pusher's `presence-` channels are rooms whenever a Pusher application is configured.
        let pusher = config.pusher_enabled().then_some(PUSHER_PRESENCE_PATTERN);
        if config.presence_topics.is_empty() && pusher.is_none() {
            return Ok(None);
        }
        let patterns = config
            .presence_topics
            .iter()
            .map(String::as_str)
            .chain(pusher)
            .map(|p| Pattern::parse(p).map_err(|e| format!("presence_topics {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Presence {
            patterns,
            max_members: config.presence_max_members,
            max_topics: config.presence_max_topics,
            tables: Mutex::new(Tables {
                rooms: HashMap::new(),
                conns: conns::Conns::new(config.connection_cap()),
            }),
            metrics,
            cluster: clustered.then(|| Cluster {
                changes: Mutex::new(Vec::new()),
                wake: Condvar::new(),
                dirty: AtomicBool::new(false),
                rounds: AtomicU64::new(0),
            }),
            anonymous: config
                .presence_list_anonymous
                .then(|| (process_prefix(), AtomicU64::new(1))),
        }))
    }

    /// An identity for a connection that has none (`presence_list_anonymous`): `~`, this
    /// process's prefix and a counter, so it is unique across the cluster and short enough to
    /// be kept inline.
    fn anonymous_ident(&self) -> Option<Ident> {
        let (prefix, next) = self.anonymous.as_ref()?;
        let n = next.fetch_add(1, Relaxed);
        Some(Ident::new(&format!("~{prefix:08x}.{n:x}"), None))
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

    /// Records connection `k` of `worker` as `sub` (with `info`) for the rooms it will enter,
    /// or as nobody. An identity already used in rooms stays until the connection leaves them
    /// (a refreshed token with another `sub` does not make it someone else in the middle).
    pub fn identify(&self, worker: usize, k: u32, sub: Option<&str>, info: Option<&str>) {
        let mut t = lock(&self.tables);
        if t.conns.get(worker, k).is_some_and(|s| s.rooms() > 0) {
            return;
        }
        match sub {
            Some(sub) => t.conns.slot(worker, k).ident = Some(Ident::new(sub, info)),
            None => {
                t.conns.take(worker, k);
            }
        }
    }

    /// Forgets connection `k`'s identity if it is in no room (a stream that subscribed to
    /// other topics cannot join one later).
    pub fn settle(&self, worker: usize, k: u32) {
        let mut t = lock(&self.tables);
        if t.conns.get(worker, k).is_some_and(|s| s.rooms() == 0) {
            t.conns.take(worker, k);
        }
    }

    /// How many rooms connection `k` is in.
    pub fn rooms_of(&self, worker: usize, k: u32) -> usize {
        lock(&self.tables)
            .conns
            .get(worker, k)
            .map_or(0, |s| s.rooms())
    }

    /// The member (`sub`) connection `k` is in its rooms as; `None` when it is in none.
    pub fn member_of(&self, worker: usize, k: u32) -> Option<Box<str>> {
        let t = lock(&self.tables);
        let slot = t.conns.get(worker, k).filter(|s| s.rooms() > 0)?;
        slot.ident.as_ref().map(|i| i.sub().into())
    }

    /// Connection `k` subscribed to room `topic`: it enters, under its identity if it has one.
    /// Its identity's first connection announces a `join` through `broker`.
    pub fn enter(&self, broker: &Broker, worker: usize, k: u32, topic: &Arc<str>) {
        let mut t = lock(&self.tables);
        let Tables { rooms, conns } = &mut *t;
        let slot = conns.slot(worker, k);
        if slot.has(topic) {
            return;
        }
        if slot.ident.is_none() {
            slot.ident = self.anonymous_ident();
        }
        slot.add(Arc::clone(topic));
        self.join(rooms, broker, topic, slot.ident.as_ref());
    }

    /// Connection `k` left topic `topic`: it leaves the room, if it was in it.
    pub fn exit(&self, broker: &Broker, worker: usize, k: u32, topic: &Arc<str>) {
        let mut t = lock(&self.tables);
        let Tables { rooms, conns } = &mut *t;
        let Some(slot) = conns.get(worker, k).filter(|s| s.has(topic)) else {
            return;
        };
        let who = slot.ident.clone();
        conns.slot(worker, k).take(topic);
        conns.tidy(worker, k);
        self.leave(rooms, broker, topic, who.as_ref());
    }

    /// Connection `k` is gone: it leaves whatever rooms it was still in, and is forgotten.
    pub fn forget(&self, broker: &Broker, worker: usize, k: u32) {
        let mut t = lock(&self.tables);
        let Tables { rooms, conns } = &mut *t;
        let slot = conns.take(worker, k);
        for topic in slot.names() {
            self.leave(rooms, broker, topic, slot.ident.as_ref());
        }
    }

    /// A connection (`who`, or anonymous) entered room `topic`.
    fn join(
        &self,
        rooms: &mut HashMap<Arc<str>, Room>,
        broker: &Broker,
        topic: &Arc<str>,
        who: Option<&Ident>,
    ) {
        self.metrics.presence_connections.fetch_add(1, Relaxed);
        if self.cluster.is_some() {
            // Redis counts the connections and the member's over the cluster and announces the
            // join; only a room with listeners here has an entry (its flag goes along).
            let mut changes = vec![RoomChange::Connections {
                topic: Arc::clone(topic),
                delta: 1,
                listening: rooms.get(topic).is_some_and(|r| r.listeners > 0),
            }];
            if let Some(who) = who {
                self.metrics.presence_members.fetch_add(1, Relaxed);
                changes.push(RoomChange::Add {
                    topic: Arc::clone(topic),
                    sub: who.sub().into(),
                    n: 1,
                    info: who.info().map(Into::into),
                });
            }
            self.queue(changes);
            return;
        }
        let room = rooms.entry(Arc::clone(topic)).or_default();
        room.connections += 1;
        let listening = room.listeners > 0;
        let local = room.local.get_or_insert_with(Default::default);
        let Some(who) = who else {
            return;
        };
        if let Some(e) = local.members.get_mut(who.sub()) {
            e.conns += 1;
            return;
        }
        let info: Option<Arc<str>> = who.info().map(Into::into);
        local.members.insert(
            who.sub().into(),
            Entry {
                conns: 1,
                info: info.clone(),
            },
        );
        local.version += 1;
        self.metrics.presence_members.fetch_add(1, Relaxed);
        self.metrics.presence_joins.fetch_add(1, Relaxed);
        if listening {
            announce(
                broker,
                topic,
                local.version,
                "join",
                who.sub(),
                info.as_deref(),
            );
        }
    }

    /// A connection left room `topic`. Its identity's last connection announces a `leave`;
    /// the room is forgotten when empty.
    fn leave(
        &self,
        rooms: &mut HashMap<Arc<str>, Room>,
        broker: &Broker,
        topic: &Arc<str>,
        who: Option<&Ident>,
    ) {
        if self.cluster.is_some() {
            // The connection's slot said it was in the room: Redis takes it out.
            self.metrics.presence_connections.fetch_sub(1, Relaxed);
            let mut changes = Vec::with_capacity(2);
            if let Some(who) = who {
                self.metrics.presence_members.fetch_sub(1, Relaxed);
                changes.push(RoomChange::Remove {
                    topic: Arc::clone(topic),
                    sub: who.sub().into(),
                    n: 1,
                });
            }
            changes.push(RoomChange::Connections {
                topic: Arc::clone(topic),
                delta: -1,
                listening: rooms.get(topic).is_some_and(|r| r.listeners > 0),
            });
            self.queue(changes);
            return;
        }
        let Some(room) = rooms.get_mut(topic) else {
            return;
        };
        if room.connections == 0 {
            return;
        }
        room.connections -= 1;
        self.metrics.presence_connections.fetch_sub(1, Relaxed);
        if let (Some(who), Some(local)) = (who, room.local.as_mut()) {
            if let Some(e) = local.members.get_mut(who.sub()) {
                e.conns = e.conns.saturating_sub(1);
                if e.conns == 0 {
                    let info = local.members.remove(who.sub()).and_then(|e| e.info);
                    local.version += 1;
                    self.metrics.presence_members.fetch_sub(1, Relaxed);
                    self.metrics.presence_leaves.fetch_add(1, Relaxed);
                    if room.listeners > 0 {
                        let info = info.as_deref();
                        announce(broker, topic, local.version, "leave", who.sub(), info);
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
        let mut t = lock(&self.tables);
        let room = t.rooms.entry(Arc::clone(topic)).or_default();
        room.listeners += 1;
        if room.listeners == 1 {
            self.queue([RoomChange::Connections {
                topic: Arc::clone(topic),
                delta: 0,
                listening: true,
            }]);
        }
    }

    /// A subscriber (or held poll) that wanted room `topic`'s events is gone.
    pub fn unlisten(&self, topic: &str) {
        let mut t = lock(&self.tables);
        if let Some(room) = t.rooms.get_mut(topic) {
            room.listeners = room.listeners.saturating_sub(1);
            if room.listeners == 0 && room.connections == 0 {
                t.rooms.remove(topic);
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
        if let (Some(_), Some(rooms)) = (&self.cluster, broker.shared_rooms()) {
            let page = rooms
                .list(topic, after, limit, listen)
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
        let t = lock(&self.tables);
        let room = t.rooms.get(topic);
        let mut listing = Listing {
            version: 0,
            count: 0,
            connections: room.map_or(0, |r| u64::from(r.connections)),
            members: Vec::new(),
            next: None,
        };
        let Some(local) = room.and_then(|r| r.local.as_ref()) else {
            return listing;
        };
        listing.version = local.version;
        listing.count = local.members.len() as u64;
        listing.members.reserve(limit.min(local.members.len()));
        for (sub, e) in local.members.after(after) {
            if listing.members.len() == limit {
                listing.next = listing.members.last().map(|m| Arc::clone(&m.0));
                break;
            }
            listing
                .members
                .push((Arc::clone(sub), e.info.clone(), e.conns));
        }
        listing
    }

    /// Room `topic`'s counts: members and connections.
    pub fn count(&self, broker: &Broker, topic: &str) -> Result<(u64, u64), String> {
        if let (Some(_), Some(rooms)) = (&self.cluster, broker.shared_rooms()) {
            return rooms
                .count(topic)
                .map_err(|e| format!("presence unavailable: {e}"));
        }
        let t = lock(&self.tables);
        Ok(t.rooms.get(topic).map_or((0, 0), |r| {
            let members = r.local.as_ref().map_or(0, |l| l.members.len());
            (members as u64, u64::from(r.connections))
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
        let (Some(c), Some(b)) = (&self.cluster, broker.shared_rooms()) else {
            return;
        };
        // Whatever a previous process of this name left behind; then this one's rooms.
        c.dirty.store(true, Relaxed);
        let node = b.node_name().to_owned();
        let mut fresh = b.reap(&node).is_ok();
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
                match b.keepalive() {
                    Ok(lost) => {
                        if lost && fresh {
                            fresh = false;
                        } else if lost {
                            crate::log::warn(format_args!(
                                "presence: Redis lost this node's rooms (restarted, or this node was cut off); writing them again"
                            ));
                            c.dirty.store(true, Relaxed);
                        }
                        if let Err(e) = b.reap_dead() {
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
                match b.sync(&rooms) {
                    Ok(()) => {
                        c.dirty.store(false, Relaxed);
                        fresh = false;
                    }
                    Err(e) => crate::log::warn(format_args!("presence: writing rooms: {e}")),
                }
            } else if !batch.is_empty() {
                if let Err(e) = b.apply(&batch) {
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
        if let (Some(_), Some(rooms)) = (&self.cluster, broker.shared_rooms()) {
            let node = rooms.node_name().to_owned();
            if let Err(e) = rooms.reap(&node) {
                crate::log::warn(format_args!("presence: leaving: {e}"));
            }
        }
    }

    /// This process's part of every room, for a `sync`, and the queue emptied in the same
    /// step: changes are queued under the rooms lock, so every change still queued is in
    /// these states and must not be applied again on top of them.
    fn states(&self) -> Vec<RoomState> {
        let t = lock(&self.tables);
        if let Some(c) = &self.cluster {
            lock(&c.changes).clear();
        }
        // Per room, from each connection's slot: its connections, and its members (sub,
        // connections, info).
        type Part = (u32, HashMap<String, (u32, Option<Arc<str>>)>);
        let mut parts: HashMap<&Arc<str>, Part> = HashMap::new();
        for slot in t.conns.in_rooms() {
            for topic in slot.names() {
                let (conns, members) = parts.entry(topic).or_default();
                *conns += 1;
                if let Some(who) = &slot.ident {
                    members
                        .entry(who.sub().to_owned())
                        .or_insert_with(|| (0, who.info().map(Into::into)))
                        .0 += 1;
                }
            }
        }
        // Rooms listened to here with no connection here are written too (for their flag).
        for topic in t.rooms.keys() {
            parts.entry(topic).or_default();
        }
        parts
            .into_iter()
            .map(|(topic, (connections, members))| RoomState {
                topic: Arc::clone(topic),
                connections,
                listening: t.rooms.get(topic).is_some_and(|r| r.listeners > 0),
                members: members
                    .into_iter()
                    .map(|(sub, (n, info))| (sub.into(), n, info))
                    .collect(),
            })
            .collect()
    }
}

/// Hands a `join` or `leave` of `sub` in room `topic`, at `version`, to the broker's fan-out.
fn announce(
    broker: &Broker,
    topic: &Arc<str>,
    version: u64,
    kind: &str,
    sub: &str,
    info: Option<&str>,
) {
    let json = event_json(kind, topic, sub, info);
    broker.announce(Arc::new(Published::presence(
        Arc::clone(topic),
        version,
        kind,
        &json,
    )));
}

/// 32 random bits naming this process's anonymous identities (the clock and the process id
/// if the system has no randomness to give).
fn process_prefix() -> u32 {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 4];
    match ring::rand::SystemRandom::new().fill(&mut b) {
        Ok(()) => u32::from_le_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            t ^ std::process::id().rotate_left(16)
        }
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

    const INFO: &str = "{\"name\":\"A \\\"q\\\"\"}";

    /// Connection `k` of worker 0 as `sub`, in room `topic`.
    fn enter(p: &Presence, broker: &Broker, k: u32, sub: Option<&str>, topic: &Arc<str>) {
        p.identify(0, k, sub, sub.map(|_| INFO));
        p.enter(broker, 0, k, topic);
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
        // Without a subscriber asking for events none are made.
        enter(&p, &broker, 1, None, &topic);
        assert!(events(&inboxes[0]).is_empty());
        p.exit(&broker, 0, 1, &topic);
        enter(&p, &broker, 1, None, &topic);
        p.listen(&broker, &topic, 10).unwrap();
        enter(&p, &broker, 2, Some("alice"), &topic);
        enter(&p, &broker, 3, Some("alice"), &topic);
        // Entering twice counts once.
        p.enter(&broker, 0, 3, &topic);
        let got = events(&inboxes[0]);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, 1);
        let v: serde_json::Value = serde_json::from_str(&got[0].1).unwrap();
        assert_eq!(v["type"], "join");
        assert_eq!(v["member"]["sub"], "alice");
        assert_eq!(v["member"]["info"]["name"], "A \"q\"");
        assert_eq!(p.count(&broker, "room.1").unwrap(), (1, 3));
        assert_eq!(p.rooms_of(0, 2), 1);
        p.exit(&broker, 0, 2, &topic);
        assert!(events(&inboxes[0]).is_empty());
        // A connection that is gone leaves what it was still in.
        p.forget(&broker, 0, 3);
        let got = events(&inboxes[0]);
        assert_eq!(got.len(), 1);
        assert!(got[0].1.contains("\"type\":\"leave\""));
        assert_eq!(got[0].0, 2);
        p.unlisten("room.1");
        p.exit(&broker, 0, 1, &topic);
        // Empty rooms are forgotten; extra leaves are harmless.
        p.exit(&broker, 0, 1, &topic);
        p.forget(&broker, 0, 1);
        assert_eq!(p.count(&broker, "room.1").unwrap(), (0, 0));
        assert_eq!(p.metrics.presence_members.load(Relaxed), 0);
        assert_eq!(p.metrics.presence_connections.load(Relaxed), 0);
        assert_eq!(lock(&p.tables).conns.in_rooms().count(), 0);
    }

    #[test]
    fn an_identity_in_use_stays_and_one_not_used_is_settled() {
        let (p, broker, _inboxes, _polls) = setup(1);
        let topic: Arc<str> = "room.s".into();
        enter(&p, &broker, 4, Some("dana"), &topic);
        // A refreshed token naming someone else does not change who is in the room.
        p.identify(0, 4, Some("eve"), None);
        let list = p.list(&broker, "room.s", None, 10).unwrap();
        assert_eq!(&*list.members[0].0, "dana");
        p.exit(&broker, 0, 4, &topic);
        assert_eq!(p.count(&broker, "room.s").unwrap(), (0, 0));
        // Identified, in no room: kept until settled.
        p.identify(0, 5, Some("fay"), None);
        assert!(lock(&p.tables)
            .conns
            .get(0, 5)
            .is_some_and(|s| s.ident.is_some()));
        p.settle(0, 5);
        assert!(lock(&p.tables)
            .conns
            .get(0, 5)
            .is_some_and(|s| s.ident.is_none()));
    }

    #[test]
    fn anonymous_connections_are_listed_when_configured() {
        let config = Config {
            presence_topics: vec!["room.*".into()],
            presence_list_anonymous: true,
            ..Config::default()
        };
        let p = Presence::from_config(&config, Arc::new(Metrics::default()), false)
            .unwrap()
            .unwrap();
        let (_, broker, _inboxes, _polls) = setup(1);
        let (a, b): (Arc<str>, Arc<str>) = ("room.a".into(), "room.b".into());
        enter(&p, &broker, 1, None, &a);
        enter(&p, &broker, 2, None, &a);
        p.enter(&broker, 0, 2, &b);
        let list = p.list(&broker, "room.a", None, 10).unwrap();
        assert_eq!((list.count, list.connections), (2, 2));
        assert!(list
            .members
            .iter()
            .all(|m| m.0.starts_with('~') && m.2 == 1));
        assert_ne!(list.members[0].0, list.members[1].0);
        // One connection keeps one identity in all its rooms.
        let in_b = p.list(&broker, "room.b", None, 10).unwrap();
        assert!(list.members.iter().any(|m| m.0 == in_b.members[0].0));
        p.forget(&broker, 0, 2);
        assert_eq!(p.count(&broker, "room.a").unwrap(), (1, 1));
        assert_eq!(p.count(&broker, "room.b").unwrap(), (0, 0));
    }

    #[test]
    fn listings_page_in_identity_order() {
        let (p, broker, _inboxes, _polls) = setup(1);
        let topic: Arc<str> = "room.x".into();
        for (k, s) in ["carol", "alice", "bob"].into_iter().enumerate() {
            enter(&p, &broker, k as u32, Some(s), &topic);
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
        enter(&p, &broker, 1, None, &topic);
        p.listen(&broker, &topic, 10).unwrap();
        enter(&p, &broker, 2, Some("bob"), &topic);
        assert!(events(&inboxes[0]).is_empty());
        assert_eq!(events(&inboxes[1]).len(), 1);
    }
}
