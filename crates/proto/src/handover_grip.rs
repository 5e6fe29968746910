//! The GRIP part of a hand-over connection record ([`crate::handover`]): what a connection
//! held by a GRIP backend keeps beside its record, so that it moves instead of being told to
//! reconnect. A held stream's transport (chunked or not, keep-alive allowed) is in the record's
//! state ([`crate::handover::ConnState::Stream`] with a GRIP value, [`stream_mode`]); this
//! part carries the backend's keep-alive of a held stream, or the hold of a GRIP long-poll
//! (its time left, its timeout answer and the backend's headers for a published answer).
//!
//! Pure functions over bytes, as the rest of the format; the decoder checks every length
//! against what is left and never panics. The part has its own version byte, so a later
//! version of the part can be read beside this one.
//!
//! ```text
//! 0                                   no GRIP part
//! 1 | PART_VERSION (u8) | LEN (u32) | BODY (LEN bytes)
//! BODY: 1 | EVERY (u32) | INTERVAL (u8 0/1) | SINCE (u32) | DATA (u32 length, bytes)
//!     | 2 | LEFT (u32) | TIMEOUT (u32 length, bytes) | N (u16) | N x (NAME str16 | VALUE str16)
//! ```

use crate::handover_cursor::{Error, Reader};

/// The version of the part this code writes and reads.
pub const PART_VERSION: u8 = 1;
/// The largest keep-alive data or timeout answer carried: a backend's answer is bounded by the
/// proxy's own answer limit, far below this; more is a broken peer.
pub const MAX_BYTES: usize = 16 << 20;
/// Most backend headers kept for a held long-poll.
pub const MAX_HEADERS: usize = 256;

/// What a GRIP hold keeps beside its record as it moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GripRecord<'a> {
    /// A held stream's keep-alive (`Grip-Keep-Alive`): a held stream without one has no part.
    KeepAlive {
        /// The bytes sent when due, framed as the stream is (a chunk when chunked).
        data: &'a [u8],
        /// Seconds between keep-alives (at least 1).
        every: u32,
        /// Sent every `every` seconds (`interval` mode), not only after `every` quiet seconds.
        interval: bool,
        /// Seconds since the last keep-alive was sent.
        since: u32,
    },
    /// A held long-poll (`Grip-Hold: response`).
    Response {
        /// Seconds left before the backend's timeout answer is sent.
        left: u32,
        /// The complete timeout answer (head and body).
        timeout: &'a [u8],
        /// The backend's headers, which a published answer is sent with (its own overriding).
        headers: Vec<(&'a str, &'a str)>,
    },
}

/// The record's `ConnState::Stream` value for a GRIP held stream: 2, plus 1 when chunked, plus
/// 2 when the client allows keep-alive (values 0 and 1 are the NDJSON and raw streams).
pub fn stream_mode(chunked: bool, keep: bool) -> u8 {
    2 + u8::from(chunked) + 2 * u8::from(keep)
}

/// The `(chunked, keep)` of a `ConnState::Stream` value, when it is a GRIP held stream's.
pub fn grip_stream(mode: u8) -> Option<(bool, bool)> {
    let v = mode.checked_sub(2).filter(|v| *v <= 3)?;
    Some((v & 1 == 1, v & 2 == 2))
}

