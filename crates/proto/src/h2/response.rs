//! The way back: the bytes of an HTTP/1.1 answer, as the server's transports write them, made
//! into a stream's HEADERS and DATA frames.
//!
//! The head is parsed once and re-encoded (HPACK, without a dynamic table), dropping the
//! fields HTTP/2 forbids; a `101` to a WebSocket stream's upgrade becomes its `200` (RFC 8441).
//! The body is copied into DATA frames as far as both flow-control windows allow: a
//! `content-length` body ends the stream when it is complete, a chunked one is de-chunked, and
//! one delimited by closing (an event stream) ends when the layer above says so
//! ([`Connection::end`]).

use super::frame::{self, ErrorCode};
use super::server::Connection;
use super::stream::{Chunked, Out, NO_USER};
use crate::http1::{parse_response_head, ChunkedDecoder, ResponseBody};

/// Longest response head taken (ours are a few hundred bytes).
const MAX_HEAD: usize = 16 * 1024;
/// Most fields in a response head.
const MAX_FIELDS: usize = 64;

/// What [`Connection::end`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The stream is finished (END_STREAM, or a reset if the answer was cut short).
    Done,
    /// Decoded bytes still wait for window: call again once it opens.
    Later,
}

impl Connection {
    /// Frames as much of `data` (the next bytes of the HTTP/1.1 answer on `stream`) as the
    /// windows allow into `out`; returns the bytes of `data` used. Bytes past the end of the
    /// answer are used up and dropped; so is anything for a stream that is gone.
    pub fn respond(&mut self, stream: u32, data: &[u8], out: &mut Vec<u8>) -> usize {
        let Some(i) = self.index(stream) else {
            return data.len();
        };
        let mut used = 0;
        loop {
            let rest = data.get(used..).unwrap_or_default();
            // A stream finished by its head alone may have left the list (its slot now
            // holds another stream).
            let Some(s) = self.streams.get_mut(i).filter(|s| s.id == stream) else {
                return data.len();
            };
            if s.local_closed {
                return data.len();
            }
            match &mut s.out {
                Out::Head | Out::PartialHead(_) => {
                    if rest.is_empty() {
                        return used;
                    }
                    match self.head(i, rest, out) {
                        Some(n) => used += n,
                        None => return data.len(),
                    }
                }
                Out::Done => return data.len(),
                Out::Length(left) => {
                    let take = (*left).min(rest.len() as u64) as usize;
                    let last = take as u64 == *left;
                    let n = self.data(i, rest.get(..take).unwrap_or_default(), last, out);
                    used += n;
                    if last && n == take {
                        return data.len(); // Sent in full (the stream may be gone).
                    }
                    // The body goes on in a later call: count what went.
                    if let Some(Out::Length(left)) = self.streams.get_mut(i).map(|s| &mut s.out) {
                        *left -= n as u64;
                    }
                    if n < take {
                        return used;
                    }
                    return data.len();
                }
                Out::Close => {
                    used += self.data(i, rest, false, out);
                    return used;
                }
                Out::Chunked(c) => {
                    if c.pending.is_empty() && !c.complete && !rest.is_empty() {
                        let mut pending = std::mem::take(&mut c.pending);
                        match c.decoder.decode(rest, &mut pending) {
                            Ok((n, complete)) => {
                                used += n;
                                c.complete = complete;
                                c.pending = pending;
                            }
                            Err(_) => {
                                self.cancel(stream, ErrorCode::InternalError, out);
                                return data.len();
                            }
                        }
                    }
                    let (body, complete) = (std::mem::take(&mut c.pending), c.complete);
                    if body.is_empty() && !complete {
                        return used;
                    }
                    let sent = self.data(i, &body, complete, out);
                    if sent < body.len() {
                        self.keep_pending(i, body, sent);
                        return used;
                    }
                    if complete || used >= data.len() {
                        return if complete { data.len() } else { used };
                    }
                }
            }
        }
    }

