//! The Redis broker's part of a hand-over (`crate::handover`): the old process stops taking
//! publishes and stops handing live messages to its workers, and says where each topic stands,
//! so the new process can resume every connection it takes from exactly there.
//!
//! Nothing is lost while frozen: history lives in Redis, and the new process reads what was
//! published since those positions through the same path as a client resuming with its ids
//! (`Core::catch_up`, then `Core::read_missed`). Other nodes keep publishing and delivering.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::RedisBroker;
use crate::broker::Unavailable;
use crate::hub::lock;

impl RedisBroker {
    /// Freezes delivery and publishing, and returns, for every topic this node follows, the id
    /// of the last message it handed to its workers (`0-0` for a topic nothing was published
    /// on). Under the state lock, so no live message reaches an inbox after the positions are
    /// read: once a worker has drained its inbox, each of its subscribers stands exactly there.
    pub fn freeze(&self) -> Vec<(Arc<str>, String)> {
        let core = &self.core;
        let st = lock(&core.state);
        core.frozen.store(true, Relaxed);
        st.topics
            .iter()
            .map(|(name, t)| {
                let id = match t.seq.position() {
                    (Some(e), last) => format!("{e}-{last}"),
                    (None, _) => "0-0".to_owned(),
                };
                (Arc::clone(name), id)
            })
            .collect()
    }

    /// A publish while frozen is refused (the API answers `503`; the publisher retries, on
    /// another process of a group).
    pub fn refuse_if_frozen(&self) -> Result<(), Unavailable> {
        if self.core.frozen.load(Relaxed) {
            return Err(Unavailable::upgrading());
        }
        Ok(())
    }
}
