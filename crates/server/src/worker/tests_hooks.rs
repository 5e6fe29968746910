//! Backend hooks in the engine, under simulated time: a request waits for the `connect` hook
//! in the `Proxy` state (every transport) and is routed with its answer; subscribe and publish
//! control messages wait for their hooks while later messages queue behind them; failures
//! follow the policy; answers for connections that left are ignored.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use clarion_proto::ws::OpCode;

use super::testkit::{server_frames, upgrade, Client, Harness};
use crate::config::Config;
use crate::grip::backend::Job;

fn config() -> Config {
    Config {
        hook_connect_url: Some("http://127.0.0.1:9/connect".into()),
        hook_subscribe_url: Some("http://127.0.0.1:9/subscribe".into()),
        hook_publish_url: Some("http://127.0.0.1:9/publish".into()),
        hook_secret: Some("s3cret".into()),
        allow_client_publish: true,
        ping_interval: 0,
        idle_timeout: 0,
        ..Config::default()
    }
}

fn body_of(job: &Job) -> serde_json::Value {
    let text = String::from_utf8(job.request.clone()).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("Clarion-Signature: t="), "{head}");
    serde_json::from_str(body).unwrap()
}

fn texts(c: &Client) -> Vec<String> {
    server_frames(&c.take())
        .into_iter()
        .map(|(_, p)| String::from_utf8(p).unwrap())
        .collect()
}

/// Opens a WebSocket through the connect hook, answered with `answer`.
fn open(h: &mut Harness, target: &str, cookie: &str, answer: &str) -> Client {
    let c = h.connect();
    let mut req = String::from_utf8(upgrade(target)).unwrap();
    req.insert_str(req.len() - 2, &format!("Cookie: {cookie}\r\n"));
    h.send(&c, req.as_bytes());
    assert_eq!(c.take_text(), "", "nothing is answered before the hook");
    let job = h.next_hook_call().expect("connect hook called");
    let body = body_of(&job);
    assert_eq!(body["type"], "connect");
    assert_eq!(body["transport"], "ws");
    h.answer_hook(&job, 200, answer.as_bytes());
    c
}

#[test]
fn connect_waits_then_allows_with_identity_and_grants() {
    let mut h = Harness::new(config());
    let c = open(
        &mut h,
        "/ws?topic=chat.a",
        "session=s1",
        r#"{"allow":true,"sub":"alice","subscribe":["chat.*"],"publish":["chat.*"],"topics":["news"]}"#,
    );
    let head = c.take_text();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    // Subscribed to the requested topic and to the one the answer added.
    h.publish("chat.a", "m1");
    h.publish("news", "m2");
    assert_eq!(texts(&c), ["m1", "m2"]);
    // A granted topic needs no hook; one outside the grants asks the subscribe hook.
    h.send_frame(
        &c,
        OpCode::Text,
        br#"{"type":"subscribe","topic":"chat.b"}"#,
    );
    assert!(texts(&c)[0].contains("subscribed"));
    assert!(h.next_hook_call().is_none());
    h.send_frame(
        &c,
        OpCode::Text,
        br#"{"type":"subscribe","topic":"secret"}"#,
    );
    // A later message waits behind the hook call, in order.
    h.send_frame(
        &c,
        OpCode::Text,
        br#"{"type":"subscribe","topic":"chat.c"}"#,
    );
    assert!(texts(&c).is_empty());
    let job = h.next_hook_call().expect("subscribe hook called");
    let body = body_of(&job);
    assert_eq!(body["sub"], "alice");
    assert_eq!(body["topic"], "secret");
    h.answer_hook(&job, 200, br#"{"allow":false,"reason":"not yours"}"#);
    let out = texts(&c);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        out[0].contains("not yours") && out[0].contains("secret"),
        "{out:?}"
    );
    assert!(
        out[1].contains("subscribed") && out[1].contains("chat.c"),
        "{out:?}"
    );
}

