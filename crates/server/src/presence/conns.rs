//! Each connection's part in presence, in one table per worker indexed by the connection's slab
//! key (as `auth::grants` keeps tokens): its identity and the rooms it is in. This is what a
//! node knows of its members: without Redis the rooms are built from it as connections come and
//! go; with Redis it is all the node keeps per member, and the presence thread reads it whole
//! when Redis must be told this node's part again.
//!
//! A table is reserved for the most connections a worker may hold, not touched: resident memory
//! grows by 48 bytes per slot actually used (connections in rooms, or identified ones that may
//! join one), and growing never copies the table.

use std::sync::Arc;

use super::ident::Ident;

/// One connection's part: 48 bytes.
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// Who it is in its rooms (`None`: counted, not listed).
    pub(super) ident: Option<Ident>,
    /// Its first room (most connections are in one), names shared with the worker's index.
    first: Option<Arc<str>>,
    /// The others: boxed so that the slot holds a thin pointer (8 bytes, not a vector's 24).
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<Arc<str>>>>,
}

impl Slot {
    pub(super) fn rooms(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.as_ref().map_or(0, |m| m.len())
    }

    pub(super) fn has(&self, topic: &str) -> bool {
        self.names().any(|t| **t == *topic)
    }

    /// The rooms it is in.
    pub(super) fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.first
            .iter()
            .chain(self.more.iter().flat_map(|m| m.iter()))
    }

    /// Adds `topic` (the caller checked it is not there).
    pub(super) fn add(&mut self, topic: Arc<str>) {
        match self.first {
            None => self.first = Some(topic),
            Some(_) => self.more.get_or_insert_with(Default::default).push(topic),
        }
    }

    /// Removes `topic`; whether it was there.
    pub(super) fn take(&mut self, topic: &str) -> bool {
        if self.first.as_deref() == Some(topic) {
            self.first = self.more.as_mut().and_then(|m| m.pop());
        } else if let Some(m) = self.more.as_mut() {
            let Some(i) = m.iter().position(|t| **t == *topic) else {
                return false;
            };
            m.swap_remove(i);
        } else {
            return false;
        }
        if self.more.as_ref().is_some_and(|m| m.is_empty()) {
            self.more = None;
        }
        true
    }

    fn is_empty(&self) -> bool {
        self.ident.is_none() && self.first.is_none()
    }
}

/// The slots of every worker of this process.
#[derive(Debug, Default)]
pub(super) struct Conns {
    workers: Vec<Vec<Slot>>,
    /// Slots reserved per worker (the process's connection cap).
    reserve: usize,
}

impl Conns {
    pub(super) fn new(reserve: usize) -> Conns {
        Conns {
            workers: Vec::new(),
            reserve,
        }
    }

    pub(super) fn get(&self, worker: usize, k: u32) -> Option<&Slot> {
        self.workers.get(worker)?.get(k as usize)
    }

    /// Connection `k`'s slot, made if needed.
    pub(super) fn slot(&mut self, worker: usize, k: u32) -> &mut Slot {
        if self.workers.len() <= worker {
            self.workers.resize_with(worker + 1, Vec::new);
        }
        let reserve = self.reserve;
        // Just resized to hold `worker`, and below to hold `k`.
        #[allow(clippy::indexing_slicing)]
        let table = &mut self.workers[worker];
        if table.capacity() == 0 {
            table.reserve_exact(reserve.max(k as usize + 1));
        }
        let i = k as usize;
        if table.len() <= i {
            table.resize_with(i + 1, Slot::default);
        }
        #[allow(clippy::indexing_slicing)]
        &mut table[i]
    }

    /// Empties connection `k`'s slot, returning what it held.
    pub(super) fn take(&mut self, worker: usize, k: u32) -> Slot {
        self.workers
            .get_mut(worker)
            .and_then(|t| t.get_mut(k as usize))
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Empties connection `k`'s slot if it is in no room and has no identity left to use.
    pub(super) fn tidy(&mut self, worker: usize, k: u32) {
        if let Some(s) = self
            .workers
            .get_mut(worker)
            .and_then(|t| t.get_mut(k as usize))
        {
            if s.is_empty() {
                *s = Slot::default();
            }
        }
    }

    /// Every slot in a room.
    pub(super) fn in_rooms(&self) -> impl Iterator<Item = &Slot> {
        self.workers.iter().flatten().filter(|s| s.first.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_holds_one_room_inline_and_more_beside() {
        assert_eq!(std::mem::size_of::<Slot>(), 48);
        let mut s = Slot::default();
        assert_eq!(s.rooms(), 0);
        for t in ["a", "b", "c"] {
            s.add(t.into());
        }
        assert_eq!(s.rooms(), 3);
        assert!(s.has("a") && s.has("b") && s.has("c") && !s.has("d"));
        assert!(
            s.take("a"),
            "the first room, replaced by one from beside it"
        );
        assert!(!s.take("a"));
        assert!(s.has("b") && s.has("c"));
        assert!(s.take("b") && s.take("c"));
        assert_eq!(s.rooms(), 0);
        assert!(s.more.is_none() && s.first.is_none() && s.is_empty());
    }

    #[test]
    fn tables_grow_per_worker_and_list_slots_in_rooms() {
        let mut c = Conns::new(4);
        c.slot(1, 9).add("r".into());
        c.slot(0, 2).ident = Some(Ident::new("x", None));
        assert!(c.get(1, 9).is_some_and(|s| s.has("r")));
        assert!(c.get(0, 3).is_none() && c.get(5, 0).is_none());
        assert_eq!(c.in_rooms().count(), 1);
        c.tidy(0, 2);
        assert!(
            c.get(0, 2).is_some_and(|s| s.ident.is_some()),
            "identified: kept"
        );
        let s = c.take(1, 9);
        assert_eq!(s.rooms(), 1);
        assert_eq!(c.in_rooms().count(), 0);
    }
}
