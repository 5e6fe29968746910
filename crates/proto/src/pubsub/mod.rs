//! Clarion's own pub/sub wire format: what clients and publishers send, and the JSON bodies the
//! server answers with. Pure functions over bytes; the server applies them.
//!
//! - [`topic`]: the rules for topic and SSE event names.
//! - [`control`]: in-band WebSocket control messages (subscribe, unsubscribe, publish) and
//!   their replies.
//! - [`append`]: appendable messages (AI token streams): fragments, the fold rule that keeps a
//!   stream's text so far in history, and a client's reader of them.
//! - [`append_wire`]: an appendable message's events as nodes exchange them through a broker.
//! - [`batch`]: `POST /publish` batch bodies, decoded and validated whole.
//! - [`idempotency`]: `Idempotency-Key` rules and the table of keys published within a window.
//! - [`envelope`]: the `clarion.v1` message envelope, gap notices, long-poll bodies and JSON
//!   string escaping.
//! - [`wire`]: message bodies as nodes exchange them through a cluster broker.
//!
//! The format is documented for clients in `docs/protocol.md`. Message ids (`EPOCH-SEQ`) are
//! [`crate::event_id`]'s.

pub mod append;
pub mod append_wire;
pub mod batch;
pub mod control;
pub mod envelope;
pub mod idempotency;
pub mod topic;
pub mod wire;

pub use batch::{
    decode_batch, held_back, BatchError, BatchMessage, FragmentOp, ItemError, RefusedItem,
};
pub use control::{ControlError, Reply, Request};
pub use envelope::{poll_body, push_json_str, Envelope, GapNotice, GapReason};
pub use idempotency::{validate_key, Claim, KeyError, Recorded, Remembered};
pub use topic::{
    validate_event_name, validate_topic, EventNameError, TopicError, MAX_EVENT_NAME_LEN,
    MAX_TOPIC_LEN,
};
