//! A Pusher connection moved from one engine to another as a hand-over moves it (the old
//! engine releases it, its mode-state section is encoded and decoded, the new engine resumes
//! it): it keeps its socket id, user and memberships and is counted in its application; one
//! whose application the new configuration lacks is told to reconnect at once (4200).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::atomic::Ordering::Relaxed;

use clarion_proto::handover_state;
use clarion_proto::ws::OpCode;

use super::handover_state::CarriedMode;
use super::state::{State, WsMode, WsRole};
use super::testkit::{after_head, server_frames, upgrade, Client, Harness};
use crate::config::pusher_apps::AppConfig;
use crate::config::Config;

fn config(key: &str) -> Config {
    Config {
        pusher_apps: vec![AppConfig {
            id: "1".into(),
            key: key.into(),
            secret: "app-secret".into(),
            enable_client_messages: false,
            max_connections: 0,
            client_event_rate: 10,
            max_event_bytes: 10_240,
            max_batch_events: 10,
            webhook_url: None,
        }],
        ping_interval: 0,
        idle_timeout: 0,
        ..Config::default()
    }
}

/// The Pusher messages the client got since the last call.
fn messages(c: &Client) -> Vec<serde_json::Value> {
    server_frames(&c.take())
        .into_iter()
        .filter(|(op, _)| *op == OpCode::Text)
        .map(|(_, p)| serde_json::from_slice(&p).unwrap())
        .collect()
}

/// A Pusher connection subscribed to `ticker`, and its socket id.
fn pusher_conn(h: &mut Harness) -> (Client, String) {
    let c = h.connect();
    h.send(&c, &upgrade("/app/k?protocol=7"));
    let out = c.take();
    assert!(out.starts_with(b"HTTP/1.1 101 "));
    let frames = server_frames(after_head(&out));
    let hello: serde_json::Value = serde_json::from_slice(&frames[0].1).unwrap();
    assert_eq!(hello["event"], "pusher:connection_established");
    let data: serde_json::Value = serde_json::from_str(hello["data"].as_str().unwrap()).unwrap();
    let sid = data["socket_id"].as_str().unwrap().to_owned();
    h.send_frame(
        &c,
        OpCode::Text,
        br#"{"event":"pusher:subscribe","data":{"channel":"ticker"}}"#,
    );
    let ok = messages(&c);
    assert_eq!(ok[0]["event"], "pusher_internal:subscription_succeeded");
    (c, sid)
}

/// Moves `from` of `old` to `new` through the record's section; the arriving socket is a
/// fresh connection put in the Pusher state the record names.
fn move_conn(old: &mut Harness, from: &Client, new: &mut Harness) -> Client {
    let mode = old
        .engine
        .release(from.key, Vec::new())
        .expect("a Pusher part");
    let mut bytes = Vec::new();
    handover_state::encode(&mode.wire(), &mut bytes);
    let mode = CarriedMode::from_wire(&handover_state::decode(&bytes).unwrap());
    let to = new.connect();
    new.engine
        .set_state(to.key, State::Ws(WsMode::new(WsRole::Pusher)));
    new.engine
        .resume(to.key, &["ticker".to_owned()], None, Some(&mode));
    to
}

#[test]
fn a_pusher_connection_moves_with_its_socket_id_and_takes_events_in_the_new_engine() {
    let mut old = Harness::new(config("k"));
    let (c, sid) = pusher_conn(&mut old);
    let mut new = Harness::new(config("k"));
    let moved = move_conn(&mut old, &c, &mut new);
    let p = new.engine.side.pusher().get(&moved.key).expect("its part");
    assert_eq!(p.socket_id.to_string(), sid, "the same socket id");
    assert_eq!(new.shared.pusher.get(0).unwrap().open.load(Relaxed), 1);
    new.publish("ticker", "{\"n\":1}");
    let got = messages(&moved);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (&got[0]["channel"], &got[0]["data"]),
        (&"ticker".into(), &"{\"n\":1}".into())
    );
}

#[test]
fn a_pusher_connection_whose_app_is_gone_is_told_to_reconnect_at_once() {
    let mut old = Harness::new(config("k"));
    let (c, _) = pusher_conn(&mut old);
    let mut new = Harness::new(config("another-key"));
    let moved = move_conn(&mut old, &c, &mut new);
    let out = server_frames(&moved.take());
    let error: serde_json::Value = serde_json::from_slice(&out[0].1).unwrap();
    assert_eq!(error["event"], "pusher:error");
    assert_eq!(error["data"]["code"], 4200);
    assert_eq!(out[1].0, OpCode::Close);
    assert_eq!(&out[1].1[..2], &4200u16.to_be_bytes());
    assert_eq!(new.shared.metrics.pusher.ws_count("handover_app_gone"), 1);
    assert!(new.engine.side.pusher().get(&moved.key).is_none());
}
