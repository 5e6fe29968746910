//! Server configuration: every setting declared once, with its default and the reason for it.
//!
//! Settings come from embedded defaults, overridden by a TOML file, then by `CLARION_*`
//! environment variables, then by command-line flags (see [`crate::cli`]). Each declaration
//! below yields the [`Config`] field, its TOML key, its `clarion serve` flag and variable, and
//! its row in `docs/configuration.md` (a test fails when that table is stale; see [`declare`]).
//! Limits that are not settings are in [`limits`]; no other module invents a number.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

#[macro_use]
pub mod declare;
pub mod conflate;
pub mod env;
mod file;
mod history;
pub mod limits;
pub mod pusher_apps;
mod validate;

pub use history::{largest_segment, HistoryDisk, HistoryLimits, StreamSettings};

pub use declare::{docs_table, Setting, Source};

settings! {
    /// Clients connect from anywhere. Each worker binds it with `SO_REUSEPORT`, so the kernel
    /// spreads connections over the workers.
    listen: SocketAddr = SocketAddr::from(([0, 0, 0, 0], 8080)), flag "Client listener address";
    /// The API listener: publishing, health and metrics. Loopback by default so publishing is
    /// never exposed to the network by accident.
    api_listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 8081)),
        flag "API listener address (publish, health, metrics)";
    /// Event-loop threads; `0` means one per core. Each worker is one single-threaded event loop
    /// owning its connections; more loops than cores only adds context switches.
    workers: usize = 0, flag "Event-loop threads (0 = one per core)";
    /// Write a fan-out with io_uring: one submission per 256 sends (TLS records sealed for it and
    /// HTTP/2 pumps' frames too) instead of a `send` each; at a steady ticker it took a third off
    /// the CPU per delivery, and TLS's from 2.2x to 1.3–1.5x clear text's (docs/benchmarks.md).
    /// Used only where the kernel allows it (Linux 5.6+; not with `kernel.io_uring_disabled` or a
    /// seccomp profile that blocks it); otherwise, and with `false`, each delivery is a `send`.
    io_uring: bool = true, switch "Write fan-outs through io_uring where available";
    /// Client connections held at once; `0` means the open-files limit less 64. Over it, a new
    /// connection is answered `503` with `Retry-After: 5` at once, without reading its request
    /// (`clarion_connections_refused_total{reason="capacity"}`). The reserve of 64 descriptors
    /// keeps the listeners, the API and the pollers working at the limit.
    max_connections: usize = 0, flag "Most client connections (0 = from the open-files limit)";
    /// Connections from one client address (an IPv4 address; for IPv6 its /64, since one host
    /// usually owns a whole /64). Over it a new connection is answered `429` with
    /// `Retry-After: 5` at once and counted in `clarion_connections_refused_total{reason="address"}`.
    /// Far above what one browser opens (Chrome allows 255 WebSockets per profile), low enough
    /// that one host cannot take the server. Raise it for clients behind a large NAT or a proxy;
    /// `0` disables.
    max_connections_per_address: usize = 1024,
        flag "Most connections from one address (IPv4, or IPv6 /64); 0 = no limit";
    /// Connections that have not become a subscription yet (still sending a request head, or
    /// idle between keep-alive requests). Over it a new connection is answered `503` at once
    /// (`reason="handshakes"`). A connect storm of real clients passes in well under a second;
    /// a slowloris flood cannot hold more than this, and each of those is closed after
    /// `handshake_timeout`. `0` disables.
    max_handshakes: usize = 4096, flag "Most connections still sending their request head";
    /// Largest WebSocket message a client may send, in bytes (fragments summed); over it the
    /// connection is closed with `1009`. Clients of a push server send small control messages;
    /// µWebSockets defaults to 16 KiB. Conformance runs need 16 MiB. Must be above 0.
    max_message_size: usize = 64 * 1024,
        flag "Largest WebSocket message a client may send, in bytes";
    /// Unsent bytes one connection may owe. A client over it has stopped reading: it is closed
    /// with `1008 slow consumer` and counted in `clarion_slow_consumers_total`. µWebSockets'
    /// default; a few seconds of a busy feed, and a hard cap on the memory one stalled client
    /// can pin. Must be above 0.
    max_backlog: usize = 64 * 1024,
        flag "Unsent bytes per connection before it is closed as a slow consumer";
    /// Largest publish request body in bytes (one message, or a whole batch); `413` over it.
    /// Larger payloads belong in object storage with a link in the message.
    max_publish_size: usize = 1024 * 1024,
        flag "Largest message (request body) the publish API accepts, in bytes";
    /// Topics per connection. Enough for any dashboard, and it bounds the index memory one
    /// client can claim.
    max_subscriptions: usize = 64, flag "Topics one connection may subscribe to";
    /// Seconds of client silence before the server sends a Ping. Keeps NAT and proxy mappings
    /// alive and reveals dead peers. `0` turns pings off (conformance runs). Must be below
    /// `idle_timeout`.
    ping_interval: u64 = 60, flag "Seconds of client silence before a ping (0 = no pings)";
    /// Seconds of client silence (no frame, not even a Pong) before the connection is closed
    /// with `1001 idle timeout`. µWebSockets' default; two ping intervals, so a live client
    /// always answers in time. `0` never closes idle connections.
    idle_timeout: u64 = 120,
        flag "Seconds of client silence before the connection is closed (0 = never)";
    /// Seconds a new connection has to send a complete request head and upgrade (and between
    /// keep-alive requests; a TLS handshake too). Enough for a slow mobile link; short enough
    /// that slowloris clients cannot pile up.
    handshake_timeout: u64 = 10, flag "Seconds to complete a request head or upgrade";
    /// Seconds a graceful shutdown waits for clients to read their Close 1001 frame and
    /// disconnect, and for buffers to drain, before the process exits anyway.
    shutdown_timeout: u64 = 10,
        flag "Seconds a graceful shutdown waits for connections to close";
    /// Seconds over which a shutdown or restart tells its connections to go, a slice at a
    /// time, so that their reconnections reach the other nodes (or the next process) as a
    /// steady stream rather than all in one millisecond. `0` tells them all at once.
    /// `shutdown_timeout` runs after it.
    drain_period: u64 = 0,
        flag "Seconds over which a shutdown tells its connections to go (0: all at once)";
    /// The pub/sub WebSocket endpoint.
    ws_path: String = "/ws".to_owned(), flag "Path of the pub/sub WebSocket endpoint";
    /// permessage-deflate: `off`; `shared` (each published message compressed once, without
    /// context takeover, the same bytes for every subscriber that negotiated it: no
    /// per-connection memory, one compression per message); `dedicated` (a compression context
    /// per connection: better ratios on streams of similar messages, at one compression per
    /// subscriber per message and a compressor per connection, about 200 KiB each, see
    /// `compression_dedicated_limit`).
    compression: Compression = Compression::Shared,
        flag "permessage-deflate: off, shared (compress once per message) or dedicated";
    /// Messages shorter than this many bytes are sent uncompressed (below it deflate saves
    /// little and costs a frame's worth of CPU), and (when above 0) so are messages that would
    /// not shrink. `0` compresses everything.
    compression_threshold: usize = 128, flag "Messages shorter than this are sent uncompressed";
    /// zlib level 1–9. In shared mode a message is compressed once for all subscribers, so the
    /// better ratio costs little.
    compression_level: u32 = 6, flag "zlib level 1-9";
    /// LZ77 window (9–15 bits) of dedicated-mode compressors: most of the gain on similar JSON
    /// messages for a fraction of the memory of 15.
    compression_window_bits: u8 = 12, flag "Window bits (9-15) of a dedicated-mode compressor";
    /// Most connections holding a dedicated compressor at once (split evenly over the workers).
    /// A compressor costs about 200 KiB whatever its window (zlib-rs keeps a fixed 64 Ki-entry
    /// hash table; measured in `docs/benchmarks.md`), so the default bounds dedicated mode at
    /// about 200 MiB. Connections past the limit get the shared frames, which is always
    /// allowed: a compressor may ignore its context.
    compression_dedicated_limit: usize = 1000,
        flag "Most connections with a dedicated compressor at once";
    /// Window (9–15 bits) asked of clients that let the server choose (`client_max_window_bits`).
    /// A client that keeps compression context (browsers do) costs an inflater of this window,
    /// allocated only once it sends a compressed message.
    compression_client_window_bits: u8 = 12,
        flag "Window bits (9-15) asked of clients that let the server choose";
    /// The Server-Sent Events endpoint (`docs/protocol.md`).
    sse_path: String = "/sse".to_owned(), flag "Path of the Server-Sent Events endpoint";
    /// The long-polling endpoint.
    poll_path: String = "/poll".to_owned(), flag "Path of the long-polling endpoint";
    /// The newline-delimited HTTP streaming endpoint. All paths must start with `/` and differ.
    stream_path: String = "/stream".to_owned(),
        flag "Path of the newline-delimited streaming endpoint";
    /// Seconds without output before an SSE stream gets a `:` comment (an empty line on
    /// `/stream`). Below the 30–60 s idle limits of common proxies and load balancers, and it
    /// reveals dead clients; `0` disables.
    sse_keepalive: u64 = 20,
        flag "Seconds of silence before an SSE or HTTP stream gets a keep-alive line (0 = never)";
    /// Milliseconds an EventSource waits before reconnecting (the `retry:` line). Fast recovery
    /// without a reconnect storm after a restart.
    sse_retry: u64 = 2000, flag "The `retry:` hint sent to EventSource clients, in milliseconds";
    /// Seconds a long-poll is held when the client gives no `timeout=`. Below the 60 s at which
    /// many proxies give up on a silent response. At most `poll_max_timeout`.
    poll_timeout: u64 = 30, flag "Seconds a long-poll is held by default";
    /// Longest `timeout=` a client may ask for, in seconds (larger values are lowered to it).
    /// At most 3600.
    poll_max_timeout: u64 = 120, flag "Longest hold a long-poll client may ask for, in seconds";
    /// Messages kept per topic for clients that resume (SSE reconnects, long-poll cursors,
    /// `since=`). `0` disables history: resumes then always report a gap, and long-polls lose
    /// what is published between two polls.
    history_size: usize = 100, flag "Messages of history kept per topic (0 = no history)";
    /// Seconds a message stays in history. A client away longer is told it missed messages (a
    /// gap) rather than flooded with stale ones. At most 2^32.
    history_ttl: u64 = 3600, flag "Seconds a message stays in history";
    /// Bytes of history across all topics (64 MiB); the oldest messages go first, counted in
    /// `clarion_history_evictions_total{reason="memory"}`. A message counts its payload plus
    /// about 200 bytes of records; encodings built for delivery (envelope, SSE event) are not
    /// counted and can add up to about twice the payload for messages delivered in several
    /// formats.
    history_memory: usize = 64 * 1024 * 1024, flag "Bytes of history across all topics";
    /// Seconds a publish's `Idempotency-Key` is remembered: a publish repeated with the same
    /// key on the same topic within it is answered the first one's id and not delivered again
    /// (with Redis, across the cluster). Five minutes covers any publisher's retries (the
    /// project's clients retry for 10 s) with room for a slow deploy. `0` turns keys off
    /// (the header is then ignored).
    idempotency_window: u64 = 300,
        flag "Seconds a publish's Idempotency-Key is remembered (0 = keys ignored)";
    /// Keys remembered at once by one process (without Redis; with Redis they are Redis keys
    /// that expire with the window). Past it the oldest key is forgotten early and counted in
    /// `clarion_idempotency_keys_forgotten_total`, rather than a publish refused: the
    /// project's clients set a key on every publish. About 250 bytes each: 100,000 is 25 MB,
    /// and holds the full window up to 333 keyed publishes a second (a client's own retries
    /// come within 10 s, so up to 10,000 a second for those).
    idempotency_keys: usize = 100_000,
        flag "Idempotency keys remembered at once by one process (without Redis)";
    /// Fragments one appendable message (`POST /publish/{topic}?stream=open`, then
    /// `append_to`) may hold; past it an append is answered `413`.
    stream_max_fragments: u32 = 10_000, flag "Fragments per appendable message";
    /// Bytes of text one appendable message may accumulate; past it an append is `413`.
    stream_max_bytes: usize = 1024 * 1024, flag "Bytes of text per appendable message";
    /// Appendable messages open at once on one topic; past it an open is answered `429`.
    stream_max_open: usize = 1000, flag "Appendable messages open at once per topic";
    /// Seconds an appendable message may go without a fragment before the server closes it
    /// with a last event `{"done":true,"reason":"timeout"}`.
    stream_timeout: u64 = 300, flag "Seconds an appendable message may stay idle";
    /// A directory where history is also kept on disk, so a restart (graceful, or after
    /// `kill -9`) resumes clients exactly: same epoch, same ids, same messages
    /// (docs/history.md says exactly what a crash or a power loss may lose). Created mode 0700
    /// if missing; must be the server user's and writable by no one else; one process per
    /// directory. Unset: history is in memory only and a restart begins a new
    /// epoch. Only without `broker` (with Redis, history lives in Redis).
    history_dir: Option<PathBuf> = None, flag "Directory where history is kept on disk (unset = memory only)";
    /// Milliseconds between `fsync`s of the history log, with `history_dir`. Every publish is
    /// written (`write(2)`) before it is acknowledged, so a crash of the process loses nothing;
    /// this bounds what a power loss or kernel crash may lose (and such a loss begins a new
    /// epoch). `0` syncs every publish before acknowledging it: nothing is lost even then and
    /// the epoch continues, at the cost of one `fsync` per publish batch (~3.6x a publish's
    /// CPU here, docs/benchmarks.md).
    history_fsync_ms: u64 = 1000, flag "Milliseconds between fsyncs of the history log (0 = every publish)";
    /// Bytes after which the history log begins a new segment file (16 MiB). Disk use is at
    /// most about twice what history holds plus three segments; smaller segments free disk
    /// sooner, larger ones rotate less often.
    history_segment_bytes: u64 = 16 * 1024 * 1024, flag "Bytes per history log segment";
    /// `Access-Control-Allow-Origin` on SSE, stream and long-poll answers and preflights, so
    /// pages on other origins can subscribe. `*` is safe because subscriptions carry no
    /// credentials; set one origin to restrict, or empty to send no CORS headers.
    cors_allow_origin: String = "*".to_owned(),
        flag "Access-Control-Allow-Origin for SSE, stream and poll answers (empty = none)";
    /// A WebSocket echo endpoint for conformance runs (Autobahn). Off by default: it does
    /// nothing useful in production.
    echo_path: Option<String> = None,
        flag "Path of a WebSocket echo endpoint (off unless given; for conformance runs)";
    /// Whether WebSocket clients may publish in-band. Off by default: publishing is a
    /// backend's job, and an open publish lets any visitor write to every subscriber.
    allow_client_publish: bool = false,
        switch "Let clients publish in-band (`--allow-client-publish` or `=true/false`)";
    /// When set, the publish endpoints require `Authorization: Bearer <key>` (`401` otherwise).
    /// Health and metrics stay open for probes and scrapers. Unset by default: the API listens
    /// on loopback.
    api_key: Option<String> = None, secret "Bearer key the publish API requires";
    /// Host names (as in the `Host` header, without the port; comma-separated on the command
    /// line) the API answers to. On a loopback API, loopback names (`localhost`, `127.x.y.z`,
    /// `[::1]`) are always allowed and any other name is answered `421`: a page on a site whose
    /// name an attacker points at 127.0.0.1 (DNS rebinding) cannot read or publish. On another
    /// address every name is accepted unless this lists some. Empty by default.
    api_hosts: Vec<String> = Vec::new(),
        flag "Host names the API answers to besides loopback ones (comma-separated)";
    /// Longest request line; `414` over it. What common proxies accept.
    max_request_line: usize = 8 * 1024, file;
    /// Most request headers; `431` over it. Browsers send about 15.
    max_headers: usize = 64, file;
    /// Largest request head in bytes; `431` over it.
    max_head_size: usize = 16 * 1024, file;
    /// Bytes read from a socket per system call: one large TCP segment train at once. One
    /// buffer per worker, never per connection. At least 1024.
    read_buffer: usize = 64 * 1024, flag "Bytes read from a socket at once (one buffer per worker)";
    /// A second client listener speaking TLS (`https://`, `wss://`); every transport and path
    /// works on it exactly as on `listen`, which keeps running. Bound per worker with
    /// `SO_REUSEPORT` like `listen`. When a certificate is set without it, `0.0.0.0:8443`.
    tls_listen: Option<SocketAddr> = None,
        flag "TLS client listener address (default 0.0.0.0:8443 once a certificate is given)";
    /// HTTP/2 on the client listeners and the API: chosen by ALPN (`h2`) over TLS, by the
    /// preface (h2c) in clear text. Every HTTP transport runs as a stream, WebSockets too
    /// (RFC 8441), so a page's EventSources share one connection. See docs/protocol.md, "HTTP/2".
    http2: bool = true, switch "Speak HTTP/2 on the client listeners and the API (ALPN h2, and h2c)";
    /// Streams one HTTP/2 connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`; more
    /// are `REFUSED_STREAM`), each a connection for `max_connections[_per_address]`. At least 1;
    /// above 65,535 it is taken as 65,535.
    h2_max_streams: usize = 256, flag "Streams one HTTP/2 connection may have open at once";
    /// HPACK table for a client's request fields (`SETTINGS_HEADER_TABLE_SIZE`; equal entries are
    /// shared). 0 frees a connection's own at its SETTINGS ack; clients ignoring it (h2spec) fail.
    h2_header_table: u32 = 4096, flag "HPACK table size advertised to HTTP/2 clients";
    /// The default certificate: a PEM chain (server certificate first, then intermediates).
    /// `clarion cert --dev` makes a pair for trying TLS locally. Goes with `tls_key`.
    tls_cert: Option<PathBuf> = None,
        flag "Certificate chain (PEM) for TLS; see `clarion cert --dev`";
    /// The PEM private key of `tls_cert` (PKCS#8, PKCS#1 or SEC1; ECDSA, Ed25519 or RSA).
    tls_key: Option<PathBuf> = None, flag "Private key (PEM) for --tls-cert";
    /// More certificates for other names: `[{ cert = "...", key = "..." }, ...]` (or
    /// `[[tls_certificates]]` tables). Each handshake gets the first certificate (the default
    /// first) whose names cover the SNI name the client asked for; without a match, the default
    /// one.
    tls_certificates: Vec<crate::tls::CertFiles> = Vec::new(), file;
    /// Refuse handshakes for names no certificate covers (alert `unrecognized_name`, counted as
    /// `reason="sni"`) instead of answering with the default certificate. Clients that send no
    /// SNI (connecting by IP address) always get the default.
    tls_strict_sni: bool = false,
        switch "Refuse TLS handshakes for names no certificate covers";
    /// `"1.2"` or `"1.3"`. TLS 1.2 clients still exist (older Android, embedded devices); TLS
    /// 1.2 connections cost more memory (rustls keeps its whole connection state) than TLS 1.3
    /// ones.
    tls_min_version: String = "1.2".to_owned(), flag "Lowest TLS version, 1.2 or 1.3";
    /// Serve the API listener over TLS too, with the same certificates (for publishers on other
    /// hosts). Off by default: the API listens on loopback.
    tls_api: bool = false, switch "Serve the API over TLS too";
    /// Seconds between checks of the certificate files' modification times; a change re-reads
    /// them all. `SIGHUP` re-reads them at once. New handshakes use the new certificates;
    /// established connections are untouched. A reload that fails (unreadable file, key not
    /// matching) is logged and the previous certificates stay in use. `0` reloads on `SIGHUP`
    /// only.
    tls_reload_interval: u64 = 10,
        flag "Seconds between checks for changed certificate files (0 = SIGHUP only)";
    /// GRIP proxy mode: a routes file in Pushpin's syntax (`* 127.0.0.1:3000`,
    /// `*,path_beg=/ws 127.0.0.1:3000,over_http`). Requests matching a route are forwarded to
    /// its backend, which may hold them with `Grip-*` headers; Clarion's own endpoints serve
    /// what no route matches. See [grip.md](grip.md). A file that does not parse stops startup
    /// with its line number. Unset by default: no proxying.
    grip_routes: Option<PathBuf> = None,
        flag "GRIP proxy mode: a routes file in Pushpin's syntax (see docs/grip.md)";
    /// Signs every forwarded request with `Grip-Sig` (HS256 JWT, `iss` and `exp` one hour
    /// ahead), so a backend can tell requests that came through the proxy. A route's own
    /// `sig_key=` wins. Unset by default: requests are not signed.
    grip_sig_key: Option<String> = None, secret "Key for signing Grip-Sig on proxied requests";
    /// The `iss` claim of `Grip-Sig`: what backends written for Pushpin check.
    grip_sig_iss: String = "pushpin".to_owned(), flag "Issuer of Grip-Sig (default pushpin)";
    /// Seconds a backend has for one exchange (waiting for a thread, connect, request, whole
    /// answer), counted from when the request is queued; the client then gets `504`. A bridged WebSocket whose backend times out is closed with `1011`. Long
    /// enough for a slow backend page, short enough that a hung backend cannot pile up waiting
    /// clients. At least 1.
    grip_backend_timeout: u64 = 30,
        flag "Seconds a backend has to answer a proxied request (504 after)";
    /// Threads making backend requests, each one exchange at a time with keep-alive
    /// connections. Backend answers are small and quick; a slow backend delays only what queues
    /// behind these threads (bounded by the timeout above). At least 1.
    grip_backend_threads: usize = 32, flag "Threads making backend requests";
    /// Largest backend answer, forwarded request body (`413`) and queue of WebSocket events
    /// waiting for a busy backend (`1013` over it). GRIP answers are instructions and small
    /// initial bodies, not downloads.
    grip_max_body: usize = 1024 * 1024, file;
    /// Seconds a `Grip-Hold: response` is held when the backend sends no `Grip-Timeout`
    /// (Pushpin's default).
    grip_default_timeout: u64 = 55,
        flag "Seconds a Grip-Hold: response is held without Grip-Timeout";
    // # dashboard
    /// Serve the live dashboard (`GET /dashboard`, its feed and topic lookups) on the API
    /// listener, behind `api_key` when one is set (see [dashboard.md](dashboard.md)). On by
    /// default: the API listens on loopback, and the page only reads what `/metrics` shows.
    dashboard: bool = true, switch "Serve the live dashboard on the API listener";
    /// Dashboard feeds (open dashboard tabs) at once. Each holds an API thread for as long as
    /// the tab is open (the API serves a connection per thread), so the cap keeps watchers from
    /// taking the threads publishers need; a few people watching one server is the use. Over
    /// it the feed is answered `503` and the page retries. At least 1.
    dashboard_max_feeds: usize = 8, flag "Most dashboard feeds (open tabs) at once";
    /// Seconds of once-a-second samples the dashboard keeps for its plots, so a page opened
    /// now shows the last minutes at once (about 100 bytes a sample). At least 10.
    dashboard_window: u64 = 600, flag "Seconds of history the dashboard's plots show";
    /// Require the API key (or a token whose `clarion` claim has `"admin": true`) for
    /// `GET /metrics`, as for the dashboard. Off by default so that a Prometheus on the same
    /// private network scrapes without credentials; turn it on when the API listener is
    /// reachable by people who should not see what `/metrics` shows: connection and topic
    /// counts, message rates, node names, hook and webhook outcomes (never topic names,
    /// message contents or tokens). A group's per-process listeners (loopback, ephemeral
    /// ports, scraped by the group) answer without it.
    metrics_auth: bool = false, switch "Require the API key or an admin token for /metrics";
    // # auth: JWT authentication and topic permissions (docs/auth.md).
    /// JWT authentication (see [auth.md](auth.md)): the HS256 secret tokens are signed with.
    /// Setting it (or `auth_public_key` or `auth_jwks`) turns authentication on: topics not
    /// in `auth_public_topics` then need a token that grants them, and the publish API needs
    /// `api_key` or a token that grants the topic. Unset by default: no authentication.
    auth_secret: Option<String> = None, secret "HS256 secret for client tokens (turns auth on)";
    /// The previous HS256 secret, still accepted while tokens signed with it are in use (a
    /// rotation: sign with the new `auth_secret`, keep the old one here until `exp` has passed).
    auth_previous_secret: Option<String> = None,
        secret "Previous HS256 secret, accepted during a rotation";
    /// A PEM public key (`-----BEGIN PUBLIC KEY-----`, RSA of at least 2048 bits or EC P-256)
    /// for RS256 or ES256 tokens. Read once at startup; a file that cannot be used stops
    /// startup with its name.
    auth_public_key: Option<PathBuf> = None,
        flag "PEM public key (RSA or P-256) for RS256/ES256 tokens (turns auth on)";
    /// A JSON Web Key Set file: tokens name their key with `kid`. Needs `auth_algorithm`.
    auth_jwks: Option<PathBuf> = None,
        flag "JWKS file of public keys chosen by kid (turns auth on; needs --auth-algorithm)";
    /// The one algorithm tokens may use: `HS256`, `RS256` or `ES256`. The token's own `alg`
    /// must equal it (so `none` and algorithm confusion are refused). Unset: HS256 with a
    /// secret, or the PEM key's type.
    auth_algorithm: Option<String> = None, flag "Token algorithm: HS256, RS256 or ES256";
    /// When set, a token's `aud` must name it.
    auth_audience: Option<String> = None, flag "Audience tokens must name (aud)";
    /// When set, a token's `iss` must equal it.
    auth_issuer: Option<String> = None, flag "Issuer tokens must carry (iss)";
    /// Seconds of clock difference tolerated between the token's issuer and this server, for
    /// `exp`, `nbf` and `iat`. `0` by default: `exp` means exactly what the backend wrote.
    auth_leeway: u64 = 0, flag "Seconds of clock skew tolerated for exp/nbf/iat";
    /// Topic patterns anyone may subscribe to without a token (comma-separated on the command
    /// line; an array in TOML): `news`, `public.*`, `*`. Every other topic needs a token.
    auth_public_topics: Vec<String> = Vec::new(),
        flag "Topics anyone may subscribe to (comma-separated patterns)";
    /// Whether connections without a token are allowed at all. When false, every subscription
    /// needs a valid token (public topics included), and a WebSocket without one must send an
    /// `auth` message within `handshake_timeout` seconds (else close `4002`).
    auth_anonymous: bool = true, switch "Allow connections without a token";
    /// Accept a token in the `token` query parameter (browsers' `EventSource` and `WebSocket`
    /// cannot set headers). It is never logged. Turn off to accept headers, the cookie and the
    /// `auth` message only (URLs end up in proxy logs and browser history).
    auth_query_token: bool = true, switch "Accept a token in the ?token= query parameter";
    /// The cookie that may carry a token; empty for none.
    auth_cookie: String = "clarion_token".to_owned(), flag "Cookie that may carry a token";
    /// Origins (`https://app.example.com`: scheme, host and port as a browser writes them;
    /// comma-separated on the command line) whose pages may connect with the token cookie. A
    /// browser sends cookies with any page's WebSocket and with credentialed requests, so a
    /// request that carries the cookie with an `Origin` of another site is refused `403`
    /// (cross-site WebSocket hijacking). Not affected: requests without `Origin` (not from a
    /// page, or a same-origin GET), the server's own origin (`Origin` naming the `Host`), and
    /// tokens in `Authorization`, the query or the `auth` message, which a page cannot make a
    /// browser send. `*` allows every origin. Empty by default: only the server's own pages.
    /// The same list says whose pages may publish through the API from a browser (the
    /// dashboard's own page always may; other pages get `403`, docs/security.md).
    allowed_origins: Vec<String> = Vec::new(),
        flag "Origins whose pages may use the token cookie (comma-separated; * for any)";
    /// Seconds before a WebSocket's token expires that it gets an `expiring` message, time to
    /// send a `refresh` with a fresh token. Checked by the once-a-second sweep.
    auth_expiry_warning: u64 = 30,
        flag "Seconds before exp a WebSocket is warned (expiring message)";
    // # hooks: asking the application over HTTP (docs/hooks.md).
    /// The application's `connect` hook (`http://host:port/path`): asked before a connection
    /// on any transport is accepted, with its cookies, query, selected headers and address; its
    /// answer allows or refuses it and may give its identity and topic grants. Unset by
    /// default: no hook (connections are decided by `auth_*` alone).
    hook_connect_url: Option<String> = None, secret "URL of the application's connect hook";
    /// The `subscribe` hook: asked when a connection subscribes to a topic its grants (token or
    /// `connect` answer) do not cover. Unset by default: such topics follow the `auth_*` rules.
    hook_subscribe_url: Option<String> = None, secret "URL of the application's subscribe hook";
    /// The `publish` hook: asked when a WebSocket client publishes to a topic its grants do
    /// not cover; may replace the data. Unset by default.
    hook_publish_url: Option<String> = None, secret "URL of the application's publish hook";
    /// Shared secret for the `Clarion-Signature` header (HMAC-SHA256 over timestamp and body)
    /// on every hook request, so the application can trust the caller. Unset by default:
    /// requests are not signed (fine on loopback only).
    hook_secret: Option<String> = None, secret "Secret for signing hook requests";
    /// Milliseconds a hook call may take (waiting for a thread, connect, request, whole answer),
    /// counted from when it is queued; then the failure policy applies. Long enough for a database lookup, short enough that a client's
    /// handshake does not hang on a dead backend.
    hook_timeout_ms: u64 = 3000, flag "Milliseconds a hook call may take";
    /// Threads making hook calls, each one call at a time with a keep-alive connection. The
    /// workers never wait on them. At least 1.
    hook_threads: usize = 16, flag "Threads making hook calls";
    /// Hook calls queued or in flight at once, over every worker; above it a call fails at once
    /// (failure policy) instead of queueing behind a slow backend without bound.
    hook_max_in_flight: usize = 1024, flag "Most hook calls queued or in flight";
    /// Hook calls queued or in flight at once for one client address (an IPv6 /64 counts as
    /// one); above it a `connect` is answered `429` with `Retry-After` (an SSE request, the
    /// `unavailable` stream) and a control message an error, at once. Half of `hook_threads`'
    /// default, so one address never holds more than half the threads every other client's
    /// connect waits on, yet a page opening a few connections at once fits. `0`: no limit
    /// (behind a proxy whose address every client shares).
    hook_max_in_flight_per_address: usize = 8,
        flag "Most hook calls in flight for one client address (0: no limit)";
    /// Request headers passed to the `connect` hook (names, comma-separated). Cookies and the
    /// query are always passed; `Authorization` only if listed.
    hook_headers: Vec<String> = vec!["user-agent".to_owned(), "origin".to_owned()],
        flag "Request headers passed to the connect hook";
    /// When a request carries a valid JWT: `skip` the `connect` hook (the token decides) or
    /// `call` it anyway (with `token_sub`; its answer decides).
    hook_connect_with_token: String = "skip".to_owned(),
        flag "With a valid token: skip or call the connect hook";
    /// When a hook cannot answer (down, slow, overloaded, broken answer): `refuse` (`503` with
    /// `Retry-After`, or an error reply clients retry) or `token` (allow when the request also
    /// carries a valid JWT, with that token's grants; refuse otherwise).
    hook_on_failure: String = "refuse".to_owned(), flag "When a hook fails: refuse or token";
    /// Seconds an answer is reused for the same question (the same `connect` request; the same
    /// identity and topic for `subscribe`/`publish`). `0` by default: the application decides
    /// every time, since its answer may change at any moment.
    hook_cache_ttl: u64 = 0, flag "Seconds a hook answer is cached (0: off)";
    /// Longest a refusal is cached, whatever `hook_cache_ttl` says: a user who has just been
    /// granted access should not wait long.
    hook_cache_refusal_ttl: u64 = 5, flag "Most seconds a hook refusal is cached";
    /// Largest hook answer in bytes (a publish hook's replacement data included); larger
    /// answers are a failure. Answers are small JSON objects.
    hook_max_answer: usize = 64 * 1024, file;
    /// The application's webhook (`http://host:port/path`): `connected`, `disconnected`,
    /// `topic_occupied` and `topic_vacated` events, batched, signed with `hook_secret`, retried
    /// until answered 2xx. Unset by default: no events, and no cost.
    webhook_url: Option<String> = None, secret "URL of the application's webhook (events out)";
    /// Milliseconds an event waits for others to share its request: a tenth of a second keeps
    /// presence-like views current while turning a reconnect storm into a few requests.
    webhook_batch_ms: u64 = 100, flag "Milliseconds an event waits for its batch";
    /// Most events in one webhook request (sent at once when reached).
    webhook_batch_max: usize = 1000, flag "Most events per webhook request";
    /// Most events waiting (while the application is slow or down); newer events are dropped
    /// and counted past it. About 200 bytes each: 100,000 is ~20 MB at worst.
    webhook_queue: usize = 100_000, flag "Most webhook events queued (drops past it)";
    // # presence: who is in a topic (docs/presence.md).
    /// Topics whose members are tracked (comma-separated patterns on the command line, an
    /// array in TOML; the same rules as `auth_public_topics`: `room`, `chat.*`, `*`). A
    /// connection subscribed to one is a member under its identity (the token's `sub`, or the
    /// `sub` a `connect` hook gave); several connections of one identity are one member.
    /// Empty by default: no topic pays anything for presence.
    presence_topics: Vec<String> = Vec::new(),
        flag "Topics whose members are tracked (comma-separated patterns)";
    /// Largest `info` a member may carry, in bytes of JSON (the token's `clarion.info`
    /// object, shown to everyone in the topic). A token with a larger one is refused (`401`):
    /// every join, leave and member list repeats it, so it must stay small.
    presence_max_info: usize = 512, flag "Largest member info, bytes of JSON";
    /// Most members in one member list: a page of `GET /topics/{topic}/presence`, the list a
    /// subscriber gets when it asks for presence events, and the answer to a `presence`
    /// message (each says `"more":true` and how to get the next page when there are more).
    /// Bounds the bytes one request can make the server write and hold.
    presence_max_members: usize = 1000, flag "Most members in one member list";
    /// Most presence topics one connection may be in at once: each costs a room entry and, with
    /// events, a listener entry; a connection past it is refused the subscription.
    presence_max_topics: usize = 32, flag "Most presence topics per connection";
    /// Whether a connection without an identity (no token, a token without `sub`) is listed
    /// as a member of its own, under an identity made for it (`~` and hex digits, unique to
    /// the connection), with `join` and `leave` events. Off by default: such connections are
    /// counted in `connections` but not listed.
    presence_list_anonymous: bool = false,
        switch "List connections without an identity as members (`~...` identities)";
    // # delta: delta compression of consecutive publications (docs/delta.md).
    /// Topics whose publications are also sent as deltas against the topic's previous one
    /// (comma-separated patterns on the command line, an array in TOML; the same rules as
    /// `auth_public_topics`), to subscribers that ask for them (`delta=1`, `"delta":true`).
    /// Each publication's delta is computed once on each node, whoever receives it. Empty by
    /// default: no topic pays for deltas.
    delta_topics: Vec<String> = Vec::new(),
        flag "Topics sent as deltas to subscribers that ask (comma-separated patterns)";
    // # conflation: latest wins for slow subscribers (docs/conflation.md).
    /// Conflating topics, as `[[conflate_topics]]` tables: `pattern`, `key` (a JSON pointer,
    /// `/id`, or `"field"` for the publish's `conflation_key`), and optionally `threshold`
    /// (16384 unsent bytes, from which a subscriber gets the latest message per key),
    /// `max_keys` (1000 per subscriber and topic; past it the subscriber is a slow consumer)
    /// and `max_rate` (delivery rounds per second per topic, 1 to 1000, the latest message per
    /// key winning in between; unset by default). Empty by default: every subscriber
    /// gets every message, and one that falls `max_backlog` behind is closed.
    conflate_topics: Vec<conflate::ConflateTopic> = Vec::new(), file;
    // # pusher: the Pusher Channels protocol (docs/pusher.md).
    /// Pusher applications, as `[[pusher_apps]]` tables: `id`, `key`, `secret`, and optionally
    /// `enable_client_messages` (false), `max_connections` (0: no limit of its own),
    /// `client_event_rate` (10 a second), `max_event_bytes` (10240), `max_batch_events`
    /// (10), Pusher's own defaults, and `webhook_url` (none). Empty by default: the Pusher API answers `404`.
    pusher_apps: Vec<pusher_apps::AppConfig> = Vec::new(), file;
    /// The id of one Pusher application given without a file (with `pusher_app_key` and
    /// `pusher_app_secret`; the three go together). Its limits are Pusher's defaults.
    pusher_app_id: Option<String> = None, flag "Pusher application id (with --pusher-app-key and --pusher-app-secret)";
    /// The key of the application of `pusher_app_id`.
    pusher_app_key: Option<String> = None, flag "Pusher application key";
    /// The secret of the application of `pusher_app_id` (never logged).
    pusher_app_secret: Option<String> = None, secret "Pusher application secret";
    /// Whether the application of `pusher_app_id` accepts `client-` events.
    pusher_client_messages: bool = false, switch "Let the --pusher-app-id application's clients send client- events";
    /// Where the application of `pusher_app_id` is sent Pusher's webhooks (`http://...`,
    /// docs/pusher.md "Webhooks"). Unset: none are sent.
    pusher_webhook_url: Option<String> = None, flag "URL for the --pusher-app-id application's webhooks, in Pusher's format";
    // # cluster: several processes and machines as one server (docs/cluster.md).
    /// The broker that joins this process to others: `redis://[user:pass@]host:port[/db]`
    /// (`rediss://` for TLS, see `redis_tls_*`; several, comma-separated, spread topics over them;
    /// `redis+sentinel://host1:26379,host2:26379/NAME[/db]` for the master Sentinel names, see
    /// `redis_sentinel_*`; `redis+cluster://host1:7000,host2:7001` (`rediss+cluster://`) for a
    /// Redis Cluster's seed nodes) or `nats://host:port`. Unset: this process is the whole server (ids, history and fan-out in
    /// memory, the fastest and leanest mode). With Redis, message ids are allocated per topic
    /// by Redis and history lives there, so a client resumes on any node; with NATS, messages
    /// fan out to every node but each node keeps its own ids and history.
    broker: Option<String> = None, secret "Broker joining this node to others (redis://, rediss://, redis+sentinel://, redis+cluster:// or nats://...)";
    /// This node's name in logs, metrics (`node` label), webhook connection ids and the
    /// broker's client list. Unset: `host:pid`, and a process that takes over in an upgrade
    /// keeps its predecessor's.
    node_name: Option<String> = None, flag "Node name (default host:pid)";
    /// Milliseconds a broker command may take before the node gives up on it: a publish then
    /// answers `503`, and the connection is dropped and made again (with backoff). A stalled
    /// broker costs each caller at most this long, never unbounded memory.
    broker_timeout_ms: u64 = 2000, flag "Milliseconds a broker command may take";
    /// PEM file of the CA certificates a `rediss://` broker's certificate must chain to,
    /// instead of the system's (`SSL_CERT_FILE`, else the usual bundle paths such as
    /// `/etc/ssl/certs/ca-certificates.crt`). For a Redis with a private CA.
    redis_tls_ca: Option<PathBuf> = None, flag "CA certificates (PEM) for rediss:// brokers";
    /// Client certificate chain (PEM) for a `rediss://` broker that asks for one (mutual TLS,
    /// `tls-auth-clients yes`). Goes with `redis_tls_key`.
    redis_tls_cert: Option<PathBuf> = None, flag "Client certificate (PEM) for rediss:// brokers";
    /// The private key (PEM) of `redis_tls_cert`.
    redis_tls_key: Option<PathBuf> = None, flag "Private key (PEM) for --redis-tls-cert";
    /// The name a `rediss://` broker's certificate is verified against (and sent as SNI),
    /// instead of the URL's host: for connecting by an IP address the certificate does not
    /// list. Verification itself is never turned off.
    redis_tls_server_name: Option<String> = None,
        flag "Name to verify a rediss:// broker's certificate against (default: the URL's host)";
    /// ACL user for the sentinels of a `redis+sentinel://` broker, with
    /// `redis_sentinel_password`. The URL's credentials are Redis's; the sentinels get these.
    redis_sentinel_username: Option<String> = None, flag "ACL user for a redis+sentinel:// broker's sentinels";
    /// Password for the sentinels of a `redis+sentinel://` broker (`requirepass` in
    /// sentinel.conf). Unset: the sentinels are asked without `AUTH`.
    redis_sentinel_password: Option<String> = None, secret "Password for a redis+sentinel:// broker's sentinels";
    /// Processes to run on this machine as one server (see [processes.md](processes.md)). Above
    /// 1, `clarion serve` becomes a small supervisor that starts this many `clarion serve`
    /// processes with the same configuration, sharing the client, TLS and API ports
    /// (`SO_REUSEPORT`), each named `<node_name>-<i>`, restarted when one dies, and joined
    /// through `broker` (required: without it a publish would reach one process's
    /// subscribers only). The API address then answers `/metrics` and `/healthz` for the whole
    /// group. For machines where one process cannot hold all connections (its open-files
    /// limit) or a fault should take down only part of them. At most 256.
    processes: usize = 1, flag "Processes sharing the ports as one server (needs --broker above 1)";
}

