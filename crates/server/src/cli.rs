//! The command line: `clarion serve` and `clarion publish`.
//!
//! Precedence, lowest to highest: embedded defaults, the TOML file given with `--config`,
//! `CLARION_*` environment variables, command-line flags. Each flag has its environment variable
//! (clap reads it when the flag is absent), so both simply override the file.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError};

/// Clarion: a lean realtime push server.
#[derive(Debug, Parser)]
#[command(name = "clarion", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
// Parsed once at startup; boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (defaults: clients on 0.0.0.0:8080, API on 127.0.0.1:8081).
    Serve(ServeArgs),
    /// Publish one message through a running server's API.
    Publish(PublishArgs),
    /// Make certificates: `clarion cert --dev` writes a local CA and a certificate for
    /// localhost, for trying https:// and wss:// on this machine.
    Cert(CertArgs),
    /// Load-test a running server: many connections, every delivery checked (docs/benchmarks.md).
    Bench(clarion_bench::BenchArgs),
    /// One load-generating process of `clarion bench` (started by it; reads its job on stdin).
    #[command(hide = true)]
    BenchWorker,
}

/// `clarion serve` options; each overrides the config file. See docs/configuration.md.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "CLARION_CONFIG")]
    pub config: Option<PathBuf>,
    /// Client listener address.
    #[arg(long, env = "CLARION_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// API listener address (publish, health, metrics).
    #[arg(long, env = "CLARION_API_LISTEN")]
    pub api_listen: Option<std::net::SocketAddr>,
    /// Event-loop threads (0 = one per core).
    #[arg(long, env = "CLARION_WORKERS")]
    pub workers: Option<usize>,
    /// Most client connections (0 = from the open-files limit).
    #[arg(long, env = "CLARION_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most connections from one address (IPv4, or IPv6 /64); 0 = no limit.
    #[arg(long, env = "CLARION_MAX_CONNECTIONS_PER_ADDRESS")]
    pub max_connections_per_address: Option<usize>,
    /// Most connections still sending their request head.
    #[arg(long, env = "CLARION_MAX_HANDSHAKES")]
    pub max_handshakes: Option<usize>,
    /// Largest WebSocket message a client may send, in bytes.
    #[arg(long, env = "CLARION_MAX_MESSAGE_SIZE")]
    pub max_message_size: Option<usize>,
    /// Unsent bytes per connection before it is closed as a slow consumer.
    #[arg(long, env = "CLARION_MAX_BACKLOG")]
    pub max_backlog: Option<usize>,
    /// Largest message (request body) the publish API accepts, in bytes.
    #[arg(long, env = "CLARION_MAX_PUBLISH_SIZE")]
    pub max_publish_size: Option<usize>,
    /// Topics one connection may subscribe to.
    #[arg(long, env = "CLARION_MAX_SUBSCRIPTIONS")]
    pub max_subscriptions: Option<usize>,
    /// Seconds of client silence before a ping (0 = no pings).
    #[arg(long, env = "CLARION_PING_INTERVAL")]
    pub ping_interval: Option<u64>,
    /// Seconds of client silence before the connection is closed (0 = never).
    #[arg(long, env = "CLARION_IDLE_TIMEOUT")]
    pub idle_timeout: Option<u64>,
    /// Seconds to complete a request head or upgrade.
    #[arg(long, env = "CLARION_HANDSHAKE_TIMEOUT")]
    pub handshake_timeout: Option<u64>,
    /// Seconds a graceful shutdown waits for connections to close.
    #[arg(long, env = "CLARION_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Option<u64>,
    /// Path of the pub/sub WebSocket endpoint.
    #[arg(long, env = "CLARION_WS_PATH")]
    pub ws_path: Option<String>,
    /// permessage-deflate: off, shared (compress once per message) or dedicated.
    #[arg(long, env = "CLARION_COMPRESSION")]
    pub compression: Option<crate::config::Compression>,
    /// Messages shorter than this are sent uncompressed.
    #[arg(long, env = "CLARION_COMPRESSION_THRESHOLD")]
    pub compression_threshold: Option<usize>,
    /// zlib level 1-9.
    #[arg(long, env = "CLARION_COMPRESSION_LEVEL")]
    pub compression_level: Option<u32>,
    /// Window bits (9-15) of a dedicated-mode compressor.
    #[arg(long, env = "CLARION_COMPRESSION_WINDOW_BITS")]
    pub compression_window_bits: Option<u8>,
    /// Most connections with a dedicated compressor at once.
    #[arg(long, env = "CLARION_COMPRESSION_DEDICATED_LIMIT")]
    pub compression_dedicated_limit: Option<usize>,
    /// Window bits (9-15) asked of clients that let the server choose.
    #[arg(long, env = "CLARION_COMPRESSION_CLIENT_WINDOW_BITS")]
    pub compression_client_window_bits: Option<u8>,
    /// Path of the Server-Sent Events endpoint.
    #[arg(long, env = "CLARION_SSE_PATH")]
    pub sse_path: Option<String>,
    /// Path of the long-polling endpoint.
    #[arg(long, env = "CLARION_POLL_PATH")]
    pub poll_path: Option<String>,
    /// Path of the newline-delimited streaming endpoint.
    #[arg(long, env = "CLARION_STREAM_PATH")]
    pub stream_path: Option<String>,
    /// Seconds of silence before an SSE or HTTP stream gets a keep-alive line (0 = never).
    #[arg(long, env = "CLARION_SSE_KEEPALIVE")]
    pub sse_keepalive: Option<u64>,
    /// The `retry:` hint sent to EventSource clients, in milliseconds.
    #[arg(long, env = "CLARION_SSE_RETRY")]
    pub sse_retry: Option<u64>,
    /// Seconds a long-poll is held by default.
    #[arg(long, env = "CLARION_POLL_TIMEOUT")]
    pub poll_timeout: Option<u64>,
    /// Longest hold a long-poll client may ask for, in seconds.
    #[arg(long, env = "CLARION_POLL_MAX_TIMEOUT")]
    pub poll_max_timeout: Option<u64>,
    /// Messages of history kept per topic (0 = no history).
    #[arg(long, env = "CLARION_HISTORY_SIZE")]
    pub history_size: Option<usize>,
    /// Seconds a message stays in history.
    #[arg(long, env = "CLARION_HISTORY_TTL")]
    pub history_ttl: Option<u64>,
    /// Bytes of history across all topics.
    #[arg(long, env = "CLARION_HISTORY_MEMORY")]
    pub history_memory: Option<usize>,
    /// Access-Control-Allow-Origin for SSE, stream and poll answers (empty = none).
    #[arg(long, env = "CLARION_CORS_ALLOW_ORIGIN")]
    pub cors_allow_origin: Option<String>,
    /// Path of a WebSocket echo endpoint (off unless given; for conformance runs).
    #[arg(long, env = "CLARION_ECHO_PATH")]
    pub echo_path: Option<String>,
    /// Let clients publish in-band (`--allow-client-publish` or `=true/false`).
    #[arg(long, env = "CLARION_ALLOW_CLIENT_PUBLISH", num_args = 0..=1, default_missing_value = "true")]
    pub allow_client_publish: Option<bool>,
    /// Bearer key the publish API requires.
    #[arg(long, env = "CLARION_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Bytes read from a socket at once (one buffer per worker).
    #[arg(long, env = "CLARION_READ_BUFFER")]
    pub read_buffer: Option<usize>,
    /// TLS client listener address (default 0.0.0.0:8443 once a certificate is given).
    #[arg(long, env = "CLARION_TLS_LISTEN")]
    pub tls_listen: Option<std::net::SocketAddr>,
    /// Certificate chain (PEM) for TLS; see `clarion cert --dev`.
    #[arg(long, env = "CLARION_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) for --tls-cert.
    #[arg(long, env = "CLARION_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Refuse TLS handshakes for names no certificate covers.
    #[arg(long, env = "CLARION_TLS_STRICT_SNI", num_args = 0..=1, default_missing_value = "true")]
    pub tls_strict_sni: Option<bool>,
    /// Lowest TLS version, 1.2 or 1.3.
    #[arg(long, env = "CLARION_TLS_MIN_VERSION")]
    pub tls_min_version: Option<String>,
    /// Serve the API over TLS too.
    #[arg(long, env = "CLARION_TLS_API", num_args = 0..=1, default_missing_value = "true")]
    pub tls_api: Option<bool>,
    /// Seconds between checks for changed certificate files (0 = SIGHUP only).
    #[arg(long, env = "CLARION_TLS_RELOAD_INTERVAL")]
    pub tls_reload_interval: Option<u64>,
    /// GRIP proxy mode: a routes file in Pushpin's syntax (see docs/grip.md).
    #[arg(long, env = "CLARION_GRIP_ROUTES")]
    pub grip_routes: Option<PathBuf>,
    /// Key for signing Grip-Sig on proxied requests.
    #[arg(long, env = "CLARION_GRIP_SIG_KEY", hide_env_values = true)]
    pub grip_sig_key: Option<String>,
    /// Issuer of Grip-Sig (default pushpin).
    #[arg(long, env = "CLARION_GRIP_SIG_ISS")]
    pub grip_sig_iss: Option<String>,
    /// Seconds a backend has to answer a proxied request (504 after).
    #[arg(long, env = "CLARION_GRIP_BACKEND_TIMEOUT")]
    pub grip_backend_timeout: Option<u64>,
    /// Threads making backend requests.
    #[arg(long, env = "CLARION_GRIP_BACKEND_THREADS")]
    pub grip_backend_threads: Option<usize>,
    /// Seconds a Grip-Hold: response is held without Grip-Timeout.
    #[arg(long, env = "CLARION_GRIP_DEFAULT_TIMEOUT")]
    pub grip_default_timeout: Option<u64>,
}

