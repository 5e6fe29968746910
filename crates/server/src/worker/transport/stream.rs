//! HTTP streaming responses: Server-Sent Events and chunked newline-delimited JSON (or raw)
//! lines. Both have the same life (a head, the replay, then live messages until the client
//! leaves) and differ only in the encoding of each message, so they share this module.
//!
//! Deliveries to open streams are made by [`crate::worker`]'s fan-out with the shared encodings.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::{http1, sse};

use crate::broker::Since;
use crate::message::{Encoding, Published};
use crate::worker::socket::Socket;
use crate::worker::state::{Kind, SseMode, State, StreamMode};
use crate::worker::Engine;

impl<S: Socket> Engine<S> {
    /// Starts an SSE or NDJSON stream: head, prelude, gap notices, replay, then live messages.
    pub(crate) fn open_stream(
        &mut self,
        k: u32,
        topics: &[&str],
        since: Since<'_>,
        state: State,
        checked: crate::worker::transport::auth::Checked,
    ) {
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
        let Some(sub) = self.subscribe_conn(k, topics, since, false) else {
            return;
        };
        for g in &sub.gaps {
            let json = g.json();
            if sse {
                sse::write_event(&mut out, None, Some("gap"), json.as_bytes());
            } else {
                http1::write_chunk(&mut out, format!("{json}\n").as_bytes());
            }
        }
        let encoding = match state {
            State::Sse(SseMode::Json) => Encoding::SseJson,
            State::Stream(StreamMode::Raw) => Encoding::RawChunk,
            _ if sse => Encoding::Sse,
            _ => Encoding::NdjsonChunk,
        };
        self.send_resume(k, vec![out.into()], &sub.replay, encoding);
    }

    /// An SSE request that cannot be subscribed now (the cluster's broker is reconnecting): a
    /// browser's `EventSource` gives up for good on any answer but `200`, so it gets a `200`
    /// stream that says when to come back (`retry:`, the same 5 s as `Retry-After`) and why
    /// (an `unavailable` event), and ends; the EventSource reconnects by itself, with its
    /// `Last-Event-ID`, and resumes exactly.
    pub(crate) fn sse_unavailable(&mut self, k: u32, why: &str) {
        self.shared.metrics.http_errors.fetch_add(1, Relaxed);
        let origin = self.shared.config.cors_allow_origin.clone();
        let mut headers: Vec<(&str, &str)> = vec![
            ("Content-Type", "text/event-stream; charset=utf-8"),
            ("Cache-Control", "no-cache"),
            ("Connection", "close"),
        ];
        if !origin.is_empty() {
            headers.push(("Access-Control-Allow-Origin", &origin));
        }
        let mut out = Vec::with_capacity(256 + why.len());
        http1::write_response_head(&mut out, 200, &headers, None);
        sse::write_retry(&mut out, 5000);
        let json = clarion_proto::pubsub::Reply::Error {
            error: why,
            topic: None,
        }
        .to_json();
        sse::write_event(&mut out, None, Some("unavailable"), json.as_bytes());
        self.start_closing(k, Some(out.into()), crate::metrics::CloseReason::HttpError);
    }

    /// Writes `first` (a head, gap notices) and the replayed messages in one go. The replay may
    /// exceed the slow-consumer cap: it is bounded by history, and the client asked for it.
    pub(crate) fn send_resume(
        &mut self,
        k: u32,
        first: Vec<Arc<[u8]>>,
        replay: &[Arc<Published>],
        encoding: Encoding,
    ) {
        let mut frames: Vec<&Arc<[u8]>> = first.iter().collect();
        frames.extend(replay.iter().map(|m| m.encoded(encoding)));
        self.write_all_to(k, &frames, None);
        self.tally.delivered += replay.len() as u64;
    }
}
