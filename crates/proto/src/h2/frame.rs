//! HTTP/2 frames (RFC 9113 §4, §6): reading them from bytes with every check the format
//! allows before any state is touched, and writing the ones a server sends.
//!
//! [`parse`] returns `Ok(None)` until a whole frame is buffered, and refuses a frame longer
//! than the `SETTINGS_MAX_FRAME_SIZE` this side advertised before waiting for its payload, so
//! a peer cannot make the server buffer more than one frame's worth. Errors carry the error
//! code the RFC prescribes and whether they end the connection or one stream.

/// The client connection preface (§3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 9;

/// The smallest `SETTINGS_MAX_FRAME_SIZE` (and the default).
pub const DEFAULT_MAX_FRAME: u32 = 16_384;

/// The largest flow-control window (§6.9.1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Error codes (§7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    NoError = 0x0,
    ProtocolError = 0x1,
    InternalError = 0x2,
    FlowControlError = 0x3,
    SettingsTimeout = 0x4,
    StreamClosed = 0x5,
    FrameSizeError = 0x6,
    RefusedStream = 0x7,
    Cancel = 0x8,
    CompressionError = 0x9,
    ConnectError = 0xa,
    EnhanceYourCalm = 0xb,
    InadequateSecurity = 0xc,
    Http11Required = 0xd,
}

/// A frame that cannot be accepted, and what it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    pub code: ErrorCode,
    /// `Some(id)`: only that stream is reset (RST_STREAM); `None`: the connection ends (GOAWAY).
    pub stream: Option<u32>,
    pub reason: &'static str,
}

impl FrameError {
    fn conn(code: ErrorCode, reason: &'static str) -> FrameError {
        FrameError {
            code,
            stream: None,
            reason,
        }
    }
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.stream {
            Some(id) => write!(f, "stream {id}: {:?}: {}", self.code, self.reason),
            None => write!(f, "{:?}: {}", self.code, self.reason),
        }
    }
}

impl std::error::Error for FrameError {}

pub const FLAG_END_STREAM: u8 = 0x1;
pub const FLAG_ACK: u8 = 0x1;
pub const FLAG_END_HEADERS: u8 = 0x4;
pub const FLAG_PADDED: u8 = 0x8;
pub const FLAG_PRIORITY: u8 = 0x20;

/// A setting (§6.5.2) by identifier; unknown identifiers are ignored, as required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    HeaderTableSize(u32),
    EnablePush(u32),
    MaxConcurrentStreams(u32),
    InitialWindowSize(u32),
    MaxFrameSize(u32),
    MaxHeaderListSize(u32),
    /// RFC 8441: extended CONNECT (WebSockets over HTTP/2).
    EnableConnectProtocol(u32),
    Unknown(u16, u32),
}

