//! The TLS side of a bench connection, shared by both workers, and as lean as the server's: a
//! million-connection run over TLS needs its clients to fit in the same machine.
//!
//! rustls' unbuffered client runs the handshake over the worker's own buffers. Once the
//! worker has the answer to its request (the `101` of an upgrade; by then the server's session
//! tickets have been read), the connection moves to proto's TLS 1.3 record layer
//! ([`clarion_proto::tls13::handoff`], the same hand-off the server makes), which keeps only the
//! raw keys of an idle connection. A connection then holds a few hundred bytes of its own plus
//! rustls' key-update state, against ~9 KB for rustls' buffered client (measured: 9,169 B per
//! connection at 40,000).
//!
//! Ciphertext is read by the worker into its shared read buffer and handed here; plaintext
//! comes back in a buffer the caller chooses. Bytes are kept only for a partial record and for
//! records the socket did not take; both are freed as soon as they empty.

use std::io::{self, Write};
use std::sync::Arc;

use clarion_proto::tls13::handoff::{self, encode, KernelKeys};
use clarion_proto::tls13::Records;
use mio::net::TcpStream;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::unbuffered::ConnectionState;
use serde::{Deserialize, Serialize};

/// TLS for every connection of a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TlsJob {
    /// PEM certificates to trust.
    pub ca_pem: String,
    /// The name to ask for (SNI) and verify.
    pub server_name: String,
    /// Offer ALPN `h2` (then `http/1.1`) and refuse a server that does not choose `h2`.
    #[serde(default)]
    pub h2: bool,
}

/// What every connection of a worker shares: the client configuration and the server name.
#[derive(Clone)]
pub struct TlsSetup {
    config: Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
    /// Every connection must end up with ALPN `h2`.
    h2: bool,
}

impl TlsJob {
    /// The configuration every connection of a worker shares.
    pub fn setup(&self) -> anyhow::Result<TlsSetup> {
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // As a browser does: h2 first when HTTP/2 is wanted, so a server without it is caught
        // by the check of what it chose rather than by a failed handshake.
        config.alpn_protocols = if self.h2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        // A fleet of distinct clients: no resumption between the bench's own connections.
        config.resumption = rustls::client::Resumption::disabled();
        // For the hand-off to the lean record layer.
        config.enable_secret_extraction = true;
        Ok(TlsSetup {
            config: Arc::new(config),
            name: rustls::pki_types::ServerName::try_from(self.server_name.clone())?,
            h2: self.h2,
        })
    }
}

/// Who protects the records. rustls' state is large and boxed only until the hand-off; the
/// lean layer is the long-lived state, so it is inline (one allocation per connection).
#[allow(clippy::large_enum_variant)]
enum Engine {
    /// rustls: the handshake and the request's answer (and all of a TLS 1.2 connection).
    Rustls(Box<UnbufferedClientConnection>),
    /// proto's record layer once the answer has arrived.
    Lean(Records<KernelKeys<ClientConnectionData>>),
    /// The hand-off failed: the connection is unusable.
    Broken,
}

struct Inner {
    engine: Engine,
    /// Ciphertext of a record not yet complete.
    partial: Vec<u8>,
    /// Records the socket has not taken yet.
    unsent: Vec<u8>,
    /// Plaintext sent before the handshake completed (the request), encrypted once it has.
    early: Vec<u8>,
    established: bool,
    /// The handshake must choose ALPN `h2`.
    h2: bool,
}

/// One connection's TLS client state: a single pointer in the connection record.
pub struct TlsClient(Box<Inner>);

impl TlsClient {
    /// A connection whose ClientHello goes out on the first [`TlsClient::flush`].
    pub fn new(setup: &TlsSetup) -> io::Result<TlsClient> {
        let mut conn = Box::new(
            UnbufferedClientConnection::new(Arc::clone(&setup.config), setup.name.clone())
                .map_err(io::Error::other)?,
        );
        let mut unsent = Vec::new();
        let mut established = false;
        drive(
            &mut conn,
            &mut [],
            &mut Vec::new(),
            &mut unsent,
            &mut established,
        )
        .map_err(io::Error::other)?;
        Ok(TlsClient(Box::new(Inner {
            engine: Engine::Rustls(conn),
            partial: Vec::new(),
            unsent,
            early: Vec::new(),
            established,
            h2: setup.h2,
        })))
    }

    /// Encrypts `plain` and writes it, after anything still waiting; before the handshake has
    /// completed it is kept and sent as soon as it has.
    pub fn send(&mut self, stream: &TcpStream, plain: &[u8]) -> io::Result<()> {
        let inner = &mut *self.0;
        if !inner.established {
            inner.early.extend_from_slice(plain);
            return self.flush(stream);
        }
        seal(&mut inner.engine, plain, &mut inner.unsent)?;
        self.flush(stream)
    }

