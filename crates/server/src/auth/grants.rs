//! What each authenticated connection of one worker holds: its token's expiry on the worker's
//! coarse clock and its grants. A side table beside the slab, indexed by slab key, allocated
//! only when authentication is configured: 16 bytes per slot, and the grants themselves are
//! shared, one `Arc` per distinct set (a thousand browsers with the same token shape share one
//! allocation). No connection owns a timer: the once-a-second sweep walks this table.

use std::collections::HashSet;
use std::sync::Arc;

use clarion_proto::auth::Grants;

/// One connection's authentication state.
#[derive(Debug, Default, Clone)]
pub struct Slot {
    /// Worker-clock second at which the token expires (or, when `pending`, the deadline for
    /// an `auth` message); 0 for none.
    pub deadline: u32,
    /// The expiry warning was sent for the current token.
    pub warned: bool,
    /// The connection must still authenticate (anonymous connections are not allowed).
    pub pending: bool,
    /// What the token grants; `None` for an anonymous connection.
    pub grants: Option<Arc<Grants>>,
}

/// What the sweep found due.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// Connections whose token expired (or that never authenticated in time).
    pub expired: Vec<(u32, bool)>,
    /// Connections to warn, with their deadline.
    pub warn: Vec<(u32, u32)>,
}

/// The table.
#[derive(Debug, Default)]
pub struct GrantStore {
    slots: Vec<Slot>,
    shared: HashSet<Arc<Grants>>,
}

impl GrantStore {
    /// A table with room for `slots` connections reserved up front. Reserved, not touched: a
    /// large reservation is mapped lazily by the OS, so resident memory grows by 16 bytes per
    /// slot actually used, and growing never copies the table or leaves freed copies behind.
    pub fn with_capacity(slots: usize) -> GrantStore {
        GrantStore {
            slots: Vec::with_capacity(slots),
            shared: HashSet::new(),
        }
    }

    /// The slot of connection `k`, if it has one.
    pub fn get(&self, k: u32) -> Option<&Slot> {
        self.slots.get(k as usize).filter(|s| s.deadline != 0)
    }

    /// The grants of connection `k`, if it authenticated.
    pub fn grants(&self, k: u32) -> Option<&Arc<Grants>> {
        self.get(k).and_then(|s| s.grants.as_ref())
    }

    fn slot_mut(&mut self, k: u32) -> &mut Slot {
        let i = k as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, Slot::default);
        }
        // Just resized to hold `i`.
        #[allow(clippy::indexing_slicing)]
        &mut self.slots[i]
    }

    /// Records that `k` holds a token granting `grants` until worker second `deadline`.
    pub fn set(&mut self, k: u32, deadline: u32, grants: Grants) {
        let grants = match self.shared.get(&grants) {
            Some(g) => Arc::clone(g),
            None => {
                let g = Arc::new(grants);
                self.shared.insert(Arc::clone(&g));
                g
            }
        };
        *self.slot_mut(k) = Slot {
            deadline: deadline.max(1),
            warned: false,
            pending: false,
            grants: Some(grants),
        };
    }

    /// Records that `k` must authenticate by worker second `deadline`.
    pub fn require(&mut self, k: u32, deadline: u32) {
        *self.slot_mut(k) = Slot {
            deadline: deadline.max(1),
            pending: true,
            ..Slot::default()
        };
    }

    /// Forgets `k` (it closed, or its slab key is reused).
    pub fn clear(&mut self, k: u32) {
        if let Some(s) = self.slots.get_mut(k as usize) {
            *s = Slot::default();
        }
    }

    /// Marks `k` warned.
    pub fn warned(&mut self, k: u32) {
        if let Some(s) = self.slots.get_mut(k as usize) {
            s.warned = true;
        }
    }

    /// The connections due at `now`: expired ones (with whether they were pending) and those
    /// within `warning` seconds of expiry that were not warned yet. Also drops grant sets no
    /// connection holds any more.
    pub fn due(&mut self, now: u32, warning: u32) -> Due {
        let mut due = Due::default();
        for (k, s) in self.slots.iter().enumerate() {
            if s.deadline == 0 {
                continue;
            }
            if now >= s.deadline {
                due.expired.push((k as u32, s.pending));
            } else if !s.pending && !s.warned && now.saturating_add(warning) >= s.deadline {
                due.warn.push((k as u32, s.deadline));
            }
        }
        // Only this table holds the set: no connection uses it.
        self.shared.retain(|g| Arc::strong_count(g) > 1);
        due
    }

    /// Distinct grant sets held (tests).
    pub fn distinct(&self) -> usize {
        self.shared.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::auth::Pattern;

    fn grants(t: &str) -> Grants {
        Grants {
            subscribe: vec![Pattern::parse(t).unwrap()],
            publish: Vec::new(),
        }
    }

    #[test]
    fn slots_are_small_and_grants_shared() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
        let mut s = GrantStore::default();
        s.set(3, 100, grants("a"));
        s.set(5, 100, grants("a"));
        s.set(6, 100, grants("b"));
        assert_eq!(s.distinct(), 2);
        assert!(Arc::ptr_eq(s.grants(3).unwrap(), s.grants(5).unwrap()));
        s.clear(6);
        assert!(s.grants(6).is_none());
        s.due(0, 0);
        assert_eq!(s.distinct(), 1);
    }

    #[test]
    fn due_warns_once_then_expires() {
        let mut s = GrantStore::default();
        s.set(1, 100, grants("a"));
        s.require(2, 90);
        assert_eq!(s.due(60, 30), Due::default());
        assert_eq!(s.due(70, 30).warn, vec![(1, 100)]);
        s.warned(1);
        let d = s.due(99, 30);
        assert!(d.warn.is_empty());
        assert_eq!(d.expired, vec![(2, true)]);
        s.clear(2);
        assert_eq!(s.due(100, 30).expired, vec![(1, false)]);
    }
}
