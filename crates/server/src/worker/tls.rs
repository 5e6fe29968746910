//! One connection's TLS state, driven through rustls' unbuffered API so that an idle secure
//! connection keeps no buffers: ciphertext is read into the worker's shared read buffer,
//! plaintext is handed over in a worker-owned buffer, and records to send are built in scratch
//! space. A connection keeps bytes only for a partial record it has not fully received and for
//! ciphertext the kernel has not taken yet, in one box that is freed as soon as both empty.
//!
//! Once a TLS 1.3 handshake completes, the records move to proto's record layer (handed over
//! in [`clarion_proto::tls13::handoff`]), which keeps only raw keys while the connection is idle; TLS 1.2
//! connections stay with rustls.
//!
//! The hand-off happens exactly at the record that ends the handshake (the client's Finished):
//! rustls is given whole records one at a time until then, and never one after it. Whatever
//! follows in the same read (data, a KeyUpdate sent at once) goes to the lean layer in that
//! same call. rustls must not see a KeyUpdate: it answers one only when it next sends, so the
//! answer would be lost at the hand-off while its sending key had already moved on (issue 38).
//! Its tickets, sent when the Finished arrives, go out before the hand-off, and the lean layer
//! continues their key and sequence numbers.
//!
//! No socket is touched here: the caller writes what lands in `out`.

use std::alloc::Layout;
use std::sync::{Arc, Mutex};

use rustls::server::{ServerConfig, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncryptError};

use clarion_proto::tls13::handoff::{self, encode, Schedule};
use clarion_proto::tls13::{KeyError, Parked, RecordHeader};

use super::pool::{InPool, Slots};
use crate::tls::Secret;

/// The record layer of an established TLS 1.3 server connection.
type Records = clarion_proto::tls13::Records<Schedule<rustls::server::ServerConnectionData>>;

/// Why a TLS connection cannot continue in another process (a hand-over counts each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmovable {
    /// The handshake is not finished: rustls' handshake state cannot be serialized.
    Handshake,
    /// TLS 1.2 stays with rustls, whose record state cannot be serialized.
    Tls12,
    /// The lean layer's keys are derived by rustls (its traffic secrets were not captured).
    Keys,
}

/// Plaintext bytes per TLS record (RFC 8446 §5.1).
pub const MAX_RECORD: usize = 16 * 1024;
/// Room for a record's header, nonce, tag and content type: 29 bytes at most for the suites
/// rustls offers (TLS 1.2 GCM), rounded up.
const RECORD_OVERHEAD: usize = 32;

/// What reading some ciphertext produced besides plaintext.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// The handshake finished during this read.
    pub handshake_done: bool,
    /// The peer sent close_notify: it will send nothing more.
    pub peer_closed: bool,
}

/// rustls' connection and what only its phase needs: all of it is gone once a TLS 1.3
/// connection moves to the lean layer.
struct Handshake {
    conn: UnbufferedServerConnection,
    /// The application traffic secrets (ours, the client's) rustls reported, from the
    /// server's first flight until the hand-off to the lean layer takes them.
    secrets: Option<(Secret, Secret)>,
    /// The handshake has completed (a TLS 1.2 connection stays here).
    established: bool,
    /// Some ciphertext has arrived (to tell a plain-HTTP request from a ClientHello).
    started: bool,
}

/// Who does the records. The lean layer is the long-lived state, so it is inline (one
/// allocation per connection) while the much larger rustls state is boxed only until the
/// handshake ends.
#[allow(clippy::large_enum_variant)]
enum Engine {
    /// rustls: during the handshake, and for TLS 1.2 connections throughout.
    Rustls(Box<Handshake>),
    /// Our lean TLS 1.3 record layer, once the handshake is done.
    Lean(Records),
    /// Only while switching from one to the other (and after a hand-off that failed).
    Switching,
}

impl Engine {
    /// Whether the handshake has completed: only rustls can be in the middle of one.
    fn established(&self) -> bool {
        match self {
            Engine::Rustls(h) => h.established,
            Engine::Lean(_) | Engine::Switching => true,
        }
    }
}