    /// Writes whatever records are waiting (the handshake's among them), as far as the socket
    /// takes them.
    pub fn flush(&mut self, mut stream: &TcpStream) -> io::Result<()> {
        let unsent = &mut self.0.unsent;
        while !unsent.is_empty() {
            match stream.write(unsent) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    unsent.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        *unsent = Vec::new();
        Ok(())
    }

    /// Takes ciphertext just read and appends the plaintext it completes to `plain`; answers
    /// the handshake on `stream`. `Ok(true)` once the server has closed the TLS session.
    pub fn receive(
        &mut self,
        stream: &TcpStream,
        ciphertext: &[u8],
        plain: &mut Vec<u8>,
    ) -> Result<bool, String> {
        let inner = &mut *self.0;
        let mut buf = std::mem::take(&mut inner.partial);
        buf.extend_from_slice(ciphertext);
        let was_established = inner.established;
        let (used, closed) = match &mut inner.engine {
            Engine::Rustls(conn) => drive(
                conn,
                &mut buf,
                plain,
                &mut inner.unsent,
                &mut inner.established,
            )
            .map_err(|e| format!("tls: {e}"))?,
            Engine::Lean(r) => {
                let read = r.open(&mut buf, plain).map_err(|e| format!("tls: {e}"))?;
                (read.used, read.peer_closed)
            }
            Engine::Broken => return Err("tls: broken".into()),
        };
        buf.drain(..used.min(buf.len()));
        if !buf.is_empty() {
            inner.partial = buf;
        }
        if inner.established && !was_established && inner.h2 {
            if let Engine::Rustls(conn) = &inner.engine {
                check_h2(conn.alpn_protocol())?;
            }
        }
        if inner.established && !was_established && !inner.early.is_empty() {
            let early = std::mem::take(&mut inner.early);
            seal(&mut inner.engine, &early, &mut inner.unsent).map_err(|e| format!("tls: {e}"))?;
        }
        self.flush(stream)
            .map_err(|e| format!("write: {}", e.kind()))?;
        Ok(closed)
    }

    /// The request has been answered: move an established TLS 1.3 connection to the lean
    /// record layer (TLS 1.2 stays with rustls). Everything rustls received has been read by
    /// then, session tickets included; a partial record stays in our buffer for the new layer.
    pub fn settle(&mut self) {
        let inner = &mut *self.0;
        let tls13 = matches!(&inner.engine, Engine::Rustls(c)
            if inner.established && c.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3));
        if !tls13 {
            return;
        }
        let Engine::Rustls(conn) = std::mem::replace(&mut inner.engine, Engine::Broken) else {
            return;
        };
        if let Ok((secrets, kernel)) = conn.dangerous_into_kernel_connection() {
            if let Some(records) = handoff::take_over(secrets, kernel) {
                inner.engine = Engine::Lean(records);
            }
        }
    }

    /// Whether the lean record layer has taken over.
    pub fn is_lean(&self) -> bool {
        matches!(self.0.engine, Engine::Lean(_))
    }

    /// Frees the expanded keys of a connection that was quiet since the previous call (the
    /// worker sweeps once a second, as the server does).
    pub fn compact(&mut self) {
        if let Engine::Lean(r) = &mut self.0.engine {
            r.compact();
        }
    }
}

/// Whether the ALPN protocol a server chose is `h2`; the error names what it chose instead.
fn check_h2(chosen: Option<&[u8]>) -> Result<(), String> {
    match chosen {
        Some(b"h2") => Ok(()),
        Some(other) => Err(format!(
            "tls: the server chose ALPN {}, not h2",
            String::from_utf8_lossy(other)
        )),
        None => Err("tls: the server chose no ALPN protocol, not h2".into()),
    }
}

/// Writes `bytes` to a load connection, through its TLS client when it has one. Requests, pongs
/// and greetings are small and an idle socket's buffer empty, so a plain write completes.
pub(crate) fn send(
    stream: &TcpStream,
    tls: Option<&mut TlsClient>,
    bytes: &[u8],
) -> io::Result<()> {
    match tls {
        None => {
            let mut plain = stream;
            plain.write_all(bytes)
        }
        Some(t) => t.send(stream, bytes),
    }
}

/// Encrypts `plain` onto the end of `out` with whichever engine holds the keys.
fn seal(engine: &mut Engine, plain: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    match engine {
        Engine::Lean(r) => r.seal(plain, out).map_err(io::Error::other),
        Engine::Rustls(conn) => seal_with_rustls(conn, plain, out),
        Engine::Broken => Err(io::Error::other("tls: broken")),
    }
}

