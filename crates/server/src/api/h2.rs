//! HTTP/2 on the API listener: a blocking adapter, [`H2Serial`], that makes one HTTP/2
//! connection read and write like an HTTP/1.1 keep-alive connection, so the API's request loop
//! serves it unchanged.
//!
//! The connection's requests are served one at a time, in the order their streams opened:
//! publishing backends send few requests, each answered in microseconds, and one thread per
//! connection is the API's model. Streams opened meanwhile wait their turn, at most
//! [`MAX_STREAMS`] at once. Reading yields the current request's HTTP/1.1 head (without
//! `connection: close`), then its body: as it came when the request has a `content-length`,
//! else as chunks ending at END_STREAM. Writing frames the HTTP/1.1 answer into the current
//! stream within the flow-control windows, reading frames while they are closed. An answer
//! delimited by closing (the dashboard's live feed) would hold the streams behind it for ever:
//! they are refused (`REFUSED_STREAM`, safe to retry) and a GOAWAY sends the client's next
//! requests to a new connection.
//!
//! What it owns: the socket's bytes while the connection is HTTP/2. What it must not touch:
//! routing and answers, which stay in the request loop; the protocol itself, which is
//! [`clarion_proto::h2::server`].

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use clarion_proto::h2::frame::{ErrorCode, PREFACE};
use clarion_proto::h2::response::Ended;
use clarion_proto::h2::server::{Connection, Event, Fatal, Settings};

use crate::config::limits::{API_IDLE, API_REQUEST_DEADLINE};
use crate::dashboard::FeedStream;

/// `SETTINGS_MAX_CONCURRENT_STREAMS` on the API: the streams are served one at a time, so
/// more would only wait; a backend that publishes in parallel opens connections.
pub(super) const MAX_STREAMS: u32 = 16;
/// What the requests waiting their turn may hold together beyond one body of
/// `max_publish_size`: their heads and small bodies. A stream that would pass it is refused
/// (`REFUSED_STREAM`, safe to retry), since the protocol layer opens the windows as it reads.
const QUEUE_SLACK: usize = 64 * 1024;
/// Bytes read from the socket at once (the API threads have small stacks).
const READ_CHUNK: usize = 8 * 1024;
/// How often the flood budgets (SETTINGS, PING, resets) start again.
const TICK: Duration = Duration::from_secs(1);
/// Longest drain of a connection ended by a protocol error, so that its GOAWAY is read
/// rather than lost to a reset.
const LINGER: Duration = Duration::from_millis(500);
/// The interim answer the request loop writes for `Expect: 100-continue`; an HTTP/2 client
/// sends its body without waiting for it (RFC 9113 §8.1), so it is dropped.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// What a clear-text connection's first bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sniffed {
    /// Not the HTTP/2 preface: HTTP/1.1 (or nothing, or too late), for the request loop.
    Http1,
    /// The HTTP/2 preface.
    Http2,
    /// `PRI ` and then not the preface: no HTTP/1.1 method of ours, a broken preface. The
    /// connection is closed without an answer, as RFC 9113 §3.4 allows.
    Broken,
}

