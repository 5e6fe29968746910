//! A worker's subscription filters (`docs/filters.md`): the distinct filters its subscriptions
//! hold, refcounted, and which subscription (connection, topic) holds which.
//!
//! Delivery asks [`FilterTable::pass`] which messages of a run a subscriber gets. Each distinct
//! filter is evaluated once per message on this worker, the first time a subscriber holding it
//! is reached in a fan-out; every other subscriber sharing it reuses that answer (so 15,000
//! subscribers with 100 distinct filters cost 100 evaluations per message, not 15,000).
//! Filters are keyed on their canonical form, so `a == "1" and b == "2"` and
//! `b == "2" and a == "1"` are one filter.
//!
//! Gap notices and presence events are not publications: they pass every filter.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::filter::{Filter, FilterError, Limits};
use slab::Slab;

use crate::message::Published;
use crate::metrics::filters::FilterCounters;

/// One distinct filter and the answers it gave for the run being delivered.
struct Entry {
    filter: Arc<Filter>,
    /// Subscriptions holding it.
    refs: u32,
    /// The run these answers are for ([`FilterTable::begin_run`]).
    run: u64,
    /// For each message of that run, whether it passes.
    answers: Vec<bool>,
}

/// What a subscriber gets of a run of messages.
pub(crate) enum Pass {
    /// Every message (no filter, or all pass).
    All,
    /// None of them.
    Nothing,
    /// These, in order.
    Some(Vec<Arc<Published>>),
}

/// The worker's filters.
#[derive(Default)]
pub(crate) struct FilterTable {
    entries: Slab<Entry>,
    by_filter: HashMap<Arc<Filter>, u32>,
    /// (connection, topic id) → entry.
    held: HashMap<(u32, u32), u32>,
    /// Numbers the runs delivered, so answers are computed once per run.
    run: u64,
}

impl FilterTable {
    /// Connection `k`'s subscription to topic `tid` now holds `filter` (or none), replacing
    /// what it held.
    pub(crate) fn set(&mut self, k: u32, tid: u32, filter: Option<&Filter>, c: &FilterCounters) {
        self.clear(k, tid, c);
        let Some(filter) = filter else { return };
        let id = match self.by_filter.get(filter) {
            Some(&id) => id,
            None => {
                let filter = Arc::new(filter.clone());
                let id = self.entries.insert(Entry {
                    filter: Arc::clone(&filter),
                    refs: 0,
                    run: 0,
                    answers: Vec::new(),
                }) as u32;
                self.by_filter.insert(filter, id);
                c.distinct.fetch_add(1, Relaxed);
                id
            }
        };
        if let Some(e) = self.entries.get_mut(id as usize) {
            e.refs += 1;
        }
        self.held.insert((k, tid), id);
    }

    /// Connection `k`'s subscription to topic `tid` ended (or dropped its filter).
    pub(crate) fn clear(&mut self, k: u32, tid: u32, c: &FilterCounters) {
        let Some(id) = self.held.remove(&(k, tid)) else {
            return;
        };
        let Some(e) = self.entries.get_mut(id as usize) else {
            return;
        };
        e.refs = e.refs.saturating_sub(1);
        if e.refs == 0 {
            let e = self.entries.remove(id as usize);
            self.by_filter.remove(&e.filter);
            c.distinct.fetch_sub(1, Relaxed);
        }
    }

    /// The filter connection `k` holds on topic `tid`.
    pub(crate) fn of(&self, k: u32, tid: u32) -> Option<&Filter> {
        let id = self.held.get(&(k, tid))?;
        self.entries.get(*id as usize).map(|e| &*e.filter)
    }

    /// Whether no subscription on this worker has a filter (delivery then skips all of this).
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Starts a new run: answers computed for the previous one are stale.
    pub(crate) fn begin_run(&mut self) {
        self.run = self.run.wrapping_add(1);
    }

    /// What connection `k`, subscribed to topic `tid`, gets of `run` (the run begun last).
    pub(crate) fn pass(
        &mut self,
        k: u32,
        tid: u32,
        run: &[Arc<Published>],
        c: &FilterCounters,
    ) -> Pass {
        let Some(&id) = self.held.get(&(k, tid)) else {
            return Pass::All;
        };
        let Some(e) = self.entries.get_mut(id as usize) else {
            return Pass::All;
        };
        if e.run != self.run || e.answers.len() != run.len() {
            e.run = self.run;
            e.answers.clear();
            e.answers.extend(run.iter().map(|m| passes(&e.filter, m)));
            c.evaluations.fetch_add(run.len() as u64, Relaxed);
        }
        if e.answers.iter().all(|&a| a) {
            Pass::All
        } else if !e.answers.iter().any(|&a| a) {
            Pass::Nothing
        } else {
            Pass::Some(
                run.iter()
                    .zip(&e.answers)
                    .filter(|(_, &a)| a)
                    .map(|(m, _)| Arc::clone(m))
                    .collect(),
            )
        }
    }
}

