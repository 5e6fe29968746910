//! How a setting is declared. The `settings!` macro turns one entry per setting into
//! everything that names it: the [`Config`] field with its doc and default, the TOML key (the
//! field name, through serde), the `clarion serve` flag `--key-with-dashes` and its
//! `CLARION_KEY` environment variable (clap arguments built from [`SETTINGS`]), and the row of
//! the settings table in `docs/configuration.md` ([`docs_table`]).
//!
//! This module owns only that plumbing; which settings exist, their defaults and how they are
//! checked together are in the parent module.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::ValueParser;
use clap::parser::MatchesError;
use clap::ArgMatches;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use super::{Compression, Config, SETTINGS};

/// Declares the settings. Each entry is
///
/// ```text
/// /// Description: the docs row and the field's rustdoc (say why the default is what it is).
/// name: Type = default_expression, SOURCE "short --help line";
/// ```
///
/// where SOURCE is `flag` (`--name VALUE`, `CLARION_NAME`), `switch` (a boolean flag: `--name`
/// alone means true), `secret` (a flag whose variable's value `--help` never shows) or `file`
/// (TOML only: structured values, and limits too rarely changed to deserve a flag).
macro_rules! settings {
    (@help) => { "" };
    (@help $help:literal) => { $help };
    (@source flag) => { $crate::config::declare::Source::Flag };
    (@source switch) => { $crate::config::declare::Source::Switch };
    (@source secret) => { $crate::config::declare::Source::Secret };
    (@source file) => { $crate::config::declare::Source::FileOnly };
    (@secret secret) => { true };
    (@secret $source:ident) => { false };
    (@parser file $ty:ty) => { None };
    (@parser $source:ident $ty:ty) => {
        Some(<$ty as $crate::config::declare::FlagValue>::parser)
    };
    (@apply file $name:ident $ty:ty) => { |_, _| Ok(()) };
    (@apply $source:ident $name:ident $ty:ty) => {
        |matches, config| {
            type Parsed = <$ty as $crate::config::declare::FlagValue>::Parsed;
            if let Some(v) = matches.try_get_one::<Parsed>(stringify!($name))? {
                config.$name = <$ty as $crate::config::declare::FlagValue>::from_parsed(v.clone());
            }
            Ok(())
        }
    };
    ($(
        $(#[doc = $doc:literal])*
        $name:ident : $ty:ty = $default:expr, $source:ident $($help:literal)?;
    )*) => {
        /// Everything `clarion serve` can be told: one field per declaration in
        /// `config/mod.rs`, whose doc states the default and why.
        #[derive(Clone, serde::Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Config {
            $(
                $(#[doc = $doc])*
                #[serde(deserialize_with = "crate::config::declare::from_file")]
                pub $name: $ty,
            )*
        }

        /// Every setting, with the value of a `secret` one hidden and the passwords, tokens
        /// and query values of URLs in the others ([`crate::redact`]).
        impl std::fmt::Debug for Config {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let mut d = f.debug_struct("Config");
                $(
                    d.field(
                        stringify!($name),
                        &$crate::config::declare::Shown {
                            secret: settings!(@secret $source),
                            value: &self.$name,
                        },
                    );
                )*
                d.finish()
            }
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $( $name: $default, )* }
            }
        }

        /// Every setting, in declaration order (the order of the docs table and `--help`).
        pub static SETTINGS: &[$crate::config::declare::Setting] = &[$(
            $crate::config::declare::Setting {
                name: stringify!($name),
                help: settings!(@help $($help)?),
                doc: &[$($doc),*],
                source: settings!(@source $source),
                parser: settings!(@parser $source $ty),
                apply: settings!(@apply $source $name $ty),
                default: |config| $crate::config::declare::TomlValue::toml(&config.$name),
            },
        )*];
    };
}

