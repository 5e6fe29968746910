//! One HTTP/2 soak connection, without I/O: several SSE streams on one connection, as a
//! browser's `EventSource`s to one origin share it, each resuming after its own last id with a
//! `last-event-id` header and read into what the soak checks ([`Got`], per stream).
//!
//! Frames and HPACK are `clarion_proto::h2`'s, the server's own codec (as in
//! [`crate::h2_life`], the load bench's HTTP/2 life, whose flow control this follows: the
//! largest windows, given back every [`TOP_UP`] bytes). Unlike that life, which lets a
//! connection go on when one of its streams ends, a soak connection ends as a whole when any
//! stream is refused, reset or ended: the client then reconnects every stream with its last
//! id, as a page reloading would.
//!
//! Call order: [`SoakH2::preface`] once connected (over TLS: once ALPN chose `h2`), then
//! [`SoakH2::handle_input`] for each read (plaintext); the requests go out (as a
//! [`Got::Reply`]) when the server's first SETTINGS arrive; [`SoakH2::handle_end`] when the
//! server ends the connection. An error leaves the connection dead.

use clarion_proto::h2::frame::{self, Frame, Setting, DEFAULT_MAX_FRAME, MAX_WINDOW, PREFACE};
use clarion_proto::h2::hpack::{Decoder, Encoder, DEFAULT_TABLE_SIZE};

use crate::h2_life::TOP_UP;
use crate::soak_life::{sse_event, Got, SoakEnd};

/// Largest header block or SSE event buffered: far above a soak message.
const MAX_BUFFERED: usize = 1 << 20;

/// One subscribing stream.
#[derive(Debug)]
struct Stream {
    /// `:path` and the id to resume after.
    path: String,
    since: Option<String>,
    answered: bool,
    /// Bytes of an event split across DATA frames.
    partial: Vec<u8>,
    consumed: u32,
}

/// One HTTP/2 soak connection's protocol state; stream `i` has id `2i + 1`.
#[derive(Debug)]
pub struct SoakH2 {
    authority: String,
    scheme: &'static str,
    streams: Vec<Stream>,
    buf: Vec<u8>,
    decoder: Decoder,
    /// A header block waiting for its CONTINUATION: (stream id, END_STREAM, bytes).
    block: Option<(u32, bool, Vec<u8>)>,
    consumed: u32,
    settled: bool,
    dead: bool,
}

impl SoakH2 {
    /// A connection to `authority` (`tls`: `:scheme https`) carrying one stream per
    /// `(path, since)`.
    pub fn new(authority: String, tls: bool, streams: Vec<(String, Option<String>)>) -> SoakH2 {
        SoakH2 {
            authority,
            scheme: if tls { "https" } else { "http" },
            streams: streams
                .into_iter()
                .map(|(path, since)| Stream {
                    path,
                    since,
                    answered: false,
                    partial: Vec::new(),
                    consumed: 0,
                })
                .collect(),
            buf: Vec::new(),
            decoder: Decoder::new(DEFAULT_TABLE_SIZE),
            block: None,
            consumed: 0,
            settled: false,
            dead: false,
        }
    }

