//! What a run measured: the server's samples, the delivery verdict, latency and memory per
//! connection, the steps and the churn cycles. The reports ([`crate::report`], [`crate::trust`])
//! read it; the coordinator ([`crate::run`]) fills it in.

use std::collections::HashMap;

use serde::Serialize;

use crate::check::Verdict;
use crate::stats::Summary;

/// One sample of the server process.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// Server CPU seconds so far.
    pub cpu: f64,
    /// Server RSS, bytes.
    pub rss: u64,
    /// Kernel TCP memory (whole machine), bytes.
    pub tcp_kernel: u64,
    /// Connections open (workers' last progress).
    pub opened: u64,
    /// Messages received so far.
    pub received: u64,
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Connections asked for and opened.
    pub connections: usize,
    /// Opened.
    pub opened: u64,
    /// Connections per second while opening.
    pub connect_rate: f64,
    /// Errors by kind.
    pub errors: HashMap<String, u64>,
    /// Deliveries expected (messages × subscribers).
    pub expected: u64,
    /// Delivery verdicts.
    pub verdict: Verdict,
    /// Latency, microseconds.
    pub latency: Summary,
    /// Messages bunched behind another (ticker feeds).
    pub clumped: u64,
    /// Each connection's mean latency, microseconds, as percentiles over connections: a wide
    /// spread means the fan-out favours some subscribers over others every time.
    pub connection_means: Summary,
    /// Deliveries per second during publishing.
    pub deliveries_per_second: f64,
    /// Server CPU seconds per million deliveries.
    pub server_cpu_per_million: Option<f64>,
    /// Server user-space bytes per connection (RSS growth / opened).
    pub server_bytes_per_connection: Option<f64>,
    /// Kernel TCP bytes per connection (growth / opened; both ends of loopback count).
    pub kernel_bytes_per_connection: Option<f64>,
    /// The workers' own CPU seconds.
    pub bench_cpu_seconds: f64,
    /// The load client's CPU seconds while publishing and draining (the window of
    /// `server_cpu_per_million`).
    pub bench_publish_cpu_seconds: Option<f64>,
    /// Times the load client's worker processes were woken while publishing and draining
    /// (their voluntary context switches): over loopback the server's sends run the client's
    /// receive path and pay for each of these wake-ups, so runs that differ in them differ
    /// in server CPU for reasons outside the server (docs/benchmarks.md, "The publishing
    /// window, and the clients' wake-ups").
    pub bench_wakeups: Option<u64>,
    /// Server CPU seconds over the run.
    pub server_cpu_seconds: Option<f64>,
    /// Samples over time.
    pub samples: Vec<Sample>,
    /// Memory per connection at each step of `--steps`.
    pub steps: Vec<Step>,
    /// What connect/disconnect cycles left behind (churn scenario).
    pub churn: Option<Churn>,
    /// Figures measured with too little signal to believe, and why ([`crate::trust`]).
    pub warnings: Vec<String>,
    /// How HTTP/2 carried the subscribers (`--http2`); absent over HTTP/1.1, whose output
    /// keeps its shape. Flattened: `protocol`, `stream`, `streams_per_connection`,
    /// `tcp_connections`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub http2: Option<Http2>,
}

/// How an HTTP/2 run carried its subscribers.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Http2 {
    /// `h2` (TLS, chosen by ALPN) or `h2c` (clear text, prior knowledge).
    pub protocol: &'static str,
    /// What each stream carries: `SSE stream` or `WebSocket` (RFC 8441).
    pub stream: &'static str,
    /// Streams per connection (`--streams-per-conn`); `connections` and `opened` count
    /// streams.
    pub streams_per_connection: u32,
    /// TCP connections that got past the server's SETTINGS.
    pub tcp_connections: u64,
}

/// The server's memory once a step's connections are all open.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Step {
    /// Connections open at this step.
    pub opened: u64,
    /// Server RSS, bytes.
    pub rss: Option<u64>,
    /// Server user-space bytes per connection: (RSS now - RSS before any) / open.
    pub server_bytes_per_connection: Option<f64>,
    /// The growth since the previous step divided by the connections it added.
    pub marginal_bytes_per_connection: Option<f64>,
    /// Kernel TCP bytes per connection (both loopback ends).
    pub kernel_bytes_per_connection: Option<f64>,
}

/// The server before and after connect/disconnect cycles.
#[derive(Debug, Clone, Serialize)]
pub struct Churn {
    /// Cycles run.
    pub rounds: u32,
    /// Connections opened in each cycle.
    pub opened: Vec<u64>,
    /// Connections per second in each cycle.
    pub connect_rates: Vec<f64>,
    /// Server RSS before the first cycle and after the last (settled), bytes.
    pub rss_baseline: Option<u64>,
    /// RSS after the last cycle.
    pub rss_after: Option<u64>,
    /// Highest RSS seen while connections were open.
    pub rss_peak: Option<u64>,
    /// Open files of the server before the first cycle.
    pub fds_baseline: Option<u64>,
    /// Open files after the last cycle (once they stop falling, at most 10 s).
    pub fds_after: Option<u64>,
    /// Whether the open files came back to the baseline.
    pub fds_returned: bool,
}

/// How many bytes `after` is over `before`, per connection; `None` when unmeasured.
pub fn per_connection(before: Option<u64>, after: Option<u64>, connections: u64) -> Option<f64> {
    match (before, after) {
        (Some(x), Some(y)) if connections > 0 => Some((y as f64 - x as f64) / connections as f64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_connection_need_both_readings_and_connections() {
        assert_eq!(per_connection(Some(1000), Some(3000), 10), Some(200.0));
        assert_eq!(per_connection(Some(3000), Some(1000), 10), Some(-200.0));
        assert_eq!(per_connection(None, Some(1000), 10), None);
        assert_eq!(per_connection(Some(1), Some(2), 0), None);
    }
}
