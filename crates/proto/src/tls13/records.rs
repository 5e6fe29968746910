//! One established connection's record protection in both directions (RFC 8446 §5.2-§5.5),
//! and the post-handshake KeyUpdate exchange (§4.6.3) that renews it.
//!
//! An idle connection holds our raw sending key and IV, sequence numbers and usage counters,
//! and the schedule's traffic secrets; the peer's key and IV are not kept when the schedule
//! holds the peer's secret ([`KeySchedule::receive_key`] derives them). The expanded AEAD key
//! schedules (about 500 B per direction) exist only while a direction is busy: each is built at
//! the first record it protects after a quiet period and dropped by [`Records::compact`] when
//! that direction was quiet since the previous call. Our sending key is kept raw because a
//! server on a periodic ticker expands it at every message after a quiet period, and deriving
//! it each time too would add two HKDF expansions to each; the peer's, on a subscriber, is
//! mostly needed for a pong now and then, where the derivation costs little.
//!
//! Limits: a key is never used past [`KeyLimits`]. Before our sending key would reach its
//! limit we send a KeyUpdate and move to the next key; a peer that goes past the limit on
//! its key is refused.
//!
//! A peer's request that we update our key too (`update_requested`) is answered with our own
//! KeyUpdate just before our next application data record (§4.6.3), under the old key and
//! after every record already sealed under it. Requests that arrive while we are silent get
//! one answer between them, as the RFC intends: answering each at once would send a peer
//! that asks often as many KeyUpdates in a row, and rustls and BoringSSL close a connection
//! after 32 of those without data.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
use zeroize::Zeroize;

pub use super::alert::RecordError;
use super::alert::{Alert, AlertDescription};
use super::keys::{CipherSuite, KeyError, KeySchedule, SecretSchedule, TrafficKey, IV_LEN};
use super::limits::{KeyLimits, Usage};
use super::parked::{Parked, ParkedDirection};
use super::wire::{
    split_inner, ContentType, KeyUpdateRequest, RecordHeader, HEADER_LEN, KEY_UPDATE_LEN,
    MAX_PLAINTEXT, TAG_LEN,
};

/// What reading records produced besides plaintext.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// Bytes of the input that were whole records (the rest is a partial record).
    pub used: usize,
    /// The peer sent close_notify.
    pub peer_closed: bool,
}

/// Room kept under our sending key for the records that may still have to go out under it
/// when its limit nears: the KeyUpdate itself and a fatal alert.
const RESERVED_RECORDS: u64 = 2;
const RESERVED_WEIGHT: u64 = 2 * (KEY_UPDATE_LEN + 1 + TAG_LEN) as u64;

/// The first four bytes of every KeyUpdate (§4.6.3): its type and its 24-bit length, 1. A
/// KeyUpdate split across records is checked byte by byte against it, so the bytes kept
/// between records are always this prefix and only their count is stored.
const KEY_UPDATE_PREFIX: [u8; KEY_UPDATE_LEN - 1] = [24, 0, 0, 1];

/// A record was sealed since the last [`Records::compact`].
const SEALED: u8 = 1;
/// A record was opened since the last [`Records::compact`].
const OPENED: u8 = 2;
/// The peer asked for our key to be updated and we have not sent a KeyUpdate since.
const OWE_UPDATE: u8 = 4;

/// The record's nonce (§5.3): the IV XORed with the big-endian sequence number, left-padded
/// to the IV's length.
fn nonce(iv: &[u8; IV_LEN], seq: u64) -> Nonce {
    let mut n: [u8; IV_LEN] = *iv;
    for (b, s) in n.iter_mut().skip(IV_LEN - 8).zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    Nonce::assume_unique_for_key(n)
}

fn expand(suite: CipherSuite, key: &TrafficKey) -> Result<LessSafeKey, RecordError> {
    UnboundKey::new(suite.aead(), key.key())
        .map(LessSafeKey::new)
        .map_err(|_| RecordError::KeyUpdate(KeyError::Length))
}

/// The peer's key expanded, with its IV: while the peer is sending, the only copy of either.
struct Opening {
    key: LessSafeKey,
    iv: [u8; IV_LEN],
}

impl Opening {
    fn new(suite: CipherSuite, key: &TrafficKey) -> Result<Opening, RecordError> {
        Ok(Opening {
            key: expand(suite, key)?,
            iv: *key.iv(),
        })
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.iv.zeroize();
    }
}