#[test]
fn connect_refusal_and_failure_answer_before_any_upgrade() {
    let mut h = Harness::new(config());
    let c = open(
        &mut h,
        "/ws?topic=a",
        "session=bad",
        r#"{"allow":false,"status":401,"reason":"log in first"}"#,
    );
    let out = c.take_text();
    assert!(out.starts_with("HTTP/1.1 401 "), "{out}");
    assert!(out.contains("log in first"), "{out}");
    // Invalid JSON: the documented failure answer, 503 with Retry-After.
    let c = open(&mut h, "/ws?topic=a", "session=x", "{nope");
    let out = c.take_text();
    assert!(out.starts_with("HTTP/1.1 503 "), "{out}");
    assert!(out.contains("Retry-After: 1"), "{out}");
    // A redirect is not followed.
    let c = h.connect();
    h.send(&c, &upgrade("/ws?topic=a"));
    let job = h.next_hook_call().unwrap();
    h.answer_hook(&job, 302, b"");
    assert!(c.take_text().starts_with("HTTP/1.1 503 "));
    assert_eq!(
        h.shared.metrics.hooks.calls[0][2].load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[test]
fn every_http_transport_waits_for_connect() {
    let mut h = Harness::new(config());
    let mut clients = Vec::new();
    for (target, want) in [
        ("/sse?topic=a", "text/event-stream"),
        ("/stream?topic=a", "application/x-ndjson"),
        ("/poll?topic=a&timeout=5", ""),
    ] {
        let c = h.connect();
        h.send(
            &c,
            format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        );
        assert_eq!(c.take_text(), "");
        let job = h.next_hook_call().unwrap();
        let transport = body_of(&job)["transport"].clone();
        assert_eq!(transport, target[1..].split('?').next().unwrap());
        h.answer_hook(&job, 200, br#"{"allow":true}"#);
        let out = c.take_text();
        if want.is_empty() {
            assert_eq!(out, "", "a long-poll is held");
        } else {
            assert!(
                out.starts_with("HTTP/1.1 200 ") && out.contains(want),
                "{out}"
            );
        }
        clients.push(c);
    }
    h.publish("a", "zz-payload");
    for c in &clients {
        assert!(c.take_text().contains("zz-payload"));
    }
}

#[test]
fn publish_data_is_replaced_and_answers_for_gone_connections_are_ignored() {
    let mut h = Harness::new(config());
    let c = open(
        &mut h,
        "/ws?topic=room",
        "s=1",
        r#"{"allow":true,"sub":"bob"}"#,
    );
    assert!(c.take_text().starts_with("HTTP/1.1 101 "));
    h.send_frame(
        &c,
        OpCode::Text,
        br#"{"type":"publish","topic":"room","data":"hello"}"#,
    );
    let job = h.next_hook_call().unwrap();
    assert_eq!(body_of(&job)["data"], "hello");
    h.answer_hook(&job, 200, br#"{"allow":true,"data":"[filtered]"}"#);
    h.engine.handle_inbox(h.now);
    let out = texts(&c);
    assert!(out.iter().any(|t| t == "[filtered]"), "{out:?}");
    assert!(out.iter().any(|t| t.contains("published")), "{out:?}");
    // A connection that leaves while its hook call is out: the late answer does nothing.
    let d = h.connect();
    h.send(&d, &upgrade("/ws?topic=a"));
    let job = h.next_hook_call().unwrap();
    h.hang_up(&d);
    assert!(!h.is_open(&d));
    h.answer_hook(&job, 200, br#"{"allow":true}"#);
    assert_eq!(h.engine.side.hooks().waiting(), 0);
    assert_eq!(h.counts()[1], 1, "only the first WebSocket is open");
}

#[test]
fn cached_answers_are_reused_and_refusals_only_briefly() {
    let mut h = Harness::new(Config {
        hook_cache_ttl: 60,
        hook_cache_refusal_ttl: 2,
        ..config()
    });
    let c = open(&mut h, "/ws", "s=1", r#"{"allow":true,"sub":"carol"}"#);
    assert!(c.take_text().starts_with("HTTP/1.1 101 "));
    // The same connect request again: answered from the cache, no call.
    let d = h.connect();
    let mut req = String::from_utf8(upgrade("/ws")).unwrap();
    req.insert_str(req.len() - 2, "Cookie: s=1\r\n");
    h.send(&d, req.as_bytes());
    assert!(d.take_text().starts_with("HTTP/1.1 101 "));
    assert!(h.next_hook_call().is_none());
    // A refused subscribe is cached for 2 s only.
    h.send_frame(&c, OpCode::Text, br#"{"type":"subscribe","topic":"x"}"#);
    let job = h.next_hook_call().unwrap();
    h.answer_hook(&job, 200, br#"{"allow":false}"#);
    assert!(texts(&c)[0].contains("refused"));
    h.send_frame(&d, OpCode::Text, br#"{"type":"subscribe","topic":"x"}"#);
    assert!(texts(&d)[0].contains("refused"));
    assert!(
        h.next_hook_call().is_none(),
        "the refusal came from the cache"
    );
    h.engine.set_unix_base(h.engine.anchors.unix + 3);
    h.send_frame(&d, OpCode::Text, br#"{"type":"subscribe","topic":"x"}"#);
    assert!(h.next_hook_call().is_some(), "the cached refusal expired");
}

#[test]
fn a_webhook_alone_turns_hooks_on_in_the_test_kit_as_in_production() {
    // Before the kit and the server decided it the same way, only a hook URL did.
    let config = Config {
        webhook_url: Some("http://127.0.0.1:9/events".into()),
        ..Config::default()
    };
    assert!(crate::hooks::Hooks::configured(&config));
    let h = Harness::new(config);
    assert!(h.shared.hooks.is_some());
    let h = Harness::new(Config::default());
    assert!(h.shared.hooks.is_none());
}
