//! What connections hold outside their slab record: one owned part of the engine, the way
//! quinn-proto's `Connection` owns its `streams` and `timers`. Only connections that use a
//! feature pay for its entry (a held poll, a GRIP hold, a compression stream, a token, a hook's
//! answer, presence, HTTP/2), so an idle connection costs nothing here.
//!
//! The tables are private. The three things every connection's life needs of all of them are
//! written here once, each destructuring every table without `..`: [`Side::forget`] (the
//! connection is gone), [`Side::blocker`] (why it cannot move to a new process) and
//! [`Side::take`] / [`Side::restore`] (what moves with it). A table added later does not
//! compile until each of the three says what happens to it.
//!
//! This module decides nothing about protocols: the features that own each table (named on
//! its accessor) read and change it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroU16;

use clarion_proto::ws::deflate::{Compressor, Inflater};

use super::conflation::Backlogs;
use super::delta::DeltaSubs;
use super::dense::Dense;
use super::grip::conn::{GripConn, Phase};
use super::h2::Link;
use super::h2_rest::Held;
use super::presence::PresenceConns;
use super::shutdown::Drain;
use super::transport::hooks::HookTable;
use super::transport::poll::PollHold;
use super::transport::pusher_conn::PusherConn;
use crate::auth::grants::GrantStore;

/// A table by slab key. The engine assigns the keys (a client cannot choose them, nor learn
/// them), so these tables need no defence against chosen collisions, which is what the
/// standard map's keyed SipHash pays for on every lookup: a multiply spreads a key's bits.
pub(crate) type ByKey<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// [`ByKey`]'s hasher: a slab key times an odd constant (the golden ratio's, as Fibonacci
/// hashing does), its high bits folded into the low ones the table indexes with.
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        let h = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 32);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Every per-connection table, by slab key.
#[derive(Default)]
pub(crate) struct Side {
    /// Held long-polls (`transport::poll`).
    polls: ByKey<PollHold>,
    /// GRIP connections' state beyond their record (`grip`; proxy mode only).
    grip: ByKey<GripConn>,
    /// Inflaters of clients that compress with context takeover, created when such a client
    /// first sends a compressed message. Clarion answers `client_no_context_takeover` to every
    /// offer, so only a connection agreed by an older version (and handed over) has one.
    inflaters: ByKey<Inflater>,
    /// Dedicated-mode compressors, created at a connection's first compressed delivery.
    deflaters: ByKey<Compressor>,
    /// Authenticated connections' expiry and grants (`transport::auth`; auth configured only).
    grants: GrantStore,
    /// Requests and messages waiting for a backend hook, and what hooks said (hooks only).
    hooks: HookTable,
    /// Connections in presence rooms: identities, rooms, event listeners.
    presence: PresenceConns,
    /// HTTP/2 connections' protocol state (`h2`), dense: a fan-out reaches it for every
    /// delivery to a stream.
    h2: Dense<Held>,
    /// HTTP/2 stream records: their connection's key and their stream id (dense, as `h2`).
    h2_streams: Dense<Link>,
    /// How many of `h2_streams` each HTTP/2 connection holds, by its key: kept within
    /// `h2_max_streams` by the engine itself (`h2`). Dense, 2 bytes a slot (a hash table of
    /// `u32` cost about 20 bytes a connection).
    h2_records: Dense<NonZeroU16>,
    /// A shutdown telling its connections to go over `drain_period`, and which it told
    /// (`shutdown`).
    drain: Option<Box<Drain>>,
    /// Connections that take deltas, and the last message each was sent per topic (`delta`).
    delta: DeltaSubs,
    /// Conflated messages of subscribers behind on a conflating topic (`conflation`).
    conflation: ByKey<Backlogs>,
    /// Pusher connections' own part (`transport::pusher`).
    pusher: ByKey<PusherConn>,
}

/// What [`Side::forget`] took out that its feature must still finish with the engine: a
/// bridged WebSocket's backend is told it left, an HTTP/2 connection's streams end with it.
pub(crate) struct Forgotten {
    /// The connection's GRIP state.
    pub(crate) grip: Option<GripConn>,
    /// Its Pusher part: its application's count and its presence memberships to leave.
    pub(crate) pusher: Option<PusherConn>,
}

/// Why a connection's side state keeps it from moving to a new process ([`Side::blocker`]);
/// the hand-over counts each as its `Fallback`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocker {
    /// A backend hook's answer is awaited: the call belongs to this process.
    HookWait,
    /// A request forwarded to a GRIP backend waits for its answer, which comes back to this
    /// process (a held stream or long-poll moves: `super::handover_grip`).
    GripBackend,
    /// A WebSocket bridged with WebSocket-over-HTTP: its session lives in the backend's event
    /// requests.
    GripBridge,
    /// A held long-poll watches presence events, which are not carried.
    PresencePoll,
    /// Conflated messages wait for the socket: they are this process's (the connection is
    /// ended as at a restart, and resumes).
    Conflating,
}

