//! What each authenticated connection of one worker holds: its token's expiry on the worker's
//! coarse clock and which grant set its token carries. A side table beside the slab, indexed by
//! slab key, reserved only when authentication is configured: 8 bytes per slot. The grant sets
//! themselves are interned once per worker and reference-counted by the slots that use them (a
//! thousand browsers with the same token shape share one), and dropped when the last slot
//! leaves. No connection owns a timer: the once-a-second sweep walks this table.

use std::collections::HashMap;
use std::sync::Arc;

use clarion_proto::auth::Grants;

/// One connection's authentication state, packed: 8 bytes.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    /// Worker-clock second at which the token expires (or, when pending, the deadline for an
    /// `auth` message); 0 for an empty slot.
    deadline: u32,
    /// [`WARNED`] and [`PENDING`] flags, and the grant set's id plus one (0: none).
    meta: u32,
}

/// The expiry warning was sent for the current token.
const WARNED: u32 = 1 << 31;
/// The connection must still authenticate (anonymous connections are not allowed).
const PENDING: u32 = 1 << 30;
/// The bits of `meta` that hold the grant set's id plus one.
const SET: u32 = PENDING - 1;

/// What the sweep found due.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// Connections whose token expired, with whether they were still pending (never
    /// authenticated).
    pub expired: Vec<(u32, bool)>,
    /// Connections to warn, with their deadline.
    pub warn: Vec<(u32, u32)>,
}

/// The table.
#[derive(Debug, Default)]
pub struct GrantStore {
    slots: Vec<Slot>,
    /// Interned grant sets with the number of slots using each; `None` entries are free ids.
    sets: Vec<Option<(Arc<Grants>, u32)>>,
    ids: HashMap<Arc<Grants>, u32>,
}

impl GrantStore {
    /// A table with room for `slots` connections reserved up front. Reserved, not touched: a
    /// large reservation is mapped lazily by the OS, so resident memory grows by 8 bytes per
    /// slot actually used, and growing never copies the table or leaves freed copies behind.
    pub fn with_capacity(slots: usize) -> GrantStore {
        GrantStore {
            slots: Vec::with_capacity(slots),
            ..GrantStore::default()
        }
    }

    fn slot(&self, k: u32) -> Option<Slot> {
        self.slots
            .get(k as usize)
            .copied()
            .filter(|s| s.deadline != 0)
    }

    /// Whether connection `k` must still authenticate.
    pub fn pending(&self, k: u32) -> bool {
        self.slot(k).is_some_and(|s| s.meta & PENDING != 0)
    }

    /// The grants of connection `k`, if it authenticated.
    pub fn grants(&self, k: u32) -> Option<&Arc<Grants>> {
        let id = self.slot(k)?.meta & SET;
        let (g, _) = self.sets.get(id.checked_sub(1)? as usize)?.as_ref()?;
        Some(g)
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
        let id = match self.ids.get(&grants) {
            Some(&id) => id,
            None => {
                let g = Arc::new(grants);
                let free = self.sets.iter().position(Option::is_none);
                let id = match free {
                    Some(i) => i as u32,
                    None => {
                        self.sets.push(None);
                        (self.sets.len() - 1) as u32
                    }
                };
                if let Some(e) = self.sets.get_mut(id as usize) {
                    *e = Some((Arc::clone(&g), 0));
                }
                self.ids.insert(g, id);
                id
            }
        };
        if let Some(Some((_, uses))) = self.sets.get_mut(id as usize) {
            *uses += 1;
        }
        self.clear(k);
        *self.slot_mut(k) = Slot {
            deadline: deadline.max(1),
            meta: (id + 1) & SET,
        };
    }

    /// Records that `k` must authenticate by worker second `deadline`.
    pub fn require(&mut self, k: u32, deadline: u32) {
        self.clear(k);
        *self.slot_mut(k) = Slot {
            deadline: deadline.max(1),
            meta: PENDING,
        };
    }

    /// Forgets `k` (it closed, or its slab key is reused), releasing its grant set.
    pub fn clear(&mut self, k: u32) {
        let Some(s) = self.slots.get_mut(k as usize) else {
            return;
        };
        let old = std::mem::take(s);
        let Some(id) = (old.meta & SET).checked_sub(1) else {
            return;
        };
        if let Some(entry) = self.sets.get_mut(id as usize) {
            if let Some((g, uses)) = entry.as_mut() {
                *uses = uses.saturating_sub(1);
                if *uses == 0 {
                    self.ids.remove(&**g);
                    *entry = None;
                }
            }
        }
    }

    /// What `k` holds, for a hand-over: its deadline, whether it is pending, whether it was
    /// warned, and its grants.
    pub fn export(&self, k: u32) -> Option<(u32, bool, bool, Option<Arc<Grants>>)> {
        let s = self.slot(k)?;
        let grants = self.grants(k).cloned();
        Some((
            s.deadline,
            s.meta & PENDING != 0,
            s.meta & WARNED != 0,
            grants,
        ))
    }

    /// Marks `k` warned.
    pub fn warned(&mut self, k: u32) {
        if let Some(s) = self.slots.get_mut(k as usize) {
            s.meta |= WARNED;
        }
    }

    /// The connections due at `now`: expired ones (with whether they were pending) and those
    /// within `warning` seconds of expiry that were not warned yet.
    pub fn due(&self, now: u32, warning: u32) -> Due {
        let mut due = Due::default();
        for (k, s) in self.slots.iter().enumerate() {
            if s.deadline == 0 {
                continue;
            }
            let pending = s.meta & PENDING != 0;
            if now >= s.deadline {
                due.expired.push((k as u32, pending));
            } else if !pending && s.meta & WARNED == 0 && now.saturating_add(warning) >= s.deadline
            {
                due.warn.push((k as u32, s.deadline));
            }
        }
        due
    }

    /// Distinct grant sets held.
    pub fn distinct(&self) -> usize {
        self.ids.len()
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
        assert_eq!(std::mem::size_of::<Slot>(), 8);
        let mut s = GrantStore::default();
        s.set(3, 100, grants("a"));
        s.set(5, 100, grants("a"));
        s.set(6, 100, grants("b"));
        assert_eq!(s.distinct(), 2);
        assert!(Arc::ptr_eq(s.grants(3).unwrap(), s.grants(5).unwrap()));
        s.clear(6);
        assert!(s.grants(6).is_none());
        assert_eq!(s.distinct(), 1);
        // Replacing a token releases the old set; a freed id is reused.
        s.set(3, 100, grants("c"));
        s.set(5, 100, grants("c"));
        assert_eq!(s.distinct(), 1);
        assert!(s.grants(5).unwrap().may_subscribe("c"));
        assert_eq!(s.sets.len(), 2);
        s.clear(3);
        s.clear(5);
        s.clear(99);
        assert_eq!(s.distinct(), 0);
    }

    #[test]
    fn due_warns_once_then_expires() {
        let mut s = GrantStore::default();
        s.set(1, 100, grants("a"));
        s.require(2, 90);
        assert!(s.pending(2) && !s.pending(1));
        assert_eq!(s.due(60, 30), Due::default());
        assert_eq!(s.due(70, 30).warn, vec![(1, 100)]);
        s.warned(1);
        let d = s.due(99, 30);
        assert!(d.warn.is_empty());
        assert_eq!(d.expired, vec![(2, true)]);
        s.clear(2);
        assert_eq!(s.due(100, 30).expired, vec![(1, false)]);
        // A fresh token clears the warning.
        s.set(1, 200, grants("a"));
        assert_eq!(s.due(171, 30).warn, vec![(1, 200)]);
    }
}
