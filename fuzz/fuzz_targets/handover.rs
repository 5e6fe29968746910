//! Hand-over frames, as the replacing (or replaced) process reads them from its peer: decoding
//! never panics; a frame that decodes re-encodes to the same bytes; any prefix of a valid frame
//! asks for more bytes rather than failing or inventing a frame. The same input is also read as
//! a connection record's mode-state section (auth, hooks, presence), which must hold to the same
//! rules: no panic, one encoding per state, and no prefix of a valid section is one; and as the
//! parked TLS 1.3 record layer inside a connection record, and as the parked HTTP/2 connection
//! of an HTTP/2 record: neither panics, and what decodes re-encodes to the same bytes. A
//! connection record's permessage-deflate windows (its own, or its HTTP/2 streams') prime
//! fresh streams without panicking, whatever their bytes. The input is also read as a
//! connection record's GRIP part alone (a held stream's keep-alive, a GRIP long-poll's hold):
//! no panic, and what decodes re-encodes to the same bytes.
#![no_main]

use clarion_proto::h2::server::Connection;
use clarion_proto::handover::{decode, encode, ConnRecord, Frame};
use clarion_proto::ws::deflate::{Compressor, Inflater};
use clarion_proto::{handover_grip, handover_state};
use clarion_proto::tls13::Parked;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Parked::decode(data) {
        let mut out = Vec::new();
        p.encode(&mut out);
        assert_eq!(&out[..], data, "parked TLS state re-encodes to its bytes");
    }
    if let Ok(c) = Connection::restore(data) {
        let mut out = Vec::new();
        c.park(&mut out);
        assert_eq!(&out[..], data, "a parked HTTP/2 connection re-encodes to its bytes");
    }
    if let Ok(part) = handover_grip::decode_part(data) {
        let mut out = Vec::new();
        handover_grip::encode(part.as_ref(), &mut out);
        assert_eq!(&out[..], data, "a GRIP part re-encodes to its bytes");
    }
    let mut at = 0;
    while let Ok(Some((frame, used))) = decode(&data[at..]) {
        let mut out = Vec::new();
        encode(&frame, &mut out);
        assert_eq!(&out[..], &data[at..at + used], "re-encodes to its bytes");
        if let Frame::Conns(list) = &frame {
            let streams = list
                .iter()
                .flat_map(|r| r.h2.iter().flat_map(|h| h.streams.iter().map(|(_, s)| s)));
            let all: Vec<&ConnRecord<'_>> = list.iter().chain(streams).collect();
            for r in all {
                if let Some(w) = r.deflate.deflater {
                    let mut c = Compressor::resume(6, 9, 1, w);
                    let _ = c.compress(b"next");
                }
                if let Some(w) = r.deflate.inflater {
                    if let Some(mut i) = Inflater::resume(9, w) {
                        let _ = i.inflate(w, 1 << 16, &mut Vec::new());
                    }
                }
            }
        }
        for cut in [0, used / 2, used - 1] {
            assert_eq!(decode(&data[at..at + cut]), Ok(None));
        }
        at += used;
    }
    if let Ok(state) = handover_state::decode(data) {
        let mut out = Vec::new();
        handover_state::encode(&state, &mut out);
        assert_eq!(&out[..], data, "a state section re-encodes to its bytes");
        assert!(handover_state::decode(&data[..data.len() - 1]).is_err());
    }
});
