//! Keys for the record layer: the TLS 1.3 cipher suites, traffic secrets, the key and IV
//! derived from a secret (RFC 8446 §7.3) and the next secret after a KeyUpdate (§7.2), all
//! with HKDF-Expand-Label (§7.1). Plain values in, plain values out: no handshake state.

use ring::{aead, hkdf};
use zeroize::Zeroize;

/// The longest hash of a TLS 1.3 suite (SHA-384), hence the longest traffic secret.
const MAX_SECRET: usize = 48;
/// The longest AEAD key (AES-256, ChaCha20).
const MAX_KEY: usize = 32;
/// Every TLS 1.3 AEAD takes a 96-bit nonce, so every IV is 12 bytes (§5.3).
pub const IV_LEN: usize = 12;

/// A TLS 1.3 cipher suite (RFC 8446 B.4). The CCM suites are not offered by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherSuite {
    /// TLS_AES_128_GCM_SHA256 (0x1301).
    Aes128GcmSha256,
    /// TLS_AES_256_GCM_SHA384 (0x1302).
    Aes256GcmSha384,
    /// TLS_CHACHA20_POLY1305_SHA256 (0x1303).
    Chacha20Poly1305Sha256,
}

impl CipherSuite {
    /// The suite for its IANA code point.
    pub fn from_u16(v: u16) -> Option<CipherSuite> {
        match v {
            0x1301 => Some(CipherSuite::Aes128GcmSha256),
            0x1302 => Some(CipherSuite::Aes256GcmSha384),
            0x1303 => Some(CipherSuite::Chacha20Poly1305Sha256),
            _ => None,
        }
    }

    /// Its IANA code point.
    pub fn to_u16(self) -> u16 {
        match self {
            CipherSuite::Aes128GcmSha256 => 0x1301,
            CipherSuite::Aes256GcmSha384 => 0x1302,
            CipherSuite::Chacha20Poly1305Sha256 => 0x1303,
        }
    }

    /// Whether the AEAD is AES-GCM, whose keys wear out before the sequence number does
    /// (§5.5).
    pub fn is_aes_gcm(self) -> bool {
        !matches!(self, CipherSuite::Chacha20Poly1305Sha256)
    }

    pub(crate) fn aead(self) -> &'static aead::Algorithm {
        match self {
            CipherSuite::Aes128GcmSha256 => &aead::AES_128_GCM,
            CipherSuite::Aes256GcmSha384 => &aead::AES_256_GCM,
            CipherSuite::Chacha20Poly1305Sha256 => &aead::CHACHA20_POLY1305,
        }
    }

    fn hkdf(self) -> hkdf::Algorithm {
        match self {
            CipherSuite::Aes256GcmSha384 => hkdf::HKDF_SHA384,
            _ => hkdf::HKDF_SHA256,
        }
    }

    /// Bytes in the suite's hash, and so in its traffic secrets.
    pub fn hash_len(self) -> usize {
        match self {
            CipherSuite::Aes256GcmSha384 => 48,
            _ => 32,
        }
    }

    /// Bytes in the AEAD key.
    pub fn key_len(self) -> usize {
        self.aead().key_len()
    }
}

/// Why keys could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A secret, key or IV of the wrong length for the suite.
    #[error("key material of the wrong length for the cipher suite")]
    Length,
    /// Whoever holds the secrets (the handshake library) refused to derive the next ones.
    #[error("the next traffic keys could not be derived")]
    Unavailable,
}

/// `HKDF-Expand-Label(secret, label, context, out.len())` (RFC 8446 §7.1) with the suite's
/// hash.
pub fn hkdf_expand_label(
    suite: CipherSuite,
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    out: &mut [u8],
) -> Result<(), KeyError> {
    /// How many bytes to expand to, as ring wants it said.
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    // struct HkdfLabel { uint16 length; opaque label<7..255> = "tls13 " + label;
    // opaque context<0..255>; }
    let length = u16::try_from(out.len()).map_err(|_| KeyError::Length)?;
    let label_len = u8::try_from(label.len() + 6).map_err(|_| KeyError::Length)?;
    let context_len = u8::try_from(context.len()).map_err(|_| KeyError::Length)?;
    let info: [&[u8]; 6] = [
        &length.to_be_bytes(),
        &[label_len],
        b"tls13 ",
        label,
        &[context_len],
        context,
    ];
    hkdf::Prk::new_less_safe(suite.hkdf(), secret)
        .expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| KeyError::Length)
}