/// permessage-deflate mode (see [`Config::compression`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Never negotiated.
    Off,
    /// Compressed once per message, shared by all subscribers.
    Shared,
    /// A compression context per connection.
    Dedicated,
}

/// Why a configuration could not be used. The reasons are part of each message, not error
/// sources, so a report that walks the chain (`{:#}`) states them once.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the config file {path}: {reason}")]
    Read {
        /// The file named on the command line.
        path: String,
        /// The operating system's reason.
        reason: std::io::Error,
    },
    /// The file is not valid TOML or names an unknown option.
    #[error("invalid config file {path}: {reason}")]
    Parse {
        /// The file named on the command line.
        path: String,
        /// What the TOML parser found.
        reason: Box<toml::de::Error>,
    },
    /// The file names a key that is no setting.
    #[error("invalid config file {path}: {why}")]
    UnknownKey {
        /// The file named on the command line.
        path: String,
        /// The key, its line and the closest setting.
        why: String,
    },
    /// A value is out of its allowed range.
    #[error("invalid setting: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads a TOML file; options it does not name keep their defaults.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|reason| ConfigError::Read {
            path: path.display().to_string(),
            reason,
        })?;
        toml::from_str(&text).map_err(|reason| {
            let path = path.display().to_string();
            match file::unknown_setting(&text, &reason) {
                Some(why) => ConfigError::UnknownKey { path, why },
                None => ConfigError::Parse {
                    path,
                    reason: Box::new(reason),
                },
            }
        })
    }

    /// TLS settings, when any certificate is configured.
    pub fn tls_settings(&self) -> Option<crate::tls::Settings> {
        let mut certs = Vec::new();
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            certs.push(crate::tls::CertFiles {
                cert: cert.clone(),
                key: key.clone(),
            });
        }
        certs.extend(self.tls_certificates.iter().cloned());
        (!certs.is_empty()).then(|| crate::tls::Settings {
            certs,
            strict_sni: self.tls_strict_sni,
            tls12: self.tls_min_version == "1.2",
            http2: self.http2,
        })
    }

    /// The TLS client listener's address, when TLS is configured.
    pub fn tls_address(&self) -> Option<SocketAddr> {
        self.tls_settings()?;
        Some(
            self.tls_listen
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], limits::DEFAULT_TLS_PORT))),
        )
    }

    /// Worker count with 0 resolved to the number of cores.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// Connection cap with 0 resolved from the open-files limit.
    pub fn connection_cap(&self) -> usize {
        match self.max_connections {
            0 => {
                let files = open_files_limit().unwrap_or(limits::ASSUMED_OPEN_FILES);
                files.saturating_sub(limits::RESERVED_FILES).max(1) as usize
            }
            n => n,
        }
    }

    /// Head-parsing limits for the proto crate.
    pub fn head_limits(&self) -> clarion_proto::http1::HeadLimits {
        clarion_proto::http1::HeadLimits {
            max_request_line: self.max_request_line,
            max_headers: self.max_headers,
            max_head_bytes: self.max_head_size,
        }
    }

    /// The permessage-deflate policy for negotiation, `None` when compression is off.
    pub fn deflate_policy(&self) -> Option<clarion_proto::ws::deflate::Policy> {
        (self.compression != Compression::Off).then_some(clarion_proto::ws::deflate::Policy {
            server_context_takeover: self.compression == Compression::Dedicated,
            client_max_window_bits: self.compression_client_window_bits,
        })
    }

    /// This node's name: `node_name`, or `host:pid`.
    pub fn node(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".to_owned());
            format!("{host}:{}", std::process::id())
        })
    }

    /// How long publishes are remembered by their `Idempotency-Key`.
    pub fn idempotency(&self) -> IdempotencyLimits {
        IdempotencyLimits {
            window: Duration::from_secs(self.idempotency_window),
            keys: self.idempotency_keys,
        }
    }

    /// How appendable messages are bounded.
    pub fn streams(&self) -> StreamSettings {
        StreamSettings {
            limits: clarion_proto::pubsub::append::StreamLimits {
                max_fragments: self.stream_max_fragments,
                max_bytes: self.stream_max_bytes,
                max_open_per_topic: self.stream_max_open,
            },
            timeout: u32::try_from(self.stream_timeout).unwrap_or(u32::MAX),
        }
    }

    /// The history limits for the hub.
    pub fn history_limits(&self) -> HistoryLimits {
        HistoryLimits {
            per_topic: self.history_size,
            ttl: u32::try_from(self.history_ttl).unwrap_or(u32::MAX),
            max_bytes: self.history_memory,
        }
    }

    /// Where and how history is kept on disk, if `history_dir` is set.
    pub fn durable_history(&self) -> Option<HistoryDisk> {
        self.history_dir.as_ref().map(|dir| HistoryDisk {
            dir: dir.clone(),
            fsync_ms: self.history_fsync_ms,
            segment_bytes: self.history_segment_bytes,
            max_segment_bytes: largest_segment(
                self.history_segment_bytes,
                self.history_memory,
                self.max_publish_size,
            ),
        })
    }

    /// What a Pushpin-format publish may hold: the body is bounded by `max_publish_size` like
    /// every publish, the item count by [`limits::GRIP_PUBLISH_MAX_ITEMS`].
    pub fn grip_publish_limits(&self) -> clarion_proto::grip::PublishLimits {
        clarion_proto::grip::PublishLimits {
            max_body: self.max_publish_size,
            max_items: limits::GRIP_PUBLISH_MAX_ITEMS,
        }
    }

    /// The ping interval as a duration, `None` when pings are off.
    pub fn ping_every(&self) -> Option<Duration> {
        (self.ping_interval > 0).then(|| Duration::from_secs(self.ping_interval))
    }
}

