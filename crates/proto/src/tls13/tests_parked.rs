//! A record layer parked mid-stream and resumed from its bytes continues the connection
//! exactly: a real rustls client (which knows nothing of the move) keeps reading and writing,
//! follows KeyUpdates both ways, and the §5.5 accounting carries on where it stopped.
#![allow(clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConnection, ConnectionTrafficSecrets, DigitallySignedStruct, ServerConnection};

use super::keys::tests::{rfc8448_secret, CLIENT_AP_SECRET, SERVER_AP_SECRET};
use super::*;

type Server = Records<SecretSchedule>;

/// The application traffic secrets rustls' key log reports for the server.
#[derive(Debug, Default)]
struct Capture(Mutex<(Vec<u8>, Vec<u8>)>);

impl rustls::KeyLog for Capture {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let mut g = self.0.lock().unwrap();
        match label {
            "SERVER_TRAFFIC_SECRET_0" => g.0 = secret.to_vec(),
            "CLIENT_TRAFFIC_SECRET_0" => g.1 = secret.to_vec(),
            _ => {}
        }
    }
}

/// The client trusts any certificate: the test is about records, not about names.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.3 only".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn move_bytes(from: &mut impl WriteTls, to: &mut impl ReadTls) {
    let mut v = Vec::new();
    while from.wants() {
        from.write(&mut v);
    }
    let mut s = &v[..];
    while !s.is_empty() {
        to.read(&mut s);
    }
}

trait WriteTls {
    fn wants(&self) -> bool;
    fn write(&mut self, v: &mut Vec<u8>);
}
trait ReadTls {
    fn read(&mut self, s: &mut &[u8]);
}
impl WriteTls for ClientConnection {
    fn wants(&self) -> bool {
        self.wants_write()
    }
    fn write(&mut self, v: &mut Vec<u8>) {
        self.write_tls(v).unwrap();
    }
}
impl WriteTls for ServerConnection {
    fn wants(&self) -> bool {
        self.wants_write()
    }
    fn write(&mut self, v: &mut Vec<u8>) {
        self.write_tls(v).unwrap();
    }
}
impl ReadTls for ClientConnection {
    fn read(&mut self, s: &mut &[u8]) {
        self.read_tls(s).unwrap();
        self.process_new_packets().unwrap();
    }
}
impl ReadTls for ServerConnection {
    fn read(&mut self, s: &mut &[u8]) {
        self.read_tls(s).unwrap();
        self.process_new_packets().unwrap();
    }
}

fn key_of(suite: CipherSuite, s: &ConnectionTrafficSecrets) -> TrafficKey {
    match s {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            TrafficKey::new(suite, key.as_ref(), iv.as_ref()).unwrap()
        }
        _ => panic!("not a TLS 1.3 suite"),
    }
}

/// A finished rustls handshake with `suite`, the server side then taken over by the record
/// layer (from the key log's secrets, continuing rustls' sequence numbers after its tickets),
/// and the client that will never know.
fn established(suite: CipherSuite) -> (Server, ClientConnection) {
    let rustls_suite = match suite {
        CipherSuite::Aes128GcmSha256 => {
            rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
        }
        CipherSuite::Aes256GcmSha384 => {
            rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384
        }
        CipherSuite::Chacha20Poly1305Sha256 => {
            rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256
        }
    };
    let provider = Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites: vec![rustls_suite],
        ..rustls::crypto::ring::default_provider()
    });
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    let capture = Arc::new(Capture::default());
    server.key_log = capture.clone();
    server.enable_secret_extraction = true;
    let client = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    let mut s = ServerConnection::new(Arc::new(server)).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut c = ClientConnection::new(Arc::new(client), name).unwrap();
    while c.is_handshaking() || s.is_handshaking() || s.wants_write() {
        move_bytes(&mut c, &mut s);
        move_bytes(&mut s, &mut c);
    }
    let extracted = s.dangerous_extract_secrets().unwrap();
    let (ours, peers) = capture.0.lock().unwrap().clone();
    let schedule = SecretSchedule::new(
        suite,
        TrafficSecret::new(suite, &ours).unwrap(),
        TrafficSecret::new(suite, &peers).unwrap(),
    );
    let (send, receive) = schedule.keys().unwrap();
    assert_eq!(send, key_of(suite, &extracted.tx.1));
    assert_eq!(receive, key_of(suite, &extracted.rx.1));
    assert!(extracted.tx.0 > 0, "the tickets went first");
    let records = Records::new(suite, schedule, (send, extracted.tx.0), extracted.rx.0);
    (records, c)
}

