//! The decoder's dynamic table (RFC 7541 §2.3.2, §4), with its entries shared between the
//! connections of a thread.
//!
//! Every connection a browser opens indexes the same fields in its first request: the user
//! agent, client hints, languages, encodings, the page's origin. With the default table size
//! each connection kept its own copy for as long as it lived, about 1.3 KB a browser's
//! connection, most of what an idle HTTP/2 connection cost. Here each distinct entry is kept
//! once per thread, counted by reference ([`Entry`]), and so is each list of entries: after
//! every header block that changed it, a table takes the list an equal table holds already
//! ([`Table::share`]). The connections of one browser on one page hold one pointer between
//! them; a table with an entry of its own (a cookie) holds its own list, 8 bytes an entry. A
//! change to a shared list copies it first.
//!
//! Nothing a peer can see changes: the table's size is still counted per connection in RFC
//! 7541's terms (name, value and 32 bytes), entries are evicted as before, and an entry is
//! never changed once made, so what one connection inserted another reads as the bytes its
//! own peer sent.
//!
//! Sharing is a cache, not a state the protocol depends on: [`Entry::new`] and
//! [`Table::share`] find an equal value by a keyed hash (one key per thread, so a peer cannot
//! choose collisions), and on a miss or a collision keep their own. The thread's indexes hold
//! weak references: the last table to let go of a value takes it out of its index, and a value
//! dropped where its index cannot be reached (on another thread) leaves a dead reference,
//! dropped once the index has grown to twice what was alive at its last purge.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::{Arc, Weak};

use super::field_size;

/// One table entry, name and value in one buffer, shared by every table that holds it.
pub(crate) struct Entry {
    bytes: Box<[u8]>,
    /// Where the name ends in `bytes`.
    split: u32,
}

impl Entry {
    /// The entry `name: value`, shared with any table of this thread that holds it already.
    pub(crate) fn new(name: &[u8], value: &[u8]) -> Arc<Entry> {
        Shared::with(|s| s.entry(name, value)).unwrap_or_else(|| Arc::new(Entry::copy(name, value)))
    }

    fn copy(name: &[u8], value: &[u8]) -> Entry {
        let mut bytes = Vec::with_capacity(name.len() + value.len());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(value);
        Entry {
            bytes: bytes.into_boxed_slice(),
            // A name is within a header block, itself bounded far below 4 GiB.
            split: u32::try_from(name.len()).unwrap_or(u32::MAX),
        }
    }

    pub(crate) fn name(&self) -> &[u8] {
        self.bytes.get(..self.split as usize).unwrap_or_default()
    }

    pub(crate) fn value(&self) -> &[u8] {
        self.bytes.get(self.split as usize..).unwrap_or_default()
    }

    /// What the entry counts in a table (RFC 7541 §4.1).
    fn size(&self) -> u32 {
        u32::try_from(field_size(self.name(), self.value())).unwrap_or(u32::MAX)
    }
}

/// Lengths only: an entry may be a cookie or a credential.
impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Entry({} + {} B)", self.name().len(), self.value().len())
    }
}

/// The last table to let go of an entry takes it out of its thread's index, so that the index
/// holds what lives and the entry's memory goes back when it did before sharing.
impl Drop for Entry {
    fn drop(&mut self) {
        let me: *const Entry = self;
        Shared::with(|s| {
            let key = s.entry_key(self.name(), self.value());
            s.entries.forget(key, me);
        });
    }
}

/// An index purges dead references at no fewer entries than this (a value dropped while its
/// thread's index was in use, or on another thread, leaves one).
const MIN_PURGE: usize = 1024;

/// A thread's index of shared values (entries, or tables' lists), by a keyed hash.
struct Index<T> {
    by_key: HashMap<u64, Weak<T>>,
    /// The index's size at which dead references are dropped next.
    purge_at: usize,
}

impl<T> Index<T> {
    fn new() -> Index<T> {
        Index {
            by_key: HashMap::new(),
            purge_at: MIN_PURGE,
        }
    }

    /// The value under `key`, if it is alive and `is` accepts it.
    fn find(&self, key: u64, is: impl FnOnce(&T) -> bool) -> Option<Arc<T>> {
        let found = self.by_key.get(&key)?.upgrade()?;
        is(&found).then_some(found)
    }