/// A traffic secret (`[sender]_application_traffic_secret_N`, §7.1).
#[derive(Clone)]
pub struct TrafficSecret {
    bytes: [u8; MAX_SECRET],
    len: u8,
}

impl TrafficSecret {
    /// A secret for `suite`: it must be as long as the suite's hash.
    pub fn new(suite: CipherSuite, secret: &[u8]) -> Result<TrafficSecret, KeyError> {
        if secret.len() != suite.hash_len() {
            return Err(KeyError::Length);
        }
        let mut bytes = [0; MAX_SECRET];
        bytes
            .get_mut(..secret.len())
            .ok_or(KeyError::Length)?
            .copy_from_slice(secret);
        Ok(TrafficSecret {
            bytes,
            len: u8::try_from(secret.len()).map_err(|_| KeyError::Length)?,
        })
    }

    /// The secret's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or_default()
    }

    /// The secret after a KeyUpdate: `HKDF-Expand-Label(secret, "traffic upd", "",
    /// Hash.length)` (§7.2).
    pub fn next(&self, suite: CipherSuite) -> Result<TrafficSecret, KeyError> {
        let mut next = [0; MAX_SECRET];
        let out = next.get_mut(..suite.hash_len()).ok_or(KeyError::Length)?;
        hkdf_expand_label(suite, self.as_bytes(), b"traffic upd", b"", out)?;
        TrafficSecret::new(suite, out)
    }
}

impl PartialEq for TrafficSecret {
    fn eq(&self, other: &TrafficSecret) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for TrafficSecret {}

/// A secret leaves no copy behind in freed memory (a hand-over moves it; a closed connection
/// drops it).
impl Drop for TrafficSecret {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

impl std::fmt::Debug for TrafficSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrafficSecret(..)")
    }
}

/// The write key and IV of one direction (§7.3): what protecting records needs.
#[derive(Clone, PartialEq, Eq)]
pub struct TrafficKey {
    key: [u8; MAX_KEY],
    key_len: u8,
    iv: [u8; IV_LEN],
}

impl TrafficKey {
    /// A key and IV as another library derived them; lengths must suit `suite`.
    pub fn new(suite: CipherSuite, key: &[u8], iv: &[u8]) -> Result<TrafficKey, KeyError> {
        if key.len() != suite.key_len() {
            return Err(KeyError::Length);
        }
        let mut k = [0; MAX_KEY];
        k.get_mut(..key.len())
            .ok_or(KeyError::Length)?
            .copy_from_slice(key);
        Ok(TrafficKey {
            key: k,
            key_len: u8::try_from(key.len()).map_err(|_| KeyError::Length)?,
            iv: iv.try_into().map_err(|_| KeyError::Length)?,
        })
    }

    /// `key = HKDF-Expand-Label(secret, "key", "", key_length)` and `iv =
    /// HKDF-Expand-Label(secret, "iv", "", iv_length)` (§7.3).
    pub fn derive(suite: CipherSuite, secret: &TrafficSecret) -> Result<TrafficKey, KeyError> {
        let mut key = [0; MAX_KEY];
        let key = key.get_mut(..suite.key_len()).ok_or(KeyError::Length)?;
        hkdf_expand_label(suite, secret.as_bytes(), b"key", b"", key)?;
        let mut iv = [0; IV_LEN];
        hkdf_expand_label(suite, secret.as_bytes(), b"iv", b"", &mut iv)?;
        TrafficKey::new(suite, key, &iv)
    }

    /// The AEAD key.
    pub fn key(&self) -> &[u8] {
        self.key
            .get(..usize::from(self.key_len))
            .unwrap_or_default()
    }

    /// The IV that, XORed with the sequence number, makes each record's nonce (§5.3).
    pub fn iv(&self) -> &[u8; IV_LEN] {
        &self.iv
    }
}

impl Drop for TrafficKey {
    fn drop(&mut self) {
        self.key.zeroize();
        self.iv.zeroize();
    }
}

impl std::fmt::Debug for TrafficKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrafficKey(..)")
    }
}