/// What the client sends for `data` after `update` KeyUpdates of its own.
fn client_sends(c: &mut ClientConnection, updates: usize, data: &[u8]) -> Vec<u8> {
    for _ in 0..updates {
        c.refresh_traffic_keys().unwrap();
    }
    c.writer().write_all(data).unwrap();
    let mut v = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut v).unwrap();
    }
    v
}

/// What the client reads from `wire`.
fn client_reads(c: &mut ClientConnection, wire: &[u8]) -> Vec<u8> {
    let mut s = wire;
    let mut got = Vec::new();
    while !s.is_empty() {
        c.read_tls(&mut s).unwrap();
        c.process_new_packets().unwrap();
        let _ = c.reader().read_to_end(&mut got);
    }
    got
}

/// Opens the whole records of `partial` (the caller's kept ciphertext) into plaintext,
/// keeping the tail.
fn server_reads(s: &mut Server, partial: &mut Vec<u8>) -> Vec<u8> {
    let mut plain = Vec::new();
    let read = s.open(partial, &mut plain).unwrap();
    partial.drain(..read.used);
    plain
}

/// Parks `s` through its bytes (wiping them afterwards, as the server does) and resumes it.
fn moved(s: Server) -> Server {
    let mut bytes = Vec::new();
    s.park().unwrap().encode(&mut bytes);
    drop(s);
    let parked = Parked::decode(&bytes).unwrap();
    zeroize::Zeroize::zeroize(&mut bytes);
    Records::resume(parked, |schedule| schedule).unwrap()
}

const SUITES: [CipherSuite; 3] = [
    CipherSuite::Aes128GcmSha256,
    CipherSuite::Aes256GcmSha384,
    CipherSuite::Chacha20Poly1305Sha256,
];

#[test]
fn a_parked_session_continues_with_a_real_client_through_key_updates_both_ways() {
    for suite in SUITES {
        let why = format!("{suite:?}");
        let (mut s, mut c) = established(suite);
        let mut partial = Vec::new();
        // Traffic both ways before the move.
        partial.extend(client_sends(&mut c, 0, b"GET / HTTP/1.1\r\n\r\n"));
        assert_eq!(
            server_reads(&mut s, &mut partial),
            b"GET / HTTP/1.1\r\n\r\n"
        );
        let mut wire = Vec::new();
        s.seal(b"HTTP/1.1 101", &mut wire).unwrap();
        assert_eq!(client_reads(&mut c, &wire), b"HTTP/1.1 101", "{why}");
        // Sealed before the move, not yet taken by the kernel: travels as ciphertext.
        let mut unsent = Vec::new();
        s.seal(b"in flight", &mut unsent).unwrap();
        // The client updates its key and asks for ours; the answer is still owed at the move,
        // and half of the client's next record is still in flight.
        partial.extend(client_sends(&mut c, 1, b"asked"));
        assert_eq!(server_reads(&mut s, &mut partial), b"asked", "{why}");
        assert!(s.owes_key_update(), "{why}");
        let mut next = client_sends(&mut c, 0, b"split across the move");
        let later = next.split_off(next.len() / 2);
        partial.extend(next);
        assert!(server_reads(&mut s, &mut partial).is_empty(), "{why}");
        let usage = s.usage();

        let mut s = moved(s);
        assert_eq!(s.usage(), usage, "{why}: the accounting continues");
        assert!(s.owes_key_update(), "{why}: the obligation moved too");
        partial.extend(later);
        assert_eq!(
            server_reads(&mut s, &mut partial),
            b"split across the move",
            "{why}"
        );
        let mut wire = unsent;
        s.seal(b"after the move", &mut wire).unwrap();
        assert!(!s.owes_key_update(), "{why}");
        assert_eq!(
            client_reads(&mut c, &wire),
            b"in flightafter the move",
            "{why}"
        );
        // The client's KeyUpdate after the move, then ours (asking for its own again).
        partial.extend(client_sends(&mut c, 1, b"client updated"));
        assert_eq!(
            server_reads(&mut s, &mut partial),
            b"client updated",
            "{why}"
        );
        let mut wire = Vec::new();
        s.update_send_key(KeyUpdateRequest::Requested, &mut wire)
            .unwrap();
        s.seal(b"server updated", &mut wire).unwrap();
        assert_eq!(client_reads(&mut c, &wire), b"server updated", "{why}");
        partial.extend(client_sends(&mut c, 0, b"client answered"));
        assert_eq!(
            server_reads(&mut s, &mut partial),
            b"client answered",
            "{why}"
        );
        // And a second move, at a quiet moment, changes nothing either.
        let mut s = moved(s);
        let mut wire = Vec::new();
        s.seal(b"twice moved", &mut wire).unwrap();
        assert_eq!(client_reads(&mut c, &wire), b"twice moved", "{why}");
        partial.extend(client_sends(&mut c, 2, b"still here"));
        assert_eq!(server_reads(&mut s, &mut partial), b"still here", "{why}");
        assert!(partial.is_empty(), "{why}");
    }
}

