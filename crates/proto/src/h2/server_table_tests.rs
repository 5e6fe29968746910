//! The HPACK dynamic table of a connection that advertises a table of zero: the client's
//! default table until it acknowledges this side's SETTINGS, nothing kept after that; and what
//! an idle connection of one stream allocates.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::h2::frame::{write_headers, write_settings, write_settings_ack};
use crate::h2::stream::Streams;

/// A literal field with incremental indexing and a new name (RFC 7541 §6.2.1), raw strings.
fn indexed_literal(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0x40);
    for s in [name, value] {
        assert!(s.len() < 127);
        block.push(s.len() as u8);
        block.extend_from_slice(s.as_bytes());
    }
}

/// `GET /a` with `user-agent` and `cookie` as a browser sends them: added to the table.
fn indexing_get() -> Vec<u8> {
    let mut block = vec![0x82, 0x87, 0x84, 0x01, 0x01, b'x'];
    indexed_literal(&mut block, "user-agent", "a-browser/1.0");
    indexed_literal(&mut block, "cookie", "session=0123456789abcdef");
    block
}

/// `GET /` referring to the two newest table entries (62 and 63).
fn referring_get() -> Vec<u8> {
    vec![0x82, 0x87, 0x84, 0x01, 0x01, b'x', 0x80 | 62, 0x80 | 63]
}

/// Feeds `input`; the requests' heads as text, and the connection error if any.
fn feed(c: &mut Connection, input: &[u8]) -> (Vec<String>, Option<Fatal>) {
    let mut out = Vec::new();
    let mut events = Vec::new();
    let res = c.receive(input, &mut out, &mut events);
    let heads = events
        .iter()
        .filter_map(|e| match e {
            Event::Request { request, .. } => Some(String::from_utf8_lossy(&request.head).into()),
            Event::Data { .. } | Event::Reset { .. } => None,
        })
        .collect();
    (heads, res.err())
}

/// Settings advertising a table of zero (`h2_header_table = 0`).
fn zero() -> Settings {
    Settings {
        header_table: 0,
        ..Settings::default()
    }
}

/// A connection that took the preface, the client's SETTINGS and a first indexing request on
/// stream 1, and did not see an acknowledgement yet.
fn before_ack() -> Connection {
    let mut c = Connection::new(zero());
    let mut v = PREFACE.to_vec();
    write_settings(&mut v, &[]);
    write_headers(&mut v, 1, &indexing_get(), true, 16_384);
    let (heads, err) = feed(&mut c, &v);
    assert!(err.is_none());
    assert!(heads[0].contains("user-agent: a-browser/1.0"), "{heads:?}");
    assert!(!c.decoder.is_empty(), "the default table holds the fields");
    c
}

#[test]
fn this_side_advertises_a_table_of_zero() {
    let mut out = Vec::new();
    Connection::new(zero()).start(&mut out);
    // SETTINGS_HEADER_TABLE_SIZE (1) = 0 among the settings.
    let payload = &out[9..];
    assert!(
        payload.chunks(6).any(|s| s == [0, 1, 0, 0, 0, 0]),
        "{payload:?}"
    );
}

#[test]
fn before_the_acknowledgement_the_client_s_entries_are_referred_to() {
    let mut c = before_ack();
    let mut v = Vec::new();
    write_headers(&mut v, 3, &referring_get(), true, 16_384);
    let (heads, err) = feed(&mut c, &v);
    assert!(err.is_none(), "{err:?}");
    assert!(
        heads[0].contains("cookie: session=0123456789abcdef"),
        "{heads:?}"
    );
    assert!(heads[0].contains("user-agent: a-browser/1.0"), "{heads:?}");
}

#[test]
fn the_acknowledgement_frees_the_table_and_the_next_block_starts_empty() {
    let mut c = before_ack();
    let mut v = Vec::new();
    write_settings_ack(&mut v);
    assert_eq!(feed(&mut c, &v), (vec![], None));
    assert!(
        c.decoder.is_empty(),
        "the entries are freed at the acknowledgement"
    );
    assert_eq!(c.decoder.table_size(), 0);
    // The client's next block starts with its size update to 0 (§4.2), then indexes nothing.
    let mut block = vec![0x20];
    block.extend(indexing_get());
    let mut v = Vec::new();
    write_headers(&mut v, 3, &block, true, 16_384);
    let (heads, err) = feed(&mut c, &v);
    assert!(err.is_none(), "{err:?}");
    assert!(
        heads[0].contains("cookie: session=0123456789abcdef"),
        "{heads:?}"
    );
    assert!(c.decoder.is_empty(), "nothing is added to a table of zero");
    // A second acknowledgement (none was asked for) changes nothing.
    let mut v = Vec::new();
    write_settings_ack(&mut v);
    assert_eq!(feed(&mut c, &v), (vec![], None));
}

