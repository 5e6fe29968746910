//! Pusher Channels on Clarion's topics: what a message published in Pusher's terms carries for
//! Pusher connections besides its payload ([`PusherEvent`]): the event name when it is not a
//! Clarion event name (`App\Events\OrderShipped`), and the socket id to leave out (the HTTP
//! API's `socket_id`, a client event's sender). The protocol
//! is `clarion_proto::pusher`; the API's answers are `api::pusher`, the connections'
//! `worker::transport::pusher`.

use clarion_proto::pusher::socket_id::SocketId;

use crate::message::Attachment;

/// The Pusher part of a published message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PusherEvent {
    /// The Pusher event name.
    pub name: Box<str>,
    /// The connection that must not receive it.
    pub exclude: Option<SocketId>,
}

impl Attachment for PusherEvent {
    fn cost(&self) -> usize {
        std::mem::size_of::<PusherEvent>() + self.name.len()
    }

    fn publisher_id(&self) -> Option<&str> {
        None
    }

    fn event_name(&self) -> Option<&str> {
        Some(&self.name)
    }
}
