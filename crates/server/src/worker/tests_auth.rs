//! Authentication in the engine, under simulated time: refusals before the 101 or the stream
//! head, WebSocket subscribe/publish checks, `auth` and `refresh` messages, the expiry warning,
//! the close at `exp`, and streams ended with their `expired` event. Tokens are HS256, signed
//! here with ring; the integration suites use PyJWT and `jsonwebtoken`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use clarion_proto::ws::OpCode;

use super::testkit::{hs256, server_frames, upgrade, Client, Harness, UNIX_BASE};
use crate::config::Config;

const TEXT: OpCode = OpCode::Text;
const CLOSE: OpCode = OpCode::Close;
const SECRET: &str = "test-secret-of-some-length-000000";

fn config() -> Config {
    Config {
        auth_secret: Some(SECRET.into()),
        auth_public_topics: vec!["public.*".into()],
        auth_expiry_warning: 10,
        ping_interval: 0,
        idle_timeout: 0,
        ..Config::default()
    }
}

/// A token for `sub` expiring `exp_in` seconds after the harness clock's start.
fn token(exp_in: u64, subscribe: &[&str], publish: &[&str]) -> String {
    let claims = serde_json::json!({
        "sub": "alice",
        "exp": UNIX_BASE + exp_in,
        "clarion": { "subscribe": subscribe, "publish": publish },
    });
    hs256(SECRET, &claims)
}

fn texts(c: &Client) -> Vec<String> {
    server_frames(&c.take())
        .into_iter()
        .map(|(op, p)| {
            assert_eq!(op, TEXT);
            String::from_utf8(p).unwrap()
        })
        .collect()
}

fn open_ws(h: &mut Harness, target: &str) -> Client {
    let c = h.connect();
    h.send(&c, &upgrade(target));
    let head = c.take_text();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    c
}

fn control(h: &mut Harness, c: &Client, json: &str) -> Vec<String> {
    h.send_frame(c, OpCode::Text, json.as_bytes());
    texts(c)
}

#[test]
fn refused_upgrades_get_their_status_before_any_101() {
    let mut h = Harness::new(config());
    // No token for a protected topic: 401.
    let c = h.connect();
    h.send(&c, &upgrade("/ws?topic=secret"));
    let out = c.take_text();
    assert!(out.starts_with("HTTP/1.1 401 "), "{out}");
    assert!(out.contains(r#"{"error":"a token is required"}"#), "{out}");
    assert!(out.contains("WWW-Authenticate: Bearer"), "{out}");
    // A token that does not grant the topic: 403.
    let t = token(100, &["other"], &[]);
    let c = h.connect();
    h.send(&c, &upgrade(&format!("/ws?topic=secret&token={t}")));
    let out = c.take_text();
    assert!(out.starts_with("HTTP/1.1 403 "), "{out}");
    assert!(!out.contains(&t), "the token is never echoed");
    // A bad signature: 401, whatever the topic.
    let c = h.connect();
    let (signed, _) = t.rsplit_once('.').unwrap();
    let other = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"another secret");
    let tag = ring::hmac::sign(&other, signed.as_bytes());
    let forged = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()));
    h.send(&c, &upgrade(&format!("/ws?topic=public.a&token={forged}")));
    assert!(c.take_text().starts_with("HTTP/1.1 401 "));
    let m = &h.shared.metrics;
    assert_eq!(m.auth_failures("missing"), 1);
    assert_eq!(m.auth_failures("forbidden"), 1);
    assert_eq!(m.auth_failures("signature"), 1);
    // Public topics need no token; a granted topic with one succeeds.
    open_ws(&mut h, "/ws?topic=public.news");
    let t = token(100, &["secret"], &[]);
    let c = h.connect();
    let mut req = String::from_utf8(upgrade("/ws?topic=secret")).unwrap();
    req.insert_str(req.len() - 2, &format!("Authorization: Bearer {t}\r\n"));
    h.send(&c, req.as_bytes());
    assert!(c.take_text().starts_with("HTTP/1.1 101 "));
    h.publish("secret", "hi");
    assert_eq!(texts(&c), vec!["hi"]);
}

