//! Pusher's webhooks (`docs/pusher.md`, "Webhooks"): one sender per Pusher application with a
//! `webhook_url`, on the same machinery as Clarion's webhook ([`super::webhook`]: batched,
//! retried, bounded), in Pusher's format and signing ([`Format::Pusher`]).
//!
//! `channel_occupied` / `channel_vacated` count the application's Pusher subscriptions to a
//! channel, and `member_added` / `member_removed` a presence member's connections in a
//! channel, per process; with the Redis broker each transition is settled with the cluster
//! ([`crate::broker::occupancy`], under keys of their own: `pusher/{app}/c/{channel}` and
//! `pusher/{app}/m/{channel}` + `\n` + the user id), so a channel is occupied and vacated once
//! for the cluster, and a member added and removed once, whichever nodes its connections are
//! on. `client_event` and `cache_miss` are reported by the node that saw them.

use std::sync::Arc;

use clarion_proto::pusher::webhook::Event;

use super::webhook::{Format, Settings, Webhooks};
use super::Target;
use crate::config::Config;
use crate::grip::backend::Limits;
use crate::metrics::Metrics;

/// One application's sender.
struct App {
    id: String,
    webhooks: Webhooks,
}

/// The senders, by application index (the order of [`Config::pusher_all`], as
/// `worker::transport::pusher_conn::PusherApps`).
pub struct PusherWebhooks {
    apps: Vec<Option<App>>,
}

impl PusherWebhooks {
    /// Starts a sender for each application with a `webhook_url`; `None` when none has one.
    pub fn start(
        config: &Config,
        metrics: &Arc<Metrics>,
        broker: &crate::broker::Broker,
        limits: Limits,
        prefix: &str,
    ) -> Result<Option<PusherWebhooks>, String> {
        let mut apps = Vec::new();
        for app in config.pusher_all() {
            let Some(url) = &app.webhook_url else {
                apps.push(None);
                continue;
            };
            let settings = Settings {
                target: Target::parse(url)?,
                format: Format::Pusher {
                    key: app.key.clone(),
                    secret: app.secret.clone().into_bytes(),
                },
                max: config.webhook_queue,
                batch_max: config.webhook_batch_max,
                batch_wait: std::time::Duration::from_millis(config.webhook_batch_ms),
                limits,
                prefix: prefix.to_owned(),
            };
            let webhooks = Webhooks::start(settings, metrics, broker.occupancy(prefix))
                .map_err(|e| format!("cannot start a Pusher webhook thread: {e}"))?;
            apps.push(Some(App {
                id: app.id,
                webhooks,
            }));
        }
        Ok(apps
            .iter()
            .any(Option::is_some)
            .then_some(PusherWebhooks { apps }))
    }

    fn app(&self, app: u16) -> Option<&App> {
        self.apps.get(usize::from(app))?.as_ref()
    }

    /// A Pusher connection of application `app` subscribed to `channel` (`joined`) or left it.
    pub fn channel(&self, app: u16, channel: &str, joined: bool) {
        let Some(a) = self.app(app) else {
            return;
        };
        let key: Arc<str> = format!("pusher/{}/c/{channel}", a.id).into();
        a.webhooks.keyed(&key, joined, |occupied| {
            if occupied {
                Event::ChannelOccupied { channel }.encode()
            } else {
                Event::ChannelVacated { channel }.encode()
            }
        });
    }

    /// A connection of member `user_id` joined presence channel `channel` or left it.
    pub fn member(&self, app: u16, channel: &str, user_id: &str, joined: bool) {
        let Some(a) = self.app(app) else {
            return;
        };
        let key: Arc<str> = format!("pusher/{}/m/{channel}\n{user_id}", a.id).into();
        a.webhooks.keyed(&key, joined, |added| {
            if added {
                Event::MemberAdded { channel, user_id }.encode()
            } else {
                Event::MemberRemoved { channel, user_id }.encode()
            }
        });
    }

    /// Counts a Pusher subscription to `channel` that arrived in a hand-over, without an event
    /// (the channel was occupied already).
    pub fn count_channel(&self, app: u16, channel: &str) {
        if let Some(a) = self.app(app) {
            a.webhooks
                .count_topic(&format!("pusher/{}/c/{channel}", a.id).into());
        }
    }

    /// Counts a connection of member `user_id` in presence channel `channel` that arrived in a
    /// hand-over, without an event (the member was there already).
    pub fn count_member(&self, app: u16, channel: &str, user_id: &str) {
        if let Some(a) = self.app(app) {
            a.webhooks
                .count_topic(&format!("pusher/{}/m/{channel}\n{user_id}", a.id).into());
        }
    }

    /// Reports `event` (a `client_event` or `cache_miss`) as it is.
    pub fn event(&self, app: u16, event: &Event<'_>) {
        if let Some(a) = self.app(app) {
            a.webhooks.push(event.encode());
        }
    }

    /// Whether application `app` has a webhook.
    pub fn has(&self, app: u16) -> bool {
        self.app(app).is_some()
    }
}
