//! A worker's subscriber index: for each topic with a local subscriber, the slab keys of the
//! connections that follow it; and a connection's side of it, [`Subs`].
//!
//! Topics get small integer ids so that a connection stores a `u32` per subscription instead of a
//! name. Subscriber lists are plain vectors of slab keys: a broadcast walks one contiguous array.
//! Each subscription also remembers where its connection sits in the topic's list, so leaving
//! is O(1) (a swap with the last entry, whose own record is told its new place) and a mass
//! disconnect from one topic is linear, not quadratic. This module owns only the mapping; the
//! hub's global counts are updated by the worker.
#![deny(clippy::wildcard_enum_match_arm)]

use std::collections::HashMap;
use std::sync::Arc;

use slab::Slab;

/// One subscription as a connection's record holds it: the topic's id and the connection's
/// place in that topic's subscriber list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sub {
    /// The topic's id in the worker's [`TopicIndex`].
    pub topic: u32,
    /// Where the connection's key sits in the topic's list.
    pub pos: u32,
}

/// The topics a connection subscribes to. Most push clients follow exactly one topic, so one
/// subscription is stored inline (16 bytes in all) and only more than one allocates.
#[derive(Debug, Default)]
pub enum Subs {
    /// No subscription.
    #[default]
    None,
    /// Exactly one.
    One(Sub),
    /// Two or more.
    Many(Box<Vec<Sub>>),
}

impl Subs {
    /// Whether there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        matches!(self, Subs::None)
    }

    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn as_slice(&self) -> &[Sub] {
        match self {
            Subs::None => &[],
            Subs::One(s) => std::slice::from_ref(s),
            Subs::Many(v) => v.as_slice(),
        }
    }

    /// Whether topic `tid` is among them.
    pub fn contains(&self, tid: u32) -> bool {
        self.as_slice().iter().any(|s| s.topic == tid)
    }

    /// Adds `sub` (the caller checked its topic is not there yet).
    pub fn push(&mut self, sub: Sub) {
        *self = match std::mem::take(self) {
            Subs::None => Subs::One(sub),
            Subs::One(s) => Subs::Many(Box::new(vec![s, sub])),
            Subs::Many(mut v) => {
                v.push(sub);
                Subs::Many(v)
            }
        };
    }

    /// Removes topic `tid` if present, and returns its subscription.
    pub fn remove(&mut self, tid: u32) -> Option<Sub> {
        let (rest, gone) = match std::mem::take(self) {
            Subs::One(s) if s.topic == tid => (Subs::None, Some(s)),
            Subs::Many(mut v) => {
                let gone = v.iter().position(|s| s.topic == tid).map(|i| v.remove(i));
                let rest = match v.as_slice() {
                    [] => Subs::None,
                    [one] => Subs::One(*one),
                    _ => Subs::Many(v),
                };
                (rest, gone)
            }
            other @ (Subs::None | Subs::One(_)) => (other, None),
        };
        *self = rest;
        gone
    }

    /// Records that this connection now sits at `pos` in topic `tid`'s list.
    pub fn moved(&mut self, tid: u32, pos: u32) {
        let slot = match self {
            Subs::None => None,
            Subs::One(s) => Some(s).filter(|s| s.topic == tid),
            Subs::Many(v) => v.iter_mut().find(|s| s.topic == tid),
        };
        if let Some(s) = slot {
            s.pos = pos;
        }
    }

    /// The topic ids, copied.
    pub fn ids(&self) -> Vec<u32> {
        self.as_slice().iter().map(|s| s.topic).collect()
    }

    /// Takes every subscription out, leaving `None`.
    pub fn take_all(&mut self) -> Vec<Sub> {
        match std::mem::take(self) {
            Subs::None => Vec::new(),
            Subs::One(s) => vec![s],
            Subs::Many(v) => *v,
        }
    }
}

