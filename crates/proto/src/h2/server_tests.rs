#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::h2::frame::{write_data, write_header, write_headers, write_ping, write_settings};
use crate::h2::request::Request;

/// A client's bytes: the preface, an empty SETTINGS, then what `f` adds.
pub(super) fn client(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = PREFACE.to_vec();
    write_settings(&mut v, &[]);
    f(&mut v);
    v
}

/// A HEADERS frame on `stream` carrying `fields`.
pub(super) fn request(out: &mut Vec<u8>, stream: u32, fields: &[(&str, &str)], end_stream: bool) {
    let mut block = Vec::new();
    Encoder::new().encode(fields.iter().copied(), &mut block);
    write_headers(out, stream, &block, end_stream, 16_384);
}

pub(super) fn get(out: &mut Vec<u8>, stream: u32, path: &str) {
    request(
        out,
        stream,
        &[
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "x"),
            (":path", path),
        ],
        true,
    );
}

/// A connection whose client set the stream window to `window` and sent a GET on stream 1.
pub(super) fn windowed(window: u32, path: &str) -> Connection {
    let mut c = Connection::new(Settings::default());
    let input = client(|v| {
        write_settings(v, &[Setting::InitialWindowSize(window)]);
        get(v, 1, path);
    });
    run(&mut c, &input);
    c
}

/// A connection whose client sent a GET for each of `paths`, on streams 1, 3, 5...
pub(super) fn with_gets(paths: &[&str]) -> Connection {
    let mut c = Connection::new(Settings::default());
    let input = client(|v| {
        for (stream, path) in (1..).step_by(2).zip(paths) {
            get(v, stream, path);
        }
    });
    run(&mut c, &input);
    c
}

/// The client grants `n` more bytes on `stream`.
pub(super) fn grant(c: &mut Connection, stream: u32, n: u32) {
    let mut wu = Vec::new();
    frame::write_window_update(&mut wu, stream, n);
    run(c, &wu);
}

/// (kind, flags, stream, payload) of every frame in `bytes`.
pub(super) fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut v = Vec::new();
    let mut pos = 0;
    while pos + 9 <= bytes.len() {
        let len = (usize::from(bytes[pos]) << 16)
            | (usize::from(bytes[pos + 1]) << 8)
            | usize::from(bytes[pos + 2]);
        let id = u32::from_be_bytes(bytes[pos + 5..pos + 9].try_into().unwrap()) & MAX_WINDOW;
        v.push((
            bytes[pos + 3],
            bytes[pos + 4],
            id,
            bytes[pos + 9..pos + 9 + len].to_vec(),
        ));
        pos += 9 + len;
    }
    assert_eq!(pos, bytes.len(), "whole frames only");
    v
}

pub(super) fn goaway_code(out: &[u8]) -> Option<u32> {
    frames(out)
        .iter()
        .find(|f| f.0 == 0x7)
        .map(|f| u32::from_be_bytes(f.3[4..8].try_into().unwrap()))
}

pub(super) fn rst_code(out: &[u8], stream: u32) -> Option<u32> {
    frames(out)
        .iter()
        .find(|f| f.0 == 0x3 && f.2 == stream)
        .map(|f| u32::from_be_bytes(f.3[..4].try_into().unwrap()))
}

/// Feeds `input` whole; returns the output and the connection error, if any.
pub(super) fn run(c: &mut Connection, input: &[u8]) -> (Vec<u8>, Vec<String>, Option<Fatal>) {
    let mut out = Vec::new();
    let mut events = Vec::new();
    let res = c.receive(input, &mut out, &mut events);
    let names = events
        .iter()
        .map(|e| match e {
            Event::Request { stream, .. } => format!("request {stream}"),
            Event::Data {
                stream,
                data,
                end_stream,
                ..
            } => format!("data {stream} {} {end_stream}", data.len()),
            Event::Reset { stream, .. } => format!("reset {stream}"),
        })
        .collect();
    match res {
        Ok(n) => {
            assert_eq!(n, input.len());
            (out, names, None)
        }
        Err(f) => (out, names, Some(f)),
    }
}