/// Reads the first bytes of a clear-text connection (after `first`, what was read already)
/// as long as they may be the HTTP/2 preface. An HTTP/1.1 request differs by its second
/// byte at the latest, so it costs one read at most, and its bytes stay in `first`.
pub(super) fn sniff(stream: &mut TcpStream, first: &mut Vec<u8>) -> io::Result<Sniffed> {
    let mut until = None;
    let mut chunk = [0u8; PREFACE.len()];
    while first.len() < PREFACE.len() && PREFACE.starts_with(first) {
        if !first.is_empty() && until.is_none() {
            until = Some(Instant::now() + API_REQUEST_DEADLINE);
        }
        let wait = match until {
            Some(u) => match u.saturating_duration_since(Instant::now()) {
                d if d.is_zero() => return Ok(Sniffed::Http1),
                d => d,
            },
            None => API_IDLE,
        };
        stream.set_read_timeout(Some(wait))?;
        let want = PREFACE.len() - first.len();
        let n = match stream.read(chunk.get_mut(..want).unwrap_or_default()) {
            Ok(0) => return Ok(Sniffed::Http1),
            Ok(n) => n,
            // Late or gone: the request loop answers what arrived (a 408) or ends.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(Sniffed::Http1)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        first.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    stream.set_read_timeout(Some(API_IDLE))?;
    Ok(if first.as_slice() == PREFACE {
        Sniffed::Http2
    } else if first.starts_with(b"PRI ") {
        Sniffed::Broken
    } else {
        Sniffed::Http1
    })
}

/// Completes a TLS handshake; whether the client chose HTTP/2 (ALPN `h2`).
pub(super) fn negotiated(
    s: &mut rustls::StreamOwned<rustls::ServerConnection, TcpStream>,
) -> io::Result<bool> {
    while s.conn.is_handshaking() {
        if s.conn.complete_io(&mut s.sock)? == (0, 0) {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(s.conn.alpn_protocol() == Some(b"h2"))
}

/// One request of the connection, as the request loop reads it.
struct Exchange {
    stream: u32,
    /// Its HTTP/1.1 bytes not read yet: the head, then the body.
    bytes: Vec<u8>,
    /// Of `bytes`, those read already.
    read: usize,
    /// The body is passed on as chunks (it has no `content-length`).
    chunked: bool,
    /// Body bytes received, counted past those kept.
    body: usize,
    /// The stream is gone (the client reset it, or it broke a rule of the protocol).
    reset: bool,
    /// The client has sent all of its request (END_STREAM).
    sent_all: bool,
}

impl Exchange {
    fn held(&self) -> usize {
        self.bytes.len() - self.read
    }

    fn take(&mut self, buf: &mut [u8]) -> usize {
        let rest = self.bytes.get(self.read..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        if let (Some(to), Some(from)) = (buf.get_mut(..n), rest.get(..n)) {
            to.copy_from_slice(from);
        }
        self.read += n;
        if self.read == self.bytes.len() {
            self.bytes = Vec::new();
            self.read = 0;
        }
        n
    }
}

/// An HTTP/2 connection read and written as an HTTP/1.1 keep-alive connection (see the
/// module's documentation).
pub(super) struct H2Serial<'a, S: FeedStream> {
    inner: &'a mut S,
    conn: Connection,
    /// Bytes from the socket the connection has not taken yet (an incomplete frame).
    input: Vec<u8>,
    /// Frames not written to the socket yet.
    out: Vec<u8>,
    /// The request being served.
    current: Option<Exchange>,
    /// Requests waiting their turn, in the order their streams opened.
    queue: VecDeque<Exchange>,
    /// Bytes `queue` holds.
    queued: usize,
    /// Body bytes a request keeps: one past `max_publish_size`, which is answered `413`.
    max_body: usize,
    last_tick: Instant,
    /// The socket is finished with: end of stream, an error, or a protocol error's GOAWAY.
    closed: bool,
    /// The protocol error that ended the connection.
    fatal: Option<Fatal>,
    /// An answer lasting until the end holds the connection; no other stream is served.
    held: bool,
    /// Streams answered before the client had sent all of its request (a `401` or `413`
    /// before the body), with the bytes dropped since: the rest is read and dropped, up to a
    /// body's worth, rather than refused with RST_STREAM at once, which some clients (curl)
    /// take for a failed request even after a whole answer.
    draining: Vec<(u32, usize)>,
    /// When the header block in progress began: a request's header block, like an HTTP/1.1
    /// head, must arrive within [`API_REQUEST_DEADLINE`] (a client trickling CONTINUATION
    /// bytes holds the connection's thread meanwhile).
    block_since: Option<Instant>,
    /// Streams reset or refused for the client's error, for `clarion_h2_stream_errors_total`.
    stream_errors: u32,
}

impl<'a, S: FeedStream> H2Serial<'a, S> {
    /// Starts the connection on `inner` (its SETTINGS sent); `first`: bytes read from it
    /// already (the preface, when it was sniffed).
    pub(super) fn new(
        inner: &'a mut S,
        max_head: usize,
        max_body: usize,
        first: Vec<u8>,
    ) -> io::Result<H2Serial<'a, S>> {
        let conn = Connection::new(Settings {
            max_streams: MAX_STREAMS,
            max_header_list: u32::try_from(max_head).unwrap_or(u32::MAX),
            connect_protocol: false,
            keep_alive_heads: true,
            ..Settings::default()
        });
        let mut h = H2Serial {
            inner,
            conn,
            input: first,
            out: Vec::with_capacity(64),
            current: None,
            queue: VecDeque::new(),
            queued: 0,
            max_body: max_body.saturating_add(1),
            last_tick: Instant::now(),
            closed: false,
            fatal: None,
            held: false,
            draining: Vec::new(),
            block_since: None,
            stream_errors: 0,
        };
        h.conn.start(&mut h.out);
        if !h.input.is_empty() {
            h.take_frames();
        }
        h.send()?;
        Ok(h)
    }

    /// Streams reset or refused for the client's error so far.
    pub(super) fn stream_errors(&self) -> u32 {
        self.stream_errors
    }

    /// The protocol error that ended the connection, if one did.
    pub(super) fn fatal(&self) -> Option<Fatal> {
        self.fatal
    }

    /// Whether another request may still come: the socket is open, and no GOAWAY was sent
    /// with nothing left to serve.
    pub(super) fn may_continue(&self) -> bool {
        let spent = self.conn.going_away() && self.queue.is_empty();
        !self.closed && !spent
    }

    /// The request loop is done with the current request: its answer ends here (END_STREAM
    /// for one delimited by closing, a reset for one cut short) and what the client still
    /// sends on it is not wanted. `None` if there was none; else whether it had been reset.
    pub(super) fn finish_current(&mut self) -> Option<bool> {
        let x = self.current.take()?;
        let until = Instant::now() + API_IDLE;
        if !x.reset {
            while !self.closed && self.conn.end(x.stream, &mut self.out) == Ended::Later {
                // A chunked answer's last bytes wait for window.
                self.conn.respond(x.stream, &[], &mut self.out);
                if self.receive(Some(until)).is_err() {
                    break;
                }
            }
        }
        if self.conn.answered(x.stream) {
            self.let_go(&x);
        } else {
            self.conn.cancel(x.stream, ErrorCode::Cancel, &mut self.out);
        }
        let _ = self.send();
        Some(x.reset)
    }

    /// Ends the connection: the streams still waiting are refused, a GOAWAY names the last
    /// stream taken, and after a protocol error the socket is drained briefly so the client
    /// reads the GOAWAY.
    pub(super) fn close(mut self) {
        for x in std::mem::take(&mut self.queue) {
            self.conn
                .cancel(x.stream, ErrorCode::RefusedStream, &mut self.out);
        }
        self.conn.go_away(ErrorCode::NoError, &mut self.out);
        let _ = self.send();
        if self.fatal.is_some() {
            let socket = self.inner.socket();
            let _ = socket.shutdown(std::net::Shutdown::Write);
            let until = Instant::now() + LINGER;
            let mut sink = [0u8; 1024];
            loop {
                let left = until.saturating_duration_since(Instant::now());
                let mut s = socket;
                if left.is_zero()
                    || s.set_read_timeout(Some(left)).is_err()
                    || !matches!(s.read(&mut sink), Ok(n) if n > 0)
                {
                    break;
                }
            }
        }
    }

    /// Makes the next waiting request current once the current one is answered.
    fn next_exchange(&mut self) {
        if let Some(x) = &self.current {
            if x.reset || !self.conn.answered(x.stream) {
                return;
            }
            if let Some(x) = self.current.take() {
                self.let_go(&x);
            }
        }
        if let Some(x) = self.queue.pop_front() {
            self.queued -= x.held();
            self.current = Some(x);
        }
    }

    /// An answered exchange: the rest of its request, if the client is still sending it, is
    /// not wanted (RFC 9113 §8.1); it is dropped as it comes.
    fn let_go(&mut self, x: &Exchange) {
        if !x.reset && !x.sent_all {
            self.draining.push((x.stream, 0));
        }
    }

    /// Writes what is framed.
    fn send(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let res = self
            .inner
            .write_all(&self.out)
            .and_then(|()| self.inner.flush());
        self.out.clear();
        if res.is_err() {
            self.closed = true;
        }
        res
    }

    /// Reads the socket once (until `until` at the latest: then `WouldBlock`) and takes the
    /// frames that arrived.
    fn receive(&mut self, until: Option<Instant>) -> io::Result<()> {
        self.send()?;
        let wait = match until {
            Some(u) => match u.saturating_duration_since(Instant::now()) {
                d if d.is_zero() => return Err(io::ErrorKind::WouldBlock.into()),
                d => Some(d),
            },
            None => None,
        };
        let before = self.inner.socket().read_timeout()?;
        if wait != before {
            self.inner.socket().set_read_timeout(wait)?;
        }
        let mut chunk = [0u8; READ_CHUNK];
        let res = self.inner.read(&mut chunk);
        if wait != before {
            self.inner.socket().set_read_timeout(before)?;
        }
        match res {
            Ok(0) => {
                self.closed = true;
                Ok(())
            }
            Ok(n) => {
                self.input
                    .extend_from_slice(chunk.get(..n).unwrap_or_default());
                self.take_frames();
                self.send()
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(e)
            }
            Err(e) => {
                self.closed = true;
                Err(e)
            }
        }
    }

    /// Gives the connection what the socket brought, and the requests' events to their
    /// exchanges.
    fn take_frames(&mut self) {
        if self.last_tick.elapsed() >= TICK {
            self.conn.tick();
            self.last_tick = Instant::now();
        }
        let mut input = std::mem::take(&mut self.input);
        let mut events = Vec::new();
        let res = self.conn.receive(&input, &mut self.out, &mut events);
        self.stream_errors = self
            .stream_errors
            .saturating_add(self.conn.take_stream_errors());
        for ev in events {
            self.on_event(ev);
        }
        match res {
            Ok(used) => {
                input.drain(..used.min(input.len()));
                self.input = input;
            }
            Err(fatal) => {
                self.fatal = Some(fatal);
                self.closed = true;
            }
        }
        self.block_since = match self.block_since {
            _ if !self.conn.pending_header_block() => None,
            Some(t) => Some(t),
            None => Some(Instant::now()),
        };
    }

    /// The end of the wait for the header block in progress, if one is.
    fn block_deadline(&self) -> Option<Instant> {
        self.block_since.map(|t| t + API_REQUEST_DEADLINE)
    }

    /// Ends the connection if its header block is past [`API_REQUEST_DEADLINE`]: GOAWAY
    /// `PROTOCOL_ERROR`, counted as a protocol error. Whether it did.
    fn block_late(&mut self) -> bool {
        if self.closed || self.block_deadline().is_none_or(|d| Instant::now() < d) {
            return false;
        }
        self.fatal = Some(self.conn.header_block_late(&mut self.out));
        self.closed = true;
        let _ = self.send();
        true
    }

    fn on_event(&mut self, ev: Event<'_>) {
        match ev {
            Event::Request {
                stream,
                request,
                end_stream,
            } => {
                let chunked = !end_stream && request.content_length.is_none();
                let mut bytes = request.head;
                if chunked {
                    // Before the empty line that ends the head.
                    bytes.truncate(bytes.len().saturating_sub(2));
                    bytes.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                }
                let x = Exchange {
                    stream,
                    bytes,
                    read: 0,
                    chunked,
                    body: 0,
                    reset: false,
                    sent_all: end_stream,
                };
                self.queued += x.held();
                self.queue.push_back(x);
                self.queue_check(stream);
            }
            Event::Data {
                stream,
                data,
                end_stream,
                ..
            } => self.on_data(stream, data, end_stream),
            Event::Reset { stream, .. } => {
                self.draining.retain(|d| d.0 != stream);
                if let Some(x) = self.current.as_mut().filter(|x| x.stream == stream) {
                    x.reset = true;
                    x.bytes = Vec::new();
                    x.read = 0;
                } else if let Some(i) = self.queue.iter().position(|x| x.stream == stream) {
                    if let Some(x) = self.queue.remove(i) {
                        self.queued -= x.held();
                    }
                }
            }
        }
    }

    fn on_data(&mut self, stream: u32, data: &[u8], end_stream: bool) {
        let queued = self.queue.iter().position(|x| x.stream == stream);
        let x = match (self.current.as_mut(), queued) {
            (Some(x), _) if x.stream == stream => x,
            (_, Some(i)) => match self.queue.get_mut(i) {
                Some(x) => x,
                None => return,
            },
            // A stream already answered: its bytes are not wanted.
            _ => return self.drain(stream, data.len(), end_stream),
        };
        x.sent_all |= end_stream;
        let before = x.held();
        let keep = self.max_body.saturating_sub(x.body).min(data.len());
        x.body = x.body.saturating_add(data.len());
        let kept = data.get(..keep).unwrap_or_default();
        if x.chunked {
            // An empty chunk would end the body: leave empty DATA out.
            if !kept.is_empty() {
                x.bytes
                    .extend_from_slice(format!("{:x}\r\n", kept.len()).as_bytes());
                x.bytes.extend_from_slice(kept);
                x.bytes.extend_from_slice(b"\r\n");
            }
            if end_stream {
                x.bytes.extend_from_slice(b"0\r\n\r\n");
            }
        } else {
            x.bytes.extend_from_slice(kept);
        }
        if queued.is_some() {
            self.queued += x.held() - before;
            self.queue_check(stream);
        }
    }

    /// Drops bytes of an answered stream; past a body's worth, asks the client to stop
    /// (RST_STREAM `NO_ERROR`).
    fn drain(&mut self, stream: u32, len: usize, end_stream: bool) {
        let Some(i) = self.draining.iter().position(|d| d.0 == stream) else {
            return;
        };
        let total = self.draining.get(i).map_or(0, |d| d.1).saturating_add(len);
        if end_stream || total > self.max_body {
            self.draining.swap_remove(i);
            if !end_stream {
                self.conn.cancel(stream, ErrorCode::NoError, &mut self.out);
            }
        } else if let Some(d) = self.draining.get_mut(i) {
            d.1 = total;
        }
    }

    /// Refuses `stream`, waiting in the queue, if the queue holds more than it may.
    fn queue_check(&mut self, stream: u32) {
        if self.queued <= self.max_body.saturating_add(QUEUE_SLACK) {
            return;
        }
        if let Some(i) = self.queue.iter().position(|x| x.stream == stream) {
            if let Some(x) = self.queue.remove(i) {
                self.queued -= x.held();
            }
            self.conn
                .cancel(stream, ErrorCode::RefusedStream, &mut self.out);
        }
    }

    /// The current answer lasts until the end (the dashboard's feed): the streams waiting
    /// would wait for ever, so they are refused and a GOAWAY takes the client's next requests
    /// to a new connection.
    fn hold(&mut self) {
        self.held = true;
        for x in std::mem::take(&mut self.queue) {
            self.conn
                .cancel(x.stream, ErrorCode::RefusedStream, &mut self.out);
        }
        self.queued = 0;
        self.conn.go_away(ErrorCode::NoError, &mut self.out);
    }
}

impl<S: FeedStream> Read for H2Serial<'_, S> {
    /// The current request's bytes; once they are all read, waits (reading frames, within
    /// the socket's read timeout) for the next request, which comes once the current one is
    /// answered. `Ok(0)`: the current stream was reset, or the connection ended.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let until = self
            .inner
            .socket()
            .read_timeout()?
            .map(|t| Instant::now() + t);
        loop {
            self.next_exchange();
            if let Some(x) = &mut self.current {
                if x.reset {
                    return Ok(0);
                }
                if x.held() > 0 {
                    return Ok(x.take(buf));
                }
            }
            if self.closed {
                return Ok(0);
            }
            let wait = match (until, self.block_deadline()) {
                (Some(u), Some(b)) => Some(u.min(b)),
                (u, b) => u.or(b),
            };
            match self.receive(wait) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.block_late() => {
                    return Ok(0)
                }
                res => res?,
            }
            if self.conn.take_windows_opened() {
                if let Some(x) = &self.current {
                    // A chunked answer's bytes may wait for window.
                    self.conn.respond(x.stream, &[], &mut self.out);
                }
            }
        }
    }
}