/// What [`TopicIndex::remove`] did.
pub struct Left {
    /// The topic's name (for the hub).
    pub name: Arc<str>,
    /// The connection whose key took the leaver's place in the list, and that place: its
    /// record's [`Subs`] must be told with [`Subs::moved`].
    pub moved: Option<(u32, Sub)>,
}

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

    /// Adds connection `conn` to topic `name`; returns the subscription for its record.
    pub fn add(&mut self, name: Arc<str>, conn: u32) -> Sub {
        if let Some(&topic) = self.by_name.get(&*name) {
            if let Some(t) = self.topics.get_mut(topic as usize) {
                t.subs.push(conn);
                let pos = (t.subs.len() - 1) as u32;
                return Sub { topic, pos };
            }
        }
        let topic = self.topics.insert(LocalTopic {
            name: Arc::clone(&name),
            subs: vec![conn],
        }) as u32;
        self.by_name.insert(name, topic);
        Sub { topic, pos: 0 }
    }

    /// Removes connection `conn`'s subscription `sub`, and forgets the topic when its last
    /// local subscriber leaves. `None` when `conn` was not in the list.
    ///
    /// The place in `sub` is trusted when it holds `conn`; if not (a record and the index out
    /// of step would be a bug), the list is searched, so the index stays right either way.
    pub fn remove(&mut self, sub: Sub, conn: u32) -> Option<Left> {
        let t = self.topics.get_mut(sub.topic as usize)?;
        let at = sub.pos as usize;
        debug_assert_eq!(
            t.subs.get(at),
            Some(&conn),
            "the place of {conn}'s subscription"
        );
        let pos = if t.subs.get(at) == Some(&conn) {
            at
        } else {
            t.subs.iter().position(|&c| c == conn)?
        };
        t.subs.swap_remove(pos);
        let moved = t.subs.get(pos).map(|&c| {
            let place = Sub {
                topic: sub.topic,
                pos: pos as u32,
            };
            (c, place)
        });
        let name = Arc::clone(&t.name);
        if t.subs.is_empty() {
            self.topics.remove(sub.topic as usize);
            self.by_name.remove(&*name);
        }
        Some(Left { name, moved })
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

    /// An index and the records' side of it, kept in step as the engine keeps them.
    #[derive(Default)]
    struct Model {
        ix: TopicIndex,
        recs: HashMap<u32, Subs>,
    }

    impl Model {
        fn join(&mut self, topic: &str, conn: u32) -> u32 {
            let sub = self.ix.add(topic.into(), conn);
            self.recs.entry(conn).or_default().push(sub);
            sub.topic
        }

        fn leave(&mut self, tid: u32, conn: u32) -> Option<Arc<str>> {
            let sub = self.recs.get_mut(&conn)?.remove(tid)?;
            let left = self.ix.remove(sub, conn)?;
            if let Some((other, place)) = left.moved {
                if let Some(rec) = self.recs.get_mut(&other) {
                    rec.moved(place.topic, place.pos);
                }
            }
            Some(left.name)
        }

        /// Every record's places point at its own key.
        fn check(&self) {
            for (&conn, rec) in &self.recs {
                for s in rec.as_slice() {
                    let t = &self.ix.topics[s.topic as usize];
                    assert_eq!(t.subs[s.pos as usize], conn, "{conn} at {s:?}");
                }
            }
            let listed: usize = self.ix.topics.iter().map(|(_, t)| t.subs.len()).sum();
            let held: usize = self.recs.values().map(Subs::len).sum();
            assert_eq!(listed, held);
        }
    }

    #[test]
    fn add_remove_forgets_empty_topics() {
        let mut m = Model::default();
        let a = m.join("a", 1);
        assert_eq!(m.join("a", 2), a);
        let b = m.join("b", 1);
        assert_ne!(a, b);
        assert_eq!(m.ix.subscribers("a"), &[1, 2]);
        assert_eq!(m.leave(a, 1).as_deref(), Some("a"));
        assert_eq!(m.ix.subscribers("a"), &[2]);
        m.check();
        assert_eq!(m.leave(a, 1), None, "not subscribed any more");
        assert_eq!(m.leave(a, 2).as_deref(), Some("a"));
        assert_eq!(m.ix.id_of("a"), None);
        assert_eq!(m.ix.subscribers("a"), &[] as &[u32]);
        assert_eq!(m.ix.len(), 1);
        m.check();
    }

    #[test]
    fn places_stay_right_through_any_order_of_joins_and_leaves() {
        let mut m = Model::default();
        let topics = ["a", "b", "c"];
        // A fixed pseudo-random walk: joins and leaves of 40 connections over 3 topics.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let conn = (x % 40) as u32;
            let name = topics[(x >> 8) as usize % topics.len()];
            match m.ix.id_of(name) {
                Some(tid) if m.recs.get(&conn).is_some_and(|r| r.contains(tid)) => {
                    assert_eq!(m.leave(tid, conn).as_deref(), Some(name));
                }
                Some(_) | None => {
                    m.join(name, conn);
                }
            }
            m.check();
        }
    }

    #[test]
    fn a_mass_leave_is_linear() {
        // 200,000 subscribers leaving one topic in the order they joined: with a search per
        // leave this is 2 * 10^10 comparisons (minutes); with places, a blink.
        let mut m = Model::default();
        let n = 200_000;
        let tid = (0..n).map(|c| m.join("t", c)).last().unwrap_or(0);
        let started = std::time::Instant::now();
        for c in 0..n {
            assert!(m.leave(tid, c).is_some());
        }
        assert!(m.ix.is_empty());
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn subs_grow_and_shrink_in_order() {
        let s3 = Sub { topic: 3, pos: 0 };
        let s5 = Sub { topic: 5, pos: 1 };
        let s7 = Sub { topic: 7, pos: 2 };
        let mut s = Subs::None;
        s.push(s3);
        assert!(matches!(s, Subs::One(x) if x == s3));
        s.push(s5);
        s.push(s7);
        assert_eq!(s.len(), 3);
        assert!(s.contains(5));
        assert_eq!(s.remove(5), Some(s5));
        assert_eq!(s.ids(), vec![3, 7], "order kept");
        s.moved(7, 9);
        assert_eq!(s.remove(3), Some(s3));
        assert!(matches!(s, Subs::One(Sub { topic: 7, pos: 9 })));
        assert_eq!(s.remove(9), None);
        s.moved(9, 1);
        assert_eq!(s.len(), 1);
        assert_eq!(s.take_all(), vec![Sub { topic: 7, pos: 9 }]);
        assert_eq!(s.len(), 0);
    }
}
