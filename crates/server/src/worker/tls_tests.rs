//! The TLS session against a rustls client: handshakes in any cut, the lean record layer and
//! key updates, parked sessions, alerts, and the session's size.
#![allow(clippy::unwrap_used)]

use super::*;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A server session and a buffered rustls client trusting the dev CA.
fn pair() -> (Session, rustls::ClientConnection) {
    let (server, client) = configs();
    connect(&server, &client)
}

/// A new server session and client from configurations that may be shared, so that a
/// second connection can resume the first's session.
fn connect(
    server: &Arc<ServerConfig>,
    client: &Arc<rustls::ClientConfig>,
) -> (Session, rustls::ClientConnection) {
    let name = ServerName::try_from("localhost").unwrap();
    let client = rustls::ClientConnection::new(Arc::clone(client), name).unwrap();
    (Session::new(server).unwrap(), client)
}

/// The server's configuration (a dev certificate) and a client's that trusts it.
fn configs() -> (Arc<ServerConfig>, Arc<rustls::ClientConfig>) {
    configs_with(rustls::DEFAULT_VERSIONS)
}

/// The same, the client offering only `versions`.
fn configs_with(
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> (Arc<ServerConfig>, Arc<rustls::ClientConfig>) {
    let dev = crate::tls::dev_cert(&[]).unwrap();
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(dev.chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(dev.key_pem.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    server.enable_secret_extraction = true;
    server.key_log = Arc::new(crate::tls::SecretCapture);
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(dev.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

fn client_out(c: &mut rustls::ClientConnection) -> Vec<u8> {
    let mut v = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut v).unwrap();
    }
    v
}

/// Feeds the server `bytes` in pieces of `step`, returning plaintext and what it sends.
fn feed(s: &mut Session, bytes: &[u8], step: usize) -> (Vec<u8>, Vec<u8>, ReadOutcome) {
    let (mut plain, mut out) = (Vec::new(), Vec::new());
    let mut all = ReadOutcome::default();
    for piece in bytes.chunks(step.max(1)) {
        let mut piece = piece.to_vec();
        let o = s.read(&mut piece, &mut plain, &mut out).unwrap();
        all.handshake_done |= o.handshake_done;
        all.peer_closed |= o.peer_closed;
    }
    (plain, out, all)
}

fn handshake(s: &mut Session, c: &mut rustls::ClientConnection, step: usize) {
    for _ in 0..10 {
        let to_server = client_out(c);
        let (_, to_client, _) = feed(s, &to_server, step);
        if !to_client.is_empty() {
            c.read_tls(&mut &to_client[..]).unwrap();
            c.process_new_packets().unwrap();
        }
        if !c.is_handshaking() && s.established() {
            return;
        }
    }
    panic!("handshake did not complete");
}

#[test]
fn handshake_and_data_both_ways_even_one_byte_at_a_time() {
    for step in [1, 7, 100_000] {
        let (mut s, mut c) = pair();
        handshake(&mut s, &mut c, step);
        assert_eq!(s.version(), Some("1.3"));
        assert!(s.in_flight.is_none());
        // Client to server.
        std::io::Write::write_all(&mut c.writer(), b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let (plain, _, _) = feed(&mut s, &client_out(&mut c), step);
        assert_eq!(plain, b"GET / HTTP/1.1\r\n\r\n");
        assert!(s.in_flight.is_none(), "nothing kept once a record is whole");
        // Server to client: one large message spans several records.
        let big = vec![b'x'; 40_000];
        let mut out = Vec::new();
        s.encrypt(b"hello", &mut out).unwrap();
        s.encrypt(&big, &mut out).unwrap();
        let mut got = Vec::new();
        let mut rest = &out[..];
        while !rest.is_empty() {
            c.read_tls(&mut rest).unwrap();
            c.process_new_packets().unwrap();
            let _ = std::io::Read::read_to_end(&mut c.reader(), &mut got);
        }
        assert_eq!(got.len(), 5 + 40_000);
        assert_eq!(&got[..5], b"hello");
    }
}

/// Everything the client can read now.
fn client_read(c: &mut rustls::ClientConnection, mut bytes: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    while !bytes.is_empty() {
        c.read_tls(&mut bytes).unwrap();
        c.process_new_packets().unwrap();
        let _ = std::io::Read::read_to_end(&mut c.reader(), &mut got);
    }
    got
}

#[test]
fn tls13_moves_to_the_lean_record_layer_and_follows_key_updates() {
    let (mut s, mut c) = pair();
    handshake(&mut s, &mut c, 100_000);
    assert!(s.is_lean());
    // The client rolls its keys and asks us to roll ours (update_requested).
    c.refresh_traffic_keys().unwrap();
    std::io::Write::write_all(&mut c.writer(), b"after update").unwrap();
    let (plain, to_client, _) = feed(&mut s, &client_out(&mut c), 100_000);
    assert_eq!(plain, b"after update");
    assert!(
        to_client.is_empty(),
        "our KeyUpdate goes with our next data"
    );
    let mut out = Vec::new();
    s.encrypt(b"new keys", &mut out).unwrap();
    assert!(out.len() > 5 + 8 + 1 + 16, "our own KeyUpdate first");
    assert_eq!(client_read(&mut c, &out), b"new keys");
    // Several updates in a row, and data both ways after each.
    for i in 0..3u8 {
        c.refresh_traffic_keys().unwrap();
        std::io::Write::write_all(&mut c.writer(), &[i]).unwrap();
        let (plain, to_client, _) = feed(&mut s, &client_out(&mut c), 3);
        assert_eq!(plain, [i]);
        let mut out = to_client;
        s.encrypt(&[i; 3], &mut out).unwrap();
        assert_eq!(client_read(&mut c, &out), [i; 3]);
    }
}

/// Runs the handshake until the client has read the server's Finished: the client's own
/// Finished is still in its buffer, so whatever the client writes next goes with it.
fn handshake_until_the_client_finished(s: &mut Session, c: &mut rustls::ClientConnection) {
    for _ in 0..10 {
        let (_, to_client, _) = feed(s, &client_out(c), 100_000);
        c.read_tls(&mut &to_client[..]).unwrap();
        c.process_new_packets().unwrap();
        if !c.is_handshaking() {
            assert!(!s.established(), "the client's Finished has not been sent");
            return;
        }
    }
    panic!("handshake did not complete");
}

/// Issue 38 (5): a client that asks for key updates at once, its KeyUpdates in the same
/// read as its Finished (or cut anywhere), gets every ticket, our answer and our data
/// under keys it can follow, and its own data arrives, again and again afterwards.
#[test]
fn key_updates_sent_with_the_client_finished_are_followed() {
    for updates in [1, 20, 200] {
        for step in [100_000, 1, 7, 31] {
            let why = format!("{updates} updates fed {step} bytes at a time");
            let (mut s, mut c) = pair();
            handshake_until_the_client_finished(&mut s, &mut c);
            for _ in 0..updates {
                c.refresh_traffic_keys().unwrap();
            }
            std::io::Write::write_all(&mut c.writer(), b"GET / HTTP/1.1\r\n\r\n").unwrap();
            let (plain, to_client, outcome) = feed(&mut s, &client_out(&mut c), step);
            assert!(outcome.handshake_done && s.is_lean(), "{why}");
            assert_eq!(plain, b"GET / HTTP/1.1\r\n\r\n", "{why}");
            let mut out = to_client;
            s.encrypt(b"HTTP/1.1 101", &mut out).unwrap();
            assert_eq!(client_read(&mut c, &out), b"HTTP/1.1 101", "{why}");
            // Then updates interleaved with traffic both ways.
            for round in 0..5u8 {
                for _ in 0..=round {
                    c.refresh_traffic_keys().unwrap();
                }
                std::io::Write::write_all(&mut c.writer(), &[round]).unwrap();
                let (plain, to_client, _) = feed(&mut s, &client_out(&mut c), step);
                assert_eq!(plain, [round], "{why}");
                let mut out = to_client;
                s.encrypt(&[round; 2], &mut out).unwrap();
                assert_eq!(client_read(&mut c, &out), [round; 2], "{why}");
            }
        }
    }
}

/// The server's NewSessionTickets leave under rustls' keys before the hand-off, then the
/// lean layer continues their sequence: a client that read them resumes with them, even
/// when its KeyUpdate arrived with its Finished (before it had the tickets).
#[test]
fn tickets_sent_at_the_hand_off_are_usable_after_an_early_key_update() {
    let (server, client) = configs();
    let (mut s, mut c) = connect(&server, &client);
    handshake_until_the_client_finished(&mut s, &mut c);
    c.refresh_traffic_keys().unwrap();
    let (_, to_client, _) = feed(&mut s, &client_out(&mut c), 100_000);
    let mut out = to_client;
    s.encrypt(b"first", &mut out).unwrap();
    assert_eq!(client_read(&mut c, &out), b"first");
    let (mut s, mut c) = connect(&server, &client);
    handshake(&mut s, &mut c, 100_000);
    assert_eq!(c.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    assert!(s.is_lean());
    assert!(
        s.park().is_ok(),
        "a resumed session's secrets are captured too"
    );
}

/// rustls is fed one record at a time until the handshake ends; a handshake message cut
/// into many small records (a client's max_fragment_size) still comes together, all of
/// it in one read, and the KeyUpdate after the Finished still reaches the lean layer.
#[test]
fn a_handshake_in_small_records_completes_in_one_read() {
    let (server, client) = configs();
    let mut small = (*client).clone();
    small.max_fragment_size = Some(64);
    let (mut s, mut c) = connect(&server, &Arc::new(small));
    let hello = client_out(&mut c);
    assert!(hello.len() > 3 * 64, "several records");
    let (_, to_client, _) = feed(&mut s, &hello, 100_000);
    c.read_tls(&mut &to_client[..]).unwrap();
    c.process_new_packets().unwrap();
    assert!(!c.is_handshaking());
    c.refresh_traffic_keys().unwrap();
    std::io::Write::write_all(&mut c.writer(), b"small").unwrap();
    let (plain, to_client, outcome) = feed(&mut s, &client_out(&mut c), 100_000);
    assert!(outcome.handshake_done && s.is_lean());
    assert_eq!(plain, b"small");
    let mut out = to_client;
    s.encrypt(b"reply", &mut out).unwrap();
    assert_eq!(client_read(&mut c, &out), b"reply");
}

/// TLS 1.2 stays with rustls: when the handshake ends inside a read (a resumed session,
/// where the client's Finished and its first data travel together), the data after the
/// Finished is read in that same call, not left waiting for the next one.
#[test]
fn tls12_data_in_the_read_that_ends_the_handshake_is_not_held_back() {
    let (server, tls12) = configs_with(&[&rustls::version::TLS12]);
    let (mut s, mut c) = connect(&server, &tls12);
    handshake(&mut s, &mut c, 100_000);
    assert_eq!(s.version(), Some("1.2"));
    let (mut s, mut c) = connect(&server, &tls12);
    handshake_until_the_client_finished(&mut s, &mut c);
    assert_eq!(c.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    std::io::Write::write_all(&mut c.writer(), b"resumed").unwrap();
    let (plain, _, outcome) = feed(&mut s, &client_out(&mut c), 100_000);
    assert!(outcome.handshake_done && !s.is_lean());
    assert_eq!(plain, b"resumed");
    let mut out = Vec::new();
    s.encrypt(b"still rustls", &mut out).unwrap();
    assert_eq!(client_read(&mut c, &out), b"still rustls");
}

#[test]
fn our_key_is_updated_before_its_limit_and_a_real_client_follows() {
    static SMALL: clarion_proto::tls13::KeyLimits = clarion_proto::tls13::KeyLimits {
        aes_gcm_full_records: 3,
        records: 5,
    };
    let (mut s, mut c) = pair();
    handshake(&mut s, &mut c, 100_000);
    let Engine::Lean(r) = std::mem::replace(&mut s.engine, Engine::Switching) else {
        panic!("not lean");
    };
    s.engine = Engine::Lean(r.with_limits(&SMALL));
    // Full-size records hit the AES-GCM limit, small ones the sequence limit.
    let big = vec![b'y'; 5 * MAX_RECORD];
    let mut out = Vec::new();
    s.encrypt(&big, &mut out).unwrap();
    for i in 0..10u8 {
        s.encrypt(&[i], &mut out).unwrap();
    }
    let without_updates = 5 * (5 + MAX_RECORD + 1 + 16) + 10 * (5 + 1 + 1 + 16);
    let updates = (out.len() - without_updates) / (5 + 5 + 1 + 16);
    assert!(updates >= 5, "{updates} KeyUpdates");
    let got = client_read(&mut c, &out);
    assert_eq!(got.len(), big.len() + 10);
    assert_eq!(got[big.len()..], (0..10).collect::<Vec<u8>>());
    // And the client's data still reads after our updates.
    std::io::Write::write_all(&mut c.writer(), b"still here").unwrap();
    let (plain, _, _) = feed(&mut s, &client_out(&mut c), 100_000);
    assert_eq!(plain, b"still here");
}

/// A hand-over: an established TLS 1.3 session parked with the ciphertext it had in
/// flight, rebuilt as another process would, and the client notices nothing.
#[test]
fn a_parked_session_resumes_where_it_stopped() {
    let (mut s, mut c) = pair();
    handshake(&mut s, &mut c, 100_000);
    assert!(
        matches!(s.engine, Engine::Lean(_)),
        "rustls' box, with the captured secrets, is gone"
    );
    let parked = s.park().unwrap();
    // The client asks for our key to be updated; half of its next record is in flight.
    c.refresh_traffic_keys().unwrap();
    std::io::Write::write_all(&mut c.writer(), b"first").unwrap();
    let (plain, _, _) = feed(&mut s, &client_out(&mut c), 100_000);
    assert_eq!(plain, b"first");
    std::io::Write::write_all(&mut c.writer(), b"split").unwrap();
    let next = client_out(&mut c);
    let (plain, _, _) = feed(&mut s, &next[..7], 100_000);
    assert!(plain.is_empty());
    let mut unsent = Vec::new();
    s.encrypt(b"unsent ", &mut unsent).unwrap();
    s.keep_unsent(&unsent);
    let moved = s.park().unwrap();
    assert_ne!(moved, parked, "sequence numbers and keys moved on");
    let (partial, unsent) = s.take_in_flight();
    drop(s);
    let mut s = Session::resume(Box::new(moved), partial, unsent).unwrap();
    assert!(s.is_lean() && s.established() && !s.untouched());
    let (plain, _, _) = feed(&mut s, &next[7..], 100_000);
    assert_eq!(plain, b"split");
    let mut out = s.unsent().to_vec();
    s.unsent_written(out.len());
    assert!(
        s.in_flight.is_none(),
        "both parts written: the box is freed"
    );
    s.encrypt(b"after", &mut out).unwrap();
    assert_eq!(client_read(&mut c, &out), b"unsent after");
    c.refresh_traffic_keys().unwrap();
    std::io::Write::write_all(&mut c.writer(), b"again").unwrap();
    let (plain, to_client, _) = feed(&mut s, &client_out(&mut c), 3);
    assert_eq!(plain, b"again");
    let mut out = to_client;
    s.encrypt(b"done", &mut out).unwrap();
    assert_eq!(client_read(&mut c, &out), b"done");
}

/// The secrets rustls reports are taken right after each call into it, so handshakes that
/// interleave on one worker thread each keep their own: both sessions can be parked, and
/// continue (a KeyUpdate included) after a move.
#[test]
fn interleaved_handshakes_on_one_thread_keep_their_own_secrets() {
    let (server, client) = configs();
    let (mut s1, mut c1) = connect(&server, &client);
    let (mut s2, mut c2) = connect(&server, &client);
    let mut flights = Vec::new();
    for (s, c) in [(&mut s1, &mut c1), (&mut s2, &mut c2)] {
        let (_, to_client, _) = feed(s, &client_out(c), 100_000);
        flights.push(to_client);
    }
    for (c, flight) in [(&mut c1, &flights[0]), (&mut c2, &flights[1])] {
        c.read_tls(&mut &flight[..]).unwrap();
        c.process_new_packets().unwrap();
    }
    // The second connection finishes first.
    for (s, c) in [(&mut s2, &mut c2), (&mut s1, &mut c1)] {
        let (_, to_client, o) = feed(s, &client_out(c), 100_000);
        assert!(o.handshake_done && s.is_lean());
        client_read(c, &to_client);
    }
    for (s, mut c) in [(s1, c1), (s2, c2)] {
        let mut s = Session::resume(Box::new(s.park().unwrap()), Vec::new(), Vec::new()).unwrap();
        let mut out = Vec::new();
        s.encrypt(b"moved", &mut out).unwrap();
        assert_eq!(client_read(&mut c, &out), b"moved");
        c.refresh_traffic_keys().unwrap();
        std::io::Write::write_all(&mut c.writer(), b"back").unwrap();
        let (plain, _, _) = feed(&mut s, &client_out(&mut c), 100_000);
        assert_eq!(plain, b"back");
    }
}

#[test]
fn a_handshake_in_flight_and_tls12_cannot_be_parked() {
    let (mut s, mut c) = pair();
    assert_eq!(s.park(), Err(Unmovable::Handshake));
    handshake_until_the_client_finished(&mut s, &mut c);
    assert_eq!(s.park(), Err(Unmovable::Handshake));
    let (server, tls12) = configs_with(&[&rustls::version::TLS12]);
    let (mut s, mut c) = connect(&server, &tls12);
    handshake(&mut s, &mut c, 100_000);
    assert_eq!(s.park(), Err(Unmovable::Tls12));
}

#[test]
fn idle_connections_drop_their_expanded_keys_and_rebuild_them() {
    let (mut s, mut c) = pair();
    handshake(&mut s, &mut c, 100_000);
    let mut out = Vec::new();
    s.encrypt(b"one", &mut out).unwrap();
    assert!(!s.compact(), "active since the last sweep: kept");
    assert!(s.compact(), "quiet for a whole sweep: dropped");
    assert!(!s.compact(), "nothing left to drop");
    s.encrypt(b"two", &mut out).unwrap();
    assert_eq!(client_read(&mut c, &out), b"onetwo");
    std::io::Write::write_all(&mut c.writer(), b"in").unwrap();
    s.compact();
    assert!(s.compact(), "quiet again: dropped");
    let (plain, _, _) = feed(&mut s, &client_out(&mut c), 100_000);
    assert_eq!(plain, b"in");
}

#[test]
fn a_tampered_record_is_refused_with_an_alert() {
    let (mut s, mut c) = pair();
    handshake(&mut s, &mut c, 100_000);
    std::io::Write::write_all(&mut c.writer(), b"payload").unwrap();
    let mut bytes = client_out(&mut c);
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let (mut plain, mut out) = (Vec::new(), Vec::new());
    assert!(s.read(&mut bytes, &mut plain, &mut out).is_err());
    assert!(plain.is_empty());
    // The client gets an encrypted bad_record_mac alert.
    c.read_tls(&mut &out[..]).unwrap();
    let err = c.process_new_packets().unwrap_err();
    assert!(err.to_string().contains("BadRecordMac"), "{err}");
}

#[test]
fn close_notify_is_reported_both_ways() {
    let (mut s, mut c) = pair();
    handshake(&mut s, &mut c, 1000);
    c.send_close_notify();
    let (_, _, o) = feed(&mut s, &client_out(&mut c), 1000);
    assert!(o.peer_closed);
    let mut out = Vec::new();
    s.close_notify(&mut out);
    c.read_tls(&mut &out[..]).unwrap();
    let st = c.process_new_packets().unwrap();
    assert!(st.peer_has_closed());
}

#[test]
fn garbage_fails_with_an_alert_and_keeps_nothing() {
    let (mut s, _) = pair();
    let mut junk = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    let (mut plain, mut out) = (Vec::new(), Vec::new());
    assert!(s.read(&mut junk, &mut plain, &mut out).is_err());
    assert!(plain.is_empty());
    assert!(s.in_flight.is_none());
    // An alert record: content type 21.
    assert_eq!(out.first(), Some(&21));
}

#[test]
fn application_data_before_the_handshake_is_refused() {
    let (mut s, _) = pair();
    let mut out = Vec::new();
    assert!(s.encrypt(b"early", &mut out).is_err());
    assert!(out.is_empty());
}

/// The in-flight box exists only while it holds a partial record or refused records, and
/// is freed as soon as both are empty.
#[test]
fn the_in_flight_box_is_freed_once_empty() {
    let (mut s, mut c) = pair();
    handshake(&mut s, &mut c, 100_000);
    assert!(s.in_flight.is_none());
    s.keep_unsent(b"");
    assert!(s.in_flight.is_none(), "nothing kept, nothing allocated");
    s.keep_unsent(b"refused");
    assert_eq!(s.unsent(), b"refused");
    s.unsent_written(3);
    assert_eq!(s.unsent(), b"used");
    // Half a record arrives while records wait to go out: both in the one box.
    std::io::Write::write_all(&mut c.writer(), b"split").unwrap();
    let record = client_out(&mut c);
    let (plain, _, _) = feed(&mut s, &record[..9], 100_000);
    assert!(plain.is_empty());
    assert!(s.in_flight.as_ref().is_some_and(|f| f.partial.len() == 9));
    s.unsent_written(4);
    assert!(s.unsent().is_empty());
    assert!(s.in_flight.is_some(), "the partial record is still held");
    let (plain, _, _) = feed(&mut s, &record[9..], 100_000);
    assert_eq!(plain, b"split");
    assert!(s.in_flight.is_none(), "both empty: freed");
    // And the other order: the partial record completes first.
    std::io::Write::write_all(&mut c.writer(), b"again").unwrap();
    let record = client_out(&mut c);
    feed(&mut s, &record[..2], 100_000);
    s.keep_unsent(b"late");
    feed(&mut s, &record[2..], 100_000);
    assert_eq!(s.unsent(), b"late");
    assert!(s
        .in_flight
        .as_ref()
        .is_some_and(|f| f.partial.capacity() == 0));
    assert_eq!(s.take_in_flight(), (Vec::new(), b"late".to_vec()));
    assert!(s.in_flight.is_none());
}

/// Without the captured secrets rustls derives the next keys (`Schedule::Kernel`), and the
/// peer's current key, which the lean layer does not keep, is kept by that schedule: data,
/// sweeps and KeyUpdates both ways still work; the session just cannot move.
#[test]
fn without_captured_secrets_the_kernel_schedule_keeps_the_peer_key() {
    let (server, client) = configs();
    let mut server = (*server).clone();
    server.key_log = Arc::new(rustls::NoKeyLog);
    let (mut s, mut c) = connect(&Arc::new(server), &client);
    handshake(&mut s, &mut c, 100_000);
    assert!(s.is_lean());
    assert_eq!(s.park(), Err(Unmovable::Keys));
    for round in 0..3u8 {
        if round > 0 {
            c.refresh_traffic_keys().unwrap();
        }
        s.compact();
        s.compact();
        std::io::Write::write_all(&mut c.writer(), &[round; 3]).unwrap();
        let (plain, to_client, _) = feed(&mut s, &client_out(&mut c), 100_000);
        assert_eq!(plain, [round; 3], "round {round}");
        let mut out = to_client;
        s.encrypt(&[round; 4], &mut out).unwrap();
        assert_eq!(client_read(&mut c, &out), [round; 4], "round {round}");
    }
}

#[test]
fn session_is_small_once_established() {
    // The struct itself, which holds the lean record layer inline (rustls' handshake state
    // and the handshake secrets are boxed and gone once established); the heap it owns is
    // measured by bench/idle_memory.py --tls. It is the one allocation an idle TLS 1.3
    // connection keeps (docs/benchmarks.md, "What an idle TLS 1.3 session owns"): 216 B on
    // 64-bit targets, a 224 B glibc chunk (it was 328 B, a 336 B chunk, before issue 53's
    // cut); growing it grows every idle connection. Below 201 B it would fit a 208 B chunk.
    use std::mem::size_of;
    let size = size_of::<Session>();
    assert!(size <= 216, "Session: {size} B");
    assert!(
        size_of::<Records>() <= 208,
        "Records: {} B",
        size_of::<Records>()
    );
    assert_eq!(
        size_of::<Engine>(),
        size_of::<Records>(),
        "the engine's tag is a niche"
    );
    assert_eq!(size_of::<Option<Box<InFlight>>>(), 8);
}
