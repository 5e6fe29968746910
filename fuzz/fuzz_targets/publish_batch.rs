//! `POST /publish` bodies: decoding never panics, every message that is accepted has a valid
//! topic, event name and key and a text payload that is UTF-8, an accepted fragment is text
//! without event, conflation key or tags, and every refusal is worded.
#![no_main]

use clarion_proto::pubsub::{
    decode_batch, validate_event_name, validate_key, validate_topic, FragmentOp,
};
use clarion_proto::ws::DataKind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode_batch(data) {
        Ok(batch) => {
            for m in batch {
                let m = match m {
                    Ok(m) => m,
                    Err(r) => {
                        assert!(r.error.to_string().len() < 4096 + data.len());
                        continue;
                    }
                };
                assert!(validate_topic(&m.topic).is_ok());
                if let Some(k) = &m.key {
                    assert!(validate_key(k).is_ok());
                }
                if let Some(e) = &m.event {
                    assert!(validate_event_name(e).is_ok());
                }
                if m.kind == DataKind::Text {
                    assert!(std::str::from_utf8(&m.payload).is_ok());
                }
                match &m.fragment {
                    Some(FragmentOp::Open | FragmentOp::Append { .. }) => {
                        assert_eq!(m.kind, DataKind::Text);
                        assert!(m.event.is_none() && m.conflation_key.is_none());
                        assert!(m.tags.is_empty());
                    }
                    None => {}
                }
            }
        }
        Err(why) => assert!(why.to_string().len() < 4096 + data.len()),
    }
});
