//! A server connection as bytes, so that another process continues it where this one stopped
//! (the hand-over of `clarion serve --upgrade-from`): the client never learns that its
//! connection is now served by someone else.
//!
//! Everything the connection's next frame can depend on is carried: both sides' settings, the
//! preface and settings seen, the HPACK decoder's dynamic table with its limits (the encoder
//! keeps no table: only whether its first block, which empties the client's, was written),
//! a header block partly received, the connection windows, the last stream id and the streams
//! recently closed, the flood budgets of the current second (and the stream errors the
//! caller has not counted yet), and every stream with its
//! windows, its ends, its request's remaining `content-length` and where its answer stands (a
//! head partly written, the body bytes left, a chunked answer's decoder and the bytes it
//! decoded that wait for window). Each stream's handle ([`Connection::bind`]) is carried as
//! it was: the caller maps it to its own with [`Connection::rebind`].
//!
//! ```text
//! VERSION (u8 = 1)
//! SETTINGS  MAX_STREAMS | INITIAL_WINDOW | MAX_HEADER_LIST | HEADER_TABLE (u32 LE each)
//!           | CONNECT_PROTOCOL | KEEP_ALIVE_HEADS (flags, u8 0 or 1)
//! FLAGS     GOT_PREFACE | GOT_SETTINGS | GOING_AWAY | WINDOWS_OPENED | ENCODER_STARTED
//! PEER      INITIAL_WINDOW (u32) | MAX_FRAME (u32)
//! WINDOWS   SEND (i64 LE) | RECEIVE (i64 LE)
//! HPACK     MAX (u32) | ADVERTISED (u32) | N (u32) | N x (NAME (bytes32) | VALUE (bytes32))
//! BLOCK     0, or 1 | STREAM (u32) | END_STREAM (flag) | FRAMES (u32) | BYTES (bytes32)
//! LAST      LAST_STREAM (u32) | CLOSED (16 x u32) | CLOSED_AT (u32, < 16)
//! FLOOD     SETTINGS | PINGS | EMPTY | RESETS | STREAM_ERRORS not yet counted (u32 each)
//! STREAMS   N (u32) | N x STREAM
//! STREAM    ID | USER (u32) | SEND_WINDOW | RECV_WINDOW (i32 LE) | REMOTE_CLOSED
//!           | LOCAL_CLOSED | WEBSOCKET | HEAD_ONLY (flags) | EXPECT (u64) | OUT
//! OUT       0 head | 1 PARTIAL (bytes32) | 2 LEFT (u64) | 3 DECODER (35) COMPLETE (flag)
//!           PENDING (bytes32) | 4 until end | 5 done
//! ```
//!
//! [`Connection::restore`] checks every field against what a live connection could hold (ids
//! odd, unique and not above the last one; windows within 2^31-1; the dynamic table within
//! its limits; a frame size in range; no more streams than allowed; one encoding per state)
//! and never panics, so the bytes of another process are not trusted further than a client's.

use super::{Block, Closed, Connection, Flood, Passing, RECENTLY_CLOSED};
use crate::h2::frame::{DEFAULT_MAX_FRAME, MAX_WINDOW};
use crate::h2::hpack::{Decoder, Encoder, Entry, DEFAULT_TABLE_SIZE};
use crate::h2::stream::{Chunked, Out, Stream, Streams};
use crate::handover_cursor::{Error, Reader};
use crate::http1::ChunkedDecoder;

/// The layout's version (the first byte).
const VERSION: u8 = 1;
/// The longest partial response head carried (the response side takes heads up to this).
const MAX_PARTIAL_HEAD: usize = 16 * 1024;
/// What errors name.
const WHAT: &str = "h2 connection";

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

