//! Redis Cluster, the I/O part: asking the cluster where each partition's slot is served
//! ([`Core::refresh_topology`]), moving followed topics to their new master, the thread that
//! keeps the topology fresh, and commands that follow redirections ([`Core::run_routed`]).
//! The parsing and the shard table's rules are pure, in [`super::cluster`].
//!
//! The shard table has [`PARTITIONS`] places, each an [`super::sentinel::Endpoint`] that a master
//! of the cluster occupies (most are free: a cluster of 3 masters uses 3). Each place has its pool
//! and its subscriber connection (one per master) like a standalone shard; a place whose master
//! changes (a failover, a new master) closes its connections and its reader re-subscribes its
//! topics there. Routing a topic is one atomic load.

use crate::redact::Urls;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::resp::Value;

use super::cluster::{self, assign, parse_slots, partition_owners, ClusterUrl, Redirect};
use super::conn::{Conn, LinkError};
use super::layout::{partition, PARTITIONS};
use super::{Core, Follow, State};
use crate::broker::Unavailable;
use crate::hub::lock;

/// How often the topology is asked for while nothing is wrong (new masters, slots moved by
/// an operator with no traffic to notice it).
const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// How often while a master in use is unreachable: its replica's promotion is noticed within
/// this of the cluster finishing the failover.
const REFRESH_WHILE_DOWN: Duration = Duration::from_millis(200);
/// The pause before a command refused with `TRYAGAIN` (its slot is migrating) is sent again.
const TRYAGAIN_PAUSE: Duration = Duration::from_millis(25);
/// Rounds of redirections a command may take before the caller is answered "unavailable".
const MAX_ROUNDS: usize = 16;

/// The cluster side of the broker's core.
pub(crate) struct Topology {
    pub(super) url: ClusterUrl,
    /// Per partition, its place in the shard table.
    route: Vec<AtomicUsize>,
    /// Held while the topology is asked for and applied: one refresh at a time.
    refreshing: Mutex<()>,
    /// A refresh was asked for (a reader lost its master, a slot moved).
    wanted: Mutex<bool>,
    wake: Condvar,
}

impl Topology {
    pub(super) fn new(url: ClusterUrl) -> Topology {
        Topology {
            url,
            route: (0..PARTITIONS).map(|_| AtomicUsize::new(0)).collect(),
            refreshing: Mutex::new(()),
            wanted: Mutex::new(false),
            wake: Condvar::new(),
        }
    }

    /// The place of partition `p`.
    pub(super) fn place(&self, p: u32) -> usize {
        self.route.get(p as usize).map_or(0, |r| r.load(Relaxed))
    }

    /// Whether place `i` serves any partition.
    pub(super) fn in_use(&self, i: usize) -> bool {
        self.route.iter().any(|r| r.load(Relaxed) == i)
    }
}

/// Commands routed by partition through the broker (for what keeps its own keys per topic
/// partition in the broker's Redis: the webhooks' occupancy).
#[derive(Clone)]
pub struct Router(pub(super) std::sync::Arc<Core>);

impl Router {
    /// Runs `calls`, each on partition `p`'s keys, where that partition is served (see
    /// [`Core::run_routed`]); `script` is loaded where a call answers `NOSCRIPT`.
    pub fn call(
        &self,
        script: &str,
        calls: &[(u32, Vec<Vec<u8>>)],
    ) -> Result<Vec<Value>, Unavailable> {
        self.0.run_routed(script, calls)
    }
}

/// Why the cluster could not be asked.
#[derive(Debug)]
pub(super) enum TopologyError {
    /// No node could be reached (or none answered in time): try again later.
    Unreachable(String),
    /// A node answered with a refusal that a retry will not fix (not a cluster, AUTH).
    Refused(String),
}

impl std::fmt::Display for TopologyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TopologyError::Unreachable(e) | TopologyError::Refused(e) => f.write_str(e),
        }
    }
}