#[test]
fn a_request_is_an_http1_head_at_every_split_point() {
    let input = client(|v| get(v, 1, "/sse?topic=a"));
    for split in 0..input.len() {
        let mut c = Connection::new(Settings::default());
        let (mut out, mut events) = (Vec::new(), Vec::new());
        let n = c.receive(&input[..split], &mut out, &mut events).unwrap();
        let rest = &input[n..];
        let mut events2 = Vec::new();
        let m = c.receive(rest, &mut out, &mut events2).unwrap();
        assert_eq!(m, rest.len(), "split {split}");
        let heads: Vec<&Request> = events
            .iter()
            .chain(events2.iter())
            .filter_map(|e| match e {
                Event::Request { request, .. } => Some(request),
                _ => None,
            })
            .collect();
        assert_eq!(heads.len(), 1, "split {split}");
        assert!(heads[0]
            .head
            .starts_with(b"GET /sse?topic=a HTTP/1.1\r\nhost: x\r\n"));
        // The client's SETTINGS is acknowledged.
        assert!(frames(&out).iter().any(|f| f.0 == 0x4 && f.1 == 1));
    }
}

#[test]
fn an_answer_becomes_headers_and_data_within_the_windows() {
    let mut c = windowed(10, "/sse?topic=a");
    c.bind(1, 7);
    assert_eq!(c.bound().collect::<Vec<_>>(), vec![(1, 7)]);
    let answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: 0123456789abcdef\n\n";
    let mut out = Vec::new();
    let used = c.respond(1, answer, &mut out);
    // The head and 10 body bytes: the stream's window.
    let head_len = answer.len() - 24;
    assert_eq!(used, head_len + 10);
    let f = frames(&out);
    assert_eq!((f[0].0, f[0].1 & 0x4, f[0].2), (0x1, 0x4, 1));
    assert_eq!((f[1].0, f[1].3.as_slice()), (0x0, &b"data: 0123"[..]));
    let mut none = Vec::new();
    assert_eq!(
        c.respond(1, &answer[used..], &mut none),
        0,
        "the window is closed"
    );
    assert!(none.is_empty());
    // A WINDOW_UPDATE opens it.
    grant(&mut c, 1, 100);
    assert!(c.take_windows_opened());
    let mut out = Vec::new();
    assert_eq!(c.respond(1, &answer[used..], &mut out), 14);
    // The stream ends when the layer above says so.
    let mut end = Vec::new();
    assert_eq!(c.end(1, &mut end), crate::h2::response::Ended::Done);
    assert_eq!(frames(&end), vec![(0x0, 0x1, 1, vec![])]);
    assert_eq!(c.open_streams(), 0);
}

#[test]
fn lengths_end_the_stream_and_chunks_are_undone() {
    let mut c = with_gets(&["/a", "/b"]);
    c.bind(1, 1);
    c.bind(3, 3);
    let mut out = Vec::new();
    let a = b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabcEXTRA";
    assert_eq!(c.respond(1, a, &mut out), a.len());
    let f = frames(&out);
    assert_eq!(f.last().unwrap(), &(0x0, 0x1, 1, b"abc".to_vec()));
    let mut out = Vec::new();
    let b =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{}\n\r\n2\r\nx\n\r\n0\r\n\r\n";
    for piece in b.chunks(5) {
        let mut at = 0;
        while at < piece.len() {
            let n = c.respond(3, &piece[at..], &mut out);
            assert!(n > 0);
            at += n;
        }
    }
    let data: Vec<u8> = frames(&out)
        .iter()
        .filter(|f| f.0 == 0)
        .flat_map(|f| f.3.clone())
        .collect();
    assert_eq!(data, b"{}\nx\n");
    assert_eq!(frames(&out).last().unwrap().1 & 0x1, 1, "END_STREAM");
    assert_eq!(c.open_streams(), 0);
}

