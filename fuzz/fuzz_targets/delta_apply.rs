//! The Fossil delta decoder on arbitrary deltas: never panics, never returns more than the
//! limit or a target whose size and checksum differ from what the delta declares; the first
//! byte picks how much of the input is the base. Also: both encoders' deltas between the two
//! halves apply and give the target.
#![no_main]

use clarion_proto::delta::{apply, checksum, encode, encode_splice, target_size};
use libfuzzer_sys::fuzz_target;

/// The output limit: far below what a delta can declare (`3~~~~~` is 4 GiB), so the bound is
/// exercised.
const LIMIT: usize = 1 << 16;

/// Base-64 digits of the format, to find a checksum at the end of a delta.
fn digits(mut n: u32) -> String {
    const D: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~";
    let mut s = Vec::new();
    loop {
        s.insert(0, D[(n & 63) as usize]);
        n >>= 6;
        if n == 0 {
            break;
        }
    }
    String::from_utf8(s).unwrap_or_default()
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let cut = (split as usize * rest.len()) / 256;
    let (base, delta) = rest.split_at(cut);
    if let Ok(out) = apply(base, delta, LIMIT) {
        assert!(out.len() <= LIMIT);
        assert_eq!(target_size(delta), Ok(out.len() as u32));
        // The decoder verified the checksum: encoding the output again must carry the same.
        let again = encode(base, &out).unwrap_or_default();
        assert!(again.ends_with(format!("{};", digits(checksum(&out))).as_bytes()));
    }
    for d in [encode(base, delta), encode_splice(base, delta)].into_iter().flatten() {
        assert_eq!(apply(base, &d, delta.len()).as_deref(), Ok(delta));
    }
});
