//! The WebSocket opening handshake: any request head that validates has a key of 16 bytes in
//! base64, and the answer written for it is a complete 101 head carrying a 28-byte accept value.
#![no_main]

use base64::Engine as _;
use clarion_proto::http1::{parse_head, HeadLimits};
use clarion_proto::ws::handshake::{validate, write_accept};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = HeadLimits {
        max_request_line: 1024,
        max_headers: 32,
        max_head_bytes: 4096,
    };
    let Ok(Some(head)) = parse_head(data, &limits) else {
        return;
    };
    assert!(head.head_len <= data.len());
    if let Ok(up) = validate(&head) {
        let key = base64::engine::general_purpose::STANDARD
            .decode(up.key)
            .expect("a validated key is base64");
        assert_eq!(key.len(), 16);
        let mut out = Vec::new();
        write_accept(&mut out, up.key, up.protocols.first().copied(), None);
        assert!(out.starts_with(b"HTTP/1.1 101 "));
        assert!(out.ends_with(b"\r\n\r\n"));
        let accept = out
            .split(|&b| b == b'\n')
            .find_map(|l| l.strip_prefix(b"Sec-WebSocket-Accept: "))
            .expect("accept header");
        assert_eq!(accept.len(), 28 + 1, "28 characters and the CR");
    }
});
