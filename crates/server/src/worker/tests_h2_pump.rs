//! The HTTP/2 pump in the engine, in memory under simulated time (see [`super::testkit`]):
//! a stream's bytes wait for its flow-control window and go when the client opens it; one
//! engine call frames more than one pass's byte budget when the kernel takes everything (the
//! stall the bench found: no writable event comes to continue); a pass the kernel refuses
//! continues on the writable event; an idle connection is told to go at its deadline, not a
//! second before.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::HashMap;

use clarion_proto::h2::frame::{self, ErrorCode, Frame, Setting, MAX_WINDOW, PREFACE};

use super::h2::PUMP_BYTES;
use super::testkit::{Client, Harness};
use super::tests_h2::get;
use crate::config::Config;

/// An h2c connection that advertised `settings` and opened its connection window by `more`.
fn client_with(h: &mut Harness, settings: &[Setting], more: u32) -> Client {
    let c = h.connect();
    let mut v = PREFACE.to_vec();
    frame::write_settings(&mut v, settings);
    if more > 0 {
        frame::write_window_update(&mut v, 0, more);
    }
    h.send(&c, &v);
    c.take();
    c
}

/// What the server sent, as DATA payload bytes and frames per stream and the codes of GOAWAY
/// frames.
#[derive(Default)]
struct Seen {
    data: HashMap<u32, Vec<u8>>,
    data_frames: HashMap<u32, usize>,
    goaway: Vec<u32>,
}

fn seen(mut bytes: &[u8]) -> Seen {
    let mut s = Seen::default();
    while let Ok(Some((f, used))) = frame::parse(bytes, 1 << 24) {
        match f {
            Frame::Data { stream, data, .. } => {
                s.data.entry(stream).or_default().extend_from_slice(data);
                *s.data_frames.entry(stream).or_default() += 1;
            }
            Frame::GoAway { code, .. } => s.goaway.push(code),
            _ => {}
        }
        bytes = &bytes[used..];
    }
    s
}

/// Opens SSE streams `ids` on topic `t` and drops what their openings wrote.
fn open_sse(h: &mut Harness, c: &Client, ids: &[u32]) {
    let mut v = Vec::new();
    for &id in ids {
        get(&mut v, id, "/sse?topic=t", true);
    }
    h.send(c, &v);
    c.take();
}

#[test]
fn a_stream_waits_for_its_window_and_goes_when_the_client_opens_it() {
    let mut h = Harness::new(Config::default());
    // Room for the stream's first bytes (its `retry:` line) and 100 more.
    let c = client_with(&mut h, &[Setting::InitialWindowSize(100)], 0);
    let mut v = Vec::new();
    get(&mut v, 1, "/sse?topic=t", true);
    h.send(&c, &v);
    let opening = seen(&c.take()).data.remove(&1).unwrap_or_default().len();
    assert!(opening < 100, "the opening fits: {opening} bytes");
    let payload = "x".repeat(1000);
    h.publish("t", &payload);
    let first = seen(&c.take()).data.remove(&1).unwrap_or_default();
    assert_eq!(first.len(), 100 - opening, "exactly the window, no more");
    h.advance(1);
    assert!(
        seen(&c.take()).data.is_empty(),
        "stalled until the window opens"
    );
    let mut v = Vec::new();
    frame::write_window_update(&mut v, 1, 10_000);
    h.send(&c, &v);
    let rest = seen(&c.take()).data.remove(&1).unwrap_or_default();
    let event = String::from_utf8([first, rest].concat()).unwrap();
    assert!(
        event.contains(&payload),
        "the whole event once the window opened"
    );
    assert!(event.ends_with("\n\n"), "{event:?}");
}

#[test]
fn one_call_frames_past_a_pass_s_budget_when_the_kernel_takes_everything() {
    let mut h = Harness::new(Config::default());
    let c = client_with(&mut h, &[Setting::InitialWindowSize(MAX_WINDOW)], 1 << 30);
    let ids = [1, 3, 5, 7, 9, 11];
    open_sse(&mut h, &c, &ids);
    let payload = "y".repeat(60_000);
    assert!(ids.len() * payload.len() > PUMP_BYTES, "more than one pass");
    h.publish("t", &payload);
    let s = seen(&c.take());
    for id in ids {
        let got = s.data.get(&id).map_or(0, Vec::len);
        assert!(
            got > payload.len(),
            "stream {id}: {got} bytes in the same call"
        );
    }
}

