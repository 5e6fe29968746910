//! GRIP WebSocket-over-HTTP bodies (`application/websocket-events` from a backend): decoding never
//! panics, gives the same events whether the body arrives whole or a byte at a time, and what it
//! accepts re-encodes to something that decodes to the same events.
#![no_main]

use clarion_proto::grip::websocket_events::{decode_body, decode_event, write_event, EventLimits};
use libfuzzer_sys::fuzz_target;

const LIMITS: EventLimits = EventLimits {
    max_content: 4096,
    max_events: 64,
};

fuzz_target!(|data: &[u8]| {
    let whole = decode_body(data, &LIMITS);

    // Byte by byte: an event appears exactly when its last byte arrives.
    let mut split = Vec::new();
    let mut start = 0;
    for end in 1..=data.len() {
        match decode_event(&data[start..end], &LIMITS) {
            Ok(Some((event, used))) => {
                assert!(used <= end - start);
                split.push(event);
                start += used;
            }
            Ok(None) => {}
            Err(_) => break,
        }
    }
    if let Ok(events) = &whole {
        assert_eq!(events, &split[..events.len().min(split.len())]);
        assert_eq!(events.len(), split.len());

        let mut wire = Vec::new();
        for e in events {
            write_event(&mut wire, e);
        }
        assert_eq!(decode_body(&wire, &LIMITS).as_ref(), Ok(events));
    }
});