impl Connection {
    /// Appends this connection's state to `out` (see the module doc for the layout).
    pub fn park(&self, out: &mut Vec<u8>) {
        let Connection {
            settings,
            got_preface,
            got_settings,
            peer_initial_window,
            peer_max_frame,
            send_window,
            recv_window,
            decoder,
            encoder,
            passing,
            streams,
            last_stream,
            closed,
            going_away,
            windows_opened,
        } = self;
        let none = Passing::default();
        let Passing {
            block,
            flood,
            stream_errors,
        } = passing.as_deref().unwrap_or(&none);
        out.push(VERSION);
        let super::Settings {
            max_streams,
            initial_window,
            max_header_list,
            header_table,
            connect_protocol,
            keep_alive_heads,
        } = *settings;
        for v in [max_streams, initial_window, max_header_list, header_table] {
            put_u32(out, v);
        }
        out.push(u8::from(connect_protocol));
        out.push(u8::from(keep_alive_heads));
        for f in [
            *got_preface,
            *got_settings,
            *going_away,
            *windows_opened,
            encoder.started(),
        ] {
            out.push(u8::from(f));
        }
        put_u32(out, *peer_initial_window as u32);
        put_u32(out, *peer_max_frame);
        // Written as 64 bits, as when the windows were kept in 64 (the layout is unchanged).
        out.extend_from_slice(&i64::from(*send_window).to_le_bytes());
        out.extend_from_slice(&i64::from(*recv_window).to_le_bytes());
        let (max, limit, entries) = decoder.parts();
        put_u32(out, max);
        put_u32(out, limit);
        let count_at = out.len();
        put_u32(out, 0);
        let mut n = 0u32;
        for (name, value) in entries {
            put_bytes(out, name);
            put_bytes(out, value);
            n += 1;
        }
        if let Some(slot) = out.get_mut(count_at..count_at + 4) {
            slot.copy_from_slice(&n.to_le_bytes());
        }
        match block {
            None => out.push(0),
            Some(Block {
                stream,
                bytes,
                end_stream,
                frames,
            }) => {
                out.push(1);
                put_u32(out, *stream);
                out.push(u8::from(*end_stream));
                put_u32(out, *frames);
                put_bytes(out, bytes);
            }
        }
        put_u32(out, *last_stream);
        // None closed yet is written as an empty ring.
        let (ids, at) = closed
            .as_deref()
            .map_or(([0; RECENTLY_CLOSED], 0), |c| (c.ids, c.at));
        for id in ids {
            put_u32(out, id);
        }
        put_u32(out, (at % RECENTLY_CLOSED) as u32);
        let Flood {
            settings,
            pings,
            empty,
            resets,
        } = flood;
        for v in [settings, pings, empty, resets, stream_errors] {
            put_u32(out, *v);
        }
        put_u32(out, streams.len() as u32);
        for s in streams.iter() {
            park_stream(s, out);
        }
    }

