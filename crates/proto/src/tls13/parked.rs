//! An established connection's record layer as bytes, so that another process can continue it
//! exactly where this one stopped (the hand-over of `clarion serve --upgrade-from`): the peer
//! never learns that its records are now protected by someone else.
//!
//! What continuing needs, and nothing more: the cipher suite; each direction's current traffic
//! secret (the next keys after a KeyUpdate derive from it, RFC 8446 §7.2) and the key and IV
//! derived from it (§7.3: carried rather than derived again, which would cost the receiving
//! process HKDF expansions per connection while the hand-over holds every delivery), with
//! its sequence number and its use of the key against the §5.5 limits; whether a KeyUpdate the
//! peer asked for is still owed (§4.6.3); and the first bytes of a KeyUpdate split across
//! records (§5.1). Ciphertext in flight (a partial incoming record, records the kernel has not
//! taken) is the caller's to carry beside it.
//!
//! Since issue 53 the record layer keeps no copy of the peer's key (it derives it from the
//! peer's secret when the peer next sends): parking derives it for the format, which is
//! unchanged so that binaries before and after read each other's bytes, and resuming leaves the
//! carried one unused.
//!
//! The bytes are secret: whoever reads them can read and forge the connection's records from
//! then on. The caller sends them only over a private channel and wipes its buffers afterwards.
//!
//! ```text
//! SUITE (u16 LE)
//! SEND:    SECRET_LEN (u8) | SECRET | KEY_LEN (u8) | KEY | IV (12) | SEQ (u64 LE) | WEIGHT (u64 LE)
//! RECEIVE: the same
//! OWE_UPDATE (u8: 0 or 1) | PARTIAL_LEN (u8: 0..=4) | PARTIAL (a prefix of a KeyUpdate)
//! ```
//!
//! [`Parked::decode`] checks every field (the suite is known, each secret and key is as long as
//! the suite's hash and key, flags are 0 or 1, the partial message is a prefix of a KeyUpdate, nothing
//! trails) and never panics.

use super::keys::{CipherSuite, TrafficKey, TrafficSecret, IV_LEN};
use super::limits::Usage;
use super::wire::{HandshakeType, KEY_UPDATE_LEN};

/// The longest encoding: a SHA-384 suite's secrets, 32-byte keys and a four-byte partial
/// KeyUpdate.
pub const MAX_LEN: usize = 2 + 2 * (1 + 48 + 1 + 32 + IV_LEN + 16) + 1 + 1 + (KEY_UPDATE_LEN - 1);
// The hand-over format gives the encoding a one-byte length.
const _: () = assert!(MAX_LEN <= 255);

/// Why bytes are not a parked record layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParkError {
    /// The bytes end before the last field.
    #[error("parked TLS state is truncated")]
    Truncated,
    /// A cipher suite this layer does not run.
    #[error("parked TLS state names unknown cipher suite {0:#06x}")]
    Suite(u16),
    /// A traffic secret or key whose length is not the suite's hash or key length.
    #[error("parked TLS traffic secret or key of the wrong length")]
    SecretLength,
    /// A flag other than 0 or 1, or a partial message that no KeyUpdate starts with.
    #[error("malformed parked TLS state")]
    Malformed,
    /// Bytes after the last field.
    #[error("parked TLS state has trailing bytes")]
    Trailing,
}

/// One direction: its current traffic secret, the key derived from it, and how much that key
/// has protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedDirection {
    /// The current traffic secret (`*_application_traffic_secret_N`).
    pub secret: TrafficSecret,
    /// The key and IV derived from it.
    pub key: TrafficKey,
    /// Records protected under the key derived from it, and their weight (see [`Usage`]).
    pub usage: Usage,
}

/// An established TLS 1.3 record layer between two processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    /// The negotiated suite.
    pub suite: CipherSuite,
    /// Our sending direction.
    pub send: ParkedDirection,
    /// The peer's sending direction.
    pub receive: ParkedDirection,
    /// The peer asked for a KeyUpdate that our next application data must answer.
    pub owe_update: bool,
    /// The first bytes (at most four) of a KeyUpdate whose rest comes in the peer's next
    /// record.
    pub partial_handshake: Vec<u8>,
}

impl Parked {
    /// Appends the encoding to `out` (at most [`MAX_LEN`] bytes).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.suite.to_u16().to_le_bytes());
        for d in [&self.send, &self.receive] {
            let secret = d.secret.as_bytes();
            out.push(secret.len() as u8);
            out.extend_from_slice(secret);
            let key = d.key.key();
            out.push(key.len() as u8);
            out.extend_from_slice(key);
            out.extend_from_slice(d.key.iv());
            out.extend_from_slice(&d.usage.seq.to_le_bytes());
            out.extend_from_slice(&d.usage.weight.to_le_bytes());
        }
        out.push(u8::from(self.owe_update));
        let partial = self
            .partial_handshake
            .get(..self.partial_handshake.len().min(KEY_UPDATE_LEN - 1))
            .unwrap_or_default();
        out.push(partial.len() as u8);
        out.extend_from_slice(partial);
    }

    /// Decodes exactly `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Parked, ParkError> {
        let mut r = bytes;
        let code = u16::from_le_bytes(take(&mut r)?);
        let suite = CipherSuite::from_u16(code).ok_or(ParkError::Suite(code))?;
        let send = direction(&mut r, suite)?;
        let receive = direction(&mut r, suite)?;
        let owe_update = match take::<1>(&mut r)? {
            [0] => false,
            [1] => true,
            _ => return Err(ParkError::Malformed),
        };
        let [n] = take::<1>(&mut r)?;
        let n = usize::from(n);
        if n >= KEY_UPDATE_LEN {
            return Err(ParkError::Malformed);
        }
        let partial = r.get(..n).ok_or(ParkError::Truncated)?;
        // Whatever follows the type is the 24-bit length, which is always 1 (§4.6.3).
        let prefix = [HandshakeType::KeyUpdate.to_u8(), 0, 0, 1];
        if prefix.get(..n) != Some(partial) {
            return Err(ParkError::Malformed);
        }
        r = r.get(n..).unwrap_or_default();
        if !r.is_empty() {
            return Err(ParkError::Trailing);
        }
        Ok(Parked {
            suite,
            send,
            receive,
            owe_update,
            partial_handshake: partial.to_vec(),
        })
    }
}

