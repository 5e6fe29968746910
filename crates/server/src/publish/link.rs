//! The connection `clarion publish` sends its request over: plain TCP for `http://`, rustls
//! over TCP for `https://`. The API serves one request per connection for this client
//! (`Connection: close`), so rustls' blocking stream is the simple fit.
//!
//! Trust: the certificates in `--cacert` (`CLARION_CACERT`) when given, as curl's `--cacert`
//! does; otherwise the system's bundle (`SSL_CERT_FILE`, or the first of the usual paths).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

/// Where Linux distributions (and macOS) keep their bundle of trusted roots, most common first.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Arch, Alpine
    "/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",             // openSUSE
    "/etc/ssl/cert.pem",                  // macOS, Alpine, the BSDs
];

/// A connection to the API.
pub(super) enum Link {
    /// `http://`.
    Plain(TcpStream),
    /// `https://`: boxed, rustls' state is a few kilobytes.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Link {
    /// Wraps a connected socket; with `tls`, the handshake runs on the first write.
    pub(super) fn new(
        socket: TcpStream,
        tls: Option<(&str, Option<&Path>)>,
    ) -> anyhow::Result<Link> {
        let Some((host, cacert)) = tls else {
            return Ok(Link::Plain(socket));
        };
        let config = client_config(cacert)?;
        let name = ServerName::try_from(host.to_owned())
            .map_err(|_| anyhow!("{host:?} is not a name a certificate can be checked against"))?;
        let conn = rustls::ClientConnection::new(config, name)
            .map_err(|e| anyhow!("cannot start TLS: {e}"))?;
        Ok(Link::Tls(Box::new(rustls::StreamOwned::new(conn, socket))))
    }

    /// The socket's read timeout.
    pub(super) fn set_read_timeout(&self, wait: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(wait)
    }

    fn socket(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Plain(s) => s.read(buf),
            Link::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Link::Plain(s) => s.write(buf),
            Link::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Link::Plain(s) => s.flush(),
            Link::Tls(s) => s.flush(),
        }
    }
}

/// A client configuration trusting `cacert`'s certificates, or the system's.
fn client_config(cacert: Option<&Path>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let (path, given) = match cacert {
        Some(p) => (p.to_owned(), true),
        None => (
            system_bundle().ok_or_else(|| {
                anyhow!(
                    "no system bundle of trusted certificates found (SSL_CERT_FILE, {}): give the \
                 server's CA with --cacert (CLARION_CACERT)",
                    SYSTEM_BUNDLES.join(", ")
                )
            })?,
            false,
        ),
    };
    let what = if given {
        "--cacert (CLARION_CACERT)"
    } else {
        "the system bundle"
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&path)
        .with_context(|| format!("{what}: cannot read {}", path.display()))?;
    for cert in certs {
        let cert = cert.with_context(|| format!("{what}: {} is not PEM", path.display()))?;
        // A bundle may hold a certificate rustls cannot use; the others still count.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        anyhow::bail!(
            "{what}: {} holds no usable certificate; give the server's CA with --cacert \
             (CLARION_CACERT)",
            path.display()
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow!("cannot configure TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The system's bundle of trusted roots: `SSL_CERT_FILE` (as OpenSSL reads it), or the first
/// usual path that exists.
fn system_bundle() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    SYSTEM_BUNDLES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Whether an answer starts like a TLS record (a handshake or an alert) rather than HTTP: a
/// plain request reached a TLS listener that answered in TLS.
pub(super) fn looks_like_tls(answer: &[u8]) -> bool {
    matches!(answer, [0x15 | 0x16, 0x03, ..])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_record_is_told_from_http() {
        assert!(looks_like_tls(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]));
        assert!(looks_like_tls(&[0x16, 0x03, 0x01]));
        assert!(!looks_like_tls(b"HTTP/1.1 200 OK\r\n"));
        assert!(!looks_like_tls(b""));
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let err = client_config(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("--cacert") && text.contains("/nonexistent/ca.pem"),
            "{text}"
        );
    }
}
