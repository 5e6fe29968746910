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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centrifuge_pushes_are_unwrapped_and_others_kept() {
        assert_eq!(
            centrifuge_unwrapped(
                br#"{"push":{"channel":"b","pub":{"data":"7 123 xx","offset":2}}}"#
            ),
            b"7 123 xx"
        );
        assert_eq!(
            centrifuge_unwrapped(br#"{"push":{"channel":"b","pub":{"data":"7 1"}}}"#),
            b"7 1"
        );
        let reply: &[u8] = br#"{"id":1,"connect":{"client":"x","subs":{"b":{}}}}"#;
        assert_eq!(centrifuge_unwrapped(reply), reply);
        let cut: &[u8] = br#"{"push":{"channel":"b","pub":{"data":"7 1"#;
        assert_eq!(centrifuge_unwrapped(cut), cut);
    }

    #[test]
    fn socketio_event_frames_are_unwrapped_and_others_kept() {
        assert_eq!(socketio_unwrapped(br#"42["m","7 123 xx"]"#), b"7 123 xx");
        assert_eq!(socketio_unwrapped(b"7 123 xx"), b"7 123 xx");
        assert_eq!(socketio_unwrapped(br#"42["m"]"#), br#"42["m"]"#);
        assert_eq!(socketio_unwrapped(b"0{\"sid\":\"a\"}"), b"0{\"sid\":\"a\"}");
    }
}