fn take<const N: usize>(r: &mut &[u8]) -> Result<[u8; N], ParkError> {
    let (head, rest) = r.split_first_chunk::<N>().ok_or(ParkError::Truncated)?;
    *r = rest;
    Ok(*head)
}

fn direction(r: &mut &[u8], suite: CipherSuite) -> Result<ParkedDirection, ParkError> {
    let [n] = take::<1>(r)?;
    let n = usize::from(n);
    if n != suite.hash_len() {
        return Err(ParkError::SecretLength);
    }
    let secret = r.get(..n).ok_or(ParkError::Truncated)?;
    let secret = TrafficSecret::new(suite, secret).map_err(|_| ParkError::SecretLength)?;
    *r = r.get(n..).unwrap_or_default();
    let [n] = take::<1>(r)?;
    let n = usize::from(n);
    if n != suite.key_len() {
        return Err(ParkError::SecretLength);
    }
    let key = r.get(..n).ok_or(ParkError::Truncated)?;
    *r = r.get(n..).unwrap_or_default();
    let iv: [u8; IV_LEN] = take(r)?;
    let key = TrafficKey::new(suite, key, &iv).map_err(|_| ParkError::SecretLength)?;
    let seq = u64::from_le_bytes(take(r)?);
    let weight = u64::from_le_bytes(take(r)?);
    Ok(ParkedDirection {
        secret,
        key,
        usage: Usage { seq, weight },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    pub(crate) fn sample(suite: CipherSuite) -> Parked {
        let n = suite.hash_len();
        Parked {
            suite,
            send: ParkedDirection {
                secret: TrafficSecret::new(suite, &vec![1; n]).unwrap(),
                key: TrafficKey::new(suite, &vec![3; suite.key_len()], &[4; 12]).unwrap(),
                usage: Usage {
                    seq: 7,
                    weight: 900,
                },
            },
            receive: ParkedDirection {
                secret: TrafficSecret::new(suite, &vec![2; n]).unwrap(),
                key: TrafficKey::new(suite, &vec![5; suite.key_len()], &[6; 12]).unwrap(),
                usage: Usage {
                    seq: u64::MAX - 1,
                    weight: 3,
                },
            },
            owe_update: true,
            partial_handshake: vec![24, 0],
        }
    }

    #[test]
    fn every_suite_round_trips_within_the_maximum_length() {
        for suite in [
            CipherSuite::Aes128GcmSha256,
            CipherSuite::Aes256GcmSha384,
            CipherSuite::Chacha20Poly1305Sha256,
        ] {
            for partial in 0..KEY_UPDATE_LEN {
                let mut p = sample(suite);
                p.partial_handshake = [24, 0, 0, 1][..partial].to_vec();
                let mut buf = Vec::new();
                p.encode(&mut buf);
                assert!(buf.len() <= MAX_LEN);
                assert_eq!(Parked::decode(&buf), Ok(p));
            }
        }
    }

    #[test]
    fn truncated_lying_or_padded_bytes_are_refused() {
        let mut buf = Vec::new();
        sample(CipherSuite::Aes256GcmSha384).encode(&mut buf);
        assert_eq!(buf.len(), MAX_LEN - 2);
        for cut in 0..buf.len() {
            assert!(Parked::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = buf.clone();
        long.push(0);
        assert_eq!(Parked::decode(&long), Err(ParkError::Trailing));
        let mut b = buf.clone();
        b[0] = 0x04; // TLS_AES_128_CCM_SHA256: not run here.
        assert_eq!(Parked::decode(&b), Err(ParkError::Suite(0x1304)));
        let mut b = buf.clone();
        b[2] = 32; // A SHA-256 length for a SHA-384 suite.
        assert_eq!(Parked::decode(&b), Err(ParkError::SecretLength));
        let mut b = buf.clone();
        b[2 + 1 + 48] = 16; // An AES-128 key for an AES-256 suite.
        assert_eq!(Parked::decode(&b), Err(ParkError::SecretLength));
        let owe = buf.len() - 4;
        let mut b = buf.clone();
        b[owe] = 2;
        assert_eq!(Parked::decode(&b), Err(ParkError::Malformed));
        let mut b = buf.clone();
        b[owe + 2] = 4; // Not a KeyUpdate.
        assert_eq!(Parked::decode(&b), Err(ParkError::Malformed));
        let mut b = buf.clone();
        b[owe + 1] = 5; // A whole KeyUpdate is never partial.
        assert_eq!(Parked::decode(&b), Err(ParkError::Malformed));
        // Every single-byte corruption decodes or fails cleanly.
        for i in 0..buf.len() {
            for v in [0u8, 1, 0x30, 0xff] {
                let mut b = buf.clone();
                b[i] = v;
                let _ = Parked::decode(&b);
            }
        }
    }
}
