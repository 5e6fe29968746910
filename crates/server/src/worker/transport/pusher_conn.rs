//! What a Pusher connection holds of its own (`super::pusher`), apart from its WebSocket: its
//! application, socket id, signed-in user, presence memberships and client-event budget, one
//! entry of the engine's side table. And the applications as the workers share them: each
//! with its count of open connections (`max_connections`, answered with 4004 past it), touched
//! at connect and close only.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use clarion_proto::pusher::socket_id::SocketId;

use crate::config::pusher_apps::AppConfig;
use crate::config::Config;

/// One application, shared by the workers.
pub struct PusherApp {
    /// As configured.
    pub config: AppConfig,
    /// Its Pusher connections open now, across workers.
    pub open: AtomicUsize,
}

/// Every configured application (none: `/app/...` answers 404).
#[derive(Default)]
pub struct PusherApps {
    apps: Vec<PusherApp>,
}

impl PusherApps {
    /// The applications `config` names.
    pub fn of(config: &Config) -> PusherApps {
        PusherApps {
            apps: config
                .pusher_all()
                .into_iter()
                .map(|config| PusherApp {
                    config,
                    open: AtomicUsize::new(0),
                })
                .collect(),
        }
    }

    /// Whether any is configured.
    pub fn any(&self) -> bool {
        !self.apps.is_empty()
    }

    /// The index of the application whose key is `key`.
    pub fn by_key(&self, key: &str) -> Option<u16> {
        let i = self.apps.iter().position(|a| a.config.key == key)?;
        u16::try_from(i).ok()
    }

    /// Application number `i`.
    pub fn get(&self, i: u16) -> Option<&PusherApp> {
        self.apps.get(usize::from(i))
    }

    /// Counts a new connection to application `i`; `false` (not counted) when that would pass
    /// its `max_connections`.
    pub fn admit(&self, i: u16) -> bool {
        let Some(app) = self.get(i) else {
            return false;
        };
        let max = app.config.max_connections;
        app.open
            .fetch_update(Relaxed, Relaxed, |n| (max == 0 || n < max).then_some(n + 1))
            .is_ok()
    }

    /// Counts a connection to application `i` arriving in a hand-over: it was admitted by the
    /// old process, so it is counted even past `max_connections` (a limit lowered by the new
    /// configuration refuses new connections, not the ones already there).
    pub fn count_arrived(&self, i: u16) {
        if let Some(app) = self.get(i) {
            app.open.fetch_add(1, Relaxed);
        }
    }

    /// A connection to application `i` is gone.
    pub fn release(&self, i: u16) {
        if let Some(app) = self.get(i) {
            let _ = app
                .open
                .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        }
    }
}

/// A presence channel this connection is a member of: the member it joined as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Membership {
    /// The channel (`presence-...`).
    pub(crate) channel: Box<str>,
    /// The `user_id` of its `channel_data`.
    pub(crate) user_id: Box<str>,
}

/// One Pusher connection's own part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PusherConn {
    /// Its application ([`PusherApps::get`]).
    pub(crate) app: u16,
    /// Its socket id, as `pusher:connection_established` gave it.
    pub(crate) socket_id: SocketId,
    /// The user it signed in as (`pusher:signin`).
    pub(crate) user: Option<Box<str>>,
    /// Its presence memberships.
    pub(crate) members: Vec<Membership>,
    /// The second its client-event count is for.
    window: u32,
    /// Client events sent in that second.
    sent: u32,
}

impl PusherConn {
    /// A new connection to application `app`.
    pub(crate) fn new(app: u16, socket_id: SocketId) -> PusherConn {
        PusherConn {
            app,
            socket_id,
            user: None,
            members: Vec::new(),
            window: 0,
            sent: 0,
        }
    }

    /// A connection arriving in a hand-over, as the old process knew it (its client-event
    /// budget starts again: it is counted per second).
    pub(crate) fn arrived(
        app: u16,
        socket_id: SocketId,
        user: Option<Box<str>>,
        members: Vec<Membership>,
    ) -> PusherConn {
        PusherConn {
            user,
            members,
            ..PusherConn::new(app, socket_id)
        }
    }

    /// Counts a client event sent at second `now`; `false` when it is over `per_second`
    /// (Pusher's rule: at most that many in each second; the refused one is not counted).
    pub(crate) fn take_client_event(&mut self, now: u32, per_second: u32) -> bool {
        if now != self.window {
            self.window = now;
            self.sent = 0;
        }
        if self.sent >= per_second {
            return false;
        }
        self.sent += 1;
        true
    }
}

/// A new socket id: two random numbers (the hasher's per-instance keys), so that one
/// connection cannot guess another's and sign with it.
pub(crate) fn new_socket_id() -> SocketId {
    use std::hash::{BuildHasher, Hasher};
    let random = || {
        let h = std::collections::hash_map::RandomState::new().build_hasher();
        // Up to 10 digits each, as Pusher's own ids look.
        h.finish() % 10_000_000_000
    };
    SocketId {
        high: random(),
        low: random(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_events_are_limited_per_second_per_connection() {
        let mut c = PusherConn::new(0, new_socket_id());
        for _ in 0..10 {
            assert!(c.take_client_event(5, 10));
        }
        assert!(!c.take_client_event(5, 10), "the 11th in one second");
        assert!(c.take_client_event(6, 10), "a new second, a new budget");
    }

    #[test]
    fn socket_ids_differ_and_have_pushers_shape() {
        let a = new_socket_id();
        let b = new_socket_id();
        assert_ne!(a, b);
        let text = a.to_string();
        assert!(
            clarion_proto::pusher::socket_id::validate(&text).is_ok(),
            "{text}"
        );
    }

    #[test]
    fn an_application_admits_up_to_its_connection_limit() {
        let config = Config {
            pusher_apps: vec![AppConfig {
                id: "1".into(),
                key: "k".into(),
                secret: "s".into(),
                enable_client_messages: false,
                max_connections: 2,
                client_event_rate: 10,
                max_event_bytes: 1024,
                max_batch_events: 10,
                webhook_url: None,
            }],
            ..Config::default()
        };
        let apps = PusherApps::of(&config);
        let i = apps.by_key("k").expect("configured");
        assert_eq!(apps.by_key("nope"), None);
        assert!(apps.admit(i) && apps.admit(i));
        assert!(!apps.admit(i), "the third is over the limit");
        apps.release(i);
        assert!(apps.admit(i));
    }
}
