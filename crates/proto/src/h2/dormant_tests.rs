//! A connection that dozes wakes as it was, field for field, and goes on as one that never
//! dozed; the states that keep a connection awake are refused and handed back untouched.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::h2::frame::{
    write_data, write_headers, write_ping, write_rst_stream, write_settings, write_settings_ack,
    write_window_update, ErrorCode, Setting, PREFACE,
};
use crate::h2::server::Event;

const SSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";

/// Settings a worker of `h2_header_table = 0` enforces.
fn worker() -> Settings {
    Settings {
        header_table: 0,
        ..Settings::default()
    }
}

/// A literal field with incremental indexing and a new name (RFC 7541 §6.2.1).
fn indexed(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0x40);
    for s in [name, value] {
        block.push(s.len() as u8);
        block.extend_from_slice(s.as_bytes());
    }
}

/// `GET /events` on stream `id`, as a browser sends it: indexed fields.
fn get(id: u32, end_stream: bool) -> Vec<u8> {
    let mut block = vec![0x82, 0x87, 0x41, 0x01, b'x', 0x04, 0x07];
    block.extend_from_slice(b"/events");
    indexed(&mut block, "user-agent", "a-browser/1.0");
    let mut v = Vec::new();
    write_headers(&mut v, id, &block, end_stream, 16_384);
    v
}

/// Feeds `input`; what the connection wrote, and the streams opened (bound to `id + 100`).
fn feed(c: &mut Connection, input: &[u8]) -> Vec<u8> {
    let (mut out, mut events) = (Vec::new(), Vec::new());
    let res = c.receive(input, &mut out, &mut events);
    assert!(res.is_ok(), "{res:?}");
    let opened: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::Request { stream, .. } => Some(*stream),
            Event::Data { .. } | Event::Reset { .. } => None,
        })
        .collect();
    drop(events);
    for s in opened {
        c.bind(s, s + 100);
    }
    out
}

/// The hand-over's bytes: every field a connection's next frame can depend on.
fn parked(c: &Connection) -> Vec<u8> {
    let mut v = Vec::new();
    c.park(&mut v);
    v
}

/// A browser's connection: preface, its SETTINGS (a larger stream window, as Chromium's),
/// our SETTINGS acknowledged, one EventSource on stream `id` answered with `answer`, after
/// `before` streams that came and went.
fn browser(id: u32, answer: &[u8], before: u32) -> Connection {
    browser_with(worker(), id, answer, before)
}

/// [`browser`] on a worker of `settings`.
fn browser_with(settings: Settings, id: u32, answer: &[u8], before: u32) -> Connection {
    let mut c = Connection::new(settings);
    let mut v = PREFACE.to_vec();
    write_settings(
        &mut v,
        &[
            Setting::InitialWindowSize(6_291_456),
            Setting::MaxFrameSize(32_768),
        ],
    );
    write_settings_ack(&mut v);
    write_window_update(&mut v, 0, 15_663_105);
    feed(&mut c, &v);
    for i in 0..before {
        let s = 1 + 2 * i;
        feed(&mut c, &get(s, true));
        let mut out = Vec::new();
        c.respond(s, b"HTTP/1.1 204 No Content\r\n\r\n", &mut out);
    }
    feed(&mut c, &get(id, true));
    let mut out = Vec::new();
    assert_eq!(c.respond(id, answer, &mut out), answer.len());
    c.tick();
    c
}

fn doze_and_wake(c: Connection) -> Connection {
    match c.doze(&worker()) {
        Ok(d) => d.wake(worker()),
        Err(c) => panic!("did not doze: {c:?}"),
    }
}

#[test]
fn a_browser_s_connection_dozes_in_64_bytes_and_wakes_as_it_was() {
    assert!(
        std::mem::size_of::<Dormant>() <= 64,
        "{}",
        std::mem::size_of::<Dormant>()
    );
    for (id, answer, before) in [(1, SSE, 0), (7, SSE, 3), (1, &b""[..], 0)] {
        let c = browser(id, answer, before);
        let was = parked(&c);
        let d = c.doze(&worker()).unwrap();
        assert_eq!((d.stream(), d.user()), (id, Some(id + 100)));
        let woke = d.wake(worker());
        assert_eq!(parked(&woke), was, "stream {id}, {before} before");
        assert_eq!(woke.user_of(id), Some(id + 100));
    }
}

#[test]
fn a_woken_connection_goes_on_as_one_that_never_dozed() {
    let mut awake = browser(3, SSE, 1);
    let mut woken = doze_and_wake(browser(3, SSE, 1));
    let mut input = Vec::new();
    write_ping(&mut input, *b"12345678", false);
    write_window_update(&mut input, 3, 1_000);
    input.extend_from_slice(&get(5, false));
    write_data(&mut input, 5, b"body", true);
    input.extend_from_slice(&get(9, true));
    write_rst_stream(&mut input, 9, ErrorCode::Cancel);
    assert_eq!(feed(&mut woken, &input), feed(&mut awake, &input));
    for c in [&mut awake, &mut woken] {
        c.respond(
            5,
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            &mut Vec::new(),
        );
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let events: [&[u8]; 2] = [b"data: 1\n\n", b"data: 2\n\n"];
    assert_eq!(
        awake.respond_run(3, &events, &mut a),
        woken.respond_run(3, &events, &mut b)
    );
    assert_eq!(awake.end(3, &mut a), woken.end(3, &mut b));
    assert_eq!(a, b);
    assert_eq!(parked(&awake), parked(&woken));
    // A HEADERS on a stream that closed before the doze is still told apart from one that
    // never was: the ring of closed ids was kept.
    let mut late = Vec::new();
    write_headers(&mut late, 1, &[0x82], true, 16_384);
    for c in [&mut awake, &mut woken] {
        let err = c
            .receive(&late, &mut Vec::new(), &mut Vec::new())
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::StreamClosed);
    }
}