/// A `filter=` query parameter (the text form), read with the default limits; the error is the
/// `400` answer's text, counted by reason.
pub(crate) fn read_filter_text(text: &str, c: &FilterCounters) -> Result<Filter, String> {
    clarion_proto::filter::parse(text, &Limits::default()).map_err(|e| refused(&e, c))
}

/// A subscribe message's `"filter"`: its JSON form, or the text form as a string.
pub(crate) fn read_filter_json(
    v: &serde_json::Value,
    c: &FilterCounters,
) -> Result<Filter, String> {
    let limits = Limits::default();
    let read = match v {
        serde_json::Value::String(text) => clarion_proto::filter::parse(text, &limits),
        serde_json::Value::Null
        | serde_json::Value::Bool(_)
        | serde_json::Value::Number(_)
        | serde_json::Value::Array(_)
        | serde_json::Value::Object(_) => clarion_proto::filter::json::from_json(v, &limits),
    };
    read.map_err(|e| refused(&e, c))
}

fn refused(e: &FilterError, c: &FilterCounters) -> String {
    c.refused(e.reason());
    format!("invalid filter: {e}")
}

/// Whether `m` passes `filter`: a publication whose tags match it, or a gap notice or presence
/// event (the server's own, never filtered).
pub(crate) fn passes(filter: &Filter, m: &Published) -> bool {
    m.notice || m.presence || filter.matches(&*m.tags)
}

/// Keeps the messages of a replay (what a subscriber missed) that pass `filter`. A message
/// filtered out is not missing: it is no gap, and no gap notice is removed.
pub(crate) fn keep_passing(filter: Option<&Filter>, replay: &mut Vec<Arc<Published>>) {
    if let Some(f) = filter {
        replay.retain(|m| passes(f, m));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::filter::parse;
    use clarion_proto::ws::DataKind;

    fn msg(id: u64, tags: &[(&str, &str)]) -> Arc<Published> {
        let mut p = Published::new("t".into(), id, "e".into(), DataKind::Text, None, 0, b"x");
        p.tags = tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Arc::new(p)
    }

    fn ids(p: Pass) -> Vec<u64> {
        match p {
            Pass::All => vec![u64::MAX],
            Pass::Nothing => vec![],
            Pass::Some(v) => v.iter().map(|m| m.id).collect(),
        }
    }

    #[test]
    fn one_evaluation_per_message_per_distinct_filter() {
        let c = FilterCounters::default();
        let mut t = FilterTable::default();
        let l = Limits::default();
        let f1 = parse(r#"a == "1" and b == "2""#, &l).unwrap();
        let f1b = parse(r#"b == "2" and a == "1""#, &l).unwrap();
        let f2 = parse(r#"a == "1""#, &l).unwrap();
        // 100 subscribers on topic 0: 50 with f1 (in two spellings), 50 with f2.
        for k in 0..100u32 {
            let f = match k % 4 {
                0 => &f1,
                1 => &f1b,
                _ => &f2,
            };
            t.set(k, 0, Some(f), &c);
        }
        assert_eq!(c.distinct.load(Relaxed), 2);
        let run = vec![
            msg(1, &[("a", "1")]),
            msg(2, &[("a", "1"), ("b", "2")]),
            msg(3, &[]),
        ];
        t.begin_run();
        for k in 0..100u32 {
            let got = ids(t.pass(k, 0, &run, &c));
            assert_eq!(got, if k % 4 < 2 { vec![2] } else { vec![1, 2] }, "{k}");
        }
        assert_eq!(c.evaluations.load(Relaxed), 2 * 3, "2 filters × 3 messages");
        assert_eq!(
            ids(t.pass(7, 1, &run, &c)),
            vec![u64::MAX],
            "no filter there"
        );
        // Unsubscribing everyone forgets the filters.
        for k in 0..100u32 {
            t.clear(k, 0, &c);
        }
        assert_eq!(c.distinct.load(Relaxed), 0);
        assert!(t.is_empty());
    }

    #[test]
    fn notices_pass_and_replays_keep_only_matches() {
        let l = Limits::default();
        let f = parse(r#"a == "1""#, &l).unwrap();
        let mut notice = Published::new("t".into(), 5, "e".into(), DataKind::Text, None, 0, b"{}");
        notice.notice = true;
        let mut replay = vec![
            msg(1, &[("a", "2")]),
            msg(2, &[("a", "1")]),
            Arc::new(notice),
        ];
        keep_passing(Some(&f), &mut replay);
        assert_eq!(replay.iter().map(|m| m.id).collect::<Vec<_>>(), vec![2, 5]);
        keep_passing(None, &mut replay);
        assert_eq!(replay.len(), 2);
    }
}
