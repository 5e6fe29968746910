//! The command line: `clarion serve` and `clarion publish`.
//!
//! Precedence, lowest to highest: embedded defaults, the TOML file given with `--config`,
//! `CLARION_*` environment variables, command-line flags. Each flag has its environment variable
//! (clap reads it when the flag is absent), so both simply override the file. `serve`'s flags
//! are not written here: they come from the settings declared in [`crate::config`].

use std::path::PathBuf;

use clap::{Arg, ArgMatches, Args, FromArgMatches, Parser, Subcommand};

use crate::config::{Config, ConfigError, SETTINGS};

/// `clarion --help`'s first paragraph (the binary's command line, which adds `bench`, says it too).
pub const ABOUT: &str = "Clarion: a lean realtime push server. Clients subscribe to topics over \
                         WebSocket, Server-Sent Events, HTTP streaming or long-polling (plain or \
                         TLS); backends publish over an HTTP API (or `clarion publish`); a GRIP \
                         proxy mode stands in for Pushpin.";

/// `clarion --help`'s last paragraph.
pub const AFTER_HELP: &str = "Start with `clarion serve`, then `clarion publish TOPIC MESSAGE`. \
                              Settings: `clarion serve --help` and docs/configuration.md.";

/// The end of `clarion serve -h`: the common settings were shown, here is where the rest are.
const SERVE_SHORT_HELP: &str = "Ports: --listen :PORT --api-listen 127.0.0.1:PORT [--tls-listen \
                                :PORT], and CLARION_API=127.0.0.1:PORT for `clarion publish`.\n\
                                These are the common settings; `clarion serve --help` lists \
                                every one with its default and variable, and \
                                docs/configuration.md explains each.";

/// The end of `clarion serve --help`.
const SERVE_LONG_HELP: &str = "Every setting is also a key of the TOML file given with --config \
                               (the same name with underscores) and a CLARION_* variable; flags \
                               beat variables, which beat the file. docs/configuration.md \
                               explains each setting and its default.";

/// Clarion's server commands. The `clarion` binary adds `bench` beside them.
#[derive(Debug, Parser)]
#[command(name = "clarion", version, about = ABOUT, after_help = AFTER_HELP)]
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
    #[command(after_help = SERVE_SHORT_HELP, after_long_help = SERVE_LONG_HELP)]
    Serve(ServeArgs),
    /// Publish one message through a running server's API.
    Publish(PublishArgs),
    /// Make certificates: `clarion cert --dev` writes a local CA and a certificate for
    /// localhost, for trying https:// and wss:// on this machine.
    Cert(CertArgs),
    /// Print a signed token (JWT) for trying authentication, presence and the clients, signed
    /// with the server's auth_secret (or --private-key for RS256/ES256).
    Token(TokenArgs),
}

/// Parses the command line, or prints why it cannot and exits (status 2). A bad value that
/// came from a `CLARION_*` variable is blamed on the variable: the user never typed the flag.
/// `C` is the whole command line: [`Cli`], or the binary's, which adds `bench` to it.
pub fn parse<C: Parser>() -> C {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match C::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            let message = blame_variable(&e, &args, |name| std::env::var_os(name).is_some())
                .or_else(|| port_hint(&e));
            match message {
                Some(message) => {
                    eprint!("{message}");
                    std::process::exit(2)
                }
                None => e.exit(),
            }
        }
    }
}

/// The flags people type to change a port, which `serve` spells otherwise.
const PORT_FLAGS: &[&str] = &[
    "--port",
    "-p",
    "--api-port",
    "--tls-port",
    "--host",
    "--bind",
];

/// For an unknown `--port` (or the like): clap's message, with how ports are changed here.
fn port_hint(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = arg.split('=').next().unwrap_or(arg);
    if !PORT_FLAGS.contains(&flag) {
        return None;
    }
    let text = e.to_string();
    let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
    Some(format!(
        "{first}\n\n  tip: ports and addresses are set with --listen :PORT (clients), --api-listen \
         127.0.0.1:PORT (the API) and --tls-listen :PORT (TLS clients)\n{rest}"
    ))
}

