//! The byte stream to one Redis: plain TCP (`redis://`) or TLS over it (`rediss://`), and the
//! TLS client settings every Redis connection of the process shares.
//!
//! It owns the socket and, with TLS, the rustls session: bytes in and out, the handshake and
//! its errors in words an operator can act on. It knows nothing of RESP or of what the
//! connection is used for ([`super::conn`] does).
//!
//! **One TLS session, two threads.** The subscriber connection is read by the reader thread
//! while callers write `SSUBSCRIBE`s on it. A plain socket is cloned into two handles; a TLS
//! session cannot be split (one record sequence each way, one key schedule, and a read may have
//! to answer with a write: a key update). So the session sits behind a mutex, shared by the
//! reading [`Stream`] and its [`Writer`]s, and the reader never holds the mutex while it waits:
//! it waits on the socket with `peek` (bounded by the socket's read timeout), then takes the
//! lock only to pull the bytes that arrived through rustls, which never blocks. A writer
//! therefore waits at most for one decryption, never for Redis, and a command is encrypted and
//! sent by the thread that issues it, at once, as with plain TCP. (Handing commands to the
//! reader thread instead would cost every `SSUBSCRIBE` a wake-up of that thread, a hop the
//! plain path does not pay.)

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ClientConnection, RootCertStore, SignatureScheme};

use crate::hub::lock;

/// The TLS settings for Redis, as configured (`redis_tls_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file of the CAs to trust instead of the system's.
    pub ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for mutual TLS; goes with `key`.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
    /// The name to ask for (SNI) and verify instead of the URL's host.
    pub server_name: Option<String>,
}

/// Where the system's CA bundle is on common systems (Debian and Ubuntu, Alpine and Arch
/// first; Fedora and RHEL; openSUSE; macOS and the BSDs). `SSL_CERT_FILE` overrides, as it
/// does for OpenSSL.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The TLS client configuration shared by every Redis connection of the process.
#[derive(Debug)]
pub struct RedisTls {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl RedisTls {
    /// Reads the CA file (or the system bundle) and the client certificate, once at startup:
    /// a missing or unreadable file stops startup with its name and reason.
    pub fn load(files: &TlsFiles) -> Result<RedisTls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        match &files.ca {
            Some(ca) => {
                for der in read_certs(ca)? {
                    roots
                        .add(der)
                        .map_err(|e| format!("redis_tls_ca {}: {e}", ca.display()))?;
                }
            }
            None => {
                let bundle = system_bundle().ok_or_else(|| {
                    format!(
                        "rediss://: no system CA bundle found (SSL_CERT_FILE, {}); set redis_tls_ca",
                        SYSTEM_BUNDLES.join(", ")
                    )
                })?;
                // A system bundle may hold a certificate webpki cannot use; skip it, as the
                // system's own TLS libraries do.
                roots.add_parsable_certificates(read_certs(&bundle)?);
            }
        }
        if roots.is_empty() {
            return Err("rediss://: no CA certificate to trust (redis_tls_ca)".to_owned());
        }
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("rediss://: {e}"))?
            .with_root_certificates(roots);
        let config = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => {
                let pair = crate::tls::CertFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                };
                let ck = crate::tls::load_pair(&pair, &provider)
                    .map_err(|e| format!("redis_tls_cert/redis_tls_key: {e}"))?;
                builder.with_client_cert_resolver(Arc::new(ClientCert(Arc::new(ck))))
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err(
                "redis_tls_cert and redis_tls_key go together: set both (mutual TLS) or neither"
                    .to_owned(),
            ),
        };
        let server_name = match &files.server_name {
            Some(n) => Some(
                ServerName::try_from(n.clone())
                    .map_err(|e| format!("redis_tls_server_name {n:?}: {e}"))?,
            ),
            None => None,
        };
        Ok(RedisTls {
            config: Arc::new(config),
            server_name,
        })
    }

    /// The name verified for `host`: the override, else the host (an IP address is checked
    /// against the certificate's IP addresses).
    fn name_for(&self, host: &str) -> Result<ServerName<'static>, String> {
        if let Some(n) = &self.server_name {
            return Ok(n.clone());
        }
        ServerName::try_from(host.to_owned()).map_err(|e| {
            format!("{host:?} is not a name TLS can verify ({e}); set redis_tls_server_name")
        })
    }
}