/// Where the next keys come from when a direction's key is updated (§4.6.3). The record
/// layer decides when; the schedule only derives.
pub trait KeySchedule {
    /// Moves our sending direction to its next traffic secret and returns its key.
    fn next_send_key(&mut self) -> Result<TrafficKey, KeyError>;
    /// Moves the peer's sending direction to its next traffic secret and returns its key.
    fn next_receive_key(&mut self) -> Result<TrafficKey, KeyError>;
    /// The peer's current key: derived from its traffic secret where the schedule holds it
    /// (the record layer keeps no copy then), else the copy the schedule keeps.
    fn receive_key(&self) -> Result<TrafficKey, KeyError>;
    /// The current traffic secrets (ours, the peer's), if this schedule holds them where they
    /// can be read: what continuing the connection elsewhere needs ([`super::parked`]).
    fn current_secrets(&self) -> Option<(&TrafficSecret, &TrafficSecret)> {
        None
    }
}

/// The key schedule computed here from both directions' current traffic secrets.
#[derive(Debug, Clone)]
pub struct SecretSchedule {
    suite: CipherSuite,
    send: TrafficSecret,
    receive: TrafficSecret,
}

impl SecretSchedule {
    /// A schedule starting at `send` (our secret) and `receive` (the peer's).
    pub fn new(suite: CipherSuite, send: TrafficSecret, receive: TrafficSecret) -> Self {
        SecretSchedule {
            suite,
            send,
            receive,
        }
    }

    /// The negotiated cipher suite.
    pub fn suite(&self) -> CipherSuite {
        self.suite
    }

    /// The current keys: (send, receive).
    pub fn keys(&self) -> Result<(TrafficKey, TrafficKey), KeyError> {
        Ok((
            TrafficKey::derive(self.suite, &self.send)?,
            TrafficKey::derive(self.suite, &self.receive)?,
        ))
    }
}

impl KeySchedule for SecretSchedule {
    fn next_send_key(&mut self) -> Result<TrafficKey, KeyError> {
        self.send = self.send.next(self.suite)?;
        TrafficKey::derive(self.suite, &self.send)
    }

    fn next_receive_key(&mut self) -> Result<TrafficKey, KeyError> {
        self.receive = self.receive.next(self.suite)?;
        TrafficKey::derive(self.suite, &self.receive)
    }

    fn receive_key(&self) -> Result<TrafficKey, KeyError> {
        TrafficKey::derive(self.suite, &self.receive)
    }

    fn current_secrets(&self) -> Option<(&TrafficSecret, &TrafficSecret)> {
        Some((&self.send, &self.receive))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s
            .bytes()
            .filter(u8::is_ascii_hexdigit)
            .map(|c| (c as char).to_digit(16).unwrap() as u8)
            .collect();
        digits.chunks(2).map(|p| p[0] << 4 | p[1]).collect()
    }

    // RFC 8448 §3 ("Simple 1-RTT Handshake", TLS_AES_128_GCM_SHA256).
    /// {server} derive secret "tls13 s ap traffic".
    pub(crate) const SERVER_AP_SECRET: &str =
        "a1 1a f9 f0 55 31 f8 56 ad 47 11 6b 45 a9 50 32 82 04 b4 f4 4b fb 6b 3a 4b 4f 1f 3f cb 63 16 43";
    /// {client} derive secret "tls13 c ap traffic".
    pub(crate) const CLIENT_AP_SECRET: &str =
        "9e 40 64 6c e7 9a 7f 9d c0 5a f8 88 9b ce 65 52 87 5a fa 0b 06 df 00 87 f7 92 eb b7 c1 75 04 a5";
    /// {server} derive write traffic keys for application data.
    const SERVER_AP_KEY: &str = "9f 02 28 3b 6c 9c 07 ef c2 6b b9 f2 ac 92 e3 56";
    const SERVER_AP_IV: &str = "cf 78 2b 88 dd 83 54 9a ad f1 e9 84";
    /// {client} derive write traffic keys for application data.
    const CLIENT_AP_KEY: &str = "17 42 2d da 59 6e d5 d9 ac d8 90 e3 c6 3f 50 51";
    const CLIENT_AP_IV: &str = "5b 78 92 3d ee 08 57 90 33 e5 23 d9";

    pub(crate) fn rfc8448_secret(s: &str) -> TrafficSecret {
        TrafficSecret::new(CipherSuite::Aes128GcmSha256, &hex(s)).unwrap()
    }

