//! Message ids and SSE encoding. A string that parses as an id prints back to itself; SSE events
//! built from any payload keep every line inside one `data:` field (no field injection through
//! CR or LF), and the payload's lines survive in order.
#![no_main]

use clarion_proto::{event_id, sse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(id) = event_id::parse(s) {
            assert_eq!(id.to_string(), s);
            assert!(event_id::is_epoch(id.epoch));
        }
    }
    let mut out = Vec::new();
    sse::write_event(&mut out, Some("e-1"), None, data);
    assert!(out.ends_with(b"\n\n"));
    let body = &out[..out.len() - 1];
    let mut lines: Vec<&[u8]> = body.split(|&b| b == b'\n').collect();
    lines.pop(); // after the last LF
    assert_eq!(lines.first().copied(), Some(&b"id: e-1"[..]));
    let data_lines: Vec<&[u8]> = lines[1..]
        .iter()
        .map(|l| l.strip_prefix(b"data: ").expect("every other line is a data field"))
        .collect();
    assert!(data_lines.iter().all(|l| !l.contains(&b'\r')));
    // Joined with LF, the data lines are the payload with CRLF and CR turned into LF.
    let joined = data_lines.join(&b'\n');
    let mut normalised = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        match data[i] {
            b'\r' if data.get(i + 1) == Some(&b'\n') => {
                normalised.push(b'\n');
                i += 2;
                continue;
            }
            b'\r' => normalised.push(b'\n'),
            b => normalised.push(b),
        }
        i += 1;
    }
    assert_eq!(joined, normalised);
});