#[test]
fn a_pass_the_kernel_refuses_continues_on_the_writable_event() {
    let mut h = Harness::new(Config::default());
    let c = client_with(&mut h, &[Setting::InitialWindowSize(MAX_WINDOW)], 1 << 30);
    let ids = [1, 3, 5, 7, 9, 11];
    open_sse(&mut h, &c, &ids);
    c.set_window(Some(100_000));
    let payload = "z".repeat(60_000);
    h.publish("t", &payload);
    let first = c.take();
    let refused = seen(&first);
    let sent: usize = refused.data.values().map(Vec::len).sum();
    assert!(
        sent < ids.len() * payload.len(),
        "the kernel took {sent} only"
    );
    c.set_window(None);
    h.writable(&c);
    // The kernel cut a frame: read the bytes of both writes as one.
    let all = seen(&[first, c.take()].concat());
    for id in ids {
        let got = all.data.get(&id).map_or(0, Vec::len);
        assert!(
            got > payload.len(),
            "stream {id}: {got} bytes after the writable event"
        );
    }
}

#[test]
fn an_idle_h2_connection_is_told_to_go_at_its_deadline_not_before() {
    let mut h = Harness::new(Config {
        handshake_timeout: 5,
        ..Config::default()
    });
    let c = client_with(&mut h, &[], 0);
    h.advance(4);
    assert!(seen(&c.take()).goaway.is_empty(), "not before its deadline");
    assert!(!c.write_shut());
    h.advance(1);
    assert_eq!(seen(&c.take()).goaway, vec![ErrorCode::NoError as u32]);
    assert!(c.write_shut(), "closed after its GOAWAY");
}

#[test]
fn a_pump_of_several_connections_is_written_together_each_in_order() {
    // As with io_uring: the frames a pump makes for several connections are gathered and
    // written in one submission. A pass that stopped at its budget continues on a later pump
    // (after the bytes gathered before it), and one the kernel took part of continues on its
    // writable event: every stream still gets its whole event.
    let mut h = Harness::new(Config::default());
    h.engine.fanout.batch = Some(());
    let ids = [1, 3, 5, 7, 9, 11];
    let clients: Vec<Client> = (0..3)
        .map(|_| {
            let c = client_with(&mut h, &[Setting::InitialWindowSize(MAX_WINDOW)], 1 << 30);
            open_sse(&mut h, &c, &ids);
            c
        })
        .collect();
    clients[1].set_window(Some(100_000));
    let payload = "w".repeat(60_000);
    assert!(ids.len() * payload.len() > PUMP_BYTES, "more than one pass");
    h.publish("t", &payload);
    let mut got: Vec<Vec<u8>> = clients.iter().map(Client::take).collect();
    assert!(
        got.iter().all(|b| !b.is_empty()),
        "every connection's first pass"
    );
    for _ in 0..16 {
        h.engine.h2_pump();
    }
    clients[1].set_window(None);
    h.writable(&clients[1]);
    for _ in 0..16 {
        h.engine.h2_pump();
    }
    assert!(h.engine.fanout.pending.is_empty());
    for (c, bytes) in clients.iter().zip(&mut got) {
        bytes.extend(c.take());
        let s = seen(bytes);
        for id in ids {
            let event = String::from_utf8(s.data.get(&id).cloned().unwrap_or_default()).unwrap();
            assert!(
                event.contains(&payload),
                "stream {id}: {} bytes",
                event.len()
            );
            assert!(event.ends_with("\n\n"));
        }
    }
}

/// The stream records of connection `c`: (record, stream id), by stream id.
fn records_of(h: &Harness, c: &Client) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = h
        .engine
        .side
        .h2_streams()
        .iter()
        .filter(|(_, l)| l.parent == c.key)
        .map(|(child, l)| (child, l.stream()))
        .collect();
    v.sort_by_key(|&(_, stream)| stream);
    v
}

#[test]
fn a_lone_stream_s_message_is_framed_at_once_and_several_streams_keep_the_pump() {
    let mut h = Harness::new(Config::default());
    h.engine.fanout.batch = Some(());
    let lone = client_with(&mut h, &[Setting::InitialWindowSize(MAX_WINDOW)], 1 << 30);
    open_sse(&mut h, &lone, &[1]);
    let pair = client_with(&mut h, &[Setting::InitialWindowSize(MAX_WINDOW)], 1 << 30);
    open_sse(&mut h, &pair, &[1, 3]);
    let frame: std::sync::Arc<[u8]> = std::sync::Arc::from(&b"data: now\n\n"[..]);
    let [(child, _)] = records_of(&h, &lone)[..] else {
        panic!("one stream record")
    };
    assert!(h.engine.h2_deliver_now(child, &[&frame], true));
    assert_eq!(h.engine.conns[child as usize].backlog_bytes(), 0);
    assert!(
        lone.take().is_empty(),
        "gathered for the fan-out's submission"
    );
    for (c, _) in records_of(&h, &pair) {
        assert!(h.engine.h2_deliver_now(c, &[&frame], true));
        let waiting = h.engine.conns[c as usize].backlog_bytes();
        assert_eq!(
            waiting,
            frame.len(),
            "two streams: in the backlog, for the pump"
        );
    }
    h.engine.write_fanout();
    assert_eq!(seen(&lone.take()).data[&1], b"data: now\n\n");
    assert!(pair.take().is_empty(), "not before the pump");
    h.engine.h2_pump();
    let s = seen(&pair.take());
    assert_eq!(
        (&s.data[&1][..], &s.data[&3][..]),
        (&b"data: now\n\n"[..], &b"data: now\n\n"[..])
    );
    // A publish reaches all three streams, whichever way each takes.
    h.publish("t", "all");
    assert!(String::from_utf8(seen(&lone.take()).data[&1].clone())
        .unwrap()
        .contains("all"));
    let s = seen(&pair.take());
    for id in [1, 3] {
        assert!(String::from_utf8(s.data[&id].clone())
            .unwrap()
            .contains("all"));
    }
}

