//! What every worker of a process shares, and the one constructor that makes it: the server
//! and the engine test kit build it the same way, so a test sees the setups production does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use super::handover::Switch;
use crate::broker::Broker;
use crate::config::Config;
use crate::metrics::Metrics;

/// What every worker shares.
pub struct Shared {
    /// The configuration, validated.
    pub config: Config,
    /// Publishing, subscriptions and history (see [`crate::broker`]).
    pub broker: Broker,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Set once by the signal handler; workers stop accepting and close their connections.
    pub stopping: AtomicBool,
    /// Set with `stopping` when the stop is a restart (SIGUSR2): WebSockets are closed with
    /// 1012 "service restart" and SSE streams are told to come back soon, rather than 1001.
    pub restarting: AtomicBool,
    /// Client connections open across all workers (compared with `cap`).
    pub open: AtomicUsize,
    /// Client connections admitted since start, HTTP/2 streams and connections handed over
    /// included (when a storm of them is over, see [`super::trim`]).
    pub admitted: AtomicU64,
    /// Most client connections at once.
    pub cap: usize,
    /// Open connections per client address key, when `max_connections_per_address` is set.
    /// Touched only at accept and close, never per message.
    pub per_address: Mutex<HashMap<u32, u32>>,
    /// Certificates and TLS settings, when a TLS listener is configured.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// GRIP proxy mode, when routes are configured.
    pub grip: Option<crate::grip::Proxy>,
    /// JWT authentication, when a key is configured (see [`crate::auth`]).
    pub auth: Option<crate::auth::Auth>,
    /// Backend hooks, when one is configured (see [`crate::hooks`]).
    pub hooks: Option<crate::hooks::Hooks>,
    /// Presence, when `presence_topics` names any (see [`crate::presence`]).
    pub presence: Option<Arc<crate::presence::Presence>>,
    /// A hand-over to a new binary in progress (see [`super::handover`]).
    pub handover: Switch,
    /// The conflating topics (`conflate_topics`, compiled once).
    pub conflate: crate::config::conflate::Rules,
    /// Pusher applications and their open connections (`transport::pusher`).
    pub pusher: super::transport::pusher_conn::PusherApps,
}

/// The modes a process runs with, each `None` when its configuration does not ask for it.
#[derive(Default)]
pub struct Modes {
    /// Certificates and TLS settings.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// GRIP proxy mode.
    pub grip: Option<crate::grip::Proxy>,
    /// JWT authentication.
    pub auth: Option<crate::auth::Auth>,
    /// Backend hooks and webhooks (see `crate::hooks::Hooks::configured`).
    pub hooks: Option<crate::hooks::Hooks>,
    /// Presence.
    pub presence: Option<Arc<crate::presence::Presence>>,
}

impl Shared {
    /// What the workers share, for at most `cap` connections at once: nothing open yet, no
    /// stop asked, no hand-over in progress.
    pub fn new(
        config: Config,
        broker: Broker,
        metrics: Arc<Metrics>,
        cap: usize,
        modes: Modes,
    ) -> Shared {
        let Modes {
            tls,
            grip,
            auth,
            hooks,
            presence,
        } = modes;
        let pusher = super::transport::pusher_conn::PusherApps::of(&config);
        Shared {
            conflate: crate::config::conflate::Rules::of(&config),
            config,
            broker,
            metrics,
            stopping: AtomicBool::new(false),
            restarting: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            admitted: AtomicU64::new(0),
            cap,
            per_address: Mutex::new(HashMap::new()),
            tls,
            grip,
            auth,
            hooks,
            presence,
            handover: Switch::default(),
            pusher,
        }
    }
}