#[test]
fn websocket_subscribe_refusals_keep_the_connection() {
    let mut h = Harness::new(config());
    let c = open_ws(&mut h, "/ws");
    let r = control(&mut h, &c, r#"{"type":"subscribe","topic":"secret"}"#);
    assert!(
        r[0].contains("a token is required") && r[0].contains("secret"),
        "{r:?}"
    );
    let r = control(&mut h, &c, r#"{"type":"subscribe","topic":"public.x"}"#);
    assert!(r[0].contains("subscribed"), "{r:?}");
    let t = token(100, &["room.*"], &[]);
    let r = control(&mut h, &c, &format!(r#"{{"type":"auth","token":"{t}"}}"#));
    assert!(
        r[0].contains(r#""type":"authenticated""#) && r[0].contains("alice"),
        "{r:?}"
    );
    let r = control(&mut h, &c, r#"{"type":"subscribe","topic":"room.1"}"#);
    assert!(r[0].contains("subscribed"), "{r:?}");
    let r = control(&mut h, &c, r#"{"type":"subscribe","topic":"room"}"#);
    assert!(r[0].contains("does not grant"), "{r:?}");
    assert!(h.is_open(&c));
    h.publish("room.1", "m");
    assert_eq!(texts(&c), vec!["m"]);
}

#[test]
fn in_band_publish_needs_a_token_that_allows_the_topic() {
    let mut h = Harness::new(Config {
        allow_client_publish: true,
        ..config()
    });
    let c = open_ws(&mut h, "/ws?topic=public.chat");
    let publish = r#"{"type":"publish","topic":"public.chat","data":"x"}"#;
    let r = control(&mut h, &c, publish);
    assert!(r[0].contains("needs a token"), "{r:?}");
    let t = token(100, &[], &["public.*"]);
    control(&mut h, &c, &format!(r#"{{"type":"auth","token":"{t}"}}"#));
    let r = control(&mut h, &c, publish);
    assert!(
        r.iter().any(|m| m.contains(r#""type":"published""#)),
        "{r:?}"
    );
    let r = control(
        &mut h,
        &c,
        r#"{"type":"publish","topic":"other","data":"x"}"#,
    );
    assert!(r[0].contains("does not allow"), "{r:?}");
}

#[test]
fn websocket_is_warned_may_refresh_and_is_closed_at_exp() {
    let mut h = Harness::new(config());
    let t = token(30, &["t"], &[]);
    let c = open_ws(&mut h, &format!("/ws?topic=t&token={t}"));
    h.advance(19);
    assert!(c.take().is_empty());
    // Ten seconds before exp: the warning, once.
    h.advance(1);
    let w = texts(&c);
    assert_eq!(w.len(), 1);
    assert!(
        w[0].contains(r#""type":"expiring""#) && w[0].contains(r#""seconds":10"#),
        "{w:?}"
    );
    h.advance(5);
    assert!(c.take().is_empty());
    // A refresh with a fresh token moves the deadline.
    let fresh = token(60, &["t"], &[]);
    let r = control(
        &mut h,
        &c,
        &format!(r#"{{"type":"refresh","token":"{fresh}"}}"#),
    );
    assert!(r[0].contains("authenticated"), "{r:?}");
    h.advance(10);
    assert!(h.is_open(&c));
    h.publish("t", "still here");
    assert_eq!(texts(&c), vec!["still here"]);
    // An expired token as a refresh is refused; the connection keeps its current token.
    let stale = token(20, &["t"], &[]);
    let r = control(
        &mut h,
        &c,
        &format!(r#"{{"type":"refresh","token":"{stale}"}}"#),
    );
    assert!(r[0].contains("token expired"), "{r:?}");
    h.advance(15);
    assert!(texts(&c)[0].contains("expiring"));
    h.advance(9);
    assert!(c.take().is_empty());
    // At exp: close 4001.
    h.advance(1);
    let frames = server_frames(&c.take());
    assert_eq!(frames[0].0, CLOSE);
    assert_eq!(u16::from_be_bytes([frames[0].1[0], frames[0].1[1]]), 4001);
    assert_eq!(h.shared.metrics.auth_failures("expired_connection"), 1);
}

#[test]
fn a_refresh_that_narrows_the_grants_drops_subscriptions() {
    let mut h = Harness::new(config());
    let t = token(100, &["a", "b"], &[]);
    let c = open_ws(&mut h, &format!("/ws?topic=a&topic=b&token={t}"));
    let narrower = token(200, &["a"], &[]);
    let r = control(
        &mut h,
        &c,
        &format!(r#"{{"type":"refresh","token":"{narrower}"}}"#),
    );
    assert!(
        r[1].contains("unsubscribed") && r[1].contains(r#""topic":"b""#),
        "{r:?}"
    );
    h.publish("b", "gone");
    assert!(c.take().is_empty());
}

#[test]
fn without_anonymous_access_a_websocket_must_authenticate_in_time() {
    let mut h = Harness::new(Config {
        auth_anonymous: false,
        handshake_timeout: 5,
        ..config()
    });
    let c = open_ws(&mut h, "/ws");
    let r = control(&mut h, &c, r#"{"type":"subscribe","topic":"public.a"}"#);
    assert!(r[0].contains("a token is required"), "{r:?}");
    h.advance(5);
    let frames = server_frames(&c.take());
    assert_eq!(frames[0].0, CLOSE);
    assert_eq!(u16::from_be_bytes([frames[0].1[0], frames[0].1[1]]), 4002);
    // One that authenticates stays.
    let c = open_ws(&mut h, "/ws");
    let t = token(100, &[], &[]);
    control(&mut h, &c, &format!(r#"{{"type":"auth","token":"{t}"}}"#));
    let r = control(&mut h, &c, r#"{"type":"subscribe","topic":"public.a"}"#);
    assert!(r[0].contains("subscribed"), "{r:?}");
    h.advance(10);
    assert!(h.is_open(&c));
    // HTTP subscriptions without a token are refused outright.
    let s = h.connect();
    h.send(&s, b"GET /sse?topic=public.a HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(s.take_text().starts_with("HTTP/1.1 401 "));
}

#[test]
fn streams_end_with_an_expired_event_at_exp() {
    let mut h = Harness::new(config());
    let t = token(8, &["t"], &[]);
    let sse = h.connect();
    let cookie =
        format!("GET /sse?topic=t HTTP/1.1\r\nHost: x\r\nCookie: a=b; clarion_token={t}\r\n\r\n");
    h.send(&sse, cookie.as_bytes());
    assert!(sse.take_text().starts_with("HTTP/1.1 200 "));
    let nd = h.connect();
    h.send(
        &nd,
        format!("GET /stream?topic=t&token={t} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    );
    assert!(nd.take_text().starts_with("HTTP/1.1 200 "));
    let poll = h.connect();
    h.send(
        &poll,
        format!("GET /poll?topic=t&timeout=30&token={t} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    );
    assert!(poll.take().is_empty());
    h.advance(7);
    assert!(!sse.take_text().contains("expired"));
    h.advance(1);
    let out = sse.take_text();
    assert!(
        out.contains("event: expired\ndata: {\"error\":\"token expired\"}\n\n"),
        "{out}"
    );
    assert!(sse.write_shut());
    let out = nd.take_text();
    assert!(
        out.contains("{\"type\":\"expired\"}\n") && out.ends_with("0\r\n\r\n"),
        "{out}"
    );
    let out = poll.take_text();
    assert!(
        out.starts_with("HTTP/1.1 401 ") && out.contains("token expired"),
        "{out}"
    );
    assert_eq!(h.shared.metrics.auth_failures("expired_connection"), 3);
    // The shared grant set went with the last connection that held it.
    assert_eq!(h.engine.side.grants().distinct(), 0);
}

#[test]
fn query_tokens_can_be_turned_off() {
    let mut h = Harness::new(Config {
        auth_query_token: false,
        ..config()
    });
    let t = token(100, &["t"], &[]);
    let c = h.connect();
    h.send(
        &c,
        format!("GET /sse?topic=t&token={t} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    );
    let out = c.take_text();
    assert!(out.starts_with("HTTP/1.1 401 "), "{out}");
    let c = h.connect();
    let req = format!("GET /sse?topic=t HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\n\r\n");
    h.send(&c, req.as_bytes());
    assert!(c.take_text().starts_with("HTTP/1.1 200 "));
}

#[test]
fn without_auth_configuration_nothing_changes() {
    let mut h = Harness::new(Config::default());
    let c = open_ws(&mut h, "/ws?topic=secret&token=garbage");
    h.publish("secret", "x");
    assert_eq!(texts(&c), vec!["x"]);
    let r = control(&mut h, &c, r#"{"type":"auth","token":"x"}"#);
    assert!(r[0].contains("not configured"), "{r:?}");
}

/// What a cookie-carrying SSE request with `extra` header lines is answered.
fn cookie_sse_status(h: &mut Harness, extra: &str) -> String {
    let t = token(60, &["t"], &[]);
    let c = h.connect();
    let req = format!(
        "GET /sse?topic=t HTTP/1.1\r\nHost: push.example.com\r\nCookie: clarion_token={t}\r\n{extra}\r\n"
    );
    h.send(&c, req.as_bytes());
    c.take_text()
}

#[test]
fn the_token_cookie_does_not_count_on_a_subresource_another_page_made() {
    let mut h = Harness::new(Config {
        allowed_origins: vec!["https://app.example.com".into()],
        ..config()
    });
    // An <img> or no-cors fetch from a sibling subdomain (or another site): no Origin, and the
    // browser says another page made it.
    for site in ["same-site", "cross-site"] {
        let out = cookie_sse_status(
            &mut h,
            &format!("Sec-Fetch-Mode: no-cors\r\nSec-Fetch-Site: {site}\r\n"),
        );
        assert!(out.starts_with("HTTP/1.1 403 "), "{site}: {out}");
        assert!(out.contains("Sec-Fetch-Site"), "{out}");
    }
    // The server's own page, an address the user typed, a client that is not a browser.
    for extra in [
        "Sec-Fetch-Site: same-origin\r\n",
        "Sec-Fetch-Site: none\r\n",
        "",
    ] {
        let out = cookie_sse_status(&mut h, extra);
        assert!(out.starts_with("HTTP/1.1 200 "), "{extra:?}: {out}");
    }
    // A same-site request that names an allowed Origin (a CORS EventSource) counts; one that
    // names another does not.
    let allowed = "Sec-Fetch-Site: same-site\r\nOrigin: https://app.example.com\r\n";
    assert!(cookie_sse_status(&mut h, allowed).starts_with("HTTP/1.1 200 "));
    let other = "Sec-Fetch-Site: same-site\r\nOrigin: https://blog.example.com\r\n";
    assert!(cookie_sse_status(&mut h, other).starts_with("HTTP/1.1 403 "));
}
