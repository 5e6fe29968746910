//! GRIP content between cluster nodes: a [`GripContent`] as bytes and back, so a Pushpin-format
//! publish on one node reaches the held connections of every node.
//!
//! The bytes are a list of fields, each a tag byte, a four-byte big-endian length and that many
//! bytes. A response's fields follow its tag (`r`) as a nested list. Unknown tags are refused,
//! so nodes of incompatible versions do not half-understand each other.

use std::sync::Arc;

use clarion_proto::grip::publish::HttpResponse;
use clarion_proto::http1;

use super::{GripContent, StreamPart, WsPart};
use crate::message::Attachment;

const ID: u8 = b'i';
const STREAM: u8 = b's';
const STREAM_CLOSE: u8 = b'S';
const RESPONSE: u8 = b'r';
const WS_FRAME: u8 = b'w';
const WS_CLOSE: u8 = b'c';
const CODE: u8 = b'C';
const REASON: u8 = b'R';
const HEADER_NAME: u8 = b'N';
const HEADER_VALUE: u8 = b'V';
const BODY: u8 = b'B';
const FILTER: u8 = b'F';

fn field(out: &mut Vec<u8>, tag: u8, data: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Splits `buf` into its fields; `None` if it is truncated.
fn fields(mut buf: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut out = Vec::new();
    while let Some((&tag, rest)) = buf.split_first() {
        let len: [u8; 4] = rest.get(..4)?.try_into().ok()?;
        let n = u32::from_be_bytes(len) as usize;
        let data = rest.get(4..4 + n)?;
        out.push((tag, data));
        buf = rest.get(4 + n..)?;
    }
    Some(out)
}

impl GripContent {
    /// The content as bytes ([`decode`] reverses it).
    pub fn to_wire(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(id) = &self.id {
            field(&mut out, ID, id.as_bytes());
        }
        match &self.stream {
            Some(StreamPart::Send { raw, .. }) => field(&mut out, STREAM, raw),
            Some(StreamPart::Close) => field(&mut out, STREAM_CLOSE, b""),
            None => {}
        }
        if let Some(r) = &self.response {
            let mut inner = Vec::new();
            field(&mut inner, CODE, &r.code.to_be_bytes());
            if let Some(reason) = &r.reason {
                field(&mut inner, REASON, reason.as_bytes());
            }
            for (n, v) in &r.headers {
                field(&mut inner, HEADER_NAME, n.as_bytes());
                field(&mut inner, HEADER_VALUE, v.as_bytes());
            }
            field(&mut inner, BODY, &r.body);
            for f in &r.filters {
                field(&mut inner, FILTER, f.as_bytes());
            }
            field(&mut out, RESPONSE, &inner);
        }
        match &self.ws {
            Some(WsPart::Frame(f)) => field(&mut out, WS_FRAME, f),
            Some(WsPart::Close(f)) => field(&mut out, WS_CLOSE, f),
            None => {}
        }
        out
    }
}

fn text(b: &[u8]) -> Option<String> {
    String::from_utf8(b.to_vec()).ok()
}

fn response(buf: &[u8]) -> Option<HttpResponse> {
    let mut r = HttpResponse {
        code: 200,
        reason: None,
        headers: Vec::new(),
        body: Vec::new(),
        filters: Vec::new(),
    };
    let mut name: Option<String> = None;
    for (tag, data) in fields(buf)? {
        match tag {
            CODE => r.code = u16::from_be_bytes(data.try_into().ok()?),
            REASON => r.reason = Some(text(data)?),
            HEADER_NAME => name = Some(text(data)?),
            HEADER_VALUE => r.headers.push((name.take()?, text(data)?)),
            BODY => r.body = data.to_vec(),
            FILTER => r.filters.push(text(data)?),
            _ => return None,
        }
    }
    Some(r)
}

/// GRIP content from another node's [`GripContent::to_wire`]; `None` for bytes that are not.
pub fn decode(buf: &[u8]) -> Option<Arc<dyn Attachment>> {
    let mut c = GripContent {
        id: None,
        stream: None,
        response: None,
        ws: None,
    };
    for (tag, data) in fields(buf)? {
        match tag {
            ID => c.id = Some(text(data)?.into()),
            STREAM => {
                let mut chunk = Vec::with_capacity(data.len() + 16);
                http1::write_chunk(&mut chunk, data);
                c.stream = Some(StreamPart::Send {
                    raw: Arc::from(data),
                    chunk: chunk.into(),
                });
            }
            STREAM_CLOSE => c.stream = Some(StreamPart::Close),
            RESPONSE => c.response = Some(Box::new(response(data)?)),
            WS_FRAME => c.ws = Some(WsPart::Frame(Arc::from(data))),
            WS_CLOSE => c.ws = Some(WsPart::Close(Arc::from(data))),
            _ => return None,
        }
    }
    Some(Arc::new(c))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::message::Published;
    use clarion_proto::ws::DataKind;

    #[test]
    fn content_round_trips() {
        let c = GripContent {
            id: Some("p-7".into()),
            stream: None,
            response: Some(Box::new(HttpResponse {
                code: 404,
                reason: Some("Gone Fishing".into()),
                headers: vec![("X-A".into(), "1".into()), ("X-B".into(), "".into())],
                body: b"body\x00".to_vec(),
                filters: vec!["skip-self".into()],
            })),
            ws: Some(WsPart::Frame(Arc::from(&b"\x81\x02hi"[..]))),
        };
        let bytes = c.to_wire();
        let back = decode(&bytes).unwrap();
        let mut p = Published::new("t".into(), 1, "e".into(), DataKind::Text, None, 0, b"x");
        p.attachment = Some(back);
        let got = GripContent::of(&p).unwrap();
        assert_eq!(got.to_wire(), bytes);
        assert_eq!(got.publisher_id(), Some("p-7"));
        let s = GripContent {
            id: None,
            stream: Some(StreamPart::Send {
                raw: Arc::from(&b"line\n"[..]),
                chunk: Arc::from(&b""[..]),
            }),
            response: None,
            ws: None,
        };
        let mut p2 = Published::new("t".into(), 1, "e".into(), DataKind::Text, None, 0, b"x");
        p2.attachment = decode(&s.to_wire());
        match &GripContent::of(&p2).unwrap().stream {
            Some(StreamPart::Send { chunk, .. }) => assert_eq!(&chunk[..], b"5\r\nline\n\r\n"),
            _ => panic!("stream part lost"),
        }
    }

    #[test]
    fn broken_bytes_are_refused() {
        assert!(decode(b"i\x00\x00\x00\x05ab").is_none());
        assert!(decode(b"?\x00\x00\x00\x00").is_none());
        assert!(decode(b"r\x00\x00\x00\x05C\x00\x00\x00\x01").is_none());
        assert!(decode(b"").is_some());
    }
}
