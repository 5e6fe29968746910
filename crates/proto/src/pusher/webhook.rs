//! Pusher's webhooks, sans-IO: the events an application's `webhook_url` is told, and the
//! body and headers that carry a batch of them (`{"time_ms": ..., "events": [...]}` with
//! `X-Pusher-Key` and `X-Pusher-Signature`), as Pusher sends them, so that the official
//! server libraries' webhook checks accept them unchanged.
//!
//! The clock is the caller's: [`body`] takes `time_ms`.

use super::signature::webhook_signature;

/// The header naming the application's key.
pub const KEY_HEADER: &str = "X-Pusher-Key";
/// The header holding [`webhook_signature`] of the body.
pub const SIGNATURE_HEADER: &str = "X-Pusher-Signature";

/// One webhook event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A channel got its first subscriber (across the cluster).
    ChannelOccupied {
        /// The channel.
        channel: &'a str,
    },
    /// A channel lost its last subscriber (across the cluster).
    ChannelVacated {
        /// The channel.
        channel: &'a str,
    },
    /// A user's first connection joined a presence channel.
    MemberAdded {
        /// The channel.
        channel: &'a str,
        /// The member's `user_id`.
        user_id: &'a str,
    },
    /// A user's last connection left a presence channel.
    MemberRemoved {
        /// The channel.
        channel: &'a str,
        /// The member's `user_id`.
        user_id: &'a str,
    },
    /// A client sent a `client-` event.
    ClientEvent {
        /// The channel.
        channel: &'a str,
        /// The event name (`client-...`).
        event: &'a str,
        /// Its `data`, as the client sent it.
        data: &'a str,
        /// The sender's socket id.
        socket_id: &'a str,
        /// The sender's member `user_id`, on a presence channel.
        user_id: Option<&'a str>,
    },
    /// A client subscribed to a `cache-` channel that had no event to give it.
    CacheMiss {
        /// The channel.
        channel: &'a str,
    },
}

impl Event<'_> {
    /// The event's JSON object.
    pub fn encode(&self) -> String {
        let v = match *self {
            Event::ChannelOccupied { channel } => {
                serde_json::json!({"name": "channel_occupied", "channel": channel})
            }
            Event::ChannelVacated { channel } => {
                serde_json::json!({"name": "channel_vacated", "channel": channel})
            }
            Event::MemberAdded { channel, user_id } => {
                serde_json::json!({"name": "member_added", "channel": channel, "user_id": user_id})
            }
            Event::MemberRemoved { channel, user_id } => serde_json::json!({
                "name": "member_removed", "channel": channel, "user_id": user_id
            }),
            Event::ClientEvent {
                channel,
                event,
                data,
                socket_id,
                user_id,
            } => {
                let mut v = serde_json::json!({
                    "name": "client_event", "channel": channel, "event": event,
                    "data": data, "socket_id": socket_id,
                });
                if let (Some(u), Some(o)) = (user_id, v.as_object_mut()) {
                    o.insert("user_id".into(), u.into());
                }
                v
            }
            Event::CacheMiss { channel } => {
                serde_json::json!({"name": "cache_miss", "channel": channel})
            }
        };
        v.to_string()
    }
}

/// The body of one request: `{"time_ms":T,"events":[...]}` from events encoded by
/// [`Event::encode`].
pub fn body<'e>(time_ms: u64, events: impl IntoIterator<Item = &'e str>) -> Vec<u8> {
    crate::hooks::events_body(&format!("\"time_ms\":{time_ms},"), events)
}

/// The two headers of a request carrying `body` for the application `key` / `secret`.
pub fn headers(key: &str, secret: &[u8], body: &[u8]) -> [(&'static str, String); 2] {
    [
        (KEY_HEADER, key.to_owned()),
        (SIGNATURE_HEADER, webhook_signature(secret, body)),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn json(e: Event<'_>) -> serde_json::Value {
        serde_json::from_str(&e.encode()).unwrap()
    }

    #[test]
    fn events_have_pushers_names_and_fields() {
        let v = json(Event::ChannelOccupied { channel: "a" });
        assert_eq!(
            v,
            serde_json::json!({"name": "channel_occupied", "channel": "a"})
        );
        let v = json(Event::ChannelVacated { channel: "a" });
        assert_eq!(v["name"], "channel_vacated");
        let v = json(Event::MemberAdded {
            channel: "presence-r",
            user_id: "7",
        });
        assert_eq!(v["name"], "member_added");
        assert_eq!(v["user_id"], "7");
        assert_eq!(
            json(Event::MemberRemoved {
                channel: "presence-r",
                user_id: "7"
            })["name"],
            "member_removed"
        );
        assert_eq!(
            json(Event::CacheMiss { channel: "cache-x" })["name"],
            "cache_miss"
        );
    }

    #[test]
    fn a_client_event_names_its_user_only_on_presence() {
        let e = |user_id| Event::ClientEvent {
            channel: "private-c",
            event: "client-typing",
            data: "{\"x\":\"\\\"q\"}",
            socket_id: "1.2",
            user_id,
        };
        let v = json(e(None));
        assert_eq!(v["event"], "client-typing");
        assert_eq!(
            v["data"], "{\"x\":\"\\\"q\"}",
            "data stays the client's string"
        );
        assert_eq!(v["socket_id"], "1.2");
        assert!(v.get("user_id").is_none());
        assert_eq!(json(e(Some("u1")))["user_id"], "u1");
    }

    #[test]
    fn the_body_carries_the_time_and_the_events_and_is_signed_with_the_secret() {
        let a = Event::ChannelOccupied { channel: "a" }.encode();
        let b = Event::CacheMiss { channel: "cache-b" }.encode();
        let body = body(1_700_000_000_123, [a.as_str(), b.as_str()]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["time_ms"], 1_700_000_000_123_u64);
        assert_eq!(v["events"].as_array().unwrap().len(), 2);
        let [(k, key), (s, sig)] = headers("app-key", b"secret", &body);
        assert_eq!((k, key.as_str()), (KEY_HEADER, "app-key"));
        assert_eq!(s, SIGNATURE_HEADER);
        assert_eq!(sig, webhook_signature(b"secret", &body));
        assert_ne!(sig, webhook_signature(b"other", &body));
    }
}
