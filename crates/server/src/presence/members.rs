//! A room's members in identity order, sized for what rooms mostly are: a handful of members
//! per process. Up to [`SMALL`] members live in one sorted vector that grows one slot at a time
//! (no slack: a room of two costs two entries, where a B-tree node would hold eleven); past it
//! they move to a B-tree, so a room of 100,000 members still joins and leaves in O(log n).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// Members a room keeps in its sorted vector before it becomes a B-tree.
const SMALL: usize = 32;

/// One member: its connections (on this process) and the info of its first connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) conns: u32,
    pub(super) info: Option<Arc<str>>,
}

/// The members of one room.
#[derive(Debug)]
pub(super) enum Members {
    Small(Vec<(Arc<str>, Entry)>),
    Large(BTreeMap<Arc<str>, Entry>),
}

impl Default for Members {
    fn default() -> Members {
        Members::Small(Vec::new())
    }
}

impl Members {
    pub(super) fn len(&self) -> usize {
        match self {
            Members::Small(v) => v.len(),
            Members::Large(m) => m.len(),
        }
    }

    pub(super) fn get_mut(&mut self, sub: &str) -> Option<&mut Entry> {
        match self {
            Members::Small(v) => {
                let i = v.binary_search_by(|(s, _)| (**s).cmp(sub)).ok()?;
                v.get_mut(i).map(|(_, e)| e)
            }
            Members::Large(m) => m.get_mut(sub),
        }
    }

    /// Adds `sub`, which must not be a member yet.
    pub(super) fn insert(&mut self, sub: Arc<str>, e: Entry) {
        match self {
            Members::Small(v) if v.len() < SMALL => {
                let i = v
                    .binary_search_by(|(s, _)| (**s).cmp(&*sub))
                    .unwrap_or_else(|i| i);
                v.reserve_exact(1);
                v.insert(i, (sub, e));
            }
            Members::Small(v) => {
                let mut m: BTreeMap<Arc<str>, Entry> = std::mem::take(v).into_iter().collect();
                m.insert(sub, e);
                *self = Members::Large(m);
            }
            Members::Large(m) => {
                m.insert(sub, e);
            }
        }
    }

    pub(super) fn remove(&mut self, sub: &str) -> Option<Entry> {
        match self {
            Members::Small(v) => {
                let i = v.binary_search_by(|(s, _)| (**s).cmp(sub)).ok()?;
                let (_, e) = v.remove(i);
                if v.capacity() > v.len() + 4 {
                    v.shrink_to_fit();
                }
                Some(e)
            }
            Members::Large(m) => m.remove(sub),
        }
    }

    /// Members after `after` (from the first when `None`), in identity order.
    pub(super) fn after<'a>(
        &'a self,
        after: Option<&'a str>,
    ) -> Box<dyn Iterator<Item = (&'a Arc<str>, &'a Entry)> + 'a> {
        match self {
            Members::Small(v) => {
                let start = match after {
                    Some(a) => v
                        .binary_search_by(|(s, _)| (**s).cmp(a))
                        .map_or_else(|i| i, |i| i + 1),
                    None => 0,
                };
                Box::new(
                    v.get(start..)
                        .unwrap_or_default()
                        .iter()
                        .map(|(s, e)| (s, e)),
                )
            }
            Members::Large(m) => match after {
                Some(a) => Box::new(m.range::<str, _>((Bound::Excluded(a), Bound::Unbounded))),
                None => Box::new(m.iter()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(n: u32) -> Entry {
        Entry {
            conns: n,
            info: None,
        }
    }

    #[test]
    fn small_and_large_rooms_behave_alike() {
        for n in [3usize, SMALL, SMALL + 1, 200] {
            let mut m = Members::default();
            // Inserted out of order; listed in order.
            for i in (0..n).rev() {
                m.insert(format!("u{i:04}").into(), e(1));
            }
            assert_eq!(m.len(), n);
            assert_eq!(matches!(m, Members::Large(_)), n > SMALL);
            let all: Vec<String> = m.after(None).map(|(s, _)| s.to_string()).collect();
            let mut sorted = all.clone();
            sorted.sort();
            assert_eq!(all, sorted);
            let rest: Vec<&Arc<str>> = m.after(Some("u0001")).map(|(s, _)| s).collect();
            assert_eq!(rest.len(), n - 2);
            assert_eq!(
                m.after(Some("u00005")).next().map(|(s, _)| &**s),
                Some("u0001")
            );
            if let Some(x) = m.get_mut("u0002") {
                x.conns = 7;
            }
            assert!(m.get_mut("u0002").is_some() && m.get_mut("nobody").is_none());
            assert_eq!(m.remove("u0002"), Some(e(7)));
            assert_eq!(m.remove("u0002"), None);
            assert_eq!(m.len(), n - 1);
        }
    }
}
