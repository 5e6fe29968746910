//! Request heads: parsing, header queries, body framing, query strings and the WebSocket
//! handshake must never panic, whatever the bytes.
#![no_main]

use clarion_proto::http1::{parse_head, query_pairs, HeadLimits};
use clarion_proto::ws::handshake;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = HeadLimits { max_request_line: 256, max_headers: 8, max_head_bytes: 1024 };
    if let Ok(Some(head)) = parse_head(data, &limits) {
        let _ = head.body();
        let _ = head.keep_alive();
        let _ = head.has_token("connection", "upgrade");
        for pair in query_pairs(head.query()) {
            let _ = pair;
        }
        if let Ok(up) = handshake::validate(&head) {
            let mut out = Vec::new();
            handshake::write_accept(&mut out, up.key, None, None);
        }
    }
});