    /// The connection [`Connection::park`] wrote, checked field by field; the bytes must be
    /// exactly one parked connection.
    pub fn restore(bytes: &[u8]) -> Result<Connection, Error> {
        let mut r = Reader {
            buf: bytes,
            what: WHAT,
        };
        let bad = Error::Malformed(WHAT);
        if r.u8()? != VERSION {
            return Err(bad);
        }
        let settings = super::Settings {
            max_streams: r.u32()?,
            initial_window: r.u32()?,
            max_header_list: r.u32()?,
            header_table: r.u32()?,
            connect_protocol: r.flag()?,
            keep_alive_heads: r.flag()?,
        };
        if settings.initial_window > MAX_WINDOW {
            return Err(bad);
        }
        let got_preface = r.flag()?;
        let got_settings = r.flag()?;
        let going_away = r.flag()?;
        let windows_opened = r.flag()?;
        let encoder = Encoder::resumed(r.flag()?);
        let peer_initial_window = r.u32()?;
        let peer_max_frame = r.u32()?;
        if peer_initial_window > MAX_WINDOW
            || !(DEFAULT_MAX_FRAME..=(1 << 24) - 1).contains(&peer_max_frame)
        {
            return Err(bad);
        }
        let send_window = r.u64()? as i64;
        let recv_window = r.u64()? as i64;
        let window = -i64::from(MAX_WINDOW) - 1..=i64::from(MAX_WINDOW);
        if !window.contains(&send_window) || !(0..=i64::from(MAX_WINDOW)).contains(&recv_window) {
            return Err(bad);
        }
        let max = r.u32()?;
        // The size updates' limit: the advertised size once acknowledged, before that the
        // default if it is larger.
        let limit = r.u32()?;
        if limit != settings.header_table && limit != settings.header_table.max(DEFAULT_TABLE_SIZE)
        {
            return Err(bad);
        }
        let n = r.u32()? as usize;
        // Each entry takes at least 8 bytes: a count beyond that is a lie, not a size.
        let mut entries = Vec::with_capacity(n.min(r.buf.len() / 8));
        for _ in 0..n {
            let (name, value) = (r.bytes32()?, r.bytes32()?);
            entries.push(Entry::new(name, value));
        }
        let decoder = Decoder::from_parts(max, limit, entries).ok_or(bad.clone())?;
        let block = if r.flag()? {
            let stream = r.u32()?;
            let end_stream = r.flag()?;
            let frames = r.u32()?;
            let bytes = r.bytes32()?.to_vec();
            let limit = settings.max_header_list as usize * 2 + 1024;
            if stream == 0 || stream > MAX_WINDOW || bytes.len() > limit {
                return Err(bad);
            }
            Some(Block {
                stream,
                bytes,
                end_stream,
                frames,
            })
        } else {
            None
        };
        let last_stream = r.u32()?;
        let mut ids = [0u32; RECENTLY_CLOSED];
        for slot in &mut ids {
            *slot = r.u32()?;
        }
        let at = r.u32()? as usize;
        if last_stream > MAX_WINDOW || at >= RECENTLY_CLOSED {
            return Err(bad);
        }
        let closed = (ids != [0; RECENTLY_CLOSED] || at != 0).then(|| Box::new(Closed { ids, at }));
        let flood = Flood {
            settings: r.u32()?,
            pings: r.u32()?,
            empty: r.u32()?,
            resets: r.u32()?,
        };
        let stream_errors = r.u32()?;
        let n = r.u32()? as usize;
        if n > settings.max_streams as usize {
            return Err(bad);
        }
        let mut streams: Vec<Stream> = Vec::with_capacity(n.min(r.buf.len() / 32));
        for _ in 0..n {
            let s = restore_stream(&mut r)?;
            let fresh = streams.iter().all(|o| o.id != s.id);
            if s.id % 2 == 0 || s.id > last_stream || !fresh {
                return Err(bad);
            }
            streams.push(s);
        }
        if !r.buf.is_empty() {
            return Err(Error::Trailing(WHAT));
        }
        let passing = Passing {
            block,
            flood,
            stream_errors,
        };
        Ok(Connection {
            settings,
            got_preface,
            got_settings,
            peer_initial_window: peer_initial_window as i32,
            peer_max_frame,
            // Both within ±2^31, checked above.
            send_window: send_window as i32,
            recv_window: recv_window as i32,
            decoder,
            encoder,
            passing: (!passing.is_empty()).then(|| Box::new(passing)),
            streams: Streams::from(streams),
            last_stream,
            closed,
            going_away,
            windows_opened,
        })
    }

    /// The streams' handles, as carried: `(stream, handle)` for each stream bound in the
    /// process that parked the connection.
    pub fn carried_handles(&self) -> Vec<(u32, u32)> {
        self.bound().collect()
    }