impl Core {
    /// Asks the cluster which master serves each partition (`first`, the node a `MOVED`
    /// named, before the known masters and the seeds) and applies it: places get their new
    /// masters and followed topics whose master changed are subscribed where they are now.
    pub(super) fn refresh_topology(&self, first: Option<&str>) -> Result<(), TopologyError> {
        let Some(topo) = &self.cluster else {
            return Ok(());
        };
        let _one = lock(&topo.refreshing);
        let mut asked: Vec<String> = Vec::new();
        let mut candidates = Vec::new();
        candidates.extend(first.and_then(|a| topo.url.node(a)));
        // Masters whose subscriber connection is up first: a dead one (a failover in
        // progress) may cost a connect timeout on a real network.
        let up: Vec<bool> = {
            let st = lock(&self.state);
            (0..self.shards.len()).map(|i| st.up(i)).collect()
        };
        for want_up in [true, false] {
            candidates.extend(
                self.shards
                    .iter()
                    .zip(&up)
                    .filter(|(_, u)| **u == want_up)
                    .filter_map(|(s, _)| s.endpoint.master_addr())
                    .filter_map(|a| topo.url.node(&a)),
            );
        }
        candidates.extend(topo.url.seeds.iter().cloned());
        let mut why = Vec::new();
        let mut owners = None;
        for url in candidates {
            if asked.contains(&url.addr) {
                continue;
            }
            asked.push(url.addr.clone());
            let reply = Conn::open(&url, self.tls.as_deref(), self.timeout, &self.name)
                .and_then(|mut c| c.call(&[vec![b"CLUSTER".to_vec(), b"SLOTS".to_vec()]]));
            let reply = match reply {
                Ok(mut r) => r.pop().unwrap_or(Value::Nil),
                Err(LinkError::Refused(e)) => {
                    return Err(TopologyError::Refused(format!("{}: {e}", url.addr)))
                }
                Err(e) => {
                    why.push(format!("{}: {e}", url.addr));
                    continue;
                }
            };
            if let Value::Error(e) = &reply {
                if e.contains("cluster support disabled") {
                    return Err(TopologyError::Refused(format!(
                        "{} is not a Redis Cluster node (cluster support disabled): \
                         use redis:// or rediss:// for a standalone Redis",
                        url.addr
                    )));
                }
            }
            match parse_slots(&reply, &url.addr).and_then(|r| partition_owners(&r)) {
                Ok(o) => {
                    owners = Some(o);
                    break;
                }
                Err(e) => why.push(format!("{}: {e}", url.addr)),
            }
        }
        let Some(owners) = owners else {
            return Err(TopologyError::Unreachable(format!(
                "no cluster node gave the topology ({})",
                why.join("; ")
            )));
        };
        let places: Vec<Option<String>> = self
            .shards
            .iter()
            .map(|s| s.endpoint.master_addr())
            .collect();
        let old: Vec<usize> = (0..PARTITIONS).map(|p| topo.place(p)).collect();
        let (next, route) = assign(&places, &old, &owners);
        let mut st = lock(&self.state);
        for (i, (before, now)) in places.iter().zip(&next).enumerate() {
            if before == now {
                continue;
            }
            let Some(shard) = self.shards.get(i) else {
                continue;
            };
            let url = now.as_deref().and_then(|a| topo.url.node(a));
            if shard.endpoint.set_master(url) {
                crate::log::info(format_args!(
                    "broker cluster: place {i}: master {} -> {}",
                    before.as_deref().unwrap_or("none"),
                    now.as_deref().unwrap_or("none")
                ));
                // The reader reconnects to the new master and re-subscribes its topics.
                if let Some(w) = lock(&shard.writer).as_ref() {
                    w.shutdown();
                }
            }
        }
        for (r, p) in topo.route.iter().zip(&route) {
            r.store(*p, Relaxed);
        }
        self.rehome(&mut st, &old);
        self.changed.notify_all();
        Ok(())
    }

    /// The first topology, at startup: a node that is not in a cluster, or refuses us, stops
    /// the start with the reason; a cluster not reachable yet is retried by the topology
    /// thread (the node starts without it, as with a standalone Redis that is away).
    pub(super) fn first_topology(&self, url: &str, down: &mut Vec<String>) -> Result<(), String> {
        match self.refresh_topology(None) {
            Ok(()) => {
                // Load the publish script on every master now, so a refusal shows here.
                for (i, s) in self.shards.iter().enumerate() {
                    if !self.in_use(i) {
                        continue;
                    }
                    let load = [vec![
                        b"SCRIPT".to_vec(),
                        b"LOAD".to_vec(),
                        super::SCRIPT.as_bytes().to_vec(),
                    ]];
                    match s.pool.call(&load) {
                        Ok(r) => {
                            if let Some(Value::Error(e)) = r.first() {
                                return Err(format!("broker {}: {e}", Urls(url)));
                            }
                        }
                        Err(LinkError::Refused(e)) => {
                            return Err(format!("broker {}: {e}", Urls(url)))
                        }
                        Err(_) => {}
                    }
                }
                Ok(())
            }
            Err(TopologyError::Refused(e)) => Err(format!("broker {}: {e}", Urls(url))),
            Err(TopologyError::Unreachable(e)) => {
                crate::log::warn(format_args!(
                    "broker {}: {e}; starting without it, retrying",
                    Urls(url)
                ));
                down.extend(self.shards.iter().map(|s| s.label.clone()));
                Ok(())
            }
        }
    }

