//! HTTP streaming responses: Server-Sent Events and chunked newline-delimited JSON (or raw)
//! lines. Both have the same life (a head, the replay, then live messages until the client
//! leaves) and differ only in the encoding of each message, so they share this module.
//!
//! Deliveries to open streams are made by [`crate::worker`]'s fan-out with the shared encodings.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::{http1, sse};

use crate::broker::Since;
use crate::message::{Encoding, Published};
use crate::worker::socket::Socket;
use crate::worker::state::{Kind, State, StreamMode};
use crate::worker::transport::frame::{jittered_ms, pick, Event, Form, Framing};
use crate::worker::Engine;

/// What a stream's request asks of its messages besides its topics.
#[derive(Clone, Copy, Default)]
pub(crate) struct Asks<'a> {
    /// `filter=`: only messages whose tags pass it (`docs/filters.md`).
    pub(crate) filter: Option<&'a clarion_proto::filter::Filter>,
    /// `delta=1`: messages as deltas of the previous one (`docs/delta.md`).
    pub(crate) delta: bool,
}

impl<S: Socket> Engine<S> {
    /// Starts an SSE or NDJSON stream: head, prelude, gap notices, replay, then live messages
    /// (as deltas with `delta`, the request's topics all being in `delta_topics`).
    pub(crate) fn open_stream(
        &mut self,
        k: u32,
        topics: &[&str],
        since: Since<'_>,
        state: State,
        checked: crate::worker::transport::auth::Checked,
        asks: Asks<'_>,
    ) {
        let Asks { filter, delta } = asks;
        let cfg = &self.shared.config;
        let origin = cfg.cors_allow_origin.as_str();
        let sse = state.kind() == Kind::Sse;
        let raw = state == State::Stream(StreamMode::Raw);
        let mut headers: Vec<(&str, &str)> = vec![
            (
                "Content-Type",
                match (sse, raw) {
                    (true, _) => "text/event-stream; charset=utf-8",
                    (false, false) => "application/x-ndjson",
                    (false, true) => "text/plain; charset=utf-8",
                },
            ),
            ("Cache-Control", "no-cache"),
            ("X-Accel-Buffering", "no"),
            ("Connection", "close"),
        ];
        if !sse {
            headers.push(("Transfer-Encoding", "chunked"));
        }
        if !origin.is_empty() {
            headers.push(("Access-Control-Allow-Origin", origin));
        }
        let mut out = Vec::with_capacity(512);
        http1::write_response_head(&mut out, 200, &headers, None);
        if sse {
            sse::write_retry(&mut out, cfg.sse_retry);
        }
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        conn.last_seen = self.now;
        self.set_state(k, state);
        self.adopt(k, checked);
        let Some(mut sub) = self.subscribe_filtered(k, topics, since, false, filter) else {
            return;
        };
        crate::worker::filters::keep_passing(filter, &mut sub.replay);
        let framing = Framing::of(state);
        for g in &sub.gaps {
            let json = g.json();
            framing.frame(
                Event::Typed {
                    kind: "gap",
                    json: &json,
                },
                &mut out,
            );
        }
        // Only SSE and streams open here (see `open_http_subscription`).
        let encoding = framing.encoding().unwrap_or(Encoding::NdjsonChunk);
        self.send_resume(k, vec![out.into()], &sub.replay, Form::Shared(encoding));
        if delta {
            self.delta_join(k, &sub.names, &sub.replay);
        }
    }

    /// An SSE request that cannot be subscribed now (the cluster's broker is reconnecting): a
    /// browser's `EventSource` gives up for good on any answer but `200`, so it gets a `200`
    /// stream that says when to come back (`retry:`, 4 to 6 s: the 5 s of `Retry-After` with
    /// jitter, so the browsers turned away during an outage do not all come back in the same
    /// millisecond) and why (an `unavailable` event), and ends; the EventSource reconnects by
    /// itself, with its `Last-Event-ID`, and resumes exactly.
    pub(crate) fn sse_unavailable(&mut self, k: u32, why: &str) {
        self.shared.metrics.http_errors.fetch_add(1, Relaxed);
        let out = sse_unavailable_answer(&self.shared.config.cors_allow_origin, why);
        self.start_closing(k, Some(out.into()), crate::metrics::CloseReason::HttpError);
    }