/// An established TLS 1.3 connection's record layer, for either side; `K` supplies the peer's
/// current key and the next keys when they are updated.
///
/// Kept small (every idle TLS connection holds one): `send_key` is the only key kept raw, and
/// the flags and the partial KeyUpdate take a byte each.
pub struct Records<K> {
    suite: CipherSuite,
    limits: &'static KeyLimits,
    schedule: K,
    /// Our current key and IV.
    send_key: TrafficKey,
    /// How much of it we have used.
    send: Usage,
    /// How much of the peer's current key it has used.
    receive: Usage,
    /// Our key expanded, while we are sending.
    sealing: Option<Box<LessSafeKey>>,
    /// The peer's key expanded, while it is sending.
    opening: Option<Box<Opening>>,
    /// [`SEALED`], [`OPENED`], [`OWE_UPDATE`].
    flags: u8,
    /// How many bytes of a KeyUpdate split across records have arrived (0..=4; the bytes are
    /// [`KEY_UPDATE_PREFIX`]'s).
    partial: u8,
}

impl<K: KeySchedule> Records<K> {
    /// Takes over a connection whose sending key is `send`, which has protected `send_seq`
    /// records already, and whose peer has sent `receive_seq` under its current key (during
    /// the handover, e.g. tickets); the peer's key comes from `schedule`.
    pub fn new(
        suite: CipherSuite,
        schedule: K,
        (send, send_seq): (TrafficKey, u64),
        receive_seq: u64,
    ) -> Records<K> {
        Records {
            suite,
            limits: &KeyLimits::RFC8446,
            schedule,
            send_key: send,
            send: Usage::handed_over(send_seq),
            receive: Usage::handed_over(receive_seq),
            sealing: None,
            opening: None,
            flags: 0,
            partial: 0,
        }
    }

    /// Continues a connection another process parked ([`Records::park`]) with its keys;
    /// `schedule` wraps the schedule that derives the next ones from its traffic secrets.
    /// The peer's key is not taken from `parked`: the schedule derives it when the peer next
    /// sends.
    pub fn resume(
        parked: Parked,
        schedule: impl FnOnce(SecretSchedule) -> K,
    ) -> Result<Records<K>, KeyError> {
        let Parked {
            suite,
            send,
            receive,
            owe_update,
            partial_handshake,
        } = parked;
        let ParkedDirection {
            secret: send_secret,
            key: send_key,
            usage: send_usage,
        } = send;
        let ParkedDirection {
            secret: receive_secret,
            key: _,
            usage: receive_usage,
        } = receive;
        // A whole KeyUpdate is never left partial, and a partial one is always its prefix.
        if KEY_UPDATE_PREFIX.get(..partial_handshake.len()) != Some(&partial_handshake[..]) {
            return Err(KeyError::Length);
        }
        let partial = u8::try_from(partial_handshake.len()).map_err(|_| KeyError::Length)?;
        let secrets = SecretSchedule::new(suite, send_secret, receive_secret);
        Ok(Records {
            suite,
            limits: &KeyLimits::RFC8446,
            schedule: schedule(secrets),
            send_key,
            send: send_usage,
            receive: receive_usage,
            sealing: None,
            opening: None,
            flags: if owe_update { OWE_UPDATE } else { 0 },
            partial,
        })
    }

    /// Everything another process needs to continue this connection's records
    /// ([`Records::resume`]); `None` if the key schedule does not expose its secrets (rustls'
    /// kernel hand-off keeps them to itself). The peer's key, which is not kept, is derived
    /// again for the format (two HKDF expansions).
    pub fn park(&self) -> Option<Parked> {
        let (send, receive) = self.schedule.current_secrets()?;
        let receive_key = self.schedule.receive_key().ok()?;
        Some(Parked {
            suite: self.suite,
            send: ParkedDirection {
                secret: send.clone(),
                key: self.send_key.clone(),
                usage: self.send,
            },
            receive: ParkedDirection {
                secret: receive.clone(),
                key: receive_key,
                usage: self.receive,
            },
            owe_update: self.owes_key_update(),
            partial_handshake: KEY_UPDATE_PREFIX
                .get(..usize::from(self.partial))
                .unwrap_or_default()
                .to_vec(),
        })
    }

    /// The same with other limits than RFC 8446's (tests reach them in a few records).
    pub fn with_limits(mut self, limits: &'static KeyLimits) -> Records<K> {
        self.limits = limits;
        self
    }

    /// The negotiated cipher suite.
    pub fn suite(&self) -> CipherSuite {
        self.suite
    }

    /// How much of their current keys each direction has used: (send, receive).
    pub fn usage(&self) -> (Usage, Usage) {
        (self.send, self.receive)
    }

    /// Drops the expanded key of each direction that protected no record since the previous
    /// call (the caller's periodic sweep); returns whether any was dropped.
    pub fn compact(&mut self) -> bool {
        let busy = self.flags & (SEALED | OPENED);
        self.flags &= !(SEALED | OPENED);
        let sealing = busy & SEALED == 0 && self.sealing.take().is_some();
        let opening = busy & OPENED == 0 && self.opening.take().is_some();
        sealing || opening
    }