/// Ciphertext a connection holds between events, boxed together because it is rare.
#[derive(Default)]
struct InFlight {
    /// Ciphertext of a record not yet complete.
    partial: Vec<u8>,
    /// Encrypted bytes the kernel refused.
    unsent: Vec<u8>,
}

/// A TLS server connection.
pub struct Session {
    engine: Engine,
    /// Ciphertext in flight; `None` (nothing allocated) almost always, and again as soon as
    /// both parts empty.
    in_flight: Option<Box<InFlight>>,
}

/// The pool every worker's sessions share (see [`super::pool`]).
static SESSIONS: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Session>()));

impl InPool for Session {
    fn slots() -> &'static Mutex<Slots> {
        &SESSIONS
    }
}

impl Session {
    /// A connection that will handshake with `config`.
    pub fn new(config: &Arc<ServerConfig>) -> Result<Session, rustls::Error> {
        Ok(Session {
            engine: Engine::Rustls(Box::new(Handshake {
                conn: UnbufferedServerConnection::new(Arc::clone(config))?,
                secrets: None,
                established: false,
                started: false,
            })),
            in_flight: None,
        })
    }

    /// An established TLS 1.3 connection that another process parked (a hand-over), with the
    /// ciphertext it had in flight: `partial`, the start of the client's next record, and
    /// `unsent`, records the kernel had not taken, which go out before anything else.
    ///
    /// `parked` is read, not moved: dropping the box wipes the secrets it held.
    pub fn resume(
        parked: Box<Parked>,
        partial: Vec<u8>,
        unsent: Vec<u8>,
    ) -> Result<Session, KeyError> {
        let mut s = Session {
            engine: Engine::Lean(Records::resume(Parked::clone(&parked), Schedule::Secrets)?),
            in_flight: Some(Box::new(InFlight { partial, unsent })),
        };
        s.tidy();
        Ok(s)
    }

    /// Everything another process needs to continue this connection's records, or why it
    /// cannot. The ciphertext in flight is not included: see [`Session::take_in_flight`].
    pub fn park(&self) -> Result<Parked, Unmovable> {
        match &self.engine {
            Engine::Lean(r) => r.park().ok_or(Unmovable::Keys),
            Engine::Rustls(h) if h.established => Err(Unmovable::Tls12),
            Engine::Rustls(_) => Err(Unmovable::Handshake),
            Engine::Switching => Err(Unmovable::Keys),
        }
    }

    /// Takes the ciphertext in flight: (the partial record received, the records not sent).
    pub fn take_in_flight(&mut self) -> (Vec<u8>, Vec<u8>) {
        let InFlight { partial, unsent } = self.in_flight.take().map(|b| *b).unwrap_or_default();
        (partial, unsent)
    }

    /// Encrypted bytes the kernel refused, which go out before anything else.
    pub fn unsent(&self) -> &[u8] {
        self.in_flight.as_ref().map_or(&[], |f| &f.unsent[..])
    }

    /// Keeps `records` the kernel refused, after those already kept.
    pub fn keep_unsent(&mut self, records: &[u8]) {
        if !records.is_empty() {
            let f = self.in_flight.get_or_insert_with(Box::default);
            f.unsent.extend_from_slice(records);
        }
    }

    /// The kernel took the first `n` bytes of [`Session::unsent`]; frees them (and the
    /// in-flight box once nothing is left in it).
    pub fn unsent_written(&mut self, n: usize) {
        if let Some(f) = self.in_flight.as_mut() {
            f.unsent.drain(..n.min(f.unsent.len()));
            if f.unsent.is_empty() {
                f.unsent = Vec::new();
            }
        }
        self.tidy();
    }

    /// Stores the partial record kept after a read (freeing it if empty).
    fn keep_partial(&mut self, partial: Vec<u8>) {
        if partial.is_empty() {
            if let Some(f) = self.in_flight.as_mut() {
                f.partial = Vec::new();
            }
            self.tidy();
        } else {
            self.in_flight.get_or_insert_with(Box::default).partial = partial;
        }
    }

    /// Drops the in-flight box once it holds nothing.
    fn tidy(&mut self) {
        if self
            .in_flight
            .as_ref()
            .is_some_and(|f| f.partial.is_empty() && f.unsent.is_empty())
        {
            self.in_flight = None;
        }
    }