/// A setting's value in `Config`'s `Debug`: a secret one as `***` (`None` when unset), the
/// others with the secrets of their URLs hidden.
pub struct Shown<'a> {
    /// Declared `secret`.
    pub secret: bool,
    /// The value.
    pub value: &'a dyn std::fmt::Debug,
}

impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = if f.alternate() {
            format!("{:#?}", self.value)
        } else {
            format!("{:?}", self.value)
        };
        if self.secret && text != "None" {
            return f.write_str(crate::redact::HIDDEN);
        }
        f.write_str(&crate::redact::urls(&text))
    }
}

/// Where a setting can be given besides the TOML file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--name VALUE` or `CLARION_NAME=VALUE`.
    Flag,
    /// A boolean: `--name` alone means true, `--name=false` or `CLARION_NAME=false` false.
    Switch,
    /// Like `Flag`, but `--help` never shows the variable's value (keys).
    Secret,
    /// Only in the TOML file.
    FileOnly,
}

/// One declared setting: what clap and the docs need to know about it.
pub struct Setting {
    /// The field name and TOML key.
    pub name: &'static str,
    /// The one-line `--help` text (empty for file-only settings).
    pub help: &'static str,
    /// The description, one doc-comment line per element.
    pub doc: &'static [&'static str],
    /// Where it can be given.
    pub source: Source,
    /// The flag's value parser; `None` for file-only settings.
    pub(super) parser: Option<fn() -> ValueParser>,
    /// Copies the flag's (or variable's) value into a config, when one was given.
    pub(super) apply: fn(&ArgMatches, &mut Config) -> Result<(), MatchesError>,
    /// The setting's value in a config, written as in a TOML file.
    pub(super) default: fn(&Config) -> String,
}

impl Setting {
    /// `--name-with-dashes`, unless the setting is file-only.
    pub fn flag(&self) -> Option<String> {
        (self.source != Source::FileOnly).then(|| format!("--{}", self.name.replace('_', "-")))
    }

    /// `CLARION_NAME`, unless the setting is file-only.
    pub fn env(&self) -> Option<String> {
        (self.source != Source::FileOnly)
            .then(|| format!("CLARION_{}", self.name.to_ascii_uppercase()))
    }

    /// The clap argument for `clarion serve`, unless the setting is file-only.
    pub fn arg(&self) -> Option<clap::Arg> {
        let (parser, env) = (self.parser?, self.env()?);
        // clap would print `[env: NAME=]` for an unset variable, which reads as "set to
        // empty", and no default (a clap default would override the file): both are written
        // into the help text instead.
        let default = self.value_in(&Config::default());
        let default = match default.as_str() {
            "none" => "unset".to_owned(),
            d => d.trim_matches('"').to_owned(),
        };
        let common = COMMON.iter().find(|(name, _)| *name == self.name);
        let arg = clap::Arg::new(self.name)
            .long(self.name.replace('_', "-"))
            .env(&env)
            .hide_env(true)
            .value_name(self.name.to_ascii_uppercase())
            .help(format!("{} [default: {default}] [env: {env}]", self.help))
            .help_heading(common.map_or(MORE_HEADING, |(_, heading)| *heading))
            .hide_short_help(common.is_none())
            .value_parser(parser());
        Some(match self.source {
            Source::Switch => arg.num_args(0..=1).default_missing_value("true"),
            Source::Secret => arg.hide_env_values(true),
            Source::Flag | Source::FileOnly => arg,
        })
    }

    /// Sets the value given by flag or environment in `matches`, if any.
    pub fn apply(&self, matches: &ArgMatches, config: &mut Config) -> Result<(), MatchesError> {
        (self.apply)(matches, config)
    }

    /// The setting's value in `config`, as a TOML value (`none` when unset).
    pub fn value_in(&self, config: &Config) -> String {
        (self.default)(config)
    }

    /// The description as one paragraph.
    pub fn description(&self) -> String {
        let lines: Vec<&str> = self.doc.iter().map(|l| l.trim()).collect();
        lines.join(" ")
    }
}

