//! The hand-off of an established TLS 1.3 connection from rustls to proto's record layer
//! ([`clarion_proto::tls13`]): once rustls has finished the handshake, the connection's keys
//! and sequence numbers move there (rustls' kernel-TLS hand-off), and rustls keeps only what
//! deriving the next keys needs, behind [`KernelKeys`].
//!
//! Everything about records (protection, alerts, KeyUpdate, the RFC 8446 §5.5 limits) is in
//! proto; this file only translates rustls' types.

use clarion_proto::tls13::{self, CipherSuite, KeyError, KeySchedule, TrafficKey};
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};

/// The record layer of an established TLS 1.3 server connection.
pub type Records = tls13::Records<KernelKeys>;

/// The next traffic keys, derived by rustls from the secrets it keeps ("traffic upd",
/// RFC 8446 §7.2).
pub struct KernelKeys {
    kernel: KernelConnection<ServerConnectionData>,
    suite: CipherSuite,
}

impl KeySchedule for KernelKeys {
    fn next_send_key(&mut self) -> Result<TrafficKey, KeyError> {
        let (_, secrets) = self
            .kernel
            .update_tx_secret()
            .map_err(|_| KeyError::Unavailable)?;
        traffic_key(self.suite, &secrets)
    }

    fn next_receive_key(&mut self) -> Result<TrafficKey, KeyError> {
        let (_, secrets) = self
            .kernel
            .update_rx_secret()
            .map_err(|_| KeyError::Unavailable)?;
        traffic_key(self.suite, &secrets)
    }
}

/// Takes over from rustls; `None` for suites or versions proto does not handle.
pub fn take_over(
    secrets: ExtractedSecrets,
    kernel: KernelConnection<ServerConnectionData>,
) -> Option<Records> {
    if kernel.protocol_version() != rustls::ProtocolVersion::TLSv1_3 {
        return None;
    }
    let suite = suite(&secrets.tx.1)?;
    let send = (traffic_key(suite, &secrets.tx.1).ok()?, secrets.tx.0);
    let receive = (traffic_key(suite, &secrets.rx.1).ok()?, secrets.rx.0);
    Some(tls13::Records::new(
        suite,
        KernelKeys { kernel, suite },
        send,
        receive,
    ))
}

fn suite(secrets: &ConnectionTrafficSecrets) -> Option<CipherSuite> {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { .. } => Some(CipherSuite::Aes128GcmSha256),
        ConnectionTrafficSecrets::Aes256Gcm { .. } => Some(CipherSuite::Aes256GcmSha384),
        ConnectionTrafficSecrets::Chacha20Poly1305 { .. } => {
            Some(CipherSuite::Chacha20Poly1305Sha256)
        }
        _ => None,
    }
}

fn traffic_key(
    suite: CipherSuite,
    secrets: &ConnectionTrafficSecrets,
) -> Result<TrafficKey, KeyError> {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            TrafficKey::new(suite, key.as_ref(), iv.as_ref())
        }
        _ => Err(KeyError::Length),
    }
}
