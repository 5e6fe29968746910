//! What a load-generating worker ([`crate::worker`]) and its coordinator ([`crate::run`]) say
//! to each other, one JSON object per line: the [`Job`] first, a [`Progress`] line now and then
//! and a [`Report`] at the end from the worker, the [`Finish`] from the coordinator.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::check::Verdict;
use crate::stats::Buckets;

pub use crate::conn_life::Transport;

/// What one worker does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// The server's client listener.
    pub target: SocketAddr,
    /// Local address to connect from.
    pub source: IpAddr,
    /// Transport.
    pub transport: Transport,
    /// The topic of each connection.
    pub topics: Vec<String>,
    /// New connections per second for this worker (0: as fast as they complete).
    pub connect_rate: u32,
    /// Interval of a steady feed in microseconds, for clump detection (0: none).
    pub interval_us: u64,
    /// A text message each WebSocket sends once open (a peer's protocol greeting).
    #[serde(default)]
    pub hello: Option<String>,
    /// Connect over TLS, trusting this CA.
    #[serde(default)]
    pub tls: Option<TlsJob>,
    /// Sign each connection a token of its own identity with this HS256 secret.
    #[serde(default)]
    pub jwt_secret: Option<String>,
    /// Subscribe over HTTP/2 (SSE streams, or WebSockets by RFC 8441's extended CONNECT; h2 by
    /// ALPN over TLS, h2c prior knowledge without).
    #[serde(default)]
    pub http2: bool,
    /// With `http2`, streams per connection: consecutive entries of `topics` share one.
    #[serde(default = "one")]
    pub streams_per_conn: u32,
}

fn one() -> u32 {
    1
}

pub use crate::tls_client::TlsJob;

/// The coordinator's last word: messages published per topic, and how long to wait for them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finish {
    /// Messages published to each topic.
    pub published: HashMap<String, u64>,
    /// Milliseconds to wait for stragglers.
    pub deadline_ms: u64,
}

/// What a worker measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Subscribers whose request was answered (connections, or HTTP/2 streams).
    pub opened: u64,
    /// TCP connections opened (HTTP/2: past the server's SETTINGS), as `opened` over
    /// HTTP/1.1.
    #[serde(default)]
    pub tcp_connections: u64,
    /// Failed connection attempts and lost connections, by kind.
    pub errors: HashMap<String, u64>,
    /// Delivery verdicts summed over connections.
    pub verdict: Verdict,
    /// Publish-to-receive latency.
    pub latency: Buckets,
    /// Messages that arrived bunched behind another (steady feeds only).
    pub clumped: u64,
    /// Each connection's mean publish-to-receive latency (one sample per connection that
    /// received anything): how evenly a fan-out treats its subscribers.
    #[serde(default)]
    pub connection_means: Buckets,
    /// Seconds to open all connections.
    pub connect_seconds: f64,
    /// This process's CPU time (user + system), seconds.
    pub cpu_seconds: f64,
}

/// A progress line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    /// Connections open.
    pub opened: u64,
    /// Messages received and checked.
    pub received: u64,
    /// All connections attempted.
    pub ready: bool,
}
