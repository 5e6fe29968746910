//! The record layer end to end: RFC 8448's published records, a client and a server talking
//! through key updates, every refusal with its alert, and the §5.5 limits reached with small
//! injected limits.
#![allow(clippy::unwrap_used)]

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey};

use super::keys::tests::{hex, rfc8448_secret, CLIENT_AP_SECRET, SERVER_AP_SECRET};
use super::limits::FULL_RECORD_WEIGHT;
use super::*;

type Side = Records<SecretSchedule>;
const SUITE: CipherSuite = CipherSuite::Aes128GcmSha256;

// RFC 8448 §3: the records after the handshake. The server's first application-data record
// has sequence number 1 (its NewSessionTicket went first under the same key).
/// {client} send application_data record: complete record (72 octets).
const CLIENT_APP_RECORD: &str = "17 03 03 00 43 a2 3f 70 54 b6 2c 94 d0 af fa fe 82 28 ba 55 cb
    ef ac ea 42 f9 14 aa 66 bc ab 3f 2b 98 19 a8 a5 b4 6b 39 5b d5 4a 9a 20 44 1e 2b 62 97 4e
    1f 5a 62 92 a2 97 70 14 bd 1e 3d ea e6 3a ee bb 21 69 49 15 e4";
/// {server} send application_data record: complete record (72 octets).
const SERVER_APP_RECORD: &str = "17 03 03 00 43 2e 93 7e 11 ef 4a c7 40 e5 38 ad 36 00 5f c4
    a4 69 32 fc 32 25 d0 5f 82 aa 1b 36 e3 0e fa f9 7d 90 e6 df fc 60 2d cb 50 1a 59 a8 fc c4
    9c 4b f2 e5 f0 a2 1c 00 47 c2 ab f3 32 54 0d d0 32 e1 67 c2 95 5d";
/// {client} send alert record (close_notify): complete record (24 octets).
const CLIENT_CLOSE_RECORD: &str =
    "17 03 03 00 13 c9 87 27 60 65 56 66 b7 4d 7f f1 15 3e fd 6d b6 d0 b0 e3";
/// {server} send alert record (close_notify): complete record (24 octets).
const SERVER_CLOSE_RECORD: &str =
    "17 03 03 00 13 b5 8f d6 71 66 eb f5 99 d2 47 20 cf be 7e fa 7a 88 64 a9";

/// The 50-byte payload both sides send: 00 01 .. 31.
fn payload() -> Vec<u8> {
    (0..50).collect()
}

/// One side: the server has sent one record (the ticket), which the client has read.
fn side(send: &str, receive: &str, limits: &'static KeyLimits) -> Side {
    let schedule = SecretSchedule::new(SUITE, rfc8448_secret(send), rfc8448_secret(receive));
    let (s, _) = schedule.keys().unwrap();
    let (send_seq, receive_seq) = if send == SERVER_AP_SECRET {
        (1, 0)
    } else {
        (0, 1)
    };
    Records::new(SUITE, schedule, (s, send_seq), receive_seq).with_limits(limits)
}

/// (server, client) at the start of RFC 8448's application data.
fn pair_with(limits: &'static KeyLimits) -> (Side, Side) {
    (
        side(SERVER_AP_SECRET, CLIENT_AP_SECRET, limits),
        side(CLIENT_AP_SECRET, SERVER_AP_SECRET, limits),
    )
}

fn pair() -> (Side, Side) {
    pair_with(&KeyLimits::RFC8446)
}

/// Opens everything in `wire`: (plaintext, outcome).
fn open(to: &mut Side, wire: &[u8]) -> Result<(Vec<u8>, Read), RecordError> {
    let mut plain = Vec::new();
    let mut buf = wire.to_vec();
    let read = to.open(&mut buf, &mut plain)?;
    Ok((plain, read))
}

#[test]
fn rfc8448_client_record_seals_and_opens() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    client.seal(&payload(), &mut wire).unwrap();
    assert_eq!(wire, hex(CLIENT_APP_RECORD));
    let (plain, read) = open(&mut server, &wire).unwrap();
    assert_eq!(plain, payload());
    assert!(!server.owes_key_update());
    assert_eq!(read.used, 72);
}

#[test]
fn rfc8448_server_record_seals_and_opens() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    server.seal(&payload(), &mut wire).unwrap();
    assert_eq!(wire, hex(SERVER_APP_RECORD));
    assert_eq!(open(&mut client, &wire).unwrap().0, payload());
    // Then each side's close_notify, as §3 ends.
    let mut wire = Vec::new();
    server.close_notify(&mut wire);
    assert_eq!(wire, hex(SERVER_CLOSE_RECORD));
    assert!(open(&mut client, &wire).unwrap().1.peer_closed);
}

