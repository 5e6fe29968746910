//! The Pusher client message decoder (`clarion_proto::pusher::client`): bytes from a WebSocket
//! never panic; what decodes respects the limits (a relayed client event's data is JSON and fits
//! the message bound, a channel is valid), and a subscription's member data never panics either.
#![no_main]

use clarion_proto::pusher::channel::classify;
use clarion_proto::pusher::client::{decode, signin_user_id, ClientMessage, Member};
use clarion_proto::pusher::Limits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    match decode(data, &limits) {
        Ok(ClientMessage::Subscribe(s)) => {
            assert_eq!(classify(&s.channel), Ok(s.kind));
            if let Some(d) = &s.channel_data {
                if let Ok(m) = Member::parse(d, &limits) {
                    assert!(!m.user_id.is_empty() && m.user_id.len() <= limits.max_user_id);
                    assert!(m.user_info.is_none_or(|i| i.len() <= limits.max_user_info));
                }
            }
        }
        Ok(ClientMessage::ClientEvent { event, channel, data }) => {
            assert!(event.starts_with("client-") && event.len() <= limits.max_event_name);
            assert!(classify(&channel).is_ok());
            assert!(serde_json::from_str::<serde_json::Value>(&data).is_ok());
        }
        Ok(ClientMessage::Signin { user_data, .. }) => {
            let _ = signin_user_id(&user_data, &limits);
        }
        Ok(ClientMessage::Unsubscribe { channel }) => assert!(classify(&channel).is_ok()),
        Ok(ClientMessage::Ping | ClientMessage::Pong) | Err(_) => {}
    }
});
