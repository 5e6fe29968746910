//! `clarion bench`: a load generator that proves Clarion's numbers.
//!
//! Layout, bottom to top (a file names only files above it in this list; the workspace's
//! file-cycle test keeps it so):
//! - what is measured and how it is checked: [`stats`] (latency histograms, clumps, the clock),
//!   [`check`] (every delivery: missing, duplicated, reordered), [`proc_stat`] (a process's
//!   CPU and memory, the kernel's socket memory, from /proc);
//! - what a load connection reads and writes: [`wire`] (answer-head limits, the server-frame
//!   reader over the tested parser, random keys), [`peer_formats`] (peers' envelopes),
//!   [`source_ports`] (loopback source addresses and ports), [`tls_client`];
//! - [`conn_life`]: one load connection's life without I/O (request, answer, frames, events or
//!   polls, sequence checks, pongs), the one both workers drive;
//! - [`publisher`] (the server's publish API), [`plan`] (the options: what to run) and
//!   [`scenario`] (the presets' shapes), [`outcome`] and [`million_outcome`] (what a run
//!   measured);
//! - the load processes: [`worker`] and [`million_worker`], each many connections on one poll:
//!   sockets, TLS, timers and the measurements they sum, around a [`conn_life::Life`] each;
//! - the soak ([`crate::soak`]): [`soak_check`] (one client's deliveries across its reconnects),
//!   [`soak_life`] (one soak connection without I/O: resume by id, envelopes, SSE events, gap
//!   notices; with [`soak_deflate`], the browser-like permessage-deflate WebSocket),
//!   [`soak_h2`] (an HTTP/2 soak connection with several SSE streams, without I/O),
//!   [`soak_conn`] (a connection's socket and TLS), [`soak_mix`] (which kind each client is,
//!   and the per-kind sums), [`soak_worker`] (clients that live, die and come back) and
//!   [`soak`] (the coordinator: publishing, the verdict with unconfirmed publishes set aside);
//! - the streams scenario (issue 52): [`streams_check`] (the fragments, and one subscriber's
//!   events checked by the fold rule, across its resume), [`streams_subs`] (the subscribers of a
//!   phase on one poll) and [`streams`] (the coordinator: paced publishers, the phases, the
//!   verdict and the report);
//! - [`report`], [`million_report`] and [`trust`] (text, JSON and HTML, and which figures had
//!   too little signal to believe);
//! - the coordinators: [`run`] and [`million`] start the workers, publish and merge what they
//!   measured.

pub mod check;
pub mod conn_life;
pub mod h2_life;
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
pub mod soak;
pub mod soak_check;
pub mod soak_conn;
pub mod soak_deflate;
pub mod soak_h2;
pub mod soak_life;
pub mod soak_mix;
pub mod soak_worker;
pub mod source_ports;
pub mod stats;
pub mod streams;
pub mod streams_check;
pub mod streams_subs;
pub mod tls_client;
pub mod trust;
pub mod wire;
pub mod worker;
mod worker_conn;
mod worker_msg;
mod worker_proc;

pub use plan::BenchArgs;