impl<S: FeedStream> Write for H2Serial<'_, S> {
    /// Frames the next bytes of the current answer; while the windows are closed, reads
    /// frames until they open (within the socket's write timeout).
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.closed {
            return Err(io::ErrorKind::ConnectionAborted.into());
        }
        let Some(stream) = self.current.as_ref().filter(|x| !x.reset).map(|x| x.stream) else {
            // No request to answer (its stream is gone): nobody reads these bytes.
            return Ok(data.len());
        };
        if data == CONTINUE {
            return Ok(data.len());
        }
        let limit = self.inner.socket().write_timeout()?.unwrap_or(API_IDLE);
        let until = Instant::now() + limit;
        loop {
            let n = self.conn.respond(stream, data, &mut self.out);
            if !self.held && self.conn.answer_until_end(stream) {
                self.hold();
            }
            if n > 0 || data.is_empty() {
                self.send()?;
                return Ok(n);
            }
            // The windows are closed: wait for the client to open them.
            while !self.conn.take_windows_opened() {
                match self.receive(Some(until)) {
                    Ok(()) if self.closed => return Err(io::ErrorKind::ConnectionAborted.into()),
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Err(io::ErrorKind::TimedOut.into())
                    }
                    Err(e) => return Err(e),
                }
                if self.current.as_ref().is_none_or(|x| x.reset) {
                    return Ok(data.len());
                }
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

impl<S: FeedStream> FeedStream for H2Serial<'_, S> {
    fn socket(&self) -> &TcpStream {
        self.inner.socket()
    }
}
