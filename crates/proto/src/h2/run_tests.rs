//! [`Connection::respond_run`]: a run of messages to one stream framed together.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::tests::{frames, grant, windowed, with_gets};
use super::*;

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";

/// An event stream on stream 1, its head framed, the client's stream window `window`.
fn event_stream(window: u32) -> Connection {
    let mut c = windowed(window, "/sse?topic=a");
    c.bind(1, 7);
    let mut out = Vec::new();
    assert_eq!(c.respond(1, SSE_HEAD, &mut out), SSE_HEAD.len());
    c
}

/// The DATA payload in `out`, and how many DATA frames carried it.
fn payload(out: &[u8]) -> (Vec<u8>, usize) {
    let data: Vec<_> = frames(out).into_iter().filter(|f| f.0 == 0).collect();
    (data.iter().flat_map(|f| f.3.clone()).collect(), data.len())
}

fn events(n: usize, len: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| vec![b'a' + (i % 26) as u8; len]).collect()
}

#[test]
fn a_run_of_events_shares_one_data_frame() {
    let mut c = event_stream(65_535);
    let parts = events(50, 20);
    let mut out = Vec::new();
    assert_eq!(c.respond_run(1, &parts, &mut out), (50, 0));
    let (body, count) = payload(&out);
    assert_eq!(body, parts.concat());
    assert_eq!(count, 1, "one frame header for the whole run");
    assert_eq!(out.len(), 9 + 1000);
    // The windows were charged: what is left of the stream's takes the rest.
    let mut more = Vec::new();
    let rest = events(1, 65_535 - 1000 + 5);
    assert_eq!(
        c.respond_run(1, &[&rest[0][..], b""], &mut more),
        (0, 64_535)
    );
}

#[test]
fn frames_stop_at_the_peer_s_frame_size() {
    let mut c = event_stream(1 << 20);
    grant(&mut c, 0, 1 << 20);
    let parts = events(5, 10_000);
    let mut out = Vec::new();
    assert_eq!(c.respond_run(1, &parts, &mut out), (5, 0));
    let lens: Vec<usize> = frames(&out).iter().map(|f| f.3.len()).collect();
    assert_eq!(lens, [16_384, 16_384, 16_384, 848]);
    assert_eq!(payload(&out).0, parts.concat());
}

#[test]
fn the_window_cuts_a_run_inside_a_part_and_it_goes_on_from_there() {
    let mut c = event_stream(45);
    let parts = events(3, 20);
    let mut out = Vec::new();
    assert_eq!(c.respond_run(1, &parts, &mut out), (2, 5));
    assert_eq!(payload(&out).0, parts.concat()[..45]);
    let mut none = Vec::new();
    assert_eq!(c.respond_run(1, &[&parts[2][5..]], &mut none), (0, 0));
    assert!(none.is_empty(), "the window is closed");
    grant(&mut c, 1, 100);
    let mut rest = Vec::new();
    assert_eq!(
        c.respond_run(1, &[&parts[2][5..], b"", b"x"], &mut rest),
        (3, 0)
    );
    assert_eq!(payload(&rest).0, [&parts[2][5..], b"x"].concat());
}

#[test]
fn a_run_matches_one_part_at_a_time_for_any_sizes_and_windows() {
    let mut seed = 0x2545_f491_u64;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % n
    };
    for _ in 0..200 {
        let window = 1 + next(300) as u32;
        let parts: Vec<Vec<u8>> = (0..1 + next(12))
            .map(|i| vec![i as u8; next(60) as usize])
            .collect();
        let (mut run, mut one) = (event_stream(window), event_stream(window));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (whole, at) = run.respond_run(1, &parts, &mut a);
        // One part at a time, as the pump would.
        let (mut w, mut t) = (0, 0);
        for p in &parts {
            let used = one.respond(1, p, &mut b);
            if used < p.len() {
                t = used;
                break;
            }
            w += 1;
        }
        assert_eq!(
            payload(&a).0,
            payload(&b).0,
            "window {window}, parts {parts:?}"
        );
        assert_eq!((whole, at), (w, t), "window {window}");
    }
}

#[test]
fn a_length_body_or_a_single_part_is_framed_as_respond_frames_it() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n";
    let (mut run, mut one) = (with_gets(&["/a"]), with_gets(&["/a"]));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let parts: [&[u8]; 4] = [answer, b"abc", b"def", b"ignored"];
    assert_eq!(run.respond_run(1, &parts, &mut a), (4, 0));
    for p in parts {
        one.respond(1, p, &mut b);
    }
    assert_eq!(
        a, b,
        "the head, then each part in its own frame, the last ends the stream"
    );
    assert_eq!(run.open_streams(), 0);
    let mut c = event_stream(100);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    c.respond_run(1, &[b"data: x\n\n"], &mut a);
    event_stream(100).respond(1, b"data: x\n\n", &mut b);
    assert_eq!(a, b);
}
