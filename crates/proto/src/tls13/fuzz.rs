//! The body of the `tls_records` fuzz target: it lives here so that a unit test runs it over
//! the committed seeds (fuzz/seeds/tls_records) on every `cargo test`, with or without a
//! nightly toolchain. Not part of the record layer's API.
//!
//! Input: one mode byte, then either raw bytes opened as records (mode bit 7 clear) or a
//! script of records that a peer seals with the connection's real keys first (bit 7 set), so
//! that the inner content types, alerts, padding and KeyUpdates are reached too.
//! - bits 0-1: the cipher suite (0 and 3: AES-128-GCM with RFC 8448's §3 secrets, so its
//!   published records open; 1: AES-256-GCM; 2: ChaCha20-Poly1305).
//! - bit 2: tiny key limits, so that exhaustion and forced key updates happen.
//! - bits 3-4: how the input is cut before it is fed (whole, 1, 7 or 100 bytes at a time).

use super::keys::{CipherSuite, SecretSchedule, TrafficSecret};
use super::limits::KeyLimits;
use super::records::Records;
use super::wire::{ContentType, KeyUpdateRequest};

/// Small enough that a short input reaches both limits.
static TINY: KeyLimits = KeyLimits {
    aes_gcm_full_records: 2,
    records: 6,
};

/// RFC 8448 §3: the client's and the server's application traffic secrets.
const RFC8448_CLIENT: [u8; 32] = [
    0x9e, 0x40, 0x64, 0x6c, 0xe7, 0x9a, 0x7f, 0x9d, 0xc0, 0x5a, 0xf8, 0x88, 0x9b, 0xce, 0x65, 0x52,
    0x87, 0x5a, 0xfa, 0x0b, 0x06, 0xdf, 0x00, 0x87, 0xf7, 0x92, 0xeb, 0xb7, 0xc1, 0x75, 0x04, 0xa5,
];
const RFC8448_SERVER: [u8; 32] = [
    0xa1, 0x1a, 0xf9, 0xf0, 0x55, 0x31, 0xf8, 0x56, 0xad, 0x47, 0x11, 0x6b, 0x45, 0xa9, 0x50, 0x32,
    0x82, 0x04, 0xb4, 0xf4, 0x4b, 0xfb, 0x6b, 0x3a, 0x4b, 0x4f, 0x1f, 0x3f, 0xcb, 0x63, 0x16, 0x43,
];

/// A server and a client sharing keys: (server, client).
fn pair(
    suite: CipherSuite,
    limits: &'static KeyLimits,
) -> Option<(Records<SecretSchedule>, Records<SecretSchedule>)> {
    let (client, server) = match suite {
        CipherSuite::Aes128GcmSha256 => (RFC8448_CLIENT.to_vec(), RFC8448_SERVER.to_vec()),
        _ => (vec![0xc1; suite.hash_len()], vec![0x5e; suite.hash_len()]),
    };
    let client = TrafficSecret::new(suite, &client).ok()?;
    let server = TrafficSecret::new(suite, &server).ok()?;
    let side = |send: &TrafficSecret, receive: &TrafficSecret| {
        let schedule = SecretSchedule::new(suite, send.clone(), receive.clone());
        let (s, _) = schedule.keys().ok()?;
        Some(Records::new(suite, schedule, (s, 0), 0).with_limits(limits))
    };
    Some((side(&server, &client)?, side(&client, &server)?))
}

/// Has `peer` seal the records `script` describes; returns the bytes on the wire.
/// Each step: a control byte (bit 7: a KeyUpdate, bit 6 of it: requested; else bits 0-1
/// the content type), a length, a padding length, then that many content bytes.
fn seal_script(peer: &mut Records<SecretSchedule>, mut script: &[u8]) -> Vec<u8> {
    let mut wire = Vec::new();
    while let Some((&op, rest)) = script.split_first() {
        script = rest;
        if op & 0x80 != 0 {
            let request = if op & 0x40 != 0 {
                KeyUpdateRequest::Requested
            } else {
                KeyUpdateRequest::NotRequested
            };
            let _ = peer.update_send_key(request, &mut wire);
            continue;
        }
        let kind = match op & 3 {
            0 => ContentType::ApplicationData,
            1 => ContentType::Alert,
            2 => ContentType::Handshake,
            _ => ContentType::ChangeCipherSpec,
        };
        let (len, padding) = match script {
            [len, padding, ..] => (usize::from(*len), usize::from(*padding)),
            _ => (0, 0),
        };
        script = script.get(2..).unwrap_or_default();
        let take = len.min(script.len());
        let (content, rest) = script.split_at(take);
        script = rest;
        let _ = peer.seal_record(kind, content, padding, &mut wire);
    }
    wire
}

/// Opens `wire` the way the server does: fed in pieces of `step`, a partial record kept and
/// joined to the next piece. Checks that nothing is consumed beyond what was given.
fn feed(
    to: &mut Records<SecretSchedule>,
    wire: &[u8],
    step: usize,
    answers: &mut Vec<u8>,
) -> Vec<u8> {
    let mut plain = Vec::new();
    let mut partial: Vec<u8> = Vec::new();
    for piece in wire.chunks(step.max(1)) {
        partial.extend_from_slice(piece);
        match to.open(&mut partial, &mut plain) {
            Ok(read) => {
                assert!(read.used <= partial.len(), "consumed more than given");
                partial.drain(..read.used);
            }
            Err(e) => {
                to.fatal_alert(&e, answers);
                break;
            }
        }
    }
    assert!(plain.len() <= wire.len(), "more plaintext than ciphertext");
    plain
}

/// The fuzz target's body. Must never panic.
pub fn open_arbitrary(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let suite = match mode & 3 {
        1 => CipherSuite::Aes256GcmSha384,
        2 => CipherSuite::Chacha20Poly1305Sha256,
        _ => CipherSuite::Aes128GcmSha256,
    };
    let limits = if mode & 4 != 0 {
        &TINY
    } else {
        &KeyLimits::RFC8446
    };
    let step = match mode >> 3 & 3 {
        0 => usize::MAX,
        1 => 1,
        2 => 7,
        _ => 100,
    };
    let Some((mut server, mut client)) = pair(suite, limits) else {
        return;
    };
    let wire = if mode & 0x80 != 0 {
        seal_script(&mut client, rest)
    } else {
        rest.to_vec()
    };
    let mut answers = Vec::new();
    let _ = feed(&mut server, &wire, step, &mut answers);
    // Whatever the server answered (an alert) must be readable by the client, and so must its
    // data after it, led by the KeyUpdate the client may have asked for.
    let mut ignored = Vec::new();
    let _ = feed(&mut client, &answers, step, &mut ignored);
    let mut out = Vec::new();
    let _ = server.seal(rest, &mut out);
    server.close_notify(&mut out);
    let _ = feed(&mut client, &out, usize::MAX, &mut ignored);
}