impl ServeArgs {
    /// Defaults, then the file, then these overrides; validated.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = &self.$f { c.$f = v.clone(); } )* };
        }
        set!(
            listen,
            api_listen,
            workers,
            max_connections,
            max_connections_per_address,
            max_handshakes,
            max_message_size,
            max_backlog,
            max_publish_size,
            max_subscriptions,
            ping_interval,
            idle_timeout,
            handshake_timeout,
            shutdown_timeout,
            ws_path,
            compression,
            compression_threshold,
            compression_level,
            compression_window_bits,
            compression_dedicated_limit,
            compression_client_window_bits,
            sse_path,
            poll_path,
            stream_path,
            sse_keepalive,
            sse_retry,
            poll_timeout,
            poll_max_timeout,
            history_size,
            history_ttl,
            history_memory,
            cors_allow_origin,
            allow_client_publish,
            read_buffer,
            tls_strict_sni,
            tls_min_version,
            tls_api,
            tls_reload_interval,
            grip_sig_iss,
            grip_backend_timeout,
            grip_backend_threads,
            grip_default_timeout
        );
        if self.grip_routes.is_some() {
            c.grip_routes = self.grip_routes.clone();
        }
        if self.grip_sig_key.is_some() {
            c.grip_sig_key = self.grip_sig_key.clone();
        }
        if self.tls_listen.is_some() {
            c.tls_listen = self.tls_listen;
        }
        if self.tls_cert.is_some() {
            c.tls_cert = self.tls_cert.clone();
        }
        if self.tls_key.is_some() {
            c.tls_key = self.tls_key.clone();
        }
        if self.echo_path.is_some() {
            c.echo_path = self.echo_path.clone();
        }
        if self.api_key.is_some() {
            c.api_key = self.api_key.clone();
        }
        c.validate()?;
        Ok(c)
    }
}

