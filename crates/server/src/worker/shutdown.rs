//! Graceful shutdown of the connections: each is ended the way its transport allows a client
//! to resume (WebSockets close with 1001, or 1012 "service restart" on a restart; SSE streams
//! end, told on a restart to come back within 1 to 3 s; streams end; held long-polls are
//! answered empty; GRIP holds get their backend's answers).
//!
//! With `drain_period` the shell calls [`Engine::drain_to`] with a growing share, so the
//! connections are told to go a slice at a time and their reconnections arrive elsewhere as a
//! steady stream. The listeners and the deadline belong to the shell in [`super`].
#![deny(clippy::wildcard_enum_match_arm)]

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;

use super::socket::Socket;
use super::state::State;
use super::Engine;
use crate::worker::transport::frame::End;

/// A drain in progress: how many subscribers there were, and which connections were told.
#[derive(Debug, Default)]
pub(crate) struct Drain {
    total: usize,
    told: HashSet<u32>,
}

impl<S: Socket> Engine<S> {
    /// Tells subscribers to go until `share` of those open at the first call have been; at
    /// `1.0`, every connection left is ended (handshakes and backend requests included).
    pub(crate) fn drain_to(&mut self, share: f64) {
        let subscribers = || {
            self.conns
                .iter()
                .filter(|(_, c)| c.state.subscribed())
                .count()
        };
        let drain = self.side.drain_mut().get_or_insert_with(|| {
            Box::new(Drain {
                total: subscribers(),
                told: HashSet::new(),
            })
        });
        let keys: Vec<(u32, State)> = if share >= 1.0 {
            self.conns
                .iter()
                .map(|(k, c)| (k as u32, c.state))
                .filter(|(k, _)| !drain.told.contains(k))
                .collect()
        } else {
            let target = (drain.total as f64 * share).ceil() as usize;
            let due = target.saturating_sub(drain.told.len());
            self.conns
                .iter()
                .map(|(k, c)| (k as u32, c.state))
                .filter(|(k, s)| s.subscribed() && !drain.told.contains(k))
                .take(due)
                .collect()
        };
        drain.told.extend(keys.iter().map(|(k, _)| *k));
        for (k, state) in keys {
            self.end_for_shutdown(k, state);
        }
    }

    /// Ends one connection the way its transport allows the client to resume.
    fn end_for_shutdown(&mut self, k: u32, state: State) {
        let restart = self.shared.restarting.load(Relaxed);
        self.end_as(k, state, End::Shutdown { restart });
    }
}
