//! HTTP/2 stream records in the engine, in memory under simulated time (see
//! [`super::testkit`]): a record lives exactly as long as its stream is open in the protocol
//! state (streams the server resets free theirs: the "MadeYouReset" class), no connection
//! holds more than `h2_max_streams`, and idle or half-sent connections are ended at
//! `handshake_timeout`. The last test drives random frame sequences and checks the records
//! after every step.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use clarion_proto::h2::frame::{self, ErrorCode, Frame, Setting, MAX_WINDOW, PREFACE};
use clarion_proto::h2::hpack::Encoder;

use super::testkit::{Client, Harness};
use crate::config::Config;

fn config(max_streams: usize, handshake: u64) -> Config {
    Config {
        h2_max_streams: max_streams,
        handshake_timeout: handshake,
        ..Config::default()
    }
}

/// An h2c connection past its preface (the server's SETTINGS taken).
fn h2_client(h: &mut Harness) -> Client {
    let c = h.connect();
    let mut v = PREFACE.to_vec();
    frame::write_settings(&mut v, &[]);
    h.send(&c, &v);
    assert!(
        !server_frames(&c.take()).is_empty(),
        "the server's SETTINGS"
    );
    c
}

fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    Encoder::new().encode(fields.iter().copied(), &mut b);
    b
}

pub(super) fn get(out: &mut Vec<u8>, stream: u32, path: &str, end_stream: bool) {
    let b = block(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", path),
    ]);
    frame::write_headers(out, stream, &b, end_stream, 16_384);
}

/// (kind, stream, code) of the server's frames: the code of GOAWAY and RST_STREAM, else 0.
fn server_frames(mut bytes: &[u8]) -> Vec<(u8, u32, u32)> {
    let mut v = Vec::new();
    while let Ok(Some((f, used))) = frame::parse(bytes, 1 << 24) {
        let head = bytes[3];
        let id = u32::from_be_bytes(bytes[5..9].try_into().unwrap()) & MAX_WINDOW;
        let code = match f {
            Frame::GoAway { code, .. } | Frame::RstStream { code, .. } => code,
            _ => 0,
        };
        v.push((head, id, code));
        bytes = &bytes[used..];
    }
    v
}

fn goaway(frames: &[(u8, u32, u32)]) -> Option<u32> {
    frames.iter().find(|f| f.0 == 0x7).map(|f| f.2)
}

/// Checks what this module promises of the engine's records, at a moment between two entry
/// points: every stream record is linked to a stream its connection's protocol state has
/// open and bound to it, every record without a socket is such a record, and no connection
/// holds more than `max` of them (nor a count other than the one kept).
fn check_records(h: &Harness, max: usize) {
    let e = &h.engine;
    let mut per: HashMap<u32, usize> = HashMap::new();
    for (child, link) in e.side.h2_streams().iter() {
        let (p, stream) = (link.parent, link.stream());
        assert!(
            e.conns.contains(child as usize),
            "record {child} linked, not in the slab"
        );
        let state = e
            .side
            .h2()
            .get(&p)
            .expect("a record's connection has its protocol state");
        assert!(
            state.is_open(stream),
            "record {child} holds stream {stream} of {p}, which is closed"
        );
        assert_eq!(state.user_of(stream), Some(child), "stream {stream}");
        *per.entry(p).or_default() += 1;
    }
    for (&p, &n) in &per {
        assert!(
            n <= max,
            "connection {p} holds {n} records, more than {max}"
        );
        assert_eq!(e.h2_records_of(p), n, "the count kept for {p}");
    }
    for (k, c) in e.conns.iter() {
        if c.stream.is_none() {
            assert!(
                e.side.h2_streams().contains_key(&(k as u32)),
                "socketless record {k} is no linked stream"
            );
        }
    }
}

#[test]
fn a_stream_reset_in_the_read_that_opened_it_leaves_no_record() {
    let mut h = Harness::new(config(4, 10));
    let c = h2_client(&mut h);
    let mut v = Vec::new();
    for id in (1..40).step_by(2) {
        get(&mut v, id, "/sse?topic=t", true);
        frame::write_window_update(&mut v, id, 0); // a stream error: the server resets it
    }
    h.send(&c, &v);
    let frames = server_frames(&c.take());
    assert_eq!(
        frames.iter().filter(|f| f.0 == 0x3).count(),
        20,
        "every stream reset"
    );
    assert!(goaway(&frames).is_none());
    assert_eq!(h.shared.metrics.h2_stream_errors.load(Relaxed), 20);
    assert!(
        h.engine.side.h2_streams().is_empty(),
        "records kept for reset streams"
    );
    check_records(&h, 4);
    assert_eq!(
        h.shared.open.load(Relaxed),
        1,
        "only the connection is counted"
    );
}