/// `clarion cert` options.
#[derive(Debug, Args)]
pub struct CertArgs {
    /// Make a development CA and a certificate it signs for localhost, 127.0.0.1 and ::1.
    #[arg(long, required = true)]
    pub dev: bool,
    /// Directory to write `ca.pem`, `cert.pem` and `key.pem` into (created if missing).
    #[arg(long, default_value = "clarion-dev-tls")]
    pub dir: PathBuf,
    /// More names (DNS names or IP addresses) the certificate should cover.
    #[arg(long = "name")]
    pub names: Vec<String>,
    /// Replace existing files.
    #[arg(long)]
    pub force: bool,
}

impl CertArgs {
    /// Writes the files and prints how to use them.
    pub fn run(&self) -> anyhow::Result<()> {
        use anyhow::Context as _;
        let files = ["ca.pem", "cert.pem", "key.pem"].map(|f| self.dir.join(f));
        if !self.force {
            if let Some(f) = files.iter().find(|f| f.exists()) {
                anyhow::bail!("{} exists (use --force to replace)", f.display());
            }
        }
        let dev = crate::tls::dev_cert(&self.names).context("cannot make the certificate")?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let [ca, cert, key] = &files;
        std::fs::write(ca, &dev.ca_pem)?;
        std::fs::write(cert, &dev.chain_pem)?;
        write_private(key, &dev.key_pem)?;
        println!(
            "wrote {ca} (give to clients), {cert} and {key} (the server's)\n\
             serve:  clarion serve --tls-cert {cert} --tls-key {key}\n\
             try:    curl --cacert {ca} -N 'https://localhost:8443/sse?topic=demo'",
            ca = ca.display(),
            cert = cert.display(),
            key = key.display(),
        );
        Ok(())
    }
}

/// Writes a private key readable by its owner only.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// `clarion publish` options.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// Topic to publish to.
    pub topic: String,
    /// The message; `-` or absent reads it from standard input.
    pub message: Option<String>,
    /// Base URL of the server's API.
    #[arg(long, env = "CLARION_API", default_value = "http://127.0.0.1:8081")]
    pub api: String,
    /// Bearer key, if the server requires one.
    #[arg(long, env = "CLARION_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Send the message as binary (application/octet-stream) instead of text.
    #[arg(long)]
    pub binary: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> ServeArgs {
        let cli = Cli::try_parse_from([&["clarion", "serve"], args].concat()).expect("parse");
        match cli.command {
            Command::Serve(s) => s,
            _ => panic!("not serve"),
        }
    }

    #[test]
    fn flags_override_defaults() {
        let c = serve(&[
            "--max-backlog",
            "1000",
            "--allow-client-publish",
            "--echo-path",
            "/echo",
        ])
        .resolve()
        .expect("valid");
        assert_eq!(c.max_backlog, 1000);
        assert!(c.allow_client_publish);
        assert_eq!(c.echo_path.as_deref(), Some("/echo"));
        assert_eq!(c.ws_path, "/ws");
    }

    #[test]
    fn invalid_combination_is_refused() {
        assert!(serve(&["--echo-path", "/ws"]).resolve().is_err());
        assert!(serve(&["--ping-interval", "200"]).resolve().is_err());
    }
}