#[test]
fn rfc8448_client_close_notify() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    client.seal(&payload(), &mut wire).unwrap();
    let start = wire.len();
    client.close_notify(&mut wire);
    assert_eq!(wire[start..], hex(CLIENT_CLOSE_RECORD));
    let (plain, read) = open(&mut server, &wire).unwrap();
    assert_eq!(plain, payload());
    assert!(read.peer_closed);
    assert_eq!(read.used, wire.len());
}

#[test]
fn partial_records_wait_for_the_rest() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    client.seal(b"first", &mut wire).unwrap();
    let first = wire.len();
    client.seal(b"second", &mut wire).unwrap();
    for cut in [0, 1, 4, 5, first - 1] {
        let (mut s, _) = pair();
        let (plain, read) = open(&mut s, &wire[..cut]).unwrap();
        assert_eq!((plain.len(), read.used), (0, 0), "cut at {cut}");
    }
    let (plain, read) = open(&mut server, &wire[..first + 3]).unwrap();
    assert_eq!((plain.as_slice(), read.used), (&b"first"[..], first));
    let (plain, read) = open(&mut server, &wire[first..]).unwrap();
    assert_eq!(
        (plain.as_slice(), read.used),
        (&b"second"[..], wire.len() - first)
    );
}

#[test]
fn padding_and_large_writes_round_trip() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    client
        .seal_record(ContentType::ApplicationData, b"padded", 300, &mut wire)
        .unwrap();
    let big = vec![7u8; 40_000];
    client.seal(&big, &mut wire).unwrap();
    let (plain, _) = open(&mut server, &wire).unwrap();
    assert_eq!(&plain[..6], b"padded");
    assert_eq!(plain[6..], big[..]);
    // Content plus padding may not pass 2^14 + 1 bytes.
    assert_eq!(
        client.seal_record(ContentType::ApplicationData, &[1; 16_000], 400, &mut wire),
        Err(RecordError::Overflow)
    );
}

/// A record sealed with `key` at `seq` around arbitrary inner bytes, outside the record layer.
fn raw_record(key: &TrafficKey, seq: u64, outer: u8, inner: &[u8]) -> Vec<u8> {
    let aead = LessSafeKey::new(UnboundKey::new(SUITE.aead(), key.key()).unwrap());
    let mut nonce = *key.iv();
    for (b, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    let len = (inner.len() + 16) as u16;
    let header = [outer, 3, 3, (len >> 8) as u8, len as u8];
    let mut body = inner.to_vec();
    aead.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(header),
        &mut body,
    )
    .unwrap();
    [&header[..], &body].concat()
}

fn client_key() -> TrafficKey {
    TrafficKey::derive(SUITE, &rfc8448_secret(CLIENT_AP_SECRET)).unwrap()
}

/// What the server answers when it opens `wire`: the error and the alert the client reads.
fn refusal(wire: &[u8]) -> (RecordError, Option<RecordError>) {
    let (mut server, mut client) = pair();
    let e = open(&mut server, wire).unwrap_err();
    let mut alert = Vec::new();
    server.fatal_alert(&e, &mut alert);
    let seen = if alert.is_empty() {
        None
    } else {
        Some(open(&mut client, &alert).unwrap_err())
    };
    (e, seen)
}

fn fatal(d: AlertDescription) -> Option<RecordError> {
    Some(RecordError::PeerAlert(Alert::fatal(d)))
}

