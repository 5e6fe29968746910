//! The server side of one HTTP/2 connection (RFC 9113), sans-IO: bytes in, frames out, and
//! events for the requests it carries.
//!
//! Each stream is one HTTP/1.1-shaped exchange for the layer above: [`Connection::receive`]
//! turns a request's header block into the HTTP/1.1 head the server already routes
//! ([`super::request`]) and its DATA into body bytes; [`Connection::respond`] turns the bytes
//! of an HTTP/1.1 answer back into HEADERS and DATA frames ([`super::response`]), as far as
//! the flow-control windows allow, leaving the rest with the caller. So every transport (SSE,
//! NDJSON, long-poll, WebSockets through RFC 8441) runs over HTTP/2 with its HTTP/1.1 code,
//! and a slow stream's unsent bytes stay where its slow-consumer limit counts them.
//!
//! What a peer can make this side do is bounded: one frame of input buffered at most (the
//! parser refuses longer ones before their payload arrives), header blocks within the
//! header-list limit (compressed and decoded, CONTINUATION frames counted), streams within
//! `SETTINGS_MAX_CONCURRENT_STREAMS`, and per-second budgets for the frames that cost work
//! without carrying a request (SETTINGS, PING, empty DATA, resets: the rapid-reset attack),
//! past which the connection ends with `ENHANCE_YOUR_CALM`. The reset budget counts the
//! resets this side sends as well as the client's: a client that makes the server reset its
//! streams (a zero WINDOW_UPDATE, DATA on a half-closed stream, a malformed request: the
//! "MadeYouReset" attack, CVE-2025-8671) opens streams as cheaply as one that resets them
//! itself.
//!
//! What this side does not know is time: the caller asks [`Connection::pending_header_block`]
//! and ends a connection whose header block is not finished in time with
//! [`Connection::header_block_late`].

use super::frame::{self, ErrorCode, Frame, FrameError, Setting, MAX_WINDOW, PREFACE};
use super::hpack::{Decoder, Encoder, HpackError};
use super::request::{Builder, Trailers};
use super::stream::{Out, Stream, Streams, NO_USER};
use limits::{Flood, Passing, TOO_MANY};

pub use super::events::{Event, Fatal};
pub use super::settings::Settings;
pub use dormant::Dormant;

/// The connection's flow-control window on both sides starts here (RFC 9113 §6.9.2).
const CONN_WINDOW: i32 = 65_535;
/// Streams remembered as closed, to tell a frame on a stream that ended (`STREAM_CLOSED`)
/// from one on a stream that never existed (`PROTOCOL_ERROR`).
const RECENTLY_CLOSED: usize = 16;

#[derive(Debug)]
struct Block {
    stream: u32,
    bytes: Vec<u8>,
    end_stream: bool,
    frames: u32,
}

/// The ids of the last [`RECENTLY_CLOSED`] streams closed, and where the next goes.
#[derive(Debug, Default)]
pub(crate) struct Closed {
    pub(crate) ids: [u32; RECENTLY_CLOSED],
    pub(crate) at: usize,
}

/// The server side of one connection.
#[derive(Debug)]
pub struct Connection {
    pub(crate) settings: Settings,
    got_preface: bool,
    got_settings: bool,
    peer_initial_window: i32,
    pub(crate) peer_max_frame: u32,
    /// The connection's windows, within ±2^31 (wider arithmetic checks a change first).
    pub(crate) send_window: i32,
    recv_window: i32,
    decoder: Decoder,
    pub(crate) encoder: Encoder,
    /// `None` while nothing passing is held (see [`Passing`]).
    passing: Option<Box<Passing>>,
    pub(crate) streams: Streams,
    last_stream: u32,
    /// The last streams closed, made when the first one closes (a connection that holds one
    /// stream open for its life never needs it).
    closed: Option<Box<Closed>>,
    going_away: bool,
    windows_opened: bool,
}

impl Connection {
    /// A connection that will enforce `settings`; [`Connection::start`] writes them.
    pub fn new(settings: Settings) -> Connection {
        Connection {
            settings,
            got_preface: false,
            got_settings: false,
            peer_initial_window: 65_535,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            send_window: CONN_WINDOW,
            recv_window: CONN_WINDOW,
            decoder: Decoder::advertising(settings.header_table),
            encoder: Encoder::new(),
            passing: None,
            streams: Streams::None,
            last_stream: 0,
            closed: None,
            going_away: false,
            windows_opened: false,
        }
    }

