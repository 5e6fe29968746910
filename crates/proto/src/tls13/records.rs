//! One established connection's record protection in both directions (RFC 8446 §5.2-§5.5),
//! and the post-handshake KeyUpdate exchange (§4.6.3) that renews it.
//!
//! An idle connection holds raw keys (up to 32 bytes), IVs, sequence numbers and usage
//! counters. The expanded AEAD key schedules (about 1 KiB for both directions) exist only
//! while the connection is busy: they are built at the first record after a quiet period and
//! dropped by [`Records::compact`] when the connection was quiet since the previous call.
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

pub use super::alert::RecordError;
use super::alert::{Alert, AlertDescription};
use super::keys::{CipherSuite, KeyError, KeySchedule, SecretSchedule, TrafficKey, IV_LEN};
use super::limits::{KeyLimits, Usage};
use super::parked::{Parked, ParkedDirection};
use super::wire::{
    split_inner, ContentType, HandshakeType, KeyUpdateRequest, RecordHeader, HEADER_LEN,
    KEY_UPDATE_LEN, MAX_PLAINTEXT, TAG_LEN,
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

/// One direction's current key and its use.
struct Direction {
    key: TrafficKey,
    usage: Usage,
}

impl Direction {
    /// A direction under `key`, which has protected `seq` records already (0 for a fresh key).
    fn new(key: TrafficKey, seq: u64) -> Direction {
        Direction {
            key,
            usage: Usage::handed_over(seq),
        }
    }

    fn expand(&self, suite: CipherSuite) -> Result<LessSafeKey, RecordError> {
        UnboundKey::new(suite.aead(), self.key.key())
            .map(LessSafeKey::new)
            .map_err(|_| RecordError::KeyUpdate(KeyError::Length))
    }

    /// Charges one record of `weight` and returns its nonce (§5.3): the IV XORed with the
    /// big-endian sequence number, left-padded to the IV's length.
    fn next_nonce(&mut self, weight: usize) -> Nonce {
        let seq = self.usage.charge(weight as u64);
        let mut n: [u8; IV_LEN] = *self.key.iv();
        for (b, s) in n.iter_mut().skip(IV_LEN - 8).zip(seq.to_be_bytes()) {
            *b ^= s;
        }
        Nonce::assume_unique_for_key(n)
    }
}

/// A handshake message whose first bytes arrived at the end of a record (§5.1 allows
/// splitting one across records). Only a KeyUpdate can get this far, so five bytes suffice.
#[derive(Default)]
struct PartialHandshake {
    bytes: [u8; KEY_UPDATE_LEN],
    len: u8,
}

/// An established TLS 1.3 connection's record layer, for either side; `K` supplies the next
/// keys when they are updated.
pub struct Records<K> {
    suite: CipherSuite,
    limits: &'static KeyLimits,
    schedule: K,
    send: Direction,
    receive: Direction,
    /// Expanded keys (send, receive) while the connection is busy.
    expanded: Option<Box<(LessSafeKey, LessSafeKey)>>,
    /// A record was processed since the last [`Records::compact`].
    active: bool,
    handshake: PartialHandshake,
    /// The peer asked for our key to be updated and we have not sent a KeyUpdate since.
    owe_update: bool,
}

impl<K: KeySchedule> Records<K> {
    /// Takes over a connection whose keys are `send` and `receive`, which have protected
    /// `send_seq` and `receive_seq` records already (during the handover, e.g. tickets).
    pub fn new(
        suite: CipherSuite,
        schedule: K,
        (send, send_seq): (TrafficKey, u64),
        (receive, receive_seq): (TrafficKey, u64),
    ) -> Records<K> {
        Records {
            suite,
            limits: &KeyLimits::RFC8446,
            schedule,
            send: Direction::new(send, send_seq),
            receive: Direction::new(receive, receive_seq),
            expanded: None,
            active: false,
            handshake: PartialHandshake::default(),
            owe_update: false,
        }
    }

    /// Continues a connection another process parked ([`Records::park`]) with its keys;
    /// `schedule` wraps the schedule that derives the next ones from its traffic secrets.
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
        let secrets = SecretSchedule::new(suite, send.secret, receive.secret);
        let mut handshake = PartialHandshake::default();
        let n = partial_handshake.len();
        if n >= KEY_UPDATE_LEN {
            return Err(KeyError::Length); // A whole KeyUpdate is never left partial.
        }
        handshake
            .bytes
            .get_mut(..n)
            .ok_or(KeyError::Length)?
            .copy_from_slice(&partial_handshake);
        handshake.len = u8::try_from(n).map_err(|_| KeyError::Length)?;
        Ok(Records {
            suite,
            limits: &KeyLimits::RFC8446,
            schedule: schedule(secrets),
            send: Direction {
                key: send.key,
                usage: send.usage,
            },
            receive: Direction {
                key: receive.key,
                usage: receive.usage,
            },
            expanded: None,
            active: false,
            handshake,
            owe_update,
        })
    }

    /// Everything another process needs to continue this connection's records
    /// ([`Records::resume`]); `None` if the key schedule does not expose its secrets (rustls'
    /// kernel hand-off keeps them to itself).
    pub fn park(&self) -> Option<Parked> {
        let (send, receive) = self.schedule.current_secrets()?;
        Some(Parked {
            suite: self.suite,
            send: ParkedDirection {
                secret: send.clone(),
                key: self.send.key.clone(),
                usage: self.send.usage,
            },
            receive: ParkedDirection {
                secret: receive.clone(),
                key: self.receive.key.clone(),
                usage: self.receive.usage,
            },
            owe_update: self.owe_update,
            partial_handshake: self
                .handshake
                .bytes
                .get(..usize::from(self.handshake.len))
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
        (self.send.usage, self.receive.usage)
    }

    /// Drops the expanded keys if no record was processed since the previous call (the
    /// caller's periodic sweep); returns whether they were dropped.
    pub fn compact(&mut self) -> bool {
        let idle = !std::mem::take(&mut self.active);
        idle && self.expanded.take().is_some()
    }

    fn keys(&mut self) -> Result<&mut (LessSafeKey, LessSafeKey), RecordError> {
        self.active = true;
        if self.expanded.is_none() {
            let keys = (
                self.send.expand(self.suite)?,
                self.receive.expand(self.suite)?,
            );
            self.expanded = Some(Box::new(keys));
        }
        self.expanded
            .as_deref_mut()
            .ok_or(RecordError::KeyUpdate(KeyError::Unavailable))
    }

    /// Whether the peer asked for a key update that our next application data will answer.
    pub fn owes_key_update(&self) -> bool {
        self.owe_update
    }

    /// Seals `data` as application data records appended to `out`, updating our key first
    /// if the peer asked for it or if these records would take it to its limit.
    pub fn seal(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        self.answer_update(out)?;
        for chunk in data.chunks(MAX_PLAINTEXT) {
            let weight = (chunk.len() + 1 + TAG_LEN) as u64;
            let room = self.send.usage.has_room(
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
        if self.owe_update {
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
        self.send = Direction::new(next, 0);
        self.expanded = None;
        self.owe_update = false;
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
            .usage
            .has_room(self.limits, self.suite, 1, weight as u64)
        {
            return Err(RecordError::KeyExhausted);
        }
        let length = u16::try_from(weight).map_err(|_| RecordError::Overflow)?;
        let header = RecordHeader::protected(length);
        let nonce = self.send.next_nonce(weight);
        let key = &self.keys()?.0;
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
        if !self
            .receive
            .usage
            .has_room(self.limits, self.suite, 1, weight)
        {
            return Err(RecordError::PeerKeyExhausted);
        }
        let nonce = self.receive.next_nonce(body.len());
        let key = &self.keys()?.1;
        let inner = key
            .open_in_place(nonce, Aad::from(header.bytes), body)
            .map_err(|_| RecordError::BadMac)?;
        let (kind, content) = split_inner(inner)?;
        if kind != ContentType::Handshake && self.handshake.len > 0 {
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
    /// across records, and always the last message of its record.
    fn handshake(&mut self, mut content: &[u8]) -> Result<(), RecordError> {
        if content.is_empty() {
            return Err(RecordError::UnexpectedHandshake); // §5.1: no empty fragments.
        }
        while !content.is_empty() {
            let have = usize::from(self.handshake.len);
            let take = (KEY_UPDATE_LEN - have).min(content.len());
            let (now, rest) = content.split_at(take);
            let slot = self
                .handshake
                .bytes
                .get_mut(have..have + take)
                .ok_or(RecordError::UnexpectedHandshake)?;
            slot.copy_from_slice(now);
            content = rest;
            let have = have + take;
            self.handshake.len = have as u8;
            // Checked as soon as each byte is there: a bad type or length is refused without
            // waiting for more.
            let [kind, l0, l1, l2, request] = self.handshake.bytes;
            if HandshakeType::from_u8(kind) != HandshakeType::KeyUpdate {
                return Err(RecordError::UnexpectedHandshake);
            }
            if have >= 4 && [l0, l1, l2] != [0, 0, 1] {
                return Err(RecordError::BadKeyUpdateLength);
            }
            if have < KEY_UPDATE_LEN {
                return Ok(()); // The rest comes in the next record.
            }
            self.handshake.len = 0;
            let request = KeyUpdateRequest::from_u8(request)?;
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
        self.receive = Direction::new(next, 0);
        self.expanded = None;
        if request == KeyUpdateRequest::Requested {
            self.owe_update = true;
        }
        Ok(())
    }
}