#[test]
fn refusals_carry_the_right_alert() {
    use AlertDescription as D;
    let key = client_key();
    let mut tampered = hex(CLIENT_APP_RECORD);
    tampered[30] ^= 1;
    let cases: Vec<(Vec<u8>, RecordError, AlertDescription)> = vec![
        (tampered, RecordError::BadMac, D::BadRecordMac),
        (
            vec![23, 3, 3, 0, 16].into_iter().chain([0; 16]).collect(),
            RecordError::BadMac,
            D::BadRecordMac,
        ),
        (
            vec![23, 3, 3, 0x41, 1],
            RecordError::Overflow,
            D::RecordOverflow,
        ),
        (
            vec![22, 3, 3, 0, 1, 1],
            RecordError::UnexpectedType(22),
            D::UnexpectedMessage,
        ),
        (
            vec![20, 3, 3, 0, 1, 1],
            RecordError::UnexpectedType(20),
            D::UnexpectedMessage,
        ),
        (vec![23, 9, 9, 0, 1, 1], RecordError::NotTls, D::DecodeError),
        (
            raw_record(&key, 0, 23, &[0; 9]),
            RecordError::NoContentType,
            D::UnexpectedMessage,
        ),
        (
            raw_record(&key, 0, 23, b"x\x18"),
            RecordError::UnexpectedType(24),
            D::UnexpectedMessage,
        ),
        (
            raw_record(&key, 0, 23, b"\x01\x14"),
            RecordError::UnexpectedType(20),
            D::UnexpectedMessage,
        ),
        (
            raw_record(&key, 0, 23, b"\x01\x00\x00\x15"),
            RecordError::BadAlert,
            D::DecodeError,
        ),
        (
            raw_record(&key, 0, 23, &[b'x'; 16_386]),
            RecordError::Overflow,
            D::RecordOverflow,
        ),
        (
            raw_record(&key, 0, 23, b"\x16"),
            RecordError::UnexpectedHandshake,
            D::UnexpectedMessage,
        ),
        (
            // A NewSessionTicket from a client.
            raw_record(&key, 0, 23, b"\x04\x00\x00\x00\x16"),
            RecordError::UnexpectedHandshake,
            D::UnexpectedMessage,
        ),
        (
            raw_record(&key, 0, 23, b"\x18\x00\x00\x02\x00\x00\x16"),
            RecordError::BadKeyUpdateLength,
            D::DecodeError,
        ),
        (
            raw_record(&key, 0, 23, b"\x18\x00\x00\x01\x02\x16"),
            RecordError::BadKeyUpdate,
            D::IllegalParameter,
        ),
        (
            // Something after a KeyUpdate in the same record (§5.1).
            raw_record(&key, 0, 23, b"\x18\x00\x00\x01\x00\x18\x16"),
            RecordError::UnexpectedHandshake,
            D::UnexpectedMessage,
        ),
    ];
    for (i, (wire, error, alert)) in cases.into_iter().enumerate() {
        assert_eq!(refusal(&wire), (error, fatal(alert)), "case {i}");
    }
    // A peer's own fatal alert is reported, not answered.
    let wire = raw_record(&key, 0, 23, b"\x02\x50\x15");
    let peer = RecordError::PeerAlert(Alert::fatal(D::InternalError));
    assert_eq!(refusal(&wire), (peer, None));
}

#[test]
fn a_handshake_message_may_not_be_interleaved_with_data() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    client
        .seal_record(ContentType::Handshake, &[24, 0], 0, &mut wire)
        .unwrap();
    client.seal(b"data", &mut wire).unwrap();
    assert_eq!(
        open(&mut server, &wire).unwrap_err(),
        RecordError::UnexpectedHandshake
    );
}

#[test]
fn peer_key_update_requested_is_answered_and_followed() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    client
        .update_send_key(KeyUpdateRequest::Requested, &mut wire)
        .unwrap();
    client.seal(b"under the new key", &mut wire).unwrap();
    let (plain, _) = open(&mut server, &wire).unwrap();
    assert_eq!(plain, b"under the new key");
    assert!(server.owes_key_update());
    // The answer goes out under the old key, just before the reply under the new one.
    let mut wire = Vec::new();
    server.seal(b"reply", &mut wire).unwrap();
    assert_eq!(wire.len(), (5 + 5 + 1 + 16) + (5 + 5 + 1 + 16));
    assert!(!server.owes_key_update());
    let (plain, _) = open(&mut client, &wire).unwrap();
    assert_eq!(plain, b"reply");
    assert!(!client.owes_key_update(), "not_requested needs no answer");
    assert_eq!(server.usage().0.seq, 1, "one record under the new key");
    assert_eq!(server.usage().1.seq, 1);
}