/// For a bad value of a flag that is not on the command line but whose variable is set, clap's
/// message with the variable named instead of the flag.
fn blame_variable(
    e: &clap::Error,
    args: &[String],
    is_set: impl Fn(&str) -> bool,
) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::CommandFactory as _;
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = arg.split_whitespace().next()?;
    let long = flag.strip_prefix("--")?;
    let typed = args
        .iter()
        .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|r| r.starts_with('=')));
    if typed {
        return None;
    }
    let cli = Cli::command();
    let env = std::iter::once(&cli)
        .chain(cli.get_subcommands())
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())?;
    if !is_set(&env) {
        return None;
    }
    Some(e.to_string().replacen(
        &format!("'{arg}'"),
        &format!("{env} (the variable of {flag})"),
        1,
    ))
}

/// `clarion serve` options: `--config FILE`, and a flag for every setting declared in
/// [`crate::config`] (see docs/configuration.md), each overriding the file.
#[derive(Debug, Clone)]
pub struct ServeArgs {
    /// TOML configuration file (`--config`, `CLARION_CONFIG`).
    pub config: Option<PathBuf>,
    /// What clap found for the setting flags and their variables; applied over the file.
    settings: ArgMatches,
}

impl ServeArgs {
    /// Defaults, then the file, then flags and environment variables; validated.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        for setting in SETTINGS {
            setting
                .apply(&self.settings, &mut c)
                .map_err(|e| ConfigError::Invalid(format!("{}: {e}", setting.name)))?;
        }
        c.validate()?;
        Ok(c)
    }

    /// `--upgrade-from PID`: take over the listeners and connections of the running server
    /// `PID` (see docs/operations.md, "Upgrades that keep connections").
    pub fn upgrade_from(&self) -> Option<u32> {
        self.settings.get_one::<u32>("upgrade-from").copied()
    }

    /// `--pid-file PATH`: where a lone server writes its pid once it serves (a service manager
    /// follows an upgrade through it).
    pub fn pid_file(&self) -> Option<PathBuf> {
        self.settings.get_one::<PathBuf>("pid-file").cloned()
    }
}

// clap's derive cannot loop over a table, so `serve`'s arguments are built by hand from it.
impl FromArgMatches for ServeArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(ServeArgs {
            config: matches.get_one::<PathBuf>("config").cloned(),
            settings: matches.clone(),
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = ServeArgs::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for ServeArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let config = Arg::new("config")
            .long("config")
            .env("CLARION_CONFIG")
            .value_name("CONFIG")
            .hide_env(true)
            .help_heading("Listeners")
            .help("TOML configuration file, beneath flags and variables [env: CLARION_CONFIG]")
            .value_parser(clap::value_parser!(PathBuf));
        let upgrade = Arg::new("upgrade-from")
            .long("upgrade-from")
            .value_name("PID")
            .help_heading("Listeners")
            .help(
                "Take over the listening sockets and connections of the running server PID \
                 (same flags); it exits once they are served here",
            )
            .value_parser(clap::value_parser!(u32));
        let pid_file = Arg::new("pid-file")
            .long("pid-file")
            .value_name("PATH")
            .help_heading("Listeners")
            .help(
                "Write this process's pid here once it serves (replaced by the new process's \
                 on an upgrade that keeps connections)",
            )
            .value_parser(clap::value_parser!(PathBuf));
        cmd.arg(config)
            .arg(upgrade)
            .arg(pid_file)
            .args(SETTINGS.iter().filter_map(|s| s.arg()))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        ServeArgs::augment_args(cmd)
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
            let existing: Vec<String> = files
                .iter()
                .filter(|f| f.exists())
                .map(|f| f.display().to_string())
                .collect();
            if !existing.is_empty() {
                // Running it again is the common case, not a failure: the files are there.
                println!(
                    "{} already exist{} and {} kept (--force makes new ones)",
                    existing.join(", "),
                    if existing.len() == 1 { "s" } else { "" },
                    if existing.len() == 1 { "is" } else { "are" },
                );
                return Ok(());
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
    /// The server's API listener: host:port, http://host:port[/prefix], or https://host:port
    /// for an API served over TLS (`serve --tls-api`).
    #[arg(long, env = "CLARION_API", default_value = "http://127.0.0.1:8081")]
    pub api: String,
    /// For https://: PEM file of the CA certificates to trust instead of the system's
    /// (`clarion cert --dev` writes clarion-dev-tls/ca.pem).
    #[arg(long, env = "CLARION_CACERT", value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Bearer key, if the server requires one.
    #[arg(long, env = "CLARION_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Send the message as binary (application/octet-stream) instead of text.
    #[arg(long)]
    pub binary: bool,
    /// Seconds, in all, for which a publish answered 503 with Retry-After (an upgrade in
    /// progress, a broker away: nothing was published) is sent again after the wait the
    /// header asks; 0 never retries. An upgrade's freeze lasts well under a second.
    #[arg(
        long,
        env = "CLARION_RETRY_FOR",
        default_value_t = 10,
        value_name = "SECONDS"
    )]
    pub retry_for: u64,
    /// Sent as Idempotency-Key (1 to 128 characters ! to ~): a publish repeating a key the
    /// topic saw within the server's idempotency_window is not delivered again, and its
    /// answer is the first one's id with "repeat": true. Give the same key to a script's own
    /// retries; by default each run makes a random one, kept for its 503 retries.
    #[arg(long, env = "CLARION_IDEMPOTENCY_KEY", value_name = "KEY")]
    pub idempotency_key: Option<String>,
}

