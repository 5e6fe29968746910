//! One connection's TLS state, driven through rustls' unbuffered API so that an idle secure
//! connection keeps no buffers: ciphertext is read into the worker's shared read buffer,
//! plaintext is handed over in a worker-owned buffer, and records to send are built in scratch
//! space. A connection keeps bytes only for a partial record it has not fully received and for
//! ciphertext the kernel has not taken yet; both are freed as soon as they empty.
//!
//! No socket is touched here: the caller writes what lands in `out`.

use std::sync::Arc;

use rustls::server::{ServerConfig, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, InsufficientSizeError};

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

/// A TLS server connection.
pub struct Session {
    conn: UnbufferedServerConnection,
    /// Ciphertext of a record not yet complete; empty (unallocated) almost always.
    partial: Vec<u8>,
    /// Encrypted bytes the kernel refused; empty (unallocated) almost always.
    pub unsent: Vec<u8>,
    established: bool,
    /// Some ciphertext has arrived (to tell a plain-HTTP request from a ClientHello).
    started: bool,
}

impl Session {
    /// A connection that will handshake with `config`.
    pub fn new(config: &Arc<ServerConfig>) -> Result<Session, rustls::Error> {
        Ok(Session {
            conn: UnbufferedServerConnection::new(Arc::clone(config))?,
            partial: Vec::new(),
            unsent: Vec::new(),
            established: false,
            started: false,
        })
    }

    /// Whether the handshake has completed.
    pub fn established(&self) -> bool {
        self.established
    }

    /// Whether no byte has arrived yet.
    pub fn untouched(&self) -> bool {
        !self.started
    }

    /// The negotiated protocol version, once known ("1.3" or "1.2").
    pub fn version(&self) -> Option<&'static str> {
        self.conn.protocol_version().map(|v| match v {
            rustls::ProtocolVersion::TLSv1_3 => "1.3",
            rustls::ProtocolVersion::TLSv1_2 => "1.2",
            _ => "other",
        })
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
        self.started = true;
        let mut outcome = ReadOutcome::default();
        let was_established = self.established;
        let Session {
            conn,
            partial,
            established,
            ..
        } = self;
        let joined = !partial.is_empty();
        if joined {
            partial.extend_from_slice(fresh);
        }
        let buf: &mut [u8] = if joined { partial } else { fresh };
        let mut used = 0usize;
        let result = loop {
            let rest = buf.get_mut(used..).unwrap_or_default();
            let status = conn.process_tls_records(rest);
            let discard = status.discard;
            let state = match status.state {
                Ok(s) => s,
                Err(e) => {
                    used += discard;
                    break Err(e);
                }
            };
            let mut stop = false;
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
                // BlockedHandshake (more bytes needed), Closed, and states of future versions.
                _ => {
                    stop = true;
                    Ok(())
                }
            };
            used += discard;
            if let Err(e) = step {
                break Err(e);
            }
            if stop {
                break Ok(());
            }
        };
        // Keep the unprocessed tail (a partial record) and nothing else.
        let tail_len = buf.len().saturating_sub(used);
        if joined {
            partial.drain(..used.min(partial.len()));
            if partial.is_empty() {
                *partial = Vec::new();
            }
        } else if tail_len > 0 {
            *partial = buf.get(used..).unwrap_or_default().to_vec();
        }
        if result.is_err() {
            *partial = Vec::new();
            drain_alert(conn, out);
        }
        outcome.handshake_done = !was_established && *established;
        result.map(|()| outcome)
    }

    /// Encrypts `data` (any length; split into records as needed), appending the records to
    /// `out`.
    pub fn encrypt(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), rustls::Error> {
        let records = data.len().div_ceil(MAX_RECORD).max(1);
        let room = data.len() + records * RECORD_OVERHEAD;
        self.with_write_traffic(out, |w, out| {
            let start = out.len();
            out.resize(start + room, 0);
            let res = w.encrypt(data, out.get_mut(start..).unwrap_or_default());
            match res {
                Ok(n) => {
                    out.truncate(start + n);
                    Ok(())
                }
                Err(e) => {
                    out.truncate(start);
                    Err(encrypt_error(e))
                }
            }
        })
    }

    /// Appends a close_notify alert to `out` (when the handshake has completed).
    pub fn close_notify(&mut self, out: &mut Vec<u8>) {
        if !self.established {
            return;
        }
        let _ = self.with_write_traffic(out, |w, out| {
            let start = out.len();
            out.resize(start + RECORD_OVERHEAD + 8, 0);
            match w.queue_close_notify(out.get_mut(start..).unwrap_or_default()) {
                Ok(n) => {
                    out.truncate(start + n);
                    Ok(())
                }
                Err(e) => {
                    out.truncate(start);
                    Err(encrypt_error(e))
                }
            }
        });
    }

    /// Brings the connection to its write state (encoding anything rustls queued first, such as
    /// the answer to a key update) and runs `f` there.
    fn with_write_traffic(
        &mut self,
        out: &mut Vec<u8>,
        f: impl FnOnce(
            &mut rustls::unbuffered::WriteTraffic<'_, rustls::server::ServerConnectionData>,
            &mut Vec<u8>,
        ) -> Result<(), rustls::Error>,
    ) -> Result<(), rustls::Error> {
        // Each step either finishes or consumes one queued item; a handful is plenty.
        for _ in 0..16 {
            let status = self.conn.process_tls_records(&mut []);
            match status.state? {
                ConnectionState::WriteTraffic(mut w) => return f(&mut w, out),
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

/// Encodes one queued handshake or alert record into `out`.
fn encode(
    e: &mut rustls::unbuffered::EncodeTlsData<'_, rustls::server::ServerConnectionData>,
    out: &mut Vec<u8>,
) -> Result<(), rustls::Error> {
    let start = out.len();
    let mut room = 4096;
    loop {
        out.resize(start + room, 0);
        match e.encode(out.get_mut(start..).unwrap_or_default()) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size }))
                if required_size > room =>
            {
                room = required_size;
            }
            Err(err) => {
                out.truncate(start);
                return Err(rustls::Error::General(err.to_string()));
            }
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
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(dev.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let client = rustls::ClientConnection::new(
            Arc::new(client),
            ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        (Session::new(&Arc::new(server)).unwrap(), client)
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
            assert!(s.partial.is_empty() && s.partial.capacity() == 0);
            // Client to server.
            std::io::Write::write_all(&mut c.writer(), b"GET / HTTP/1.1\r\n\r\n").unwrap();
            let (plain, _, _) = feed(&mut s, &client_out(&mut c), step);
            assert_eq!(plain, b"GET / HTTP/1.1\r\n\r\n");
            assert_eq!(
                s.partial.capacity(),
                0,
                "nothing kept once a record is whole"
            );
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
        assert_eq!(s.partial.capacity(), 0);
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

    #[test]
    fn session_is_small_once_established() {
        // The struct itself (rustls keeps its connection state inline: about 1.1 KiB); the
        // heap it owns is measured by bench/idle_memory.py --tls.
        let size = std::mem::size_of::<Session>();
        assert!(size < 1536, "{size}");
    }
}
