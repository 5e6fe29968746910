//! The hand-off of an established TLS 1.3 connection from rustls to this record layer (feature
//! `rustls`): once rustls has finished the handshake, the connection's keys and sequence numbers
//! move here (rustls' kernel-TLS hand-off), and rustls keeps only what deriving the next keys
//! needs, behind [`KernelKeys`]. The same for either side: the server hands over when its
//! handshake ends, the bench's client once its upgrade is answered.
//!
//! Everything about records (protection, alerts, KeyUpdate, the RFC 8446 §5.5 limits) is in
//! [`super::records`]; this file only translates rustls' types.

use rustls::kernel::KernelConnection;
use rustls::unbuffered::{EncodeError, EncodeTlsData, InsufficientSizeError};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};

use super::{
    CipherSuite, KeyError, KeySchedule, Records, SecretSchedule, TrafficKey, TrafficSecret,
};

/// The next traffic keys, derived by rustls from the secrets it keeps ("traffic upd",
/// RFC 8446 §7.2), and a copy of the peer's current key (the record layer keeps none);
/// `D` is rustls' client or server connection data.
pub struct KernelKeys<D> {
    kernel: KernelConnection<D>,
    suite: CipherSuite,
    receive: TrafficKey,
}

impl<D> KeySchedule for KernelKeys<D> {
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
        self.receive = traffic_key(self.suite, &secrets)?;
        Ok(self.receive.clone())
    }

    fn receive_key(&self) -> Result<TrafficKey, KeyError> {
        Ok(self.receive.clone())
    }
}

/// The next keys of a connection taken over from rustls: from the traffic secrets themselves
/// when the caller captured them during the handshake (then the connection can be parked and
/// continued in another process, [`Records::park`]), else from rustls' kernel connection.
pub enum Schedule<D> {
    /// Derived here from the captured secrets; rustls is gone.
    Secrets(SecretSchedule),
    /// Derived by rustls (boxed: rustls' state is much larger, and this is the rare case).
    Kernel(Box<KernelKeys<D>>),
}

impl<D> KeySchedule for Schedule<D> {
    fn next_send_key(&mut self) -> Result<TrafficKey, KeyError> {
        match self {
            Schedule::Secrets(s) => s.next_send_key(),
            Schedule::Kernel(k) => k.next_send_key(),
        }
    }

    fn next_receive_key(&mut self) -> Result<TrafficKey, KeyError> {
        match self {
            Schedule::Secrets(s) => s.next_receive_key(),
            Schedule::Kernel(k) => k.next_receive_key(),
        }
    }

    fn receive_key(&self) -> Result<TrafficKey, KeyError> {
        match self {
            Schedule::Secrets(s) => s.receive_key(),
            Schedule::Kernel(k) => k.receive_key(),
        }
    }

    fn current_secrets(&self) -> Option<(&TrafficSecret, &TrafficSecret)> {
        match self {
            Schedule::Secrets(s) => s.current_secrets(),
            Schedule::Kernel(_) => None,
        }
    }
}

/// Takes over from rustls as [`take_over`] does, deriving the next keys from `own` (our
/// traffic secret and the peer's, `*_application_traffic_secret_0` as rustls' key log gave
/// them) when they are the secrets of the keys rustls hands over: the connection then no
/// longer needs rustls at all, nor a copy of the peer's key. Otherwise (no secrets, or not
/// these keys) rustls derives them.
pub fn take_over_with_secrets<D>(
    secrets: ExtractedSecrets,
    kernel: KernelConnection<D>,
    own: Option<(&[u8], &[u8])>,
) -> Option<Records<Schedule<D>>> {
    let (suite, send, receive) = current_keys(&secrets, &kernel)?;
    let schedule = own
        .and_then(|(ours, peers)| {
            let s = SecretSchedule::new(
                suite,
                TrafficSecret::new(suite, ours).ok()?,
                TrafficSecret::new(suite, peers).ok()?,
            );
            let (tx, rx) = s.keys().ok()?;
            (tx == send.0 && rx == receive.0).then_some(s)
        })
        .map_or_else(
            || {
                Schedule::Kernel(Box::new(KernelKeys {
                    kernel,
                    suite,
                    receive: receive.0.clone(),
                }))
            },
            Schedule::Secrets,
        );
    Some(Records::new(suite, schedule, send, receive.1))
}

/// Takes over from rustls; `None` for suites or versions this layer does not handle.
///
/// rustls must not have read a KeyUpdate that asks for ours: it keeps its answer aside until
/// it next sends, the kernel hand-off does not carry it, and its sending key has already moved
/// on, so the peer would never learn our new key. The server hands over at the record that
/// ends the handshake, before any such request can be read (issue 38).
pub fn take_over<D>(
    secrets: ExtractedSecrets,
    kernel: KernelConnection<D>,
) -> Option<Records<KernelKeys<D>>> {
    let (suite, send, (receive, receive_seq)) = current_keys(&secrets, &kernel)?;
    Some(Records::new(
        suite,
        KernelKeys {
            kernel,
            suite,
            receive,
        },
        send,
        receive_seq,
    ))
}

/// The suite and each direction's key and sequence number rustls hands over, for TLS 1.3.
#[allow(clippy::type_complexity)]
fn current_keys<D>(
    secrets: &ExtractedSecrets,
    kernel: &KernelConnection<D>,
) -> Option<(CipherSuite, (TrafficKey, u64), (TrafficKey, u64))> {
    if kernel.protocol_version() != rustls::ProtocolVersion::TLSv1_3 {
        return None;
    }
    let suite = suite(&secrets.tx.1)?;
    let send = (traffic_key(suite, &secrets.tx.1).ok()?, secrets.tx.0);
    let receive = (traffic_key(suite, &secrets.rx.1).ok()?, secrets.rx.0);
    Some((suite, send, receive))
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

/// Encodes one record rustls queued during a handshake (or an alert) onto the end of `out`:
/// the step both sides repeat while driving rustls' unbuffered API.
pub fn encode<D>(e: &mut EncodeTlsData<'_, D>, out: &mut Vec<u8>) -> Result<(), rustls::Error> {
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
