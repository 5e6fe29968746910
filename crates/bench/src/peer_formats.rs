//! What other servers wrap a benchmark payload in: a Socket.IO event frame, a Centrifuge push.
//! The bench reads the payload out of them so peers are measured like Clarion.

use crate::wire::find;

/// The payload inside a Socket.IO event frame (`42["NAME","PAYLOAD"]`, what a Socket.IO server
/// sends for `emit(NAME, PAYLOAD)` over its websocket transport); any other payload as it is.
/// Benchmark payloads need no JSON escapes, so none are undone.
pub fn socketio_unwrapped(payload: &[u8]) -> &[u8] {
    let Some(rest) = payload.strip_prefix(b"42[\"") else {
        return payload;
    };
    let Some(start) = rest.windows(3).position(|w| w == b"\",\"") else {
        return payload;
    };
    rest.get(start + 3..)
        .and_then(|r| r.strip_suffix(b"\"]"))
        .unwrap_or(payload)
}

/// The data of a Centrifuge publication push (`{"push":{"channel":..,"pub":{"data":"PAYLOAD",
/// ..}}}` in its JSON protocol, data published as a JSON string); any other payload as it is.
/// Benchmark payloads need no JSON escapes, so none are undone.
pub fn centrifuge_unwrapped(payload: &[u8]) -> &[u8] {
    const DATA: &[u8] = b"\"pub\":{\"data\":\"";
    if !payload.starts_with(b"{\"push\":") {
        return payload;
    }
    let Some(start) = find(payload, DATA).map(|i| i + DATA.len()) else {
        return payload;
    };
    let rest = payload.get(start..).unwrap_or_default();
    match rest.iter().position(|&b| b == b'"') {
        Some(end) => rest.get(..end).unwrap_or(payload),
        None => payload,
    }
}