/// How long publishes are remembered by their `Idempotency-Key` (`idempotency_window`,
/// `idempotency_keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyLimits {
    /// How long a key is remembered (zero: keys are ignored).
    pub window: Duration,
    /// Most keys one process remembers at once.
    pub keys: usize,
}

impl Default for IdempotencyLimits {
    fn default() -> IdempotencyLimits {
        Config::default().idempotency()
    }
}

/// The soft open-files limit of this process, read from `/proc` (no `unsafe` needed).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().expect("defaults validate");
    }

    #[test]
    fn file_overrides_only_what_it_names() {
        let c: Config = toml::from_str("max_backlog = 1000\necho_path = \"/echo\"").expect("toml");
        assert_eq!(c.max_backlog, 1000);
        assert_eq!(c.echo_path.as_deref(), Some("/echo"));
        assert_eq!(c.max_message_size, Config::default().max_message_size);
    }

    #[test]
    fn open_files_limit_is_read() {
        assert!(open_files_limit().is_some_and(|n| n > 0));
    }

    #[test]
    fn a_missing_file_is_reported_once() {
        let err = Config::from_file(Path::new("/nonexistent/clarion.toml")).expect_err("no file");
        let text = format!("{:#}", anyhow::Error::from(err));
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
        assert!(text.starts_with("cannot read the config file /nonexistent/clarion.toml: "));
    }

    #[test]
    fn redis_tls_settings_need_a_url_that_asks_for_tls() {
        let with = |broker: &str| Config {
            broker: Some(broker.to_owned()),
            redis_tls_ca: Some("/etc/ca.pem".into()),
            ..Config::default()
        };
        for ok in [
            "rediss://10.0.0.1:6379",
            "redis://10.0.0.1:6379,rediss://10.0.0.2:6379",
            "rediss+sentinel://10.0.0.1:26379,10.0.0.2/main",
            "rediss+cluster://10.0.0.1:7000,10.0.0.2:7000",
        ] {
            with(ok).validate().expect(ok);
        }
        for refused in ["redis://10.0.0.1:6379", "redis+cluster://10.0.0.1:7000"] {
            assert!(with(refused).validate().is_err(), "{refused}");
        }
    }

    #[test]
    fn unknown_option_is_an_error() {
        assert!(toml::from_str::<Config>("max_backlogg = 1").is_err());
    }

    #[test]
    fn grip_publish_cap_is_the_servers() {
        // proto once defaulted to 1000 items while the server promised 10 000; the server's
        // limits are now the only ones, and a publish between the two is accepted.
        let limits = Config::default().grip_publish_limits();
        assert_eq!(limits.max_items, limits::GRIP_PUBLISH_MAX_ITEMS);
        assert_eq!(limits.max_body, Config::default().max_publish_size);
        let item = r#"{"channel":"c","formats":{"http-stream":{"content":"x"}}}"#;
        let body = |n: usize| format!(r#"{{"items":[{}]}}"#, vec![item; n].join(","));
        let decode = |n| clarion_proto::grip::decode_publish(body(n).as_bytes(), &limits);
        assert_eq!(decode(1001).map(|items| items.len()).ok(), Some(1001));
        assert_eq!(
            decode(limits::GRIP_PUBLISH_MAX_ITEMS)
                .map(|items| items.len())
                .ok(),
            Some(limits::GRIP_PUBLISH_MAX_ITEMS)
        );
        assert_eq!(
            decode(limits::GRIP_PUBLISH_MAX_ITEMS + 1).err(),
            Some(clarion_proto::grip::PublishError::TooManyItems)
        );
    }

    #[test]
    fn ping_must_come_before_idle_timeout() {
        let c = Config {
            ping_interval: 120,
            idle_timeout: 60,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
