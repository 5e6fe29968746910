//! The NATS reader (server operations), the subject mapping and server URL lists: nothing
//! panics; every decoded operation uses at least one byte and no more than it was given, and
//! never more than the limits allow; feeding the same bytes in two parts, as a client reading
//! a socket would, gives the same operations; a subject that maps back to a topic maps to the
//! same subject again.
#![no_main]

use clarion_proto::nats::{decode, parse_servers, DecodeError, Limits, ServerOp, SubjectMap};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_line: 512,
    max_payload: 4096,
};

/// Every operation in `data`, with what ended the run (`None`: more bytes needed).
fn all(data: &[u8]) -> (Vec<(String, usize)>, Option<DecodeError>) {
    let mut ops = Vec::new();
    let mut at = 0;
    loop {
        match decode(&data[at..], &LIMITS) {
            Ok(Some((op, used))) => {
                assert!(used > 0 && used <= data.len() - at);
                assert!(used <= LIMITS.max_line + LIMITS.max_payload + 4);
                if let ServerOp::Msg { payload, .. } | ServerOp::HMsg { payload, .. } = &op {
                    assert!(payload.len() <= LIMITS.max_payload);
                }
                ops.push((format!("{op:?}"), used));
                at += used;
            }
            Ok(None) => return (ops, None),
            Err(e) => {
                assert!(!e.to_string().is_empty());
                return (ops, Some(e));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (ops, end) = all(data);
    // A prefix never holds an error the whole input does not, nor different operations.
    let cut = data.first().map_or(0, |b| *b as usize % (data.len() + 1));
    let (prefix_ops, prefix_end) = all(&data[..cut]);
    assert!(prefix_ops.len() <= ops.len());
    assert_eq!(prefix_ops[..], ops[..prefix_ops.len()]);
    if let Some(e) = prefix_end {
        assert_eq!(Some(e), end);
    }
    let map = SubjectMap::default();
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(topic) = map.topic(text) {
            assert_eq!(map.subject(&topic).as_deref(), Ok(text));
        }
        if let Ok(subject) = map.subject(text) {
            assert_eq!(map.topic(&subject).as_deref(), Some(text));
        }
        let _ = parse_servers(text);
    }
});
