//! TLS setup shared by every worker: certificates read from PEM files, the certificate chosen
//! per handshake by SNI, re-reading the files without a restart, and the rustls `ServerConfig`.
//!
//! Per-connection TLS state (records in and out of one socket) lives in `worker::tls`; this
//! module never touches a client socket. Reloading swaps the certificate set behind the
//! resolver: handshakes that start afterwards use the new certificates, established
//! connections keep their keys and are not disturbed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert, ServerConfig};
use rustls::sign::CertifiedKey;
use serde::Deserialize;

/// One certificate chain and its private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertFiles {
    /// The chain: the server's certificate first, then intermediates.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why TLS could not be set up or reloaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: String,
        /// What was wrong with it.
        why: String,
    },
    /// The key does not belong to the certificate, or the key type is not supported.
    #[error("{path}: {why}")]
    Key {
        /// The key file.
        path: String,
        /// rustls' reason.
        why: String,
    },
    /// TLS is enabled without any certificate.
    #[error("TLS needs at least one certificate (tls_cert and tls_key)")]
    NoCertificate,
    /// rustls refused the protocol settings.
    #[error("TLS settings: {0}")]
    Config(#[from] rustls::Error),
}

/// The certificates in use: the first is the default.
#[derive(Debug)]
struct CertSet {
    keys: Vec<Arc<CertifiedKey>>,
}

impl CertSet {
    /// The certificate for `sni`: the first one valid for the name; without a match, the default
    /// one unless `strict` (then none, and the handshake fails with an alert).
    fn choose(&self, sni: Option<&str>, strict: bool) -> Option<Arc<CertifiedKey>> {
        let Some(name) = sni.and_then(|s| ServerName::try_from(s).ok()) else {
            return if strict && sni.is_some() {
                None
            } else {
                self.keys.first().cloned()
            };
        };
        let valid_for = |ck: &CertifiedKey| {
            ck.end_entity_cert().is_ok_and(|der| {
                webpki::EndEntityCert::try_from(der)
                    .is_ok_and(|ee| ee.verify_is_valid_for_subject_name(&name).is_ok())
            })
        };
        match self.keys.iter().find(|ck| valid_for(ck)) {
            Some(ck) => Some(Arc::clone(ck)),
            None if strict => None,
            None => self.keys.first().cloned(),
        }
    }
}

/// Chooses the certificate of each handshake from the current set; the set can be replaced
/// while handshakes run.
#[derive(Debug)]
struct Resolver {
    set: RwLock<Arc<CertSet>>,
    strict: bool,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let set = match self.set.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        };
        set.choose(hello.server_name(), self.strict)
    }
}

/// The body of the `400` a plain HTTP request gets on any TLS listener (clients' and the
/// API's), in plain text as nginx answers it: a TLS alert would reach nobody who can read it.
pub const PLAINTEXT_REFUSAL: &str = "this port speaks TLS: use https:// or wss://\n";

/// Whether the first byte a client sent starts a plain HTTP request (a method is upper-case
/// letters) rather than a TLS record (a ClientHello starts with record type 22).
pub fn starts_plain_http(first: u8) -> bool {
    first.is_ascii_uppercase()
}

/// TLS protocol settings (from [`crate::config::Config`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Certificates; the first is the default.
    pub certs: Vec<CertFiles>,
    /// Refuse handshakes whose SNI matches no certificate (alert `unrecognized_name`)
    /// instead of answering with the default certificate.
    pub strict_sni: bool,
    /// Offer TLS 1.2 as well as 1.3.
    pub tls12: bool,
    /// Offer HTTP/2 (ALPN `h2`) before HTTP/1.1.
    pub http2: bool,
}

/// The loaded TLS setup: a rustls configuration whose certificates can be reloaded.
pub struct Tls {
    config: Arc<ServerConfig>,
    resolver: Arc<Resolver>,
    settings: Settings,
    /// Modification times of the files when last loaded, to notice replaced files.
    stamps: Mutex<Vec<Option<SystemTime>>>,
}

