//! Chunked bodies: the decoder must never panic, never produce more than its limit, and give
//! the same result whether input arrives whole or byte by byte.
#![no_main]

use clarion_proto::http1::ChunkedDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut whole = Vec::new();
    let a = ChunkedDecoder::new(1024).decode(data, &mut whole);
    assert!(whole.len() <= 1024);
    let mut dec = ChunkedDecoder::new(1024);
    let mut split = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut b = Ok((0, false));
    for byte in data {
        pending.push(*byte);
        b = dec.decode(&pending, &mut split);
        match b {
            Ok((used, done)) => {
                pending.drain(..used);
                if done {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    if let (Ok((_, true)), Ok((_, true))) = (&a, &b) {
        assert_eq!(whole, split);
    }
});