/// The settings `clarion serve -h` shows, under their headings: the ten a newcomer changes
/// first. `--help` shows every setting; the rest come under [`MORE_HEADING`].
pub const COMMON: &[(&str, &str)] = &[
    ("listen", "Listeners"),
    ("api_listen", "Listeners"),
    ("tls_listen", "Listeners"),
    ("tls_cert", "Listeners"),
    ("tls_key", "Listeners"),
    ("api_key", "Access"),
    ("auth_secret", "Access"),
    ("broker", "Scale"),
    ("processes", "Scale"),
    ("workers", "Scale"),
];

/// The heading of every setting not in [`COMMON`] (shown by `--help` only).
pub const MORE_HEADING: &str = "More settings (docs/configuration.md explains each)";

/// A setting type a flag or environment variable can set: how clap parses it, and how the
/// parsed value becomes the setting's (an optional setting becomes `Some`).
pub trait FlagValue {
    /// What clap's parser yields.
    type Parsed: Clone + Send + Sync + 'static;
    /// The parser clap's derive would choose for this type, so errors read the same.
    fn parser() -> ValueParser;
    /// The setting's value for a parsed flag.
    fn from_parsed(parsed: Self::Parsed) -> Self;
}

macro_rules! plain_flag_values {
    ($($ty:ty),*) => {$(
        impl FlagValue for $ty {
            type Parsed = $ty;
            fn parser() -> ValueParser {
                clap::value_parser!($ty).into()
            }
            fn from_parsed(parsed: $ty) -> $ty {
                parsed
            }
        }
    )*};
}
plain_flag_values!(usize, u64, u32, u8, bool, String, PathBuf, Compression);

/// An address as users type it (see [`parse_listen`]).
impl FlagValue for SocketAddr {
    type Parsed = SocketAddr;
    fn parser() -> ValueParser {
        ValueParser::new(parse_listen)
    }
    fn from_parsed(parsed: SocketAddr) -> SocketAddr {
        parsed
    }
}

/// A listen address: `ip:port` (`[v6]:port`), `:port` or `*:port` for every interface
/// (`0.0.0.0`), or `host:port` with a name, resolved now. A name with several addresses
/// (`localhost` is often `::1` and `127.0.0.1`) is bound at its first one, and a warning says
/// which one and what is left out.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let usage = || format!("{text:?} is not an address: give ip:port, host:port or :port");
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(usage());
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{text:?} has no valid port (0 to 65535 after the last ':')"))?;
    if host.is_empty() || host == "*" {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if host.contains(|c: char| c.is_whitespace() || c == '/' || c == '[' || c == ']') {
        return Err(usage());
    }
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
        .collect();
    let Some(&first) = addrs.first() else {
        return Err(format!("{host:?} has no address"));
    };
    if addrs.len() > 1 {
        let all: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
        crate::log::warn(format_args!(
            "{text} has {} addresses ({}); listening on the first only, {first}: give an \
             address (ip:port, or :port for all interfaces) to choose",
            addrs.len(),
            all.join(", ")
        ));
    }
    Ok(first)
}