    /// After the route changed (or a slot's subscriptions were dropped by Redis): every
    /// followed topic whose place changed, and every topic waiting to be subscribed again, is
    /// subscribed at its place now. Its position is then read and the hole since its last
    /// delivered message filled from the stream (see [`super::link`]).
    pub(super) fn rehome(&self, st: &mut State, old: &[usize]) {
        let mut send: Vec<(usize, Vec<Vec<u8>>)> = Vec::new();
        let mut drop = Vec::new();
        for (name, t) in st.topics.iter_mut() {
            let p = partition(name);
            let now = self.shard_of(name);
            let moved = old.get(p as usize).is_some_and(|&o| o != now);
            let waiting = t.follow == Follow::Subscribing && t.unconfirmed == 0;
            if !moved && !waiting {
                continue;
            }
            // Confirmations still owed by the old place will be ignored (not routed there).
            t.unconfirmed = 0;
            if t.follow == Follow::Idle {
                if t.unused() {
                    drop.push(std::sync::Arc::clone(name));
                }
                continue;
            }
            t.follow = Follow::Subscribing;
            t.seq.reset();
            if st.connected.get(now).copied().unwrap_or(false) {
                t.unconfirmed = 1;
                send.push((
                    now,
                    vec![
                        b"SSUBSCRIBE".to_vec(),
                        super::keys(name)[2].clone().into_bytes(),
                    ],
                ));
            }
        }
        for name in drop {
            st.topics.remove(&name);
        }
        for (shard, cmd) in send {
            // A failed write closes the connection; its next session subscribes the topic.
            let _ = self.send_sub(shard, &[cmd]);
        }
    }

    /// Asks the topology thread for a refresh soon.
    pub(super) fn want_refresh(&self) {
        if let Some(topo) = &self.cluster {
            *lock(&topo.wanted) = true;
            topo.wake.notify_all();
        }
    }

    /// The topology thread's body: refreshes when asked, periodically, and often while a
    /// master in use is unreachable (a failover in progress), until `stop`.
    pub(super) fn watch_topology(&self) {
        let Some(topo) = &self.cluster else {
            return;
        };
        let mut failing = false;
        while !self.stop.load(Relaxed) {
            let down = {
                let st = lock(&self.state);
                !self.all_up(&st)
            };
            let every = if down || failing {
                REFRESH_WHILE_DOWN
            } else {
                REFRESH_EVERY
            };
            {
                let wanted = lock(&topo.wanted);
                let (mut wanted, _) = topo
                    .wake
                    .wait_timeout_while(wanted, every, |w| !*w && !self.stop.load(Relaxed))
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *wanted = false;
            }
            if self.stop.load(Relaxed) {
                return;
            }
            match self.refresh_topology(None) {
                Ok(()) => failing = false,
                Err(e) => {
                    if !failing {
                        crate::log::warn(format_args!("broker cluster: {e}; retrying"));
                    }
                    failing = true;
                }
            }
        }
    }

    /// Wakes the topology thread and the readers of free places so they see `stop`.
    pub(super) fn stop_topology(&self) {
        if let Some(topo) = &self.cluster {
            {
                let _w = lock(&topo.wanted);
                topo.wake.notify_all();
            }
            let _st = lock(&self.state);
            self.changed.notify_all();
        }
    }

    /// The replication ids of the masters serving partitions now (cluster mode; empty
    /// otherwise): a topic last written under one of them (keys migrated by a resharding)
    /// keeps its epoch (docs/cluster.md, "Redis Cluster").
    pub(super) fn accepted_replids(&self) -> Vec<Vec<u8>> {
        let Some(topo) = &self.cluster else {
            return Vec::new();
        };
        let mut out: Vec<Vec<u8>> = Vec::new();
        for (i, s) in self.shards.iter().enumerate() {
            if !topo.in_use(i) {
                continue;
            }
            let r = s.endpoint.replid();
            if !r.is_empty() && !out.iter().any(|o| o == r.as_bytes()) {
                out.push(r.into_bytes());
            }
        }
        out
    }

