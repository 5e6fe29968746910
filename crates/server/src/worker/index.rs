//! A worker's subscriber index: for each topic with a local subscriber, the slab keys of the
//! connections that follow it.
//!
//! Topics get small integer ids so that a connection stores a `u32` per subscription instead of a
//! name. Subscriber lists are plain vectors of slab keys: a broadcast walks one contiguous array.
//! This module owns only the mapping; the hub's global counts are updated by the worker.

use std::collections::HashMap;
use std::sync::Arc;

use slab::Slab;

/// The local subscribers of one topic.
pub struct LocalTopic {
    /// The topic name, shared with the hub and with published messages.
    pub name: Arc<str>,
    /// Slab keys of subscribed connections, in no particular order.
    pub subs: Vec<u32>,
}

/// Topic name → local subscribers.
#[derive(Default)]
pub struct TopicIndex {
    topics: Slab<LocalTopic>,
    by_name: HashMap<Arc<str>, u32>,
}

impl TopicIndex {
    /// The id of a topic that has local subscribers.
    pub fn id_of(&self, name: &str) -> Option<u32> {
        self.by_name.get(name).copied()
    }

    /// The name of topic `id`.
    pub fn name_of(&self, id: u32) -> Option<Arc<str>> {
        self.topics.get(id as usize).map(|t| Arc::clone(&t.name))
    }

    /// The subscribers of a topic, by name.
    pub fn subscribers(&self, name: &str) -> &[u32] {
        self.id_of(name)
            .and_then(|id| self.topics.get(id as usize))
            .map_or(&[], |t| t.subs.as_slice())
    }

    /// Adds connection `conn` to topic `name` and returns the topic's id.
    pub fn add(&mut self, name: Arc<str>, conn: u32) -> u32 {
        if let Some(&id) = self.by_name.get(&*name) {
            if let Some(t) = self.topics.get_mut(id as usize) {
                t.subs.push(conn);
                return id;
            }
        }
        let id = self.topics.insert(LocalTopic {
            name: Arc::clone(&name),
            subs: vec![conn],
        }) as u32;
        self.by_name.insert(name, id);
        id
    }

    /// Removes connection `conn` from topic `id`; returns the topic's name (for the hub), and
    /// forgets the topic when its last local subscriber leaves.
    pub fn remove(&mut self, id: u32, conn: u32) -> Option<Arc<str>> {
        let t = self.topics.get_mut(id as usize)?;
        let pos = t.subs.iter().position(|&c| c == conn)?;
        t.subs.swap_remove(pos);
        let name = Arc::clone(&t.name);
        if t.subs.is_empty() {
            self.topics.remove(id as usize);
            self.by_name.remove(&*name);
        }
        Some(name)
    }

    /// Number of topics with local subscribers.
    pub fn len(&self) -> usize {
        self.topics.len()
    }

    /// Whether no topic has a local subscriber.
    pub fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_remove_forgets_empty_topics() {
        let mut ix = TopicIndex::default();
        let a = ix.add("a".into(), 1);
        assert_eq!(ix.add("a".into(), 2), a);
        let b = ix.add("b".into(), 1);
        assert_ne!(a, b);
        assert_eq!(ix.subscribers("a"), &[1, 2]);
        assert_eq!(ix.remove(a, 1).as_deref(), Some("a"));
        assert_eq!(ix.subscribers("a"), &[2]);
        assert_eq!(ix.remove(a, 1), None, "not subscribed any more");
        assert_eq!(ix.remove(a, 2).as_deref(), Some("a"));
        assert_eq!(ix.id_of("a"), None);
        assert_eq!(ix.subscribers("a"), &[] as &[u32]);
        assert_eq!(ix.len(), 1);
    }
}