/// Appends the part (or its absence) to `out`. Lengths beyond a field's width are cut to it
/// (the caller keeps within [`MAX_BYTES`] and [`MAX_HEADERS`], as the proxy's limits do).
pub fn encode(part: Option<&GripRecord<'_>>, out: &mut Vec<u8>) {
    let Some(g) = part else {
        out.push(0);
        return;
    };
    out.extend_from_slice(&[1, PART_VERSION]);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    match g {
        GripRecord::KeepAlive {
            data,
            every,
            interval,
            since,
        } => {
            out.push(1);
            out.extend_from_slice(&every.to_le_bytes());
            out.push(u8::from(*interval));
            out.extend_from_slice(&since.to_le_bytes());
            put_bytes(out, data);
        }
        GripRecord::Response {
            left,
            timeout,
            headers,
        } => {
            out.push(2);
            out.extend_from_slice(&left.to_le_bytes());
            put_bytes(out, timeout);
            let n = headers.len().min(MAX_HEADERS);
            out.extend_from_slice(&(n as u16).to_le_bytes());
            for (name, value) in headers.iter().take(n) {
                put_str16(out, name);
                put_str16(out, value);
            }
        }
    }
    let len = (out.len() - at - 4) as u32;
    if let Some(slot) = out.get_mut(at..at + 4) {
        slot.copy_from_slice(&len.to_le_bytes());
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    let b = b.get(..b.len().min(MAX_BYTES)).unwrap_or_default();
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    // Header names and values are ASCII (checked when the backend's answer was read), so a
    // cut never splits a character.
    let b = s.as_bytes().get(..s.len().min(65535)).unwrap_or_default();
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads the part at the cursor (its absence is `Ok(None)`).
pub(crate) fn decode<'a>(r: &mut Reader<'a>) -> Result<Option<GripRecord<'a>>, Error> {
    if !r.flag()? {
        return Ok(None);
    }
    if r.u8()? != PART_VERSION {
        return Err(Error::Malformed(r.what));
    }
    let body = r.bytes32()?;
    let mut b = Reader {
        buf: body,
        what: r.what,
    };
    let part = match b.u8()? {
        1 => {
            let every = b.u32()?;
            let interval = b.flag()?;
            let since = b.u32()?;
            let data = bytes(&mut b)?;
            if every == 0 {
                return Err(Error::Malformed(r.what));
            }
            GripRecord::KeepAlive {
                data,
                every,
                interval,
                since,
            }
        }
        2 => {
            let left = b.u32()?;
            let timeout = bytes(&mut b)?;
            let n = usize::from(b.u16()?);
            if n > MAX_HEADERS {
                return Err(Error::Malformed(r.what));
            }
            let mut headers = Vec::with_capacity(n.min(b.buf.len() / 4));
            for _ in 0..n {
                headers.push((b.str16()?, b.str16()?));
            }
            GripRecord::Response {
                left,
                timeout,
                headers,
            }
        }
        _ => return Err(Error::Malformed(r.what)),
    };
    if !b.buf.is_empty() {
        // One encoding per part: its length says exactly where it ends.
        return Err(Error::Malformed(r.what));
    }
    Ok(Some(part))
}

fn bytes<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], Error> {
    let n = r.u32()? as usize;
    if n > MAX_BYTES {
        return Err(Error::Malformed(r.what));
    }
    r.take(n)
}

/// Decodes a part alone (as the fuzz target reads its input), requiring every byte to be used.
pub fn decode_part(buf: &[u8]) -> Result<Option<GripRecord<'_>>, Error> {
    let mut r = Reader {
        buf,
        what: "grip part",
    };
    let part = decode(&mut r)?;
    if !r.buf.is_empty() {
        return Err(Error::Trailing("grip part"));
    }
    Ok(part)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn samples() -> Vec<Option<GripRecord<'static>>> {
        vec![
            None,
            Some(GripRecord::KeepAlive {
                data: b"2\r\n\n\n\r\n",
                every: 20,
                interval: true,
                since: 3,
            }),
            Some(GripRecord::KeepAlive {
                data: b"",
                every: 1,
                interval: false,
                since: 0,
            }),
            Some(GripRecord::Response {
                left: 17,
                timeout: b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\ntimeout\n",
                headers: vec![("Content-Type", "text/plain"), ("X-Seen", "")],
            }),
            Some(GripRecord::Response {
                left: 0,
                timeout: b"",
                headers: vec![],
            }),
        ]
    }

    #[test]
    fn every_part_round_trips_and_every_prefix_is_refused() {
        for s in samples() {
            let mut out = Vec::new();
            encode(s.as_ref(), &mut out);
            assert_eq!(decode_part(&out), Ok(s.clone()));
            for cut in 0..out.len() {
                assert!(decode_part(&out[..cut]).is_err(), "cut at {cut} of {s:?}");
            }
            out.push(0);
            assert!(decode_part(&out).is_err(), "a trailing byte is refused");
        }
    }

    #[test]
    fn another_part_version_a_zero_period_and_unknown_kinds_are_refused() {
        let mut out = Vec::new();
        encode(samples()[1].as_ref(), &mut out);
        let mut other = out.clone();
        other[1] = PART_VERSION + 1;
        assert!(decode_part(&other).is_err());
        let mut zero = out.clone();
        zero[7..11].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode_part(&zero).is_err());
        let mut kind = out.clone();
        kind[6] = 3;
        assert!(decode_part(&kind).is_err());
        // A length that runs past the end, and a data length beyond the limit.
        let mut long = out.clone();
        long[2..6].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_part(&long).is_err());
        let mut big = vec![1, PART_VERSION, 14, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        big.extend_from_slice(&(MAX_BYTES as u32 + 1).to_le_bytes());
        assert!(decode_part(&big).is_err());
        assert!(decode_part(&[2]).is_err());
    }

    #[test]
    fn a_grip_stream_s_mode_is_apart_from_the_other_streams() {
        assert_eq!(grip_stream(0), None);
        assert_eq!(grip_stream(1), None);
        assert_eq!(grip_stream(6), None);
        for chunked in [false, true] {
            for keep in [false, true] {
                assert_eq!(
                    grip_stream(stream_mode(chunked, keep)),
                    Some((chunked, keep))
                );
            }
        }
    }
}
