//! Cluster-wide topic occupancy over Redis, for the `topic_occupied` / `topic_vacated`
//! webhooks: each topic has a set of the nodes (processes) that hold subscribers to it, changed
//! only by one script (`occupancy.lua`) that reports whether the cluster as a whole changed.
//! Redis runs scripts one at a time, so when the last subscribers on two nodes leave at once,
//! exactly one of them sees the set become empty and emits `topic_vacated`.
//!
//! A node keeps a liveness key (`clarion:hooks:alive:<node>`, expiring after
//! [`ALIVE_TTL`]) fresh; the script drops members whose key has expired, so a node that died
//! does not hold a topic occupied forever (the topic's next transition notices). Called only
//! on the webhook sender thread, never on a worker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clarion_proto::resp::Value;

use super::webhook::Occupancy;
use crate::broker::redis::conn::Conn;
use crate::broker::redis::sentinel::{Endpoint, SentinelAuth};
use crate::broker::redis::stream::RedisTls;
use crate::hub::lock;

const SCRIPT: &str = include_str!("occupancy.lua");
/// How long a node counts as alive after its last refresh: a few refresh periods, so a busy
/// sender thread or a short Redis hiccup does not make a live node look dead.
pub const ALIVE_TTL: Duration = Duration::from_secs(15);

/// The Redis side of occupancy.
pub struct RedisOccupancy {
    /// The broker's first Redis (behind Sentinel: its master, wherever it is now).
    endpoint: Endpoint,
    /// For a `rediss://` broker.
    tls: Option<Arc<RedisTls>>,
    node: String,
    timeout: Duration,
    conn: Mutex<Option<Conn>>,
}

impl RedisOccupancy {
    /// Occupancy over the Redis at `url` (the broker's first), for node `node`.
    pub fn new(
        url: &str,
        tls: Option<Arc<RedisTls>>,
        sentinel_auth: &SentinelAuth,
        node: String,
        timeout: Duration,
    ) -> Result<RedisOccupancy, String> {
        Ok(RedisOccupancy {
            endpoint: Endpoint::parse(url, sentinel_auth)?,
            tls,
            node,
            timeout,
            conn: Mutex::new(None),
        })
    }

    fn call(&self, commands: &[Vec<Vec<u8>>]) -> Option<Vec<Value>> {
        let mut conn = lock(&self.conn);
        for _ in 0..2 {
            if conn.is_none() {
                let opened = self
                    .endpoint
                    .open(self.tls.as_deref(), self.timeout, "hooks");
                *conn = match opened {
                    Ok((c, _)) => Some(c),
                    Err(e) => {
                        crate::log::warn(format_args!("webhook occupancy: redis: {e}"));
                        None
                    }
                };
            }
            let c = conn.as_mut()?;
            match c.call(commands) {
                Ok(v) => return Some(v),
                Err(e) => {
                    crate::log::warn(format_args!("webhook occupancy: redis: {e}"));
                    *conn = None;
                    self.endpoint.lost(self.endpoint.generation());
                }
            }
        }
        None
    }

    fn alive_key(&self) -> Vec<u8> {
        format!("clarion:hooks:alive:{}", self.node).into_bytes()
    }
}

impl Occupancy for RedisOccupancy {
    fn transition(&self, topic: &str, occupied: bool) -> bool {
        let refresh = vec![
            b"SET".to_vec(),
            self.alive_key(),
            b"1".to_vec(),
            b"EX".to_vec(),
            ALIVE_TTL.as_secs().to_string().into_bytes(),
        ];
        let eval = vec![
            b"EVAL".to_vec(),
            SCRIPT.as_bytes().to_vec(),
            b"1".to_vec(),
            format!("clarion:hooks:occupancy:{topic}").into_bytes(),
            self.node.as_bytes().to_vec(),
            if occupied {
                b"1".to_vec()
            } else {
                b"0".to_vec()
            },
            b"clarion:hooks:alive:".to_vec(),
        ];
        match self.call(&[refresh, eval]).as_deref() {
            Some([_, Value::Integer(1)]) => true,
            Some([_, Value::Integer(_)]) => false,
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
        let refresh = vec![
            b"SET".to_vec(),
            self.alive_key(),
            b"1".to_vec(),
            b"EX".to_vec(),
            ALIVE_TTL.as_secs().to_string().into_bytes(),
        ];
        let _ = self.call(&[refresh]);
    }
}