/// The TLS settings for the configured `broker` URLs: loaded when one of them is
/// `rediss://`, `None` otherwise (the configuration refuses `redis_tls_*` without one).
pub fn for_config(config: &crate::config::Config) -> Result<Option<Arc<RedisTls>>, String> {
    let files = TlsFiles {
        ca: config.redis_tls_ca.clone(),
        cert: config.redis_tls_cert.clone(),
        key: config.redis_tls_key.clone(),
        server_name: config.redis_tls_server_name.clone(),
    };
    let urls = config.broker.as_deref().unwrap_or_default();
    if !urls.split(',').any(|u| u.trim().starts_with("rediss")) {
        return Ok(None);
    }
    RedisTls::load(&files).map(|t| Some(Arc::new(t)))
}

fn system_bundle() -> Option<PathBuf> {
    let env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    env.into_iter()
        .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let why = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| why(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| why(&e))?;
    if certs.is_empty() {
        return Err(why(&"no CERTIFICATE in the file"));
    }
    Ok(certs)
}

/// The one client certificate, offered to every Redis that asks.
#[derive(Debug)]
struct ClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for ClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Why the TLS layer failed, in words that say what to check.
pub fn explain(host: &str, e: &io::Error) -> String {
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => format!(
                "TLS with {host}: the server closed the connection ({e}); is it a TLS port, \
                 and does it want a client certificate (redis_tls_cert)?"
            ),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                "TLS with {host}: no TLS answer in time; is it a TLS port (a plain redis:// \
                 one waits silently)?"
            ),
            _ => format!("TLS with {host}: {e}"),
        };
    };
    match tls {
        rustls::Error::InvalidCertificate(c) => {
            format!("TLS with {host}: certificate verification failed for {host}: {c}")
        }
        rustls::Error::InvalidMessage(_) => format!(
            "TLS with {host}: the server does not speak TLS ({tls}); is it a plain redis:// port?"
        ),
        rustls::Error::AlertReceived(a) => {
            format!("TLS with {host}: the server refused the handshake ({a:?}); does it want a client certificate (redis_tls_cert), or trust ours?")
        }
        other => format!("TLS with {host}: {other}"),
    }
}

/// The TLS session, shared by the reader and the writers (see the module doc).
type Session = Mutex<ClientConnection>;

/// One connection's byte stream, read by one thread.
pub struct Stream {
    sock: TcpStream,
    tls: Option<Arc<Session>>,
}

/// A handle that writes on a [`Stream`] another thread reads.
pub struct Writer {
    sock: TcpStream,
    tls: Option<Arc<Session>>,
}

impl Stream {
    /// Plain TCP.
    pub fn plain(sock: TcpStream) -> Stream {
        Stream { sock, tls: None }
    }

