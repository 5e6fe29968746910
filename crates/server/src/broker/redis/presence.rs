//! Presence in Redis (docs/presence.md, "Across a cluster"): the cluster's rooms, changed only
//! by [`SCRIPT`], which publishes `join`/`leave` on the topic's own channel so events take
//! their place among the topic's messages.
//!
//! Per topic, in the topic's partition (so every key and the channel share a slot): the members
//! with their connections on all nodes, their info, each node's connections, the room's
//! version, and per node its own members (what a node's death takes away). Per node, in
//! partition 0 (tag `{p0}`: one slot of a Redis Cluster, the first Redis of a list): a
//! liveness key refreshed every [`KEEPALIVE`](crate::broker::rooms::KEEPALIVE) and expiring after [`ALIVE_TTL`], and the set of
//! rooms it is in. A node whose liveness key expired (killed, cut off from
//! Redis) is *reaped* by the first live node that notices: each of its rooms loses its members,
//! with `leave` events. A node that finds its own liveness key gone (Redis restarted, or it was
//! reaped while cut off) writes its rooms again from its connections (`sync`).
//!
//! Called from the presence thread (changes, liveness, reaping) and from workers and the API
//! (member lists, counts), on the broker's connection pools.

use std::sync::Arc;
use std::time::Duration;

use clarion_proto::resp::Value;

use super::{keys, partition, sha1_hex, RedisBroker, Topic};
use crate::broker::rooms::{RoomChange, RoomPage, RoomState};
use crate::broker::Unavailable;
use crate::message::Published;

/// The presence script (see the module doc).
pub const SCRIPT: &str = include_str!("presence.lua");
/// How long a node counts as alive after its last refresh: several refreshes, so a slow
/// moment does not make a live node look dead. A dead node's members leave within about
/// `ALIVE_TTL + KEEPALIVE` (docs/presence.md).
pub const ALIVE_TTL: Duration = Duration::from_secs(10);

/// The keys the script takes for `topic`, with node `node`'s members fifth.
fn room_keys(topic: &str, node: &str) -> [String; 6] {
    let p = partition(topic);
    [
        format!("clarion:{{p{p}}}:pm:{topic}"),
        format!("clarion:{{p{p}}}:pi:{topic}"),
        format!("clarion:{{p{p}}}:pc:{topic}"),
        format!("clarion:{{p{p}}}:pv:{topic}"),
        // `|` cannot be in a topic, so no topic and node pair names another's key.
        format!("clarion:{{p{p}}}:pn:{topic}|{node}"),
        format!("clarion:{{p{p}}}:pl:{topic}"),
    ]
}

/// The script's SHA-1, computed once.
fn script_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| sha1_hex(SCRIPT.as_bytes()))
}

// Per-node keys live in partition 0 (tag `{p0}`), so they are in one slot of a Redis Cluster
// (and on the first Redis of a list, as partition 0 maps there).
fn alive_key(node: &str) -> String {
    format!("clarion:{{p0}}:presence:alive:{node}")
}

fn rooms_key(node: &str) -> String {
    format!("clarion:{{p0}}:presence:rooms:{node}")
}

const NODES: &str = "clarion:{p0}:presence:nodes";

impl RedisBroker {
    /// This node's name, as other nodes know it.
    pub fn node_name(&self) -> &str {
        &self.core.name
    }

    /// One script call for `topic` on behalf of `node`.
    fn presence_call(&self, op: &str, topic: &str, node: &str, args: &[&[u8]]) -> Vec<Vec<u8>> {
        let [m, i, c, v, n, l] = room_keys(topic, node);
        let channel = keys(topic)[2].clone();
        let mut cmd: Vec<Vec<u8>> = vec![
            b"EVALSHA".to_vec(),
            script_sha().as_bytes().to_vec(),
            b"6".to_vec(),
            m.into_bytes(),
            i.into_bytes(),
            c.into_bytes(),
            v.into_bytes(),
            n.into_bytes(),
            l.into_bytes(),
            op.as_bytes().to_vec(),
            channel.into_bytes(),
            node.as_bytes().to_vec(),
            topic.as_bytes().to_vec(),
        ];
        cmd.extend(args.iter().map(|a| a.to_vec()));
        cmd
    }

