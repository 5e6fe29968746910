//! Random epochs and script hashes: names the broker makes up, with no state of their own.

use clarion_proto::event_id;

/// A random epoch (up to 13 base-36 characters, 64 bits): the time and process id mixed with a
/// per-call counter `n`, so no two calls of a process give the same one.
pub(super) fn random_epoch(n: u64) -> String {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 40)
        ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finaliser: every input bit affects every output bit.
    let mut x = seed;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    event_id::base36(x)
}

/// The lowercase hex SHA-1 of `data` (what `EVALSHA` names a script by).
pub(super) fn sha1_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_hash_is_sha1_hex() {
        assert_eq!(sha1_hex(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
    }

    #[test]
    fn epochs_differ_per_call() {
        assert_ne!(random_epoch(1), random_epoch(2));
    }
}