    /// Indexes `value` under `key` from now on. A collision replaces the older value in the
    /// index: it stays where it is held, only unshared from now on.
    fn insert(&mut self, key: u64, value: &Arc<T>) {
        if self.by_key.len() >= self.purge_at {
            self.by_key.retain(|_, f| f.strong_count() > 0);
            self.purge_at = (self.by_key.len() * 2).max(MIN_PURGE);
        }
        self.by_key.insert(key, Arc::downgrade(value));
    }

    /// Takes `value` (being dropped) out of the index, if it is the one under `key`.
    fn forget(&mut self, key: u64, value: *const T) {
        if self
            .by_key
            .get(&key)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), value))
        {
            self.by_key.remove(&key);
        }
    }
}

/// A thread's indexes, and the key of their hashes.
struct Shared {
    keys: RandomState,
    entries: Index<Entry>,
    tables: Index<Entries>,
}

thread_local! {
    static SHARED: RefCell<Shared> = RefCell::new(Shared {
        keys: RandomState::new(),
        entries: Index::new(),
        tables: Index::new(),
    });
}

impl Shared {
    /// Runs `f` on this thread's indexes, unless the thread is ending or they are in use
    /// already (a value dropped from inside `f`): sharing is a cache, and is then skipped.
    fn with<R>(f: impl FnOnce(&mut Shared) -> R) -> Option<R> {
        SHARED
            .try_with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
            .ok()
            .flatten()
    }

    fn entry_key(&self, name: &[u8], value: &[u8]) -> u64 {
        let mut h = self.keys.build_hasher();
        h.write_usize(name.len());
        h.write(name);
        h.write(value);
        h.finish()
    }

    fn list_key(&self, queue: &VecDeque<Arc<Entry>>) -> u64 {
        let mut h = self.keys.build_hasher();
        for e in queue {
            h.write_usize(Arc::as_ptr(e) as usize);
        }
        h.finish()
    }

    fn entry(&mut self, name: &[u8], value: &[u8]) -> Arc<Entry> {
        let key = self.entry_key(name, value);
        if let Some(found) = self
            .entries
            .find(key, |e| e.name() == name && e.value() == value)
        {
            return found;
        }
        let made = Arc::new(Entry::copy(name, value));
        self.entries.insert(key, &made);
        made
    }

    /// An equal list (the same entries in the same order) that another table holds already,
    /// if there is one; otherwise `list` itself, indexed, keeping no room for more entries.
    /// The caller drops what it gave and did not get back once the index is free again.
    fn table(&mut self, list: &mut Arc<Entries>) -> Option<Arc<Entries>> {
        let key = self.list_key(&list.queue);
        let same = |other: &Entries| {
            other.queue.len() == list.queue.len()
                && other
                    .queue
                    .iter()
                    .zip(&list.queue)
                    .all(|(a, b)| Arc::ptr_eq(a, b))
        };
        if let Some(found) = self.tables.find(key, same) {
            return Some(found);
        }
        if let Some(own) = Arc::get_mut(list) {
            own.queue.shrink_to_fit();
        }
        self.tables.insert(key, list);
        None
    }

    #[cfg(test)]
    fn sizes() -> (usize, usize) {
        SHARED.with(|s| {
            let s = s.borrow();
            (s.entries.by_key.len(), s.tables.by_key.len())
        })
    }
}

/// The dynamic table: newest entry first, evicted from the back to stay within `max`. An empty
/// table owns no memory: its entries and their size are behind a pointer, made at the first
/// insertion and freed whenever the table empties (a connection whose client indexes nothing,
/// or once it has acknowledged a table size of zero, keeps 16 bytes here, sizes included). A
/// list may be shared with other tables ([`Table::share`]); a change copies it first.
#[derive(Debug, Default)]
pub(super) struct Table {
    entries: Option<Arc<Entries>>,
    pub(super) max: u32,
    /// The largest `max` a peer's size update may ask for: the default until the peer has
    /// acknowledged our `SETTINGS_HEADER_TABLE_SIZE` (or the advertised size if that is
    /// larger: the peer may have seen it already), then the advertised size. (The decoder's
    /// rule, kept here so that it shares the table's 8-byte alignment with `max`.)
    pub(super) limit: u32,
}

/// A table's entries, oldest first (so the newest, index 62, is the last), and their size.
#[derive(Debug, Default, Clone)]
struct Entries {
    queue: VecDeque<Arc<Entry>>,
    size: u32,
}

/// A list to change: this table's own, taken out of the index first if it was there, or a copy
/// of one that other tables share.
fn own(list: &mut Arc<Entries>) -> &mut Entries {
    if Arc::strong_count(list) == 1 && Arc::weak_count(list) > 0 {
        // Indexed, held by this table alone: changed in place once no other can find it.
        let me = Arc::as_ptr(list);
        Shared::with(|s| {
            let key = s.list_key(&list.queue);
            s.tables.forget(key, me);
        });
    }
    Arc::make_mut(list)
}

