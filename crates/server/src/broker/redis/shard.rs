//! One Redis of the broker: where it is (a fixed address or the master behind Sentinel), the
//! pool publishers share, and the writing half of its subscriber connection; plus the thread
//! that follows Sentinel's announcements for it. Topics and their state are not here
//! ([`super`] owns them; [`super::link`] reads the subscriber connection).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clarion_proto::resp::Value;

use super::cluster::ClusterUrl;
use super::conn::LinkError;
use super::pool::Pool;
use super::sentinel::{Endpoint, SentinelAuth};
use super::stream::{RedisTls, Writer};
use crate::hub::lock;
use crate::metrics::Metrics;

/// One Redis of the broker: topics whose partition maps to it keep their keys and channel
/// there (`broker` may list several Redis servers: partition `N` lives on server `N mod k`).
pub(crate) struct Shard {
    pub(super) endpoint: Arc<Endpoint>,
    /// What logs call it.
    pub(super) label: String,
    pub(super) pool: Pool,
    /// Writes `SSUBSCRIBE`/`SUNSUBSCRIBE` on the subscriber connection while the reader reads.
    pub(super) writer: Mutex<Option<Writer>>,
    /// The master generation the subscriber connection was opened under: a watcher that
    /// learns of a newer one closes it, and the reader follows its topics on the new master.
    pub(super) session: AtomicU64,
}

/// A shard, and whether TLS to it failed (it then starts down, retrying).
/// Connections publishers and resuming subscribers share, per shard.
const POOL_SIZE: usize = 4;

pub(super) struct Opened {
    pub(super) shard: Shard,
    /// Its Redis could not be reached (or TLS with it failed) at startup: the node starts
    /// without it and keeps trying.
    pub(super) down_at_start: bool,
}

impl Shard {
    /// Connects to one URL of the `broker` setting and loads the publish script. A wrong
    /// address, password or master name stops startup with its reason; a TLS failure does not.
    pub(super) fn open(
        url: &str,
        script: &str,
        sentinel_auth: &SentinelAuth,
        tls: Option<Arc<RedisTls>>,
        node: &str,
        timeout: Duration,
        metrics: &Arc<Metrics>,
    ) -> Result<Opened, String> {
        let endpoint = Arc::new(Endpoint::parse(url, sentinel_auth)?);
        let label = endpoint.label();
        let pool = Pool::new(
            Arc::clone(&endpoint),
            tls,
            timeout,
            node,
            POOL_SIZE,
            Arc::clone(metrics),
        );
        let load = [vec![
            b"SCRIPT".to_vec(),
            b"LOAD".to_vec(),
            script.as_bytes().to_vec(),
        ]];
        let mut down_at_start = false;
        let loaded = match pool.call(&load) {
            // Unreachable, or TLS failing: the node starts without this Redis (publishes 503,
            // /healthz says so) and keeps trying, so nodes and Redis may start in any order;
            // the script is loaded again on first use (NOSCRIPT). A refusal (AUTH, SELECT) or a
            // wrong sentinel master name is a setting to fix: it stops the start.
            Err(e @ (LinkError::Tls(_) | LinkError::Io(_) | LinkError::Down)) => {
                crate::log::warn(format_args!(
                    "broker {label}: {e}; starting without it, retrying"
                ));
                down_at_start = true;
                Vec::new()
            }
            other => other.map_err(|e| format!("broker {label}: {e}"))?,
        };
        if let Some(Value::Error(e)) = loaded.first() {
            return Err(format!(
                "broker {label}: cannot load the publish script: {e}"
            ));
        }
        if !down_at_start {
            // A cluster node answers only for its own slots: it needs redis+cluster://.
            let info = pool
                .call(&[vec![b"INFO".to_vec(), b"cluster".to_vec()]])
                .map_err(|e| format!("broker {label}: {e}"))?;
            if info
                .first()
                .and_then(Value::as_str)
                .is_some_and(super::cluster::cluster_enabled)
            {
                return Err(format!(
                    "broker {label}: this Redis is a Redis Cluster node; \
                     use redis+cluster://{}[,more nodes] (or rediss+cluster://)",
                    endpoint.master_addr().unwrap_or_default()
                ));
            }
        }
        Ok(Opened {
            shard: Shard {
                endpoint,
                label,
                pool,
                writer: Mutex::new(None),
                session: AtomicU64::new(0),
            },
            down_at_start,
        })
    }
}

/// The Redis Cluster URL of the `broker` setting, if it names one: then it must be the only
/// URL (the cluster spreads the partitions over its masters itself).
pub(super) fn cluster_url(urls: &[String]) -> Result<Option<ClusterUrl>, String> {
    let mut found = None;
    for u in urls {
        if let Some(parsed) = ClusterUrl::parse(u) {
            if urls.len() > 1 {
                return Err(format!(
                    "broker {u:?}: a Redis Cluster URL must be the only broker URL \
                     (list more seed nodes inside it: redis+cluster://h1:7000,h2:7001)"
                ));
            }
            found = Some(parsed?);
        }
    }
    Ok(found)
}

impl Shard {
    /// A place of a Redis Cluster's shard table, free until the topology gives it a master.
    pub(super) fn place(
        tls: Option<Arc<RedisTls>>,
        node: &str,
        timeout: Duration,
        metrics: &Arc<Metrics>,
    ) -> Shard {
        let endpoint = Arc::new(Endpoint::cluster_place());
        Shard {
            label: "cluster".to_owned(),
            pool: Pool::new(
                Arc::clone(&endpoint),
                tls,
                timeout,
                node,
                POOL_SIZE,
                Arc::clone(metrics),
            ),
            endpoint,
            writer: Mutex::new(None),
            session: AtomicU64::new(0),
        }
    }

    /// Behind Sentinel, follows `+switch-master` until `stop` (the body of a thread): on a
    /// new master the subscriber connection is closed (the reader opens one to the new master
    /// and subscribes again), and the pool drops its connections on their next use.
    pub(super) fn watch(
        &self,
        tls: Option<&RedisTls>,
        timeout: Duration,
        name: &str,
        stop: &AtomicBool,
    ) {
        let moved = || {
            if self.session.load(Relaxed) != self.endpoint.generation() {
                if let Some(w) = lock(&self.writer).as_ref() {
                    w.shutdown();
                }
            }
        };
        self.endpoint.watch(tls, timeout, name, stop, &moved);
    }
}
