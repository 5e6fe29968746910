//! Cluster-wide topic occupancy over Redis, for the `topic_occupied` / `topic_vacated`
//! webhooks: each topic has a set of the nodes (processes) that hold subscribers to it, changed
//! only by one script (`occupancy.lua`) that reports whether the cluster as a whole changed.
//! Redis runs scripts one at a time, so when the last subscribers on two nodes leave at once,
//! exactly one of them sees the set become empty and emits `topic_vacated`.
//!
//! The set lives in the topic's partition (`clarion:{pN}:hooks:occupancy:<topic>`), and a
//! node keeps a liveness key per partition (`clarion:{pN}:hooks:alive:<node>`, expiring after
//! [`ALIVE_TTL`]) fresh, so the script only touches keys of one slot (a Redis Cluster refuses
//! anything else); it drops members whose key has expired, so a node that died does not hold
//! a topic occupied forever (the topic's next transition notices). The commands go through
//! the broker's routing (its pools; a Redis Cluster's redirections are followed). Called only
//! on the webhook sender thread, never on a worker.

use clarion_proto::resp::Value;

use super::topology::Router;
use super::{partition, PARTITIONS};
use crate::broker::occupancy::{Occupancy, ALIVE_TTL};

const SCRIPT: &str = include_str!("occupancy.lua");

/// The Redis side of occupancy.
pub struct RedisOccupancy {
    /// The broker's routing to its Redis.
    router: Router,
    node: String,
}

impl RedisOccupancy {
    /// Occupancy over the broker's Redis, for node `node`.
    pub fn new(router: Router, node: String) -> RedisOccupancy {
        RedisOccupancy { router, node }
    }

    fn alive_prefix(p: u32) -> String {
        format!("clarion:{{p{p}}}:hooks:alive:")
    }

    fn refresh(&self, p: u32) -> Vec<Vec<u8>> {
        vec![
            b"SET".to_vec(),
            format!("{}{}", Self::alive_prefix(p), self.node).into_bytes(),
            b"1".to_vec(),
            b"EX".to_vec(),
            ALIVE_TTL.as_secs().to_string().into_bytes(),
        ]
    }
}

impl Occupancy for RedisOccupancy {
    fn transition(&self, topic: &str, occupied: bool) -> bool {
        let p = partition(topic);
        let eval = vec![
            b"EVAL".to_vec(),
            SCRIPT.as_bytes().to_vec(),
            b"1".to_vec(),
            format!("clarion:{{p{p}}}:hooks:occupancy:{topic}").into_bytes(),
            self.node.as_bytes().to_vec(),
            if occupied {
                b"1".to_vec()
            } else {
                b"0".to_vec()
            },
            Self::alive_prefix(p).into_bytes(),
        ];
        match self
            .router
            .call(SCRIPT, &[(p, self.refresh(p)), (p, eval)])
            .as_deref()
        {
            Ok([_, Value::Integer(1)]) => true,
            Ok([_, Value::Integer(_)]) => false,
            other => {
                // Redis unreachable: the process's own transition is reported, so the
                // application hears of it (possibly twice across nodes) rather than never.
                crate::log::warn(format_args!(
                    "webhook occupancy: no cluster answer for {topic:?} ({other:?}); reporting this node's transition"
                ));
                true
            }
        }
    }

    fn keep_alive(&self) {
        let calls: Vec<(u32, Vec<Vec<u8>>)> =
            (0..PARTITIONS).map(|p| (p, self.refresh(p))).collect();
        if let Err(e) = self.router.call(SCRIPT, &calls) {
            crate::log::warn(format_args!("webhook occupancy: redis: {}", e.0));
        }
    }
}