    /// Which directions have their keys expanded: (send, receive).
    pub fn expanded(&self) -> (bool, bool) {
        (self.sealing.is_some(), self.opening.is_some())
    }

    /// Our expanded key, built from the kept raw key if the sweep dropped it.
    fn sealing_key(&mut self) -> Result<&LessSafeKey, RecordError> {
        self.flags |= SEALED;
        let sealing = match self.sealing.take() {
            Some(k) => k,
            None => Box::new(expand(self.suite, &self.send_key)?),
        };
        Ok(self.sealing.insert(sealing))
    }

    /// The peer's expanded key and IV, derived from the schedule if the sweep dropped them.
    fn opening_key(&mut self) -> Result<&Opening, RecordError> {
        self.flags |= OPENED;
        let opening = match self.opening.take() {
            Some(k) => k,
            None => {
                let key = self
                    .schedule
                    .receive_key()
                    .map_err(RecordError::KeyUpdate)?;
                Box::new(Opening::new(self.suite, &key)?)
            }
        };
        Ok(self.opening.insert(opening))
    }

    /// Whether the peer asked for a key update that our next application data will answer.
    pub fn owes_key_update(&self) -> bool {
        self.flags & OWE_UPDATE != 0
    }

    /// Seals `data` as application data records appended to `out`, updating our key first
    /// if the peer asked for it or if these records would take it to its limit.
    pub fn seal(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        self.answer_update(out)?;
        for chunk in data.chunks(MAX_PLAINTEXT) {
            let weight = (chunk.len() + 1 + TAG_LEN) as u64;
            let room = self.send.has_room(
                self.limits,
                self.suite,
                1 + RESERVED_RECORDS,
                weight + RESERVED_WEIGHT,
            );
            if !room {
                self.update_send_key(KeyUpdateRequest::NotRequested, out)?;
            }
            self.seal_record(ContentType::ApplicationData, chunk, 0, out)?;
        }
        Ok(())
    }

    /// Sends the KeyUpdate the peer asked for, if it is still owed.
    fn answer_update(&mut self, out: &mut Vec<u8>) -> Result<(), RecordError> {
        if self.owes_key_update() {
            self.update_send_key(KeyUpdateRequest::NotRequested, out)?;
        }
        Ok(())
    }

    /// Sends a KeyUpdate (optionally asking the peer to update too) and moves our sending
    /// direction to its next key (§4.6.3). The message goes out under the old key; it answers
    /// any request of the peer's.
    pub fn update_send_key(
        &mut self,
        request: KeyUpdateRequest,
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        // Derived before anything is sent: if it fails, the peer has seen no KeyUpdate.
        let next = self
            .schedule
            .next_send_key()
            .map_err(RecordError::KeyUpdate)?;
        self.seal_record(ContentType::Handshake, &request.message(), 0, out)?;
        self.send_key = next;
        self.send = Usage::handed_over(0);
        self.sealing = None;
        self.flags &= !OWE_UPDATE;
        Ok(())
    }

    /// Appends a close_notify alert (nothing if the key has no room left for it).
    pub fn close_notify(&mut self, out: &mut Vec<u8>) {
        let _ = self.seal_record(ContentType::Alert, &Alert::CLOSE_NOTIFY.encode(), 0, out);
    }

    /// Appends the fatal alert `e` calls for, if any.
    pub fn fatal_alert(&mut self, e: &RecordError, out: &mut Vec<u8>) {
        if let Some(alert) = e.alert() {
            let _ = self.seal_record(ContentType::Alert, &alert.encode(), 0, out);
        }
    }