/// A list of names, comma-separated on the command line (`a,b.*`), an array in TOML.
impl FlagValue for Vec<String> {
    type Parsed = String;
    fn parser() -> ValueParser {
        clap::value_parser!(String)
    }
    fn from_parsed(parsed: String) -> Self {
        // A TOML array (`["a", "b.*"]`, as the docs show defaults) is accepted too.
        if parsed.trim_start().starts_with('[') {
            if let Ok(t) = toml::from_str::<toml::Table>(&format!("v = {parsed}")) {
                if let Some(toml::Value::Array(items)) = t.get("v") {
                    return items
                        .iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect();
                }
            }
        }
        parsed
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl<T: FlagValue> FlagValue for Option<T> {
    type Parsed = T::Parsed;
    fn parser() -> ValueParser {
        T::parser()
    }
    fn from_parsed(parsed: T::Parsed) -> Self {
        Some(T::from_parsed(parsed))
    }
}

/// A setting's value written as in a TOML file, for the docs' default column.
pub trait TomlValue {
    /// The value as TOML (`none` for an unset optional setting).
    fn toml(&self) -> String;

    /// Reads the value from a config file: as serde derives it, unless the type is typed by
    /// people in another form too (addresses: see [`parse_listen`]).
    fn from_file<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>
    where
        Self: Sized + Deserialize<'de>,
    {
        Self::deserialize(d)
    }
}

/// Reads every setting from a config file (the `deserialize_with` of each `Config` field).
pub fn from_file<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TomlValue + Deserialize<'de>,
{
    T::from_file(d)
}

/// A value read through [`TomlValue::from_file`], so an optional setting reads its inner value
/// the same way.
struct FileValue<T>(T);

impl<'de, T: TomlValue + DeserializeOwned> Deserialize<'de> for FileValue<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::from_file(d).map(FileValue)
    }
}