#[test]
fn a_stream_reset_for_data_on_its_closed_side_frees_its_record() {
    let mut h = Harness::new(config(4, 10));
    let c = h2_client(&mut h);
    let mut v = Vec::new();
    get(&mut v, 1, "/sse?topic=t", true);
    h.send(&c, &v);
    assert_eq!(h.engine.side.h2_streams().len(), 1);
    check_records(&h, 4);
    // In a later read, and in the same read as its HEADERS.
    let mut v = Vec::new();
    frame::write_data(&mut v, 1, b"x", false);
    get(&mut v, 3, "/sse?topic=t", true);
    frame::write_data(&mut v, 3, b"x", false);
    h.send(&c, &v);
    let frames = server_frames(&c.take());
    for id in [1, 3] {
        assert!(frames.contains(&(0x3, id, ErrorCode::StreamClosed as u32)));
    }
    assert!(h.engine.side.h2_streams().is_empty());
    check_records(&h, 4);
    assert_eq!(h.shared.open.load(Relaxed), 1);
}

/// The engine holds a connection to `h2_max_streams` records by its own count, not only
/// through the protocol state's limit: records it still counts (as a record that outlived its
/// stream would be) leave no room for a new stream.
#[test]
fn the_engine_refuses_a_stream_past_h2_max_streams_records_of_its_own() {
    let mut h = Harness::new(config(2, 10));
    let c = h2_client(&mut h);
    for fake in [900, 901] {
        h.engine.h2_link(fake, c.key, 99);
    }
    let mut v = Vec::new();
    get(&mut v, 1, "/sse?topic=t", true);
    h.send(&c, &v);
    let frames = server_frames(&c.take());
    assert!(
        frames.contains(&(0x3, 1, ErrorCode::RefusedStream as u32)),
        "{frames:?}"
    );
    assert_eq!(h.engine.h2_records_of(c.key), 2);
    for fake in [900, 901] {
        h.engine.h2_unlink(fake);
    }
    let mut v = Vec::new();
    get(&mut v, 3, "/sse?topic=t", true);
    h.send(&c, &v);
    assert_eq!(h.engine.h2_records_of(c.key), 1, "room again");
    check_records(&h, 2);
}

#[test]
fn resets_the_client_provokes_past_the_budget_end_the_connection() {
    let mut h = Harness::new(config(4, 10));
    let c = h2_client(&mut h);
    let mut v = Vec::new();
    // The budget: 200 a second (twice h2_max_streams when that is more).
    for id in (1..2 * 201).step_by(2) {
        get(&mut v, id, "/sse?topic=t", true);
        frame::write_window_update(&mut v, id, 0);
    }
    h.send(&c, &v);
    let frames = server_frames(&c.take());
    assert_eq!(goaway(&frames), Some(ErrorCode::EnhanceYourCalm as u32));
    assert_eq!(h.shared.metrics.h2_errors.load(Relaxed), 1);
    assert!(h.engine.side.h2_streams().is_empty());
    check_records(&h, 4);
}

#[test]
fn an_h2_connection_with_only_pings_is_told_to_go_at_the_handshake_timeout() {
    let mut h = Harness::new(config(4, 3));
    let c = h2_client(&mut h);
    for i in 0..3u8 {
        let mut v = Vec::new();
        frame::write_ping(&mut v, [i; 8], false);
        h.send(&c, &v);
        h.advance(1);
    }
    let frames = server_frames(&c.take());
    assert_eq!(
        goaway(&frames),
        Some(ErrorCode::NoError as u32),
        "{frames:?}"
    );
    assert!(c.write_shut(), "closed after its GOAWAY");
}

#[test]
fn a_connection_whose_streams_ended_is_told_to_go_a_handshake_timeout_later() {
    let mut h = Harness::new(config(4, 3));
    let c = h2_client(&mut h);
    let mut v = Vec::new();
    get(&mut v, 1, "/sse?topic=t", true);
    h.send(&c, &v);
    h.advance(5);
    assert!(
        goaway(&server_frames(&c.take())).is_none(),
        "a stream is open"
    );
    let mut v = Vec::new();
    frame::write_rst_stream(&mut v, 1, ErrorCode::Cancel);
    h.send(&c, &v);
    h.advance(2);
    assert!(goaway(&server_frames(&c.take())).is_none());
    h.advance(1);
    assert_eq!(
        goaway(&server_frames(&c.take())),
        Some(ErrorCode::NoError as u32)
    );
}

