//! The Pusher HTTP API's signed requests (`clarion_proto::pusher::signed_request`) and trigger
//! bodies (`trigger`): a query and body from the network never panic; a request signed with
//! the right secret verifies, and the same request never verifies under another secret or
//! outside the timestamp window.
#![no_main]

use clarion_proto::pusher::signed_request::{sign_query, SignedQuery, MAX_SKEW_SECS};
use clarion_proto::pusher::trigger::{decode_batch, decode_event};
use clarion_proto::pusher::Limits;
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
    // The first line is the query, the rest the body.
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let (query, body) = data.split_at(split);
    let body = body.get(1..).unwrap_or_default();
    let limits = Limits::default();
    let _ = decode_event(body, &limits);
    let _ = decode_batch(body, &limits);
    let Ok(query) = std::str::from_utf8(query) else {
        return;
    };
    if let Ok(q) = SignedQuery::parse(query) {
        let _ = q.verify("POST", "/apps/1/events", body, "key", b"secret", NOW);
    }
    // A request signed by a library: accepted with its secret, refused otherwise.
    let signed = sign_query("POST", "/apps/1/events", &[], body, "key", b"secret", NOW);
    let q = SignedQuery::parse(&signed).expect("a signed query parses");
    assert!(q.verify("POST", "/apps/1/events", body, "key", b"secret", NOW).is_ok());
    assert!(q.verify("POST", "/apps/1/events", body, "key", b"other", NOW).is_err());
    let late = NOW + MAX_SKEW_SECS + 1;
    assert!(q.verify("POST", "/apps/1/events", body, "key", b"secret", late).is_err());
});