/// The side state a connection carries to another worker or process ([`Side::take`]).
#[derive(Default)]
pub(crate) struct Taken {
    /// A held long-poll.
    pub(crate) poll: Option<PollHold>,
    /// Its client's context-takeover inflater.
    pub(crate) inflater: Option<Inflater>,
    /// Its dedicated compressor.
    pub(crate) deflater: Option<Compressor>,
}

/// `name()` and `name_mut()` for each table: its feature reads and changes it through these.
macro_rules! accessors {
    ($($name:ident, $name_mut:ident: $ty:ty;)*) => {
        impl Side {
            $(
                pub(crate) fn $name(&self) -> &$ty {
                    &self.$name
                }

                pub(crate) fn $name_mut(&mut self) -> &mut $ty {
                    &mut self.$name
                }
            )*
        }
    };
}

accessors! {
    polls, polls_mut: ByKey<PollHold>;
    grip, grip_mut: ByKey<GripConn>;
    deflaters, deflaters_mut: ByKey<Compressor>;
    grants, grants_mut: GrantStore;
    hooks, hooks_mut: HookTable;
    presence, presence_mut: PresenceConns;
    h2, h2_mut: Dense<Held>;
    h2_streams, h2_streams_mut: Dense<Link>;
    h2_records, h2_records_mut: Dense<NonZeroU16>;
    delta, delta_mut: DeltaSubs;
    conflation, conflation_mut: ByKey<Backlogs>;
    pusher, pusher_mut: ByKey<PusherConn>;
}

impl Side {
    /// Client inflaters are only made and used by the WebSocket read path (no reader needs
    /// the table without changing it).
    pub(crate) fn inflaters_mut(&mut self) -> &mut ByKey<Inflater> {
        &mut self.inflaters
    }

    /// Only the shutdown starts and advances a drain.
    pub(crate) fn drain_mut(&mut self) -> &mut Option<Box<Drain>> {
        &mut self.drain
    }
}

impl Side {
    /// The tables, with the grants reserved for `cap` connections when authentication is on
    /// (see `GrantStore::with_capacity`).
    pub(crate) fn new(grants_for: Option<usize>) -> Side {
        Side {
            grants: grants_for.map_or_else(GrantStore::default, GrantStore::with_capacity),
            ..Side::default()
        }
    }

    /// Connection `k` is gone (closing or dropped): its entries leave every table. The HTTP/2
    /// tables are the HTTP/2 part's to end (its streams are records of their own, dropped
    /// through the engine), and the presence rooms are left through the broker: both are
    /// finished by the engine, before or after this.
    pub(crate) fn forget(&mut self, k: u32) -> Forgotten {
        let Side {
            polls,
            grip,
            inflaters,
            deflaters,
            grants,
            hooks,
            presence: _, // Keyed by room; `Engine::presence_forget` leaves them.
            h2: _,       // `Engine::h2_forget` ends the streams first.
            h2_streams: _,
            h2_records: _,
            drain: _, // Keys told stay told: the share counts those open at its start.
            delta,
            conflation,
            pusher,
        } = self;
        polls.remove(&k);
        delta.forget(k);
        conflation.remove(&k);
        inflaters.remove(&k);
        deflaters.remove(&k);
        grants.clear(k);
        hooks.forget(k);
        Forgotten {
            grip: grip.remove(&k),
            pusher: pusher.remove(&k),
        }
    }

    /// Why connection `k`'s side state keeps it from moving to a new process, if it does.
    pub(crate) fn blocker(&self, k: u32) -> Option<Blocker> {
        let Side {
            polls, // Carried (its deadline and cursor), unless it watches presence events.
            grip,
            inflaters: _, // Carried: the window (`DeflateWindows`).
            deflaters: _, // Carried: the window.
            grants: _,    // Carried in the mode (`CarriedMode`).
            hooks,
            presence: _, // Carried in the mode; a cluster's rooms are checked by the caller.
            h2: _,       // Carried: `H2Part`.
            h2_streams: _, // A stream moves with its connection or is refused there.
            h2_records: _,
            drain: _, // A hand-over and a drain do not overlap.
            delta: _, // Not carried: a moved connection gets full messages (never wrong).
            conflation,
            pusher: _, // Its state (`WsRole::Pusher`) is not carried: `Fallback::ModeState`.
        } = self;
        if conflation.contains_key(&k) {
            return Some(Blocker::Conflating);
        }
        if hooks.waiting_for(k) {
            return Some(Blocker::HookWait);
        }
        match grip.get(&k).map(|g| &g.phase) {
            None | Some(Phase::Stream(_) | Phase::Response(_)) => {}
            Some(Phase::Waiting(_)) => return Some(Blocker::GripBackend),
            Some(Phase::Ws(_)) => return Some(Blocker::GripBridge),
        }
        if polls.get(&k).is_some_and(|h| h.presence) {
            return Some(Blocker::PresencePoll);
        }
        None
    }

