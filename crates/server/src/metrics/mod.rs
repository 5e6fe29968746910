//! Process-wide counters and gauges, rendered in the Prometheus text format by the API.
//!
//! Counters are relaxed atomics: they are statistics, never used to synchronise anything. Hot
//! paths (a broadcast to thousands of subscribers) add their totals once per batch, not once per
//! delivery.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

mod cluster;
mod delta;
pub mod filters;
mod hooks;
pub mod pusher;

pub use hooks::{HookCounters, HOOKS, HOOK_OUTCOMES};

/// Why a client connection ended, for the `clarion_closes_total{reason=...}` counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client sent a Close frame (normal WebSocket close).
    ClientClose,
    /// The peer closed or reset TCP without a close handshake.
    Disconnected,
    /// The client broke RFC 6455 (close 1002/1003/1007).
    ProtocolError,
    /// A message over the size limit (close 1009).
    TooBig,
    /// The client stopped reading and its backlog passed the cap (close 1008).
    SlowConsumer,
    /// No data within the idle timeout.
    IdleTimeout,
    /// The request head did not arrive within the handshake timeout.
    HandshakeTimeout,
    /// An HTTP request that was answered with an error status and closed.
    HttpError,
    /// An ordinary HTTP exchange that ended (Connection: close, or EOF between requests).
    HttpDone,
    /// The server is shutting down (close 1001).
    Shutdown,
    /// A GRIP backend ended it (stream close, WebSocket CLOSE or DISCONNECT, backend error).
    Backend,
    /// Its token expired (or it never authenticated in time) (close 4001/4002, or the
    /// `expired` event of a stream).
    TokenExpired,
}

impl CloseReason {
    const ALL: [CloseReason; 12] = [
        CloseReason::ClientClose,
        CloseReason::Disconnected,
        CloseReason::ProtocolError,
        CloseReason::TooBig,
        CloseReason::SlowConsumer,
        CloseReason::IdleTimeout,
        CloseReason::HandshakeTimeout,
        CloseReason::HttpError,
        CloseReason::HttpDone,
        CloseReason::Shutdown,
        CloseReason::Backend,
        CloseReason::TokenExpired,
    ];

    /// The `reason` label (also the webhook's `disconnected` reason).
    pub fn label(self) -> &'static str {
        match self {
            CloseReason::ClientClose => "client_close",
            CloseReason::Disconnected => "disconnected",
            CloseReason::ProtocolError => "protocol_error",
            CloseReason::TooBig => "too_big",
            CloseReason::SlowConsumer => "slow_consumer",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::HandshakeTimeout => "handshake_timeout",
            CloseReason::TokenExpired => "token_expired",
            CloseReason::HttpError => "http_error",
            CloseReason::HttpDone => "http_done",
            CloseReason::Shutdown => "shutdown",
            CloseReason::Backend => "backend",
        }
    }
}

/// Why history dropped a message, for `clarion_history_evictions_total{reason=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// The topic had more than `history_size` messages.
    Count,
    /// The message was older than `history_ttl`.
    Age,
    /// History across topics exceeded `history_memory`.
    Memory,
}

/// Why a write to `history_dir` failed, for `clarion_history_write_errors_total{reason=...}`:
/// each refuses the publish it carried (`503` with the reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryWrite {
    /// The file system is full (`ENOSPC`) or the user's quota is (`EDQUOT`).
    DiskFull = 0,
    /// The process's file size limit (`RLIMIT_FSIZE`, `EFBIG`) was reached.
    FileTooLarge = 1,
    /// Any other I/O error.
    Other = 2,
}

impl HistoryWrite {
    /// Every reason, in the order of their counters.
    pub const ALL: [HistoryWrite; 3] = [
        HistoryWrite::DiskFull,
        HistoryWrite::FileTooLarge,
        HistoryWrite::Other,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            HistoryWrite::DiskFull => "disk_full",
            HistoryWrite::FileTooLarge => "file_too_large",
            HistoryWrite::Other => "other",
        }
    }
}