/// `clarion token` options: who the token is for, what it grants, and the key to sign with.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// Who the token is for (`sub`): presence and hooks show it.
    #[arg(long)]
    pub sub: Option<String>,
    /// Topic patterns it may subscribe to (`news`, `chat.*`, `*`); repeat or comma-separate.
    #[arg(long, value_delimiter = ',', value_name = "PATTERN")]
    pub subscribe: Vec<String>,
    /// Topic patterns it may publish to, in-band or through the API; repeat or comma-separate.
    #[arg(long, value_delimiter = ',', value_name = "PATTERN")]
    pub publish: Vec<String>,
    /// An operator's token: the dashboard, and publishing to any topic through the API.
    #[arg(long)]
    pub admin: bool,
    /// What presence shows of the holder: a JSON object, such as '{"name":"Alice"}'.
    #[arg(long, value_name = "JSON")]
    pub info: Option<String>,
    /// How long it is valid: 90s, 15m, 1h, 7d.
    #[arg(long, default_value = "1h")]
    pub ttl: String,
    /// The server's HS256 secret (its auth_secret).
    #[arg(long, env = "CLARION_AUTH_SECRET", hide_env_values = true)]
    pub auth_secret: Option<String>,
    /// A PEM private key (PKCS#8, or PKCS#1 RSA) whose public half is the server's
    /// auth_public_key or in its auth_jwks: signs RS256 or ES256.
    #[arg(long, value_name = "FILE")]
    pub private_key: Option<PathBuf>,
    /// The key's id, for a server that reads a key set (auth_jwks).
    #[arg(long)]
    pub kid: Option<String>,
    /// `aud`, when the server checks one (default: the config file's auth_audience).
    #[arg(long, env = "CLARION_AUTH_AUDIENCE")]
    pub audience: Option<String>,
    /// `iss`, when the server checks one (default: the config file's auth_issuer).
    #[arg(long, env = "CLARION_AUTH_ISSUER")]
    pub issuer: Option<String>,
    /// The server's TOML file, to take auth_secret, auth_audience and auth_issuer from.
    #[arg(long, env = "CLARION_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::Compression;

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
    fn every_flag_sets_its_setting() {
        // Each flag given its default's text must parse and land in its own field: proves the
        // parser and the reader of every declared flag agree on the type.
        let defaults = Config::default();
        let mut args: Vec<String> = Vec::new();
        for s in SETTINGS {
            let (Some(flag), value) = (s.flag(), s.value_in(&defaults)) else {
                continue;
            };
            if value != "none" {
                args.push(format!("{flag}={}", value.trim_matches('"')));
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let c = serve(&args).resolve().expect("valid");
        assert_eq!(format!("{c:?}"), format!("{defaults:?}"));
        let c = serve(&[
            "--tls-api=false",
            "--compression",
            "dedicated",
            "--workers",
            "3",
        ]);
        let c = c.resolve().expect("valid");
        assert_eq!(
            (c.tls_api, c.compression, c.workers),
            (false, Compression::Dedicated, 3)
        );
    }

    #[test]
    fn flags_beat_variables_beat_the_file() {
        // Only this test sets CLARION_SSE_RETRY; every other test that parses `serve` and
        // compares sse_retry passes --sse-retry itself.
        let file = std::env::temp_dir().join(format!("clarion-cli-{}.toml", std::process::id()));
        std::fs::write(&file, "sse_retry = 7\nsse_keepalive = 9\n").unwrap();
        let path = file.to_str().unwrap();
        std::env::set_var("CLARION_SSE_RETRY", "1234");
        let from_env = serve(&["--config", path]).resolve();
        let from_flag = serve(&["--config", path, "--sse-retry", "5"]).resolve();
        std::env::remove_var("CLARION_SSE_RETRY");
        std::fs::remove_file(&file).unwrap();
        let (from_env, from_flag) = (from_env.unwrap(), from_flag.unwrap());
        assert_eq!((from_env.sse_retry, from_env.sse_keepalive), (1234, 9));
        assert_eq!((from_flag.sse_retry, from_flag.sse_keepalive), (5, 9));
    }

    #[test]
    fn listen_flags_take_a_bare_port_and_host_names() {
        let c = serve(&["--listen", ":18080", "--api-listen", "localhost:18081"])
            .resolve()
            .expect("valid");
        assert_eq!(c.listen, std::net::SocketAddr::from(([0, 0, 0, 0], 18080)));
        assert!(c.api_listen.ip().is_loopback() && c.api_listen.port() == 18081);
        let err = Cli::try_parse_from(["clarion", "serve", "--listen", "18080"]).unwrap_err();
        assert!(
            err.to_string().contains("give ip:port, host:port or :port"),
            "{err}"
        );
    }

    #[test]
    fn file_only_settings_have_no_flag() {
        let cli = Cli::try_parse_from(["clarion", "serve", "--max-headers", "10"]);
        assert!(cli.is_err());
        let cli = Cli::try_parse_from(["clarion", "serve", "--grip-max-body", "10"]);
        assert!(cli.is_err());
    }

    #[test]
    fn bad_values_name_the_flag() {
        let err = Cli::try_parse_from(["clarion", "serve", "--max-backlog", "nope"]).unwrap_err();
        assert!(
            err.to_string().contains("--max-backlog <MAX_BACKLOG>"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_variable_is_named_not_its_flag() {
        let args = ["clarion", "serve"].map(String::from);
        // What clap reports for CLARION_MAX_BACKLOG=lots is what it reports for the flag.
        let err = Cli::try_parse_from(["clarion", "serve", "--max-backlog", "lots"]).unwrap_err();
        let text = blame_variable(&err, &args, |v| v == "CLARION_MAX_BACKLOG").unwrap();
        assert!(
            text.contains(
                "invalid value 'lots' for CLARION_MAX_BACKLOG (the variable of --max-backlog)"
            ),
            "{text}"
        );
        assert!(!text.contains("<MAX_BACKLOG>"), "{text}");
        // Typed on the command line, or the variable unset: clap's own message stands.
        let typed = ["clarion", "serve", "--max-backlog=lots"].map(String::from);
        assert!(blame_variable(&err, &typed, |_| true).is_none());
        assert!(blame_variable(&err, &args, |_| false).is_none());
        let err = Cli::try_parse_from(["clarion", "serve", "--compression", "max"]).unwrap_err();
        let text = blame_variable(&err, &args, |v| v == "CLARION_COMPRESSION").unwrap();
        assert!(
            text.contains("for CLARION_COMPRESSION (the variable of --compression)"),
            "{text}"
        );
    }

    #[test]
    fn port_flags_point_at_listen() {
        for flag in ["--port", "--port=9000", "-p"] {
            let err = Cli::try_parse_from(["clarion", "serve", flag, "9000"]).unwrap_err();
            let text = port_hint(&err).unwrap();
            assert!(
                text.contains("--listen :PORT") && text.contains("--api-listen"),
                "{text}"
            );
        }
        let err = Cli::try_parse_from(["clarion", "serve", "--nope"]).unwrap_err();
        assert!(port_hint(&err).is_none());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn invalid_combination_is_refused() {
        assert!(serve(&["--echo-path", "/ws"]).resolve().is_err());
        assert!(serve(&["--ping-interval", "200"]).resolve().is_err());
    }
}
