//! WebSocket frames: the receiver must either consume bytes, ask for more, or report a
//! violation; never panic, never consume more than it was given.
#![no_main]

use clarion_proto::ws::receiver::Limits;
use clarion_proto::ws::Receiver;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = data.to_vec();
    let mut rx = Receiver::default();
    let limits = Limits {
        max_message: 4096,
        require_mask: data.first().is_some_and(|b| b & 1 == 0),
        deflate: data.first().is_some_and(|b| b & 2 == 0),
    };
    let mut pos = 0;
    while pos < buf.len() {
        match rx.next(&mut buf[pos..], &limits) {
            Ok(Some((used, _event))) => {
                assert!(used > 0 && pos + used <= data.len());
                pos += used;
            }
            Ok(None) | Err(_) => break,
        }
    }
});