    /// Frames `parts`, the next bytes of `stream`'s answer in order, as [`Self::respond`] on
    /// each in turn would, except that the parts of a body that runs until the stream ends (an
    /// event stream, an RFC 8441 WebSocket) share DATA frames up to the peer's frame size: a
    /// run of small messages costs one frame header, not one each. Returns how many parts were
    /// used whole, and how many bytes of the next one (the windows cut it there).
    pub fn respond_run<P: AsRef<[u8]>>(
        &mut self,
        stream: u32,
        parts: &[P],
        out: &mut Vec<u8>,
    ) -> (usize, usize) {
        let open_body = (parts.len() > 1)
            .then(|| self.index(stream))
            .flatten()
            .filter(|&i| {
                self.streams.get(i).is_some_and(|s| {
                    s.id == stream && !s.local_closed && matches!(s.out, Out::Close)
                })
            });
        let Some(i) = open_body else {
            for (n, part) in parts.iter().enumerate() {
                let used = self.respond(stream, part.as_ref(), out);
                if used < part.as_ref().len() {
                    return (n, used);
                }
            }
            return (parts.len(), 0);
        };
        let max_frame = (self.peer_max_frame as usize).max(1);
        let total: usize = parts.iter().map(|p| p.as_ref().len()).sum();
        let n = total.min(self.room(i));
        self.charge(i, n);
        // Frames of up to `max_frame` bytes, each gathered from as many parts as it spans.
        let (mut whole, mut at) = (0, 0);
        let mut left = n;
        while left > 0 {
            let len = left.min(max_frame);
            frame::write_header(out, len, 0x0, 0, stream);
            let mut need = len;
            while need > 0 {
                let Some(part) = parts.get(whole).map(AsRef::as_ref) else {
                    break;
                };
                let take = part.len().saturating_sub(at).min(need);
                out.extend_from_slice(part.get(at..at + take).unwrap_or_default());
                (at, need) = (at + take, need - take);
                if at == part.len() {
                    (whole, at) = (whole + 1, 0);
                }
            }
            left -= len;
        }
        // Empty parts after the last byte framed are used too.
        while at == 0 && parts.get(whole).is_some_and(|p| p.as_ref().is_empty()) {
            whole += 1;
        }
        (whole, at)
    }

    fn keep_pending(&mut self, i: usize, mut body: Vec<u8>, sent: usize) {
        if let Some(Out::Chunked(c)) = self.streams.get_mut(i).map(|s| &mut s.out) {
            body.drain(..sent.min(body.len()));
            c.pending = body;
        }
    }

    /// Parses the head (joined to a part kept from before) and writes it as HEADERS.
    /// Returns the bytes of `rest` used, or `None` if the stream was reset.
    fn head(&mut self, i: usize, rest: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        let s = self.streams.get_mut(i)?;
        let (id, websocket, head_only) = (s.id, s.websocket, s.head_only);
        let kept = match std::mem::take(&mut s.out) {
            Out::PartialHead(p) => *p,
            _ => Vec::new(),
        };
        let joined;
        let buf: &[u8] = if kept.is_empty() {
            rest
        } else {
            joined = [kept.as_slice(), rest].concat();
            &joined
        };
        let head = match parse_response_head(buf, MAX_FIELDS, MAX_HEAD) {
            Ok(Some(h)) => h,
            Ok(None) => {
                if let Some(s) = self.streams.get_mut(i) {
                    s.out = Out::PartialHead(Box::new(buf.to_vec()));
                }
                return Some(rest.len());
            }
            Err(_) => {
                self.cancel(id, ErrorCode::InternalError, out);
                return None;
            }
        };
        let upgraded = websocket && head.status == 101;
        let body = if upgraded {
            Ok(ResponseBody::UntilClose)
        } else {
            head.body(if head_only { "HEAD" } else { "GET" })
        };
        let Ok(body) = body else {
            self.cancel(id, ErrorCode::InternalError, out);
            return None;
        };
        let status = if upgraded { 200 } else { head.status };
        let status = status.to_string();
        let mut fields: Vec<(String, &str)> = vec![(":status".into(), status.as_str())];
        for (name, value) in &head.headers {
            let name = name.to_ascii_lowercase();
            let dropped = matches!(
                name.as_str(),
                "connection"
                    | "keep-alive"
                    | "proxy-connection"
                    | "transfer-encoding"
                    | "upgrade"
                    | "sec-websocket-accept"
            ) || (name == "content-length" && body == ResponseBody::Chunked);
            if dropped {
                continue;
            }
            if let Ok(v) = std::str::from_utf8(value) {
                fields.push((name, v));
            }
        }
        let end = matches!(body, ResponseBody::None | ResponseBody::Length(0));
        let mut block = Vec::with_capacity(128);
        self.encoder
            .encode(fields.iter().map(|(n, v)| (n.as_str(), *v)), &mut block);
        frame::write_headers(out, id, &block, end, self.peer_max_frame);
        let head_len = head.head_len;
        let s = self.streams.get_mut(i)?;
        s.out = match body {
            _ if end => Out::Done,
            ResponseBody::Length(n) => Out::Length(n),
            ResponseBody::Chunked => Out::Chunked(Box::new(Chunked {
                decoder: ChunkedDecoder::new(usize::MAX),
                pending: Vec::new(),
                complete: false,
            })),
            _ => Out::Close,
        };
        if end {
            s.local_closed = true;
            self.forget_if_done(id);
        }
        // Of `rest`, the head's bytes beyond what was kept before.
        Some(head_len.saturating_sub(kept.len()).min(rest.len()))
    }

