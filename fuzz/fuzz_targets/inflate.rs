//! permessage-deflate: inflating arbitrary client data never panics and never produces more
//! than the limit; anything compressed by the server inflates back to itself; offers never make
//! negotiation panic, and an accepted offer answers within RFC 7692's ranges.
#![no_main]

use clarion_proto::ws::deflate::{compress_message, inflate_message, negotiate, Policy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limit = 4096;
    if let Ok(out) = inflate_message(data, 15, limit) {
        assert!(out.len() <= limit);
    }
    let z = compress_message(data, 9 + (data.len() % 7) as u8, 6);
    let back = inflate_message(&z, 15, data.len()).expect("own output inflates");
    assert_eq!(back, data);
    if let Ok(text) = std::str::from_utf8(data) {
        let offers: Vec<&str> = text.split(',').collect();
        let policy = Policy {
            server_context_takeover: data.first().is_some_and(|b| b & 1 == 1),
            client_max_window_bits: 12,
        };
        if let Some((agreed, answer)) = negotiate(&offers, &policy) {
            assert!((9..=15).contains(&agreed.server_max_window_bits));
            assert!((8..=15).contains(&agreed.client_max_window_bits));
            assert!(answer.starts_with("permessage-deflate"));
        }
    }
});
