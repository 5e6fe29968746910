//! Server-Sent Events encoding, as the WHATWG HTML standard's `EventSource` parser reads it
//! ("Server-sent events", the event stream interpretation).
//!
//! An event is a block of `field: value` lines ended by an empty line. A payload is split at
//! every line break the parser recognises (CRLF, LF or a lone CR) into one `data:` line each; the
//! parser joins them back with LF, so LF-separated text round-trips exactly and CR or CRLF become
//! LF. A trailing line break survives as an empty last `data:` line.
//!
//! Field values written here never contain a line break: ids and event names are checked by the
//! caller (see [`is_field_safe`]).

/// Whether `value` may be written as an `id:` or `event:` value: no CR, LF or NUL (a NUL in an id
/// makes browsers ignore the field).
pub fn is_field_safe(value: &str) -> bool {
    !value.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0))
}

/// Appends one event: optional `id:` and `event:` fields, then `data`, then the blank line that
/// dispatches it. Callers pass field values that satisfy [`is_field_safe`].
///
/// An empty `data` is written as one empty `data:` line, which clients dispatch as an event with
/// empty data (the data buffer holds one LF until dispatch, so it is not empty).
pub fn write_event(out: &mut Vec<u8>, id: Option<&str>, event: Option<&str>, data: &[u8]) {
    out.reserve(data.len() + 32);
    if let Some(id) = id {
        field(out, b"id", id.as_bytes());
    }
    if let Some(event) = event {
        field(out, b"event", event.as_bytes());
    }
    let mut rest = data;
    loop {
        match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            None => {
                field(out, b"data", rest);
                break;
            }
            Some(i) => {
                field(out, b"data", rest.get(..i).unwrap_or_default());
                let skip = if rest.get(i) == Some(&b'\r') && rest.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = rest.get(i + skip..).unwrap_or_default();
            }
        }
    }
    out.push(b'\n');
}

/// Appends a comment line (`: text`), which clients ignore; used as a keep-alive.
pub fn write_comment(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(b": ");
    out.extend_from_slice(text.replace(['\r', '\n'], " ").as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Appends a `retry:` hint: how many milliseconds the client should wait before reconnecting.
pub fn write_retry(out: &mut Vec<u8>, millis: u64) {
    out.extend_from_slice(format!("retry: {millis}\n\n").as_bytes());
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.push(b'\n');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A small model of the standard's parser: returns (last id, event type, data) per
    /// dispatched event.
    fn parse(stream: &[u8]) -> Vec<(String, String, String)> {
        let text = String::from_utf8(stream.to_vec()).unwrap();
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
        let mut out = Vec::new();
        for line in text.split('\n') {
            if line.is_empty() {
                if !data.is_empty() {
                    data.pop();
                    let ev = if event.is_empty() {
                        "message".into()
                    } else {
                        event.clone()
                    };
                    out.push((id.clone(), ev, data.clone()));
                }
                data.clear();
                event.clear();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match name {
                "id" => id = value.into(),
                "event" => event = value.into(),
                "data" => {
                    data.push_str(value);
                    data.push('\n');
                }
                _ => {}
            }
        }
        out
    }

    #[test]
    fn payloads_round_trip_through_the_standard_parser() {
        for payload in [
            "x",
            "a\nb",
            "a\n",
            "\n\nz",
            " leading space",
            "a:b: c",
            "{\"k\":1}",
        ] {
            let mut out = Vec::new();
            write_event(&mut out, Some("e-1"), Some("price"), payload.as_bytes());
            let got = parse(&out);
            assert_eq!(
                got,
                vec![("e-1".into(), "price".into(), payload.into())],
                "{payload:?}"
            );
        }
    }

    #[test]
    fn cr_and_crlf_become_lf() {
        let mut out = Vec::new();
        write_event(&mut out, None, None, b"a\r\nb\rc");
        assert_eq!(out, b"data: a\ndata: b\ndata: c\n\n");
        assert_eq!(parse(&out)[0].2, "a\nb\nc");
    }

    #[test]
    fn comments_and_retry_dispatch_nothing() {
        let mut out = Vec::new();
        write_retry(&mut out, 2000);
        write_comment(&mut out, "keep\nalive");
        assert_eq!(out, b"retry: 2000\n\n: keep alive\n\n");
        assert!(parse(&out).is_empty());
    }

    #[test]
    fn empty_payload_is_an_event_with_empty_data() {
        let mut out = Vec::new();
        write_event(&mut out, Some("e-2"), None, b"");
        assert_eq!(out, b"id: e-2\ndata: \n\n");
        assert_eq!(
            parse(&out),
            vec![("e-2".into(), "message".into(), String::new())]
        );
    }

    #[test]
    fn random_payloads_round_trip_with_line_breaks_normalised() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet = b"ab \r\n:";
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 12) as usize;
            let payload: Vec<u8> = (0..len)
                .map(|i| alphabet[((x >> (i * 5)) % alphabet.len() as u64) as usize])
                .collect();
            let mut out = Vec::new();
            write_event(&mut out, Some("e-9"), None, &payload);
            let text = String::from_utf8(payload.clone()).unwrap();
            let want = text.replace("\r\n", "\n").replace('\r', "\n");
            let got = parse(&out);
            assert_eq!(
                got,
                vec![("e-9".into(), "message".into(), want)],
                "{payload:?}"
            );
        }
    }

    #[test]
    fn unsafe_field_values_are_detected() {
        assert!(is_field_safe("abc-12"));
        assert!(!is_field_safe("a\nb"));
        assert!(!is_field_safe("a\rb"));
        assert!(!is_field_safe("a\0b"));
    }
}