/// All of the server's counters. One instance, shared by every thread.
#[derive(Default)]
pub struct Metrics {
    /// Open client TCP connections that have not upgraded (yet).
    pub http_connections: AtomicU64,
    /// Open WebSocket connections.
    pub ws_connections: AtomicU64,
    /// Open Server-Sent Events streams.
    pub sse_connections: AtomicU64,
    /// Open newline-delimited HTTP streams.
    pub stream_connections: AtomicU64,
    /// Long-poll requests being held.
    pub polls_held: AtomicU64,
    /// Messages held in topic histories.
    pub history_messages: AtomicU64,
    /// Bytes held in topic histories (as the `history_memory` cap counts them).
    pub history_bytes: AtomicU64,
    /// Messages dropped from history because a topic had `history_size` newer ones.
    pub evicted_count: AtomicU64,
    /// Messages dropped from history because they were older than `history_ttl`.
    pub evicted_age: AtomicU64,
    /// Messages dropped from history to stay under `history_memory`.
    pub evicted_memory: AtomicU64,
    /// Publishes refused because `history_dir` could not be written, by [`HistoryWrite`].
    history_write_errors: [AtomicU64; HistoryWrite::ALL.len()],
    /// Subscriptions that asked to resume from an id.
    pub resumes: AtomicU64,
    /// Resumes that could not be served gap-free (the client was sent a gap notice).
    pub resume_gaps: AtomicU64,
    /// Subscriptions held (a connection on three topics counts three).
    pub subscriptions: AtomicU64,
    /// Topics with at least one subscriber or message in history.
    pub topics: AtomicU64,
    /// Messages accepted by the publish API or in-band publish.
    pub published: AtomicU64,
    /// Publishes answered with the id of an earlier one with the same `Idempotency-Key`, and
    /// not published again.
    pub publish_repeats: AtomicU64,
    /// Publishes refused for their `Idempotency-Key`: malformed, or on a route that takes
    /// none (`400`).
    pub idempotency_key_errors: AtomicU64,
    /// Publishes refused for their `conflation_key` (empty, too long, a control character:
    /// `400`).
    pub conflation_key_refusals: AtomicU64,
    /// Fragments of appendable messages published (a timeout's closing one included).
    pub stream_fragments: AtomicU64,
    /// Appendable-message publishes refused: unknown or closed stream, past a limit.
    pub stream_refusals: AtomicU64,
    /// Streams closed by `stream_timeout`.
    pub streams_timed_out: AtomicU64,
    /// Keys forgotten before their window ended because `idempotency_keys` were held.
    pub idempotency_keys_forgotten: AtomicU64,
    /// Messages of a `POST /publish` batch answered with their own error in place (invalid,
    /// forbidden), and the valid ones held back with them (same topic: all or nothing).
    pub batch_items_refused: AtomicU64,
    /// Messages handed to a subscriber's socket (or its backlog).
    pub delivered: AtomicU64,
    /// Bytes read from client sockets.
    pub bytes_in: AtomicU64,
    /// Bytes written to client sockets.
    pub bytes_out: AtomicU64,
    /// Connections refused at the connection cap (503).
    pub refused_capacity: AtomicU64,
    /// Connections refused over the per-address limit (429).
    pub refused_address: AtomicU64,
    /// Connections refused over the in-flight handshake limit (503).
    pub refused_handshakes: AtomicU64,
    /// HTTP requests on the client listener answered with an error status.
    pub http_errors: AtomicU64,
    /// Messages replaced by a newer one with the same key for a slow subscriber (conflation).
    pub conflated_skipped: AtomicU64,
    /// Messages of a debounced topic (`max_rate`) replaced by a newer one of their key before
    /// their delivery round.
    pub debounced: AtomicU64,
    /// Open connections accepted on the TLS listener.
    pub tls_connections: AtomicU64,
    /// Open HTTP/2 connections (their streams are counted by transport, as connections).
    pub h2_connections: AtomicU64,
    /// Open HTTP/2 streams.
    pub h2_streams: AtomicU64,
    /// HTTP/2 streams opened.
    pub h2_streams_opened: AtomicU64,
    /// HTTP/2 connections whose protocol state rests (idle with one stream).
    pub h2_resting: AtomicU64,
    /// HTTP/2 connections ended by a protocol error or a flood (GOAWAY with an error code).
    pub h2_errors: AtomicU64,
    /// HTTP/2 streams reset, refused or answered 431 for the client's error (the connection
    /// going on).
    pub h2_stream_errors: AtomicU64,
    /// TLS handshakes completed.
    pub tls_handshakes: AtomicU64,
    /// TLS connections ended by a record-layer error after their handshake.
    pub tls_errors: AtomicU64,
    /// Client requests forwarded to GRIP backends.
    pub grip_requests: AtomicU64,
    /// GRIP backend exchanges that failed (unreachable, timeout, invalid answer, error status).
    pub grip_backend_errors: AtomicU64,
    /// Connections held by GRIP backends (streams, long-polls, bridged WebSockets).
    pub grip_holds: AtomicU64,
    /// Dashboard feeds (open dashboard tabs) being served.
    pub dashboard_feeds: AtomicU64,
    /// Whether a cluster broker is configured (1) or not (0): the broker families are only
    /// rendered when it is.
    pub broker_configured: AtomicU64,
    /// 1 while the broker's subscriber connection is up and every followed topic re-subscribed.
    pub broker_connected: AtomicU64,
    /// Broker commands sent and not answered yet (publishes, history reads).
    pub broker_in_flight: AtomicU64,
    /// Times the broker's subscriber connection was made again after it failed.
    pub broker_reconnects: AtomicU64,
    /// Broker commands that failed (unreachable, timed out, malformed answer).
    pub broker_errors: AtomicU64,
    /// Holes in a topic's live sequence (pub/sub is at-most-once) filled from the broker's history.
    pub broker_holes_filled: AtomicU64,
    /// Live gap notices sent to a topic's subscribers (history could not fill a hole, or the
    /// broker began a new epoch).
    pub broker_live_gaps: AtomicU64,
    /// Presence members (distinct identities) in this process's rooms, summed over rooms.
    pub presence_members: AtomicU64,
    /// Connections in presence rooms (members' connections and anonymous ones).
    pub presence_connections: AtomicU64,
    /// Presence `join` events sent (a member's first connection to a room).
    pub presence_joins: AtomicU64,
    /// Presence `leave` events sent (a member's last connection left a room).
    pub presence_leaves: AtomicU64,
    /// Deltas computed by the broker (`delta_topics`): one per publication per node at most.
    pub deltas_computed: AtomicU64,
    /// Subscriptions whose `delta` was refused (topic not in `delta_topics`, or a transport
    /// without the envelope's shape).
    pub delta_refused: AtomicU64,
    tls_failures: [AtomicU64; TLS_FAILURES.len()],
    auth_failures: [AtomicU64; AUTH_FAILURES.len()],
    closes: [AtomicU64; CloseReason::ALL.len()],
    /// Backend hook calls (docs/hooks.md).
    pub hooks: HookCounters,
    /// The Pusher HTTP API (docs/pusher.md).
    pub pusher: pusher::PusherCounters,
    /// Subscription filters (docs/filters.md).
    pub filters: filters::FilterCounters,
}