    /// Takes out what connection `k` carries to its new home that is not a mode's (grants,
    /// hooks and presence travel in `CarriedMode`) nor HTTP/2's (`H2Part`).
    pub(crate) fn take(&mut self, k: u32) -> Taken {
        let Side {
            polls,
            grip: _, // A hold moves through `Engine::take_grip`, at the engine's clock.
            inflaters,
            deflaters,
            grants: _,   // In `CarriedMode`.
            hooks: _,    // In `CarriedMode`.
            presence: _, // In `CarriedMode`.
            h2: _,       // In `H2Part`.
            h2_streams: _,
            h2_records: _,
            drain: _,
            delta,
            conflation: _, // A blocker: never taken.
            pusher: _,     // Never taken: not carried (see `blocker`).
        } = self;
        // Not carried: its key here is someone else's next, and full messages are never wrong.
        delta.forget(k);
        Taken {
            poll: polls.remove(&k),
            inflater: inflaters.remove(&k),
            deflater: deflaters.remove(&k),
        }
    }

    /// Puts back what [`Side::take`] took, for connection `k` (its key in this slab).
    pub(crate) fn restore(&mut self, k: u32, taken: Taken) {
        let Side {
            polls,
            grip: _,
            inflaters,
            deflaters,
            grants: _,
            hooks: _,
            presence: _,
            h2: _,
            h2_streams: _,
            h2_records: _,
            drain: _,
            delta: _, // Nothing was taken (see `take`).
            conflation: _,
            pusher: _,
        } = self;
        let Taken {
            poll,
            inflater,
            deflater,
        } = taken;
        if let Some(p) = poll {
            polls.insert(k, p);
        }
        if let Some(i) = inflater {
            inflaters.insert(k, i);
        }
        if let Some(d) = deflater {
            deflaters.insert(k, d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll(presence: bool) -> PollHold {
        PollHold {
            deadline: 30,
            cursor: "c".into(),
            presence,
        }
    }

    #[test]
    fn slab_keys_spread_over_a_table_s_buckets_and_tags() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<KeyHasher>::default();
        let hashes: Vec<u64> = (0..16_384u32).map(|k| build.hash_one(k)).collect();
        // The bucket index (low bits) and the tag hashbrown keeps per slot (top 7 bits).
        let buckets: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 16_383).collect();
        let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(buckets.len() > 16_384 * 6 / 10, "{} buckets", buckets.len());
        assert_eq!(tags.len(), 128);
        let mut t: ByKey<u32> = ByKey::default();
        t.extend((0..100_000).map(|k| (k, k)));
        assert!((0..100_000).all(|k| t.get(&k) == Some(&k)));
    }

    #[test]
    fn forget_leaves_nothing_of_a_connection_behind() {
        let mut side = Side::new(Some(8));
        side.polls_mut().insert(3, poll(false));
        side.deflaters_mut()
            .insert(3, Compressor::resume(1, 15, 8, b""));
        side.polls_mut().insert(4, poll(false));
        let left = side.forget(3);
        assert!(left.grip.is_none());
        assert!(!side.polls().contains_key(&3));
        assert!(!side.deflaters().contains_key(&3));
        assert!(
            side.polls().contains_key(&4),
            "another connection's entry stays"
        );
    }

    #[test]
    fn a_presence_poll_blocks_a_move_and_a_plain_one_does_not() {
        let mut side = Side::default();
        side.polls_mut().insert(1, poll(true));
        side.polls_mut().insert(2, poll(false));
        assert_eq!(side.blocker(1), Some(Blocker::PresencePoll));
        assert_eq!(side.blocker(2), None);
        assert_eq!(side.blocker(3), None);
    }

    #[test]
    fn a_conflation_backlog_blocks_a_move_and_is_forgotten_with_its_connection() {
        let mut side = Side::default();
        side.conflation_mut().insert(7, Backlogs::default());
        assert_eq!(side.blocker(7), Some(Blocker::Conflating));
        side.forget(7);
        assert_eq!(side.blocker(7), None);
        assert!(side.conflation().is_empty());
    }

    #[test]
    fn take_and_restore_carry_a_connection_to_its_new_key() {
        let mut side = Side::default();
        side.polls_mut().insert(5, poll(false));
        let taken = side.take(5);
        assert!(side.polls().is_empty());
        side.restore(9, taken);
        assert_eq!(side.polls().get(&9).map(|h| h.deadline), Some(30));
    }
}
