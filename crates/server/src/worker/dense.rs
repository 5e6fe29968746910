//! A table by slab key kept as a vector indexed by the key, for the side tables the fan-out
//! reads for every delivery (an HTTP/2 stream's link to its connection, the connection's
//! protocol state).
//!
//! Why not [`super::side::ByKey`]: a hash table spreads consecutive keys over its buckets on
//! purpose, so a fan-out that walks a topic's subscribers (in accept order, which is slab-key
//! order) misses the cache on every lookup, twice (the control bytes, then the bucket). Here
//! the entry of key `k` is at index `k`: consecutive subscribers' entries share cache lines,
//! and the walk is a sequential scan the prefetcher follows.
//!
//! The cost: a slot (the size of `Option<V>`: 8 bytes for a pointer or a niche-packed pair)
//! for every key up to the highest one in the table, about an eighth of the slab's own
//! 64-byte records when every connection uses the feature. The slots past the highest key are
//! given back by the worker's sweep, once a second, and the vector when the table is empty, so
//! a worker that no longer serves the feature keeps nothing of it.

/// Values by slab key; see the module's doc.
pub(crate) struct Dense<V> {
    slots: Vec<Option<V>>,
    len: usize,
}

impl<V> Default for Dense<V> {
    fn default() -> Self {
        Dense {
            slots: Vec::new(),
            len: 0,
        }
    }
}

impl<V> Dense<V> {
    pub(crate) fn get(&self, k: &u32) -> Option<&V> {
        self.slots.get(*k as usize)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, k: &u32) -> Option<&mut V> {
        self.slots.get_mut(*k as usize)?.as_mut()
    }

    pub(crate) fn contains_key(&self, k: &u32) -> bool {
        self.get(k).is_some()
    }

    /// Puts `v` at `k`; what was there before.
    pub(crate) fn insert(&mut self, k: u32, v: V) -> Option<V> {
        let i = k as usize;
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || None);
        }
        let old = self.slots.get_mut(i).and_then(|s| s.replace(v));
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Takes `k`'s value out. The slots stay ([`Dense::compact`] gives them back): a value
    /// taken out to be worked on and put back costs no reallocation.
    pub(crate) fn remove(&mut self, k: &u32) -> Option<V> {
        let old = self.slots.get_mut(*k as usize)?.take()?;
        self.len -= 1;
        Some(old)
    }

    /// Gives back the slots past the highest key, and the vector itself when the table is
    /// empty (from the worker's once-a-second sweep).
    pub(crate) fn compact(&mut self) {
        if self.len == 0 {
            self.slots = Vec::new();
            return;
        }
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        if self.slots.capacity() > 2 * self.slots.len() {
            self.slots.shrink_to_fit();
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entries in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &V)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(k, v)| Some((k as u32, v.as_ref()?)))
    }

    /// The entries in key order, changeable.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut V)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(k, v)| Some((k as u32, v.as_mut()?)))
    }

    /// Slots held (for the tests: what the table costs).
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.slots.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_map_by_key() {
        let mut d = Dense::default();
        assert_eq!(d.insert(5, "a"), None);
        assert_eq!(d.insert(2, "b"), None);
        assert_eq!(d.insert(5, "c"), Some("a"));
        assert_eq!(d.len(), 2);
        assert_eq!(d.get(&5), Some(&"c"));
        assert_eq!(d.get(&4), None);
        assert_eq!(d.get(&900), None);
        assert!(d.contains_key(&2) && !d.contains_key(&3));
        if let Some(v) = d.get_mut(&2) {
            *v = "d";
        }
        assert_eq!(d.iter().collect::<Vec<_>>(), [(2, &"d"), (5, &"c")]);
        for (_, v) in d.iter_mut() {
            *v = "e";
        }
        assert_eq!(d.remove(&2), Some("e"));
        assert_eq!(d.remove(&2), None);
        assert_eq!(d.remove(&77), None);
        assert_eq!(d.len(), 1);
        assert!(!d.is_empty());
    }

    #[test]
    fn gives_its_memory_back_as_keys_leave() {
        let mut d = Dense::default();
        for k in 0..10_000 {
            d.insert(k, k);
        }
        // The highest keys leave: taking out keeps the slots, compacting gives them back.
        for k in (100..10_000).rev() {
            d.remove(&k);
        }
        assert_eq!(d.len(), 100);
        assert!(d.slots() >= 10_000);
        d.compact();
        assert!(d.slots() <= 400, "{} slots for keys below 100", d.slots());
        // A low key leaving keeps the slots of the higher ones.
        d.remove(&0);
        assert_eq!(d.get(&99), Some(&99));
        d.compact();
        assert_eq!(d.get(&99), Some(&99));
        for k in 1..100 {
            d.remove(&k);
        }
        assert!(d.is_empty());
        d.compact();
        assert_eq!(d.slots(), 0, "an empty table holds nothing");
        d.insert(3, 3);
        assert_eq!(d.get(&3), Some(&3), "and takes keys again");
    }

    #[test]
    fn a_slot_costs_no_more_than_its_value_when_it_has_a_niche() {
        assert_eq!(std::mem::size_of::<Option<Box<u64>>>(), 8);
        let link = std::mem::size_of::<Option<super::super::h2::Link>>();
        assert_eq!(link, 8);
    }
}