    /// Runs script calls, each on the shard of its topic, in order per shard; their replies in
    /// the calls' order.
    fn presence_run(&self, calls: Vec<(String, Vec<Vec<u8>>)>) -> Result<Vec<Value>, Unavailable> {
        let routed: Vec<(u32, Vec<Vec<u8>>)> = calls
            .into_iter()
            .map(|(topic, cmd)| (partition(&topic), cmd))
            .collect();
        let replies = self.core.run_routed(SCRIPT, &routed)?;
        if let Some(Value::Error(e)) = replies.iter().find(|r| matches!(r, Value::Error(_))) {
            return Err(Unavailable(format!("presence script: {e}")));
        }
        Ok(replies)
    }

    /// Applies this node's changes: one script call per room, its members' changes netted
    /// (a connection that came and went within the batch costs nothing) and its last
    /// connection count.
    pub fn presence_apply(&self, changes: &[RoomChange]) -> Result<(), Unavailable> {
        let node = self.node_name().to_owned();
        // Per room, in first-seen order: the net change in its connections with whether it is
        // listened to, and per member the net change with the info of its first addition.
        type Net = (Option<(i64, bool)>, Vec<(Arc<str>, i64, Option<Arc<str>>)>);
        let mut rooms: Vec<(Arc<str>, Net)> = Vec::new();
        let mut index: std::collections::HashMap<Arc<str>, usize> = Default::default();
        for c in changes {
            let topic = match c {
                RoomChange::Add { topic, .. }
                | RoomChange::Remove { topic, .. }
                | RoomChange::Connections { topic, .. } => topic,
            };
            let i = *index.entry(Arc::clone(topic)).or_insert_with(|| {
                rooms.push((Arc::clone(topic), (None, Vec::new())));
                rooms.len() - 1
            });
            let Some((_, (conns, members))) = rooms.get_mut(i) else {
                continue;
            };
            let (sub, delta, info) = match c {
                RoomChange::Connections {
                    delta, listening, ..
                } => {
                    let before = conns.map_or(0, |c| c.0);
                    *conns = Some((before + i64::from(*delta), *listening));
                    continue;
                }
                RoomChange::Add { sub, n, info, .. } => (sub, i64::from(*n), info),
                RoomChange::Remove { sub, n, .. } => (sub, -i64::from(*n), &None),
            };
            match members.iter_mut().find(|(s, _, _)| s == sub) {
                Some(m) => {
                    m.1 += delta;
                    if m.2.is_none() {
                        m.2 = info.clone();
                    }
                }
                None => members.push((Arc::clone(sub), delta, info.clone())),
            }
        }
        // A room goes on the node's list before its members reach Redis: a node killed
        // between the two writes must not leave members no reaper can find. A listed room
        // the node holds nothing in reaps as a no-op.
        let mut listed = vec![b"SADD".to_vec(), rooms_key(&node).into_bytes()];
        listed.extend(
            rooms
                .iter()
                .filter(|(_, (conns, members))| {
                    conns.is_some_and(|c| c.0 > 0) || members.iter().any(|m| m.1 > 0)
                })
                .map(|(topic, _)| topic.as_bytes().to_vec()),
        );
        if listed.len() > 2 {
            self.node_call(vec![listed])?;
        }
        let calls = rooms
            .iter()
            .map(|(topic, (conns, members))| {
                let listening: &[u8] = if conns.is_some_and(|c| c.1) {
                    b"1"
                } else {
                    b""
                };
                let conns = conns
                    .filter(|c| c.0 != 0)
                    .map(|c| c.0.to_string())
                    .unwrap_or_default();
                let deltas: Vec<String> = members.iter().map(|m| m.1.to_string()).collect();
                let mut args: Vec<&[u8]> = vec![conns.as_bytes(), listening];
                for ((sub, delta, info), d) in members.iter().zip(&deltas) {
                    if *delta == 0 {
                        continue;
                    }
                    args.push(sub.as_bytes());
                    args.push(d.as_bytes());
                    args.push(info.as_deref().unwrap_or_default().as_bytes());
                }
                (
                    topic.to_string(),
                    self.presence_call("apply", topic, &node, &args),
                )
            })
            .collect();
        let replies = self.presence_run(calls)?;
        // A room leaves the node's list with the node's last connection in it (each apply
        // says how many are left); it went on the list above when it gained one.
        let mut srem = vec![b"SREM".to_vec(), rooms_key(&node).into_bytes()];
        for ((topic, _), reply) in rooms.iter().zip(&replies) {
            if matches!(reply, Value::Integer(0)) {
                srem.push(topic.as_bytes().to_vec());
            }
        }
        if srem.len() > 2 {
            self.node_call(vec![srem])?;
        }
        Ok(())
    }