impl Tls {
    /// Reads the certificates and builds the configuration.
    pub fn load(settings: Settings) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let stamps = file_stamps(&settings.certs);
        let set = load_set(&settings.certs, &provider)?;
        let resolver = Arc::new(Resolver {
            set: RwLock::new(Arc::new(set)),
            strict: settings.strict_sni,
        });
        let versions: &[&rustls::SupportedProtocolVersion] = if settings.tls12 {
            &[&rustls::version::TLS13, &rustls::version::TLS12]
        } else {
            &[&rustls::version::TLS13]
        };
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&resolver) as Arc<dyn ResolvesServerCert>);
        // Browsers offer h2 and http/1.1: h2 first when HTTP/2 is on (the client's preface then
        // tells the worker). A client that offers ALPN with neither is refused
        // (`no_application_protocol`).
        config.alpn_protocols = if settings.http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        // Stateless resumption tickets: a reconnecting client skips the certificate signature,
        // which is most of a handshake's CPU, and the server keeps nothing per session. One
        // ticket is enough for a client that keeps one connection.
        config.ticketer = rustls::crypto::ring::Ticketer::new()?;
        config.send_tls13_tickets = 1;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        // After the handshake, established TLS 1.3 connections hand their traffic keys to
        // Clarion's own record layer (`clarion_proto::tls13`, via `clarion_proto::tls13::handoff`), which
        // keeps far less per connection than a whole rustls connection.
        config.enable_secret_extraction = true;
        // And the traffic secrets behind those keys, so that the record layer derives its
        // next keys itself and can be handed to a replacing process (`--upgrade-from`).
        config.key_log = Arc::new(SecretCapture);
        Ok(Tls {
            config: Arc::new(config),
            resolver,
            settings,
            stamps: Mutex::new(stamps),
        })
    }

    /// The configuration every new connection starts from.
    pub fn config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// Re-reads every certificate file. On success the new set serves every handshake from
    /// now on; on failure the old set stays and the reason is returned.
    pub fn reload(&self) -> Result<usize, TlsError> {
        let provider = Arc::clone(self.config.crypto_provider());
        let stamps = file_stamps(&self.settings.certs);
        let set = load_set(&self.settings.certs, &provider)?;
        let n = set.keys.len();
        match self.resolver.set.write() {
            Ok(mut g) => *g = Arc::new(set),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(set),
        }
        if let Ok(mut s) = self.stamps.lock() {
            *s = stamps;
        }
        Ok(n)
    }

    /// Whether any certificate or key file changed since it was last loaded.
    pub fn files_changed(&self) -> bool {
        let now = file_stamps(&self.settings.certs);
        self.stamps.lock().is_ok_and(|s| *s != now)
    }
}

fn file_stamps(certs: &[CertFiles]) -> Vec<Option<SystemTime>> {
    certs
        .iter()
        .flat_map(|c| [&c.cert, &c.key])
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

fn load_set(certs: &[CertFiles], provider: &CryptoProvider) -> Result<CertSet, TlsError> {
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let keys = certs
        .iter()
        .map(|c| load_pair(c, provider).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CertSet { keys })
}

/// Reads one certificate chain and its key (also the Redis client certificate).
pub(crate) fn load_pair(
    files: &CertFiles,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let file_err = |path: &Path, why: String| TlsError::File {
        path: path.display().to_string(),
        why,
    };
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| file_err(&files.cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(&files.cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_err(&files.cert, "no CERTIFICATE in the file".into()));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| file_err(&files.key, e.to_string()))?;
    let key_err = |e: rustls::Error| TlsError::Key {
        path: files.key.display().to_string(),
        why: e.to_string(),
    };
    let ck = CertifiedKey::from_der(chain, key, provider).map_err(key_err)?;
    Ok(ck)
}

/// A development CA and a certificate it signed for `localhost`, `127.0.0.1` and `::1` (plus
/// `names`): what `clarion cert --dev` writes. Clients trust the CA file (`curl --cacert`,
/// `NODE_EXTRA_CA_CERTS`, Python's `cafile`); the server uses the chain and key.
pub struct DevCert {
    /// The CA certificate (PEM), to give to clients.
    pub ca_pem: String,
    /// The server's chain (PEM): its certificate, then the CA.
    pub chain_pem: String,
    /// The server's private key (PKCS#8 PEM).
    pub key_pem: String,
}

/// Makes a fresh development CA and server certificate (ECDSA P-256, valid for a year).
pub fn dev_cert(names: &[String]) -> Result<DevCert, rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let now = SystemTime::now();
    let year = std::time::Duration::from_secs(365 * 24 * 3600);
    let day = std::time::Duration::from_secs(24 * 3600);

    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "Clarion development CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = (now - day).into();
    ca.not_after = (now + year).into();
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;

    let mut sans = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    sans.extend(names.iter().cloned());
    let mut leaf = CertificateParams::new(sans)?;
    leaf.distinguished_name = DistinguishedName::new();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = (now - day).into();
    leaf.not_after = (now + year).into();
    let leaf_key = KeyPair::generate()?;
    let issuer = Issuer::new(ca, &ca_key);
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;

    Ok(DevCert {
        ca_pem: ca_cert.pem(),
        chain_pem: format!("{}{}", leaf_cert.pem(), ca_cert.pem()),
        key_pem: leaf_key.serialize_pem(),
    })
}

