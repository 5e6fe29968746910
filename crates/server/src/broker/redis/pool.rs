//! The few connections publishers and resuming subscribers share, to one shard's Redis
//! (wherever Sentinel says its master is now: see [`super::sentinel`]). A connection that
//! failed, or reached a server that refuses writes as a replica, is dropped and the endpoint is
//! told; a connection opened to an older master is dropped on its next use.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clarion_proto::resp::Value;

use super::conn::{Conn, LinkError};
use super::sentinel::{not_master, Endpoint};
use super::stream::RedisTls;
use crate::hub::lock;
use crate::metrics::Metrics;

/// A few connections publishers and resuming subscribers share; each call takes one for its
/// whole pipeline, so replies never interleave.
pub struct Pool {
    endpoint: Arc<Endpoint>,
    tls: Option<Arc<RedisTls>>,
    timeout: Duration,
    name: String,
    /// Connections, each with the generation of the master it was opened to and the
    /// [`Pool::renewals`] it was opened under.
    slots: Vec<Mutex<Option<(Conn, u64, u64)>>>,
    /// Bumped each time the shard's subscriber connection comes back after losing Redis: a
    /// connection opened before is most likely dead (Redis restarted, or the network cut it),
    /// and a publish should not be the one to find out and answer `503`.
    renewals: AtomicU64,
    /// When the last connection attempt failed (and the master's generation then): no new
    /// attempt before the backoff has passed, unless Sentinel has named a new master since.
    failed_at: Mutex<Option<(Instant, u64)>>,
    metrics: Arc<Metrics>,
}

/// How long after a failed connect callers are answered "down" without a new attempt.
const CONNECT_BACKOFF: Duration = Duration::from_millis(500);

impl Pool {
    /// A pool of `size` lazily opened connections.
    pub fn new(
        endpoint: Arc<Endpoint>,
        tls: Option<Arc<RedisTls>>,
        timeout: Duration,
        name: &str,
        size: usize,
        metrics: Arc<Metrics>,
    ) -> Pool {
        Pool {
            endpoint,
            tls,
            timeout,
            name: name.to_owned(),
            slots: (0..size.max(1)).map(|_| Mutex::new(None)).collect(),
            failed_at: Mutex::new(None),
            renewals: AtomicU64::new(0),
            metrics,
        }
    }

    /// Redis answers again (the subscriber connection reconnected): connections opened before
    /// are opened anew on their next use, and the backoff after a failed connect is over, so
    /// that once `/healthz` says the broker is back a publish is served.
    pub fn renew(&self) {
        self.renewals.fetch_add(1, Relaxed);
        *lock(&self.failed_at) = None;
    }

    /// Runs `commands` as one pipeline on a free connection (or waits for one), returning one
    /// reply per command. On any failure the connection is dropped.
    pub fn call<A: AsRef<[u8]>>(&self, commands: &[Vec<A>]) -> Result<Vec<Value>, LinkError> {
        self.metrics.broker_in_flight.fetch_add(1, Relaxed);
        let out = self.call_inner(commands);
        self.metrics.broker_in_flight.fetch_sub(1, Relaxed);
        out
    }

    fn call_inner<A: AsRef<[u8]>>(&self, commands: &[Vec<A>]) -> Result<Vec<Value>, LinkError> {
        // A free connection if there is one, else wait for one (chosen by a rotating index).
        let free = self.slots.iter().find_map(|s| s.try_lock().ok());
        let mut guard = match free {
            Some(g) => g,
            None => {
                let i = self.metrics.broker_in_flight.load(Relaxed) as usize % self.slots.len();
                match self.slots.get(i) {
                    Some(slot) => lock(slot),
                    None => return Err(LinkError::Down),
                }
            }
        };
        let current = self.endpoint.generation();
        let renewals = self.renewals.load(Relaxed);
        if guard
            .as_ref()
            .is_some_and(|(_, g, r)| *g != current || *r != renewals)
        {
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(self.connect()?);
        }
        let Some((conn, generation, _)) = guard.as_mut() else {
            return Err(LinkError::Down);
        };
        let generation = *generation;
        match conn.call(commands) {
            Ok(replies) => {
                // A master turned replica (or one still loading) refuses writes: ask where
                // the master is now.
                if replies.iter().any(not_master) {
                    *guard = None;
                    self.endpoint.lost(generation);
                }
                Ok(replies)
            }
            Err(e) => {
                *guard = None;
                self.endpoint.lost(generation);
                self.metrics.broker_errors.fetch_add(1, Relaxed);
                Err(e)
            }
        }
    }

    fn connect(&self) -> Result<(Conn, u64, u64), LinkError> {
        let generation = self.endpoint.generation();
        let renewals = self.renewals.load(Relaxed);
        if lock(&self.failed_at)
            .is_some_and(|(t, g)| t.elapsed() < CONNECT_BACKOFF && g == generation)
        {
            return Err(LinkError::Down);
        }
        match self
            .endpoint
            .open(self.tls.as_deref(), self.timeout, &self.name)
        {
            Ok((conn, generation)) => {
                *lock(&self.failed_at) = None;
                Ok((conn, generation, renewals))
            }
            Err(e) => {
                *lock(&self.failed_at) = Some((Instant::now(), generation));
                self.metrics.broker_errors.fetch_add(1, Relaxed);
                Err(e)
            }
        }
    }
}