/// Issue 38 (5): requests that arrive while we are silent, however many and however they are
/// cut, get one KeyUpdate, sent after everything already sealed under the old key (with the
/// next sequence numbers) and before our next data; the peer follows every step.
#[test]
fn many_update_requests_while_silent_get_one_answer_in_order() {
    for requests in [1usize, 20, 200] {
        for step in [usize::MAX, 1, 7, 27] {
            let why = format!("{requests} requests fed {step} bytes at a time");
            let (mut server, mut client) = pair();
            // Records the server sealed before the requests arrived, not yet read by the
            // client (say, still in the socket's buffer).
            let mut to_client = Vec::new();
            server.seal(b"before", &mut to_client).unwrap();
            let mut wire = Vec::new();
            for i in 0..requests {
                client
                    .update_send_key(KeyUpdateRequest::Requested, &mut wire)
                    .unwrap();
                client.seal(&[i as u8], &mut wire).unwrap();
            }
            let mut plain = Vec::new();
            let mut partial = Vec::new();
            for piece in wire.chunks(step) {
                partial.extend_from_slice(piece);
                let read = server.open(&mut partial, &mut plain).unwrap();
                partial.drain(..read.used);
            }
            assert!(partial.is_empty(), "{why}");
            let sent: Vec<u8> = (0..requests).map(|i| i as u8).collect();
            assert_eq!(plain, sent, "{why}");
            assert_eq!(server.usage().1.seq, 1, "{why}: the latest client key");
            assert!(server.owes_key_update(), "{why}");
            assert_eq!(server.usage().0.seq, 2, "{why}: ticket and 'before'");
            let mut wire = to_client;
            server.seal(b"after", &mut wire).unwrap();
            server.seal(b"more", &mut wire).unwrap();
            assert!(!server.owes_key_update(), "{why}");
            assert_eq!(
                server.usage().0.seq,
                2,
                "{why}: two records under the new key"
            );
            let (plain, _) = open(&mut client, &wire).unwrap();
            assert_eq!(plain, b"beforeaftermore", "{why}");
            assert_eq!(client.usage().1.seq, 2, "{why}: one update followed");
        }
    }
}

#[test]
fn a_key_update_split_across_records_is_reassembled() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    let msg = KeyUpdateRequest::NotRequested.message();
    client
        .seal_record(ContentType::Handshake, &msg[..1], 0, &mut wire)
        .unwrap();
    client
        .seal_record(ContentType::Handshake, &msg[1..4], 0, &mut wire)
        .unwrap();
    client
        .seal_record(ContentType::Handshake, &msg[4..], 0, &mut wire)
        .unwrap();
    // The client's record layer did not switch keys (it only sealed bytes): switch it.
    let mut ignore = Vec::new();
    let mut c2 = side(CLIENT_AP_SECRET, SERVER_AP_SECRET, &KeyLimits::RFC8446);
    c2.update_send_key(KeyUpdateRequest::NotRequested, &mut ignore)
        .unwrap();
    c2.seal(b"after", &mut wire).unwrap();
    drop(client);
    let (plain, _) = open(&mut server, &wire).unwrap();
    assert_eq!(plain, b"after");
    assert!(!server.owes_key_update());
}

#[test]
fn idle_connections_drop_their_expanded_keys_and_rebuild_them() {
    let (mut server, mut client) = pair();
    let mut wire = Vec::new();
    client.seal(b"one", &mut wire).unwrap();
    assert!(!client.compact(), "active since the last sweep: kept");
    assert!(client.compact(), "quiet for a whole sweep: dropped");
    assert!(!client.compact(), "nothing left to drop");
    client.seal(b"two", &mut wire).unwrap();
    assert_eq!(open(&mut server, &wire).unwrap().0, b"onetwo");
}

static SMALL_GCM: KeyLimits = KeyLimits {
    aes_gcm_full_records: 3,
    records: u64::MAX,
};

#[test]
fn the_writer_updates_its_key_before_the_aes_gcm_limit() {
    let (mut server, mut client) = pair_with(&SMALL_GCM);
    let full = vec![1u8; 16_384];
    let mut wire = Vec::new();
    for _ in 0..10 {
        server.seal(&full, &mut wire).unwrap();
        let (send, _) = server.usage();
        assert!(
            send.weight <= 3 * FULL_RECORD_WEIGHT,
            "never past the limit"
        );
    }
    // Each key carries two full records and a KeyUpdate (a third would leave no room for
    // the KeyUpdate); the first key had carried the ticket already, so it takes one.
    let (plain, _) = open(&mut client, &wire).unwrap();
    assert_eq!(plain.len(), 10 * 16_384);
    assert!(!client.owes_key_update(), "our updates ask for nothing");
    let updates = wire.len() - 10 * (5 + 16_384 + 1 + 16);
    assert_eq!(
        updates,
        5 * (5 + 5 + 1 + 16),
        "1 + 2 + 2 + 2 + 2 records: five KeyUpdates"
    );
    // Small records use the budget in proportion: many fit under one key.
    let (mut server, _) = pair_with(&SMALL_GCM);
    let mut wire = Vec::new();
    for _ in 0..1000 {
        server.seal(b"tick", &mut wire).unwrap();
    }
    assert_eq!(wire.len(), 1000 * (5 + 4 + 1 + 16), "no KeyUpdate needed");
}

