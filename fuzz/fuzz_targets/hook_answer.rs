//! A backend's answer to a hook call: the `connect` and `subscribe`/`publish` decoders never
//! panic and keep every field within its bound.
#![no_main]

use clarion_proto::hooks::{decode_check, decode_connect, Check, Connect, MAX_LIST, MAX_SUB_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Connect::Allow(a)) = decode_connect(data) {
        assert!(a.sub.as_ref().map_or(0, String::len) <= MAX_SUB_LEN);
        assert!(a.topics.len() <= MAX_LIST);
    }
    if let Ok(Check::Allow { data: Some(d) }) = decode_check(data, 64) {
        assert!(d.len() <= 64);
    }
});