impl Setting {
    fn from_wire(id: u16, value: u32) -> Result<Setting, FrameError> {
        let s = match id {
            0x1 => Setting::HeaderTableSize(value),
            0x2 if value > 1 => {
                return Err(FrameError::conn(
                    ErrorCode::ProtocolError,
                    "SETTINGS_ENABLE_PUSH other than 0 or 1",
                ))
            }
            0x2 => Setting::EnablePush(value),
            0x3 => Setting::MaxConcurrentStreams(value),
            0x4 if value > MAX_WINDOW => {
                return Err(FrameError::conn(
                    ErrorCode::FlowControlError,
                    "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                ))
            }
            0x4 => Setting::InitialWindowSize(value),
            0x5 if !(DEFAULT_MAX_FRAME..=(1 << 24) - 1).contains(&value) => {
                return Err(FrameError::conn(
                    ErrorCode::ProtocolError,
                    "SETTINGS_MAX_FRAME_SIZE out of range",
                ))
            }
            0x5 => Setting::MaxFrameSize(value),
            0x6 => Setting::MaxHeaderListSize(value),
            0x8 if value > 1 => {
                return Err(FrameError::conn(
                    ErrorCode::ProtocolError,
                    "SETTINGS_ENABLE_CONNECT_PROTOCOL other than 0 or 1",
                ))
            }
            0x8 => Setting::EnableConnectProtocol(value),
            other => Setting::Unknown(other, value),
        };
        Ok(s)
    }

    fn to_wire(self) -> (u16, u32) {
        match self {
            Setting::HeaderTableSize(v) => (0x1, v),
            Setting::EnablePush(v) => (0x2, v),
            Setting::MaxConcurrentStreams(v) => (0x3, v),
            Setting::InitialWindowSize(v) => (0x4, v),
            Setting::MaxFrameSize(v) => (0x5, v),
            Setting::MaxHeaderListSize(v) => (0x6, v),
            Setting::EnableConnectProtocol(v) => (0x8, v),
            Setting::Unknown(id, v) => (id, v),
        }
    }
}

/// A parsed frame; payload slices borrow the input buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    Data {
        stream: u32,
        data: &'a [u8],
        end_stream: bool,
        /// Bytes the frame counts against flow control (payload with padding).
        flow_len: u32,
    },
    Headers {
        stream: u32,
        /// A header block fragment (CONTINUATION frames may follow).
        block: &'a [u8],
        end_stream: bool,
        end_headers: bool,
        /// The stream this one depends on, when a priority is given (only checked: a
        /// stream may not depend on itself).
        depends_on: Option<u32>,
    },
    Priority {
        stream: u32,
        depends_on: u32,
    },
    RstStream {
        stream: u32,
        code: u32,
    },
    /// Settings, in order (`ack` with none).
    Settings {
        ack: bool,
        payload: &'a [u8],
    },
    PushPromise {
        stream: u32,
    },
    Ping {
        ack: bool,
        data: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        code: u32,
        debug: &'a [u8],
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    Continuation {
        stream: u32,
        block: &'a [u8],
        end_headers: bool,
    },
    /// A frame of a type this side does not know: ignored, as required (§4.1).
    Unknown {
        kind: u8,
        stream: u32,
    },
}

impl Frame<'_> {
    /// The settings a SETTINGS frame carries, in order.
    pub fn settings(payload: &[u8]) -> impl Iterator<Item = Result<Setting, FrameError>> + '_ {
        payload.chunks_exact(6).map(|c| {
            let id = u16::from_be_bytes([
                c.first().copied().unwrap_or(0),
                c.get(1).copied().unwrap_or(0),
            ]);
            let value = u32::from_be_bytes([
                c.get(2).copied().unwrap_or(0),
                c.get(3).copied().unwrap_or(0),
                c.get(4).copied().unwrap_or(0),
                c.get(5).copied().unwrap_or(0),
            ]);
            Setting::from_wire(id, value)
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        x.copy_from_slice(s);
    }
    u32::from_be_bytes(x)
}

/// Reads one frame from the start of `buf`: `Ok(Some((frame, consumed)))`, `Ok(None)` when
/// more bytes are needed, or the error that ends the connection or the stream.
pub fn parse(buf: &[u8], max_frame: u32) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    let Some(head) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let len = u32_at(head, 0) >> 8;
    let kind = head.get(3).copied().unwrap_or(0);
    let flags = head.get(4).copied().unwrap_or(0);
    let stream = u32_at(head, 5) & MAX_WINDOW;
    if len > max_frame {
        return Err(FrameError::conn(
            ErrorCode::FrameSizeError,
            "frame longer than SETTINGS_MAX_FRAME_SIZE",
        ));
    }
    let total = HEADER_LEN + len as usize;
    let Some(payload) = buf.get(HEADER_LEN..total) else {
        return Ok(None);
    };
    let stream_err = |code, reason| FrameError {
        code,
        stream: Some(stream),
        reason,
    };
    let needs_stream = |f| {
        if stream == 0 {
            Err(FrameError::conn(
                ErrorCode::ProtocolError,
                "frame needs a stream and names stream 0",
            ))
        } else {
            Ok(f)
        }
    };
    let frame = match kind {
        0x0 => {
            let data = unpad(payload, flags)?;
            needs_stream(Frame::Data {
                stream,
                data,
                end_stream: flags & FLAG_END_STREAM != 0,
                flow_len: len,
            })?
        }
        0x1 => {
            let mut block = unpad(payload, flags)?;
            let mut depends_on = None;
            if flags & FLAG_PRIORITY != 0 {
                let dep = block.get(..5).ok_or_else(|| {
                    FrameError::conn(ErrorCode::FrameSizeError, "HEADERS too short for priority")
                })?;
                depends_on = Some(u32_at(dep, 0) & MAX_WINDOW);
                block = block.get(5..).unwrap_or_default();
            }
            if depends_on == Some(stream) {
                return Err(stream_err(
                    ErrorCode::ProtocolError,
                    "stream depends on itself",
                ));
            }
            needs_stream(Frame::Headers {
                stream,
                block,
                end_stream: flags & FLAG_END_STREAM != 0,
                end_headers: flags & FLAG_END_HEADERS != 0,
                depends_on,
            })?
        }
        0x2 => {
            if len != 5 {
                return Err(stream_err(
                    ErrorCode::FrameSizeError,
                    "PRIORITY is not 5 bytes",
                ));
            }
            let depends_on = u32_at(payload, 0) & MAX_WINDOW;
            if depends_on == stream {
                return Err(stream_err(
                    ErrorCode::ProtocolError,
                    "stream depends on itself",
                ));
            }
            needs_stream(Frame::Priority { stream, depends_on })?
        }
        0x3 => {
            if len != 4 {
                return Err(FrameError::conn(
                    ErrorCode::FrameSizeError,
                    "RST_STREAM is not 4 bytes",
                ));
            }
            needs_stream(Frame::RstStream {
                stream,
                code: u32_at(payload, 0),
            })?
        }
        0x4 => {
            if stream != 0 {
                return Err(FrameError::conn(
                    ErrorCode::ProtocolError,
                    "SETTINGS on a stream",
                ));
            }
            let ack = flags & FLAG_ACK != 0;
            if ack && len != 0 {
                return Err(FrameError::conn(
                    ErrorCode::FrameSizeError,
                    "SETTINGS ack with a payload",
                ));
            }
            if !len.is_multiple_of(6) {
                return Err(FrameError::conn(
                    ErrorCode::FrameSizeError,
                    "SETTINGS not a multiple of 6 bytes",
                ));
            }
            Frame::Settings { ack, payload }
        }
        0x5 => {
            // Clients cannot push (§8.4): whatever it holds, the connection ends.
            return Err(FrameError::conn(
                ErrorCode::ProtocolError,
                "PUSH_PROMISE from a client",
            ));
        }
        0x6 => {
            if stream != 0 {
                return Err(FrameError::conn(
                    ErrorCode::ProtocolError,
                    "PING on a stream",
                ));
            }
            let mut data = [0u8; 8];
            match payload.get(..8) {
                Some(d) if len == 8 => data.copy_from_slice(d),
                _ => {
                    return Err(FrameError::conn(
                        ErrorCode::FrameSizeError,
                        "PING is not 8 bytes",
                    ))
                }
            }
            Frame::Ping {
                ack: flags & FLAG_ACK != 0,
                data,
            }
        }
        0x7 => {
            if stream != 0 {
                return Err(FrameError::conn(
                    ErrorCode::ProtocolError,
                    "GOAWAY on a stream",
                ));
            }
            if len < 8 {
                return Err(FrameError::conn(
                    ErrorCode::FrameSizeError,
                    "GOAWAY shorter than 8 bytes",
                ));
            }
            Frame::GoAway {
                last_stream: u32_at(payload, 0) & MAX_WINDOW,
                code: u32_at(payload, 4),
                debug: payload.get(8..).unwrap_or_default(),
            }
        }
        0x8 => {
            if len != 4 {
                return Err(FrameError::conn(
                    ErrorCode::FrameSizeError,
                    "WINDOW_UPDATE is not 4 bytes",
                ));
            }
            let increment = u32_at(payload, 0) & MAX_WINDOW;
            if increment == 0 {
                return Err(match stream {
                    0 => FrameError::conn(ErrorCode::ProtocolError, "WINDOW_UPDATE of 0"),
                    _ => stream_err(ErrorCode::ProtocolError, "WINDOW_UPDATE of 0"),
                });
            }
            Frame::WindowUpdate { stream, increment }
        }
        0x9 => needs_stream(Frame::Continuation {
            stream,
            block: payload,
            end_headers: flags & FLAG_END_HEADERS != 0,
        })?,
        _ => Frame::Unknown { kind, stream },
    };
    Ok(Some((frame, total)))
}