    /// Writes `first` (a head, gap notices) and the replayed messages in one go. The replay may
    /// exceed the slow-consumer cap: it is bounded by history, and the client asked for it.
    pub(crate) fn send_resume(
        &mut self,
        k: u32,
        first: Vec<Arc<[u8]>>,
        replay: &[Arc<Published>],
        form: Form,
    ) {
        let settings = self.frames.deflate_settings;
        let mut frames: Vec<&Arc<[u8]>> = first.iter().collect();
        frames.extend(replay.iter().map(|m| pick(m, form, &settings)));
        self.write_all_to(k, &frames, None);
        self.scratch.tally.delivered += replay.len() as u64;
    }
}

/// The whole answer to an SSE request that cannot be served now (see
/// [`Engine::sse_unavailable`]): a `200` event stream with `retry:` and an `unavailable`
/// event saying `why`, to be followed by the end of the connection.
pub(crate) fn sse_unavailable_answer(cors_allow_origin: &str, why: &str) -> Vec<u8> {
    let mut headers: Vec<(&str, &str)> = vec![
        ("Content-Type", "text/event-stream; charset=utf-8"),
        ("Cache-Control", "no-cache"),
        ("Connection", "close"),
    ];
    if !cors_allow_origin.is_empty() {
        headers.push(("Access-Control-Allow-Origin", cors_allow_origin));
    }
    let mut out = Vec::with_capacity(256 + why.len());
    http1::write_response_head(&mut out, 200, &headers, None);
    sse::write_retry(&mut out, jittered_ms(4000, 2000));
    let json = clarion_proto::pubsub::Reply::Error {
        error: why,
        topic: None,
    }
    .to_json();
    sse::write_event(&mut out, None, Some("unavailable"), json.as_bytes());
    out
}

/// Whether the start of a request (whatever of it has arrived) asks for an event stream: a
/// `GET` of `/sse`, or an `Accept: text/event-stream` header.
pub(crate) fn asks_for_event_stream(head: &[u8]) -> bool {
    let sse_path = head
        .strip_prefix(b"GET /sse")
        .is_some_and(|rest| matches!(rest.first(), Some(b' ' | b'?')));
    sse_path
        || head.split(|&b| b == b'\n').skip(1).any(|h| {
            h.to_ascii_lowercase()
                .starts_with(b"accept: text/event-stream")
        })
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn event_stream_requests_are_told_apart_from_the_first_bytes() {
        assert!(asks_for_event_stream(
            b"GET /sse?topic=a HTTP/1.1\r\nHost: x\r\n\r\n"
        ));
        assert!(asks_for_event_stream(b"GET /sse HTTP/1.1\r\n"));
        assert!(asks_for_event_stream(
            b"GET /x?topic=a HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n"
        ));
        assert!(!asks_for_event_stream(b"GET /ssex HTTP/1.1\r\n\r\n"));
        assert!(!asks_for_event_stream(
            b"GET /ws?topic=a HTTP/1.1\r\nUpgrade: websocket\r\n"
        ));
        assert!(!asks_for_event_stream(b"POST /sse HTTP/1.1\r\n"));
        assert!(!asks_for_event_stream(b""));
    }

    #[test]
    fn the_unavailable_answer_is_a_200_stream_with_a_jittered_retry() {
        let retries: std::collections::HashSet<u64> = (0..20)
            .map(|_| {
                let out =
                    String::from_utf8(sse_unavailable_answer("*", "full")).unwrap_or_default();
                assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
                assert!(out.contains("event: unavailable\n"), "{out}");
                assert!(out.contains("Access-Control-Allow-Origin: *"), "{out}");
                let retry = out.split("retry: ").nth(1).unwrap_or_default();
                retry
                    .split('\n')
                    .next()
                    .unwrap_or_default()
                    .parse()
                    .unwrap_or(0)
            })
            .collect();
        assert!(
            retries.iter().all(|r| (4000..=6000).contains(r)),
            "{retries:?}"
        );
        assert!(retries.len() > 1, "jitter: {retries:?}");
    }
}
