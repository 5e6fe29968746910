//! What a load connection reads from the server and the randomness it writes with: the answer
//! head's limits, the server-frame reader (over the tested frame parser), byte search and the
//! random bytes behind WebSocket keys, masks and source ports. Both workers and the publisher
//! use it; it uses nothing of the bench but the clock in [`crate::stats`].

use clarion_proto::ws::frame::{encode_client_frame, parse_header, OpCode};

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

/// What one complete server frame asks of a load connection: the step of a WebSocket
/// connection's life both workers share. The regular worker reads peers' JSON conventions into
/// `Text` on top; the million worker times its Pings by `Pong`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step<'a> {
    /// A text message to check.
    Text(&'a [u8]),
    /// A binary message to check.
    Binary(&'a [u8]),
    /// A Ping: answer it with [`pong`], or the server's idle timeout closes the connection.
    Ping(&'a [u8]),
    /// A Pong, with the payload of the Ping it answers.
    Pong(&'a [u8]),
    /// The server closed the connection.
    Closed,
    /// Nothing to do (a continuation: the servers measured never fragment what they push).
    Nothing,
}

/// The step the complete server frame at the start of `input` asks for, and the bytes it took;
/// `None` until the frame is complete.
pub(crate) fn step(input: &[u8], max: u64) -> Result<Option<(Step<'_>, usize)>, String> {
    let Some(ServerFrame {
        opcode,
        payload,
        len,
    }) = server_frame(input, max)?
    else {
        return Ok(None);
    };
    let step = match opcode {
        OpCode::Text => Step::Text(payload),
        OpCode::Binary => Step::Binary(payload),
        OpCode::Ping => Step::Ping(payload),
        OpCode::Pong => Step::Pong(payload),
        OpCode::Close => Step::Closed,
        OpCode::Continuation => Step::Nothing,
    };
    Ok(Some((step, len)))
}

/// The masked client Pong that answers a Ping with `payload` (a control frame carries at most
/// 125 bytes, RFC 6455 section 5.5).
pub(crate) fn pong(payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    encode_client_frame(OpCode::Pong, payload.get(..125).unwrap_or(payload), mask)
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

/// A token for `--jwt-secret`: HS256 over `{"sub":"m<random>","exp":<a day>,"clarion":{"subscribe":["*"]}}`,
/// so each load connection is a member of its own identity (presence) and may follow any topic.
pub fn member_token(secret: &str) -> String {
    let sub: String = rand16()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    hs256(
        secret,
        &format!(r#""sub":"m{sub}","clarion":{{"subscribe":["*"]}}"#),
    )
}

/// A token whose `clarion` claim has `admin` (it may publish anywhere), for `--jwt-secret`.
pub fn admin_token(secret: &str) -> String {
    hs256(secret, r#""sub":"bench","clarion":{"admin":true}"#)
}

/// An HS256 JWT over `{claims,"exp":<a day from now>}`.
fn hs256(secret: &str, claims: &str) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 86_400;
    let head = b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = b64.encode(format!("{{{claims},\"exp\":{exp}}}"));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let sig = ring::hmac::sign(&key, format!("{head}.{body}").as_bytes());
    format!("{head}.{body}.{}", b64.encode(sig.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clarion_proto::ws::frame::encode_frame;

    #[test]
    fn each_frame_is_one_step_and_a_partial_one_none() {
        let mut input = encode_frame(OpCode::Text, b"t 1");
        input.extend(encode_frame(OpCode::Ping, b"p"));
        input.extend(encode_frame(OpCode::Binary, b"b"));
        input.extend(encode_frame(OpCode::Pong, &7u64.to_be_bytes()));
        input.extend(encode_frame(OpCode::Close, &[3, 232]));
        let mut at = 0;
        let mut steps = Vec::new();
        while let Some((s, used)) = step(&input[at..], 1024).expect("well-formed") {
            steps.push(format!("{s:?}"));
            at += used;
        }
        assert_eq!(at, input.len());
        assert_eq!(
            steps,
            [
                format!("{:?}", Step::Text(b"t 1")),
                format!("{:?}", Step::Ping(b"p")),
                format!("{:?}", Step::Binary(b"b")),
                format!("{:?}", Step::Pong(&7u64.to_be_bytes())),
                format!("{:?}", Step::Closed),
            ]
        );
        let whole = encode_frame(OpCode::Text, b"split");
        for cut in 0..whole.len() {
            assert_eq!(step(&whole[..cut], 1024), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn a_masked_or_oversized_server_frame_is_an_error() {
        let masked = encode_client_frame(OpCode::Text, b"x", [1, 2, 3, 4]);
        assert!(step(&masked, 1024).is_err());
        let big = encode_frame(OpCode::Binary, &[0; 200]);
        assert!(step(&big, 100).is_err());
    }

    #[test]
    fn a_pong_echoes_at_most_125_bytes_masked() {
        let frame = pong(&[9; 200], [1, 2, 3, 4]);
        let h = parse_header(&frame, true, 1024)
            .expect("valid")
            .expect("complete");
        assert_eq!(h.opcode, OpCode::Pong);
        assert_eq!(h.payload_len, 125);
        assert_eq!(h.mask, Some([1, 2, 3, 4]));
    }
}