/// The payload of a frame that may be padded, without its padding.
fn unpad(payload: &[u8], flags: u8) -> Result<&[u8], FrameError> {
    if flags & FLAG_PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload.split_first().ok_or_else(|| {
        FrameError::conn(
            ErrorCode::FrameSizeError,
            "padded frame without a pad length",
        )
    })?;
    let keep = rest.len().checked_sub(usize::from(pad)).ok_or_else(|| {
        FrameError::conn(
            ErrorCode::ProtocolError,
            "padding longer than the frame's payload",
        )
    })?;
    Ok(rest.get(..keep).unwrap_or_default())
}

/// Appends a frame header.
pub fn write_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = (len as u32).min((1 << 24) - 1);
    out.extend_from_slice(len.to_be_bytes().get(1..).unwrap_or_default());
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & MAX_WINDOW).to_be_bytes());
}

/// Appends a SETTINGS frame with `settings`.
pub fn write_settings(out: &mut Vec<u8>, settings: &[Setting]) {
    write_header(out, settings.len() * 6, 0x4, 0, 0);
    for s in settings {
        let (id, value) = s.to_wire();
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Appends the acknowledgement of the peer's SETTINGS.
pub fn write_settings_ack(out: &mut Vec<u8>) {
    write_header(out, 0, 0x4, FLAG_ACK, 0);
}

/// Appends a PING (or its answer, with `ack`).
pub fn write_ping(out: &mut Vec<u8>, data: [u8; 8], ack: bool) {
    write_header(out, 8, 0x6, if ack { FLAG_ACK } else { 0 }, 0);
    out.extend_from_slice(&data);
}

/// Appends a GOAWAY naming the last stream this side will process.
pub fn write_goaway(out: &mut Vec<u8>, last_stream: u32, code: ErrorCode, debug: &[u8]) {
    write_header(out, 8 + debug.len(), 0x7, 0, 0);
    out.extend_from_slice(&(last_stream & MAX_WINDOW).to_be_bytes());
    out.extend_from_slice(&(code as u32).to_be_bytes());
    out.extend_from_slice(debug);
}

/// Appends a RST_STREAM.
pub fn write_rst_stream(out: &mut Vec<u8>, stream: u32, code: ErrorCode) {
    write_header(out, 4, 0x3, 0, stream);
    out.extend_from_slice(&(code as u32).to_be_bytes());
}

/// Appends a WINDOW_UPDATE (`stream` 0: the connection's window).
pub fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    write_header(out, 4, 0x8, 0, stream);
    out.extend_from_slice(&(increment & MAX_WINDOW).to_be_bytes());
}

/// Appends a header block as HEADERS (and CONTINUATION frames when it exceeds `max_frame`).
pub fn write_headers(
    out: &mut Vec<u8>,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: u32,
) {
    let max = (max_frame as usize).max(1);
    let mut chunks = block.chunks(max).peekable();
    let first = chunks.next().unwrap_or_default();
    let mut flags = if end_stream { FLAG_END_STREAM } else { 0 };
    if chunks.peek().is_none() {
        flags |= FLAG_END_HEADERS;
    }
    write_header(out, first.len(), 0x1, flags, stream);
    out.extend_from_slice(first);
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            FLAG_END_HEADERS
        } else {
            0
        };
        write_header(out, chunk.len(), 0x9, flags, stream);
        out.extend_from_slice(chunk);
    }
}