#[test]
fn a_length_body_in_pieces_and_past_the_window_ends_the_stream() {
    let mut c = windowed(4, "/a");
    c.bind(1, 1);
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789";
    let head_len = answer.len() - 10;
    let mut out = Vec::new();
    // The head and the stream's window of 4 bytes, then each WINDOW_UPDATE's worth.
    let mut at = c.respond(1, answer, &mut out);
    assert_eq!(at, head_len + 4);
    for _ in 0..3 {
        grant(&mut c, 1, 4);
        at += c.respond(1, &answer[at..], &mut out);
    }
    assert_eq!(at, answer.len());
    let data: Vec<_> = frames(&out).into_iter().filter(|f| f.0 == 0).collect();
    let body: Vec<u8> = data.iter().flat_map(|f| f.3.clone()).collect();
    assert_eq!(body, b"0123456789");
    assert_eq!(
        data.last().unwrap().1 & 0x1,
        1,
        "END_STREAM on the last byte"
    );
    assert!(data[..data.len() - 1].iter().all(|f| f.1 & 0x1 == 0));
    assert_eq!(c.open_streams(), 0);

    // The same body written in two pieces (head apart from the body, as a transport may).
    let mut c = Connection::new(Settings::default());
    run(&mut c, &client(|v| get(v, 1, "/a")));
    let mut out = Vec::new();
    assert_eq!(
        c.respond(1, &answer[..head_len + 3], &mut out),
        head_len + 3
    );
    assert_eq!(c.respond(1, &answer[head_len + 3..], &mut out), 7);
    let data: Vec<_> = frames(&out).into_iter().filter(|f| f.0 == 0).collect();
    assert_eq!(data.last().unwrap(), &(0x0, 0x1, 1, b"3456789".to_vec()));
    assert_eq!(c.open_streams(), 0);
    let mut end = Vec::new();
    assert_eq!(c.end(1, &mut end), crate::h2::response::Ended::Done);
    assert!(end.is_empty(), "no reset for an answer sent in full");
}

#[test]
fn an_answer_ending_with_its_head_leaves_the_other_streams_alone() {
    let mut c = with_gets(&["/a", "/b", "/c"]);
    let mut out = Vec::new();
    // Stream 5 waits for the rest of a chunked body.
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(c.respond(5, chunked, &mut out), chunked.len());
    // Stream 1's answer has no body: it ends (and leaves the list) with its head; what
    // follows it must not be taken as stream 5's.
    let a = b"HTTP/1.1 204 No Content\r\n\r\n";
    let mut both = a.to_vec();
    both.extend_from_slice(b"3\r\nxyz\r\n");
    assert_eq!(c.respond(1, &both, &mut out), both.len());
    assert!(
        frames(&out).iter().all(|f| !(f.0 == 0 && f.2 == 5)),
        "no DATA on stream 5"
    );
    assert_eq!(c.open_streams(), 2);
}

#[test]
fn a_websocket_upgrade_answer_becomes_a_200() {
    let mut c = Connection::new(Settings::default());
    let input = client(|v| {
        request(
            v,
            1,
            &[
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":authority", "x"),
                (":path", "/ws"),
                ("sec-websocket-version", "13"),
            ],
            false,
        );
        write_data(v, 1, b"\x81\x80mask", false);
    });
    let (_, events, fatal) = run(&mut c, &input);
    assert!(fatal.is_none());
    assert_eq!(events, vec!["request 1", "data 1 6 false"]);
    c.bind(1, 9);
    let mut out = Vec::new();
    let a = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n\x81\x02hi";
    assert_eq!(c.respond(1, a, &mut out), a.len());
    let f = frames(&out);
    let mut d = crate::h2::hpack::Decoder::new(4096);
    let mut fields = Vec::new();
    d.decode(&f[0].3, 1 << 16, |(n, v, _)| {
        fields.push((n.to_vec(), v.to_vec()))
    })
    .unwrap();
    assert_eq!(fields, vec![(b":status".to_vec(), b"200".to_vec())]);
    assert_eq!(f[0].1 & 0x1, 0, "the stream stays open");
    assert_eq!(f[1], (0x0, 0x0, 1, b"\x81\x02hi".to_vec()));
}

