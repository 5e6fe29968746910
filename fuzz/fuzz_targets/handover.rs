//! Hand-over frames, as the replacing (or replaced) process reads them from its peer: decoding
//! never panics; a frame that decodes re-encodes to the same bytes; any prefix of a valid frame
//! asks for more bytes rather than failing or inventing a frame. The parked TLS 1.3 record layer
//! inside a connection record is also decoded on its own from the same bytes: it never panics,
//! and what decodes re-encodes to the same bytes.
#![no_main]

use clarion_proto::handover::{decode, encode};
use clarion_proto::tls13::Parked;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Parked::decode(data) {
        let mut out = Vec::new();
        p.encode(&mut out);
        assert_eq!(&out[..], data, "parked TLS state re-encodes to its bytes");
    }
    let mut at = 0;
    while let Ok(Some((frame, used))) = decode(&data[at..]) {
        let mut out = Vec::new();
        encode(&frame, &mut out);
        assert_eq!(&out[..], &data[at..at + used], "re-encodes to its bytes");
        for cut in [0, used / 2, used - 1] {
            assert_eq!(decode(&data[at..at + cut]), Ok(None));
        }
        at += used;
    }
});