#[test]
fn the_key_limit_accounting_continues_after_the_move() {
    // Our key may protect 12 records; the move happens after 6 (tickets included), so the
    // resumed layer must update its key within the next 6, as the old one would have.
    static SMALL: KeyLimits = KeyLimits {
        aes_gcm_full_records: u64::MAX / limits::FULL_RECORD_WEIGHT,
        records: 12,
    };
    let (s, mut c) = established(CipherSuite::Aes128GcmSha256);
    let mut s = s.with_limits(&SMALL);
    let mut wire = Vec::new();
    while s.usage().0.seq < 6 {
        s.seal(b"x", &mut wire).unwrap();
    }
    assert_eq!(client_reads(&mut c, &wire), vec![b'x'; wire.len() / 23]);
    let before = s.usage().0;
    let mut s = moved(s).with_limits(&SMALL);
    assert_eq!(s.usage().0, before);
    let mut wire = Vec::new();
    let mut first_update = None;
    for i in 0..20u8 {
        let seq = s.usage().0.seq;
        s.seal(&[i], &mut wire).unwrap();
        assert!(s.usage().0.seq <= 12);
        if s.usage().0.seq < seq && first_update.is_none() {
            first_update = Some(i);
        }
    }
    // Records at 6, 7, 8 and 9 under the old key (two stay reserved), then the KeyUpdate: a
    // count restarted at 0 by the move would have gone on to 9 first.
    assert_eq!(first_update, Some(4));
    assert_eq!(client_reads(&mut c, &wire), (0..20).collect::<Vec<u8>>());
}

#[test]
fn a_key_update_split_across_the_move_is_reassembled() {
    // RFC 8448's keys, outside rustls (which never splits a KeyUpdate): the first two bytes
    // arrive before the move, the rest after it.
    let suite = CipherSuite::Aes128GcmSha256;
    let side = |send, receive| {
        let sched = SecretSchedule::new(suite, rfc8448_secret(send), rfc8448_secret(receive));
        let (s, _) = sched.keys().unwrap();
        Records::new(suite, sched, (s, 0), 0)
    };
    let mut server: Server = side(SERVER_AP_SECRET, CLIENT_AP_SECRET);
    let mut client: Server = side(CLIENT_AP_SECRET, SERVER_AP_SECRET);
    let msg = KeyUpdateRequest::Requested.message();
    let mut first = Vec::new();
    client
        .seal_record(ContentType::Handshake, &msg[..2], 0, &mut first)
        .unwrap();
    let mut rest = Vec::new();
    client
        .seal_record(ContentType::Handshake, &msg[2..], 0, &mut rest)
        .unwrap();
    // Seal the data under the client's next key with a layer that did switch.
    let mut c2: Server = side(CLIENT_AP_SECRET, SERVER_AP_SECRET);
    let mut skip = Vec::new();
    c2.seal_record(ContentType::Handshake, &msg[..2], 0, &mut skip)
        .unwrap();
    c2.update_send_key(KeyUpdateRequest::Requested, &mut skip)
        .unwrap();
    c2.seal(b"after", &mut rest).unwrap();
    assert!(server_reads(&mut server, &mut first).is_empty());
    let parked = server.park().unwrap();
    assert_eq!(parked.partial_handshake, [24, 0]);
    let mut server = moved(server);
    assert_eq!(server_reads(&mut server, &mut rest), b"after");
    assert!(server.owes_key_update());
    let mut wire = Vec::new();
    server.seal(b"reply", &mut wire).unwrap();
    let mut plain = Vec::new();
    client.open(&mut wire, &mut plain).unwrap();
    assert_eq!(plain, b"reply");
}

#[test]
fn a_schedule_without_secrets_cannot_be_parked() {
    struct Opaque;
    impl KeySchedule for Opaque {
        fn next_send_key(&mut self) -> Result<TrafficKey, KeyError> {
            Err(KeyError::Unavailable)
        }
        fn next_receive_key(&mut self) -> Result<TrafficKey, KeyError> {
            Err(KeyError::Unavailable)
        }
        fn receive_key(&self) -> Result<TrafficKey, KeyError> {
            Err(KeyError::Unavailable)
        }
    }
    let suite = CipherSuite::Aes128GcmSha256;
    let key = TrafficKey::derive(suite, &rfc8448_secret(SERVER_AP_SECRET)).unwrap();
    let r = Records::new(suite, Opaque, (key, 0), 0);
    assert!(r.park().is_none());
}
