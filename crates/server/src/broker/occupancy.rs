//! Topic occupancy across processes: the broker capability behind the `topic_occupied` /
//! `topic_vacated` webhooks (`crate::hooks`). A broker whose nodes share state (the Redis
//! broker) decides a topic's transitions for the whole cluster; with one process or NATS each
//! process reports its own, and [`super::Broker::occupancy`] answers `None`.

use std::time::Duration;

/// How long a node counts as alive after its last refresh: a few refresh periods, so a busy
/// sender thread or a short Redis hiccup does not make a live node look dead.
pub const ALIVE_TTL: Duration = Duration::from_secs(15);

/// Where topic transitions are decided across processes (the Redis broker's nodes), if at all.
pub trait Occupancy: Send + Sync {
    /// This process's subscriptions to `topic` went from none to some (`true`) or back
    /// (`false`); the answer is whether the whole cluster made that transition now.
    fn transition(&self, topic: &str, occupied: bool) -> bool;
    /// Called at least every few seconds: keeps this node counted as alive.
    fn keep_alive(&self);
}
