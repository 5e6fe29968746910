//! GRIP, the Generic Realtime Intermediary Protocol that Pushpin speaks with backends.
//!
//! With GRIP, a push server sits in front of an ordinary web application as a proxy. It forwards
//! a client's request to the backend; the backend answers with instructions (hold this request
//! open as a stream or a long-poll, subscribed to these channels) and later publishes to those
//! channels through an HTTP API, and the proxy delivers to every held connection. WebSocket
//! clients are relayed the same way, either over a WebSocket to the backend or as short HTTP
//! requests carrying WebSocket-over-HTTP events, with subscriptions sent as control messages.
//!
//! These are only the protocol's pure pieces, bytes and strings in and typed values out; the
//! proxying itself belongs to the server.
//!
//! - [`websocket_events`]: the `application/websocket-events` body format (encoder and
//!   incremental decoder).
//! - [`headers`]: the instruction headers of a backend response (`Grip-Hold`, `Grip-Channel`, ...).
//! - [`instruct`]: the same instructions as an `application/grip-instruct` JSON body.
//! - [`publish`]: the publish API's JSON body (`{"items": [...]}`) and its formats.
//! - [`control`]: WebSocket control messages (`c:{...}`) and the message prefix convention.
//! - [`routes`]: Pushpin's routes file (which backend serves which requests).
//! - [`sig`]: `Grip-Sig`, the HS256 JWT that tells a backend a request came through the proxy.
//!
//! Both [`headers`] and [`control`] read HTTP header parameters (`a; name="value", b`) through
//! one private parser, `params`.

pub mod control;
pub mod headers;
pub mod instruct;
mod params;
pub mod publish;
pub mod routes;
pub mod sig;
pub mod websocket_events;

pub use control::{
    decode_control, grip_message_prefix, split_prefix, Control, ControlError, Prefixed,
};
pub use headers::{parse_instruct, Channel, HoldMode, Instruct, InstructError};
pub use instruct::{decode_instruct_body, InstructBodyError, INSTRUCT_CONTENT_TYPE};
pub use publish::{decode_publish, Item, PublishError, PublishLimits};
pub use routes::{find_route, parse_routes, Route, RouteError, Target};
pub use sig::{Claims, SigError};
pub use websocket_events::{
    decode_body, decode_event, write_event, Event, EventError, EventLimits,
};

use base64::alphabet::STANDARD;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;

/// Standard base64 with padding optional, for the protocol's binary fields (`content-bin`,
/// `body-bin`, `format=base64`): backends' encoders differ on padding.
pub(crate) const BASE64: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