/// Why TLS handshakes fail, as `clarion_tls_handshake_failures_total` labels them:
/// a plain HTTP request on the TLS port, no shared version/cipher/ALPN, no certificate for the
/// SNI name (strict SNI), an alert from the client (it rejected our certificate), the handshake
/// not finished within `handshake_timeout`, anything else malformed.
pub const TLS_FAILURES: [&str; 6] = [
    "plaintext",
    "incompatible",
    "sni",
    "alert",
    "timeout",
    "protocol",
];

/// Why a client was refused by authentication, as `clarion_auth_failures_total` labels it: the
/// token checks (`malformed`, `algorithm`, `unknown_key`, `signature`, `claims`, `expired`,
/// `not_yet_valid`, `audience`, `issuer`), `missing` (no token where one is needed),
/// `forbidden` (a valid token without the topic), `expired_connection` (a long-lived
/// connection ended at its token's `exp`) and `origin` (the token cookie from a page of
/// another site, see `allowed_origins`).
pub const AUTH_FAILURES: [&str; 13] = [
    "malformed",
    "algorithm",
    "unknown_key",
    "signature",
    "claims",
    "expired",
    "not_yet_valid",
    "audience",
    "issuer",
    "missing",
    "forbidden",
    "expired_connection",
    "origin",
];

