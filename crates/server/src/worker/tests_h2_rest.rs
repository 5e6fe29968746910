//! HTTP/2 connections at rest (`super::h2_rest`), in memory under simulated time: an idle
//! connection of one stream rests after `REST_AFTER` sweeps that found it unused, and wakes,
//! unchanged for its client, for a message, a frame, its end; a connection that may not rest
//! stays awake, and one that hears a message every few seconds never rests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::atomic::Ordering::Relaxed;

use clarion_proto::h2::frame::{self, ErrorCode, Frame, PREFACE};

use super::h2_rest::{Held, REST_AFTER};
use super::testkit::{Client, Harness};
use super::tests_h2::get;
use crate::config::Config;

const REST: u32 = REST_AFTER as u32;

fn config() -> Config {
    Config {
        handshake_timeout: 30,
        ..Config::default()
    }
}

/// An h2c connection with one SSE stream (1) on topic `t`, its opening taken.
fn one_stream(h: &mut Harness) -> Client {
    let c = h.connect();
    let mut v = PREFACE.to_vec();
    frame::write_settings(&mut v, &[]);
    frame::write_settings_ack(&mut v);
    get(&mut v, 1, "/sse?topic=t", true);
    h.send(&c, &v);
    assert!(!c.take().is_empty(), "SETTINGS and the answer's head");
    c
}

fn resting(h: &Harness, c: &Client) -> bool {
    h.engine.side.h2().get(&c.key).is_some_and(Held::is_resting)
}

fn gauge(h: &Harness) -> u64 {
    h.shared.metrics.h2_resting.load(Relaxed)
}

/// The DATA payloads on stream 1 and whether a PING acknowledgement came.
fn read(bytes: &[u8]) -> (Vec<u8>, bool) {
    let (mut data, mut pong, mut rest) = (Vec::new(), false, bytes);
    while let Ok(Some((f, used))) = frame::parse(rest, 1 << 24) {
        match f {
            Frame::Data {
                stream: 1, data: d, ..
            } => data.extend_from_slice(d),
            Frame::Ping { ack: true, .. } => pong = true,
            Frame::GoAway { code, .. } => panic!("GOAWAY {code}"),
            Frame::RstStream { code, .. } => panic!("RST_STREAM {code}"),
            _ => {}
        }
        rest = &rest[used..];
    }
    (data, pong)
}

#[test]
fn an_idle_connection_rests_after_an_unused_sweep_and_wakes_for_what_comes() {
    let mut h = Harness::new(config());
    let c = one_stream(&mut h);
    h.advance(REST - 1);
    assert!(!resting(&h, &c), "not quiet for long enough");
    h.advance(1);
    assert!(resting(&h, &c));
    assert_eq!(gauge(&h), 1);

    // A message wakes it, and goes out as it would have.
    h.publish("t", "first");
    let (data, _) = read(&c.take());
    assert!(
        String::from_utf8_lossy(&data).contains("data: first\n"),
        "{data:?}"
    );
    assert!(!resting(&h, &c));
    assert_eq!(gauge(&h), 0);

    // So does a frame from the client.
    h.advance(REST);
    assert!(resting(&h, &c));
    let mut ping = Vec::new();
    frame::write_ping(&mut ping, *b"12345678", false);
    h.send(&c, &ping);
    let (_, pong) = read(&c.take());
    assert!(pong, "the PING answered");
    assert!(!resting(&h, &c));

    // A stream window update the client sends while it rests is kept.
    h.advance(REST);
    let mut more = Vec::new();
    frame::write_window_update(&mut more, 1, 1_000_000);
    frame::write_window_update(&mut more, 0, 1_000_000);
    h.send(&c, &more);
    h.advance(REST);
    assert!(resting(&h, &c));
    let big = "x".repeat(100_000);
    h.publish("t", &big);
    let (data, _) = read(&c.take());
    assert!(
        data.len() > 100_000,
        "within the opened windows: {}",
        data.len()
    );

    // A message every few seconds keeps it awake: it does not rest and wake per message.
    for i in 0..4 {
        h.publish("t", &format!("tick {i}"));
        h.advance(REST - 1);
        assert!(!resting(&h, &c), "tick {i}");
    }
    c.take();

    // Its end, while it rests, takes its stream record with it.
    h.advance(REST);
    assert!(resting(&h, &c));
    h.hang_up(&c);
    h.advance(1);
    assert!(h.engine.side.h2().is_empty());
    assert!(h.engine.side.h2_streams().is_empty());
    assert_eq!(h.shared.metrics.h2_streams.load(Relaxed), 0);
    assert_eq!(gauge(&h), 0);
}

#[test]
fn a_connection_that_may_not_rest_stays_awake() {
    let mut h = Harness::new(config());
    // Two streams.
    let two = one_stream(&mut h);
    let mut v = Vec::new();
    get(&mut v, 3, "/sse?topic=u", true);
    h.send(&two, &v);
    // A stream whose client reset it: none left.
    let none = one_stream(&mut h);
    let mut v = Vec::new();
    frame::write_rst_stream(&mut v, 1, ErrorCode::Cancel);
    h.send(&none, &v);
    h.advance(REST + 1);
    assert!(!resting(&h, &two));
    assert!(!resting(&h, &none));
    assert_eq!(gauge(&h), 0);

    // Told to go (the server shuts down) while resting: woken, and its GOAWAY goes out.
    let lone = one_stream(&mut h);
    h.advance(REST);
    assert!(resting(&h, &lone));
    h.shutdown();
    let mut rest = &lone.take()[..];
    let mut goaway = None;
    while let Ok(Some((f, used))) = frame::parse(rest, 1 << 24) {
        if let Frame::GoAway { code, .. } = f {
            goaway = Some(code);
        }
        rest = &rest[used..];
    }
    assert_eq!(goaway, Some(ErrorCode::NoError as u32));
    assert!(!resting(&h, &lone));
}