/// As [`Entry`]'s: the last table to let go of a list takes it out of the index.
impl Drop for Entries {
    fn drop(&mut self) {
        let me: *const Entries = self;
        Shared::with(|s| {
            let key = s.list_key(&self.queue);
            s.tables.forget(key, me);
        });
    }
}

impl Table {
    /// An empty table of `max` bytes whose size updates may ask for up to `limit`.
    pub(super) fn new(max: u32, limit: u32) -> Table {
        Table {
            entries: None,
            max,
            limit,
        }
    }

    /// A table holding `entries`, oldest first, its list shared as after a block; `None` if
    /// they do not fit `max`, or `max` is above `limit`.
    pub(super) fn with(max: u32, limit: u32, entries: Vec<Arc<Entry>>) -> Option<Table> {
        let size = entries.iter().try_fold(0usize, |n, f| {
            n.checked_add(field_size(f.name(), f.value()))
        })?;
        if max > limit || size > max as usize {
            return None;
        }
        let mut table = Table {
            entries: (!entries.is_empty()).then(|| {
                Arc::new(Entries {
                    queue: entries.into(),
                    size: size as u32,
                })
            }),
            max,
            limit,
        };
        table.share();
        Some(table)
    }

    pub(super) fn size(&self) -> u32 {
        self.entries.as_ref().map_or(0, |e| e.size)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_none()
    }

    pub(super) fn get(&self, dynamic_index: usize) -> Option<(&[u8], &[u8])> {
        let queue = &self.entries.as_ref()?.queue;
        let i = queue.len().checked_sub(dynamic_index + 1)?;
        queue.get(i).map(|f| (f.name(), f.value()))
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.entries
            .iter()
            .flat_map(|e| e.queue.iter())
            .map(|f| (f.name(), f.value()))
    }

    fn evict_to(&mut self, max: u32) {
        let Some(e) = self.entries.as_mut() else {
            return;
        };
        if e.size <= max {
            return;
        }
        let e = own(e);
        while e.size > max {
            match e.queue.pop_front() {
                Some(f) => e.size -= f.size(),
                None => break,
            }
        }
        if e.queue.is_empty() {
            self.entries = None;
        }
    }

