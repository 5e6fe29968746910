//! TLS 1.3 records: opening arbitrary bytes (or records a peer sealed from an arbitrary
//! script) must never panic, never consume more than it was given, and everything the
//! opener answers must be readable by the peer. The body is proto's, so that a unit test
//! runs it over seeds/tls_records too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    clarion_proto::tls13::fuzz::open_arbitrary(data);
});
