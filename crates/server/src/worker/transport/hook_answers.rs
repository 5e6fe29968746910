//! What a backend hook's answer means to the transports (`super::hooks`): a `connect`
//! answer's verdict, why an answer or a call failed (for the log and the failure policy), and
//! which transport a request is asking for (the hook's `transport` field).

use clarion_proto::hooks::{self as proto, Accepted, Connect};
use clarion_proto::http1::RequestHead;

use crate::grip::backend::Failure;
use crate::hooks::NotCalled;

pub(super) enum ConnectVerdict {
    Allow(Box<Accepted>),
    Refuse {
        status: u16,
        reason: String,
    },
    Failed(String),
    /// Not asked: the client's address has `hook_max_in_flight_per_address` calls out.
    AddressBusy,
}

/// What a client whose address has too many hook calls out is told.
pub(super) const ADDRESS_BUSY: &str =
    "too many hook calls in flight for this address; retry later (hook_max_in_flight_per_address)";

/// Why an answer is not usable, or its body.
pub(super) fn body_of(
    result: Result<crate::grip::backend::Response, Failure>,
) -> Result<Vec<u8>, String> {
    match result {
        Ok(r) if (200..300).contains(&r.status) => Ok(r.body),
        Ok(r) if (300..400).contains(&r.status) => Err(format!(
            "the hook answered a redirect ({}), which is not followed",
            r.status
        )),
        Ok(r) => Err(format!("the hook answered {} {}", r.status, r.reason)),
        Err(Failure::Timeout) => Err("the hook did not answer in time".into()),
        Err(Failure::Unreachable(why)) => Err(format!("the hook is unreachable: {why}")),
        Err(Failure::Invalid(why)) => Err(format!("the hook's answer is invalid: {why}")),
    }
}

/// Why a call that could not be made failed, for the log and the failure policy.
pub(super) fn not_called(why: NotCalled) -> &'static str {
    match why {
        NotCalled::Busy => "too many hook calls in flight (hook_max_in_flight)",
        NotCalled::AddressBusy => ADDRESS_BUSY,
        NotCalled::Unconfigured => "the hook is not configured",
        NotCalled::Unwritable => "the hook request cannot be written",
    }
}

pub(super) fn transport_of(head: &RequestHead<'_>, cfg: &crate::config::Config) -> &'static str {
    let path = head.path();
    if head.has_token("upgrade", "websocket") {
        "ws"
    } else if path == cfg.poll_path || super::http::latest_topic(path).is_some() {
        // `/topics/{t}/latest` reads like a long-poll `since=latest&timeout=0`.
        "poll"
    } else if path == cfg.stream_path
        && !head
            .header_str("accept")
            .is_some_and(|a| a.contains("text/event-stream"))
    {
        "stream"
    } else {
        "sse"
    }
}

/// A `connect` answer's verdict and its outcome for the counters (0 allow, 1 refuse, 2
/// failure).
pub(super) fn connect_verdict(body: &[u8]) -> (ConnectVerdict, usize) {
    match proto::decode_connect(body) {
        Ok(Connect::Allow(a)) => (ConnectVerdict::Allow(a), 0),
        Ok(Connect::Refuse { status, reason }) => (ConnectVerdict::Refuse { status, reason }, 1),
        Err(e) => (
            ConnectVerdict::Failed(format!("the hook's answer is invalid: {e}")),
            2,
        ),
    }
}
