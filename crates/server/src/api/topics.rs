//! `GET /topics[?cursor=NAME&limit=N]`: the topics this process knows, in name order, a page at
//! a time, each with its subscribers here and the messages its history holds here
//! (docs/protocol.md, "The publish API"). Read with the rights of the dashboard, which shows the
//! same: the API key or an admin token when either is configured, anyone otherwise.
//!
//! A page is chosen in one walk over the topic table under the broker's lock, keeping the
//! `limit` smallest names after the cursor in a bounded heap: O(topics · log limit), no copy of
//! a name (they are `Arc<str>` shared with the broker), and the lock is never held while a
//! history length is read or the answer written. The cursor is the last name of the previous
//! page, so a topic created or dropped between pages moves no other topic: every topic present
//! throughout is listed exactly once.

use std::collections::BinaryHeap;
use std::sync::Arc;

use clarion_proto::http1;
use serde_json::json;

use super::access::admin_ok;
use super::request::Request;
use crate::broker::Broker;
use crate::reply::Answer;
use crate::worker::Shared;

/// Topics in a page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 100;
/// The largest `limit`: one page's walk keeps this many names and then reads each one's status
/// under the lock, a few milliseconds at most.
pub const MAX_LIMIT: usize = 1000;

/// One page: the names in order, and how many topics there are in all.
#[derive(Debug, PartialEq, Eq)]
pub struct Page {
    /// At most `limit` names after the cursor, in byte order.
    pub names: Vec<Arc<str>>,
    /// Whether names follow the last one.
    pub more: bool,
    /// Every topic this process knows, before and after the cursor.
    pub total: u64,
}

/// Chooses a page while the names go by: a max-heap of the smallest names after the cursor,
/// whose largest is dropped past `limit + 1` (one more than `limit` says whether more follow).
struct Pager<'c> {
    cursor: Option<&'c str>,
    limit: usize,
    heap: BinaryHeap<Arc<str>>,
    total: u64,
}

impl<'c> Pager<'c> {
    fn new(cursor: Option<&'c str>, limit: usize) -> Pager<'c> {
        Pager {
            cursor,
            limit,
            heap: BinaryHeap::new(),
            total: 0,
        }
    }

    fn offer(&mut self, name: &Arc<str>) {
        self.total += 1;
        if self.cursor.is_some_and(|c| &**name <= c) {
            return;
        }
        if self.heap.len() > self.limit {
            match self.heap.peek() {
                Some(top) if name < top => {
                    self.heap.pop();
                }
                Some(_) | None => return,
            }
        }
        self.heap.push(Arc::clone(name));
    }

    fn finish(self) -> Page {
        let mut names = self.heap.into_sorted_vec();
        let more = names.len() > self.limit;
        names.truncate(self.limit);
        Page {
            names,
            more,
            total: self.total,
        }
    }
}

/// The page of `limit` names after `cursor` (from the first name when `None`) among `names`.
#[cfg(test)]
fn page<'a>(
    names: impl IntoIterator<Item = &'a Arc<str>>,
    cursor: Option<&str>,
    limit: usize,
) -> Page {
    let mut pager = Pager::new(cursor, limit);
    for name in names {
        pager.offer(name);
    }
    pager.finish()
}

/// The `GET /topics` answer.
pub(super) fn answer(req: &Request, shared: &Shared) -> Answer {
    if !admin_ok(req.authorization.as_deref(), shared) {
        return Answer::error(
            401,
            "GET /topics needs the API key or an admin token (clarion token --admin)",
        );
    }
    let mut cursor = None;
    let mut limit = DEFAULT_LIMIT;
    for pair in http1::query_pairs(&req.query) {
        let Ok((k, v)) = pair else {
            return Answer::error(400, "invalid query string");
        };
        match &*k {
            "cursor" if !v.is_empty() => cursor = Some(v.into_owned()),
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => limit = n,
                Ok(_) | Err(_) => {
                    return Answer::error(400, &format!("invalid limit {v:?}: 1 to {MAX_LIMIT}"))
                }
            },
            _ => {}
        }
    }
    let body = listing(&shared.broker, cursor.as_deref(), limit);
    Answer::new(200, "application/json", format!("{body}\n"))
}

/// The page as JSON: `{"topics": [{"topic", "subscribers", "history"}], "total", "next"}`;
/// `next` is the cursor of the following page, `null` on the last.
fn listing(broker: &Broker, cursor: Option<&str>, limit: usize) -> serde_json::Value {
    let mut pager = Pager::new(cursor, limit);
    broker.visit_topics(|name, _, _| pager.offer(name));
    let p = pager.finish();
    let rows: Vec<serde_json::Value> = p
        .names
        .iter()
        .filter_map(|name| {
            // A topic dropped since the walk (its last subscriber left, its history expired)
            // is left out rather than shown as empty.
            broker
                .topic_status(name)
                .map(|s| json!({"topic": &**name, "subscribers": s.subscribers, "history": s.held}))
        })
        .collect();
    let next = if p.more {
        p.names.last().map(|n| json!(&**n))
    } else {
        None
    };
    json!({"topics": rows, "total": p.total, "next": next})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<Arc<str>> {
        list.iter().map(|s| Arc::from(*s)).collect()
    }

    fn strs(p: &Page) -> Vec<&str> {
        p.names.iter().map(|n| &**n).collect()
    }

    #[test]
    fn pages_walk_every_name_once_in_order_whatever_the_table_order() {
        let table = names(&["m", "b", "z", "a", "k", "c", "y"]);
        let first = page(&table, None, 3);
        assert_eq!(strs(&first), ["a", "b", "c"]);
        assert!(first.more);
        assert_eq!(first.total, 7);
        let second = page(&table, Some("c"), 3);
        assert_eq!(strs(&second), ["k", "m", "y"]);
        assert!(second.more);
        let last = page(&table, Some("y"), 3);
        assert_eq!(strs(&last), ["z"]);
        assert!(!last.more);
        assert!(!page(&table, Some("z"), 3).more);
        assert!(page(&table, Some("z"), 3).names.is_empty());
    }

    #[test]
    fn a_page_exactly_full_says_no_more() {
        let table = names(&["b", "a"]);
        let p = page(&table, None, 2);
        assert_eq!((strs(&p), p.more), (vec!["a", "b"], false));
    }

    #[test]
    fn a_topic_created_between_pages_moves_no_other() {
        let before = names(&["a", "b", "c", "d"]);
        let first = page(&before, None, 2);
        assert_eq!(strs(&first), ["a", "b"]);
        // "aa" sorts before the cursor: not listed, and "c", "d" are not skipped.
        let after = names(&["a", "aa", "b", "c", "d"]);
        assert_eq!(strs(&page(&after, Some("b"), 2)), ["c", "d"]);
    }
}
