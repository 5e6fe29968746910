//! What a load connection reads from the server and the randomness it writes with: the answer
//! head's limits, the server-frame reader (over the tested frame parser), byte search and the
//! random bytes behind WebSocket keys, masks and source ports. Both workers and the publisher
//! use it; it uses nothing of the bench but the clock in [`crate::stats`].

use clarion_proto::ws::frame::{parse_header, OpCode};

use crate::stats::unix_micros;

/// Most header fields in an answer the bench reads.
pub(crate) const MAX_HEADERS: usize = 32;
/// Largest answer head: Clarion's are a few hundred bytes.
pub(crate) const MAX_HEAD: usize = 16 * 1024;

/// The opcode, payload and length of the complete server frame at the start of `input`, or
/// `None` until it is complete. Server frames are unmasked (RFC 6455 section 5.1); a masked one
/// is a broken server.
pub(crate) fn server_frame(input: &[u8], max: u64) -> Result<Option<ServerFrame<'_>>, String> {
    let Some(h) = parse_header(input, false, max).map_err(|e| format!("bad frame: {e}"))? else {
        return Ok(None);
    };
    if h.mask.is_some() {
        return Err("bad frame: masked by the server".into());
    }
    let total = usize::try_from(h.payload_len)
        .ok()
        .and_then(|n| n.checked_add(h.header_len))
        .ok_or("bad frame: too long")?;
    Ok(input.get(h.header_len..total).map(|payload| ServerFrame {
        opcode: h.opcode,
        payload,
        len: total,
    }))
}

/// A complete frame from the server.
pub(crate) struct ServerFrame<'a> {
    pub(crate) opcode: OpCode,
    pub(crate) payload: &'a [u8],
    /// Bytes it took, header included.
    pub(crate) len: usize,
}

/// Random bytes for keys and masks (not for secrets: the bench only needs them to differ).
pub(crate) fn rand16() -> [u8; 16] {
    let mut x = unix_micros() ^ u64::from(std::process::id()).rotate_left(32);
    let mut out = [0u8; 16];
    for b in &mut out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    out
}

/// Where `needle` first occurs in `hay`.
pub(crate) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
