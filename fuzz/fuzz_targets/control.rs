//! In-band control messages (JSON text from WebSocket clients): parsing never panics, anything
//! accepted is a JSON object whose `type` names the request, a publish's data decodes to binary
//! exactly when it names an encoding, and every refusal has a message for the client.
#![no_main]

use clarion_proto::pubsub::control::{decode_data, parse, Request};
use clarion_proto::ws::DataKind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(req) => {
            let v: serde_json::Value = serde_json::from_slice(data).expect("accepted means JSON");
            let ty = v.get("type").and_then(|t| t.as_str()).expect("a type");
            let want = match req {
                Request::Subscribe { .. } => "subscribe",
                Request::Unsubscribe { .. } => "unsubscribe",
                Request::Publish { data, encoding, .. } => {
                    match decode_data(&data, encoding.as_deref()) {
                        Ok((kind, _)) => assert_eq!(kind == DataKind::Binary, encoding.is_some()),
                        Err(why) => assert!(!why.to_string().is_empty()),
                    }
                    "publish"
                }
                Request::Auth { .. } => "auth",
                Request::Refresh { .. } => "refresh",
                Request::Presence { .. } => "presence",
            };
            assert_eq!(ty, want);
        }
        Err(why) => assert!(!why.to_string().is_empty()),
    }
});
