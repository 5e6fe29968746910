//! What an HTTP/2 connection reads from a client: frames one after another. Nothing panics; a
//! parsed frame consumes its header and exactly its length, never more than it was given; a
//! frame parsed from a buffer parses the same from a longer one; no frame longer than the
//! advertised maximum is accepted; a SETTINGS payload's settings read or are refused one by one.
#![no_main]

use clarion_proto::h2::frame::{parse, Frame, DEFAULT_MAX_FRAME, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((frame, used))) = parse(rest, DEFAULT_MAX_FRAME) {
        assert!(used >= HEADER_LEN && used <= rest.len());
        assert!(used - HEADER_LEN <= DEFAULT_MAX_FRAME as usize);
        if let Frame::Settings { payload, .. } = &frame {
            assert_eq!(payload.len() % 6, 0);
            for s in Frame::settings(payload) {
                let _ = s;
            }
        }
        let mut longer = rest[..used].to_vec();
        longer.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
        assert_eq!(parse(&longer, DEFAULT_MAX_FRAME), Ok(Some((frame, used))));
        rest = &rest[used..];
    }
});
