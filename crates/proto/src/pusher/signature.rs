//! The application's HMAC-SHA256 signatures, as lowercase hex: channel authorization
//! (`key:hex(HMAC(secret, "socket_id:channel[:channel_data]"))`), user signin
//! (`key:hex(HMAC(secret, "socket_id::user::user_data"))`) and webhook bodies
//! (`X-Pusher-Signature: hex(HMAC(secret, body))`). Checks compare in constant time.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::http1::authorization::constant_time_eq;

type HmacSha256 = Hmac<Sha256>;

/// `hex(HMAC-SHA256(secret, parts joined))`, lowercase.
pub fn sign_hex(secret: &[u8], parts: &[&[u8]]) -> String {
    // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
    let Ok(mut mac) = HmacSha256::new_from_slice(secret) else {
        return String::new();
    };
    for p in parts {
        mac.update(p);
    }
    hex(&mac.finalize().into_bytes())
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        for nibble in [b >> 4, b & 0x0f] {
            // A nibble is below 16: always a hex digit.
            out.push(char::from_digit(u32::from(nibble), 16).unwrap_or('0'));
        }
    }
    out
}

/// Whether `given` is the hex signature `expected`, compared without an early exit. Upper-case
/// hex is accepted (some libraries print it).
pub fn hex_matches(given: &str, expected: &str) -> bool {
    let given = given.to_ascii_lowercase();
    constant_time_eq(given.as_bytes(), expected.as_bytes())
}

/// Why a channel or signin authorization was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Not `key:signature`.
    #[error("auth must be APP_KEY:SIGNATURE")]
    Malformed,
    /// The key before the colon is not the application's.
    #[error("auth names another application's key")]
    WrongKey,
    /// The signature does not match.
    #[error("invalid signature")]
    BadSignature,
}

/// The `auth` string a backend gives a client for a channel: `key:hex(HMAC(...))`.
pub fn channel_auth(
    key: &str,
    secret: &[u8],
    socket_id: &str,
    channel: &str,
    channel_data: Option<&str>,
) -> String {
    let sig = match channel_data {
        Some(d) => sign_hex(
            secret,
            &[
                socket_id.as_bytes(),
                b":",
                channel.as_bytes(),
                b":",
                d.as_bytes(),
            ],
        ),
        None => sign_hex(secret, &[socket_id.as_bytes(), b":", channel.as_bytes()]),
    };
    format!("{key}:{sig}")
}

/// The `auth` string for `pusher:signin`.
pub fn signin_auth(key: &str, secret: &[u8], socket_id: &str, user_data: &str) -> String {
    let sig = sign_hex(
        secret,
        &[socket_id.as_bytes(), b"::user::", user_data.as_bytes()],
    );
    format!("{key}:{sig}")
}

/// Checks a subscription's `auth` (with the presence `channel_data` exactly as the client sent
/// it: the signature covers its bytes).
pub fn verify_channel(
    auth: &str,
    key: &str,
    secret: &[u8],
    socket_id: &str,
    channel: &str,
    channel_data: Option<&str>,
) -> Result<(), AuthError> {
    let expected = channel_auth(key, secret, socket_id, channel, channel_data);
    compare(auth, key, &expected)
}

/// Checks a `pusher:signin`'s `auth` over its `user_data` string.
pub fn verify_signin(
    auth: &str,
    key: &str,
    secret: &[u8],
    socket_id: &str,
    user_data: &str,
) -> Result<(), AuthError> {
    let expected = signin_auth(key, secret, socket_id, user_data);
    compare(auth, key, &expected)
}

fn compare(auth: &str, key: &str, expected: &str) -> Result<(), AuthError> {
    let (given_key, given_sig) = auth.split_once(':').ok_or(AuthError::Malformed)?;
    if given_key != key {
        return Err(AuthError::WrongKey);
    }
    let expected_sig = expected.get(key.len() + 1..).unwrap_or_default();
    if hex_matches(given_sig, expected_sig) {
        Ok(())
    } else {
        Err(AuthError::BadSignature)
    }
}

