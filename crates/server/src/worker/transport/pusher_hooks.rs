//! What Pusher connections tell their application's webhook (`crate::hooks::pusher`,
//! `docs/pusher.md` "Webhooks"): their channel subscriptions and presence memberships as they
//! begin and end, their client events, and cache misses. Nothing is done (nor recorded) for an
//! application without a `webhook_url`.
#![deny(clippy::wildcard_enum_match_arm)]

use clarion_proto::pusher::webhook::Event;

use crate::hooks::pusher::PusherWebhooks;
use crate::worker::socket::Socket;
use crate::worker::transport::pusher_conn::Membership;
use crate::worker::Engine;

impl<S: Socket> Engine<S> {
    /// The Pusher webhook senders, and connection `k`'s application when it is a Pusher
    /// connection whose application has one.
    fn pusher_webhook(&self, k: u32) -> Option<(&PusherWebhooks, u16)> {
        let w = self.shared.hooks.as_ref()?.pusher.as_ref()?;
        let app = self.side.pusher().get(&k)?.app;
        w.has(app).then_some((w, app))
    }

    /// Connection `k` subscribed to `topic` (`joined`) or left it: a Pusher connection's
    /// channel counts for `channel_occupied`/`channel_vacated`, and leaving a presence channel
    /// ends its membership there (`member_removed` when it was the member's last connection).
    pub(crate) fn pusher_hook_topic(&mut self, k: u32, topic: &str, joined: bool) {
        if topic.starts_with(crate::pusher::USER_TOPIC_PREFIX) {
            // A user's own topic is no channel.
            return;
        }
        if self.handing_over {
            // A hand-over moves connections rather than ending or making them: the old process
            // forgets them without `channel_vacated`, the new one counts them without
            // `channel_occupied`.
            if let (true, Some((w, app))) = (joined, self.pusher_webhook(k)) {
                w.count_channel(app, topic);
            }
            return;
        }
        let Some((_, app)) = self.pusher_webhook(k) else {
            return;
        };
        let left = if joined {
            None
        } else {
            self.side.pusher_mut().get_mut(&k).and_then(|p| {
                let i = p.members.iter().position(|m| &*m.channel == topic)?;
                Some(p.members.remove(i))
            })
        };
        let Some((w, _)) = self.pusher_webhook(k) else {
            return;
        };
        if let Some(m) = left {
            w.member(app, topic, &m.user_id, false);
        }
        w.channel(app, topic, joined);
    }

    /// Pusher connection `k` subscribed to presence channel `channel` with `user_id`. The
    /// connection is one member, under the `user_id` of its first presence channel while it is
    /// in one (as Clarion's presence counts it).
    pub(crate) fn pusher_hook_member(&mut self, k: u32, channel: &str, user_id: &str) {
        if self.pusher_webhook(k).is_none() {
            return;
        }
        let Some(p) = self.side.pusher_mut().get_mut(&k) else {
            return;
        };
        let user_id: Box<str> = p
            .members
            .first()
            .map_or_else(|| user_id.into(), |m| m.user_id.clone());
        p.members.push(Membership {
            channel: channel.into(),
            user_id: user_id.clone(),
        });
        if let Some((w, app)) = self.pusher_webhook(k) {
            w.member(app, channel, &user_id, true);
        }
    }

    /// Pusher connection `k` arrived in a hand-over with its presence memberships: each is
    /// counted without `member_added` (the member was there already).
    pub(crate) fn pusher_count_members(&self, k: u32) {
        let (Some((w, app)), Some(p)) = (self.pusher_webhook(k), self.side.pusher().get(&k)) else {
            return;
        };
        for m in &p.members {
            w.count_member(app, &m.channel, &m.user_id);
        }
    }

    /// Pusher connection `k` sent client event `event` on `channel` (relayed).
    pub(crate) fn pusher_hook_client_event(
        &self,
        k: u32,
        channel: &str,
        event: &str,
        data: &str,
        socket_id: &str,
    ) {
        let Some((w, app)) = self.pusher_webhook(k) else {
            return;
        };
        let user_id = self.side.pusher().get(&k).and_then(|p| {
            p.members
                .iter()
                .find(|m| &*m.channel == channel)
                .map(|m| &*m.user_id)
        });
        let e = Event::ClientEvent {
            channel,
            event,
            data,
            socket_id,
            user_id,
        };
        w.event(app, &e);
    }

    /// Pusher connection `k` subscribed to cache channel `channel`, which had nothing to give.
    pub(crate) fn pusher_hook_cache_miss(&self, k: u32, channel: &str) {
        if let Some((w, app)) = self.pusher_webhook(k) {
            w.event(app, &Event::CacheMiss { channel });
        }
    }
}
