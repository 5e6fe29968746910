//! The JSON the server sends to subscribers: the `clarion.v1` message envelope, the gap notice
//! of an incomplete resume, and the long-poll body that carries both.
//!
//! Output is byte-for-byte stable (clients and tests compare it): fields in a fixed order, no
//! whitespace, strings escaped as `serde_json` escapes them.

use base64::Engine as _;

use crate::ws::DataKind;

/// Appends `s` as a JSON string literal.
pub fn push_json_str(out: &mut String, s: &str) {
    // Serializing a `str` cannot fail (it needs no map keys and no I/O); the empty fallback is
    // never taken.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// One published message as subscribers of the `clarion.v1` format see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope<'a> {
    /// The topic it was published to.
    pub topic: &'a str,
    /// Its id, `EPOCH-SEQ`.
    pub id: &'a str,
    /// When the payload is a delta (`docs/delta.md`): the id of the message it applies to.
    pub delta: Option<&'a str>,
    /// The SSE event name the publisher gave, if any.
    pub event: Option<&'a str>,
    /// Text (the payload is UTF-8) or binary (sent base64-encoded).
    pub kind: DataKind,
    /// The message itself.
    pub payload: &'a [u8],
    /// Its filter tags (`"tags":{..}` when there are any).
    pub tags: &'a [(String, String)],
}

