//! GRIP publish API bodies (`{"items": [...]}` from a backend): decoding never panics, and an
//! accepted item holds only what a connection can send as is: a channel, valid status and close
//! codes, control payloads that fit a frame, and header lines that cannot be split.
#![no_main]

use clarion_proto::grip::publish::{
    decode_publish, HttpResponseFormat, PublishLimits, WsMessage, WsMessageFormat,
};
use libfuzzer_sys::fuzz_target;

const LIMITS: PublishLimits = PublishLimits {
    max_body: 16 * 1024,
    max_items: 16,
};

fuzz_target!(|data: &[u8]| {
    let Ok(items) = decode_publish(data, &LIMITS) else {
        return;
    };
    assert!(items.len() <= LIMITS.max_items);
    for item in items {
        assert!(!item.channel.is_empty());
        assert!(
            item.http_response.is_some() || item.http_stream.is_some() || item.ws_message.is_some()
        );
        if let Some(HttpResponseFormat::Send(r)) = &item.http_response {
            assert!((100..=999).contains(&r.code));
            for (name, value) in &r.headers {
                assert!(!name.is_empty() && !name.contains([':', ' ', '\r', '\n']));
                assert!(!value.contains(['\r', '\n']));
            }
        }
        match &item.ws_message {
            Some(WsMessageFormat::Send {
                message: WsMessage::Ping(p) | WsMessage::Pong(p),
                ..
            }) => {
                assert!(p.len() <= 125)
            }
            Some(WsMessageFormat::Close { code, reason }) => {
                assert!(code.is_none_or(|c| c.is_sendable()));
                assert!(reason.len() <= 123);
            }
            _ => {}
        }
    }
});