    /// Gives each bound stream the handle `handle_of(stream)` of this process; a stream
    /// bound before whose handle did not come along (`None`) is reset (`CANCEL`) into `out`.
    /// Call once, right after [`Connection::restore`].
    pub fn rebind(&mut self, mut handle_of: impl FnMut(u32) -> Option<u32>, out: &mut Vec<u8>) {
        let mut orphans = Vec::new();
        for s in self.streams.iter_mut() {
            if s.user == super::NO_USER {
                continue;
            }
            match handle_of(s.id) {
                Some(h) => s.user = h,
                None => orphans.push(s.id),
            }
        }
        for id in orphans {
            self.cancel(id, super::ErrorCode::Cancel, out);
        }
    }
}

fn park_stream(s: &Stream, out: &mut Vec<u8>) {
    let Stream {
        id,
        user,
        send_window,
        recv_window,
        remote_closed,
        local_closed,
        websocket,
        head_only,
        expect,
        out: answer,
    } = s;
    put_u32(out, *id);
    put_u32(out, *user);
    put_u32(out, *send_window as u32);
    put_u32(out, *recv_window as u32);
    for f in [*remote_closed, *local_closed, *websocket, *head_only] {
        out.push(u8::from(f));
    }
    out.extend_from_slice(&expect.to_le_bytes());
    match answer {
        Out::Head => out.push(0),
        Out::PartialHead(p) => {
            out.push(1);
            put_bytes(out, p);
        }
        Out::Length(n) => {
            out.push(2);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Out::Chunked(c) => {
            let Chunked {
                decoder,
                pending,
                complete,
            } = &**c;
            out.push(3);
            decoder.park(out);
            out.push(u8::from(*complete));
            put_bytes(out, pending);
        }
        Out::Close => out.push(4),
        Out::Done => out.push(5),
    }
}

fn restore_stream(r: &mut Reader<'_>) -> Result<Stream, Error> {
    let bad = Error::Malformed(WHAT);
    let id = r.u32()?;
    let user = r.u32()?;
    let send_window = r.u32()? as i32;
    let recv_window = r.u32()? as i32;
    let remote_closed = r.flag()?;
    let local_closed = r.flag()?;
    let websocket = r.flag()?;
    let head_only = r.flag()?;
    let expect = r.u64()?;
    let answer = match r.u8()? {
        0 => Out::Head,
        1 => {
            let p = r.bytes32()?;
            if p.is_empty() || p.len() > MAX_PARTIAL_HEAD {
                return Err(bad);
            }
            Out::PartialHead(Box::new(p.to_vec()))
        }
        2 => Out::Length(r.u64()?),
        3 => {
            let decoder = ChunkedDecoder::restore(&r.array::<{ ChunkedDecoder::PARKED_LEN }>()?)
                .ok_or(bad)?;
            let complete = r.flag()?;
            let pending = r.bytes32()?.to_vec();
            Out::Chunked(Box::new(Chunked {
                decoder,
                pending,
                complete,
            }))
        }
        4 => Out::Close,
        5 => Out::Done,
        _ => return Err(bad),
    };
    Ok(Stream {
        id,
        user,
        send_window,
        recv_window,
        remote_closed,
        local_closed,
        websocket,
        head_only,
        expect,
        out: answer,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use crate::h2::frame::{self, ErrorCode, Setting, PREFACE};
    use crate::h2::server::{Event, Settings};

    /// A literal field with incremental indexing (RFC 7541 §6.2.1), names and values under
    /// 127 bytes, not Huffman-coded: it enters the server's dynamic table.
    fn indexed(block: &mut Vec<u8>, name: &str, value: &str) {
        block.push(0x40);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }

    /// A request block that fills the dynamic table as browsers' encoders do.
    fn get_block(path: &str) -> Vec<u8> {
        let mut b = vec![0x82, 0x86]; // :method GET, :scheme http
        indexed(&mut b, ":authority", "localhost");
        indexed(&mut b, ":path", path);
        indexed(&mut b, "user-agent", "a-browser/1.0");
        b
    }

    fn headers(out: &mut Vec<u8>, stream: u32, block: &[u8], flags: u8) {
        frame::write_header(out, block.len(), 0x1, flags, stream);
        out.extend_from_slice(block);
    }

    /// Feeds `input` whole; the frames written and the events, as text.
    fn run(c: &mut Connection, input: &[u8]) -> (Vec<u8>, Vec<String>) {
        let (mut out, mut events) = (Vec::new(), Vec::new());
        let used = c.receive(input, &mut out, &mut events).unwrap();
        assert_eq!(used, input.len());
        let text = events
            .iter()
            .map(|e| match e {
                Event::Request {
                    stream,
                    request,
                    end_stream,
                } => format!(
                    "request {stream} {end_stream} {}",
                    String::from_utf8_lossy(&request.head)
                ),
                other => format!("{other:?}"),
            })
            .collect();
        (out, text)
    }

    /// A connection in the middle of a conversation: an SSE-like stream answered past its
    /// window, a request body half received, a header block cut between two frames, budgets
    /// spent, the dynamic table holding the client's fields.
    fn mid_conversation() -> Connection {
        let mut c = Connection::new(Settings::default());
        let mut input = PREFACE.to_vec();
        frame::write_settings(&mut input, &[Setting::InitialWindowSize(100)]);
        headers(&mut input, 1, &get_block("/sse?topic=t"), 0x5);
        let mut post = vec![0x83, 0x86]; // :method POST
        indexed(&mut post, ":authority", "localhost");
        indexed(&mut post, ":path", "/publish/t");
        indexed(&mut post, "content-length", "10");
        headers(&mut input, 3, &post, 0x4);
        frame::write_data(&mut input, 3, b"hello", false);
        frame::write_ping(&mut input, *b"12345678", false);
        let block = get_block("/poll?topic=t");
        headers(&mut input, 5, &block[..7], 0x1); // END_STREAM, no END_HEADERS
        let (_, events) = run(&mut c, &input);
        assert_eq!(events.len(), 3, "{events:?}"); // two requests and the body bytes
        c.bind(1, 41);
        c.bind(3, 43);
        let mut out = Vec::new();
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n";
        assert_eq!(c.respond(1, head, &mut out), head.len());
        let body = [b'x'; 150];
        assert_eq!(
            c.respond(1, &body, &mut out),
            100,
            "the stream window stops it"
        );
        c
    }

    /// What the client sends next: the rest of the cut block, a request that uses the
    /// dynamic table (indices 62.. name what the first requests added), the rest of the
    /// body, more window, a PING.
    fn continuation() -> Vec<u8> {
        let block = get_block("/poll?topic=t");
        let mut input = Vec::new();
        frame::write_header(&mut input, block.len() - 7, 0x9, 0x4, 5);
        input.extend_from_slice(&block[7..]);
        // :method GET, :scheme http, then from the dynamic table as the poll request left it
        // (62 is the newest): :authority (64), :path (63), user-agent (62).
        headers(&mut input, 7, &[0x82, 0x86, 0xc0, 0xbf, 0xbe], 0x5);
        frame::write_data(&mut input, 3, b"world", true);
        frame::write_window_update(&mut input, 1, 1000);
        frame::write_ping(&mut input, *b"abcdefgh", false);
        input
    }

    fn parked(c: &Connection) -> Vec<u8> {
        let mut b = Vec::new();
        c.park(&mut b);
        b
    }

    #[test]
    fn a_parked_connection_continues_exactly_as_one_never_parked() {
        let mut twin = mid_conversation();
        let mut moved = Connection::restore(&parked(&mid_conversation())).unwrap();
        assert_eq!(parked(&moved), parked(&twin));
        let input = continuation();
        let (a, ea) = run(&mut twin, &input);
        let (b, eb) = run(&mut moved, &input);
        assert_eq!(ea, eb);
        assert_eq!(a, b);
        // The request on stream 7 decoded through the carried dynamic table.
        assert!(
            eb.iter()
                .any(|e| e.starts_with("request 7 true GET /poll?topic=t ")
                    && e.contains("user-agent: a-browser/1.0")),
            "{eb:?}"
        );
        assert!(eb.iter().any(|e| e.starts_with("request 5 ")), "{eb:?}");
        // The answer goes on where it stopped: the windows were carried.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let body = [b'y'; 300];
        assert_eq!(twin.respond(1, &body[50..], &mut a), 250);
        assert_eq!(moved.respond(1, &body[50..], &mut b), 250);
        assert_eq!(a, b);
        assert_eq!(parked(&moved), parked(&twin));
    }

    #[test]
    fn a_chunked_answer_waiting_for_window_continues_after_the_move() {
        let build = || {
            let mut c = Connection::new(Settings::default());
            let mut input = PREFACE.to_vec();
            frame::write_settings(&mut input, &[Setting::InitialWindowSize(10)]);
            headers(&mut input, 1, &get_block("/stream?topic=t"), 0x5);
            run(&mut c, &input);
            c.bind(1, 9);
            let mut out = Vec::new();
            let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n14\r\n0123456789abcdefghij\r\n5\r\n";
            c.respond(1, answer, &mut out);
            c
        };
        let mut twin = build();
        let mut moved = Connection::restore(&parked(&build())).unwrap();
        assert_eq!(parked(&moved), parked(&twin));
        let mut grant = Vec::new();
        frame::write_window_update(&mut grant, 1, 100);
        assert_eq!(run(&mut twin, &grant), run(&mut moved, &grant));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let rest = b"ABCDE\r\n0\r\n\r\n";
        let used = (
            twin.respond(1, rest, &mut a),
            moved.respond(1, rest, &mut b),
        );
        assert_eq!(used.0, used.1);
        assert_eq!(
            twin.respond(1, &rest[used.0..], &mut a),
            moved.respond(1, &rest[used.1..], &mut b)
        );
        assert_eq!(a, b);
        // The decoded bytes that waited for window, then the rest, then END_STREAM.
        let text = String::from_utf8_lossy(&a);
        assert!(
            text.contains("abcdefghij") && text.contains("ABCDE"),
            "{text}"
        );
        assert_eq!(parked(&moved), parked(&twin));
    }

    #[test]
    fn parking_what_was_restored_gives_the_same_bytes() {
        let bytes = parked(&mid_conversation());
        let c = Connection::restore(&bytes).unwrap();
        assert_eq!(parked(&c), bytes);
        assert_eq!(c.carried_handles(), vec![(1, 41), (3, 43)]);
        let fresh = parked(&Connection::new(Settings::default()));
        assert_eq!(parked(&Connection::restore(&fresh).unwrap()), fresh);
    }

    #[test]
    fn every_cut_and_every_corruption_is_refused_or_decodes_without_panicking() {
        let bytes = parked(&mid_conversation());
        for cut in 0..bytes.len() {
            assert!(Connection::restore(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            Connection::restore(&long).err(),
            Some(Error::Trailing(WHAT))
        );
        for i in 0..bytes.len() {
            for v in [0u8, 1, 2, 0x7f, 0xff] {
                let mut b = bytes.clone();
                b[i] = v;
                if let Ok(c) = Connection::restore(&b) {
                    // What decodes is a state with one encoding.
                    assert_eq!(parked(&c), b);
                }
            }
        }
        let mut b = bytes.clone();
        b[0] = 2;
        assert!(Connection::restore(&b).is_err(), "another layout version");
    }

    #[test]
    fn handles_are_mapped_and_a_stream_whose_handle_stayed_behind_is_reset() {
        let mut c = Connection::restore(&parked(&mid_conversation())).unwrap();
        let mut out = Vec::new();
        c.rebind(|s| (s == 1).then_some(7), &mut out);
        assert_eq!(c.carried_handles(), vec![(1, 7)]);
        // RST_STREAM(CANCEL) on stream 3.
        let mut want = Vec::new();
        frame::write_rst_stream(&mut want, 3, ErrorCode::Cancel);
        assert_eq!(out, want);
    }
}