#[test]
fn a_header_block_not_finished_in_time_ends_the_connection() {
    let mut h = Harness::new(config(4, 3));
    let c = h2_client(&mut h);
    // A stream open (so the idle rule does not apply), then a block trickled a byte a second.
    let mut v = Vec::new();
    get(&mut v, 1, "/sse?topic=t", true);
    let b = block(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", "/sse?topic=t"),
    ]);
    frame::write_header(&mut v, 1, 0x1, frame::FLAG_END_STREAM, 3);
    v.push(b[0]);
    h.send(&c, &v);
    for (i, &byte) in b.iter().enumerate().take(3).skip(1) {
        let mut v = Vec::new();
        frame::write_header(&mut v, 1, 0x9, 0, 3);
        v.push(byte);
        h.send(&c, &v);
        h.advance(1);
        assert!(goaway(&server_frames(&c.take())).is_none(), "second {i}");
    }
    h.advance(1);
    let frames = server_frames(&c.take());
    assert_eq!(goaway(&frames), Some(ErrorCode::ProtocolError as u32));
    assert_eq!(h.shared.metrics.h2_errors.load(Relaxed), 1);
    assert!(
        h.engine.side.h2_streams().is_empty(),
        "its streams ended with it"
    );
    check_records(&h, 4);
}

/// splitmix64: a deterministic stream of choices, so a failure repeats with its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len() as u64) as usize]
    }
}

/// One client connection of the random run: its next stream id, and a header block begun.
struct Peer {
    c: Client,
    next: u32,
    half_block: Option<(u32, Vec<u8>)>,
}

const PATHS: [&str; 6] = [
    "/sse?topic=t",
    "/stream?topic=t",
    "/poll?topic=t",
    "/nope",
    "/sse?topic=u",
    "/ws?topic=t",
];

/// Appends one frame a client might send, sane or not, to `v`.
fn random_frame(r: &mut Rng, p: &mut Peer, v: &mut Vec<u8>) {
    // A stream the client used (not the one whose header block is pending), or one it never
    // opened.
    let used = p.half_block.as_ref().map_or(p.next, |b| b.0);
    let old = if used > 1 {
        1 + 2 * r.below(u64::from(used / 2)) as u32
    } else {
        1
    };
    let target = if r.below(200) == 0 { p.next + 2 } else { old };
    if let Some((id, rest)) = p.half_block.take() {
        if r.below(50) != 0 {
            let (piece, left) = rest.split_at(rest.len().min(1 + r.below(12) as usize));
            let last = left.is_empty();
            frame::write_header(
                v,
                piece.len(),
                0x9,
                if last { frame::FLAG_END_HEADERS } else { 0 },
                id,
            );
            v.extend_from_slice(piece);
            if !last {
                p.half_block = Some((id, left.to_vec()));
            }
            return;
        }
    }
    // A fresh connection opens a stream first.
    let choice = if used > 1 { r.below(40) } else { 0 };
    match choice {
        0..=15 => {
            let id = p.next;
            p.next += 2;
            let path = *r.pick(&PATHS);
            let authority = if r.below(10) == 0 { "x y" } else { "localhost" };
            let end_stream = r.below(3) != 0;
            let b = if path.starts_with("/ws") && r.below(2) == 0 {
                block(&[
                    (":method", "CONNECT"),
                    (":protocol", "websocket"),
                    (":scheme", "http"),
                    (":authority", authority),
                    (":path", path),
                    ("sec-websocket-version", "13"),
                ])
            } else {
                block(&[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":authority", authority),
                    (":path", path),
                ])
            };
            if r.below(4) == 0 && b.len() > 2 {
                let (first, rest) = b.split_at(2);
                let flags = if end_stream {
                    frame::FLAG_END_STREAM
                } else {
                    0
                };
                frame::write_header(v, first.len(), 0x1, flags, id);
                v.extend_from_slice(first);
                p.half_block = Some((id, rest.to_vec()));
            } else {
                frame::write_headers(v, id, &b, end_stream, 16_384);
            }
        }
        16..=20 => {
            let inc = *r.pick(&[0, 1, 65_535, MAX_WINDOW]);
            frame::write_window_update(v, target, inc);
        }
        21 => frame::write_window_update(v, 0, *r.pick(&[0, 1, 1 << 20, 1 << 20, 1 << 20])),
        22..=27 => {
            let len = *r.pick(&[0usize, 1, 10, 2_000]);
            frame::write_data(v, target, &vec![0x81; len], r.below(2) == 0);
        }
        28..=31 => frame::write_rst_stream(v, target, ErrorCode::Cancel),
        32..=33 => frame::write_ping(v, [7; 8], false),
        34..=35 => {
            let w = *r.pick(&[0, 10, 65_535, 1 << 20]);
            frame::write_settings(v, &[Setting::InitialWindowSize(w)]);
        }
        36 if r.below(2) == 0 => {
            // Trailers (on the newest stream, or on one long closed: a connection error).
            let id = if r.below(8) == 0 {
                target
            } else {
                used.saturating_sub(2).max(1)
            };
            frame::write_headers(v, id, &block(&[("x", "1")]), true, 16_384);
        }
        36 | 37 => {
            // A frame of an unknown type, and a PRIORITY naming itself.
            frame::write_header(v, 1, 0xee, 0, target);
            v.push(0);
            frame::write_header(v, 5, 0x2, 0, target);
            v.extend_from_slice(&target.to_be_bytes());
            v.push(0);
        }
        _ => {
            // A new stream's HEADERS, then a zero WINDOW_UPDATE on it (reset by the server).
            let id = p.next;
            p.next += 2;
            get(v, id, "/sse?topic=t", r.below(2) == 0);
            frame::write_window_update(v, id, 0);
        }
    }
}

