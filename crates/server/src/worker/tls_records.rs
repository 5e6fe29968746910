//! The TLS 1.3 record layer of an established connection, kept as small as the protocol
//! allows: once rustls has finished the handshake, the connection's traffic secrets move here
//! (rustls' kernel-TLS hand-off) and rustls keeps only what key updates need.
//!
//! An idle connection holds raw keys (up to 32 bytes), IVs and sequence numbers. The expanded
//! AEAD key schedules (about 1 KiB for both directions) exist only while the connection is
//! busy: they are built at the first record after a quiet period and dropped by the worker's
//! once-a-second sweep when the connection has been quiet since the previous one.
//!
//! Pure over bytes: records in, plaintext out; plaintext in, records out. RFC 8446 §5.

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};

/// Plaintext bytes per record (RFC 8446 §5.1).
const MAX_PLAIN: usize = 16 * 1024;
/// Largest ciphertext a peer may send in one record (RFC 8446 §5.2: 2^14 + 256).
const MAX_CIPHER: usize = MAX_PLAIN + 256;
const HEADER: usize = 5;
const TAG: usize = 16;

const APPLICATION_DATA: u8 = 23;
const HANDSHAKE: u8 = 22;
const ALERT: u8 = 21;
const KEY_UPDATE: u8 = 24;

/// Why a connection's records could not be read; each maps to the fatal alert we send.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// A record failed authentication (tampered, or not from this connection).
    #[error("bad record MAC")]
    BadMac,
    /// A record longer than TLS allows.
    #[error("record overflow")]
    Overflow,
    /// A record or handshake message that makes no sense here.
    #[error("unexpected message")]
    Unexpected,
    /// The peer sent a fatal alert.
    #[error("alert from the peer: {0}")]
    PeerAlert(u8),
    /// rustls refused to derive the next keys.
    #[error("key update failed")]
    KeyUpdate,
}

impl RecordError {
    /// The TLS alert description to send (none for an alert the peer sent).
    fn alert(&self) -> Option<u8> {
        match self {
            RecordError::BadMac => Some(20),
            RecordError::Overflow => Some(22),
            RecordError::Unexpected => Some(10),
            RecordError::KeyUpdate => Some(80),
            RecordError::PeerAlert(_) => None,
        }
    }
}

/// One direction's raw secrets and sequence number.
struct Direction {
    key: [u8; 32],
    key_len: u8,
    iv: [u8; 12],
    seq: u64,
}

impl Direction {
    fn new(seq: u64, secrets: &ConnectionTrafficSecrets) -> Option<Direction> {
        let (key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv }
            | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
            | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key.as_ref(), iv.as_ref()),
            _ => return None,
        };
        let mut d = Direction {
            key: [0; 32],
            key_len: u8::try_from(key.len()).ok()?,
            iv: iv.try_into().ok()?,
            seq,
        };
        d.key.get_mut(..key.len())?.copy_from_slice(key);
        Some(d)
    }

    fn expand(&self, alg: &'static aead::Algorithm) -> Option<LessSafeKey> {
        let key = self.key.get(..usize::from(self.key_len))?;
        UnboundKey::new(alg, key).ok().map(LessSafeKey::new)
    }

    /// The per-record nonce (RFC 8446 §5.3), advancing the sequence number.
    fn next_nonce(&mut self) -> Nonce {
        let mut n = self.iv;
        for (b, s) in n.iter_mut().skip(4).zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq = self.seq.wrapping_add(1);
        Nonce::assume_unique_for_key(n)
    }
}

/// What reading records produced besides plaintext.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// Bytes of the input that were whole records (the rest is a partial record).
    pub used: usize,
    /// The peer sent close_notify.
    pub peer_closed: bool,
}

/// An established TLS 1.3 connection's record layer.
pub struct Records {
    kernel: KernelConnection<ServerConnectionData>,
    alg: &'static aead::Algorithm,
    tx: Direction,
    rx: Direction,
    /// Expanded keys (tx, rx) while the connection is busy.
    keys: Option<Box<(LessSafeKey, LessSafeKey)>>,
    /// A record was processed since the last sweep.
    active: bool,
}

impl Records {
    /// Takes over from rustls; `None` for suites or versions this layer does not handle.
    pub fn new(
        secrets: ExtractedSecrets,
        kernel: KernelConnection<ServerConnectionData>,
    ) -> Option<Records> {
        if kernel.protocol_version() != rustls::ProtocolVersion::TLSv1_3 {
            return None;
        }
        let alg = algorithm(&secrets.tx.1)?;
        Some(Records {
            alg,
            tx: Direction::new(secrets.tx.0, &secrets.tx.1)?,
            rx: Direction::new(secrets.rx.0, &secrets.rx.1)?,
            kernel,
            keys: None,
            active: false,
        })
    }

    /// Drops the expanded keys if no record was processed since the previous call (the
    /// worker's sweep); returns whether they were dropped.
    pub fn compact(&mut self) -> bool {
        let idle = !std::mem::take(&mut self.active);
        idle && self.keys.take().is_some()
    }

    fn keys(&mut self) -> Result<&mut (LessSafeKey, LessSafeKey), RecordError> {
        self.active = true;
        if self.keys.is_none() {
            let tx = self.tx.expand(self.alg).ok_or(RecordError::KeyUpdate)?;
            let rx = self.rx.expand(self.alg).ok_or(RecordError::KeyUpdate)?;
            self.keys = Some(Box::new((tx, rx)));
        }
        self.keys.as_deref_mut().ok_or(RecordError::KeyUpdate)
    }

