//! What the million scenario measured: the samples, the CPU split between server, clients and
//! broker, the delivery and pong verdicts. [`crate::million`] fills it in and
//! [`crate::million_report`] shows it.

use std::collections::HashMap;

use serde::Serialize;

use crate::check::Verdict;
use crate::stats::Summary;

/// One sample, every second.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// Connections open.
    pub opened: u64,
    /// Messages received and checked so far.
    pub received: u64,
    /// Pongs received so far.
    pub pongs: u64,
    /// Server CPU seconds so far (all its processes).
    pub server_cpu: f64,
    /// Server RSS summed over its processes, bytes.
    pub server_rss: u64,
    /// Bench workers' RSS summed, bytes.
    pub client_rss: u64,
    /// Kernel socket memory (slab + TCP pages), bytes.
    pub kernel: u64,
    /// Broker CPU seconds so far.
    pub broker_cpu: f64,
    /// Broker RSS, bytes.
    pub broker_rss: u64,
    /// CPU seconds the whole machine spent busy so far (every process, other users included).
    pub machine_cpu: f64,
    /// The bench workers' CPU seconds so far.
    pub client_cpu: f64,
}

/// CPU seconds of each party over one phase.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuSplit {
    /// Wall seconds of the phase.
    pub seconds: f64,
    /// Server processes.
    pub server: f64,
    /// Bench workers.
    pub clients: f64,
    /// Broker.
    pub broker: f64,
    /// The whole machine (so the rest is other processes).
    pub machine: f64,
}

/// The result of a million run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Connections asked for.
    pub connections: u64,
    /// Connections open once all were attempted.
    pub opened: u64,
    /// Whether the connections were WebSockets over TLS (`--tls-ca`).
    pub tls: bool,
    /// Worker processes.
    pub workers: u64,
    /// Seconds to open them, and the rate.
    pub connect_seconds: f64,
    /// Connections per second while opening.
    pub connect_rate: f64,
    /// The connect rate asked for (0: unbounded).
    pub connect_rate_limit: u32,
    /// Failed attempts and lost connections by kind.
    pub errors: HashMap<String, u64>,
    /// Connections the server closed during the run (must be 0).
    pub closed_by_server: u64,
    /// Rounds (intervals) held, and the interval.
    pub rounds: u64,
    /// Interval between broadcasts and between each connection's pings, ms.
    pub interval_ms: u64,
    /// Chat rooms.
    pub rooms: u64,
    /// Deliveries of the topic all follow: expected and verdict.
    pub broadcast_expected: u64,
    /// Verdict of the broadcasts.
    pub broadcast: Verdict,
    /// Deliveries to the rooms: expected and verdict.
    pub chat_expected: u64,
    /// Verdict of the rooms.
    pub chat: Verdict,
    /// Latency of the broadcasts to every connection, µs.
    pub broadcast_latency: Summary,
    /// Latency of room messages, µs.
    pub chat_latency: Summary,
    /// Ping round trips, µs.
    pub ping_rtt: Summary,
    /// Pings sent, pongs received, pings unanswered at the end, pings sent while the previous
    /// was unanswered.
    pub pings: u64,
    /// Pongs received.
    pub pongs: u64,
    /// Pings unanswered at the end.
    pub pongs_missing: u64,
    /// Pings sent while the connection's previous one was unanswered.
    pub pongs_late: u64,
    /// Server RSS before any connection and with all open, bytes (all processes summed).
    pub server_rss_before: Option<u64>,
    /// Server RSS with all open.
    pub server_rss_open: Option<u64>,
    /// Server RSS at the end of the rounds.
    pub server_rss_end: Option<u64>,
    /// Server user-space bytes per connection, all processes summed.
    pub server_bytes_per_connection: Option<f64>,
    /// The same after the rounds (messages, history and buffers included).
    pub server_bytes_per_connection_end: Option<f64>,
    /// Bench workers' RSS growth per connection.
    pub client_bytes_per_connection: Option<f64>,
    /// Bench workers' whole RSS (their fixed cost included) per connection.
    pub client_total_bytes_per_connection: Option<f64>,
    /// Kernel socket memory growth per connection (both ends of the loopback pair).
    pub kernel_bytes_per_connection: Option<f64>,
    /// Server CPU in the quiet window, percent of one core.
    pub server_idle_cpu_percent: Option<f64>,
    /// Server CPU seconds per million deliveries over the rounds (pongs not counted as
    /// deliveries, though the server did answer them).
    pub server_cpu_per_million: Option<f64>,
    /// Messages the server handled per second during the rounds: deliveries + pings in +
    /// pongs out.
    pub messages_per_second: f64,
    /// Broker RSS at the end, bytes.
    pub broker_rss: Option<u64>,
    /// Publish batches sent again after the server refused them.
    pub publish_retries: u64,
    /// CPU split during the connect phase.
    pub cpu_connect: CpuSplit,
    /// CPU split during the quiet window.
    pub cpu_quiet: CpuSplit,
    /// CPU split during the rounds.
    pub cpu_rounds: CpuSplit,
    /// Samples over time.
    pub samples: Vec<Sample>,
}

impl Outcome {
    /// Whether the run is clean: every connection open, every delivery and pong once and in
    /// order, nothing closed by the server.
    pub fn clean(&self) -> bool {
        self.opened == self.connections
            && self.broadcast.perfect()
            && self.chat.perfect()
            && self.broadcast.in_order == self.broadcast_expected
            && self.chat.in_order == self.chat_expected
            && self.closed_by_server == 0
            && self.pongs_missing == 0
            && self.errors.is_empty()
    }
}
