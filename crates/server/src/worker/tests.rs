//! The engine's behaviour in memory, under simulated time (see [`super::testkit`]): each test
//! drives one engine through a connection's life and checks the bytes it wrote and the gauges
//! it left behind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::Arc;

use clarion_proto::grip::{write_event, Event as WsEvent};
use clarion_proto::ws::frame::encode_frame;
use clarion_proto::ws::OpCode;

use super::testkit::{after_head, server_frames, upgrade, Client, Harness};
use crate::config::Config;
use crate::grip::{GripContent, StreamPart, WsPart};

const TEXT: OpCode = OpCode::Text;
const CLOSE: OpCode = OpCode::Close;
const PING: OpCode = OpCode::Ping;

/// Opens a WebSocket on `/ws` and drops the 101.
fn open_ws(h: &mut Harness) -> Client {
    let c = h.connect();
    h.send(&c, &upgrade("/ws"));
    let head = c.take_text();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    c
}

/// The close code of a Close frame's payload.
fn close_code(payload: &[u8]) -> u16 {
    u16::from_be_bytes([payload[0], payload[1]])
}

#[test]
fn websocket_subscribes_and_receives_a_publish() {
    let mut h = Harness::new(Config::default());
    let c = open_ws(&mut h);
    assert_eq!(h.counts(), [0, 1, 0, 0, 0, 0, 1, 1]);
    h.send_frame(&c, OpCode::Text, br#"{"type":"subscribe","topic":"news"}"#);
    let frames = server_frames(&c.take());
    assert_eq!(frames.len(), 1);
    assert!(String::from_utf8_lossy(&frames[0].1).contains("subscribed"));
    h.publish("news", "hello");
    assert_eq!(server_frames(&c.take()), vec![(TEXT, b"hello".to_vec())]);
    h.publish("other", "not for us");
    assert!(c.take().is_empty());
    // The client closes: its code is echoed, and the counts return to zero at once.
    h.send(
        &c,
        &super::testkit::client_frame(OpCode::Close, &[0x03, 0xe8]),
    );
    let frames = server_frames(&c.take());
    assert_eq!(frames[0].0, CLOSE);
    assert_eq!(close_code(&frames[0].1), 1000);
    assert!(c.write_shut());
    assert_eq!(h.counts(), [0; 8]);
    h.hang_up(&c);
    assert!(!h.is_open(&c));
    assert_eq!(h.counts(), [0; 8]);
}

#[test]
fn idle_websocket_is_pinged_then_closed_with_1001() {
    let config = Config {
        ping_interval: 5,
        idle_timeout: 12,
        ..Config::default()
    };
    let mut h = Harness::new(config);
    let c = open_ws(&mut h);
    h.advance(4);
    assert!(c.take().is_empty());
    h.advance(1);
    assert_eq!(server_frames(&c.take()), vec![(PING, Vec::new())]);
    // One ping per quiet spell.
    h.advance(6);
    assert!(c.take().is_empty());
    h.advance(1);
    let frames = server_frames(&c.take());
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, CLOSE);
    assert_eq!(close_code(&frames[0].1), 1001);
    assert_eq!(h.counts(), [0; 8]);
    // A peer that never closes its side is let go after the closing linger.
    assert!(h.is_open(&c));
    h.advance(5);
    assert!(!h.is_open(&c));
    assert_eq!(h.counts(), [0; 8]);
}

#[test]
fn bytes_from_the_client_postpone_the_ping() {
    let config = Config {
        ping_interval: 5,
        idle_timeout: 0,
        ..Config::default()
    };
    let mut h = Harness::new(config);
    let c = open_ws(&mut h);
    h.advance(4);
    h.send_frame(&c, OpCode::Pong, b"");
    h.advance(4);
    assert!(c.take().is_empty());
    h.advance(1);
    assert_eq!(server_frames(&c.take()), vec![(PING, Vec::new())]);
}

#[test]
fn partial_request_head_gets_408_at_the_handshake_timeout() {
    let config = Config {
        handshake_timeout: 10,
        ..Config::default()
    };
    let mut h = Harness::new(config);
    let c = h.connect();
    h.send(&c, b"GET /ws HTTP/1.1\r\nHost: x\r\n");
    assert_eq!(h.counts(), [1, 0, 0, 0, 0, 0, 1, 1]);
    h.advance(9);
    assert!(c.take().is_empty());
    h.advance(1);
    let out = c.take_text();
    assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
    assert!(
        out.ends_with("request head not received in time\n"),
        "{out}"
    );
    assert!(c.write_shut());
    assert_eq!(h.counts(), [0; 8]);
}