/// Appends a DATA frame carrying `data` (at most `max_frame` bytes: the caller splits).
pub fn write_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end_stream: bool) {
    write_header(
        out,
        data.len(),
        0x0,
        if end_stream { FLAG_END_STREAM } else { 0 },
        stream,
    );
    out.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_header(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn frames_wait_for_their_whole_payload_and_report_what_they_consumed() {
        let mut out = Vec::new();
        write_ping(&mut out, *b"12345678", false);
        write_window_update(&mut out, 0, 1000);
        for cut in 0..17 {
            assert_eq!(
                parse(&out[..cut], DEFAULT_MAX_FRAME).unwrap(),
                None,
                "cut at {cut}"
            );
        }
        let (f, n) = parse(&out, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            f,
            Frame::Ping {
                ack: false,
                data: *b"12345678"
            }
        );
        assert_eq!(n, 17);
        let (f, _) = parse(&out[n..], DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            f,
            Frame::WindowUpdate {
                stream: 0,
                increment: 1000
            }
        );
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_header_alone() {
        let mut head = Vec::new();
        write_header(&mut head, 16_385, 0x0, 0, 1);
        let e = parse(&head, DEFAULT_MAX_FRAME).unwrap_err();
        assert_eq!((e.code, e.stream), (ErrorCode::FrameSizeError, None));
    }

    #[test]
    fn padding_is_removed_and_checked() {
        let f = frame(0x0, FLAG_PADDED | FLAG_END_STREAM, 3, b"\x02hi\0\0");
        let (got, _) = parse(&f, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            got,
            Frame::Data {
                stream: 3,
                data: b"hi",
                end_stream: true,
                flow_len: 5
            }
        );
        let bad = frame(0x0, FLAG_PADDED, 3, b"\x05hi");
        assert_eq!(
            parse(&bad, DEFAULT_MAX_FRAME).unwrap_err().code,
            ErrorCode::ProtocolError
        );
        let empty = frame(0x1, FLAG_PADDED, 3, b"");
        assert_eq!(
            parse(&empty, DEFAULT_MAX_FRAME).unwrap_err().code,
            ErrorCode::FrameSizeError
        );
    }

    #[test]
    fn malformed_control_frames_get_the_rfc_error() {
        let cases: [(Vec<u8>, ErrorCode, bool); 12] = [
            (
                frame(0x6, 0, 0, b"1234567"),
                ErrorCode::FrameSizeError,
                false,
            ),
            (
                frame(0x6, 0, 1, b"12345678"),
                ErrorCode::ProtocolError,
                false,
            ),
            (frame(0x4, 0, 0, b"12345"), ErrorCode::FrameSizeError, false),
            (
                frame(0x4, FLAG_ACK, 0, b"\0\x01\0\0\0\0"),
                ErrorCode::FrameSizeError,
                false,
            ),
            (frame(0x4, 0, 1, b""), ErrorCode::ProtocolError, false),
            (
                frame(0x8, 0, 0, b"\0\0\0\0"),
                ErrorCode::ProtocolError,
                false,
            ),
            (
                frame(0x8, 0, 5, b"\0\0\0\0"),
                ErrorCode::ProtocolError,
                true,
            ),
            (
                frame(0x8, 0, 0, b"\0\0\0"),
                ErrorCode::FrameSizeError,
                false,
            ),
            (
                frame(0x3, 0, 0, b"\0\0\0\x08"),
                ErrorCode::ProtocolError,
                false,
            ),
            (
                frame(0x2, 0, 3, b"\0\0\0\x03\x10"),
                ErrorCode::ProtocolError,
                true,
            ),
            (frame(0x0, 0, 0, b"data"), ErrorCode::ProtocolError, false),
            (
                frame(0x5, FLAG_END_HEADERS, 1, b"\0\0\0\x02"),
                ErrorCode::ProtocolError,
                false,
            ),
        ];
        for (bytes, code, on_stream) in cases {
            let e = parse(&bytes, DEFAULT_MAX_FRAME).unwrap_err();
            assert_eq!(
                (e.code, e.stream.is_some()),
                (code, on_stream),
                "{bytes:02x?}: {e}"
            );
        }
    }

    #[test]
    fn settings_are_read_in_order_and_checked() {
        let mut out = Vec::new();
        write_settings(
            &mut out,
            &[
                Setting::MaxConcurrentStreams(100),
                Setting::InitialWindowSize(65_535),
                Setting::EnableConnectProtocol(1),
                Setting::Unknown(0x99, 7),
            ],
        );
        let (f, _) = parse(&out, DEFAULT_MAX_FRAME).unwrap().unwrap();
        let Frame::Settings {
            ack: false,
            payload,
        } = f
        else {
            panic!("{f:?}")
        };
        let got: Vec<Setting> = Frame::settings(payload).map(Result::unwrap).collect();
        assert_eq!(got[0], Setting::MaxConcurrentStreams(100));
        assert_eq!(got[3], Setting::Unknown(0x99, 7));
        let bad = [
            (0x2u16, 2u32, ErrorCode::ProtocolError),
            (0x4, 1 << 31, ErrorCode::FlowControlError),
            (0x5, 100, ErrorCode::ProtocolError),
            (0x5, 1 << 24, ErrorCode::ProtocolError),
        ];
        for (id, value, code) in bad {
            let mut p = id.to_be_bytes().to_vec();
            p.extend_from_slice(&value.to_be_bytes());
            assert_eq!(Frame::settings(&p).next().unwrap().unwrap_err().code, code);
        }
    }

    #[test]
    fn header_blocks_are_split_into_continuations() {
        let block: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        write_headers(&mut out, 7, &block, false, DEFAULT_MAX_FRAME);
        let mut rest = &out[..];
        let mut joined = Vec::new();
        let mut kinds = Vec::new();
        while let Some((f, n)) = parse(rest, DEFAULT_MAX_FRAME).unwrap() {
            match f {
                Frame::Headers {
                    block, end_headers, ..
                } => {
                    kinds.push(("h", end_headers));
                    joined.extend_from_slice(block);
                }
                Frame::Continuation {
                    block, end_headers, ..
                } => {
                    kinds.push(("c", end_headers));
                    joined.extend_from_slice(block);
                }
                other => panic!("{other:?}"),
            }
            rest = &rest[n..];
        }
        assert_eq!(joined, block);
        assert_eq!(kinds, [("h", false), ("c", false), ("c", true)]);
    }

    #[test]
    fn unknown_frame_types_are_ignored_not_refused() {
        let f = frame(0xfa, 0xff, 9, b"whatever");
        let (got, n) = parse(&f, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            got,
            Frame::Unknown {
                kind: 0xfa,
                stream: 9
            }
        );
        assert_eq!(n, f.len());
    }

    #[test]
    fn goaway_and_rst_stream_are_written_as_read() {
        let mut out = Vec::new();
        write_goaway(&mut out, 41, ErrorCode::EnhanceYourCalm, b"too many resets");
        write_rst_stream(&mut out, 3, ErrorCode::RefusedStream);
        let (g, n) = parse(&out, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            g,
            Frame::GoAway {
                last_stream: 41,
                code: 0xb,
                debug: b"too many resets"
            }
        );
        let (r, _) = parse(&out[n..], DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            r,
            Frame::RstStream {
                stream: 3,
                code: 0x7
            }
        );
    }
}