impl Envelope<'_> {
    /// `{"type":"message","topic":..,"id":..,["delta":..,]["event":..,]["encoding":"base64",]"data":..}`
    /// (no trailing newline).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(self.payload.len() + 64);
        out.push_str(r#"{"type":"message","topic":"#);
        push_json_str(&mut out, self.topic);
        out.push_str(r#","id":"#);
        push_json_str(&mut out, self.id);
        if let Some(base) = self.delta {
            out.push_str(r#","delta":"#);
            push_json_str(&mut out, base);
        }
        if let Some(event) = self.event {
            out.push_str(r#","event":"#);
            push_json_str(&mut out, event);
        }
        if !self.tags.is_empty() {
            out.push_str(r#","tags":{"#);
            for (i, (k, v)) in self.tags.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_json_str(&mut out, k);
                out.push(':');
                push_json_str(&mut out, v);
            }
            out.push('}');
        }
        match self.kind {
            // Text payloads were validated as UTF-8 when they were published; a lossy
            // conversion keeps a bug elsewhere from producing invalid JSON.
            DataKind::Text => {
                out.push_str(r#","data":"#);
                push_json_str(&mut out, &String::from_utf8_lossy(self.payload));
            }
            DataKind::Binary => {
                out.push_str(r#","encoding":"base64","data":""#);
                out.push_str(&base64::engine::general_purpose::STANDARD.encode(self.payload));
                out.push('"');
            }
        }
        out.push('}');
        out
    }
}

/// Why a resuming client cannot be served every message it missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapReason {
    /// The topic's history no longer holds every message after the client's id.
    Trimmed,
    /// The id was not issued by this server run (restart, another server, or not an id).
    Epoch,
}

impl GapReason {
    /// The `reason` field's value.
    pub fn as_str(self) -> &'static str {
        match self {
            GapReason::Trimmed => "trimmed",
            GapReason::Epoch => "epoch",
        }
    }
}

/// A notice that a resume is incomplete, sent before the messages that could be replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapNotice<'a> {
    /// The topic concerned.
    pub topic: &'a str,
    /// The id the client resumed from, as it sent it.
    pub since: &'a str,
    /// Why.
    pub reason: GapReason,
}

impl GapNotice<'_> {
    /// `{"type":"gap","topic":..,"since":..,"reason":"trimmed"|"epoch"}`.
    pub fn to_json(&self) -> String {
        let mut out = String::from(r#"{"type":"gap","topic":"#);
        push_json_str(&mut out, self.topic);
        out.push_str(r#","since":"#);
        push_json_str(&mut out, self.since);
        out.push_str(r#","reason":""#);
        out.push_str(self.reason.as_str());
        out.push_str("\"}");
        out
    }
}

/// A long-poll answer: `{"messages":[m1,m2],"cursor":"..."[,"gaps":[g1]]}` and a newline, from
/// envelope JSON texts and gap notice JSON texts. `cursor` is the id to poll from next.
pub fn poll_body<'m>(
    messages: impl Iterator<Item = &'m [u8]>,
    cursor: &str,
    gaps: &[String],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(br#"{"messages":["#);
    for (i, m) in messages.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m);
    }
    let mut tail = String::from(r#"],"cursor":"#);
    push_json_str(&mut tail, cursor);
    if !gaps.is_empty() {
        tail.push_str(r#","gaps":["#);
        tail.push_str(&gaps.join(","));
        tail.push(']');
    }
    tail.push_str("}\n");
    out.extend_from_slice(tail.as_bytes());
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn env<'a>(kind: DataKind, event: Option<&'a str>, payload: &'a [u8]) -> Envelope<'a> {
        Envelope {
            topic: "t",
            id: "ep-7",
            delta: None,
            event,
            kind,
            payload,
            tags: &[],
        }
    }

    #[test]
    fn tags_ride_in_the_envelope() {
        let tags = [
            ("a".to_owned(), "1".to_owned()),
            ("b\"".to_owned(), "x".to_owned()),
        ];
        let e = Envelope {
            tags: &tags,
            ..env(DataKind::Text, None, b"d")
        };
        assert_eq!(
            e.to_json(),
            r#"{"type":"message","topic":"t","id":"ep-7","tags":{"a":"1","b\"":"x"},"data":"d"}"#
        );
    }

    #[test]
    fn envelope_escapes_and_encodes() {
        let text = env(DataKind::Text, None, "a\"b\n".as_bytes()).to_json();
        assert_eq!(
            text,
            r#"{"type":"message","topic":"t","id":"ep-7","data":"a\"b\n"}"#
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["data"], "a\"b\n");
        let bin = env(DataKind::Binary, Some("blob"), &[0, 1, 255]).to_json();
        assert_eq!(
            bin,
            r#"{"type":"message","topic":"t","id":"ep-7","event":"blob","encoding":"base64","data":"AAH/"}"#
        );
    }

    #[test]
    fn a_delta_envelope_names_its_base_after_the_id() {
        let d = Envelope {
            delta: Some("ep-6"),
            ..env(DataKind::Text, Some("px"), b"3\n1@0,")
        };
        assert_eq!(
            d.to_json(),
            r#"{"type":"message","topic":"t","id":"ep-7","delta":"ep-6","event":"px","data":"3\n1@0,"}"#
        );
    }

    #[test]
    fn json_strings_escape_controls_and_keep_unicode() {
        let mut s = String::new();
        push_json_str(&mut s, "é\u{1}\\\t/");
        assert_eq!(s, r#""é\u0001\\\t/""#);
    }

    #[test]
    fn gap_json() {
        let g = GapNotice {
            topic: "a",
            since: "x-1",
            reason: GapReason::Trimmed,
        };
        assert_eq!(
            g.to_json(),
            r#"{"type":"gap","topic":"a","since":"x-1","reason":"trimmed"}"#
        );
        let g = GapNotice {
            topic: "a",
            since: "\"",
            reason: GapReason::Epoch,
        };
        assert_eq!(
            g.to_json(),
            r#"{"type":"gap","topic":"a","since":"\"","reason":"epoch"}"#
        );
    }

    #[test]
    fn poll_bodies() {
        assert_eq!(
            poll_body(std::iter::empty(), "e-0", &[]),
            b"{\"messages\":[],\"cursor\":\"e-0\"}\n"
        );
        let msgs: [&[u8]; 2] = [b"{\"a\":1}", b"{\"b\":2}"];
        let gaps = vec!["{\"g\":1}".to_owned(), "{\"g\":2}".to_owned()];
        assert_eq!(
            String::from_utf8(poll_body(msgs.into_iter(), "e-9", &gaps)).unwrap(),
            "{\"messages\":[{\"a\":1},{\"b\":2}],\"cursor\":\"e-9\",\"gaps\":[{\"g\":1},{\"g\":2}]}\n"
        );
    }
}