/// The counter of `label` in a labelled family (`counters` in the order of `labels`).
fn labelled<'a>(labels: &[&str], counters: &'a [AtomicU64], label: &str) -> Option<&'a AtomicU64> {
    counters.get(labels.iter().position(|l| *l == label)?)
}

impl Metrics {
    /// Counts one authentication failure (`reason` is one of [`AUTH_FAILURES`]; another counts
    /// as the first).
    pub fn auth_failed(&self, reason: &str) {
        if let Some(c) =
            labelled(&AUTH_FAILURES, &self.auth_failures, reason).or(self.auth_failures.first())
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Authentication failures for one reason.
    pub fn auth_failures(&self, reason: &str) -> u64 {
        labelled(&AUTH_FAILURES, &self.auth_failures, reason).map_or(0, |c| c.load(Relaxed))
    }

    /// Counts one failed TLS handshake (`reason` is one of [`TLS_FAILURES`]; another counts as
    /// the last, "other").
    pub fn tls_failed(&self, reason: &str) {
        if let Some(c) =
            labelled(&TLS_FAILURES, &self.tls_failures, reason).or(self.tls_failures.last())
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Failed TLS handshakes for one reason.
    pub fn tls_failures(&self, reason: &str) -> u64 {
        labelled(&TLS_FAILURES, &self.tls_failures, reason).map_or(0, |c| c.load(Relaxed))
    }

    /// Counts one message dropped from history.
    pub fn evicted(&self, why: Eviction) {
        let c = match why {
            Eviction::Count => &self.evicted_count,
            Eviction::Age => &self.evicted_age,
            Eviction::Memory => &self.evicted_memory,
        };
        c.fetch_add(1, Relaxed);
    }

    /// Counts one publish refused because the durable log could not be written.
    pub fn history_write_failed(&self, why: HistoryWrite) {
        if let Some(c) = self.history_write_errors.get(why as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Publishes refused for one reason of the durable log's.
    pub fn history_write_errors(&self, why: HistoryWrite) -> u64 {
        self.history_write_errors
            .get(why as usize)
            .map_or(0, |c| c.load(Relaxed))
    }

    /// Counts one ended connection.
    pub fn closed(&self, reason: CloseReason) {
        let i = CloseReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        if let Some(c) = self.closes.get(i) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Ended connections for one reason (tests and the shutdown log).
    pub fn closes(&self, reason: CloseReason) -> u64 {
        let i = CloseReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.closes.get(i).map_or(0, |c| c.load(Relaxed))
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        let rss = process_rss_bytes().unwrap_or(0);
        let http = self.http_connections.load(Relaxed);
        let ws = self.ws_connections.load(Relaxed);
        let sse = self.sse_connections.load(Relaxed);
        let stream = self.stream_connections.load(Relaxed);
        let poll = self.polls_held.load(Relaxed);
        let _ = writeln!(
            out,
            "# HELP clarion_connections Open client connections by transport.\n\
             # TYPE clarion_connections gauge\n\
             clarion_connections{{transport=\"http\"}} {http}\n\
             clarion_connections{{transport=\"ws\"}} {ws}\n\
             clarion_connections{{transport=\"sse\"}} {sse}\n\
             clarion_connections{{transport=\"stream\"}} {stream}\n\
             clarion_connections{{transport=\"poll\"}} {poll}"
        );
        let l = |a: &AtomicU64| a.load(Relaxed);
        gauge(
            &mut out,
            "clarion_subscriptions",
            "Subscriptions held.",
            l(&self.subscriptions),
        );
        gauge(
            &mut out,
            "clarion_topics",
            "Topics with subscribers or history.",
            l(&self.topics),
        );
        counter(
            &mut out,
            "clarion_messages_published_total",
            "Messages published.",
            l(&self.published),
        );
        counter(
            &mut out,
            "clarion_publish_repeats_total",
            "Publishes repeating an Idempotency-Key, answered the first id and not published.",
            l(&self.publish_repeats),
        );
        counter(
            &mut out,
            "clarion_idempotency_key_errors_total",
            "Publishes refused (400) for their Idempotency-Key.",
            l(&self.idempotency_key_errors),
        );
        counter(
            &mut out,
            "clarion_conflation_key_errors_total",
            "Publishes refused (400) for their conflation_key.",
            l(&self.conflation_key_refusals),
        );
        counter(
            &mut out,
            "clarion_stream_fragments_total",
            "Fragments of appendable messages published.",
            l(&self.stream_fragments),
        );
        counter(
            &mut out,
            "clarion_stream_refusals_total",
            "Appendable-message publishes refused: unknown or closed stream (404, 409), past a limit (413, 429).",
            l(&self.stream_refusals),
        );
        counter(
            &mut out,
            "clarion_streams_timed_out_total",
            "Appendable messages closed by stream_timeout.",
            l(&self.streams_timed_out),
        );
        counter(
            &mut out,
            "clarion_batch_items_refused_total",
            "Messages of a publish batch not published: invalid, forbidden, or on the same topic as one that was.",
            l(&self.batch_items_refused),
        );
        counter(
            &mut out,
            "clarion_idempotency_keys_forgotten_total",
            "Idempotency keys forgotten before their window ended (idempotency_keys held).",
            l(&self.idempotency_keys_forgotten),
        );
        let _ = writeln!(
            out,
            "# HELP clarion_history_write_errors_total Publishes refused because history_dir \
             could not be written, by reason.\n\
             # TYPE clarion_history_write_errors_total counter"
        );
        for why in HistoryWrite::ALL {
            let _ = writeln!(
                out,
                "clarion_history_write_errors_total{{reason=\"{}\"}} {}",
                why.label(),
                self.history_write_errors(why)
            );
        }
        counter(
            &mut out,
            "clarion_messages_delivered_total",
            "Messages handed to subscriber sockets.",
            l(&self.delivered),
        );
        counter(
            &mut out,
            "clarion_bytes_in_total",
            "Bytes read from clients.",
            l(&self.bytes_in),
        );
        counter(
            &mut out,
            "clarion_bytes_out_total",
            "Bytes written to clients.",
            l(&self.bytes_out),
        );
        let _ = writeln!(
            out,
            "# HELP clarion_connections_refused_total Connections refused at accept, by limit.\n\
             # TYPE clarion_connections_refused_total counter\n\
             clarion_connections_refused_total{{reason=\"capacity\"}} {}\n\
             clarion_connections_refused_total{{reason=\"address\"}} {}\n\
             clarion_connections_refused_total{{reason=\"handshakes\"}} {}",
            l(&self.refused_capacity),
            l(&self.refused_address),
            l(&self.refused_handshakes)
        );
        counter(
            &mut out,
            "clarion_http_errors_total",
            "Client-listener requests answered with an error status.",
            l(&self.http_errors),
        );
        counter(
            &mut out,
            "clarion_conflated_skipped_total",
            "Messages replaced by a newer one of their key for a slow subscriber.",
            l(&self.conflated_skipped),
        );
        counter(
            &mut out,
            "clarion_debounced_total",
            "Messages of a max_rate topic replaced by a newer one of their key before delivery.",
            l(&self.debounced),
        );
        gauge(
            &mut out,
            "clarion_tls_connections",
            "Open connections accepted on the TLS listener.",
            l(&self.tls_connections),
        );
        let h2 = l(&self.h2_connections);
        let h2_streams = l(&self.h2_streams);
        let all = http + ws + sse + stream + poll;
        let _ = writeln!(
            out,
            "# HELP clarion_protocol_connections Open client connections by HTTP version (an \
             HTTP/2 connection counts once, whatever streams it carries).\n\
             # TYPE clarion_protocol_connections gauge\n\
             clarion_protocol_connections{{protocol=\"h1\"}} {}\n\
             clarion_protocol_connections{{protocol=\"h2\"}} {h2}",
            all.saturating_sub(h2_streams)
        );
        gauge(
            &mut out,
            "clarion_h2_streams",
            "Open HTTP/2 streams (each is also counted in clarion_connections by transport).",
            h2_streams,
        );
        gauge(
            &mut out,
            "clarion_h2_resting",
            "HTTP/2 connections idle with one stream whose protocol state rests in its compact \
             form (woken by their next frame or message).",
            l(&self.h2_resting),
        );
        counter(
            &mut out,
            "clarion_h2_streams_total",
            "HTTP/2 streams opened.",
            l(&self.h2_streams_opened),
        );
        counter(
            &mut out,
            "clarion_h2_errors_total",
            "HTTP/2 connections ended by a protocol error or a flood (GOAWAY with an error).",
            l(&self.h2_errors),
        );
        counter(
            &mut out,
            "clarion_h2_stream_errors_total",
            "HTTP/2 streams reset, refused or answered 431 for the client's error.",
            l(&self.h2_stream_errors),
        );
        counter(
            &mut out,
            "clarion_tls_handshakes_total",
            "TLS handshakes completed.",
            l(&self.tls_handshakes),
        );
        let _ = writeln!(
            out,
            "# HELP clarion_tls_handshake_failures_total TLS handshakes that failed, by reason.\n\
             # TYPE clarion_tls_handshake_failures_total counter"
        );
        for r in TLS_FAILURES {
            let _ = writeln!(
                out,
                "clarion_tls_handshake_failures_total{{reason=\"{r}\"}} {}",
                self.tls_failures(r)
            );
        }
        let _ = writeln!(
            out,
            "# HELP clarion_auth_failures_total Clients refused by authentication, by reason.\n\
             # TYPE clarion_auth_failures_total counter"
        );
        for r in AUTH_FAILURES {
            let _ = writeln!(
                out,
                "clarion_auth_failures_total{{reason=\"{r}\"}} {}",
                self.auth_failures(r)
            );
        }
        self.render_hooks(&mut out);
        counter(
            &mut out,
            "clarion_grip_requests_total",
            "Client requests forwarded to GRIP backends.",
            l(&self.grip_requests),
        );
        counter(
            &mut out,
            "clarion_grip_backend_errors_total",
            "GRIP backend exchanges that failed.",
            l(&self.grip_backend_errors),
        );
        gauge(
            &mut out,
            "clarion_grip_held",
            "Connections held by GRIP backends.",
            l(&self.grip_holds),
        );
        counter(
            &mut out,
            "clarion_tls_errors_total",
            "TLS connections ended by a record error after the handshake.",
            l(&self.tls_errors),
        );
        gauge(
            &mut out,
            "clarion_history_messages",
            "Messages held in topic histories.",
            l(&self.history_messages),
        );
        gauge(
            &mut out,
            "clarion_history_bytes",
            "Bytes held in topic histories (payloads and per-message records).",
            l(&self.history_bytes),
        );
        let _ = writeln!(
            out,
            "# HELP clarion_history_evictions_total Messages dropped from history, by reason.\n\
             # TYPE clarion_history_evictions_total counter\n\
             clarion_history_evictions_total{{reason=\"count\"}} {}\n\
             clarion_history_evictions_total{{reason=\"age\"}} {}\n\
             clarion_history_evictions_total{{reason=\"memory\"}} {}",
            l(&self.evicted_count),
            l(&self.evicted_age),
            l(&self.evicted_memory)
        );
        counter(
            &mut out,
            "clarion_resumes_total",
            "Subscriptions that resumed from a message id.",
            l(&self.resumes),
        );
        counter(
            &mut out,
            "clarion_resume_gaps_total",
            "Resumes that could not be served gap-free (a gap notice was sent).",
            l(&self.resume_gaps),
        );
        let _ = writeln!(
            out,
            "# HELP clarion_closes_total Connections ended, by reason.\n# TYPE clarion_closes_total counter"
        );
        for r in CloseReason::ALL {
            let _ = writeln!(
                out,
                "clarion_closes_total{{reason=\"{}\"}} {}",
                r.label(),
                self.closes(r)
            );
        }
        counter(
            &mut out,
            "clarion_slow_consumers_total",
            "Connections closed because they stopped reading.",
            self.closes(CloseReason::SlowConsumer),
        );
        gauge(
            &mut out,
            "clarion_process_rss_bytes",
            "Resident set size of the process.",
            rss,
        );
        let _ = writeln!(
            out,
            "# HELP clarion_process_cpu_seconds_total User and system CPU time used by the process.\n\
             # TYPE clarion_process_cpu_seconds_total counter\n\
             clarion_process_cpu_seconds_total {:.2}",
            process_cpu_seconds().unwrap_or(0.0)
        );
        gauge(
            &mut out,
            "clarion_dashboard_feeds",
            "Dashboard feeds (open dashboard tabs) being served.",
            l(&self.dashboard_feeds),
        );
        if l(&self.broker_configured) > 0 {
            self.render_broker(&mut out);
        }
        self.render_presence(&mut out);
        self.render_delta(&mut out);
        self.pusher.render(&mut out);
        self.filters.render(&mut out);
        let per_conn = rss
            .checked_div(http + ws + sse + stream + poll)
            .unwrap_or(0);
        gauge(
            &mut out,
            "clarion_rss_bytes_per_connection",
            "Process RSS divided by open client connections (includes fixed overhead).",
            per_conn,
        );
        out
    }
}

fn gauge(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

/// Resident set size of this process, from `/proc/self/statm`.
pub fn process_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// User plus system CPU seconds this process has used, from `/proc/self/stat` (fields 14 and
/// 15, in the kernel's fixed user-visible 100 ticks per second).
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after its `)` are plain.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks the exposition text as a scraper reads it: every family has one `# HELP` and one
    /// `# TYPE`, in that order, before its samples, which follow it without another family in
    /// between; every sample belongs to the family just declared (a histogram's `_bucket`,
    /// `_sum` and `_count` included); and no family is empty. Returns the families' names.
    fn families(text: &str) -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        let mut current: Option<(String, String, usize)> = None; // name, type, samples
        let close = |c: &Option<(String, String, usize)>| {
            if let Some((name, _, samples)) = c {
                assert!(*samples > 0, "family {name} has no sample");
            }
        };
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            if let Some(rest) = line.strip_prefix("# HELP ") {
                close(&current);
                let name = rest.split(' ').next().unwrap_or_default().to_owned();
                assert!(!seen.contains(&name), "family {name} declared twice");
                let ty = lines
                    .get(i + 1)
                    .and_then(|l| l.strip_prefix(&format!("# TYPE {name} ")))
                    .unwrap_or_else(|| panic!("# HELP {name} is not followed by its # TYPE"));
                assert!(
                    ["counter", "gauge", "histogram"].contains(&ty),
                    "{name}: type {ty}"
                );
                seen.push(name.clone());
                current = Some((name, ty.to_owned(), 0));
                i += 2;
                continue;
            }
            assert!(!line.starts_with('#'), "stray comment line: {line}");
            if !line.is_empty() {
                let Some((name, ty, samples)) = current.as_mut() else {
                    panic!("sample before any family: {line}");
                };
                let sample = line.split(['{', ' ']).next().unwrap_or_default();
                let ok = sample == name.as_str()
                    || (ty.as_str() == "histogram"
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|suffix| sample.strip_suffix(suffix) == Some(name.as_str())));
                assert!(ok, "sample {sample} inside family {name}");
                let value = line.rsplit(' ').next().unwrap_or_default();
                assert!(value.parse::<f64>().is_ok(), "{line}: value {value}");
                *samples += 1;
            }
            i += 1;
        }
        close(&current);
        seen
    }

    #[test]
    fn every_family_is_declared_once_with_its_samples() {
        let m = Metrics::default();
        let without_broker = families(&m.render());
        m.broker_configured.store(1, Relaxed);
        let with_broker = families(&m.render());
        // The broker's families come on top of the others, never instead of one.
        assert!(without_broker.iter().all(|f| with_broker.contains(f)));
        assert!(with_broker.len() > without_broker.len());
        assert!(with_broker
            .iter()
            .any(|f| f == "clarion_broker_recoveries_total"));
        // Pinned: a family that disappears is a dashboard or an alert that breaks.
        for family in [
            "clarion_connections",
            "clarion_messages_delivered_total",
            "clarion_closes_total",
            "clarion_slow_consumers_total",
            "clarion_process_cpu_seconds_total",
            "clarion_h2_streams",
            "clarion_h2_resting",
            "clarion_h2_errors_total",
            "clarion_h2_stream_errors_total",
        ] {
            assert!(
                without_broker.iter().any(|f| f == family),
                "{family} missing"
            );
        }
    }

    #[test]
    fn the_family_checker_finds_a_family_declared_twice() {
        let twice = "# HELP a x\n# TYPE a counter\na 1\n# HELP a x\n# TYPE a counter\na 2\n";
        assert!(std::panic::catch_unwind(|| families(twice)).is_err());
        let empty = "# HELP a x\n# TYPE a counter\n# HELP b x\n# TYPE b gauge\nb 1\n";
        assert!(std::panic::catch_unwind(|| families(empty)).is_err());
        let foreign = "# HELP a x\n# TYPE a counter\nb 1\n";
        assert!(std::panic::catch_unwind(|| families(foreign)).is_err());
        assert_eq!(
            families("# HELP a x\n# TYPE a gauge\na{x=\"1\"} 2\n"),
            vec!["a"]
        );
    }

    #[test]
    fn render_has_every_family_once() {
        let m = Metrics::default();
        m.closed(CloseReason::SlowConsumer);
        m.ws_connections.store(3, Relaxed);
        let text = m.render();
        assert!(text.contains("clarion_connections{transport=\"ws\"} 3"));
        assert!(text.contains("clarion_closes_total{reason=\"slow_consumer\"} 1"));
        assert!(text.contains("clarion_slow_consumers_total 1"));
        assert_eq!(
            text.matches("# TYPE clarion_messages_delivered_total")
                .count(),
            1
        );
        assert!(process_rss_bytes().is_some_and(|r| r > 0));
        assert!(process_cpu_seconds().is_some_and(|c| c >= 0.0));
        assert_eq!(
            text.matches("\nclarion_process_cpu_seconds_total ").count(),
            1
        );
    }
}