    /// Whether the handshake has completed.
    pub fn established(&self) -> bool {
        self.engine.established()
    }

    /// Whether no byte has arrived yet.
    pub fn untouched(&self) -> bool {
        match &self.engine {
            Engine::Rustls(h) => !h.started,
            Engine::Lean(_) | Engine::Switching => false,
        }
    }

    /// Whether the lean record layer has taken over from rustls.
    pub fn is_lean(&self) -> bool {
        matches!(self.engine, Engine::Lean(_))
    }

    /// The negotiated protocol version, once known ("1.3" or "1.2").
    pub fn version(&self) -> Option<&'static str> {
        match &self.engine {
            Engine::Rustls(h) => h.conn.protocol_version().map(|v| match v {
                rustls::ProtocolVersion::TLSv1_3 => "1.3",
                rustls::ProtocolVersion::TLSv1_2 => "1.2",
                _ => "other",
            }),
            Engine::Lean(_) => Some("1.3"),
            Engine::Switching => None,
        }
    }

    /// Frees the expanded keys of a direction that was quiet since the previous call (the
    /// worker's sweep calls this once a second).
    pub fn compact(&mut self) -> bool {
        match &mut self.engine {
            Engine::Lean(r) => r.compact(),
            _ => false,
        }
    }

    /// Feeds `fresh` ciphertext (joined to any partial record kept from before). Plaintext is
    /// appended to `plain`; handshake records and alerts to send are appended to `out`, which
    /// the caller must write before anything else. On error, `out` may hold an alert.
    pub fn read(
        &mut self,
        fresh: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<ReadOutcome, rustls::Error> {
        if let Engine::Rustls(h) = &mut self.engine {
            h.started = true;
        }
        let was_established = self.established();
        let mut partial = self
            .in_flight
            .as_mut()
            .map(|f| std::mem::take(&mut f.partial))
            .unwrap_or_default();
        let engine = &mut self.engine;
        let joined = !partial.is_empty();
        if joined {
            partial.extend_from_slice(fresh);
        }
        let buf: &mut [u8] = if joined { &mut partial } else { fresh };
        let (mut used, mut result) = process(engine, buf, plain, out);
        if result.is_ok() && !was_established && engine.established() {
            // The handshake ended at a record boundary inside this input: the records after
            // it belong to whoever holds the connection now.
            go_lean(engine);
            let rest = buf.get_mut(used..).unwrap_or_default();
            if !rest.is_empty() {
                let (more, after) = process(engine, rest, plain, out);
                used += more;
                result = match (result, after) {
                    (Ok(a), Ok(b)) => Ok(ReadOutcome {
                        peer_closed: a.peer_closed || b.peer_closed,
                        ..a
                    }),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
            }
        }
        // Keep the unprocessed tail (a partial record) and nothing else.
        let tail = buf.get(used..).unwrap_or_default();
        let kept = if result.is_err() {
            if let Engine::Rustls(h) = engine {
                drain_alert(&mut h.conn, out);
            }
            Vec::new()
        } else if joined {
            partial.drain(..used.min(partial.len()));
            partial
        } else {
            tail.to_vec()
        };
        self.keep_partial(kept);
        let mut outcome = result?;
        outcome.handshake_done = !was_established && self.established();
        Ok(outcome)
    }

    /// Encrypts `data` (any length; split into records as needed), appending the records to
    /// `out`.
    pub fn encrypt(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), rustls::Error> {
        if let Engine::Lean(r) = &mut self.engine {
            return r
                .seal(data, out)
                .map_err(|e| rustls::Error::General(e.to_string()));
        }
        let records = data.len().div_ceil(MAX_RECORD).max(1);
        let room = data.len() + records * RECORD_OVERHEAD;
        self.with_write_traffic(out, room, |w, buf| w.encrypt(data, buf))
    }

    /// Appends a close_notify alert to `out` (when the handshake has completed).
    pub fn close_notify(&mut self, out: &mut Vec<u8>) {
        if !self.established() {
            return;
        }
        if let Engine::Lean(r) = &mut self.engine {
            r.close_notify(out);
            return;
        }
        let _ =
            self.with_write_traffic(out, RECORD_OVERHEAD + 8, |w, buf| w.queue_close_notify(buf));
    }

    /// Brings the rustls connection to its write state (encoding anything it queued first,
    /// such as the answer to a key update) and runs `f` there on `room` bytes appended to
    /// `out`, keeping the ones it reports written.
    fn with_write_traffic(
        &mut self,
        out: &mut Vec<u8>,
        room: usize,
        f: impl FnOnce(
            &mut rustls::unbuffered::WriteTraffic<'_, rustls::server::ServerConnectionData>,
            &mut [u8],
        ) -> Result<usize, EncryptError>,
    ) -> Result<(), rustls::Error> {
        let Engine::Rustls(h) = &mut self.engine else {
            return Err(rustls::Error::HandshakeNotComplete);
        };
        let conn = &mut h.conn;
        // Each step either finishes or consumes one queued item; a handful is plenty.
        for _ in 0..16 {
            let status = conn.process_tls_records(&mut []);
            match status.state? {
                ConnectionState::WriteTraffic(mut w) => {
                    let start = out.len();
                    out.resize(start + room, 0);
                    let res = f(&mut w, out.get_mut(start..).unwrap_or_default());
                    out.truncate(start + *res.as_ref().unwrap_or(&0));
                    return res.map(drop).map_err(encrypt_error);
                }
                ConnectionState::EncodeTlsData(mut e) => encode(&mut e, out)?,
                ConnectionState::TransmitTlsData(t) => t.done(),
                ConnectionState::ReadTraffic(mut r) => while let Some(Ok(_)) = r.next_record() {},
                _ => break,
            }
        }
        Err(rustls::Error::General(
            "application data before the handshake completed".into(),
        ))
    }
}

/// Runs whichever engine holds the records over `buf`: returns the bytes it consumed and what
/// happened. A record-layer error appends its alert to `out`.
fn process(
    engine: &mut Engine,
    buf: &mut [u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> (usize, Result<ReadOutcome, rustls::Error>) {
    match engine {
        Engine::Rustls(h) => drive(h, buf, plain, out),
        Engine::Lean(records) => match records.open(buf, plain) {
            Ok(read) => (
                read.used,
                Ok(ReadOutcome {
                    peer_closed: read.peer_closed,
                    ..ReadOutcome::default()
                }),
            ),
            Err(e) => {
                records.fatal_alert(&e, out);
                (0, Err(rustls::Error::General(e.to_string())))
            }
        },
        Engine::Switching => (0, Err(rustls::Error::HandshakeNotComplete)),
    }
}

/// Hands an established TLS 1.3 connection from rustls to the lean record layer. TLS 1.2
/// (and anything unexpected) stays with rustls, which is always correct, just larger.
///
/// rustls has read nothing past the client's Finished ([`drive`]) and has encoded everything
/// it queued (the tickets): `dangerous_into_kernel_connection` refuses a connection with
/// records still queued, and takes the sequence numbers the tickets left.
///
/// With the traffic secrets rustls reported during the handshake, the lean layer derives its
/// next keys itself and rustls is dropped entirely; the connection can then move to another
/// process ([`Session::park`]).
fn go_lean(engine: &mut Engine) {
    let tls13 = matches!(engine, Engine::Rustls(h)
        if h.conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3));
    if !tls13 {
        if let Engine::Rustls(h) = engine {
            h.secrets = None; // TLS 1.2: never used.
        }
        return;
    }
    let Engine::Rustls(h) = std::mem::replace(engine, Engine::Switching) else {
        return;
    };
    let Handshake { conn, secrets, .. } = *h;
    *engine = match conn.dangerous_into_kernel_connection() {
        Ok((extracted, kernel)) => match handoff::take_over_with_secrets(
            extracted,
            kernel,
            secrets
                .as_ref()
                .map(|(ours, theirs)| (&ours[..], &theirs[..])),
        ) {
            Some(r) => Engine::Lean(r),
            None => Engine::Switching,
        },
        Err(_) => Engine::Switching,
    };
}

/// Where the record that starts at `from` ends, if all of it is in `buf`; otherwise the end of
/// `buf` (a partial record, which rustls keeps waiting for, or bytes that are no record
/// header, which rustls refuses with the right alert).
fn record_end(buf: &[u8], from: usize) -> usize {
    let rest = buf.get(from..).unwrap_or_default();
    match RecordHeader::whole_record(rest) {
        Ok(Some(len)) => from + len,
        _ => buf.len(),
    }
}

/// Runs rustls over `buf`: returns the bytes it consumed and what happened.
///
/// During the handshake rustls sees whole records one at a time, and none after the one that
/// completes it: those are the lean layer's (see the module documentation). Once established
/// (TLS 1.2, which stays with rustls) it sees everything.
fn drive(
    h: &mut Handshake,
    buf: &mut [u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> (usize, Result<ReadOutcome, rustls::Error>) {
    let Handshake {
        conn,
        secrets,
        established,
        ..
    } = h;
    let mut outcome = ReadOutcome::default();
    let mut used = 0usize;
    // How far into `buf` rustls may read.
    let mut end = if *established { buf.len() } else { 0 };
    loop {
        if end <= used && conn.is_handshaking() {
            end = record_end(buf, used);
        }
        let rest = buf.get_mut(used..end.max(used)).unwrap_or_default();
        // rustls reports the traffic secrets while it runs (`crate::tls::SecretCapture`): what
        // is captured during this call is this connection's.
        drop(crate::tls::take_captured());
        let status = conn.process_tls_records(rest);
        if let Some(captured) = crate::tls::take_captured() {
            *secrets = Some(captured);
        }
        let discard = status.discard;
        let state = match status.state {
            Ok(s) => s,
            Err(e) => return (used + discard, Err(e)),
        };
        let (mut stop, mut blocked) = (false, false);
        let step = match state {
            ConnectionState::ReadTraffic(mut r) => {
                let mut res = Ok(());
                while let Some(rec) = r.next_record() {
                    match rec {
                        Ok(rec) => plain.extend_from_slice(rec.payload),
                        Err(e) => {
                            res = Err(e);
                            break;
                        }
                    }
                }
                res
            }
            ConnectionState::ReadEarlyData(mut r) => {
                // Early data is never enabled; drain it should a future rustls offer it.
                while let Some(Ok(_)) = r.next_record() {}
                Ok(())
            }
            ConnectionState::EncodeTlsData(mut e) => encode(&mut e, out),
            ConnectionState::TransmitTlsData(t) => {
                t.done();
                Ok(())
            }
            ConnectionState::PeerClosed => {
                outcome.peer_closed = true;
                Ok(())
            }
            ConnectionState::WriteTraffic(_) => {
                *established = true;
                stop = true;
                Ok(())
            }
            ConnectionState::BlockedHandshake => {
                blocked = true;
                Ok(())
            }
            // Closed, and states of future versions.
            _ => {
                stop = true;
                Ok(())
            }
        };
        used += discard;
        if let Err(e) = step {
            return (used, Err(e));
        }
        if blocked {
            if end >= buf.len() {
                return (used, Ok(outcome)); // Waiting for the peer.
            }
            // The next record may complete a handshake message: show rustls that one too.
            end = record_end(buf, end);
        }
        if stop {
            return (used, Ok(outcome));
        }
    }
}

/// After an error, rustls may have queued an alert for the peer: append it to `out`.
fn drain_alert(conn: &mut UnbufferedServerConnection, out: &mut Vec<u8>) {
    for _ in 0..4 {
        let status = conn.process_tls_records(&mut []);
        match status.state {
            Ok(ConnectionState::EncodeTlsData(mut e)) => {
                if encode(&mut e, out).is_err() {
                    return;
                }
            }
            Ok(ConnectionState::TransmitTlsData(t)) => t.done(),
            _ => return,
        }
    }
}

fn encrypt_error(e: EncryptError) -> rustls::Error {
    rustls::Error::General(format!("encrypt: {e}"))
}

/// Why a handshake failed, as the metrics count it.
pub fn failure_reason(e: &rustls::Error) -> &'static str {
    use rustls::Error as E;
    match e {
        E::General(s) if s.contains("certificate chain") => "sni",
        E::PeerIncompatible(_) | E::NoApplicationProtocol => "incompatible",
        E::AlertReceived(_) => "alert",
        _ => "protocol",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
            let mut s =
                Session::resume(Box::new(s.park().unwrap()), Vec::new(), Vec::new()).unwrap();
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
}