/// The application traffic secrets rustls derives during one call into a server connection
/// (our `SERVER_TRAFFIC_SECRET_0` and the client's `CLIENT_TRAFFIC_SECRET_0`), handed to the
/// lean record layer at the end of the handshake ([`crate::worker::tls`]). rustls reports them
/// through its key-log hook, synchronously on the thread that is driving the connection; the
/// worker takes them right after each call ([`take_captured`]), so they cannot mix between
/// connections. Nothing is written anywhere: the secrets stay in this process's memory, as the
/// keys derived from them already do.
#[derive(Debug)]
pub struct SecretCapture;

/// A traffic secret, wiped when dropped.
pub type Secret = zeroize::Zeroizing<Vec<u8>>;

/// Secrets captured on this thread since the last [`take_captured`]: (ours, the client's).
type Captured = (Option<Secret>, Option<Secret>);

thread_local! {
    static CAPTURED: std::cell::RefCell<Captured> = const { std::cell::RefCell::new((None, None)) };
}

impl rustls::KeyLog for SecretCapture {
    fn will_log(&self, label: &str) -> bool {
        matches!(label, "SERVER_TRAFFIC_SECRET_0" | "CLIENT_TRAFFIC_SECRET_0")
    }

    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let secret = Some(zeroize::Zeroizing::new(secret.to_vec()));
        CAPTURED.with(|c| {
            let mut c = c.borrow_mut();
            match label {
                "SERVER_TRAFFIC_SECRET_0" => c.0 = secret,
                "CLIENT_TRAFFIC_SECRET_0" => c.1 = secret,
                _ => {}
            }
        });
    }
}

/// The application traffic secrets (ours, the client's) captured on this thread since the
/// previous call, if rustls reported both; either way nothing stays behind.
pub fn take_captured() -> Option<(Secret, Secret)> {
    CAPTURED.with(|c| match std::mem::take(&mut *c.borrow_mut()) {
        (Some(ours), Some(theirs)) => Some((ours, theirs)),
        _ => None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write_dev(dir: &Path, name: &str) -> CertFiles {
        let d = dev_cert(&[name.to_owned()]).unwrap();
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, d.chain_pem).unwrap();
        std::fs::write(&key, d.key_pem).unwrap();
        CertFiles { cert, key }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("clarion-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn names_of(ck: &CertifiedKey) -> Vec<u8> {
        ck.end_entity_cert().unwrap().to_vec()
    }

    #[test]
    fn sni_picks_the_matching_certificate_and_falls_back_unless_strict() {
        let dir = tempdir("sni");
        let a = write_dev(&dir, "a.example");
        let b = write_dev(&dir, "b.example");
        let provider = rustls::crypto::ring::default_provider();
        let set = load_set(&[a, b], &provider).unwrap();
        let first = names_of(&set.keys[0]);
        let second = names_of(&set.keys[1]);
        let pick = |sni: Option<&str>, strict| set.choose(sni, strict).map(|c| names_of(&c));
        assert_eq!(pick(Some("b.example"), false), Some(second.clone()));
        assert_eq!(pick(Some("B.EXAMPLE"), true), Some(second));
        assert_eq!(pick(Some("a.example"), true), Some(first.clone()));
        assert_eq!(pick(Some("other.example"), false), Some(first.clone()));
        assert_eq!(pick(Some("other.example"), true), None);
        // No SNI (clients connecting by IP address): the default, even when strict.
        assert_eq!(pick(None, true), Some(first));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_files_are_reported_and_a_failed_reload_keeps_the_old_set() {
        let dir = tempdir("bad");
        let good = write_dev(&dir, "good.example");
        let tls = Tls::load(Settings {
            certs: vec![good.clone()],
            strict_sni: false,
            tls12: true,
            http2: true,
        })
        .unwrap();
        assert!(!tls.files_changed());
        // A key that belongs to another certificate.
        let other = write_dev(&dir, "other.example");
        std::fs::copy(&other.key, &good.key).unwrap();
        assert!(matches!(tls.reload(), Err(TlsError::Key { .. })));
        // Garbage instead of a certificate.
        std::fs::write(&good.cert, "not a certificate").unwrap();
        assert!(matches!(tls.reload(), Err(TlsError::File { .. })));
        // The resolver still has the original certificate.
        let set = tls.resolver.set.read().unwrap();
        assert_eq!(set.keys.len(), 1);
        drop(set);
        assert!(matches!(
            Tls::load(Settings {
                certs: vec![],
                strict_sni: false,
                tls12: true,
                http2: true,
            }),
            Err(TlsError::NoCertificate)
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