    /// The connection preface, this side's SETTINGS (no push, the largest stream window) and
    /// the connection window raised to the largest.
    pub fn preface() -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        frame::write_settings(
            &mut out,
            &[
                Setting::EnablePush(0),
                Setting::InitialWindowSize(MAX_WINDOW),
            ],
        );
        frame::write_window_update(&mut out, 0, MAX_WINDOW - 65_535);
        out
    }

    /// Every stream has been answered `200`.
    pub fn is_open(&self) -> bool {
        !self.dead && self.settled && self.streams.iter().all(|s| s.answered)
    }

    /// The server ended the connection: what it counts as.
    pub fn handle_end(&mut self) -> SoakEnd {
        let e = if self.is_open() {
            SoakEnd::Closed
        } else {
            SoakEnd::ClosedDuringHandshake
        };
        self.dies(e)
    }

    fn dies(&mut self, e: SoakEnd) -> SoakEnd {
        self.dead = true;
        self.buf = Vec::new();
        self.block = None;
        e
    }

    /// Bytes read from the server; what they mean goes to `got` with the stream's index.
    pub fn handle_input(
        &mut self,
        input: &[u8],
        got: &mut impl FnMut(usize, Got<'_>),
    ) -> Result<(), SoakEnd> {
        if self.dead {
            return Ok(());
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.extend_from_slice(input);
        let mut out = Vec::new();
        let result = self.consume(&buf, &mut out, got);
        if !out.is_empty() {
            got(0, Got::Reply(out));
        }
        match result {
            Ok(used) => {
                buf.drain(..used.min(buf.len()));
                self.buf = buf;
                Ok(())
            }
            Err(e) => Err(self.dies(e)),
        }
    }

    fn consume(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        got: &mut impl FnMut(usize, Got<'_>),
    ) -> Result<usize, SoakEnd> {
        let mut at = 0;
        loop {
            let rest = input.get(at..).unwrap_or_default();
            if !self.settled && rest.starts_with(b"HTTP/") {
                return Err(SoakEnd::BadAnswer(
                    "h2: the server answered in HTTP/1.1".into(),
                ));
            }
            let Some((f, used)) = frame::parse(rest, DEFAULT_MAX_FRAME)
                .map_err(|e| SoakEnd::BadFrame(format!("h2: bad frame: {e}")))?
            else {
                return Ok(at);
            };
            self.frame(f, out, got)?;
            at += used;
        }
    }

    fn frame(
        &mut self,
        f: Frame<'_>,
        out: &mut Vec<u8>,
        got: &mut impl FnMut(usize, Got<'_>),
    ) -> Result<(), SoakEnd> {
        let protocol = |why: &str| SoakEnd::BadFrame(format!("h2: {why}"));
        if !self.settled && !matches!(f, Frame::Settings { ack: false, .. }) {
            return Err(protocol("the server's first frame is not SETTINGS"));
        }
        if self.block.is_some() && !matches!(f, Frame::Continuation { .. }) {
            return Err(protocol("frame inside a header block"));
        }
        match f {
            Frame::Settings { ack: true, .. } => {}
            Frame::Settings {
                ack: false,
                payload,
            } => {
                for s in Frame::settings(payload) {
                    let s = s.map_err(|e| protocol(&e.to_string()))?;
                    if let Setting::MaxConcurrentStreams(n) = s {
                        if (n as usize) < self.streams.len() {
                            return Err(protocol("MAX_CONCURRENT_STREAMS below the streams"));
                        }
                    }
                }
                frame::write_settings_ack(out);
                if !self.settled {
                    self.settled = true;
                    self.request(out);
                }
            }
            Frame::Headers {
                stream,
                block,
                end_stream,
                end_headers,
                ..
            } => {
                if end_headers {
                    self.answer(stream, block, end_stream, got)?;
                } else {
                    self.block = Some((stream, end_stream, bounded(Vec::new(), block)?));
                }
            }
            Frame::Continuation {
                stream,
                block,
                end_headers,
            } => {
                let Some((id, end_stream, bytes)) = self.block.take() else {
                    return Err(protocol("CONTINUATION without HEADERS"));
                };
                if id != stream {
                    return Err(protocol("CONTINUATION on another stream"));
                }
                let bytes = bounded(bytes, block)?;
                if end_headers {
                    self.answer(id, &bytes, end_stream, got)?;
                } else {
                    self.block = Some((id, end_stream, bytes));
                }
            }
            Frame::Data {
                stream,
                data,
                end_stream,
                flow_len,
            } => self.data(stream, data, end_stream, flow_len, out, got)?,
            Frame::RstStream { code, .. } => return Err(SoakEnd::H2Reset(code)),
            Frame::GoAway { code, .. } => return Err(SoakEnd::H2GoAway(code)),
            Frame::Ping { ack: false, data } => frame::write_ping(out, data, true),
            Frame::PushPromise { .. } => return Err(protocol("PUSH_PROMISE, push disabled")),
            Frame::Ping { ack: true, .. }
            | Frame::WindowUpdate { .. }
            | Frame::Priority { .. }
            | Frame::Unknown { .. } => {}
        }
        Ok(())
    }

    /// Every stream's subscribing request.
    fn request(&mut self, out: &mut Vec<u8>) {
        let mut encoder = Encoder::new();
        let mut block = Vec::new();
        for (i, s) in self.streams.iter().enumerate() {
            block.clear();
            let mut fields = vec![
                (":method", "GET"),
                (":scheme", self.scheme),
                (":authority", self.authority.as_str()),
                (":path", s.path.as_str()),
                ("accept", "text/event-stream"),
            ];
            if let Some(id) = &s.since {
                fields.push(("last-event-id", id.as_str()));
            }
            encoder.encode(fields, &mut block);
            frame::write_headers(out, stream_id(i), &block, true, DEFAULT_MAX_FRAME);
        }
    }

    fn index(&self, id: u32) -> Result<usize, SoakEnd> {
        let i = (id.saturating_sub(1) / 2) as usize;
        if id % 2 == 1 && i < self.streams.len() {
            Ok(i)
        } else {
            Err(SoakEnd::BadFrame(
                "h2: frame on a stream the client never opened".into(),
            ))
        }
    }

    fn answer(
        &mut self,
        id: u32,
        block: &[u8],
        end_stream: bool,
        got: &mut impl FnMut(usize, Got<'_>),
    ) -> Result<(), SoakEnd> {
        let i = self.index(id)?;
        let (mut status, mut event_stream) = (None, false);
        self.decoder
            .decode(block, MAX_BUFFERED, |(name, value, _)| match name {
                b":status" => {
                    status = std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.parse::<u16>().ok());
                }
                b"content-type" => event_stream = value.starts_with(b"text/event-stream"),
                _ => {}
            })
            .map_err(|e| SoakEnd::BadAnswer(format!("h2: {e}")))?;
        let was_open = self.is_open();
        let Some(s) = self.streams.get_mut(i) else {
            return Ok(());
        };
        if !s.answered {
            match status {
                Some(100..=199) => {}
                Some(200) if event_stream => s.answered = true,
                Some(200) => return Err(SoakEnd::NotCloseDelimited),
                Some(other) => return Err(SoakEnd::Refused(other)),
                None => return Err(SoakEnd::BadAnswer("h2: no :status".into())),
            }
        }
        if end_stream {
            return Err(SoakEnd::H2StreamEnded);
        }
        if !was_open && self.is_open() {
            got(0, Got::Answered);
        }
        Ok(())
    }

    fn data(
        &mut self,
        id: u32,
        data: &[u8],
        end_stream: bool,
        flow_len: u32,
        out: &mut Vec<u8>,
        got: &mut impl FnMut(usize, Got<'_>),
    ) -> Result<(), SoakEnd> {
        let i = self.index(id)?;
        self.consumed = self.consumed.saturating_add(flow_len);
        if self.consumed >= TOP_UP {
            frame::write_window_update(out, 0, self.consumed);
            self.consumed = 0;
        }
        let Some(s) = self.streams.get_mut(i) else {
            return Ok(());
        };
        if !s.answered {
            return Err(SoakEnd::BadFrame("h2: DATA before the answer".into()));
        }
        s.consumed = s.consumed.saturating_add(flow_len);
        if s.consumed >= TOP_UP {
            frame::write_window_update(out, id, s.consumed);
            s.consumed = 0;
        }
        let mut buf = std::mem::take(&mut s.partial);
        buf.extend_from_slice(data);
        let mut at = 0;
        while let Some(used) = sse_event(buf.get(at..).unwrap_or_default(), &mut |g| got(i, g))? {
            at += used;
        }
        buf.drain(..at.min(buf.len()));
        if buf.len() > MAX_BUFFERED {
            return Err(SoakEnd::BadMessage("an SSE event longer than 1 MiB".into()));
        }
        s.partial = buf;
        if end_stream {
            return Err(SoakEnd::H2StreamEnded);
        }
        Ok(())
    }
}

fn stream_id(i: usize) -> u32 {
    (i as u32).saturating_mul(2).saturating_add(1)
}

fn bounded(mut buf: Vec<u8>, more: &[u8]) -> Result<Vec<u8>, SoakEnd> {
    if buf.len().saturating_add(more.len()) > MAX_BUFFERED {
        return Err(SoakEnd::BadAnswer(
            "h2: header block longer than 1 MiB".into(),
        ));
    }
    buf.extend_from_slice(more);
    Ok(buf)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Answered,
        Message(usize, String, u64),
        Gap(usize),
        Reply,
    }

    fn feed(life: &mut SoakH2, input: &[u8], seen: &mut Vec<Seen>) -> Result<(), SoakEnd> {
        life.handle_input(input, &mut |i, g| {
            seen.push(match g {
                Got::Answered => Seen::Answered,
                Got::Message { id, seq, .. } => Seen::Message(i, id.to_string(), seq),
                Got::Gap => Seen::Gap(i),
                Got::Reply(_) => Seen::Reply,
            })
        })
    }

    fn server(encoder: &mut Encoder, out: &mut Vec<u8>, stream: u32) {
        let mut block = Vec::new();
        encoder.encode(
            [(":status", "200"), ("content-type", "text/event-stream")],
            &mut block,
        );
        frame::write_headers(out, stream, &block, false, 16_384);
    }

    fn two_streams() -> SoakH2 {
        SoakH2::new(
            "127.0.0.1:9".into(),
            false,
            vec![
                ("/sse?topic=a".into(), None),
                ("/sse?topic=b".into(), Some("x-7".into())),
            ],
        )
    }

    #[test]
    fn streams_resume_with_their_own_last_event_id_and_split_at_every_byte() {
        let mut settings = Vec::new();
        frame::write_settings(&mut settings, &[Setting::MaxConcurrentStreams(100)]);
        // The requests go out on the server's SETTINGS, the second with its last id.
        let mut life = two_streams();
        let mut replies = Vec::new();
        life.handle_input(&settings, &mut |_, g| {
            if let Got::Reply(b) = g {
                replies.extend(b);
            }
        })
        .unwrap();
        let mut dec = Decoder::new(4096);
        let mut headers = Vec::new();
        let mut rest = &replies[..];
        while let Some((f, used)) = frame::parse(rest, 16_384).unwrap() {
            if let Frame::Headers { stream, block, .. } = f {
                dec.decode(block, 4096, |(n, v, _)| {
                    headers.push((
                        stream,
                        String::from_utf8_lossy(n).to_string(),
                        String::from_utf8_lossy(v).to_string(),
                    ))
                })
                .unwrap();
            }
            rest = &rest[used..];
        }
        assert!(headers.contains(&(1, ":path".into(), "/sse?topic=a".into())));
        assert!(headers.contains(&(3, "last-event-id".into(), "x-7".into())));
        assert!(!headers
            .iter()
            .any(|(s, n, _)| *s == 1 && n == "last-event-id"));

        let mut input = settings.clone();
        let mut enc = Encoder::new();
        server(&mut enc, &mut input, 1);
        server(&mut enc, &mut input, 3);
        frame::write_data(
            &mut input,
            3,
            b"event: gap\ndata: {}\n\nid: b-9\ndata: 8 5 x",
            false,
        );
        frame::write_data(&mut input, 3, b"x\n\n", false);
        frame::write_data(&mut input, 1, b"id: a-1\ndata: 1 5 x\n\n", false);
        let want = [
            Seen::Answered,
            Seen::Gap(1),
            Seen::Message(1, "b-9".into(), 8),
            Seen::Message(0, "a-1".into(), 1),
        ];
        for cut in 0..=input.len() {
            let mut life = two_streams();
            let mut seen = Vec::new();
            feed(&mut life, &input[..cut], &mut seen).unwrap();
            feed(&mut life, &input[cut..], &mut seen).unwrap();
            seen.retain(|s| *s != Seen::Reply);
            assert_eq!(seen, want, "cut at {cut}");
            assert!(life.is_open());
        }
    }

    #[test]
    fn a_reset_a_goaway_or_an_ended_stream_ends_the_connection() {
        let mut settings = Vec::new();
        frame::write_settings(&mut settings, &[]);
        let mut enc = Encoder::new();
        let mut open = settings.clone();
        server(&mut enc, &mut open, 1);
        server(&mut enc, &mut open, 3);
        type AddFrame = fn(&mut Vec<u8>);
        let cases: [(AddFrame, SoakEnd); 3] = [
            (
                |b| frame::write_rst_stream(b, 3, frame::ErrorCode::Cancel),
                SoakEnd::H2Reset(8),
            ),
            (
                |b| frame::write_goaway(b, 3, frame::ErrorCode::NoError, b""),
                SoakEnd::H2GoAway(0),
            ),
            (
                |b| frame::write_data(b, 1, b"", true),
                SoakEnd::H2StreamEnded,
            ),
        ];
        for (add, want) in cases {
            let mut life = two_streams();
            let mut input = open.clone();
            add(&mut input);
            assert_eq!(feed(&mut life, &input, &mut Vec::new()), Err(want));
            assert_eq!(
                feed(&mut life, &open, &mut Vec::new()),
                Ok(()),
                "dead: ignores"
            );
        }
        let mut life = two_streams();
        assert_eq!(
            feed(
                &mut life,
                b"HTTP/1.1 400 Bad Request\r\n\r\n",
                &mut Vec::new()
            ),
            Err(SoakEnd::BadAnswer(
                "h2: the server answered in HTTP/1.1".into()
            ))
        );
        let mut life = two_streams();
        feed(&mut life, &settings, &mut Vec::new()).unwrap();
        assert_eq!(life.handle_end(), SoakEnd::ClosedDuringHandshake);
        // Random bytes after the settings: an error or nothing, never a panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2_000 {
            let mut life = two_streams();
            let mut input = open.clone();
            for _ in 0..(x % 200) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                input.push(x as u8);
            }
            let _ = feed(&mut life, &input, &mut Vec::new());
        }
    }
}