    /// Writes this node's whole part of every room again (after Redis lost it, or after this
    /// node was reaped while cut off), and forgets rooms it is no longer in.
    pub fn presence_sync(&self, rooms: &[RoomState]) -> Result<(), Unavailable> {
        let node = self.node_name().to_owned();
        let listed = self.presence_rooms_of(&node)?;
        // Listed first, as in `presence_apply`: members never sit in a room the list lacks.
        if !rooms.is_empty() {
            let mut sadd = vec![b"SADD".to_vec(), rooms_key(&node).into_bytes()];
            sadd.extend(rooms.iter().map(|r| r.topic.as_bytes().to_vec()));
            self.node_call(vec![sadd])?;
        }
        let mut calls = Vec::new();
        for r in rooms {
            let conns = r.connections.to_string();
            let counts: Vec<String> = r.members.iter().map(|(_, n, _)| n.to_string()).collect();
            let listening: &[u8] = if r.listening { b"1" } else { b"" };
            let mut args: Vec<&[u8]> = vec![conns.as_bytes(), listening];
            for ((sub, _, info), n) in r.members.iter().zip(&counts) {
                args.push(sub.as_bytes());
                args.push(n.as_bytes());
                args.push(info.as_deref().unwrap_or_default().as_bytes());
            }
            calls.push((
                r.topic.to_string(),
                self.presence_call("sync", &r.topic, &node, &args),
            ));
        }
        let gone: Vec<&String> = listed
            .iter()
            .filter(|t| !rooms.iter().any(|r| *r.topic == **t))
            .collect();
        for t in &gone {
            calls.push(((*t).clone(), self.presence_call("reap", t, &node, &[])));
        }
        self.presence_run(calls)?;
        if !gone.is_empty() {
            let mut srem = vec![b"SREM".to_vec(), rooms_key(&node).into_bytes()];
            srem.extend(gone.iter().map(|t| t.as_bytes().to_vec()));
            self.node_call(vec![srem])?;
        }
        Ok(())
    }

    /// Refreshes this node's liveness key; `true` when it had expired or never existed (Redis
    /// restarted, or this node was reaped while cut off): its rooms must be written again.
    pub fn presence_keepalive(&self) -> Result<bool, Unavailable> {
        let node = self.node_name();
        let ttl = ALIVE_TTL.as_secs().to_string();
        let replies = self.node_call(vec![
            vec![
                b"SET".to_vec(),
                alive_key(node).into_bytes(),
                b"1".to_vec(),
                b"EX".to_vec(),
                ttl.into_bytes(),
                b"GET".to_vec(),
            ],
            vec![
                b"SADD".to_vec(),
                NODES.as_bytes().to_vec(),
                node.as_bytes().to_vec(),
            ],
        ])?;
        match replies.first() {
            Some(Value::Nil) => Ok(true),
            Some(Value::Error(e)) => Err(Unavailable(format!("presence keepalive: {e}"))),
            _ => Ok(false),
        }
    }