/// Runs rustls over `buf`: plaintext to `plain`, records to send to `out`; returns the bytes
/// it consumed and whether the server closed.
fn drive(
    conn: &mut UnbufferedClientConnection,
    buf: &mut [u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
    established: &mut bool,
) -> Result<(usize, bool), rustls::Error> {
    let (mut used, mut closed) = (0usize, false);
    loop {
        let rest = buf.get_mut(used..).unwrap_or_default();
        let status = conn.process_tls_records(rest);
        let discard = status.discard;
        let mut stop = false;
        match status.state? {
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(rec) = r.next_record() {
                    plain.extend_from_slice(rec?.payload);
                }
            }
            ConnectionState::EncodeTlsData(mut e) => encode(&mut e, out)?,
            ConnectionState::TransmitTlsData(t) => t.done(),
            ConnectionState::PeerClosed => closed = true,
            ConnectionState::WriteTraffic(_) => {
                *established = true;
                stop = true;
            }
            // BlockedHandshake (more bytes needed), Closed, and states of future versions.
            _ => stop = true,
        }
        used += discard;
        if stop {
            return Ok((used, closed));
        }
    }
}

/// Encrypts `plain` with rustls (before the hand-off: the request itself).
fn seal_with_rustls(
    conn: &mut UnbufferedClientConnection,
    plain: &[u8],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    for _ in 0..16 {
        match conn.process_tls_records(&mut []).state {
            Ok(ConnectionState::WriteTraffic(mut w)) => {
                let start = out.len();
                // Each record adds at most 22 bytes in TLS 1.3 (header, type, tag); TLS 1.2's
                // explicit nonce makes it 29.
                let records = plain.len().div_ceil(16 * 1024).max(1);
                out.resize(start + plain.len() + records * 32, 0);
                let n = w
                    .encrypt(plain, out.get_mut(start..).unwrap_or_default())
                    .map_err(|e| io::Error::other(e.to_string()))?;
                out.truncate(start + n);
                return Ok(());
            }
            Ok(ConnectionState::EncodeTlsData(mut e)) => {
                encode(&mut e, out).map_err(io::Error::other)?
            }
            Ok(ConnectionState::TransmitTlsData(t)) => t.done(),
            Ok(ConnectionState::ReadTraffic(mut r)) => while let Some(Ok(_)) = r.next_record() {},
            Ok(_) => break,
            Err(e) => return Err(io::Error::other(e)),
        }
    }
    Err(io::Error::other("tls: data before the handshake completed"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::{Duration, Instant};

    /// A CA and a `localhost` certificate it signs: (CA PEM, chain PEM, key PEM).
    fn certs() -> (String, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf_cert = leaf
            .signed_by(&leaf_key, &Issuer::new(ca, &ca_key))
            .unwrap();
        (
            ca_cert.pem(),
            format!("{}{}", leaf_cert.pem(), ca_cert.pem()),
            leaf_key.serialize_pem(),
        )
    }

    /// rustls' own server (sending its default two session tickets), the other end of a
    /// loopback connection, driven by hand.
    struct Server {
        conn: rustls::ServerConnection,
        sock: std::net::TcpStream,
        plain: Vec<u8>,
    }

    impl Server {
        fn pump(&mut self) {
            let mut buf = [0u8; 16384];
            loop {
                match self.sock.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        self.conn.read_tls(&mut &buf[..n]).unwrap();
                        self.conn.process_new_packets().unwrap();
                    }
                    Err(_) => break,
                }
            }
            let _ = self.conn.reader().read_to_end(&mut self.plain);
            while self.conn.wants_write() {
                self.conn.write_tls(&mut self.sock).unwrap();
            }
        }
        fn say(&mut self, bytes: &[u8]) {
            self.conn.writer().write_all(bytes).unwrap();
            self.pump();
        }
    }

    fn pair(
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> (TlsClient, TcpStream, Server) {
        pair_with(versions, &[], false)
    }

    /// A pair whose server offers `server_alpn` and whose client asks for h2 or not.
    fn pair_with(
        versions: &[&'static rustls::SupportedProtocolVersion],
        server_alpn: &[&[u8]],
        h2: bool,
    ) -> (TlsClient, TcpStream, Server) {
        use rustls::pki_types::pem::PemObject as _;
        let (ca, chain, key) = certs();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                rustls::pki_types::CertificateDer::pem_slice_iter(chain.as_bytes())
                    .collect::<Result<_, _>>()
                    .unwrap(),
                rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap();
        config.alpn_protocols = server_alpn.iter().map(|p| p.to_vec()).collect();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.set_nonblocking(true).unwrap();
        let (sock, _) = listener.accept().unwrap();
        sock.set_nonblocking(true).unwrap();
        let setup = TlsJob {
            ca_pem: ca,
            server_name: "localhost".into(),
            h2,
        }
        .setup()
        .unwrap();
        let server = Server {
            conn: rustls::ServerConnection::new(Arc::new(config)).unwrap(),
            sock,
            plain: Vec::new(),
        };
        (
            TlsClient::new(&setup).unwrap(),
            TcpStream::from_std(client),
            server,
        )
    }

    /// Moves bytes both ways until `done` (or fails after two seconds).
    fn until(
        c: &mut TlsClient,
        stream: &TcpStream,
        s: &mut Server,
        plain: &mut Vec<u8>,
        done: impl Fn(&TlsClient, &Server, &[u8]) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !done(c, s, plain) {
            assert!(Instant::now() < deadline, "stuck");
            c.flush(stream).unwrap();
            s.pump();
            let mut buf = [0u8; 16384];
            // Fed a few bytes at a time: records arrive split across reads.
            while let Ok(n) = (&mut &*stream).read(&mut buf[..7]) {
                if n == 0 {
                    break;
                }
                assert!(!c.receive(stream, &buf[..n], plain).unwrap());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn upgrade_then_talk(versions: &[&'static rustls::SupportedProtocolVersion], lean: bool) {
        let (mut c, stream, mut s) = pair(versions);
        let mut plain = Vec::new();
        // The request goes out before the handshake has completed, as the workers send it.
        c.send(&stream, b"GET /ws HTTP/1.1\r\n\r\n").unwrap();
        until(&mut c, &stream, &mut s, &mut plain, |_, s, _| {
            s.plain.ends_with(b"\r\n\r\n")
        });
        assert_eq!(s.plain, b"GET /ws HTTP/1.1\r\n\r\n");
        s.say(b"HTTP/1.1 101 Switching Protocols\r\n\r\n");
        until(&mut c, &stream, &mut s, &mut plain, |_, _, p| {
            p.ends_with(b"\r\n\r\n")
        });
        c.settle();
        assert_eq!(c.is_lean(), lean);
        // Both directions after the hand-off, several records at once.
        plain.clear();
        s.say(b"first");
        s.say(&[b'x'; 40_000]);
        c.send(&stream, b"pong").unwrap();
        until(&mut c, &stream, &mut s, &mut plain, |_, s, p| {
            p.len() == 40_005 && s.plain.ends_with(b"pong")
        });
        assert!(plain.starts_with(b"firstxx"));
        c.compact();
        c.send(&stream, b"again").unwrap();
        until(&mut c, &stream, &mut s, &mut plain, |_, s, _| {
            s.plain.ends_with(b"again")
        });
        // The server's close_notify is reported.
        s.conn.send_close_notify();
        s.pump();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 512];
        loop {
            assert!(Instant::now() < deadline, "close_notify not seen");
            if let Ok(n) = (&mut &stream).read(&mut buf) {
                if c.receive(&stream, &buf[..n], &mut plain).unwrap() {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn tls13_hands_over_to_the_lean_record_layer_after_the_answer() {
        upgrade_then_talk(&[&rustls::version::TLS13], true);
    }

    #[test]
    fn tls12_stays_with_rustls_and_still_works() {
        upgrade_then_talk(&[&rustls::version::TLS12], false);
    }

    #[test]
    fn h2_is_offered_and_a_server_that_does_not_choose_it_is_refused_clearly() {
        // A server that speaks h2: the handshake completes, h2 chosen.
        let (mut c, stream, mut s) = pair_with(&[&rustls::version::TLS13], &[b"h2"], true);
        let mut plain = Vec::new();
        c.send(&stream, b"PRI").unwrap();
        until(&mut c, &stream, &mut s, &mut plain, |_, s, _| {
            s.plain == b"PRI"
        });
        assert_eq!(s.conn.alpn_protocol(), Some(&b"h2"[..]));
        // One that chooses HTTP/1.1 (the client offered both, as a browser does).
        for (server, error) in [
            (
                &[&b"http/1.1"[..]][..],
                "tls: the server chose ALPN http/1.1, not h2",
            ),
            (&[][..], "tls: the server chose no ALPN protocol, not h2"),
        ] {
            let (mut c, stream, mut s) = pair_with(&[&rustls::version::TLS13], server, true);
            let deadline = Instant::now() + Duration::from_secs(2);
            let e = loop {
                assert!(Instant::now() < deadline, "stuck");
                c.flush(&stream).unwrap();
                s.pump();
                let mut buf = [0u8; 16384];
                if let Ok(n) = (&mut &stream).read(&mut buf) {
                    if let Err(e) = c.receive(&stream, &buf[..n], &mut Vec::new()) {
                        break e;
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            assert_eq!(e, error);
        }
        // Without --http2 only http/1.1 is offered.
        assert_eq!(check_h2(Some(b"h2")), Ok(()));
    }
}