    /// TLS over `sock`: the handshake is done here, within the socket's timeouts; `host` is
    /// what the certificate must be valid for (unless overridden).
    pub fn tls(sock: TcpStream, settings: &RedisTls, host: &str) -> Result<Stream, String> {
        let name = settings.name_for(host)?;
        let shown = name.to_str().into_owned();
        let mut tls = ClientConnection::new(Arc::clone(&settings.config), name)
            .map_err(|e| format!("TLS with {shown}: {e}"))?;
        let mut io = &sock;
        while tls.is_handshaking() {
            match tls.complete_io(&mut io) {
                Ok((0, 0)) if tls.is_handshaking() => {
                    let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "during the handshake");
                    return Err(explain(&shown, &eof));
                }
                Ok(_) => {}
                Err(e) => {
                    // Tell the server why (the alert rustls queued), as far as it listens.
                    let _ = tls.write_tls(&mut io);
                    return Err(explain(&shown, &e));
                }
            }
        }
        Ok(Stream {
            sock,
            tls: Some(Arc::new(Mutex::new(tls))),
        })
    }

    /// Reads what has arrived (waiting up to the read timeout): `Ok(0)` is the end.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(session) = &self.tls else {
            return self.sock.read(buf);
        };
        loop {
            {
                let mut s = lock(session);
                match s.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    done => return done,
                }
            }
            // Wait for bytes without the lock, so writers are not held up meanwhile.
            if self.sock.peek(&mut [0u8; 1])? == 0 {
                return Ok(0);
            }
            let mut s = lock(session);
            let mut io = &self.sock;
            s.read_tls(&mut io)?;
            let processed = s.process_new_packets();
            // Whatever the session must send (an alert, a key update answer) goes now.
            while s.wants_write() {
                s.write_tls(&mut io)?;
            }
            if let Err(e) = processed {
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        }
    }

    /// Writes all of `data`.
    pub fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        write_on(&self.sock, self.tls.as_deref(), data)
    }

    /// Changes the read timeout.
    pub fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        self.sock.set_read_timeout(Some(t))
    }

    /// A handle to write on while this one reads.
    pub fn writer(&self) -> io::Result<Writer> {
        Ok(Writer {
            sock: self.sock.try_clone()?,
            tls: self.tls.clone(),
        })
    }

    /// Closes both directions, waking a thread blocked reading it.
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

impl Writer {
    /// Writes all of `data` (encrypted first with TLS).
    pub fn write_all(&self, data: &[u8]) -> io::Result<()> {
        write_on(&self.sock, self.tls.as_deref(), data)
    }