#[test]
fn sse_stream_sends_keepalive_comments_and_events() {
    let config = Config {
        sse_keepalive: 3,
        ..Config::default()
    };
    let mut h = Harness::new(config);
    let c = h.connect();
    h.send(&c, b"GET /sse?topic=t HTTP/1.1\r\nHost: x\r\n\r\n");
    let out = c.take();
    let head = String::from_utf8_lossy(&out).into_owned();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    assert!(String::from_utf8_lossy(after_head(&out)).starts_with("retry:"));
    assert_eq!(h.counts(), [0, 0, 1, 0, 0, 0, 1, 1]);
    h.advance(2);
    assert!(c.take().is_empty());
    h.advance(1);
    assert_eq!(c.take(), b":\n\n");
    h.publish("t", "hello");
    let event = c.take_text();
    assert!(event.contains("data: hello\n"), "{event}");
    // A delivery counts as activity: the next comment is a full interval later.
    h.advance(2);
    assert!(c.take().is_empty());
    h.advance(1);
    assert_eq!(c.take(), b":\n\n");
    h.hang_up(&c);
    assert!(!h.is_open(&c));
    assert_eq!(h.counts(), [0; 8]);
}

#[test]
fn long_poll_is_answered_empty_at_its_deadline_and_kept_alive() {
    let mut h = Harness::new(Config::default());
    let c = h.connect();
    h.send(
        &c,
        b"GET /poll?topic=t&timeout=5 HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert!(c.take().is_empty());
    assert_eq!(h.counts(), [0, 0, 0, 0, 1, 0, 1, 1]);
    h.advance(4);
    assert!(c.take().is_empty());
    h.advance(1);
    let out = c.take();
    let head = String::from_utf8_lossy(&out).into_owned();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let body = String::from_utf8_lossy(after_head(&out)).into_owned();
    assert!(body.starts_with(r#"{"messages":[],"cursor":"#), "{body}");
    // Back to reading requests on the same connection.
    assert!(!c.write_shut());
    assert_eq!(h.counts(), [1, 0, 0, 0, 0, 0, 1, 1]);
    h.hang_up(&c);
    assert_eq!(h.counts(), [0; 8]);
}

#[test]
fn long_poll_is_answered_by_a_publish() {
    let mut h = Harness::new(Config::default());
    let c = h.connect();
    h.send(&c, b"GET /poll?topic=t HTTP/1.1\r\nHost: x\r\n\r\n");
    h.publish("t", "hello");
    let out = c.take();
    let body = String::from_utf8_lossy(after_head(&out)).into_owned();
    assert!(body.contains("hello"), "{body}");
    assert_eq!(h.counts(), [1, 0, 0, 0, 0, 0, 1, 1]);
}

#[test]
fn slow_consumer_is_closed_with_1008() {
    let config = Config {
        max_backlog: 1000,
        ..Config::default()
    };
    let mut h = Harness::new(config);
    let c = open_ws(&mut h);
    h.send_frame(&c, OpCode::Text, br#"{"type":"subscribe","topic":"t"}"#);
    c.take();
    // The kernel takes nothing more: deliveries pile up in the backlog.
    c.set_window(Some(0));
    let big = "x".repeat(600);
    h.publish("t", &big);
    assert_eq!(h.counts()[1], 1, "under the cap");
    h.publish("t", &big);
    assert_eq!(h.counts(), [0; 8], "over the cap: closing");
    // Once the socket drains, the client reads the Close frame, not the rest of its feed.
    c.set_window(None);
    h.writable(&c);
    let frames = server_frames(&c.take());
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, CLOSE);
    assert_eq!(close_code(&frames[0].1), 1008);
    assert!(c.write_shut());
}

#[test]
fn a_fanout_written_in_one_submission_keeps_short_writes_and_drops_dead_sockets() {
    // As with io_uring: the fan-out's single-message deliveries are gathered and written
    // together, then each result is handled as a single write's would be.
    let mut h = Harness::new(Config::default());
    h.engine.fanout.batch = Some(());
    let clients: Vec<Client> = (0..4)
        .map(|_| {
            let c = open_ws(&mut h);
            h.send_frame(&c, OpCode::Text, br#"{"type":"subscribe","topic":"t"}"#);
            c.take();
            c
        })
        .collect();
    clients[1].set_window(Some(3)); // takes part of the frame
    clients[2].set_window(Some(0)); // takes nothing (EAGAIN)
    clients[3].reset(); // gone
    h.publish("t", "hello");
    let got = |c: &Client| -> Vec<Vec<u8>> {
        server_frames(&c.take())
            .into_iter()
            .map(|(_, payload)| payload)
            .collect()
    };
    assert_eq!(got(&clients[0]), [b"hello".to_vec()]);
    assert!(!h.is_open(&clients[3]));
    assert!(h.engine.fanout.pending.is_empty());
    // The rest goes out on the writable event, then the next message after it.
    let head = clients[1].take();
    assert_eq!(head.len(), 3);
    for c in &clients[1..3] {
        c.set_window(None);
        h.writable(c);
    }
    h.publish("t", "again");
    let mut one = head;
    one.extend(clients[1].take());
    let frames: Vec<Vec<u8>> = server_frames(&one).into_iter().map(|f| f.1).collect();
    assert_eq!(frames, [b"hello".to_vec(), b"again".to_vec()]);
    assert_eq!(got(&clients[2]), [b"hello".to_vec(), b"again".to_vec()]);
    assert_eq!(got(&clients[0]), [b"again".to_vec()]);
}

#[test]
fn shutdown_closes_websockets_with_1001_and_ends_streams() {
    let mut h = Harness::new(Config::default());
    let ws = open_ws(&mut h);
    let sse = h.connect();
    h.send(&sse, b"GET /sse?topic=t HTTP/1.1\r\nHost: x\r\n\r\n");
    sse.take();
    let stream = h.connect();
    h.send(&stream, b"GET /stream?topic=t HTTP/1.1\r\nHost: x\r\n\r\n");
    stream.take();
    assert_eq!(h.counts(), [0, 1, 1, 1, 0, 0, 3, 1]);
    h.shutdown();
    let frames = server_frames(&ws.take());
    assert_eq!(frames[0].0, CLOSE);
    assert_eq!(close_code(&frames[0].1), 1001);
    assert!(sse.take().is_empty());
    assert!(sse.write_shut());
    assert_eq!(stream.take(), clarion_proto::http1::LAST_CHUNK);
    assert!(stream.write_shut());
    assert_eq!(h.counts(), [0; 8]);
    for c in [&ws, &sse, &stream] {
        h.hang_up(c);
        assert!(!h.is_open(c));
    }
}

#[test]
fn a_drain_tells_its_share_at_each_step_and_a_restart_says_1012() {
    let mut h = Harness::new(Config::default());
    let ws: Vec<_> = (0..10).map(|_| open_ws(&mut h)).collect();
    let sse = h.connect();
    h.send(&sse, b"GET /sse?topic=t HTTP/1.1\r\nHost: x\r\n\r\n");
    sse.take();
    // Who has been told so far (10 WebSockets, then the SSE stream), each told once.
    let mut told = [false; 11];
    let look = |told: &mut [bool; 11]| {
        for (i, c) in ws.iter().enumerate() {
            if let Some(f) = server_frames(&c.take()).first() {
                assert!(!told[i], "told twice");
                assert_eq!((f.0, close_code(&f.1)), (CLOSE, 1012));
                told[i] = true;
            }
        }
        let out = sse.take();
        if !out.is_empty() {
            assert!(!told[10], "told twice");
            // Come back soon, spread out: retry 1 to 3 s, then the end of the stream.
            let text = String::from_utf8(out).unwrap_or_default();
            let retry: u64 = text
                .strip_prefix("retry: ")
                .and_then(|r| r.trim().parse().ok())
                .unwrap_or(0);
            assert!((1000..=3000).contains(&retry), "{text:?}");
            assert!(sse.write_shut());
            told[10] = true;
        }
        told.iter().filter(|t| **t).count()
    };
    // 11 subscribers: a quarter is 3 (rounded up), again a quarter is still 3, half is 6.
    h.drain(0.25, true);
    assert_eq!(look(&mut told), 3);
    h.drain(0.25, true);
    assert_eq!(look(&mut told), 3);
    h.drain(0.5, true);
    assert_eq!(look(&mut told), 6);
    h.drain(1.0, true);
    assert_eq!(look(&mut told), 11);
}

#[test]
fn grip_bridge_opens_subscribes_and_delivers() {
    let mut h = Harness::with_grip(Config::default(), "* 127.0.0.1:9,over_http\n");
    let c = h.connect();
    h.send(&c, &upgrade("/chat"));
    // Nothing for the client until the backend accepts; the backend gets an OPEN.
    assert!(c.take().is_empty());
    let job = h.next_job().expect("OPEN forwarded");
    let request = String::from_utf8_lossy(&job.request).into_owned();
    assert!(request.starts_with("POST /chat HTTP/1.1\r\n"), "{request}");
    assert!(request.contains("Content-Type: application/websocket-events\r\n"));
    assert!(request.contains("Sec-WebSocket-Extensions: grip\r\n"));
    assert!(request.ends_with("\r\n\r\nOPEN\r\n"), "{request}");
    // The backend accepts, subscribes the connection with a control message, and says hello.
    let mut body = Vec::new();
    write_event(&mut body, &WsEvent::Open);
    write_event(
        &mut body,
        &WsEvent::Text(r#"c:{"type":"subscribe","channel":"room"}"#),
    );
    write_event(&mut body, &WsEvent::Text("m:welcome"));
    h.answer(
        &job,
        200,
        &[
            ("Content-Type", "application/websocket-events"),
            ("Sec-WebSocket-Extensions", "grip"),
        ],
        &body,
    );
    let out = c.take();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 101 "));
    assert_eq!(
        server_frames(after_head(&out)),
        vec![(TEXT, b"welcome".to_vec())]
    );
    assert_eq!(h.counts(), [0, 1, 0, 0, 0, 1, 1, 1]);
    // A publish with WebSocket content reaches it.
    let content = GripContent {
        id: None,
        stream: None,
        response: None,
        ws: Some(WsPart::Frame(encode_frame(OpCode::Text, b"hi all").into())),
    };
    h.publish_with("room", "hi all", Some(Arc::new(content)));
    assert_eq!(server_frames(&c.take()), vec![(TEXT, b"hi all".to_vec())]);
    // The client's messages go to the backend as events.
    h.send_frame(&c, OpCode::Text, b"hey");
    let job = h.next_job().expect("TEXT forwarded");
    assert!(job.request.ends_with(b"TEXT 3\r\nhey\r\n"));
    // The client leaves: the backend hears DISCONNECT, and the counts return to zero.
    h.hang_up(&c);
    let mut notices = Vec::new();
    while let Some(j) = h.next_job() {
        notices.push(j);
    }
    assert!(notices
        .iter()
        .any(|j| j.reply.is_none() && j.request.ends_with(b"DISCONNECT\r\n")));
    assert_eq!(h.counts(), [0; 8]);
}

#[test]
fn grip_stream_hold_sends_its_keepalive_when_quiet() {
    let mut h = Harness::with_grip(Config::default(), "* 127.0.0.1:9\n");
    let c = h.connect();
    h.send(&c, b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n");
    let job = h.next_job().expect("request forwarded");
    assert!(job.request.starts_with(b"GET /events HTTP/1.1\r\n"));
    assert_eq!(h.counts(), [1, 0, 0, 0, 0, 0, 1, 1]);
    h.answer(
        &job,
        200,
        &[
            ("Content-Type", "text/plain"),
            ("Grip-Hold", "stream"),
            ("Grip-Channel", "feed"),
            ("Grip-Keep-Alive", "ka; timeout=4"),
        ],
        b"start\n",
    );
    let out = c.take();
    let head = String::from_utf8_lossy(&out).into_owned();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(head.contains("Transfer-Encoding: chunked\r\n"), "{head}");
    assert_eq!(after_head(&out), b"6\r\nstart\n\r\n");
    assert_eq!(h.counts(), [0, 0, 0, 1, 0, 1, 1, 1]);
    // Quiet for the keep-alive's timeout: the backend's data, as a chunk; never our own.
    h.advance(3);
    assert!(c.take().is_empty());
    h.advance(1);
    assert_eq!(c.take(), b"2\r\nka\r\n");
    // Published stream content is delivered and resets the quiet time.
    let content = GripContent {
        id: None,
        stream: Some(StreamPart::Send {
            raw: Arc::from(&b"news\n"[..]),
            chunk: Arc::from(&b"5\r\nnews\n\r\n"[..]),
        }),
        response: None,
        ws: None,
    };
    h.publish_with("feed", "news\n", Some(Arc::new(content)));
    assert_eq!(c.take(), b"5\r\nnews\n\r\n");
    h.advance(3);
    assert!(c.take().is_empty());
    h.advance(1);
    assert_eq!(c.take(), b"2\r\nka\r\n");
    // Shutdown ends the stream with its last chunk.
    h.shutdown();
    assert_eq!(c.take(), clarion_proto::http1::LAST_CHUNK);
    assert_eq!(h.counts(), [0; 8]);
}

#[test]
fn grip_response_hold_gets_the_backends_answer_at_its_timeout() {
    let mut h = Harness::with_grip(Config::default(), "* 127.0.0.1:9\n");
    let c = h.connect();
    h.send(&c, b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n");
    let job = h.next_job().unwrap();
    h.answer(
        &job,
        200,
        &[
            ("Content-Type", "text/plain"),
            ("Grip-Hold", "response"),
            ("Grip-Channel", "c"),
            ("Grip-Timeout", "3"),
        ],
        b"nothing yet\n",
    );
    assert!(c.take().is_empty());
    assert_eq!(h.counts(), [0, 0, 0, 0, 1, 1, 1, 1]);
    h.advance(2);
    assert!(c.take().is_empty());
    h.advance(1);
    let out = c.take();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200 "));
    assert_eq!(after_head(&out), b"nothing yet\n");
    // The client allowed keep-alive: the connection reads its next request.
    assert_eq!(h.counts(), [1, 0, 0, 0, 0, 0, 1, 1]);
    h.hang_up(&c);
    assert_eq!(h.counts(), [0; 8]);
}

#[test]
fn grip_backend_failure_is_answered_502_and_the_connection_kept() {
    let mut h = Harness::with_grip(Config::default(), "* 127.0.0.1:9\n");
    let c = h.connect();
    h.send(&c, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    let job = h.next_job().unwrap();
    h.fail(
        &job,
        crate::grip::backend::Failure::Unreachable("refused".into()),
    );
    let out = c.take_text();
    assert!(out.starts_with("HTTP/1.1 502 "), "{out}");
    assert!(out.ends_with("Error while proxying to origin.\n"), "{out}");
    assert!(!c.write_shut());
    assert_eq!(h.counts(), [1, 0, 0, 0, 0, 0, 1, 1]);
    // A late answer for the same ticket is ignored.
    h.answer(&job, 200, &[], b"late");
    assert!(c.take().is_empty());
}

#[test]
fn connection_over_the_per_address_limit_is_refused_with_429() {
    let config = Config {
        max_connections_per_address: 1,
        ..Config::default()
    };
    let mut h = Harness::new(config);
    let first = h.connect();
    let second = h.connect();
    let out = second.take_text();
    assert!(out.starts_with("HTTP/1.1 429 "), "{out}");
    assert!(second.write_shut());
    assert_eq!(h.counts(), [1, 0, 0, 0, 0, 0, 1, 1]);
    h.hang_up(&second);
    h.hang_up(&first);
    assert_eq!(h.counts(), [0; 8]);
    // The address may connect again.
    let third = h.connect();
    assert!(third.take().is_empty());
    assert_eq!(h.counts(), [1, 0, 0, 0, 0, 0, 1, 1]);
}

#[test]
fn a_grip_signature_is_made_at_the_engines_clock() {
    let mut h = Harness::with_grip(Config::default(), "*,sig_key=s3cret 127.0.0.1:9\n");
    h.advance(7);
    let c = h.connect();
    h.send(&c, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    let job = h.next_job().unwrap();
    let text = String::from_utf8(job.request).unwrap();
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("Grip-Sig: "))
        .expect("a Grip-Sig header");
    let now = super::testkit::UNIX_BASE + 7;
    let claims = clarion_proto::grip::sig::verify(token, b"s3cret", now).unwrap();
    // Before the engine passed its clock in, the wall clock was read here.
    assert_eq!(
        claims.exp,
        now + crate::config::limits::GRIP_SIG_LIFETIME_SECS
    );
}

#[test]
fn an_in_band_publish_is_stamped_at_the_engines_clock() {
    let mut h = Harness::new(Config {
        allow_client_publish: true,
        ..Config::default()
    });
    let c = open_ws(&mut h);
    h.advance(7);
    h.send_frame(&c, TEXT, br#"{"type":"publish","topic":"t","data":"x"}"#);
    let replies = server_frames(&c.take());
    assert!(
        String::from_utf8_lossy(&replies[0].1).contains(r#""type":"published""#),
        "{replies:?}"
    );
    let from_start = format!("{}-0", h.shared.broker.epoch());
    let kept = h
        .shared
        .broker
        .read_since(&["t"], crate::broker::Since::Id(&from_start));
    // History ages count from this stamp; before the engine passed its clock in, the
    // broker read its own (the hub clock's base plus the test's real run time).
    let stamps: Vec<u32> = kept.replay.iter().map(|m| m.at).collect();
    assert_eq!(stamps, vec![super::testkit::HUB_BASE + 7]);
}