    #[test]
    fn rfc8448_application_keys_from_the_traffic_secrets() {
        let suite = CipherSuite::Aes128GcmSha256;
        for (secret, key, iv) in [
            (SERVER_AP_SECRET, SERVER_AP_KEY, SERVER_AP_IV),
            (CLIENT_AP_SECRET, CLIENT_AP_KEY, CLIENT_AP_IV),
        ] {
            let k = TrafficKey::derive(suite, &rfc8448_secret(secret)).unwrap();
            assert_eq!(k.key(), hex(key));
            assert_eq!(k.iv()[..], hex(iv));
        }
    }

    #[test]
    fn rfc8448_hkdf_expand_label_info_and_output() {
        // The "key" label's HkdfLabel is `00 10 09 "tls13 key" 00` (RFC 8448 §3, key info).
        let suite = CipherSuite::Aes128GcmSha256;
        let mut out = [0; 16];
        hkdf_expand_label(suite, &hex(SERVER_AP_SECRET), b"key", b"", &mut out).unwrap();
        assert_eq!(out[..], hex(SERVER_AP_KEY));
    }

    /// HKDF-Expand for one block is HMAC(PRK, info || 0x01) (RFC 5869 §2.3): an independent
    /// computation of "traffic upd" to check `next` against.
    fn traffic_upd_by_hmac(secret: &[u8], sha384: bool) -> Vec<u8> {
        use hmac::{Hmac, Mac};
        let len = if sha384 { 48u8 } else { 32 };
        let mut info = vec![0, len, 17];
        info.extend_from_slice(b"tls13 traffic upd");
        info.extend_from_slice(&[0, 1]);
        if sha384 {
            let mut m = Hmac::<sha2::Sha384>::new_from_slice(secret).unwrap();
            m.update(&info);
            m.finalize().into_bytes().to_vec()
        } else {
            let mut m = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
            m.update(&info);
            m.finalize().into_bytes().to_vec()
        }
    }

    #[test]
    fn key_update_derives_traffic_upd() {
        let s0 = rfc8448_secret(SERVER_AP_SECRET);
        let s1 = s0.next(CipherSuite::Aes128GcmSha256).unwrap();
        assert_eq!(s1.as_bytes(), traffic_upd_by_hmac(s0.as_bytes(), false));
        assert_ne!(s1.as_bytes(), s0.as_bytes());
        let suite = CipherSuite::Aes256GcmSha384;
        let t0 = TrafficSecret::new(suite, &[7; 48]).unwrap();
        let t1 = t0.next(suite).unwrap();
        assert_eq!(t1.as_bytes(), traffic_upd_by_hmac(&[7; 48], true));
        assert_eq!(TrafficKey::derive(suite, &t1).unwrap().key().len(), 32);
    }

    #[test]
    fn schedule_steps_each_direction_on_its_own() {
        let suite = CipherSuite::Aes128GcmSha256;
        let (s, c) = (
            rfc8448_secret(SERVER_AP_SECRET),
            rfc8448_secret(CLIENT_AP_SECRET),
        );
        let mut sched = SecretSchedule::new(suite, s.clone(), c.clone());
        let (send0, recv0) = sched.keys().unwrap();
        assert_eq!(send0.key(), hex(SERVER_AP_KEY));
        let send1 = sched.next_send_key().unwrap();
        assert_eq!(
            send1,
            TrafficKey::derive(suite, &s.next(suite).unwrap()).unwrap()
        );
        assert_eq!(sched.keys().unwrap().1, recv0, "receive untouched");
        let recv1 = sched.next_receive_key().unwrap();
        assert_eq!(
            recv1,
            TrafficKey::derive(suite, &c.next(suite).unwrap()).unwrap()
        );
    }

    #[test]
    fn wrong_lengths_are_refused() {
        let suite = CipherSuite::Aes256GcmSha384;
        assert_eq!(
            TrafficSecret::new(suite, &[0; 32]).unwrap_err(),
            KeyError::Length
        );
        assert_eq!(
            TrafficKey::new(suite, &[0; 16], &[0; 12]),
            Err(KeyError::Length)
        );
        assert_eq!(
            TrafficKey::new(suite, &[0; 32], &[0; 8]),
            Err(KeyError::Length)
        );
        assert!(TrafficKey::new(suite, &[0; 32], &[0; 12]).is_ok());
        for v in [0x1301, 0x1302, 0x1303] {
            assert_eq!(CipherSuite::from_u16(v).unwrap().to_u16(), v);
        }
        assert_eq!(CipherSuite::from_u16(0x1304), None);
    }
}