    pub(super) fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = field_size(name, value);
        if size > self.max as usize {
            // An entry larger than the table empties it and is not added (§4.4).
            self.entries = None;
            return;
        }
        let size = size as u32;
        self.evict_to(self.max - size);
        let e = own(self.entries.get_or_insert_with(Default::default));
        e.queue.push_back(Entry::new(name, value));
        e.size += size;
    }

    pub(super) fn resize(&mut self, max: u32) {
        self.max = max;
        self.evict_to(max);
    }

    /// Shares the table's list with any other table of this thread that holds the same
    /// entries in the same order (the connections of one browser, or of many of one version,
    /// opened on one page), or makes it the one others will share, holding no room for more
    /// entries: a browser indexes its fields in its first request, so a shared list rarely
    /// changes again, and if it does, it is copied first.
    pub(super) fn share(&mut self) {
        let Some(list) = self.entries.as_mut() else {
            return;
        };
        // Past the thread's end (no index left) the table stays as it is.
        if let Some(Some(shared)) = Shared::with(|s| s.table(list)) {
            // The list given up drops here, with the index free for its `Drop`.
            *list = shared;
        }
    }

    /// Whether both tables hold the very same list (for tests).
    #[cfg(test)]
    pub(super) fn shares_with(&self, other: &Table) -> bool {
        matches!((&self.entries, &other.entries), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
    }

    /// The pointers this table holds, oldest first (for tests).
    #[cfg(test)]
    fn ptrs(&self) -> Vec<*const Entry> {
        self.entries
            .iter()
            .flat_map(|e| e.queue.iter())
            .map(Arc::as_ptr)
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn equal_entries_are_one_allocation_and_live_as_long_as_a_table_holds_them() {
        let mut a = Table::new(4096, 4096);
        let mut b = Table::new(4096, 4096);
        a.insert(b"user-agent", b"Mozilla/5.0 (shared)");
        a.insert(b"cookie", b"a=1");
        b.insert(b"user-agent", b"Mozilla/5.0 (shared)");
        b.insert(b"cookie", b"a=2");
        let (pa, pb) = (a.ptrs(), b.ptrs());
        assert_eq!(pa[0], pb[0], "the same field is one entry");
        assert_ne!(pa[1], pb[1], "different values are different entries");
        assert_eq!(b.get(0), Some((&b"cookie"[..], &b"a=2"[..])));
        assert_eq!(
            b.get(1),
            Some((&b"user-agent"[..], &b"Mozilla/5.0 (shared)"[..]))
        );
        // The size is each table's own, in RFC 7541's terms.
        assert_eq!(a.size(), b.size());
        assert_eq!(a.size() as usize, 10 + 20 + 32 + 6 + 3 + 32);
        // One table letting go leaves the other's entries whole.
        drop(a);
        assert_eq!(
            b.iter().collect::<Vec<_>>(),
            vec![
                (&b"user-agent"[..], &b"Mozilla/5.0 (shared)"[..]),
                (&b"cookie"[..], &b"a=2"[..])
            ]
        );
        // A name and value that split differently are not the same entry.
        let mut c = Table::new(4096, 4096);
        c.insert(b"ab", b"c");
        c.insert(b"a", b"bc");
        assert_eq!(
            c.iter().collect::<Vec<_>>(),
            vec![(&b"ab"[..], &b"c"[..]), (&b"a"[..], &b"bc"[..])]
        );
    }

    #[test]
    fn the_indexes_hold_what_lives() {
        // Each field is inserted and evicted at once (a table of one entry), and the list
        // shared after each: the indexes hold the one live entry and list, and nothing once
        // the table is gone. (Tests may share a thread: counts are taken relative.)
        let (entries, lists) = Shared::sizes();
        let mut t = Table::new(64, 64);
        for i in 0..3 * MIN_PURGE {
            t.insert(b"x-n", format!("{i}").as_bytes());
            t.share();
            assert_eq!(Shared::sizes(), (entries + 1, lists + 1), "{i}");
        }
        let list = list_ptr(&t);
        t.insert(b"x-n", b"last");
        assert_eq!(list_ptr(&t), list, "a list held alone changes in place");
        drop(t);
        assert_eq!(Shared::sizes(), (entries, lists));
    }

    fn contents(t: &Table) -> Vec<(Vec<u8>, Vec<u8>)> {
        t.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
    }

    fn list_ptr(t: &Table) -> *const Entries {
        t.entries.as_ref().map_or(std::ptr::null(), Arc::as_ptr)
    }

    #[test]
    fn tables_of_the_same_entries_share_one_list_and_copy_it_to_change() {
        let browser = |cookie: &[u8]| {
            let mut t = Table::new(4096, 4096);
            t.insert(b"user-agent", b"Mozilla/5.0");
            t.insert(b"accept-language", b"en-US,en;q=0.9");
            t.insert(b"cookie", cookie);
            t
        };
        let (mut a, mut b, mut c) = (browser(b"s=1"), browser(b"s=1"), browser(b"s=2"));
        assert_ne!(list_ptr(&a), list_ptr(&b), "lists are made apart");
        for t in [&mut a, &mut b, &mut c] {
            t.share();
        }
        assert_eq!(
            list_ptr(&a),
            list_ptr(&b),
            "equal lists, once shared, are one"
        );
        assert_ne!(
            list_ptr(&a),
            list_ptr(&c),
            "a different cookie is a different list"
        );
        let (before_b, before_c) = (contents(&b), contents(&c));
        // A change (an insertion, an eviction) is made on a copy: the others are untouched.
        a.insert(b"x-new", b"1");
        assert_ne!(list_ptr(&a), list_ptr(&b));
        assert_eq!(contents(&b), before_b);
        assert_eq!(a.get(0), Some((&b"x-new"[..], &b"1"[..])));
        assert_eq!(a.size(), b.size() + 5 + 1 + 32);
        b.resize(64);
        assert_eq!(contents(&c), before_c);
        assert_eq!(
            contents(&b),
            vec![(b"cookie".to_vec(), b"s=1".to_vec())],
            "the newest entry that fits stays"
        );
        // A shared table reads as it did, and grows as before.
        let mut t = Table::new(4096, 4096);
        for i in 0..9 {
            t.insert(b"x-field", format!("value {i}").as_bytes());
        }
        let before = contents(&t);
        t.share();
        assert_eq!(contents(&t), before);
        t.insert(b"x-field", b"ten");
        assert_eq!(t.get(0), Some((&b"x-field"[..], &b"ten"[..])));
        assert_eq!(t.iter().count(), 10);
    }
}