/// A batching engine with two connections of one SSE stream each on topic `t`: the first
/// gave its stream a 300-byte window, the second all the room it can.
fn narrow_and_wide() -> (Harness, Client, Client) {
    let mut h = Harness::new(Config::default());
    h.engine.fanout.batch = Some(());
    let narrow = client_with(&mut h, &[Setting::InitialWindowSize(300)], 0);
    open_sse(&mut h, &narrow, &[1]);
    let wide = client_with(&mut h, &[Setting::InitialWindowSize(MAX_WINDOW)], 1 << 30);
    open_sse(&mut h, &wide, &[1]);
    (h, narrow, wide)
}

/// What stream 1 of `c` got: `first` (taken before), then the rest once both windows open.
fn after_the_window_opens(h: &mut Harness, c: &Client, first: Vec<u8>) -> String {
    let mut v = Vec::new();
    frame::write_window_update(&mut v, 0, 1 << 20);
    frame::write_window_update(&mut v, 1, 1 << 20);
    h.send(c, &v);
    let rest = seen(&c.take()).data.remove(&1).unwrap_or_default();
    String::from_utf8([first, rest].concat()).unwrap()
}

#[test]
fn a_lone_stream_s_message_past_its_window_waits_behind_what_went_in_order() {
    let (mut h, c, _wide) = narrow_and_wide();
    // Three messages, one fan-out each: the first fills the window, the rest queue behind it.
    for i in 0..3 {
        h.publish("t", &format!("{i}{}", "m".repeat(199)));
    }
    let first = seen(&c.take()).data.remove(&1).unwrap_or_default();
    assert!(first.len() <= 300, "{} bytes", first.len());
    let text = after_the_window_opens(&mut h, &c, first);
    let at = |i: usize| text.find(&format!("{i}mmm")).unwrap();
    assert!(at(0) < at(1) && at(1) < at(2), "in order: {text:?}");
    assert_eq!(text.matches("data: ").count(), 3, "each once: {text:?}");
}

#[test]
fn a_lone_stream_s_run_of_messages_is_framed_at_once_up_to_its_window_then_waits_in_order() {
    let (mut h, c, other) = narrow_and_wide();
    // One run of four messages: the first fits the window, the second is cut by it, the
    // others wait behind it.
    let payloads: Vec<String> = (0..4).map(|i| format!("{i}{}", "r".repeat(119))).collect();
    let outgoing: Vec<crate::broker::Outgoing> = payloads
        .iter()
        .map(|p| crate::broker::Outgoing {
            tags: &[],
            conflation_key: None,
            topic: "t",
            kind: clarion_proto::ws::DataKind::Text,
            payload: p.as_bytes(),
            event: None,
            attachment: None,
            key: None,
        })
        .collect();
    let _ = h.shared.broker.publish(&outgoing);
    h.engine.handle_inbox(0);
    let first = seen(&c.take()).data.remove(&1).unwrap_or_default();
    let [(child, _)] = records_of(&h, &c)[..] else {
        panic!("one stream record")
    };
    assert!(
        h.engine.conns[child as usize].backlog_bytes() > 0,
        "the rest waits"
    );
    let text = after_the_window_opens(&mut h, &c, first);
    let at: Vec<usize> = (0..4).map(|i| text.find(&payloads[i]).unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "in order: {text:?}");
    assert_eq!(text.matches("data: ").count(), 4, "each once: {text:?}");
    let mut wide = seen(&other.take());
    assert_eq!(wide.data_frames[&1], 1, "a run shares one DATA frame");
    let all = String::from_utf8(wide.data.remove(&1).unwrap()).unwrap();
    assert_eq!(all.matches("data: ").count(), 4);
}
