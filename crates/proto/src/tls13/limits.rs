//! How much one traffic key may protect (RFC 8446 §5.5) and the per-direction accounting
//! against it: the sequence number must never wrap (§5.3), and an AES-GCM key wears out
//! after 2^24.5 full-size records. Before the limit the writer updates its key; a reader
//! whose peer goes past it treats that as an error.

use super::keys::CipherSuite;
use super::wire::{MAX_PLAINTEXT, TAG_LEN};

/// RFC 8446 §5.5: AES-GCM "may be used to encrypt 2^24.5 full-size records (about 24
/// million)" under one key; 2^24.5 rounded down.
pub const AES_GCM_FULL_RECORDS: u64 = 23_726_566;

/// RFC 8446 §5.3/§5.5: the 64-bit sequence number must not wrap, so one key protects at most
/// 2^64 - 1 records (ChaCha20-Poly1305's only limit: "the record sequence number would wrap
/// before the safety limit is reached").
pub const SEQUENCE_LIMIT: u64 = u64::MAX;

/// What a full-size record costs against a key's budget: 2^14 bytes of content, the content
/// type and the tag.
pub const FULL_RECORD_WEIGHT: u64 = (MAX_PLAINTEXT + 1 + TAG_LEN) as u64;

/// Limits on one traffic key. Real connections use [`KeyLimits::RFC8446`]; tests inject
/// small ones to reach the limit in a few records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLimits {
    /// Full-size records an AES-GCM key may protect.
    pub aes_gcm_full_records: u64,
    /// Records any key may protect (the sequence number's range).
    pub records: u64,
}

impl KeyLimits {
    /// The limits of RFC 8446 §5.5.
    pub const RFC8446: KeyLimits = KeyLimits {
        aes_gcm_full_records: AES_GCM_FULL_RECORDS,
        records: SEQUENCE_LIMIT,
    };

    /// The weight (see [`Usage`]) a key of `suite` may protect.
    pub fn weight(&self, suite: CipherSuite) -> u64 {
        if suite.is_aes_gcm() {
            self.aes_gcm_full_records.saturating_mul(FULL_RECORD_WEIGHT)
        } else {
            u64::MAX
        }
    }
}

/// One direction's use of its current key.
///
/// The §5.5 bound is stated in full-size records because the analysis behind it counts
/// cipher blocks; a record is charged its protected length (content, type, padding and tag),
/// so N full-size records reach the limit exactly at N while small records use it up in
/// proportion. Counting every small record as a full one would make a long-lived, chatty
/// connection whose client never updates keys fail after 24 million messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The next record's sequence number (§5.3): records protected so far under this key.
    pub seq: u64,
    /// The weight protected so far under this key.
    pub weight: u64,
}

impl Usage {
    /// A key that has protected `seq` records already (a key handed over mid-connection;
    /// each is charged as full-size since their sizes are unknown).
    pub fn handed_over(seq: u64) -> Usage {
        Usage {
            seq,
            weight: seq.saturating_mul(FULL_RECORD_WEIGHT),
        }
    }

    /// Whether `records` more records of total `weight` fit under this key of `suite`.
    pub fn has_room(
        &self,
        limits: &KeyLimits,
        suite: CipherSuite,
        records: u64,
        weight: u64,
    ) -> bool {
        self.seq
            .checked_add(records)
            .is_some_and(|n| n <= limits.records)
            && self.weight.saturating_add(weight) <= limits.weight(suite)
    }

    /// Charges one record of `weight` and returns its sequence number.
    pub fn charge(&mut self, weight: u64) -> u64 {
        let seq = self.seq;
        // Callers check `has_room` first, so neither saturates in practice.
        self.seq = self.seq.saturating_add(1);
        self.weight = self.weight.saturating_add(weight);
        seq
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rfc_numbers() {
        // 2^24.5 = 2^24 * sqrt(2).
        let exact = (1u64 << 24) as f64 * std::f64::consts::SQRT_2;
        assert_eq!(AES_GCM_FULL_RECORDS, exact.floor() as u64);
        assert_eq!(FULL_RECORD_WEIGHT, 16_401);
        let l = KeyLimits::RFC8446;
        assert_eq!(
            l.weight(CipherSuite::Aes128GcmSha256),
            AES_GCM_FULL_RECORDS * FULL_RECORD_WEIGHT
        );
        assert_eq!(l.weight(CipherSuite::Chacha20Poly1305Sha256), u64::MAX);
    }

    #[test]
    fn room_runs_out_at_the_limit_not_after() {
        let limits = KeyLimits {
            aes_gcm_full_records: 2,
            records: 5,
        };
        let gcm = CipherSuite::Aes256GcmSha384;
        let mut u = Usage { seq: 0, weight: 0 };
        assert!(u.has_room(&limits, gcm, 1, FULL_RECORD_WEIGHT * 2));
        assert!(!u.has_room(&limits, gcm, 1, FULL_RECORD_WEIGHT * 2 + 1));
        assert_eq!(u.charge(FULL_RECORD_WEIGHT), 0);
        assert_eq!(u.charge(FULL_RECORD_WEIGHT), 1);
        assert!(!u.has_room(&limits, gcm, 1, 1));
        // ChaCha20 has no weight limit, only the sequence number's.
        let chacha = CipherSuite::Chacha20Poly1305Sha256;
        assert!(u.has_room(&limits, chacha, 3, u64::MAX / 2));
        assert!(!u.has_room(&limits, chacha, 4, 1));
        let full = Usage {
            seq: u64::MAX,
            weight: 0,
        };
        assert!(
            !full.has_room(&KeyLimits::RFC8446, chacha, 1, 1),
            "never wraps"
        );
        assert_eq!(Usage::handed_over(3).weight, 3 * FULL_RECORD_WEIGHT);
    }
}