/// A schedule whose next keys never come (as when the handshake library refuses); it keeps
/// the peer's current key.
pub(super) struct NoNextKeys(pub(super) TrafficKey);

impl KeySchedule for NoNextKeys {
    fn next_send_key(&mut self) -> Result<TrafficKey, KeyError> {
        Err(KeyError::Unavailable)
    }
    fn next_receive_key(&mut self) -> Result<TrafficKey, KeyError> {
        Err(KeyError::Unavailable)
    }
    fn receive_key(&self) -> Result<TrafficKey, KeyError> {
        Ok(self.0.clone())
    }
}

#[test]
fn without_a_next_key_the_writer_stops_before_the_limit_and_can_still_alert() {
    let key = client_key();
    let mut w =
        Records::new(SUITE, NoNextKeys(key.clone()), (key, 0), 0).with_limits(&SMALL_SEQUENCE);
    let mut wire = Vec::new();
    w.seal(b"a", &mut wire).unwrap();
    w.seal(b"b", &mut wire).unwrap();
    let e = w.seal(b"c", &mut wire).unwrap_err();
    assert_eq!(e, RecordError::KeyUpdate(KeyError::Unavailable));
    assert_eq!(w.usage().0.seq, 2, "nothing sent for the failed write");
    w.fatal_alert(&e, &mut wire);
    assert_eq!(w.usage().0.seq, 3, "the alert fits the reserve");
    w.close_notify(&mut wire);
    assert_eq!(w.usage().0.seq, 4);
    assert_eq!(
        w.seal_record(ContentType::Alert, &[1, 0], 0, &mut wire),
        Err(RecordError::KeyExhausted),
        "never past the limit"
    );
    assert_eq!(w.usage().0.seq, 4);
}

static SMALL_SEQUENCE: KeyLimits = KeyLimits {
    aes_gcm_full_records: u64::MAX,
    records: 4,
};

#[test]
fn the_sequence_number_never_reaches_its_limit() {
    let (mut server, mut client) = pair_with(&SMALL_SEQUENCE);
    let mut wire = Vec::new();
    for i in 0..10u8 {
        server.seal(&[i], &mut wire).unwrap();
        assert!(server.usage().0.seq <= 4);
    }
    let (plain, _) = open(&mut client, &wire).unwrap();
    assert_eq!(plain, (0..10).collect::<Vec<u8>>());
    // Two data records per key, then the KeyUpdate (the first key had sent the ticket, so
    // one): 10 records need 5 updates.
    assert_eq!(wire.len(), 10 * (5 + 1 + 1 + 16) + 5 * (5 + 5 + 1 + 16));
}

#[test]
fn a_peer_past_its_limit_is_refused() {
    // The client's sender does not know the server's small limit; three full records fit
    // the server's budget, the fourth does not.
    let (_, mut client) = pair();
    let mut server_small = side(SERVER_AP_SECRET, CLIENT_AP_SECRET, &SMALL_GCM);
    let mut wire = Vec::new();
    let full = vec![2u8; 16_384];
    for _ in 0..3 {
        client.seal(&full, &mut wire).unwrap();
    }
    assert_eq!(open(&mut server_small, &wire).unwrap().0.len(), 3 * 16_384);
    let mut more = Vec::new();
    client.seal(b"x", &mut more).unwrap();
    let e = open(&mut server_small, &more).unwrap_err();
    assert_eq!(e, RecordError::PeerKeyExhausted);
    assert_eq!(
        e.alert(),
        Some(Alert::fatal(AlertDescription::UnexpectedMessage))
    );
    // A peer that updates in time is fine.
    let mut server_small = side(SERVER_AP_SECRET, CLIENT_AP_SECRET, &SMALL_GCM);
    let (_, mut client) = pair();
    let mut wire = Vec::new();
    for _ in 0..2 {
        client.seal(&full, &mut wire).unwrap();
    }
    client
        .update_send_key(KeyUpdateRequest::NotRequested, &mut wire)
        .unwrap();
    for _ in 0..3 {
        client.seal(&full, &mut wire).unwrap();
    }
    assert_eq!(open(&mut server_small, &wire).unwrap().0.len(), 5 * 16_384);
}

/// The fuzz target's body over its committed seeds, and over a few generated inputs.
#[test]
fn fuzz_seeds_never_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/tls_records");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        fuzz::open_arbitrary(&data);
        seeds += 1;
    }
    assert!(seeds >= 4, "{seeds} seeds in {}", dir.display());
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for len in 0..300 {
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        fuzz::open_arbitrary(&data);
    }
}
