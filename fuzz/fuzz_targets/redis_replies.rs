//! What a Redis broker connection reads: RESP2 replies and pushes, and the message bodies and
//! `EPOCH SEQ BODY` prefixes nodes exchange through it. Nothing panics; a parsed value uses at
//! least one byte and no more than it was given; a value parsed from a prefix of the input is
//! the same as from the whole input (a socket may deliver it in parts); a body that decodes
//! encodes back to the same bytes.
#![no_main]

use clarion_proto::pubsub::wire;
use clarion_proto::resp::{parse, Limits};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_bulk: 4096,
    max_array: 64,
    max_depth: 4,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((value, used))) = parse(data, &LIMITS) {
        assert!(used > 0 && used <= data.len());
        for cut in [used / 2, used.saturating_sub(1)] {
            match parse(&data[..cut], &LIMITS) {
                Ok(Some((v, u))) => assert_eq!((v, u), (value.clone(), used)),
                Ok(None) => {}
                Err(e) => panic!("a prefix failed where the whole parsed: {e}"),
            }
        }
    }
    if let Ok(body) = wire::decode(data) {
        let mut out = Vec::new();
        body.encode(&mut out);
        assert_eq!(wire::decode(&out), Ok(body));
    }
    if let Ok((epoch, _, body)) = wire::split_live(data) {
        assert!(!epoch.is_empty() && body.len() < data.len());
    }
});