    /// Runs calls, each for partition `p` (its keys are all in `p`'s slot), at the place
    /// serving it, in order per partition; the replies in the calls' order. In a Redis
    /// Cluster, redirections are followed: `MOVED` refreshes the topology and sends again,
    /// `ASK` sends once to the named node after `ASKING`, `TRYAGAIN` waits briefly and sends
    /// again (within `broker_timeout_ms`), `CLUSTERDOWN` answers "unavailable".
    pub(crate) fn run_routed(
        &self,
        script: &str,
        calls: &[(u32, Vec<Vec<u8>>)],
    ) -> Result<Vec<Value>, Unavailable> {
        let mut replies = vec![Value::Nil; calls.len()];
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        let mut asks: Vec<(usize, String)> = Vec::new();
        let deadline = Instant::now() + self.timeout;
        for _ in 0..MAX_ROUNDS {
            // Grouped per place, in the calls' order.
            let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
            for &i in &pending {
                let Some((p, _)) = calls.get(i) else { continue };
                let place = self.shard_of_partition(*p);
                match groups.iter_mut().find(|(s, _)| *s == place) {
                    Some((_, v)) => v.push(i),
                    None => groups.push((place, vec![i])),
                }
            }
            for (place, idx) in &groups {
                let cmds: Vec<Vec<Vec<u8>>> = idx
                    .iter()
                    .filter_map(|&i| calls.get(i).map(|c| c.1.clone()))
                    .collect();
                let got = self.run_script_calls(*place, script, &cmds)?;
                for (&i, r) in idx.iter().zip(got) {
                    if let Some(slot) = replies.get_mut(i) {
                        *slot = r;
                    }
                }
            }
            for (i, addr) in asks.drain(..) {
                let Some((_, cmd)) = calls.get(i) else {
                    continue;
                };
                let r = self.ask(&addr, script, cmd)?;
                if let Some(slot) = replies.get_mut(i) {
                    *slot = r;
                }
            }
            if self.cluster.is_none() {
                return Ok(replies);
            }
            pending.clear();
            let mut moved_to: Option<String> = None;
            let mut again = false;
            for (i, r) in replies.iter().enumerate() {
                match cluster::redirect(r) {
                    None => {}
                    Some(Redirect::Moved { addr, .. }) => {
                        moved_to.get_or_insert(addr);
                        pending.push(i);
                    }
                    Some(Redirect::Ask { addr, .. }) => asks.push((i, addr)),
                    Some(Redirect::TryAgain) => {
                        again = true;
                        pending.push(i);
                    }
                    Some(Redirect::Down(e)) => {
                        self.want_refresh();
                        return Err(Unavailable(format!("Redis Cluster: {e}")));
                    }
                }
            }
            if pending.is_empty() && asks.is_empty() {
                return Ok(replies);
            }
            if Instant::now() >= deadline {
                break;
            }
            if let Some(addr) = moved_to {
                if let Err(e) = self.refresh_topology(Some(&addr)) {
                    return Err(Unavailable(format!("Redis Cluster: {e}")));
                }
            }
            if again {
                std::thread::sleep(TRYAGAIN_PAUSE);
            }
        }
        Err(Unavailable(
            "Redis Cluster: the slot is still moving (redirected too many times)".to_owned(),
        ))
    }

    /// One command at the node an `ASK` named, after `ASKING` (loading `script` there first
    /// if it does not have it).
    fn ask(&self, addr: &str, script: &str, cmd: &[Vec<u8>]) -> Result<Value, Unavailable> {
        let place = self
            .shards
            .iter()
            .position(|s| s.endpoint.master_addr().as_deref() == Some(addr));
        let place = match place {
            Some(p) => p,
            None => {
                self.refresh_topology(Some(addr))
                    .map_err(|e| Unavailable(format!("Redis Cluster: {e}")))?;
                self.shards
                    .iter()
                    .position(|s| s.endpoint.master_addr().as_deref() == Some(addr))
                    .ok_or_else(|| {
                        Unavailable(format!("Redis Cluster: {addr} is not a known master"))
                    })?
            }
        };
        let pool = &self
            .shards
            .get(place)
            .ok_or_else(|| Unavailable("no such shard".to_owned()))?
            .pool;
        let asking = vec![b"ASKING".to_vec()];
        let run = |pool: &super::pool::Pool| -> Result<Value, Unavailable> {
            let mut r = pool
                .call(&[asking.clone(), cmd.to_vec()])
                .map_err(Unavailable::from)?;
            Ok(r.pop().unwrap_or(Value::Nil))
        };
        let r = run(pool)?;
        if matches!(&r, Value::Error(e) if e.starts_with("NOSCRIPT")) {
            pool.call(&[vec![
                b"SCRIPT".to_vec(),
                b"LOAD".to_vec(),
                script.as_bytes().to_vec(),
            ]])
            .map_err(Unavailable::from)?;
            return run(pool);
        }
        Ok(r)
    }
}