    /// Seals one record of `kind` carrying `plain` and `padding` zero bytes (§5.4). Any type
    /// and content may be sent this way; the key's limit is still enforced, and application
    /// data still goes after a KeyUpdate the peer asked for.
    pub fn seal_record(
        &mut self,
        kind: ContentType,
        plain: &[u8],
        padding: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        if kind == ContentType::ApplicationData {
            self.answer_update(out)?;
        }
        let inner = plain.len() + 1 + padding;
        if inner > MAX_PLAINTEXT + 1 {
            return Err(RecordError::Overflow);
        }
        let weight = inner + TAG_LEN;
        if !self
            .send
            .has_room(self.limits, self.suite, 1, weight as u64)
        {
            return Err(RecordError::KeyExhausted);
        }
        let length = u16::try_from(weight).map_err(|_| RecordError::Overflow)?;
        let header = RecordHeader::protected(length);
        let nonce = nonce(self.send_key.iv(), self.send.charge(weight as u64));
        let key = self.sealing_key()?;
        let start = out.len();
        out.extend_from_slice(&header);
        out.extend_from_slice(plain);
        out.push(kind.to_u8());
        out.resize(out.len() + padding, 0);
        let body = out.get_mut(start + HEADER_LEN..).unwrap_or_default();
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
    /// application data to `plain`. A partial record at the end is left for the caller to
    /// complete. Nothing is sent in answer here: a KeyUpdate the peer asks for goes out with
    /// our next application data ([`Records::owes_key_update`]); on an error, the caller sends
    /// [`Records::fatal_alert`].
    pub fn open(&mut self, input: &mut [u8], plain: &mut Vec<u8>) -> Result<Read, RecordError> {
        let mut read = Read::default();
        loop {
            let rest = input.get_mut(read.used..).unwrap_or_default();
            let Some(header) = RecordHeader::parse(rest)? else {
                return Ok(read);
            };
            if header.content_type != ContentType::ApplicationData {
                return Err(RecordError::UnexpectedType(header.content_type.to_u8()));
            }
            let Some(record) = rest.get_mut(..HEADER_LEN + header.length) else {
                return Ok(read); // A partial record: wait for the rest.
            };
            let body = record.get_mut(HEADER_LEN..).unwrap_or_default();
            if body.len() <= TAG_LEN {
                return Err(RecordError::BadMac);
            }
            self.open_record(header, body, plain, &mut read)?;
            read.used += HEADER_LEN + header.length;
        }
    }

    fn open_record(
        &mut self,
        header: RecordHeader,
        body: &mut [u8],
        plain: &mut Vec<u8>,
        read: &mut Read,
    ) -> Result<(), RecordError> {
        let weight = body.len() as u64;
        if !self.receive.has_room(self.limits, self.suite, 1, weight) {
            return Err(RecordError::PeerKeyExhausted);
        }
        let seq = self.receive.charge(weight);
        let opening = self.opening_key()?;
        let inner = opening
            .key
            .open_in_place(nonce(&opening.iv, seq), Aad::from(header.bytes), body)
            .map_err(|_| RecordError::BadMac)?;
        let (kind, content) = split_inner(inner)?;
        if kind != ContentType::Handshake && self.partial > 0 {
            return Err(RecordError::UnexpectedHandshake);
        }
        match kind {
            ContentType::ApplicationData => plain.extend_from_slice(content),
            ContentType::Alert => match Alert::parse(content)? {
                a if a.description == AlertDescription::CloseNotify => read.peer_closed = true,
                a => return Err(RecordError::PeerAlert(a)),
            },
            ContentType::Handshake => self.handshake(content)?,
            ContentType::ChangeCipherSpec => return Err(RecordError::UnexpectedType(kind.to_u8())),
        }
        Ok(())
    }

    /// Post-handshake messages the peer may send us: only KeyUpdate (§4.6.3), possibly split
    /// across records, and always the last message of its record. Each byte is checked as it
    /// arrives: a bad type or length is refused without waiting for more.
    fn handshake(&mut self, mut content: &[u8]) -> Result<(), RecordError> {
        if content.is_empty() {
            return Err(RecordError::UnexpectedHandshake); // §5.1: no empty fragments.
        }
        while let Some((&byte, rest)) = content.split_first() {
            content = rest;
            let have = usize::from(self.partial);
            if let Some(&expected) = KEY_UPDATE_PREFIX.get(have) {
                if byte != expected {
                    return Err(if have == 0 {
                        RecordError::UnexpectedHandshake
                    } else {
                        RecordError::BadKeyUpdateLength
                    });
                }
                self.partial += 1;
                continue; // The rest may come in the next record.
            }
            self.partial = 0;
            let request = KeyUpdateRequest::from_u8(byte)?;
            if !content.is_empty() {
                // §5.1: the keys change after a KeyUpdate, so it must end its record.
                return Err(RecordError::UnexpectedHandshake);
            }
            self.peer_updated(request)?;
        }
        Ok(())
    }

    /// The peer moved to its next key; if it asked, we owe it our own KeyUpdate, which goes
    /// before our next application data.
    fn peer_updated(&mut self, request: KeyUpdateRequest) -> Result<(), RecordError> {
        let next = self
            .schedule
            .next_receive_key()
            .map_err(RecordError::KeyUpdate)?;
        self.receive = Usage::handed_over(0);
        // The peer is sending: expanded now, from the key just derived.
        self.opening = Some(Box::new(Opening::new(self.suite, &next)?));
        if request == KeyUpdateRequest::Requested {
            self.flags |= OWE_UPDATE;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls13::wire::HandshakeType;

    #[test]
    fn the_kept_prefix_starts_every_key_update() {
        for request in [KeyUpdateRequest::NotRequested, KeyUpdateRequest::Requested] {
            assert_eq!(request.message()[..KEY_UPDATE_LEN - 1], KEY_UPDATE_PREFIX);
        }
        assert_eq!(KEY_UPDATE_PREFIX[0], HandshakeType::KeyUpdate.to_u8());
    }
}
