//! `POST /publish` bodies: decoding never panics, and a batch that is accepted has only valid
//! topic and event names, text payloads that are UTF-8, and nothing else.
#![no_main]

use clarion_proto::pubsub::{decode_batch, validate_event_name, validate_topic};
use clarion_proto::ws::DataKind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode_batch(data) {
        Ok(batch) => {
            for m in batch {
                assert!(validate_topic(&m.topic).is_ok());
                if let Some(e) = &m.event {
                    assert!(validate_event_name(e).is_ok());
                }
                if m.kind == DataKind::Text {
                    assert!(std::str::from_utf8(&m.payload).is_ok());
                }
            }
        }
        Err(why) => assert!(why.to_string().len() < 4096 + data.len()),
    }
});