#[test]
fn what_keeps_a_connection_awake_is_refused_and_handed_back_untouched() {
    let mut cases: Vec<(&str, Connection, Settings)> = Vec::new();
    cases.push(("other settings", browser(1, SSE, 0), Settings::default()));
    let mut two = browser(1, SSE, 0);
    feed(&mut two, &get(3, true));
    cases.push(("two streams", two, worker()));
    let mut none = browser(1, b"HTTP/1.1 204 No Content\r\n\r\n", 0);
    none.tick();
    cases.push(("no stream", none, worker()));
    cases.push((
        "a body of a known length",
        browser(1, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 0),
        worker(),
    ));
    cases.push((
        "a chunked body",
        browser(
            1,
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            0,
        ),
        worker(),
    ));
    cases.push((
        "a head in pieces",
        browser(1, b"HTTP/1.1 200 OK\r\nContent-Ty", 0),
        worker(),
    ));
    let mut going = browser(1, SSE, 0);
    going.go_away(ErrorCode::NoError, &mut Vec::new());
    cases.push(("going away", going, worker()));
    let mut block = browser(1, SSE, 0);
    let mut v = Vec::new();
    write_headers(&mut v, 3, &get(3, true)[9..], true, 16_384);
    // HEADERS without END_HEADERS: a block that waits for its CONTINUATION.
    v[4] &= !0x4;
    feed(&mut block, &v);
    block.tick();
    cases.push(("a header block in progress", block, worker()));
    let mut flooded = browser(1, SSE, 0);
    let mut ping = Vec::new();
    write_ping(&mut ping, [0; 8], false);
    feed(&mut flooded, &ping);
    cases.push(("this second's flood counts", flooded, worker()));
    let mut early = Connection::new(worker());
    feed(&mut early, PREFACE);
    cases.push(("no SETTINGS yet", early, worker()));
    for (what, c, settings) in cases {
        let was = parked(&c);
        match c.doze(&settings) {
            Ok(_) => panic!("{what}: dozed"),
            Err(c) => assert_eq!(parked(&c), was, "{what}"),
        }
    }
}

#[test]
fn a_request_of_an_empty_body_keeps_its_length_through_the_doze() {
    let mut c = browser(1, SSE, 0);
    let mut v = Vec::new();
    let mut block = get(3, false)[9..].to_vec();
    block.extend_from_slice(&[0x5c, 0x01, b'0']); // content-length: 0
    write_headers(&mut v, 3, &block, false, 16_384);
    feed(&mut c, &v);
    c.respond(1, &[], &mut Vec::new());
    let mut rst = Vec::new();
    write_rst_stream(&mut rst, 1, ErrorCode::Cancel);
    feed(&mut c, &rst);
    c.tick();
    let was = parked(&c);
    assert_eq!(parked(&doze_and_wake(c)), was);
}

/// A request's head, from the events of one read.
fn heads(c: &mut Connection, input: &[u8]) -> Vec<String> {
    let mut events = Vec::new();
    let res = c.receive(input, &mut Vec::new(), &mut events);
    assert!(res.is_ok(), "{res:?}");
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::Request { request, .. } => Some(String::from_utf8(request.head).unwrap()),
            Event::Data { .. } | Event::Reset { .. } => None,
        })
        .collect()
}

#[test]
fn resting_connections_of_one_browser_share_their_header_table() {
    // The default table size: the browser's fields stay indexed for the connection's life.
    let settings = Settings::default();
    let rest = |c: Connection| c.doze(&settings).unwrap();
    let (a, b) = (
        rest(browser_with(settings, 1, SSE, 0)),
        rest(browser_with(settings, 1, SSE, 0)),
    );
    assert_eq!(a.decoder.table_size(), 32 + 10 + 13 + 32 + 10 + 1);
    assert!(a.decoder.shares_table_with(&b.decoder));
    let (mut a, mut b) = (a.wake(settings), b.wake(settings));
    // Connections handed to a new process share again there.
    let moved = [&a, &b].map(|c| Connection::restore(&parked(c)).unwrap());
    assert!(moved[0].decoder.shares_table_with(&moved[1].decoder));
    assert_eq!(parked(&moved[0]), parked(&a));
    let b_was = parked(&b);
    // A request of the woken connection refers to what the first indexed and indexes more:
    // its table changes alone.
    let mut block = vec![0x82, 0x87, 0xbf, 0x84, 0xbe];
    indexed(&mut block, "x-tab", "2");
    let mut v = Vec::new();
    write_headers(&mut v, 3, &block, true, 16_384);
    let heads = heads(&mut a, &v);
    assert_eq!(heads.len(), 1);
    assert!(heads[0].starts_with("GET / HTTP/1.1\r\n"), "{heads:?}");
    for field in [
        "host: x\r\n",
        "user-agent: a-browser/1.0\r\n",
        "x-tab: 2\r\n",
    ] {
        assert!(
            heads[0].to_lowercase().contains(field),
            "{field}: {heads:?}"
        );
    }
    assert_eq!(parked(&b), b_was);
    assert!(!a.decoder.shares_table_with(&b.decoder));
    assert_eq!(a.decoder.table_size(), b.decoder.table_size() + 32 + 5 + 1);
    // The other still reads its own table.
    let mut v = Vec::new();
    write_headers(&mut v, 3, &block[..5], true, 16_384);
    let heads = self::heads(&mut b, &v);
    assert!(heads[0]
        .to_lowercase()
        .contains("user-agent: a-browser/1.0\r\n"));
    assert!(!heads[0].to_lowercase().contains("x-tab"));
}