macro_rules! display_toml_values {
    ($($ty:ty),*) => {$(
        impl TomlValue for $ty {
            fn toml(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
display_toml_values!(usize, u64, u32, u8, bool);

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

impl TomlValue for String {
    fn toml(&self) -> String {
        toml_string(self)
    }
}

impl TomlValue for SocketAddr {
    fn toml(&self) -> String {
        toml_string(&self.to_string())
    }

    fn from_file<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_listen(&text).map_err(serde::de::Error::custom)
    }
}

impl TomlValue for PathBuf {
    fn toml(&self) -> String {
        toml_string(&self.display().to_string())
    }
}

impl TomlValue for Compression {
    fn toml(&self) -> String {
        let name = match self {
            Compression::Off => "off",
            Compression::Shared => "shared",
            Compression::Dedicated => "dedicated",
        };
        toml_string(name)
    }
}

impl<T: TomlValue + DeserializeOwned> TomlValue for Option<T> {
    fn toml(&self) -> String {
        self.as_ref().map_or_else(|| "none".to_owned(), T::toml)
    }

    fn from_file<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<FileValue<T>>::deserialize(d).map(|v| v.map(|v| v.0))
    }
}

impl TomlValue for Vec<String> {
    fn toml(&self) -> String {
        let items: Vec<String> = self.iter().map(|s| toml_string(s)).collect();
        format!("[{}]", items.join(", "))
    }
}

impl TomlValue for Vec<crate::tls::CertFiles> {
    fn toml(&self) -> String {
        let tables: Vec<String> = self
            .iter()
            .map(|c| format!("{{ cert = {}, key = {} }}", c.cert.toml(), c.key.toml()))
            .collect();
        format!("[{}]", tables.join(", "))
    }
}

impl TomlValue for Vec<super::conflate::ConflateTopic> {
    fn toml(&self) -> String {
        let tables: Vec<String> = self
            .iter()
            .map(|t| {
                let rate = t
                    .max_rate
                    .map(|r| format!(", max_rate = {r}"))
                    .unwrap_or_default();
                format!(
                    "{{ pattern = {}, key = {}, threshold = {}, max_keys = {}{rate} }}",
                    toml_string(&t.pattern),
                    toml_string(&t.key),
                    t.threshold,
                    t.max_keys
                )
            })
            .collect();
        format!("[{}]", tables.join(", "))
    }
}

/// Applications as inline tables, their secrets hidden (this renders defaults and docs).
impl TomlValue for Vec<super::pusher_apps::AppConfig> {
    fn toml(&self) -> String {
        let tables: Vec<String> = self
            .iter()
            .map(|a| {
                format!(
                    "{{ id = {}, key = {}, secret = {} }}",
                    toml_string(&a.id),
                    toml_string(&a.key),
                    toml_string(crate::redact::HIDDEN)
                )
            })
            .collect();
        format!("[{}]", tables.join(", "))
    }
}

/// The marker before the generated table in `docs/configuration.md`.
pub const TABLE_BEGIN: &str = "<!-- settings table: generated from crates/server/src/config/mod.rs; \
                               regenerate with `UPDATE_DOCS=1 cargo test -p clarion-server --lib config` -->";
/// The marker after it.
pub const TABLE_END: &str = "<!-- end of settings table -->";

/// The settings table of `docs/configuration.md`: key, flag, environment variable, default and
/// description of every setting, in declaration order.
pub fn docs_table() -> String {
    let defaults = Config::default();
    let mut out = String::from(
        "| key | flag | environment | default | description |\n|---|---|---|---|---|\n",
    );
    let code = |s: &str| format!("`{}`", s.replace('|', "\\|"));
    for s in SETTINGS {
        let flag = match (s.source, s.flag()) {
            (Source::Switch, Some(f)) => code(&format!("{f}[=true|false]")),
            (_, Some(f)) => code(&f),
            (_, None) => "file only".to_owned(),
        };
        let env = s.env().map_or_else(|| "—".to_owned(), |e| code(&e));
        let default = match s.value_in(&defaults) {
            none if none == "none" => none,
            value => code(&value),
        };
        out.push_str(&format!(
            "| `{}` | {flag} | {env} | {default} | {} |\n",
            s.name,
            s.description().replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");

    /// `docs/configuration.md` split around its generated table.
    fn docs_parts(text: &str) -> (&str, &str, &str) {
        let begin = text
            .find(TABLE_BEGIN)
            .expect("begin marker in docs/configuration.md");
        let start = begin + TABLE_BEGIN.len() + 1;
        let end = text[start..].find(TABLE_END).expect("end marker") + start;
        (&text[..start], &text[start..end], &text[end..])
    }

    #[test]
    fn docs_table_matches_the_declarations() {
        let text = std::fs::read_to_string(DOCS).expect("docs/configuration.md");
        let (before, table, after) = docs_parts(&text);
        let expected = docs_table();
        if table == expected {
            return;
        }
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(DOCS, format!("{before}{expected}{after}")).expect("write docs");
            return;
        }
        panic!(
            "docs/configuration.md's settings table differs from the declarations in \
             crates/server/src/config/mod.rs.\nRegenerate it with \
             `UPDATE_DOCS=1 cargo test -p clarion-server --lib config`; the table should read:\n\n\
             {expected}"
        );
    }

    #[test]
    fn a_debug_printed_config_shows_no_secret() {
        let config = Config {
            broker: Some("rediss://:broker-pw@h:6380".into()),
            api_key: Some("the-api-key".into()),
            auth_secret: Some("the-auth-secret".into()),
            redis_sentinel_password: Some("sentinel-pw".into()),
            webhook_url: Some("http://app/events?token=webhook-token".into()),
            hook_connect_url: Some("http://app/connect?token=hook-token".into()),
            ..Config::default()
        };
        for text in [format!("{config:?}"), format!("{config:#?}")] {
            for secret in [
                "broker-pw",
                "the-api-key",
                "the-auth-secret",
                "sentinel-pw",
                "webhook-token",
                "hook-token",
            ] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            assert!(text.contains("api_key: ***"), "{text}");
            assert!(text.contains("grip_sig_key: None"), "{text}");
        }
    }

    #[test]
    fn docs_example_file_holds_every_key_with_its_default() {
        let text = std::fs::read_to_string(DOCS).expect("docs/configuration.md");
        let start = text.find("```toml\n").expect("a ```toml example") + "```toml\n".len();
        let example = &text[start..start + text[start..].find("```").expect("closing fence")];
        let parsed: Config = toml::from_str(example).expect("the example parses");
        assert_eq!(format!("{parsed:?}"), format!("{:?}", Config::default()));
        for s in SETTINGS {
            let named = example.lines().any(|l| {
                let l = l.trim_start_matches("# ");
                l.starts_with(s.name) && l[s.name.len()..].starts_with(" =")
            });
            assert!(
                named,
                "the example file in docs/configuration.md lacks {}",
                s.name
            );
        }
    }

    #[test]
    fn names_follow_the_key() {
        let s = SETTINGS
            .iter()
            .find(|s| s.name == "max_connections_per_address");
        let s = s.unwrap();
        assert_eq!(s.flag().as_deref(), Some("--max-connections-per-address"));
        assert_eq!(
            s.env().as_deref(),
            Some("CLARION_MAX_CONNECTIONS_PER_ADDRESS")
        );
        let file_only = SETTINGS
            .iter()
            .find(|s| s.name == "tls_certificates")
            .unwrap();
        assert_eq!((file_only.flag(), file_only.arg().is_none()), (None, true));
    }

    #[test]
    fn every_setting_has_a_description_and_every_flag_a_help_line() {
        for s in SETTINGS {
            assert!(!s.description().is_empty(), "{} has no description", s.name);
            assert_eq!(
                s.help.is_empty(),
                s.source == Source::FileOnly,
                "{}: flags have a help line, file-only settings none",
                s.name
            );
        }
    }

    #[test]
    fn addresses_are_read_as_people_type_them() {
        let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
        assert_eq!(parse_listen(":18080"), Ok(any(18080)));
        assert_eq!(parse_listen("*:18080"), Ok(any(18080)));
        assert_eq!(
            parse_listen(" 127.0.0.1:1 "),
            Ok(SocketAddr::from(([127, 0, 0, 1], 1)))
        );
        assert_eq!(parse_listen("[::1]:2").map(|a| a.is_ipv6()), Ok(true));
        let local = parse_listen("localhost:18080").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 18080, "{local}");
        assert!(parse_listen("localhost")
            .unwrap_err()
            .contains("give ip:port, host:port or :port"));
        assert!(parse_listen(":http").unwrap_err().contains("no valid port"));
        assert!(parse_listen("no-such-host.invalid:80")
            .unwrap_err()
            .contains("cannot resolve"));
    }

    #[test]
    fn config_files_take_the_same_address_forms() {
        let c: Config = toml::from_str(
            "listen = \":18080\"\napi_listen = \"localhost:18081\"\ntls_listen = \"*:18443\"\n",
        )
        .unwrap();
        assert_eq!(c.listen, SocketAddr::from(([0, 0, 0, 0], 18080)));
        assert!(c.api_listen.ip().is_loopback() && c.api_listen.port() == 18081);
        assert_eq!(c.tls_listen, Some(SocketAddr::from(([0, 0, 0, 0], 18443))));
        // Settings of other types read as before; a bad address names its line.
        let c: Config = toml::from_str("workers = 3\ntls_cert = \"a.pem\"").unwrap();
        assert_eq!((c.workers, c.tls_cert), (3, Some(PathBuf::from("a.pem"))));
        let err = toml::from_str::<Config>("workers = 1\nlisten = \"8080\"").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(
            err.to_string().contains("give ip:port, host:port or :port"),
            "{err}"
        );
    }

    #[test]
    fn defaults_render_as_toml() {
        let c = Config::default();
        let value = |name: &str| {
            let s = SETTINGS.iter().find(|s| s.name == name).unwrap();
            s.value_in(&c)
        };
        assert_eq!(value("listen"), "\"0.0.0.0:8080\"");
        assert_eq!(value("max_backlog"), "65536");
        assert_eq!(value("compression"), "\"shared\"");
        assert_eq!(value("echo_path"), "none");
        assert_eq!(value("tls_certificates"), "[]");
        assert_eq!(value("allow_client_publish"), "false");
    }
}
