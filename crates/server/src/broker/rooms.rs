//! Rooms shared across a cluster: the broker capability presence uses when the broker keeps
//! the cluster's rooms (`crate::presence` says what a room is). Only a broker with shared
//! state across nodes offers it (the Redis broker); with one process or NATS, rooms are per
//! process and [`super::Broker::shared_rooms`] answers `None`.
//!
//! The types here are what presence and the broker exchange; they name no broker.

use std::sync::Arc;
use std::time::Duration;

use super::{RedisBroker, Unavailable};

/// How often a node refreshes its liveness key and looks for dead nodes.
pub const KEEPALIVE: Duration = Duration::from_secs(2);

/// One change a node makes to a room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoomChange {
    /// `n` more connections of member `sub` (with `info`, JSON or empty).
    Add {
        topic: Arc<str>,
        sub: Arc<str>,
        n: u32,
        info: Option<Arc<str>>,
    },
    /// `n` fewer connections of member `sub`.
    Remove {
        topic: Arc<str>,
        sub: Arc<str>,
        n: u32,
    },
    /// This node has `delta` more connections in the room (members' and anonymous; negative:
    /// fewer), and whether one of its subscribers asked for events.
    Connections {
        topic: Arc<str>,
        delta: i32,
        listening: bool,
    },
}

/// One node's whole part of a room, for `sync`.
#[derive(Debug, Clone)]
pub struct RoomState {
    pub topic: Arc<str>,
    pub connections: u32,
    pub listening: bool,
    /// Member, connections on this node, info.
    pub members: Vec<(Arc<str>, u32, Option<Arc<str>>)>,
}

/// A page of a room's members, as Redis had it at `version`.
#[derive(Debug, Clone, Default)]
pub struct RoomPage {
    pub version: u64,
    pub count: u64,
    pub connections: u64,
    /// Member, info, connections on all nodes.
    pub members: Vec<(Arc<str>, Option<Arc<str>>, u32)>,
    pub more: bool,
}

/// The cluster's rooms, as a broker that shares them offers them (see the module doc).
pub struct SharedRooms<'a>(&'a RedisBroker);

impl<'a> SharedRooms<'a> {
    pub(super) fn redis(b: &'a RedisBroker) -> SharedRooms<'a> {
        SharedRooms(b)
    }

    /// This node's name, as other nodes know it.
    pub fn node_name(&self) -> &str {
        self.0.node_name()
    }

    /// Applies this node's changes, in order.
    pub fn apply(&self, changes: &[RoomChange]) -> Result<(), Unavailable> {
        self.0.presence_apply(changes)
    }

    /// Writes this node's whole part of every room (after the cluster lost it).
    pub fn sync(&self, rooms: &[RoomState]) -> Result<(), Unavailable> {
        self.0.presence_sync(rooms)
    }

    /// Refreshes this node's liveness; `true` when the cluster had lost this node's part.
    pub fn keepalive(&self) -> Result<bool, Unavailable> {
        self.0.presence_keepalive()
    }

    /// Takes dead nodes out of their rooms; how many were reaped.
    pub fn reap_dead(&self) -> Result<usize, Unavailable> {
        self.0.presence_reap_dead()
    }

    /// Takes node `node` out of every room at once.
    pub fn reap(&self, node: &str) -> Result<usize, Unavailable> {
        self.0.presence_reap(node)
    }

    /// A page of room `topic`'s members after `after`, at most `limit`; `listen` counts the
    /// caller as a subscriber that asked for events.
    pub fn list(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
        listen: bool,
    ) -> Result<RoomPage, Unavailable> {
        self.0.presence_list(topic, after, limit, listen)
    }

    /// Room `topic`'s members and connections across the cluster.
    pub fn count(&self, topic: &str) -> Result<(u64, u64), Unavailable> {
        self.0.presence_count(topic)
    }
}
