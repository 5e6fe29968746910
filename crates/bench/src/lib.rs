//! `clarion bench`: a load generator that proves Clarion's numbers.
//!
//! The coordinator ([`run`]) spreads connections over worker processes ([`worker`]), each bound
//! to its own loopback source address so no process nears the open-files limit and no address
//! runs out of ephemeral ports; publishes through the server's API ([`publisher`]); and merges
//! what the workers measured: every delivery checked ([`check`]), latency histograms and clumps
//! ([`stats`]), and the server's CPU, memory and kernel socket memory from /proc
//! ([`proc_stat`]). [`report`] prints the summary and writes the HTML report; [`trust`] says
//! which figures had too little signal to believe. Both workers speak TLS through
//! [`tls_client`].

pub mod check;
pub mod million;
pub mod million_outcome;
pub mod million_report;
pub mod million_worker;
pub mod outcome;
pub mod peer_formats;
pub mod plan;
pub mod proc_stat;
pub mod publisher;
pub mod report;
pub mod run;
pub mod scenario;
pub mod source_ports;
pub mod stats;
pub mod tls_client;
pub mod trust;
pub mod wire;
pub mod worker;

pub use plan::BenchArgs;