    /// Writes this side's SETTINGS: the server's part of the connection preface.
    pub fn start(&self, out: &mut Vec<u8>) {
        let s = self.settings;
        let mut list = vec![
            Setting::MaxConcurrentStreams(s.max_streams),
            Setting::MaxHeaderListSize(s.max_header_list),
        ];
        if s.initial_window != 65_535 {
            list.push(Setting::InitialWindowSize(s.initial_window));
        }
        if s.header_table != 4_096 {
            list.push(Setting::HeaderTableSize(s.header_table));
        }
        if s.connect_protocol {
            list.push(Setting::EnableConnectProtocol(1));
        }
        frame::write_settings(out, &list);
    }

    /// Reads whole frames from `input`, writing what they call for (acknowledgements, window
    /// updates, resets) to `out` and the requests' events to `events`. Returns the bytes
    /// used; the rest is an incomplete frame. On `Err` a GOAWAY is in `out` and the
    /// connection must end once it is written.
    pub fn receive<'a>(
        &mut self,
        input: &'a [u8],
        out: &mut Vec<u8>,
        events: &mut Vec<Event<'a>>,
    ) -> Result<usize, Fatal> {
        let mut pos = 0;
        if self.flood().is_some_and(|f| f.resets > self.budget()) {
            // Resets the layer above sent ([`Connection::cancel`]) since the last frame.
            return Err(self.fail(ErrorCode::EnhanceYourCalm, TOO_MANY, out));
        }
        if !self.got_preface {
            match input.get(..PREFACE.len()) {
                Some(p) if p == PREFACE => pos = PREFACE.len(),
                Some(_) => return Err(self.fail(ErrorCode::ProtocolError, "bad preface", out)),
                None if PREFACE.starts_with(input) => return Ok(0),
                None => return Err(self.fail(ErrorCode::ProtocolError, "bad preface", out)),
            }
            self.got_preface = true;
        }
        loop {
            let rest = input.get(pos..).unwrap_or_default();
            match frame::parse(rest, frame::DEFAULT_MAX_FRAME) {
                Ok(None) => return Ok(pos),
                Ok(Some((f, used))) => {
                    pos += used;
                    self.on_frame(f, out, events)?;
                }
                Err(FrameError {
                    stream: Some(id),
                    code,
                    ..
                }) if self.block().is_none() && id != 0 => {
                    // A frame-level stream error (a self-dependency): that frame is skipped.
                    let len = rest.get(..3).map_or(0, |b| {
                        b.iter().fold(0usize, |n, &x| n << 8 | usize::from(x))
                    });
                    pos += frame::HEADER_LEN + len;
                    self.last_stream = self.last_stream.max(id);
                    self.reset(id, code, out, events)?;
                }
                Err(e) => return Err(self.fail(e.code, e.reason, out)),
            }
        }
    }

    fn on_frame<'a>(
        &mut self,
        f: Frame<'a>,
        out: &mut Vec<u8>,
        events: &mut Vec<Event<'a>>,
    ) -> Result<(), Fatal> {
        if let Some(b) = self.block() {
            if !matches!(f, Frame::Continuation { stream, .. } if stream == b.stream) {
                return Err(self.fail(
                    ErrorCode::ProtocolError,
                    "a frame inside a header block",
                    out,
                ));
            }
        }
        if !self.got_settings && !matches!(f, Frame::Settings { ack: false, .. }) {
            return Err(self.fail(
                ErrorCode::ProtocolError,
                "the preface is not followed by SETTINGS",
                out,
            ));
        }
        match f {
            // This side sends one SETTINGS: the first acknowledgement is of it, and any other
            // changes nothing.
            Frame::Settings { ack: true, .. } => {
                self.decoder.acknowledged(self.settings.header_table)
            }
            Frame::Settings {
                ack: false,
                payload,
            } => {
                // The preface's SETTINGS is owed, not spent: a connection's first frames
                // then leave nothing passing to hold.
                if self.got_settings {
                    self.spend(|f| &mut f.settings, out)?;
                }
                self.got_settings = true;
                for s in Frame::settings(payload) {
                    match s {
                        Ok(s) => self.apply(s, out)?,
                        Err(e) => return Err(self.fail(e.code, e.reason, out)),
                    }
                }
                frame::write_settings_ack(out);
            }
            Frame::Ping { ack: false, data } => {
                self.spend(|f| &mut f.pings, out)?;
                frame::write_ping(out, data, true);
            }
            Frame::Ping { ack: true, .. } | Frame::Priority { .. } | Frame::Unknown { .. } => {}
            Frame::GoAway { .. } => {
                // The client will open no more streams; those open finish as they are.
            }
            Frame::WindowUpdate {
                stream: 0,
                increment,
            } => {
                let w = i64::from(self.send_window) + i64::from(increment);
                if w > i64::from(MAX_WINDOW) {
                    return Err(self.fail(
                        ErrorCode::FlowControlError,
                        "connection window above 2^31-1",
                        out,
                    ));
                }
                self.send_window = w as i32;
                self.windows_opened = true;
            }
            Frame::WindowUpdate { stream, increment } => {
                self.idle_check(stream, "WINDOW_UPDATE on an idle stream", out)?;
                if let Some(s) = self.find(stream) {
                    let w = i64::from(s.send_window) + i64::from(increment);
                    if w > i64::from(MAX_WINDOW) {
                        self.reset(stream, ErrorCode::FlowControlError, out, events)?;
                    } else {
                        s.send_window = w as i32;
                        self.windows_opened = true;
                    }
                }
            }
            Frame::RstStream { stream, .. } => {
                self.idle_check(stream, "RST_STREAM on an idle stream", out)?;
                self.spend(|f| &mut f.resets, out)?;
                if let Some(s) = self.index(stream).and_then(|i| self.streams.swap_remove(i)) {
                    self.remember_closed(stream);
                    events.push(Event::Reset {
                        stream,
                        user: Some(s.user).filter(|&u| u != NO_USER),
                    });
                }
            }
            Frame::Headers {
                stream,
                block,
                end_stream,
                end_headers,
                ..
            } => {
                if stream % 2 == 0 {
                    return Err(self.fail(
                        ErrorCode::ProtocolError,
                        "HEADERS on a server stream id",
                        out,
                    ));
                }
                if end_headers {
                    // Whole in one frame (nearly every request): decoded from the frame.
                    self.block_size_check(block.len(), 1, out)?;
                    self.end_block(stream, block, end_stream, out, events)?;
                } else {
                    self.passing().block = Some(Block {
                        stream,
                        bytes: block.to_vec(),
                        end_stream,
                        frames: 1,
                    });
                    self.grow_block_check(out)?;
                }
            }
            Frame::Continuation {
                block, end_headers, ..
            } => {
                let Some(b) = self.passing.as_mut().and_then(|p| p.block.as_mut()) else {
                    return Err(self.fail(
                        ErrorCode::ProtocolError,
                        "CONTINUATION without HEADERS",
                        out,
                    ));
                };
                b.bytes.extend_from_slice(block);
                b.frames += 1;
                self.grow_block_check(out)?;
                if end_headers {
                    if let Some(b) = self.passing.as_mut().and_then(|p| p.block.take()) {
                        self.end_block(b.stream, &b.bytes, b.end_stream, out, events)?;
                    }
                }
            }
            Frame::Data {
                stream,
                data,
                end_stream,
                flow_len,
            } => self.on_data(stream, data, end_stream, flow_len, out, events)?,
            Frame::PushPromise { .. } => {
                return Err(self.fail(ErrorCode::ProtocolError, "PUSH_PROMISE", out))
            }
        }
        Ok(())
    }

    fn on_data<'a>(
        &mut self,
        stream: u32,
        data: &'a [u8],
        end_stream: bool,
        flow_len: u32,
        out: &mut Vec<u8>,
        events: &mut Vec<Event<'a>>,
    ) -> Result<(), Fatal> {
        let w = i64::from(self.recv_window) - i64::from(flow_len);
        if w < 0 {
            return Err(self.fail(
                ErrorCode::FlowControlError,
                "DATA beyond the connection window",
                out,
            ));
        }
        self.recv_window = w as i32;
        if self.recv_window < CONN_WINDOW / 2 {
            frame::write_window_update(out, 0, (CONN_WINDOW - self.recv_window) as u32);
            self.recv_window = CONN_WINDOW;
        }
        if flow_len == 0 && !end_stream {
            self.spend(|f| &mut f.empty, out)?;
        }
        self.idle_check(stream, "DATA on an idle stream", out)?;
        let initial = self.settings.initial_window as i32;
        let Some(i) = self.index(stream) else {
            // Closed: the client may not have seen our reset yet; say so again (a reset sent,
            // counted like any other).
            self.stream_error(out)?;
            frame::write_rst_stream(out, stream, ErrorCode::StreamClosed);
            return Ok(());
        };
        let Some(s) = self.streams.get_mut(i) else {
            return Ok(());
        };
        let len = data.len() as u64;
        s.recv_window -= flow_len as i32;
        let fault = if s.remote_closed {
            Some(ErrorCode::StreamClosed)
        } else if s.recv_window < 0 {
            Some(ErrorCode::FlowControlError)
        } else if s.expect != u64::MAX && (len > s.expect || (end_stream && s.expect != len)) {
            // The body does not match its content-length: malformed (§8.1.1).
            Some(ErrorCode::ProtocolError)
        } else {
            None
        };
        if let Some(code) = fault {
            return self.reset(stream, code, out, events);
        }
        if s.expect != u64::MAX {
            s.expect -= len;
        }
        if !end_stream && s.recv_window < initial / 2 {
            frame::write_window_update(out, stream, (initial - s.recv_window) as u32);
            s.recv_window = initial;
        }
        s.remote_closed = end_stream;
        let user = s.user;
        events.push(Event::Data {
            stream,
            user,
            data,
            end_stream,
        });
        if end_stream {
            self.forget_if_done(stream);
        }
        Ok(())
    }

    /// The header block is complete: decode it (always, to keep the HPACK state in step with
    /// the client's) and act on it.
    fn end_block<'a>(
        &mut self,
        id: u32,
        bytes: &[u8],
        end_stream: bool,
        out: &mut Vec<u8>,
        events: &mut Vec<Event<'a>>,
    ) -> Result<(), Fatal> {
        let max_list = self.settings.max_header_list as usize;
        if let Some(i) = self.index(id) {
            // Trailers: regular fields only, and they end the stream.
            let mut t = Trailers::default();
            self.decode(bytes, max_list, |n, _| t.field(n), out)?;
            let remote_closed = self.streams.get(i).is_some_and(|s| s.remote_closed);
            if remote_closed {
                self.reset(id, ErrorCode::StreamClosed, out, events)?;
            } else if !end_stream || !t.ok() {
                self.reset(id, ErrorCode::ProtocolError, out, events)?;
            } else if let Some(s) = self.streams.get_mut(i) {
                if s.expect != u64::MAX && s.expect != 0 {
                    self.reset(id, ErrorCode::ProtocolError, out, events)?;
                } else {
                    s.remote_closed = true;
                    let user = s.user;
                    events.push(Event::Data {
                        stream: id,
                        user,
                        data: &[],
                        end_stream: true,
                    });
                    self.forget_if_done(id);
                }
            }
            return Ok(());
        }
        if id <= self.last_stream {
            let mut ignore = Builder::new();
            self.decode(bytes, max_list, |n, v| ignore.field(n, v), out)?;
            let (code, why) = if self.closed.as_ref().is_some_and(|c| c.ids.contains(&id)) {
                (ErrorCode::StreamClosed, "HEADERS on a closed stream")
            } else {
                (
                    ErrorCode::ProtocolError,
                    "stream id lower than an earlier one",
                )
            };
            return Err(self.fail(code, why, out));
        }
        self.last_stream = id;
        let mut builder = Builder::new();
        let decoded = self.decode(bytes, max_list, |n, v| builder.field(n, v), out)?;
        if self.going_away {
            return Ok(());
        }
        if !decoded {
            // Over the header-list limit: answered, not reset (RFC 9113 §10.5.1); the
            // RST_STREAM after the answer counts as a reset all the same.
            self.stream_error(out)?;
            let mut block = Vec::new();
            self.encoder.encode([(":status", "431")], &mut block);
            frame::write_headers(out, id, &block, true, self.peer_max_frame);
            frame::write_rst_stream(out, id, ErrorCode::NoError);
            self.remember_closed(id);
            return Ok(());
        }
        let built = if self.settings.keep_alive_heads {
            builder.finish_keep_alive(self.settings.connect_protocol)
        } else {
            builder.finish(self.settings.connect_protocol)
        };
        match built {
            Err(_) => {
                self.stream_error(out)?;
                frame::write_rst_stream(out, id, ErrorCode::ProtocolError);
                self.remember_closed(id);
            }
            Ok(request) => {
                if end_stream && request.content_length.is_some_and(|l| l > 0) {
                    self.stream_error(out)?;
                    frame::write_rst_stream(out, id, ErrorCode::ProtocolError);
                    self.remember_closed(id);
                    return Ok(());
                }
                if self.streams.len() >= self.settings.max_streams as usize {
                    self.stream_error(out)?;
                    frame::write_rst_stream(out, id, ErrorCode::RefusedStream);
                    self.remember_closed(id);
                    return Ok(());
                }
                self.streams.push(Stream {
                    id,
                    user: NO_USER,
                    send_window: self.peer_initial_window,
                    recv_window: self.settings.initial_window as i32,
                    remote_closed: end_stream,
                    local_closed: false,
                    websocket: request.websocket,
                    head_only: request.head_only,
                    expect: request.content_length.unwrap_or(u64::MAX),
                    out: Out::default(),
                });
                events.push(Event::Request {
                    stream: id,
                    request,
                    end_stream,
                });
            }
        }
        Ok(())
    }

    /// Decodes a block; `Ok(false)` when it exceeds the header-list limit (the HPACK state is
    /// still kept); any other decoding error ends the connection.
    fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        mut field: impl FnMut(&[u8], &[u8]),
        out: &mut Vec<u8>,
    ) -> Result<bool, Fatal> {
        match self
            .decoder
            .decode(block, max_list, |(n, v, _)| field(n, v))
        {
            Ok(()) => Ok(true),
            Err(HpackError::ListTooLarge) => Ok(false),
            Err(_) => Err(self.fail(
                ErrorCode::CompressionError,
                "header block cannot be decoded",
                out,
            )),
        }
    }

    fn apply(&mut self, s: Setting, out: &mut Vec<u8>) -> Result<(), Fatal> {
        match s {
            Setting::InitialWindowSize(v) => {
                let delta = i64::from(v) - i64::from(self.peer_initial_window);
                for st in self.streams.iter_mut() {
                    let w = i64::from(st.send_window) + delta;
                    if w > i64::from(MAX_WINDOW) {
                        return Err(self.fail(
                            ErrorCode::FlowControlError,
                            "a stream window above 2^31-1",
                            out,
                        ));
                    }
                    st.send_window = w as i32;
                }
                self.peer_initial_window = v as i32;
                if delta > 0 {
                    self.windows_opened = true;
                }
            }
            Setting::MaxFrameSize(v) => self.peer_max_frame = v,
            _ => {}
        }
        Ok(())
    }

    fn idle_check(
        &mut self,
        stream: u32,
        why: &'static str,
        out: &mut Vec<u8>,
    ) -> Result<(), Fatal> {
        if stream > self.last_stream {
            return Err(self.fail(ErrorCode::ProtocolError, why, out));
        }
        Ok(())
    }

    fn fail(&mut self, code: ErrorCode, reason: &'static str, out: &mut Vec<u8>) -> Fatal {
        frame::write_goaway(out, self.last_stream, code, reason.as_bytes());
        self.going_away = true;
        Fatal { code, reason }
    }

    pub(crate) fn index(&self, stream: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == stream)
    }

    pub(crate) fn find(&mut self, stream: u32) -> Option<&mut Stream> {
        self.streams.iter_mut().find(|s| s.id == stream)
    }

    fn remember_closed(&mut self, stream: u32) {
        let closed = self.closed.get_or_insert_with(Default::default);
        if let Some(slot) = closed.ids.get_mut(closed.at % RECENTLY_CLOSED) {
            *slot = stream;
        }
        closed.at = (closed.at + 1) % RECENTLY_CLOSED;
    }

    /// Removes a stream both sides have finished with.
    pub(crate) fn forget_if_done(&mut self, stream: u32) {
        if let Some(i) = self.index(stream) {
            if self
                .streams
                .get(i)
                .is_some_and(|s| s.remote_closed && s.local_closed)
            {
                self.streams.swap_remove(i);
                self.remember_closed(stream);
            }
        }
    }

    /// Resets a stream for the client's error: RST_STREAM with `code`, and a
    /// [`Event::Reset`] for whatever served it. Counted in the reset budget; past it the
    /// connection ends instead.
    fn reset<'a>(
        &mut self,
        stream: u32,
        code: ErrorCode,
        out: &mut Vec<u8>,
        events: &mut Vec<Event<'a>>,
    ) -> Result<(), Fatal> {
        if let Some(s) = self.index(stream).and_then(|i| self.streams.swap_remove(i)) {
            events.push(Event::Reset {
                stream,
                user: Some(s.user).filter(|&u| u != NO_USER),
            });
        }
        self.remember_closed(stream);
        self.stream_error(out)?;
        frame::write_rst_stream(out, stream, code);
        Ok(())
    }

    /// Resets a stream the layer above has given up on (its handle is gone): no event.
    /// Counted in the reset budget: past it, the next [`Connection::receive`] ends the
    /// connection.
    pub fn cancel(&mut self, stream: u32, code: ErrorCode, out: &mut Vec<u8>) {
        if let Some(i) = self.index(stream) {
            self.streams.swap_remove(i);
            frame::write_rst_stream(out, stream, code);
            self.remember_closed(stream);
            let f = &mut self.passing().flood;
            f.resets = f.resets.saturating_add(1);
        }
    }

    /// Ties a stream to the layer above's handle for it.
    pub fn bind(&mut self, stream: u32, user: u32) {
        if let Some(s) = self.find(stream) {
            s.user = user;
        }
    }

    /// Ends the connection's life politely: GOAWAY naming the last stream it will serve; no
    /// new stream is taken after it.
    pub fn go_away(&mut self, code: ErrorCode, out: &mut Vec<u8>) {
        if !self.going_away {
            self.going_away = true;
            frame::write_goaway(out, self.last_stream, code, b"");
        }
    }

    /// Whether a GOAWAY was sent.
    pub fn going_away(&self) -> bool {
        self.going_away
    }

    /// Whether `stream` is open: it has not ended on both sides, nor been reset.
    pub fn is_open(&self, stream: u32) -> bool {
        self.index(stream).is_some()
    }

    /// The handle [`Connection::bind`] gave `stream`, while it is open.
    pub fn user_of(&self, stream: u32) -> Option<u32> {
        self.streams
            .iter()
            .find(|s| s.id == stream)
            .map(|s| s.user)
            .filter(|&u| u != NO_USER)
    }

    /// Streams either side may still use.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Whether this side has sent all of `stream`'s answer (or the stream is gone).
    pub fn answered(&self, stream: u32) -> bool {
        self.streams
            .iter()
            .find(|s| s.id == stream)
            .is_none_or(|s| s.local_closed)
    }

    /// Whether `stream`'s answer has neither a length nor chunks: it lasts until
    /// [`Connection::end`].
    pub fn answer_until_end(&self, stream: u32) -> bool {
        self.streams
            .iter()
            .any(|s| s.id == stream && matches!(s.out, Out::Close) && !s.local_closed)
    }

    /// Whether a WINDOW_UPDATE or a SETTINGS change opened room to send since the last call.
    pub fn take_windows_opened(&mut self) -> bool {
        std::mem::take(&mut self.windows_opened)
    }

    /// The streams served by a handle of the layer above: `(stream, handle)`.
    pub fn bound(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.streams
            .iter()
            .filter(|s| s.user != NO_USER)
            .map(|s| (s.id, s.user))
    }
}

#[path = "limits.rs"]
mod limits;

#[path = "park.rs"]
pub mod park;

#[path = "dormant.rs"]
pub mod dormant;

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "limits_tests.rs"]
mod limits_tests;

#[cfg(test)]
#[path = "server_table_tests.rs"]
mod table_tests;

#[cfg(test)]
#[path = "run_tests.rs"]
mod run_tests;