/// After any sequence of frames from several connections, with publishes, time passing and
/// connections ending between reads, every stream record the engine holds belongs to a
/// stream its connection's protocol state has open, and none holds more than
/// `h2_max_streams`.
#[test]
fn random_frames_never_leave_a_record_without_its_open_stream() {
    const MAX: usize = 4;
    for seed in 0..60u64 {
        let mut r = Rng(seed);
        let mut h = Harness::new(config(MAX, 4));
        let mut peers: Vec<Peer> = (0..3)
            .map(|_| Peer {
                c: h2_client(&mut h),
                next: 1,
                half_block: None,
            })
            .collect();
        for step in 0..250 {
            let i = r.below(peers.len() as u64) as usize;
            match r.below(20) {
                0 => h.advance(1),
                1 => {
                    let topic = if r.below(2) == 0 { "t" } else { "u" };
                    h.publish(topic, "x");
                }
                2 => {
                    // The client reads slowly, or again.
                    let w = *r.pick(&[None, Some(0), Some(100)]);
                    peers[i].c.set_window(w);
                    h.writable(&peers[i].c);
                }
                3 if r.below(4) == 0 => {
                    h.hang_up(&peers[i].c);
                    peers[i] = Peer {
                        c: h2_client(&mut h),
                        next: 1,
                        half_block: None,
                    };
                }
                _ => {
                    let mut v = Vec::new();
                    for _ in 0..1 + r.below(5) {
                        random_frame(&mut r, &mut peers[i], &mut v);
                    }
                    let p = &peers[i];
                    if h.is_open(&p.c) && !p.c.write_shut() {
                        h.send(&p.c, &v);
                    } else {
                        peers[i] = Peer {
                            c: h2_client(&mut h),
                            next: 1,
                            half_block: None,
                        };
                    }
                }
            }
            peers[i].c.take();
            let h_ref = &h;
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_records(h_ref, MAX)
            }));
            assert!(res.is_ok(), "seed {seed}, step {step}");
        }
        // Everything ends: no record, count or gauge is left behind.
        for p in &peers {
            h.hang_up(&p.c);
        }
        h.advance(10);
        assert!(h.engine.side.h2_streams().is_empty(), "seed {seed}");
        assert!(h.engine.side.h2_records().is_empty(), "seed {seed}");
        assert_eq!(h.shared.metrics.h2_streams.load(Relaxed), 0, "seed {seed}");
    }
}

/// An HTTP/2 connection's protocol state, in its pool slot for the connection's life: 192
/// bytes until the windows were kept in 32 bits, what passes (a header block, the flood
/// counts of the second) was boxed only while held and the HPACK table's size moved into its
/// boxed entries.
#[test]
fn an_h2_connection_s_state_stays_within_144_bytes() {
    let size = std::mem::size_of::<super::h2::H2>();
    assert!(size <= 144, "{size}");
}
