//! Letting go of topics: lazily and in batches.
//!
//! When a topic's last subscriber on this node leaves, the node does not unsubscribe at once.
//! The topic *lingers* for [`LINGER`], still followed and still positioned, so a subscriber
//! coming back (a page reload, a reconnect storm after another node died) costs nothing at
//! Redis. Then the reader threads let go of the topics that stayed empty, at most
//! [`PER_SWEEP`] per sweep, with one `SUNSUBSCRIBE` per partition naming up to
//! [`PER_COMMAND`] channels (channels of one partition share a slot, as Redis Cluster
//! requires of one command). A node that loses most of its connections at once (the end of
//! the million run: tens of processes letting go of 10,000 rooms each) so sends a few hundred
//! commands instead of one per topic, and its subscriber connection keeps answering `PING`.
//!
//! The queue only holds names; what a topic's state says when its turn comes decides: a topic
//! that found a subscriber again, or that is already let go, is skipped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::layout::partition;
use super::{keys, Core, Follow, State};

/// How long an empty topic stays followed before the node unsubscribes.
pub(super) const LINGER: Duration = Duration::from_secs(2);

/// Topics let go of in one sweep, so the state lock is held briefly; the rest wait for the
/// next sweep (the reader sweeps after every read, and the confirmations of this sweep's
/// commands are reads).
const PER_SWEEP: usize = 4096;

/// Channels named by one `SUNSUBSCRIBE`.
const PER_COMMAND: usize = 512;

impl Core {
    /// Records that `topic` has no subscriber left here (or a follow of it failed): it is let
    /// go after [`LINGER`] unless someone subscribes in the meantime. A topic never subscribed
    /// at Redis has nothing to let go of and is forgotten now.
    pub(super) fn release(&self, st: &mut State, topic: &str) {
        let Some((name, t)) = st.topics.get_key_value(topic) else {
            return;
        };
        if t.follow == Follow::Idle && t.unconfirmed == 0 {
            st.topics.remove(topic);
            return;
        }
        let name = Arc::clone(name);
        st.leaving.push_back((name, Instant::now()));
    }

    /// Lets go of the topics that have been empty for [`LINGER`] by `now`.
    pub(super) fn sweep_leaving(&self, st: &mut State, now: Instant) {
        // (shard, partition) -> channels: one command per group and size.
        let mut groups: BTreeMap<(usize, u32), Vec<Vec<u8>>> = BTreeMap::new();
        let mut names = Vec::new();
        while names.len() < PER_SWEEP {
            match st.leaving.front() {
                Some((_, since)) if now.duration_since(*since) >= LINGER => {}
                _ => break,
            }
            let Some((name, _)) = st.leaving.pop_front() else {
                break;
            };
            let Some(t) = st.topics.get(&name) else {
                continue;
            };
            if !t.unused() {
                continue;
            }
            if t.follow == Follow::Idle {
                if t.unconfirmed == 0 {
                    st.topics.remove(&name);
                }
                continue;
            }
            let shard = self.shard_of(&name);
            let channel = keys(&name)[2].clone().into_bytes();
            groups
                .entry((shard, partition(&name)))
                .or_default()
                .push(channel);
            names.push(name);
        }
        // One write per shard, its partitions' commands in a row.
        let mut per_shard: BTreeMap<usize, Vec<Vec<Vec<u8>>>> = BTreeMap::new();
        for ((shard, _), channels) in groups {
            let cmds = per_shard.entry(shard).or_default();
            for chunk in channels.chunks(PER_COMMAND) {
                let mut cmd = Vec::with_capacity(chunk.len() + 1);
                cmd.push(b"SUNSUBSCRIBE".to_vec());
                cmd.extend(chunk.iter().cloned());
                cmds.push(cmd);
            }
        }
        let mut failed_shards = Vec::new();
        for (shard, cmds) in per_shard {
            if !st.up(shard) || self.send_sub(shard, &cmds).is_err() {
                failed_shards.push(shard);
            }
        }
        for name in names {
            let shard = self.shard_of(&name);
            let Some(t) = st.topics.get_mut(&name) else {
                continue;
            };
            if !failed_shards.contains(&shard) {
                // One confirmation per channel comes back, as for one command each.
                t.unconfirmed += 1;
            }
            t.follow = Follow::Idle;
            t.seq.let_go();
            if t.unconfirmed == 0 {
                st.topics.remove(&name);
            }
        }
    }
}
