//! Presence's part of a hand-over (`crate::handover`): the old process hands each moving
//! connection's identity and rooms over without taking it out of its rooms (no `leave`), and
//! the new process puts it back in them without a `join`, each room continuing at the version
//! it had, so members stay listed and no subscriber sees a blip.
//!
//! Rooms of one process only (the local broker). A cluster's rooms live in Redis,
//! keyed by node name, and `worker::handover` makes those connections fall back. Moving them
//! needs, besides these two functions (which would then touch only the slots and the rooms'
//! connection and listener counts, queueing nothing for the presence thread):
//! - the successor's presence thread must not reap its own name at start (`Presence::run`)
//!   when it took connections over, but write its part once from the adopted slots
//!   (`presence_sync`, which must then find nothing to announce), and the old process must
//!   not `leave_cluster` at exit;
//! - the node's liveness key (`clarion:{p0}:presence:alive:<node>`, `ALIVE_TTL` 10 s) must
//!   stay fresh across the switch, or another node reaps the members with `leave` events;
//! - under another node name, one script that renames the node's part of each room (`pn:` keys,
//!   its connection counts, `presence:rooms:<node>`, the liveness key) without events.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::members::Entry;
use super::{Ident, Presence, Tables};
use crate::hub::lock;

/// A connection's part, as it leaves the old process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// Its identity: `sub` and `info` (`None`: counted, not listed).
    pub ident: Option<(String, Option<String>)>,
    /// Its rooms, each with the room's version.
    pub rooms: Vec<(Arc<str>, u64)>,
}

impl Presence {
    /// Takes connection `k` of `worker` out of this process's tables without leaving its
    /// rooms: no event, no change to any room (this process serves no more than the hand-over
    /// after this). `None` when it has no part.
    pub fn detach(&self, worker: usize, k: u32) -> Option<Carried> {
        let mut t = lock(&self.tables);
        let Tables { rooms, conns } = &mut *t;
        let slot = conns.take(worker, k);
        let ident = slot
            .ident
            .as_ref()
            .map(|i| (i.sub().to_owned(), i.info().map(str::to_owned)));
        if ident.is_none() && slot.rooms() == 0 {
            return None;
        }
        let rooms = slot
            .names()
            .map(|n| {
                let version = rooms
                    .get(n)
                    .and_then(|r| r.local.as_ref())
                    .map_or(0, |l| l.version);
                (Arc::clone(n), version)
            })
            .collect();
        Some(Carried { ident, rooms })
    }

    /// Puts a connection that arrived from the old process (as connection `k` of `worker`) back
    /// in its rooms under its identity, quietly: no `join`, no version raised; each room
    /// continues at least at the version it had there. Rooms this process does not keep
    /// (`presence_topics` changed) are skipped; the caller enters the connection in those
    /// it keeps but the old process did not.
    pub fn attach(&self, worker: usize, k: u32, carried: &Carried) {
        let mut t = lock(&self.tables);
        let Tables { rooms, conns } = &mut *t;
        let slot = conns.slot(worker, k);
        slot.ident = carried
            .ident
            .as_ref()
            .map(|(sub, info)| Ident::new(sub, info.as_deref()));
        for (name, version) in &carried.rooms {
            if !self.tracks(name) || slot.has(name) {
                continue;
            }
            slot.add(Arc::clone(name));
            self.metrics.presence_connections.fetch_add(1, Relaxed);
            let room = rooms.entry(Arc::clone(name)).or_default();
            room.connections += 1;
            let local = room.local.get_or_insert_with(Default::default);
            local.version = local.version.max(*version);
            let Some(who) = slot.ident.as_ref() else {
                continue;
            };
            if let Some(e) = local.members.get_mut(who.sub()) {
                e.conns += 1;
                continue;
            }
            let info = who.info().map(Into::into);
            local
                .members
                .insert(who.sub().into(), Entry { conns: 1, info });
            self.metrics.presence_members.fetch_add(1, Relaxed);
        }
        conns.tidy(worker, k);
    }

    /// Whether connection `k` of `worker` is in room `name` here.
    pub fn is_in(&self, worker: usize, k: u32, name: &str) -> bool {
        lock(&self.tables)
            .conns
            .get(worker, k)
            .is_some_and(|s| s.has(name))
    }
}