#[test]
fn connection_errors_end_with_the_right_goaway() {
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        (
            "bad preface",
            b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n".to_vec(),
            ErrorCode::ProtocolError,
        ),
        (
            "no SETTINGS first",
            {
                let mut v = PREFACE.to_vec();
                write_ping(&mut v, [0; 8], false);
                v
            },
            ErrorCode::ProtocolError,
        ),
        (
            "even stream",
            client(|v| get(v, 2, "/")),
            ErrorCode::ProtocolError,
        ),
        (
            "DATA on an idle stream",
            client(|v| write_data(v, 5, b"x", false)),
            ErrorCode::ProtocolError,
        ),
        (
            "lower stream id",
            client(|v| {
                get(v, 5, "/");
                get(v, 3, "/");
            }),
            ErrorCode::ProtocolError,
        ),
        (
            "HEADERS on a closed stream",
            client(|v| {
                get(v, 1, "/");
                write_header(v, 4, 0x3, 0, 1);
                v.extend_from_slice(&0u32.to_be_bytes());
                get(v, 1, "/");
            }),
            ErrorCode::StreamClosed,
        ),
        (
            "a frame inside a header block",
            client(|v| {
                write_header(v, 0, 0x1, 0, 1);
                write_ping(v, [0; 8], false);
            }),
            ErrorCode::ProtocolError,
        ),
        (
            "CONTINUATION alone",
            client(|v| write_header(v, 0, 0x9, 0x4, 1)),
            ErrorCode::ProtocolError,
        ),
        (
            "connection window overflow",
            client(|v| frame::write_window_update(v, 0, MAX_WINDOW)),
            ErrorCode::FlowControlError,
        ),
        (
            "a bad header block",
            client(|v| {
                write_header(v, 1, 0x1, 0x5, 1);
                v.push(0xff);
            }),
            ErrorCode::CompressionError,
        ),
        (
            "SETTINGS flood",
            client(|v| {
                for _ in 0..600 {
                    write_settings(v, &[]);
                }
            }),
            ErrorCode::EnhanceYourCalm,
        ),
        (
            "PING flood",
            client(|v| {
                for _ in 0..600 {
                    write_ping(v, [1; 8], false);
                }
            }),
            ErrorCode::EnhanceYourCalm,
        ),
        (
            "rapid reset",
            client(|v| {
                for i in 0..600u32 {
                    get(v, 2 * i + 1, "/");
                    write_header(v, 4, 0x3, 0, 2 * i + 1);
                    v.extend_from_slice(&8u32.to_be_bytes());
                }
            }),
            ErrorCode::EnhanceYourCalm,
        ),
        (
            "CONTINUATION flood",
            client(|v| {
                write_header(v, 0, 0x1, 0, 1);
                for _ in 0..100 {
                    write_header(v, 0, 0x9, 0, 1);
                }
            }),
            ErrorCode::EnhanceYourCalm,
        ),
        (
            "empty DATA flood",
            client(|v| {
                request(
                    v,
                    1,
                    &[(":method", "POST"), (":scheme", "http"), (":path", "/")],
                    false,
                );
                for _ in 0..600 {
                    write_data(v, 1, b"", false);
                }
            }),
            ErrorCode::EnhanceYourCalm,
        ),
    ];
    for (name, input, code) in cases {
        let mut c = Connection::new(Settings::default());
        let (out, _, fatal) = run(&mut c, &input);
        let fatal = fatal.unwrap_or_else(|| panic!("{name}: no error"));
        assert_eq!(fatal.code, code, "{name}");
        assert_eq!(goaway_code(&out), Some(code as u32), "{name}");
        assert!(c.going_away(), "{name}");
    }
}

#[test]
fn stream_errors_reset_only_their_stream() {
    let mut c = Connection::new(Settings {
        max_streams: 2,
        ..Settings::default()
    });
    let input = client(|v| {
        get(v, 1, "/");
        get(v, 3, "/");
        request(
            v,
            5,
            &[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                ("connection", "close"),
            ],
            true,
        ); // malformed
        get(v, 7, "/"); // over the limit
        write_data(v, 1, b"x", false); // half-closed (remote)
        frame::write_window_update(v, 3, MAX_WINDOW); // overflow
    });
    let (out, events, fatal) = run(&mut c, &input);
    assert!(fatal.is_none());
    assert_eq!(rst_code(&out, 5), Some(ErrorCode::ProtocolError as u32));
    assert_eq!(rst_code(&out, 7), Some(ErrorCode::RefusedStream as u32));
    assert_eq!(rst_code(&out, 1), Some(ErrorCode::StreamClosed as u32));
    assert_eq!(rst_code(&out, 3), Some(ErrorCode::FlowControlError as u32));
    assert_eq!(events, vec!["request 1", "request 3", "reset 1", "reset 3"]);
    assert_eq!(c.take_stream_errors(), 4, "each counted");
    assert_eq!(c.take_stream_errors(), 0);
    assert_eq!(c.open_streams(), 0);
    assert!(!c.going_away());
}

