//! Pusher Channels compatibility (docs/pusher.md): the applications a Pusher client or server
//! library names ([`apps`]) and the HTTP API's answers ([`crate::api`]'s `pusher` module). The
//! protocol itself is sans-IO in [`clarion_proto::pusher`]; this module holds only what needs
//! the configuration. The per-connection part (`/app/{key}` WebSockets) is not here yet.

pub mod apps;

pub use apps::{App, AppConfig};