    /// Reaps every node whose liveness key expired (one node does each: a short lock),
    /// returning how many rooms lost members.
    pub fn presence_reap_dead(&self) -> Result<usize, Unavailable> {
        let nodes = self.node_call(vec![vec![b"SMEMBERS".to_vec(), NODES.as_bytes().to_vec()]])?;
        let names: Vec<String> = match nodes.first() {
            Some(Value::Array(v)) => v
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        let mut reaped = 0;
        for n in names.iter().filter(|n| **n != self.node_name()) {
            let alive =
                self.node_call(vec![vec![b"EXISTS".to_vec(), alive_key(n).into_bytes()]])?;
            if !matches!(alive.first(), Some(Value::Integer(0))) {
                continue;
            }
            let lock_key = format!("clarion:{{p0}}:presence:reaping:{n}");
            let got = self.node_call(vec![vec![
                b"SET".to_vec(),
                lock_key.into_bytes(),
                self.node_name().as_bytes().to_vec(),
                b"NX".to_vec(),
                b"EX".to_vec(),
                b"30".to_vec(),
            ]])?;
            if !matches!(got.first(), Some(Value::Simple(_))) {
                continue;
            }
            reaped += self.presence_reap(n)?;
        }
        Ok(reaped)
    }

    /// Takes node `node` out of every room it is in (a dead node, or this node's previous
    /// life at startup), with `leave` events for the members only it held.
    pub fn presence_reap(&self, node: &str) -> Result<usize, Unavailable> {
        let rooms = self.presence_rooms_of(node)?;
        let calls = rooms
            .iter()
            .map(|t| (t.clone(), self.presence_call("reap", t, node, &[])))
            .collect();
        self.presence_run(calls)?;
        self.node_call(vec![
            vec![b"DEL".to_vec(), rooms_key(node).into_bytes()],
            vec![
                b"SREM".to_vec(),
                NODES.as_bytes().to_vec(),
                node.as_bytes().to_vec(),
            ],
        ])?;
        if !rooms.is_empty() {
            crate::log::info(format_args!(
                "presence: node {node} is gone; its members left {} rooms",
                rooms.len()
            ));
        }
        Ok(rooms.len())
    }

    fn presence_rooms_of(&self, node: &str) -> Result<Vec<String>, Unavailable> {
        let r = self.node_call(vec![vec![
            b"SMEMBERS".to_vec(),
            rooms_key(node).into_bytes(),
        ]])?;
        Ok(match r.first() {
            Some(Value::Array(v)) => v
                .iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        })
    }

    /// Commands on the per-node keys (partition 0), following redirections.
    fn node_call(&self, cmds: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, Unavailable> {
        let calls: Vec<(u32, Vec<Vec<u8>>)> = cmds.into_iter().map(|c| (0, c)).collect();
        self.core.run_routed(SCRIPT, &calls)
    }

    /// A page of `topic`'s members after `after`; `listen`: a subscriber of this node asks
    /// for events, so events are published from now on (recorded before the list is read).
    pub fn presence_list(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
        listen: bool,
    ) -> Result<RoomPage, Unavailable> {
        let limit = limit.to_string();
        let flag: &[u8] = if listen { b"1" } else { b"" };
        let args: [&[u8]; 3] = [after.unwrap_or_default().as_bytes(), limit.as_bytes(), flag];
        let cmd = self.presence_call("list", topic, self.node_name(), &args);
        let reply = self.core.run_routed(SCRIPT, &[(partition(topic), cmd)])?;
        let Some(Value::Array(v)) = reply.into_iter().next() else {
            return Err(Unavailable("presence list: unexpected answer".to_owned()));
        };
        let int = |i: usize| v.get(i).and_then(Value::as_int).unwrap_or(0);
        let mut page = RoomPage {
            version: u64::try_from(int(0)).unwrap_or(0),
            count: u64::try_from(int(1)).unwrap_or(0),
            connections: u64::try_from(int(2)).unwrap_or(0),
            members: Vec::new(),
            more: int(3) == 1,
        };
        for m in v.get(4..).unwrap_or_default().chunks(3) {
            let [sub, info, n] = m else { break };
            let Some(sub) = sub.as_str() else { continue };
            let info = info.as_str().filter(|i| !i.is_empty()).map(Arc::from);
            let n = n.as_int().and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
            page.members.push((Arc::from(sub), info, n));
        }
        Ok(page)
    }

    /// `topic`'s members and connections across the cluster.
    pub fn presence_count(&self, topic: &str) -> Result<(u64, u64), Unavailable> {
        let cmd = self.presence_call("count", topic, self.node_name(), &[]);
        let reply = self.core.run_routed(SCRIPT, &[(partition(topic), cmd)])?;
        match reply.first() {
            Some(Value::Array(v)) => {
                let int = |i: usize| {
                    v.get(i)
                        .and_then(Value::as_int)
                        .and_then(|n| u64::try_from(n).ok())
                        .unwrap_or(0)
                };
                Ok((int(0), int(1)))
            }
            _ => Err(Unavailable("presence count: unexpected answer".to_owned())),
        }
    }
}

/// A presence event from a topic's channel (`!VERSION JSON`, what [`SCRIPT`] publishes), as
/// the message the workers deliver; `None` when it is not one.
pub(crate) fn event_of(name: &Arc<str>, data: &[u8]) -> Option<Published> {
    let rest = data.strip_prefix(b"!")?;
    let text = std::str::from_utf8(rest).ok()?;
    let (version, json) = text.split_once(' ')?;
    let version = version.parse::<u64>().ok()?;
    let kind = if json.starts_with("{\"type\":\"join\"") {
        "join"
    } else if json.starts_with("{\"type\":\"leave\"") {
        "leave"
    } else {
        return None;
    };
    Some(Published::presence(Arc::clone(name), version, kind, json))
}

impl super::Core {
    /// Hands a presence event that came on `topic`'s channel to this node's subscribers of it
    /// (under the state lock, like a message).
    pub(super) fn presence_event(&self, name: &Arc<str>, t: &Topic, data: &[u8]) {
        match event_of(name, data) {
            Some(m) => {
                // With Redis, the events counted are those this node received.
                let count = if m.payload().starts_with(b"{\"type\":\"join\"") {
                    &self.metrics.presence_joins
                } else {
                    &self.metrics.presence_leaves
                };
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.fan_out(t, &[Arc::new(m)]);
            }
            None => crate::log::warn(format_args!(
                "broker: a presence event on {name} that cannot be read"
            )),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_topic_partition_and_never_collide() {
        let ks = room_keys("chat:a", "web-1:42");
        assert_eq!(ks.len(), 6);
        let tag = &ks[0][..ks[0].find("}:").unwrap() + 1];
        assert!(ks.iter().all(|k| k.starts_with(tag)));
        assert!(keys("chat:a")[2].starts_with(tag));
        assert_ne!(room_keys("a", "b:c")[4], room_keys("a:b", "c")[4]);
    }

    #[test]
    fn channel_events_are_read_back() {
        let name: Arc<str> = "room".into();
        let m = event_of(
            &name,
            br#"!1700000000000001 {"type":"join","topic":"room","member":{"sub":"a"}}"#,
        )
        .unwrap();
        assert!(m.presence && m.id == 1_700_000_000_000_001);
        assert_eq!(m.event.as_deref(), Some("join"));
        assert!(event_of(&name, b"!x {}").is_none());
        assert!(event_of(&name, b"e 1 body").is_none());
        assert!(event_of(&name, br#"!5 {"type":"other"}"#).is_none());
    }
}