#[test]
fn a_body_must_match_its_content_length() {
    let post = |v: &mut Vec<u8>, len: &str| {
        request(
            v,
            1,
            &[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/"),
                ("content-length", len),
            ],
            false,
        );
    };
    let mut c = Connection::new(Settings::default());
    let (out, events, _) = run(
        &mut c,
        &client(|v| {
            post(v, "4");
            write_data(v, 1, b"abc", true);
        }),
    );
    assert_eq!(rst_code(&out, 1), Some(ErrorCode::ProtocolError as u32));
    assert_eq!(events, vec!["request 1", "reset 1"]);
    let mut c = Connection::new(Settings::default());
    let (out, events, _) = run(
        &mut c,
        &client(|v| {
            post(v, "3");
            write_data(v, 1, b"abc", true);
        }),
    );
    assert_eq!(rst_code(&out, 1), None);
    assert_eq!(events, vec!["request 1", "data 1 3 true"]);
}

#[test]
fn an_oversized_header_list_is_answered_431_and_the_connection_goes_on() {
    let mut c = Connection::new(Settings {
        max_header_list: 200,
        ..Settings::default()
    });
    let big = "x".repeat(300);
    let input = client(|v| {
        request(
            v,
            1,
            &[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                ("big", big.as_str()),
            ],
            true,
        );
        get(v, 3, "/");
    });
    let (out, events, fatal) = run(&mut c, &input);
    assert!(fatal.is_none());
    assert_eq!(events, vec!["request 3"]);
    let f = frames(&out);
    assert!(f.iter().any(|f| f.0 == 0x1 && f.2 == 1 && f.1 & 0x1 == 1));
}

#[test]
fn garbage_never_panics() {
    // A small deterministic generator: every byte value, every frame type, odd lengths.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for round in 0..2_000 {
        let mut input = client(|_| {});
        for _ in 0..(round % 40) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            input.push((x >> 24) as u8);
        }
        let mut c = Connection::new(Settings::default());
        let mut out = Vec::new();
        let mut events = Vec::new();
        let _ = c.receive(&input, &mut out, &mut events);
    }
}

#[test]
fn a_stream_stays_small() {
    // Per idle stream the server keeps this entry, a 64-byte record and a map entry: the
    // issue's goal is at most 200 bytes per additional idle stream.
    assert!(std::mem::size_of::<crate::h2::stream::Stream>() <= 48);
}

#[test]
fn keep_alive_heads_and_the_answer_accessors_serve_streams_in_turn() {
    let mut c = Connection::new(Settings {
        keep_alive_heads: true,
        connect_protocol: false,
        ..Settings::default()
    });
    let input = client(|v| {
        get(v, 1, "/dashboard/feed");
        get(v, 3, "/healthz");
    });
    let mut out = Vec::new();
    let mut events = Vec::new();
    c.receive(&input, &mut out, &mut events).unwrap();
    let heads: Vec<Vec<u8>> = events
        .iter()
        .filter_map(|e| match e {
            Event::Request { request, .. } => Some(request.head.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        heads[1], b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
        "no connection: close"
    );
    assert!(!c.answered(1) && !c.answer_until_end(1));
    // An answer delimited by closing lasts until `end`.
    c.respond(
        1,
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\n",
        &mut out,
    );
    assert!(c.answer_until_end(1) && !c.answered(1));
    assert_eq!(c.end(1, &mut out), crate::h2::response::Ended::Done);
    assert!(c.answered(1) && !c.answer_until_end(1));
    // One with a length is answered at its last byte.
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
    c.respond(3, &answer[..answer.len() - 1], &mut out);
    assert!(!c.answered(3) && !c.answer_until_end(3));
    c.respond(3, &answer[answer.len() - 1..], &mut out);
    assert!(c.answered(3));
    assert_eq!(c.open_streams(), 0);
    // A stream never seen counts as answered: there is nothing to wait for.
    assert!(c.answered(99));
}

#[test]
fn a_length_answer_past_the_window_still_ends_its_stream() {
    let mut c = windowed(4, "/poll");
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789";
    let mut out = Vec::new();
    let mut used = c.respond(1, answer, &mut out);
    while used < answer.len() {
        grant(&mut c, 1, 4);
        used += c.respond(1, &answer[used..], &mut out);
    }
    let f = frames(&out);
    let last = f.last().unwrap();
    assert_eq!(
        (last.0, last.1 & 0x1),
        (0x0, 0x1),
        "END_STREAM on the last DATA"
    );
    assert_eq!(c.open_streams(), 0);
}
