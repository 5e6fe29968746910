//! `clarion serve --processes N`: several processes on one machine acting as one server.
//!
//! With `processes` above 1, `clarion serve` is a small supervisor ([`supervise`]): it checks
//! that no other process holds the ports ([`guard`]), reserves them, and starts N copies of
//! its own binary with the same command line and environment, plus a group identity in
//! variables of its own ([`Member`]). Each member binds the client, TLS and API ports with
//! `SO_REUSEPORT` (the kernel spreads connections and publishers over them), takes the node
//! name `<node_name>-<i>`, and opens a private loopback API address that it reports in its
//! ready line. The supervisor restarts a member that dies (with a bounded backoff), stops them
//! all on SIGTERM/SIGINT, and keeps a small file listing every member's state and private
//! address ([`nodes`]). The members see each other's publishes only through the configured
//! broker; this module knows nothing of it.
//!
//! One address for the group's numbers: `/metrics` and `/healthz` on the shared API port
//! (whichever member accepts) scrape every member's private address ([`scrape`]) and merge the
//! answers ([`merge`]): every sample once per member with a `node` label, and the group total
//! without it.
//!
//! This module owns the process group only: it names `config` and `log`, and nothing that
//! serves clients (the server and the API call into it, never the other way).

pub mod guard;
pub mod merge;
pub mod nodes;
pub mod scrape;
mod supervisor;

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;

pub use supervisor::supervise;

use crate::config::Config;
use crate::log;

/// The variables a supervisor gives its members. Not `CLARION_*`: they are not settings a user
/// sets, and they must not be mistaken for (or warned about as) misspelt ones.
const ENV_INDEX: &str = "_CLARION_GROUP_INDEX";
const ENV_NODE: &str = "_CLARION_GROUP_NODE";
const ENV_DIR: &str = "_CLARION_GROUP_DIR";
const ENV_LISTEN: &str = "_CLARION_GROUP_LISTEN";
const ENV_TLS_LISTEN: &str = "_CLARION_GROUP_TLS_LISTEN";
const ENV_API_LISTEN: &str = "_CLARION_GROUP_API_LISTEN";
/// Set on a rolling upgrade's successor: the pid of the member it takes the connections of.
const ENV_UPGRADE_FROM: &str = "_CLARION_GROUP_UPGRADE_FROM";

/// The member this process replaces in a rolling upgrade (`None` at an ordinary start).
pub fn upgrade_from() -> Option<u32> {
    std::env::var(ENV_UPGRADE_FROM).ok()?.parse().ok()
}

/// Why a group could not be formed or joined.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// A group variable set by the supervisor does not parse (set by hand, or another version).
    #[error("{var}={value:?} is not valid (it is set by `clarion serve --processes`)")]
    BadVariable {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
}

/// What this `clarion serve` is.
#[derive(Debug)]
pub enum Role {
    /// One process, the whole server (`processes = 1`).
    Single,
    /// The supervisor of a group (`processes` above 1).
    Supervisor,
    /// A member started by a supervisor.
    Member(Member),
}

impl Role {
    /// The role given by the environment (a member) or the configuration.
    pub fn of(config: &Config) -> Result<Role, GroupError> {
        if let Some(member) = Member::from_env()? {
            return Ok(Role::Member(member));
        }
        Ok(if config.processes > 1 {
            Role::Supervisor
        } else {
            Role::Single
        })
    }
}

/// A member's identity in its group, passed by the supervisor in the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its place in the group, from 0.
    pub index: usize,
    /// Its node name, `<node_name>-<index>`.
    pub node: String,
    /// The supervisor's directory (holds the [`nodes`] file).
    pub dir: PathBuf,
    /// The shared client address, port resolved.
    pub listen: SocketAddr,
    /// The shared TLS address, when TLS is configured.
    pub tls_listen: Option<SocketAddr>,
    /// The shared API address, port resolved.
    pub api_listen: SocketAddr,
}

