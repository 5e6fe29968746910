//! A connection's topics: joining (with what it missed since a position), leaving one, leaving
//! all. Keeps the worker's [`super::index::TopicIndex`], the record's `subs` and the hub's
//! counts in step.
//!
//! Nothing here writes to a connection: callers send what a subscription returns in their own
//! transport's format.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::Arc;

use clarion_proto::filter::Filter;

use super::index::Sub;
use super::socket::Socket;
use super::state::Kind;
use super::Engine;
use crate::broker::{Since, Subscribed};

impl<S: Socket> Engine<S> {
    /// Subscribes connection `k` to `topics` (valid, new for it) and returns what it missed
    /// since `since`, for the caller to send in its transport's format. `None` when the
    /// connection went away meanwhile.
    ///
    /// Messages already waiting in this worker's inbox were published before the subscription:
    /// they go to the other subscribers first, before `k` joins the index, so `k` never gets a
    /// message twice (once replayed, once live).
    ///
    /// When a clustered broker cannot take the subscription, the client is told: an in-band
    /// subscribe (`in_band`, on an open WebSocket) gets an error reply and keeps its
    /// connection; a request whose answer has not started gets `503` with `Retry-After`.
    pub(crate) fn subscribe_conn(
        &mut self,
        k: u32,
        topics: &[&str],
        since: Since<'_>,
        in_band: bool,
    ) -> Option<Subscribed> {
        self.subscribe_filtered(k, topics, since, in_band, None)
    }

    /// [`Engine::subscribe_conn`] with a filter on every topic (`docs/filters.md`). The replay
    /// is returned whole: callers keep what passes with
    /// [`super::filters::keep_passing`] after reading any position they need from it.
    pub(crate) fn subscribe_filtered(
        &mut self,
        k: u32,
        topics: &[&str],
        since: Since<'_>,
        in_band: bool,
        filter: Option<&Filter>,
    ) -> Option<Subscribed> {
        if !self.presence_admits(k, topics, in_band) {
            return None;
        }
        let mut pending = Vec::new();
        let sub = self
            .shared
            .broker
            .subscribe(self.id, topics, since, &mut pending);
        if !pending.is_empty() {
            self.deliver_batch(&mut pending);
        }
        let sub = match sub {
            Ok(sub) => sub,
            Err(e) => {
                let error = format!("broker unavailable, not subscribed: {e}");
                self.tell_unavailable(k, &error, topics.first().copied(), in_band);
                return None;
            }
        };
        let alive = self
            .conns
            .get(k as usize)
            .is_some_and(|c| !matches!(c.state.kind(), Kind::Closing | Kind::Http));
        if !alive {
            for name in &sub.names {
                self.shared.broker.unsubscribe(self.id, name);
            }
            return None;
        }
        for name in &sub.names {
            let sub = self.index.add(Arc::clone(name), k);
            let tid = sub.topic;
            self.filters
                .set(k, tid, filter, &self.shared.metrics.filters);
            self.hook_topic(k, name, true);
            if let Some(conn) = self.conns.get_mut(k as usize) {
                conn.subs.push(sub);
                // Conflation: what waits in the kernel is not conflated, so little may wait.
                if let Some(rule) = self.shared.conflate.for_topic(name) {
                    if let Some(s) = &conn.stream {
                        s.limit_send_buffer(rule.threshold);
                    }
                }
            }
            self.presence_entered(k, name);
        }
        Some(sub)
    }

    /// The index id of topic `name` if connection `k` subscribes to it.
    pub(crate) fn subscription(&self, k: u32, name: &str) -> Option<u32> {
        let tid = self.index.id_of(name)?;
        let conn = self.conns.get(k as usize)?;
        conn.subs.contains(tid).then_some(tid)
    }

    pub(crate) fn unsubscribe(&mut self, k: u32, tid: u32) {
        let sub = self
            .conns
            .get_mut(k as usize)
            .and_then(|conn| conn.subs.remove(tid));
        self.filters.clear(k, tid, &self.shared.metrics.filters);
        if let Some(b) = self.side.conflation_mut().get_mut(&k) {
            b.forget_topic(tid);
        }
        if let Some(name) = sub.and_then(|sub| self.leave_index(sub, k)) {
            self.presence_left(k, &name, tid);
            self.side.delta_mut().leave(k, &name);
            self.shared.broker.unsubscribe(self.id, &name);
            self.hook_topic(k, &name, false);
        }
    }

    pub(crate) fn leave_all_topics(&mut self, k: u32) {
        self.side.delta_mut().forget(k);
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        for sub in conn.subs.take_all() {
            let tid = sub.topic;
            self.filters.clear(k, tid, &self.shared.metrics.filters);
            if let Some(name) = self.leave_index(sub, k) {
                self.presence_left(k, &name, tid);
                self.shared.broker.unsubscribe(self.id, &name);
                self.hook_topic(k, &name, false);
            }
        }
    }

    /// Takes `k` out of its subscription `sub`'s list, and tells the connection whose key took
    /// its place where it now is. Returns the topic's name.
    fn leave_index(&mut self, sub: Sub, k: u32) -> Option<Arc<str>> {
        let left = self.index.remove(sub, k)?;
        if let Some((other, place)) = left.moved {
            if let Some(conn) = self.conns.get_mut(other as usize) {
                conn.subs.moved(place.topic, place.pos);
            }
        }
        Some(left.name)
    }
}