/// `X-Pusher-Signature` of a webhook body.
pub fn webhook_signature(secret: &[u8], body: &[u8]) -> String {
    sign_hex(secret, &[body])
}

#[cfg(test)]
mod tests {
    use super::*;

    // The credentials and socket id of Pusher's worked examples ("Generating authentication
    // and authorization strings").
    const KEY: &str = "278d425bdf160c739803";
    const SECRET: &[u8] = b"7ad3773142a6692b25b8";

    #[test]
    fn private_channel_auth_matches_pushers_worked_example() {
        let auth = channel_auth(KEY, SECRET, "1234.1234", "private-foobar", None);
        assert_eq!(
            auth,
            "278d425bdf160c739803:58df8b0c36d6982b82c3ecf6b4662e34fe8c25bba48f5369f135bf843651c3a4"
        );
        assert_eq!(
            verify_channel(&auth, KEY, SECRET, "1234.1234", "private-foobar", None),
            Ok(())
        );
    }

    #[test]
    fn presence_auth_covers_the_channel_data_bytes() {
        let data = r#"{"user_id":10,"user_info":{"name":"Mr. Channels"}}"#;
        let auth = channel_auth(KEY, SECRET, "1234.1234", "presence-foobar", Some(data));
        assert_eq!(
            auth,
            "278d425bdf160c739803:31935e7d86dba64c2a90aed31fdc61869f9b22ba9d8863bba239c03ca481bc80"
        );
        let v = |d| verify_channel(&auth, KEY, SECRET, "1234.1234", "presence-foobar", Some(d));
        assert_eq!(v(data), Ok(()));
        // The same member with other spacing is other bytes: refused.
        assert_eq!(
            v(r#"{"user_id": 10,"user_info":{"name":"Mr. Channels"}}"#),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn a_signature_for_another_socket_channel_key_or_secret_is_refused() {
        let auth = channel_auth(KEY, SECRET, "1234.1234", "private-foobar", None);
        let v = |a: &str, key, secret, sock, ch| verify_channel(a, key, secret, sock, ch, None);
        assert_eq!(
            v(&auth, KEY, SECRET, "1234.1235", "private-foobar"),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            v(&auth, KEY, SECRET, "1234.1234", "private-foobaz"),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            v(&auth, "otherkey", SECRET, "1234.1234", "private-foobar"),
            Err(AuthError::WrongKey)
        );
        assert_eq!(
            v(&auth, KEY, b"other", "1234.1234", "private-foobar"),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            v("no colon", KEY, SECRET, "1234.1234", "private-foobar"),
            Err(AuthError::Malformed)
        );
        let upper = auth
            .to_ascii_uppercase()
            .replacen(&KEY.to_ascii_uppercase(), KEY, 1);
        assert_eq!(
            v(&upper, KEY, SECRET, "1234.1234", "private-foobar"),
            Ok(())
        );
    }

    #[test]
    fn signin_auth_matches_pushers_worked_example() {
        let data = r#"{"id":"12345"}"#;
        let auth = signin_auth(KEY, SECRET, "1234.1234", data);
        assert_eq!(
            auth,
            "278d425bdf160c739803:4708d583dada6a56435fb8bc611c77c359a31eebde13337c16ab43aa6de336ba"
        );
        assert_eq!(verify_signin(&auth, KEY, SECRET, "1234.1234", data), Ok(()));
        assert_eq!(
            verify_signin(&auth, KEY, SECRET, "1234.1234", r#"{"id":"1"}"#),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn webhook_signature_is_the_hmac_of_the_body() {
        assert_eq!(
            webhook_signature(SECRET, br#"{"time_ms":1,"events":[]}"#),
            "e84ad185684cff3a96d27bc8ba07b8be14b7479c43784ab14d8a256d25638f76"
        );
    }
}
