//! Clarion: a lean realtime push server.
//!
//! # Layout
//! - [`config`]: every setting declared once (field, default, TOML key, flag, `CLARION_*`
//!   variable, docs row) and the internal limits, each with its reason; [`cli`] builds the
//!   command line from those declarations.
//! - [`server`]: startup, readiness line, graceful shutdown.
//! - [`worker`]: the event loops (one per thread): a shell (poller, listeners, clock) around an
//!   engine (connection records, read/write paths, deliveries, timers, shutdown), with the
//!   transports it runs (HTTP routing and upgrade, WebSocket, SSE and NDJSON streams, long-poll)
//!   and GRIP's per-connection runtime. The only layer that does I/O for clients.
//! - [`broker`]: the seam between publishing and delivery (ids, history, fan-out to workers),
//!   with its contract; [`broker::local`] is the in-memory, single-process implementation.
//!   Publishing encodes a message once and hands it to each interested worker once.
//! - [`cluster`]: what several processes share: [`cluster::nats_link`] is a NATS client
//!   connection on its own thread.
//! - [`hub`]: the in-memory state the local broker keeps: topics with subscriber counts per
//!   worker, their history (what a resuming client missed), and the workers' inboxes.
//! - [`durable`]: durable history (`history_dir`): the in-memory broker's history also kept in
//!   segment files, recovered at start (the record format is `clarion_proto::history_log`).
//! - [`message`]: a published message and its shared encodings (WebSocket, envelope, SSE,
//!   stream lines), each built once; [`delta`]: which topics have deltas and each publication's
//!   delta against its topic's previous one (computed once per node, `docs/delta.md`).
//! - [`grip`]: GRIP proxy mode (Pushpin's protocol): routes, backend requests, publish content;
//!   the per-connection part is in
//!   the worker (`worker::grip`).
//! - [`pusher`]: Pusher Channels applications (the protocol is `clarion_proto::pusher`; the
//!   HTTP API's answers are in `api`).
//! - [`auth`]: JWT authentication: keys, policy, token sources, per-worker grants (verification
//!   is sans-IO in `clarion_proto::auth`); used by the worker and the API.
//! - [`api`]: the publish/health/metrics listener, answering with [`reply::Answer`];
//!   [`publish`]: the `clarion publish` client; [`token`]: `clarion token`, a signed token for
//!   trying authentication.
//! - [`dashboard`]: the live dashboard page on the API listener, its SSE feed (sampled once a
//!   second by one thread) and topic lookups.
//! - [`tls`]: certificates, SNI, reloading, `clarion cert --dev`; per-connection TLS records are
//!   in `worker::tls`.
//! - [`handover`]: upgrades that keep connections (`--upgrade-from PID`, SIGUSR1): the Unix
//!   socket, `SCM_RIGHTS`, and the sequence of a hand-over between two processes (the format is
//!   `clarion_proto::handover`; a worker's part is `worker::handover`, what authentication,
//!   hooks and presence keep per connection moves through `worker::handover_state`).
//! - [`group`]: `clarion serve --processes N`: the supervisor of a group of processes sharing
//!   the ports, the group's merged `/metrics` and `/healthz`, and the port guard that keeps
//!   any other process off a port one holds.
//! - [`service_manager`]: systemd `Type=notify` (`READY=1`, `RELOADING=1`, `STOPPING=1`,
//!   `MAINPID=` across an upgrade) over `$NOTIFY_SOCKET`.
//! - [`metrics`]: counters and the Prometheus text; [`log`]: stderr logging; [`spelling`]: the
//!   valid name a misspelt variable or value was meant to be; [`user`]: the user this process
//!   runs as.
//!
//! Protocol parsing and encoding (HTTP/1.1 heads, RFC 6455, the pub/sub control messages,
//! batches, envelopes and topic rules) live in the sans-IO `clarion_proto` crate; nothing here
//! interprets bytes on its own.

// No indexing that could panic on peer input outside tests; see also `unwrap_used`.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

pub mod api;
pub mod auth;
pub mod broker;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod dashboard;
pub mod delta;
pub mod durable;
pub mod grip;
pub mod group;
pub mod handover;
pub mod hooks;
pub mod hub;
pub mod log;
pub mod message;
pub mod metrics;
pub mod presence;
pub mod publish;
pub mod pusher;
pub mod redact;
pub mod reply;
pub mod server;
pub mod service_manager;
pub mod spelling;
pub mod tls;
pub mod token;
pub mod user;
pub mod worker;
