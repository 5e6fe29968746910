//! What a client may spend on a connection (see `limits.rs`): the reset budget, whoever
//! sends the resets; a header block's deadline; what passes, held only while it means
//! something; the preface's SETTINGS, owed and not spent.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::tests::{client, get, goaway_code, request, rst_code, run};
use super::*;
use crate::h2::frame::{write_data, write_header, write_ping, write_settings};

/// The resets a client makes this side send (MadeYouReset, CVE-2025-8671) spend the same
/// budget as its own RST_STREAMs: past it, GOAWAY `ENHANCE_YOUR_CALM`.
#[test]
fn resets_the_client_makes_the_server_send_count_in_the_reset_budget() {
    let budget = 2 * Settings::default().max_streams;
    type Opens = Box<dyn Fn(&mut Vec<u8>, u32)>;
    let cases: Vec<(&str, Opens)> = vec![
        (
            "zero WINDOW_UPDATE on an open stream",
            Box::new(|v: &mut Vec<u8>, id: u32| {
                get(v, id, "/sse");
                write_header(v, 4, 0x8, 0, id);
                v.extend_from_slice(&0u32.to_be_bytes());
            }),
        ),
        (
            "DATA on a half-closed stream",
            Box::new(|v: &mut Vec<u8>, id: u32| {
                get(v, id, "/sse");
                write_data(v, id, b"x", false);
            }),
        ),
        (
            "DATA on a closed stream",
            Box::new(|v: &mut Vec<u8>, id: u32| {
                get(v, id, "/sse");
                write_header(v, 4, 0x3, 0, id);
                v.extend_from_slice(&8u32.to_be_bytes());
                write_data(v, id, b"x", false);
            }),
        ),
        (
            "a malformed request",
            Box::new(|v: &mut Vec<u8>, id: u32| {
                request(
                    v,
                    id,
                    &[
                        (":method", "GET"),
                        (":scheme", "http"),
                        (":authority", "x y"),
                        (":path", "/"),
                    ],
                    true,
                );
            }),
        ),
    ];
    for (name, each) in cases {
        // Within the budget in one second: every stream reset, the connection goes on.
        let mut c = Connection::new(Settings::default());
        let (out, events, fatal) = run(
            &mut c,
            &client(|v| (0..budget / 2).for_each(|i| each(v, 2 * i + 1))),
        );
        assert!(fatal.is_none(), "{name}: {fatal:?}");
        assert!(rst_code(&out, 1).is_some(), "{name}");
        assert!(!events.iter().any(|e| e.starts_with("data")), "{name}");
        assert_eq!(c.open_streams(), 0, "{name}: every reset stream is gone");
        // The next second starts a new budget; past it in one second, the connection ends.
        c.tick();
        let mut more = Vec::new();
        for i in budget / 2..budget / 2 + budget + 1 {
            each(&mut more, 2 * i + 1);
        }
        let (out, _, fatal) = run(&mut c, &more);
        assert_eq!(
            fatal.map(|f| f.code),
            Some(ErrorCode::EnhanceYourCalm),
            "{name}"
        );
        assert_eq!(goaway_code(&out), Some(ErrorCode::EnhanceYourCalm as u32));
    }
}

/// Streams the layer above resets ([`Connection::cancel`]) count too: the next frames past
/// the budget end the connection.
#[test]
fn resets_the_layer_above_sends_count_in_the_reset_budget() {
    let budget = 2 * Settings::default().max_streams;
    let mut c = Connection::new(Settings::default());
    run(&mut c, &client(|_| {}));
    for i in 0..=budget {
        let mut v = Vec::new();
        get(&mut v, 2 * i + 1, "/");
        let (mut out, _, fatal) = run(&mut c, &v);
        assert!(fatal.is_none(), "stream {i}");
        c.cancel(2 * i + 1, ErrorCode::RefusedStream, &mut out);
        assert_eq!(
            rst_code(&out, 2 * i + 1),
            Some(ErrorCode::RefusedStream as u32)
        );
    }
    let mut ping = Vec::new();
    write_ping(&mut ping, [0; 8], false);
    let (out, _, fatal) = run(&mut c, &ping);
    assert_eq!(fatal.map(|f| f.code), Some(ErrorCode::EnhanceYourCalm));
    assert_eq!(goaway_code(&out), Some(ErrorCode::EnhanceYourCalm as u32));
}