    /// Closes both directions, waking the thread reading the stream.
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

fn write_on(sock: &TcpStream, tls: Option<&Session>, data: &[u8]) -> io::Result<()> {
    let mut io = sock;
    let Some(session) = tls else {
        return io.write_all(data);
    };
    let mut s = lock(session);
    let mut rest = data;
    // In pieces the session's send buffer takes, each sent before the next is encrypted, so a
    // large pipeline costs no more memory than with plain TCP.
    while !rest.is_empty() {
        let n = s.writer().write(rest)?;
        while s.wants_write() {
            s.write_tls(&mut io)?;
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "TLS session closed",
            ));
        }
        rest = rest.get(n..).unwrap_or_default();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("clarion-redis-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn settings_load_and_refuse_half_a_client_certificate() {
        let dir = temp("load");
        let dev = crate::tls::dev_cert(&[]).unwrap();
        let (ca, chain, key) = (
            dir.join("ca.pem"),
            dir.join("chain.pem"),
            dir.join("key.pem"),
        );
        std::fs::write(&ca, &dev.ca_pem).unwrap();
        std::fs::write(&chain, &dev.chain_pem).unwrap();
        std::fs::write(&key, &dev.key_pem).unwrap();
        let mut files = TlsFiles {
            ca: Some(ca.clone()),
            ..TlsFiles::default()
        };
        assert!(RedisTls::load(&files).is_ok());
        files.cert = Some(chain.clone());
        let half = RedisTls::load(&files).unwrap_err();
        assert!(half.contains("go together"), "{half}");
        files.key = Some(key);
        assert!(RedisTls::load(&files).is_ok());
        files.ca = Some(dir.join("missing.pem"));
        let missing = RedisTls::load(&files).unwrap_err();
        assert!(missing.contains("missing.pem"), "{missing}");
        files.ca = Some(ca);
        files.server_name = Some("not a name!".into());
        assert!(RedisTls::load(&files)
            .unwrap_err()
            .contains("redis_tls_server_name"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn hosts_become_dns_names_or_ip_addresses() {
        let dir = temp("names");
        let dev = crate::tls::dev_cert(&[]).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, &dev.ca_pem).unwrap();
        let mut files = TlsFiles {
            ca: Some(ca),
            ..TlsFiles::default()
        };
        let t = RedisTls::load(&files).unwrap();
        assert!(matches!(
            t.name_for("cache.example"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(matches!(
            t.name_for("127.0.0.1"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(t.name_for("::1"), Ok(ServerName::IpAddress(_))));
        files.server_name = Some("redis.internal".into());
        let t = RedisTls::load(&files).unwrap();
        assert_eq!(t.name_for("10.0.0.5").unwrap().to_str(), "redis.internal");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A TLS server's configuration serving `chain`/`key` (written to files in `dir`), and the
    /// path of a file holding `ca` for the client to trust.
    fn server_config(
        dir: &Path,
        chain: &str,
        key: &str,
        ca: &str,
    ) -> (rustls::ServerConfig, std::path::PathBuf) {
        let (chain_file, key_file, ca_file) =
            (dir.join("c.pem"), dir.join("k.pem"), dir.join("ca.pem"));
        std::fs::write(&chain_file, chain).unwrap();
        std::fs::write(&key_file, key).unwrap();
        std::fs::write(&ca_file, ca).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let pair = crate::tls::CertFiles {
            cert: chain_file,
            key: key_file.clone(),
        };
        let ck = crate::tls::load_pair(&pair, &provider).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(ck.cert.clone(), pem_key(&key_file))
            .unwrap();
        (config, ca_file)
    }

    #[test]
    fn a_handshake_with_the_wrong_ca_says_verification_failed() {
        let dir = temp("wrongca");
        let server = crate::tls::dev_cert(&[]).unwrap();
        let other = crate::tls::dev_cert(&[]).unwrap();
        let (config, ca) = server_config(&dir, &server.chain_pem, &server.key_pem, &other.ca_pem);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let _ = conn.complete_io(&mut s);
        });
        let tls = RedisTls::load(&TlsFiles {
            ca: Some(ca),
            ..TlsFiles::default()
        })
        .unwrap();
        let sock = TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let err = Stream::tls(sock, &tls, "127.0.0.1").err().unwrap();
        assert!(
            err.contains("certificate verification failed for 127.0.0.1"),
            "{err}"
        );
        srv.join().unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_writer_is_not_held_up_by_the_reader_waiting_on_the_same_session() {
        let dir = temp("shared");
        let dev = crate::tls::dev_cert(&[]).unwrap();
        let (config, ca) = server_config(&dir, &dev.chain_pem, &dev.key_pem, &dev.ca_pem);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // An echo server: what it reads, it writes back.
        let srv = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, s);
            let mut buf = [0u8; 64];
            while let Ok(n) = tls.read(&mut buf) {
                if n == 0 || tls.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        let tls = RedisTls::load(&TlsFiles {
            ca: Some(ca),
            ..TlsFiles::default()
        })
        .unwrap();
        let sock = TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut stream = Stream::tls(sock, &tls, "localhost").unwrap();
        let writer = stream.writer().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            while got.len() < 6 {
                let n = stream.read(&mut buf).unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
            }
            (got, stream)
        });
        // The reader is now waiting (up to 5 s) for bytes; the writer goes through at once.
        std::thread::sleep(Duration::from_millis(100));
        let began = std::time::Instant::now();
        writer.write_all(b"ping\r\n").unwrap();
        assert!(began.elapsed() < Duration::from_secs(1));
        let (got, stream) = reader.join().unwrap();
        assert_eq!(got, b"ping\r\n");
        stream.shutdown();
        srv.join().unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    fn pem_key(path: &Path) -> rustls::pki_types::PrivateKeyDer<'static> {
        rustls::pki_types::PrivateKeyDer::from_pem_file(path).unwrap()
    }
}
