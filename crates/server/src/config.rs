//! Server configuration: embedded defaults, overridden by a TOML file, then by `CLARION_*`
//! environment variables and command-line flags (see [`crate::cli`]).
//!
//! Every limit lives here with its default and the reason for it; no other module invents a
//! number. `docs/configuration.md` is the user-facing copy of this file.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// Everything `clarion serve` can be told. Field docs state the default and why.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Client listener (WebSocket). Default `0.0.0.0:8080`: clients come from anywhere.
    pub listen: SocketAddr,
    /// API listener (publish, health, metrics). Default `127.0.0.1:8081`, so publishing is never
    /// exposed to the network by accident.
    pub api_listen: SocketAddr,
    /// Event-loop threads. Default 0 = one per core: each loop is single-threaded and owns its
    /// connections, so more loops than cores only adds context switches.
    pub workers: usize,
    /// Most client connections held at once; over it new connections get 503. Default 0 = as many
    /// as the process may open files (minus a reserve for listeners and the API).
    pub max_connections: usize,
    /// Most connections from one client address (an IPv4 address, or an IPv6 /64); over it new
    /// connections get 429. Default 1024: far above what one browser opens (Chrome allows 255
    /// WebSockets per profile), low enough that one host cannot take the whole server; raise it
    /// for clients behind a large NAT, 0 disables.
    pub max_connections_per_address: usize,
    /// Most connections still sending a request head (or idle between keep-alive requests);
    /// over it new connections get 503. Default 4096: a connect storm of real clients passes in
    /// well under a second, while a slowloris flood cannot hold more than this.
    pub max_handshakes: usize,
    /// Largest WebSocket message a client may send, in bytes (close 1009 over it). Default 64 KiB:
    /// clients of a push server send small control messages; µWebSockets defaults to 16 KiB.
    pub max_message_size: usize,
    /// Unsent bytes a connection may owe before it is closed as a slow consumer (1008). Default
    /// 64 KiB, µWebSockets' default: a few seconds of a busy feed, and a hard cap on the memory one
    /// client that stopped reading can pin.
    pub max_backlog: usize,
    /// Largest message the publish API accepts, in bytes (413 over it). Default 1 MiB: bigger
    /// payloads belong in object storage, with a link in the message.
    pub max_publish_size: usize,
    /// Topics one connection may subscribe to. Default 64: enough for any dashboard, and it bounds
    /// the subscriber-index memory one client can claim.
    pub max_subscriptions: usize,
    /// Seconds of silence from a client before the server pings it. Default 60; 0 disables pings
    /// (conformance runs). Pings keep NAT and proxy mappings alive and reveal dead peers.
    pub ping_interval: u64,
    /// Seconds of silence after which a connection is closed. Default 120 (µWebSockets' default):
    /// two ping intervals, so a live client always answers in time.
    pub idle_timeout: u64,
    /// Seconds a new connection has to complete its request head and upgrade. Default 10: enough
    /// for a slow mobile link, short enough that slowloris clients cannot pile up.
    pub handshake_timeout: u64,
    /// Seconds a graceful shutdown waits for close handshakes and buffers to drain. Default 10.
    pub shutdown_timeout: u64,
    /// Path of the WebSocket pub/sub endpoint. Default `/ws`.
    pub ws_path: String,
    /// permessage-deflate for WebSockets: `off`, `shared` (default: each published message is
    /// compressed once, without context takeover, and the same bytes go to every subscriber that
    /// negotiated it) or `dedicated` (each connection keeps its own compression context; better
    /// ratios for streams of similar messages, at a per-connection memory and CPU cost).
    pub compression: Compression,
    /// Messages shorter than this many bytes are sent uncompressed. Default 128: below that,
    /// deflate saves little and costs a frame's worth of CPU.
    pub compression_threshold: usize,
    /// zlib level, 1 (fast) to 9 (small). Default 6: in shared mode a message is compressed
    /// once for all its subscribers, so the better ratio is cheap.
    pub compression_level: u32,
    /// LZ77 window of a dedicated-mode compressor, 9 to 15 bits. Default 12 (4 KiB): most of
    /// the gain on similar JSON messages, a fraction of the memory of 15.
    pub compression_window_bits: u8,
    /// Most connections with a dedicated compressor at once (about 200 KiB each). Default 1000:
    /// at most about 200 MiB. Connections past it get the shared frames (compressing without
    /// context is always allowed), so the limit bounds memory without refusing anyone.
    pub compression_dedicated_limit: usize,
    /// Window asked of clients that let the server choose (`client_max_window_bits`), 9 to 15.
    /// Default 12: a client that keeps compression context (browsers do) costs an inflater of
    /// this window, allocated only once it sends a compressed message.
    pub compression_client_window_bits: u8,
    /// Path of the Server-Sent Events endpoint. Default `/sse`.
    pub sse_path: String,
    /// Path of the long-polling endpoint. Default `/poll`.
    pub poll_path: String,
    /// Path of the newline-delimited HTTP streaming endpoint. Default `/stream`.
    pub stream_path: String,
    /// Seconds without output after which an SSE or HTTP stream gets a keep-alive line. Default
    /// 20: under the 30 to 60 s idle limits of common proxies and load balancers; 0 disables.
    pub sse_keepalive: u64,
    /// Milliseconds an `EventSource` should wait before reconnecting (the `retry:` hint). Default
    /// 2000: fast recovery without a reconnect storm after a restart.
    pub sse_retry: u64,
    /// Seconds a long-poll is held when the client does not say (`timeout=`). Default 30: below
    /// the 60 s at which many proxies give up on a silent response.
    pub poll_timeout: u64,
    /// Longest `timeout=` a long-poll client may ask for, in seconds. Default 120.
    pub poll_max_timeout: u64,
    /// Messages of history kept per topic for resuming clients. Default 100; 0 disables history
    /// (and with it gap-free resume and catch-up between long-polls).
    pub history_size: usize,
    /// Seconds a message stays in history. Default 3600: a client offline for longer is told it
    /// missed messages rather than flooded with stale ones.
    pub history_ttl: u64,
    /// Bytes of history across all topics; the oldest messages are dropped first. Default
    /// 64 MiB.
    pub history_memory: usize,
    /// `Access-Control-Allow-Origin` sent on SSE, stream and long-poll answers, so pages on other
    /// origins can subscribe. Default `*` (subscriptions carry no credentials); empty disables.
    pub cors_allow_origin: String,
    /// Path of a WebSocket echo endpoint for conformance runs. Default none (off).
    pub echo_path: Option<String>,
    /// Whether clients may publish in-band. Default false: publishing is a backend's job.
    pub allow_client_publish: bool,
    /// Bearer key required by the publish API. Default none (the API listens on loopback).
    pub api_key: Option<String>,
    /// Longest request line (414 over it). Default 8 KiB, as common proxies use.
    pub max_request_line: usize,
    /// Most request headers (431 over it). Default 64: browsers send about 15.
    pub max_headers: usize,
    /// Largest request head in bytes (431 over it). Default 16 KiB.
    pub max_head_size: usize,
    /// Bytes a worker reads from a socket at once (one buffer per worker, not per connection).
    /// Default 64 KiB: one large TCP segment train per system call.
    pub read_buffer: usize,
    /// TLS client listener (HTTPS and WSS; every transport works on it). Default none; when a
    /// certificate is configured without it, `0.0.0.0:8443`. Runs beside `listen`.
    pub tls_listen: Option<SocketAddr>,
    /// Certificate chain (PEM) of the default certificate; `tls_key` is its key.
    pub tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) for `tls_cert`.
    pub tls_key: Option<std::path::PathBuf>,
    /// More certificates, chosen by the name a client asks for (SNI):
    /// `[[tls_certificates]]` tables with `cert` and `key`. The first valid for the name wins;
    /// `tls_cert` is tried first and is the default.
    pub tls_certificates: Vec<crate::tls::CertFiles>,
    /// Refuse handshakes for names no certificate covers (alert `unrecognized_name`) instead of
    /// answering with the default certificate. Default false. Clients that send no SNI (by IP
    /// address) always get the default certificate.
    pub tls_strict_sni: bool,
    /// Lowest TLS version: `"1.2"` (default: TLS 1.2 clients still exist, e.g. older Android)
    /// or `"1.3"`.
    pub tls_min_version: String,
    /// Serve the API listener over TLS too, with the same certificates. Default false: the API
    /// listens on loopback by default.
    pub tls_api: bool,
    /// Seconds between checks for changed certificate files (re-read without a restart, like
    /// SIGHUP). Default 10; 0 checks only on SIGHUP.
    pub tls_reload_interval: u64,
    /// GRIP proxy mode: a routes file in Pushpin's syntax (`docs/grip.md`). Requests that match a
    /// route are proxied to its backend, which may hold them open with `Grip-*` headers. Default
    /// none: no proxying.
    pub grip_routes: Option<std::path::PathBuf>,
    /// Key for signing `Grip-Sig` on proxied requests (HS256), unless the route has its own
    /// `sig_key`. Default none: requests are not signed.
    pub grip_sig_key: Option<String>,
    /// Issuer (`iss`) of `Grip-Sig`. Default `"pushpin"`, what backends written for Pushpin
    /// expect when they check it.
    pub grip_sig_iss: String,
    /// Seconds a backend has to answer a proxied request (504 after it). Default 30: long
    /// enough for a slow backend page, short enough that a hung backend cannot pile up waiting
    /// clients.
    pub grip_backend_timeout: u64,
    /// Threads making backend requests (each waits on one request at a time). Default 32: backend
    /// requests are short (a subscription answer, a WebSocket event batch), and a stuck backend
    /// delays only what waits behind these threads.
    pub grip_backend_threads: usize,
    /// Largest backend answer or proxied request body, in bytes (502/413 over it). Default 1 MiB:
    /// GRIP answers are instructions and small initial bodies, not downloads.
    pub grip_max_body: usize,
    /// Seconds a `Grip-Hold: response` is held when the backend gives no `Grip-Timeout`.
    /// Default 55, Pushpin's.
    pub grip_default_timeout: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            api_listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            workers: 0,
            max_connections: 0,
            max_connections_per_address: 1024,
            max_handshakes: 4096,
            max_message_size: 64 * 1024,
            max_backlog: 64 * 1024,
            max_publish_size: 1024 * 1024,
            max_subscriptions: 64,
            ping_interval: 60,
            idle_timeout: 120,
            handshake_timeout: 10,
            shutdown_timeout: 10,
            ws_path: "/ws".to_owned(),
            compression: Compression::Shared,
            compression_threshold: 128,
            compression_level: 6,
            compression_window_bits: 12,
            compression_dedicated_limit: 1000,
            compression_client_window_bits: 12,
            sse_path: "/sse".to_owned(),
            poll_path: "/poll".to_owned(),
            stream_path: "/stream".to_owned(),
            sse_keepalive: 20,
            sse_retry: 2000,
            poll_timeout: 30,
            poll_max_timeout: 120,
            history_size: 100,
            history_ttl: 3600,
            history_memory: 64 * 1024 * 1024,
            cors_allow_origin: "*".to_owned(),
            echo_path: None,
            allow_client_publish: false,
            api_key: None,
            max_request_line: 8 * 1024,
            max_headers: 64,
            max_head_size: 16 * 1024,
            read_buffer: 64 * 1024,
            tls_listen: None,
            tls_cert: None,
            tls_key: None,
            tls_certificates: Vec::new(),
            tls_strict_sni: false,
            tls_min_version: "1.2".to_owned(),
            tls_api: false,
            tls_reload_interval: 10,
            grip_routes: None,
            grip_sig_key: None,
            grip_sig_iss: "pushpin".to_owned(),
            grip_backend_timeout: 30,
            grip_backend_threads: 32,
            grip_max_body: 1024 * 1024,
            grip_default_timeout: 55,
        }
    }
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

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file named on the command line.
        path: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The file is not valid TOML or names an unknown option.
    #[error("invalid config {path}: {source}")]
    Parse {
        /// The file named on the command line.
        path: String,
        /// What the TOML parser found.
        source: Box<toml::de::Error>,
    },
    /// A value is out of its allowed range.
    #[error("invalid setting: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads a TOML file; options it does not name keep their defaults.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source: Box::new(source),
        })
    }

    /// Checks relations between values that each parse fine on their own.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let paths = [
            ("ws_path", Some(&self.ws_path)),
            ("sse_path", Some(&self.sse_path)),
            ("poll_path", Some(&self.poll_path)),
            ("stream_path", Some(&self.stream_path)),
            ("echo_path", self.echo_path.as_ref()),
        ];
        for (i, (name, path)) in paths.iter().enumerate() {
            let Some(p) = path else { continue };
            if !p.starts_with('/') {
                return Err(ConfigError::Invalid(format!("{name} must start with '/'")));
            }
            for (other, q) in paths.iter().skip(i + 1) {
                if q.is_some_and(|q| q == *p) {
                    return Err(ConfigError::Invalid(format!(
                        "{name} and {other} must differ"
                    )));
                }
            }
        }
        if !(1..=9).contains(&self.compression_level)
            || !(9..=15).contains(&self.compression_window_bits)
            || !(9..=15).contains(&self.compression_client_window_bits)
        {
            return Err(ConfigError::Invalid(
                "compression_level is 1 to 9; compression_window_bits and \
                 compression_client_window_bits are 9 to 15"
                    .into(),
            ));
        }
        if self.poll_timeout > self.poll_max_timeout {
            return Err(ConfigError::Invalid(
                "poll_timeout must not exceed poll_max_timeout".into(),
            ));
        }
        if self.poll_max_timeout > 3600 || self.history_ttl > u64::from(u32::MAX) {
            return Err(ConfigError::Invalid(
                "poll_max_timeout is at most 3600 s and history_ttl at most 2^32 s".into(),
            ));
        }
        if self
            .cors_allow_origin
            .bytes()
            .any(|b| b < 0x20 || b == 0x7f)
        {
            return Err(ConfigError::Invalid(
                "cors_allow_origin must not contain control characters".into(),
            ));
        }
        if self.max_message_size == 0 || self.max_backlog == 0 || self.read_buffer < 1024 {
            return Err(ConfigError::Invalid(
                "max_message_size and max_backlog must be > 0, read_buffer >= 1024".into(),
            ));
        }
        if self.ping_interval > 0
            && self.idle_timeout > 0
            && self.ping_interval >= self.idle_timeout
        {
            return Err(ConfigError::Invalid(
                "ping_interval must be below idle_timeout".into(),
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "tls_cert and tls_key go together".into(),
            ));
        }
        if self.grip_backend_threads == 0 || self.grip_backend_timeout == 0 {
            return Err(ConfigError::Invalid(
                "grip_backend_threads and grip_backend_timeout must be at least 1".into(),
            ));
        }
        if !matches!(self.tls_min_version.as_str(), "1.2" | "1.3") {
            return Err(ConfigError::Invalid(
                "tls_min_version is \"1.2\" or \"1.3\"".into(),
            ));
        }
        let certs = self.tls_settings().map_or(0, |s| s.certs.len());
        if certs == 0 && (self.tls_listen.is_some() || self.tls_api) {
            return Err(ConfigError::Invalid(
                "tls_listen and tls_api need a certificate (tls_cert and tls_key)".into(),
            ));
        }
        Ok(())
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
        })
    }

    /// The TLS client listener's address, when TLS is configured.
    pub fn tls_address(&self) -> Option<SocketAddr> {
        self.tls_settings()?;
        Some(
            self.tls_listen
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8443))),
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
        // Listeners, the API, epoll and wakers need descriptors too.
        const RESERVE: u64 = 64;
        match self.max_connections {
            0 => {
                let files = open_files_limit().unwrap_or(1024);
                files.saturating_sub(RESERVE).max(1) as usize
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

    /// The history limits for the hub.
    pub fn history_limits(&self) -> HistoryLimits {
        HistoryLimits {
            per_topic: self.history_size,
            ttl: u32::try_from(self.history_ttl).unwrap_or(u32::MAX),
            max_bytes: self.history_memory,
        }
    }

    /// The ping interval as a duration, `None` when pings are off.
    pub fn ping_every(&self) -> Option<Duration> {
        (self.ping_interval > 0).then(|| Duration::from_secs(self.ping_interval))
    }
}

/// How much history the hub keeps (from `history_size`, `history_ttl` and `history_memory`).
/// Any of the three limits trims it. Declared here, not in the hub, so configuration depends on
/// nothing above it.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    /// Most messages kept per topic (0 = no history).
    pub per_topic: usize,
    /// Seconds a message is kept after it was published (0 = no history).
    pub ttl: u32,
    /// Bytes of history across all topics (see `Published::cost`); the oldest messages go
    /// first.
    pub max_bytes: usize,
}

impl HistoryLimits {
    /// Whether history is kept at all (every limit is above zero).
    pub fn enabled(&self) -> bool {
        self.per_topic > 0 && self.ttl > 0 && self.max_bytes > 0
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
    fn unknown_option_is_an_error() {
        assert!(toml::from_str::<Config>("max_backlogg = 1").is_err());
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
