//! A connection's protocol state while it rests: the form a caller keeps for a connection that
//! holds one open stream and nothing in passing (a browser's one EventSource or RFC 8441
//! WebSocket between two messages, a long-poll waiting for its answer), in 64 bytes instead of
//! the whole [`Connection`]'s 128.
//!
//! What it drops is what such a connection holds only by its shape: the room for more streams
//! and for what passes (a header block in progress, the second's flood counts), the settings
//! the caller enforces anyway (given back to [`Dormant::wake`]), and the stream's answer state
//! beyond "the head is awaited", "until the end" or "sent": a body of a known length or in
//! chunks keeps the connection awake. Everything else is carried as it was, so a woken
//! connection is the connection that dozed, field for field (the hand-over's [`park`] bytes of
//! both are the same; `tests` and the `h2_server` fuzzer check it).
//!
//! [`park`]: Connection::park

use super::{Closed, Connection, Settings};
use crate::h2::hpack::{Decoder, Encoder};
use crate::h2::stream::{Out, Stream, Streams};

/// A resting connection's protocol state; see the module's doc.
#[derive(Debug)]
pub struct Dormant {
    decoder: Decoder,
    closed: Option<Box<Closed>>,
    peer_initial_window: i32,
    peer_max_frame: u32,
    send_window: i32,
    recv_window: i32,
    last_stream: u32,
    stream: u32,
    user: u32,
    stream_send_window: i32,
    stream_recv_window: i32,
    flags: Flags,
}

/// The connection's and its stream's flags, and the stream's answer state, in one byte each.
#[derive(Debug, Clone, Copy)]
struct Flags {
    bits: u8,
    out: Rest,
}

/// Where a resting stream's answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rest {
    Head,
    Close,
    Done,
}

const WINDOWS_OPENED: u8 = 1;
const ENCODER_STARTED: u8 = 1 << 1;
const REMOTE_CLOSED: u8 = 1 << 2;
const LOCAL_CLOSED: u8 = 1 << 3;
const WEBSOCKET: u8 = 1 << 4;
const HEAD_ONLY: u8 = 1 << 5;
/// The request announced a `content-length` of 0 (otherwise none: `u64::MAX`).
const EXPECT_NOTHING: u8 = 1 << 6;

impl Connection {
    /// Whether [`Connection::doze`] would put this connection to rest.
    pub fn can_doze(&self, settings: &Settings) -> bool {
        self.rest(settings).is_some()
    }

    /// Where the one stream's answer is, if this connection may rest.
    fn rest(&self, settings: &Settings) -> Option<Rest> {
        let restable = self.settings == *settings
            && self.got_preface
            && self.got_settings
            && self.passing.is_none()
            && !self.going_away;
        // One stream, inline or the last left of a list.
        match &*self.streams {
            [s] if restable && matches!(s.expect, 0 | u64::MAX) => rest_of(&s.out),
            _ => None,
        }
    }

    /// This connection in its resting form, if it has exactly one stream open, nothing
    /// passing, no GOAWAY sent, the settings `settings`, and its stream's answer is awaited,
    /// lasts until its end, or was sent; otherwise the connection as it was.
    // The connection is handed back as it came, by value (boxing it for the lint would
    // allocate on the refusing path); a caller that checks `can_doze` first never takes it.
    #[allow(clippy::result_large_err)]
    pub fn doze(mut self, settings: &Settings) -> Result<Dormant, Connection> {
        let rest = self.rest(settings);
        let Some(rest) = rest else {
            return Err(self);
        };
        let Some(stream) = self.streams.swap_remove(0) else {
            return Err(self); // Not reached: one stream was there.
        };
        let Connection {
            settings: _,
            got_preface: _,
            got_settings: _,
            peer_initial_window,
            peer_max_frame,
            send_window,
            recv_window,
            decoder,
            encoder,
            passing: _,
            streams: _,
            last_stream,
            closed,
            going_away: _,
            windows_opened,
        } = self;
        let Stream {
            id,
            user,
            send_window: stream_send_window,
            recv_window: stream_recv_window,
            remote_closed,
            local_closed,
            websocket,
            head_only,
            expect,
            out: _,
        } = stream;
        let bits = [
            (windows_opened, WINDOWS_OPENED),
            (encoder.started(), ENCODER_STARTED),
            (remote_closed, REMOTE_CLOSED),
            (local_closed, LOCAL_CLOSED),
            (websocket, WEBSOCKET),
            (head_only, HEAD_ONLY),
            (expect == 0, EXPECT_NOTHING),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |b, (_, bit)| b | bit);
        Ok(Dormant {
            decoder,
            closed,
            peer_initial_window,
            peer_max_frame,
            send_window,
            recv_window,
            last_stream,
            stream: id,
            user,
            stream_send_window,
            stream_recv_window,
            flags: Flags { bits, out: rest },
        })
    }
}

/// The resting form of a stream's answer state, if it has one.
fn rest_of(out: &Out) -> Option<Rest> {
    match out {
        Out::Head => Some(Rest::Head),
        Out::Close => Some(Rest::Close),
        Out::Done => Some(Rest::Done),
        Out::PartialHead(_) | Out::Length(_) | Out::Chunked(_) => None,
    }
}

impl Dormant {
    /// The connection that dozed, enforcing `settings` (those it dozed with).
    pub fn wake(self, settings: Settings) -> Connection {
        let Dormant {
            decoder,
            closed,
            peer_initial_window,
            peer_max_frame,
            send_window,
            recv_window,
            last_stream,
            stream,
            user,
            stream_send_window,
            stream_recv_window,
            flags: Flags { bits, out },
        } = self;
        let on = |bit: u8| bits & bit != 0;
        let out = match out {
            Rest::Head => Out::Head,
            Rest::Close => Out::Close,
            Rest::Done => Out::Done,
        };
        Connection {
            settings,
            got_preface: true,
            got_settings: true,
            peer_initial_window,
            peer_max_frame,
            send_window,
            recv_window,
            decoder,
            encoder: Encoder::resumed(on(ENCODER_STARTED)),
            passing: None,
            streams: Streams::One(Stream {
                id: stream,
                user,
                send_window: stream_send_window,
                recv_window: stream_recv_window,
                remote_closed: on(REMOTE_CLOSED),
                local_closed: on(LOCAL_CLOSED),
                websocket: on(WEBSOCKET),
                head_only: on(HEAD_ONLY),
                expect: if on(EXPECT_NOTHING) { 0 } else { u64::MAX },
                out,
            }),
            last_stream,
            closed,
            going_away: false,
            windows_opened: on(WINDOWS_OPENED),
        }
    }

    /// The handle the one stream is bound to, as [`Connection::user_of`] says it.
    pub fn user(&self) -> Option<u32> {
        (self.user != crate::h2::stream::NO_USER).then_some(self.user)
    }

    /// The one stream's id.
    pub fn stream(&self) -> u32 {
        self.stream
    }
}

#[cfg(test)]
#[path = "dormant_tests.rs"]
mod tests;