    /// Seals `data` as application data records appended to `out`.
    pub fn seal(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        if data.is_empty() {
            return Ok(());
        }
        for chunk in data.chunks(MAX_PLAIN) {
            self.seal_record(APPLICATION_DATA, chunk, out)?;
        }
        Ok(())
    }

    /// Appends a close_notify alert.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) {
        let _ = self.seal_record(ALERT, &[1, 0], out);
    }

    /// Appends a fatal alert for `e`, if it calls for one.
    pub fn fatal_alert(&mut self, e: &RecordError, out: &mut Vec<u8>) {
        if let Some(desc) = e.alert() {
            let _ = self.seal_record(ALERT, &[2, desc], out);
        }
    }

    fn seal_record(
        &mut self,
        kind: u8,
        plain: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let len = plain.len() + 1 + TAG;
        let len16 = u16::try_from(len).map_err(|_| RecordError::Overflow)?;
        let header = [APPLICATION_DATA, 3, 3, (len16 >> 8) as u8, len16 as u8];
        let start = out.len();
        out.extend_from_slice(&header);
        out.extend_from_slice(plain);
        out.push(kind);
        let nonce = self.tx.next_nonce();
        let key = &self.keys()?.0;
        let body = out.get_mut(start + HEADER..).unwrap_or_default();
        match key.seal_in_place_separate_tag(nonce, Aad::from(header), body) {
            Ok(tag) => {
                out.extend_from_slice(tag.as_ref());
                Ok(())
            }
            Err(_) => {
                out.truncate(start);
                Err(RecordError::Overflow)
            }
        }
    }

    /// Opens the whole records at the start of `input` (decrypting in place), appending
    /// application data to `plain` and anything we must answer (key updates) to `out`.
    pub fn open(
        &mut self,
        input: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Read, RecordError> {
        let mut read = Read::default();
        loop {
            let rest = input.get_mut(read.used..).unwrap_or_default();
            let Some(&[kind, _, _, hi, lo]) = rest.get(..HEADER) else {
                return Ok(read);
            };
            let len = usize::from(u16::from_be_bytes([hi, lo]));
            if kind != APPLICATION_DATA {
                return Err(RecordError::Unexpected);
            }
            if !(TAG + 1..=MAX_CIPHER).contains(&len) {
                return Err(RecordError::Overflow);
            }
            let Some(record) = rest.get_mut(..HEADER + len) else {
                return Ok(read); // A partial record: wait for the rest.
            };
            let (header, body) = record.split_at_mut(HEADER);
            let aad: [u8; HEADER] = header.try_into().map_err(|_| RecordError::Overflow)?;
            let nonce = self.rx.next_nonce();
            let key = &self.keys()?.1;
            let inner = key
                .open_in_place(nonce, Aad::from(aad), body)
                .map_err(|_| RecordError::BadMac)?;
            // Strip the padding: the content type is the last non-zero byte.
            let Some(type_at) = inner.iter().rposition(|&b| b != 0) else {
                return Err(RecordError::Unexpected);
            };
            let (content, kind) = inner.split_at(type_at);
            match kind.first() {
                Some(&APPLICATION_DATA) => plain.extend_from_slice(content),
                Some(&ALERT) => match content {
                    [_, 0] => read.peer_closed = true,
                    [_, desc] => return Err(RecordError::PeerAlert(*desc)),
                    _ => return Err(RecordError::Unexpected),
                },
                Some(&HANDSHAKE) => self.handshake(content, out)?,
                _ => return Err(RecordError::Unexpected),
            }
            read.used += HEADER + len;
        }
    }

    /// Post-handshake messages a client may send: only KeyUpdate (RFC 8446 §4.6.3).
    fn handshake(&mut self, mut msgs: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        while !msgs.is_empty() {
            match msgs {
                [KEY_UPDATE, 0, 0, 1, request, rest @ ..] if *request <= 1 => {
                    let (seq, secrets) = self
                        .kernel
                        .update_rx_secret()
                        .map_err(|_| RecordError::KeyUpdate)?;
                    self.rx = Direction::new(seq, &secrets).ok_or(RecordError::KeyUpdate)?;
                    if *request == 1 {
                        // Answer under the old key, then switch (§4.6.3).
                        self.seal_record(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0], out)?;
                        let (seq, secrets) = self
                            .kernel
                            .update_tx_secret()
                            .map_err(|_| RecordError::KeyUpdate)?;
                        self.tx = Direction::new(seq, &secrets).ok_or(RecordError::KeyUpdate)?;
                    }
                    self.keys = None;
                    msgs = rest;
                }
                _ => return Err(RecordError::Unexpected),
            }
        }
        Ok(())
    }
}

fn algorithm(secrets: &ConnectionTrafficSecrets) -> Option<&'static aead::Algorithm> {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { .. } => Some(&aead::AES_128_GCM),
        ConnectionTrafficSecrets::Aes256Gcm { .. } => Some(&aead::AES_256_GCM),
        ConnectionTrafficSecrets::Chacha20Poly1305 { .. } => Some(&aead::CHACHA20_POLY1305),
        _ => None,
    }
}