impl Member {
    /// The identity in this process's environment, `None` outside a group.
    pub fn from_env() -> Result<Option<Member>, GroupError> {
        let Ok(index) = std::env::var(ENV_INDEX) else {
            return Ok(None);
        };
        let var = |name: &'static str| std::env::var(name).unwrap_or_default();
        let bad = |var: &'static str, value: String| GroupError::BadVariable { var, value };
        let addr = |name: &'static str| -> Result<SocketAddr, GroupError> {
            let v = var(name);
            v.parse().map_err(|_| bad(name, v))
        };
        let tls = var(ENV_TLS_LISTEN);
        Ok(Some(Member {
            index: index.parse().map_err(|_| bad(ENV_INDEX, index.clone()))?,
            node: var(ENV_NODE),
            dir: PathBuf::from(var(ENV_DIR)),
            listen: addr(ENV_LISTEN)?,
            tls_listen: match tls.as_str() {
                "" => None,
                _ => Some(tls.parse().map_err(|_| bad(ENV_TLS_LISTEN, tls.clone()))?),
            },
            api_listen: addr(ENV_API_LISTEN)?,
        }))
    }

    /// The variables that make a child this member.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (ENV_INDEX, self.index.to_string()),
            (ENV_NODE, self.node.clone()),
            (ENV_DIR, self.dir.display().to_string()),
            (ENV_LISTEN, self.listen.to_string()),
            (
                ENV_TLS_LISTEN,
                self.tls_listen.map(|a| a.to_string()).unwrap_or_default(),
            ),
            (ENV_API_LISTEN, self.api_listen.to_string()),
        ]
    }

    /// The member's configuration: the group's, with the resolved shared addresses, its own
    /// node name, and (when `workers = 0`) its share of the cores, so N processes do not start
    /// N event loops per core between them.
    pub fn apply(&self, mut config: Config) -> Config {
        config.listen = self.listen;
        config.api_listen = self.api_listen;
        if self.tls_listen.is_some() {
            config.tls_listen = self.tls_listen;
        }
        config.node_name = Some(self.node.clone());
        if config.workers == 0 {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            config.workers = (cores / config.processes.max(1)).max(1);
        }
        config
    }

    /// The group's [`nodes`] file.
    pub fn nodes_file(&self) -> PathBuf {
        nodes::path(&self.dir)
    }

    /// Stops this member gracefully when its supervisor goes away, however it goes: the
    /// supervisor holds the write end of this process's standard input, so reading it ends
    /// only when the supervisor closes it (to stop the group) or dies (even by `kill -9`, when
    /// the kernel closes its descriptors). Then this member raises SIGTERM against itself and
    /// takes the ordinary shutdown path. Call once the SIGTERM handler is installed. Unlike
    /// `PR_SET_PDEATHSIG` this needs no `unsafe`, and it does not depend on which of the
    /// supervisor's threads started the member.
    ///
    /// The same pipe carries the supervisor's SIGHUP: each [`RELOAD`] byte raises SIGHUP here
    /// when `reloads` (a TLS reloader handles it), and is ignored otherwise (SIGHUP's default
    /// action would end the process). A [`RESTART`] byte raises SIGUSR2, which the server
    /// handles (its stop is then a restart); the end of the pipe follows it.
    pub fn watch_supervisor(&self, reloads: bool) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("clarion-group-watch".into())
            .stack_size(crate::config::limits::HELPER_THREAD_STACK)
            .spawn(move || {
                let mut stdin = std::io::stdin().lock();
                let mut buf = [0u8; 64];
                while let Ok(n @ 1..) = stdin.read(&mut buf) {
                    let got = buf.get(..n).unwrap_or_default();
                    if got.contains(&RELOAD) && reloads {
                        let _ = signal_hook::low_level::raise(signal_hook::consts::SIGHUP);
                    }
                    if got.contains(&RESTART) {
                        let _ = signal_hook::low_level::raise(signal_hook::consts::SIGUSR2);
                    }
                }
                log::info(format_args!(
                    "stopping: the group's supervisor closed this process's standard input \
                     (it is stopping the group, or gone)"
                ));
                let _ = signal_hook::low_level::raise(signal_hook::consts::SIGTERM);
            })
            .map(drop)
    }
}

/// The byte a supervisor writes to its members' standard input when it gets SIGHUP: reload
/// the certificates.
pub const RELOAD: u8 = b'H';

/// The byte a supervisor writes to its members before it stops them on SIGUSR2: the stop is a
/// restart (WebSockets get 1012, SSE streams a short `retry:`).
pub const RESTART: u8 = b'R';

/// The group's base node name: `node_name`, else `host:pid` of the supervisor.
pub fn base_node_name(config: &Config) -> String {
    config.node()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_member_gets_its_name_addresses_and_share_of_cores() {
        let m = Member {
            index: 2,
            node: "web:7-2".into(),
            dir: PathBuf::from("/tmp/x"),
            listen: "127.0.0.1:9000".parse().unwrap(),
            tls_listen: None,
            api_listen: "127.0.0.1:9001".parse().unwrap(),
        };
        let config = Config {
            processes: 2,
            workers: 0,
            broker: Some("redis://127.0.0.1:6379".into()),
            ..Config::default()
        };
        let c = m.apply(config);
        assert_eq!(c.listen, m.listen);
        assert_eq!(c.api_listen, m.api_listen);
        assert_eq!(c.node_name.as_deref(), Some("web:7-2"));
        assert_eq!(c.tls_listen, None);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(c.workers, (cores / 2).max(1));
        let env = m.env();
        assert!(env.iter().all(|(k, _)| !k.starts_with("CLARION_")));
        assert!(env.contains(&(ENV_INDEX, "2".into())));
    }

    #[test]
    fn the_base_name_is_the_setting_or_host_and_pid() {
        let named = Config {
            node_name: Some("edge".into()),
            ..Config::default()
        };
        assert_eq!(base_node_name(&named), "edge");
        let name = base_node_name(&Config::default());
        assert!(
            name.ends_with(&format!(":{}", std::process::id())),
            "{name}"
        );
    }

    #[test]
    fn processes_above_one_need_a_broker() {
        let c = Config {
            processes: 2,
            ..Config::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("--broker"), "{err}");
        let c = Config {
            processes: 0,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