    /// Sends what the windows allow of `body` as DATA frames (END_STREAM after the last byte
    /// when `last`); returns the bytes sent.
    fn data(&mut self, i: usize, body: &[u8], last: bool, out: &mut Vec<u8>) -> usize {
        let max_frame = self.peer_max_frame as usize;
        let Some(id) = self.streams.get(i).map(|s| s.id) else {
            return 0;
        };
        let n = body.len().min(self.room(i));
        let mut sent = 0;
        while sent < n || (n == 0 && sent == 0 && last && body.is_empty()) {
            let len = (n - sent).min(max_frame);
            let end = last && sent + len == body.len();
            frame::write_data(out, id, body.get(sent..sent + len).unwrap_or_default(), end);
            sent += len;
            if len == 0 {
                break;
            }
        }
        self.charge(i, n);
        if last && n == body.len() {
            if let Some(s) = self.streams.get_mut(i) {
                s.local_closed = true;
                s.out = Out::Done;
            }
            self.forget_if_done(id);
        }
        n
    }

    /// The bytes stream `i` may send now: the smaller of its window and the connection's.
    fn room(&self, i: usize) -> usize {
        let stream = self.streams.get(i).map_or(0, |s| s.send_window.max(0));
        self.send_window.max(0).min(stream) as usize
    }

    /// Charges `n` bytes sent on stream `i` to both windows (`n` within [`Self::room`]).
    fn charge(&mut self, i: usize, n: usize) {
        if let Some(s) = self.streams.get_mut(i) {
            s.send_window -= n as i32;
        }
        self.send_window -= n as i32;
    }

    /// The layer above has written all of `stream`'s answer and lets go of it: an answer
    /// delimited by closing ends here (END_STREAM), one cut short is reset.
    pub fn end(&mut self, stream: u32, out: &mut Vec<u8>) -> Ended {
        let Some(s) = self.find(stream) else {
            return Ended::Done;
        };
        if s.local_closed {
            s.user = NO_USER;
            self.forget_if_done(stream);
            return Ended::Done;
        }
        match &s.out {
            Out::Close => {
                frame::write_data(out, stream, b"", true);
                s.user = NO_USER;
                s.local_closed = true;
                s.out = Out::Done;
                self.forget_if_done(stream);
                Ended::Done
            }
            // Decoded bytes wait for window: the stream stays with its handle until they
            // are out (`respond` with no bytes sends them).
            Out::Chunked(c) if c.complete => Ended::Later,
            _ => {
                self.cancel(stream, ErrorCode::InternalError, out);
                Ended::Done
            }
        }
    }
}