#[test]
fn a_pending_header_block_is_visible_and_ends_the_connection_when_late() {
    let mut c = Connection::new(Settings::default());
    let mut block = Vec::new();
    Encoder::new().encode(
        [(":method", "GET"), (":scheme", "http"), (":path", "/")],
        &mut block,
    );
    let (first, rest) = block.split_at(1);
    let (_, events, _) = run(
        &mut c,
        &client(|v| {
            write_header(v, first.len(), 0x1, 0x1, 1);
            v.extend_from_slice(first);
        }),
    );
    assert!(events.is_empty());
    assert!(c.pending_header_block());
    let mut cont = Vec::new();
    write_header(&mut cont, rest.len(), 0x9, 0x4, 1);
    cont.extend_from_slice(rest);
    let (_, events, _) = run(&mut c, &cont);
    assert_eq!(events, vec!["request 1"]);
    assert!(!c.pending_header_block());
    assert!(c.is_open(1) && !c.is_open(3));
    assert_eq!(c.user_of(1), None);
    c.bind(1, 7);
    assert_eq!(c.user_of(1), Some(7));
    // Another block, never finished: the caller's deadline ends the connection.
    let mut v = Vec::new();
    write_header(&mut v, first.len(), 0x1, 0x1, 3);
    v.extend_from_slice(first);
    run(&mut c, &v);
    assert!(c.pending_header_block());
    c.tick();
    assert!(
        c.pending_header_block(),
        "the second's tick keeps the block"
    );
    let mut out = Vec::new();
    let fatal = c.header_block_late(&mut out);
    assert_eq!(fatal.code, ErrorCode::ProtocolError);
    assert_eq!(goaway_code(&out), Some(ErrorCode::ProtocolError as u32));
    assert!(c.going_away());
}

/// What passes (a header block, this second's flood counts, stream errors) is held only while
/// it means something: the tick keeps the stream errors the caller has not taken, and gives
/// everything back once nothing is held.
#[test]
fn the_tick_gives_back_what_passed_only_once_nothing_is_held() {
    let mut c = Connection::new(Settings::default());
    let malformed = [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "x y"),
        (":path", "/"),
    ];
    let (out, _, fatal) = run(&mut c, &client(|v| request(v, 1, &malformed, true)));
    assert!(fatal.is_none() && rst_code(&out, 1).is_some());
    c.tick();
    assert!(c.passing.is_some(), "a stream error not taken yet");
    assert_eq!(c.take_stream_errors(), 1);
    assert!(c.passing.is_some(), "given back at the tick, not before");
    c.tick();
    assert!(c.passing.is_none());
    assert_eq!(c.take_stream_errors(), 0);
    // A second of resets, then a new one: the budget starts again from nothing held.
    let mut v = Vec::new();
    get(&mut v, 3, "/sse");
    write_header(&mut v, 4, 0x3, 0, 3);
    v.extend_from_slice(&8u32.to_be_bytes());
    let (_, events, fatal) = run(&mut c, &v);
    assert!(fatal.is_none());
    assert_eq!(events, vec!["request 3", "reset 3"]);
    assert!(c.passing.is_some(), "the client's reset counted");
    c.tick();
    assert!(c.passing.is_none());
}

/// The preface's SETTINGS is owed by every client and not spent from the budget: a second's
/// budget of SETTINGS after it passes, one more ends the connection.
#[test]
fn the_preface_s_settings_is_not_spent_from_the_budget() {
    let budget = 2 * Settings::default().max_streams;
    for (extra, ends) in [(budget, false), (budget + 1, true)] {
        let mut c = Connection::new(Settings::default());
        let input = client(|v| (0..extra).for_each(|_| write_settings(v, &[])));
        let (_, _, fatal) = run(&mut c, &input);
        assert_eq!(
            fatal.map(|f| f.code),
            ends.then_some(ErrorCode::EnhanceYourCalm),
            "{extra} after the preface's"
        );
    }
}
