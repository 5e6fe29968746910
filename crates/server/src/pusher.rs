//! Pusher Channels on Clarion's topics: what a message published in Pusher's terms carries for
//! Pusher connections besides its payload ([`PusherEvent`]): the event name when it is not a
//! Clarion event name (`App\Events\OrderShipped`), and the socket id to leave out (the HTTP
//! API's `socket_id`, a client event's sender). Both travel with the message to the other nodes
//! of a cluster ([`clarion_proto::pusher::relay`], as its attachment). The protocol
//! is `clarion_proto::pusher`; the API's answers are `api::pusher`, the connections'
//! `worker::transport::pusher`.

use std::sync::Arc;

use clarion_proto::pusher::relay::{self, Relay};
use clarion_proto::pusher::socket_id::SocketId;

use crate::message::Attachment;

/// The Pusher part of a published message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PusherEvent {
    /// The Pusher event name.
    pub name: Box<str>,
    /// The connection that must not receive it.
    pub exclude: Option<SocketId>,
    /// The sender's member id, for a presence channel's client event.
    pub user_id: Option<Box<str>>,
}

/// The prefix of the topics of signed-in users (`:` and `/` are in no Pusher channel name, so
/// no Pusher client can subscribe to one).
pub const USER_TOPIC_PREFIX: &str = "pusher:user/";

/// The event that closes every connection of a user (`terminate_connections`).
pub const TERMINATE_EVENT: &str = "pusher_internal:terminate";

/// The topic of user `user_id` of application `app_id`, whose connections signed in as that
/// user subscribe to it: `pusher:user/` and the HMAC of the two under the application's
/// secret, so the name is a valid topic whatever the id holds and cannot be guessed.
pub fn user_topic(app_id: &str, secret: &str, user_id: &str) -> String {
    let mac = clarion_proto::pusher::signature::sign_hex(
        secret.as_bytes(),
        &[app_id.as_bytes(), b"\n", user_id.as_bytes()],
    );
    format!("{USER_TOPIC_PREFIX}{mac}")
}

impl Attachment for PusherEvent {
    fn cost(&self) -> usize {
        std::mem::size_of::<PusherEvent>()
            + self.name.len()
            + self.user_id.as_ref().map_or(0, |u| u.len())
    }

    fn publisher_id(&self) -> Option<&str> {
        None
    }

    fn event_name(&self) -> Option<&str> {
        Some(&self.name)
    }

    fn user_id(&self) -> Option<&str> {
        self.user_id.as_deref()
    }

    /// Its name, excluded socket and sender for the other nodes of a cluster.
    fn encode(&self) -> Option<Vec<u8>> {
        Some(
            Relay {
                name: &self.name,
                exclude: self.exclude,
                user_id: self.user_id.as_deref(),
            }
            .encode(),
        )
    }
}

/// The attachment of a message from another node (or from history written by one): a Pusher
/// event's part, else GRIP content (`crate::grip::decode_attachment`). Registered with the
/// cluster broker, the hand-over and durable history.
pub fn decode_attachment(bytes: &[u8]) -> Option<Arc<dyn Attachment>> {
    if bytes.first() != Some(&relay::MARKER) {
        return crate::grip::decode_attachment(bytes);
    }
    let r = relay::decode(bytes)?;
    Some(Arc::new(PusherEvent {
        name: r.name.into(),
        exclude: r.exclude,
        user_id: r.user_id.map(Into::into),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_topics_are_valid_topics_for_any_id_and_differ_by_app_and_user() {
        let a = user_topic("1", "s", "ada lovelace #1 ☃");
        assert!(clarion_proto::pubsub::validate_topic(&a).is_ok(), "{a}");
        assert!(a.starts_with(USER_TOPIC_PREFIX));
        assert_ne!(a, user_topic("2", "s", "ada lovelace #1 ☃"));
        assert_ne!(a, user_topic("1", "s", "bob"));
        assert!(clarion_proto::pusher::channel::classify(&a).is_err());
    }

    #[test]
    fn pusher_events_cross_nodes_with_their_name_and_excluded_socket() {
        let sent = PusherEvent {
            name: "App\\Events\\Shipped".into(),
            exclude: Some(SocketId { high: 12, low: 34 }),
            user_id: Some("ada".into()),
        };
        let bytes = sent.encode().expect("travels");
        let back = decode_attachment(&bytes).expect("decodes");
        let back = (back.as_ref() as &dyn std::any::Any)
            .downcast_ref::<PusherEvent>()
            .expect("a Pusher event");
        assert_eq!(back, &sent);
        assert!(
            decode_attachment(b"Pjunk").is_none(),
            "a damaged part is refused"
        );
    }
}