#[test]
fn after_the_acknowledgement_a_reference_or_a_larger_size_is_a_compression_error() {
    for block in [referring_get(), {
        let mut b = vec![0x3f, 0xe1, 0x1f]; // a size update to 4,096
        b.extend(indexing_get());
        b
    }] {
        let mut c = before_ack();
        let mut v = Vec::new();
        write_settings_ack(&mut v);
        write_headers(&mut v, 3, &block, true, 16_384);
        let (_, err) = feed(&mut c, &v);
        assert_eq!(err.map(|f| f.code), Some(ErrorCode::CompressionError));
    }
}

/// `c` parked and restored, then sent a request referring to the table: the restored
/// connection, the requests' heads and the connection error if any.
fn moved_then_referring(c: &Connection) -> (Connection, Vec<String>, Option<Fatal>) {
    let mut parked = Vec::new();
    c.park(&mut parked);
    let mut moved = Connection::restore(&parked).unwrap();
    let mut v = Vec::new();
    write_headers(&mut v, 3, &referring_get(), true, 16_384);
    let (heads, err) = feed(&mut moved, &v);
    (moved, heads, err)
}

#[test]
fn a_connection_parked_before_or_after_the_acknowledgement_continues_alike() {
    let mut c = before_ack();
    let (_, heads, err) = moved_then_referring(&c);
    assert!(
        err.is_none() && heads[0].contains("cookie: session="),
        "{err:?} {heads:?}"
    );

    let mut v = Vec::new();
    write_settings_ack(&mut v);
    feed(&mut c, &v);
    let (moved, _, err) = moved_then_referring(&c);
    assert!(moved.decoder.is_empty());
    assert_eq!(err.map(|f| f.code), Some(ErrorCode::CompressionError));
}

#[test]
fn a_connection_parked_by_a_version_that_advertised_the_default_table_keeps_it() {
    // What an older binary parked: it advertised 4,096 (so sent no setting) and its client
    // filled the table.
    let mut c = Connection::new(Settings {
        header_table: 4_096,
        ..Settings::default()
    });
    let mut v = PREFACE.to_vec();
    write_settings(&mut v, &[]);
    write_headers(&mut v, 1, &indexing_get(), true, 16_384);
    write_settings_ack(&mut v);
    feed(&mut c, &v);
    let (_, heads, err) = moved_then_referring(&c);
    assert!(
        err.is_none() && heads[0].contains("cookie: session="),
        "{err:?} {heads:?}"
    );
}

#[test]
fn an_idle_connection_of_one_stream_allocates_little() {
    let mut c = before_ack();
    let mut v = Vec::new();
    write_settings_ack(&mut v);
    feed(&mut c, &v);
    assert!(
        matches!(c.streams, Streams::One(_)),
        "the one stream inline"
    );
    assert!(
        c.closed.is_none(),
        "no stream closed yet: no ring of closed ids"
    );
    assert!(c.decoder.is_empty());
    assert!(
        c.passing.is_none(),
        "the preface's SETTINGS and a request in one HEADERS leave nothing passing"
    );
    // The whole state, kept by the server in its pool, with its stream: it was 240 bytes
    // plus a list with room for four streams (224), with the ring of closed ids and the
    // table inline; then 176, with the windows in 64 bits and what passes inline.
    assert!(
        std::mem::size_of::<Connection>() <= 128,
        "{}",
        std::mem::size_of::<Connection>()
    );
}

#[test]
fn by_default_the_protocol_s_table_is_kept_and_not_advertised() {
    let mut out = Vec::new();
    let mut c = Connection::new(Settings::default());
    c.start(&mut out);
    assert!(!out[9..].chunks(6).any(|s| s[..2] == [0, 1]), "{out:?}");
    let mut v = PREFACE.to_vec();
    write_settings(&mut v, &[]);
    write_headers(&mut v, 1, &indexing_get(), true, 16_384);
    write_settings_ack(&mut v);
    write_headers(&mut v, 3, &referring_get(), true, 16_384);
    let (heads, err) = feed(&mut c, &v);
    assert!(err.is_none(), "{err:?}");
    assert!(heads[1].contains("cookie: session="), "{heads:?}");
}
