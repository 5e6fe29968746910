//! Prints generated delta cases as JSON lines for decoders written elsewhere to check
//! (`tests/node/delta_fossil.test.js` feeds them to the npm `fossil-delta` package):
//!
//! ```sh
//! cargo run --release -p clarion-proto --example delta_vectors -- SEED COUNT
//! ```
//!
//! Each line is `{"encoder":"block"|"splice","base":B64,"target":B64,"delta":B64}`: random
//! bytes, random edits of them, JSON documents with changed values, and UTF-8 text.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use clarion_proto::delta;

/// splitmix64, so a failing case repeats with its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn bytes(rng: &mut Rng, len: usize, alphabet: &[u8]) -> Vec<u8> {
    (0..len)
        .map(|_| alphabet[rng.below(alphabet.len())])
        .collect()
}

fn edit(rng: &mut Rng, base: &[u8], alphabet: &[u8]) -> Vec<u8> {
    let mut t = base.to_vec();
    for _ in 0..rng.below(8) {
        let at = rng.below(t.len() + 1);
        let end = (at + rng.below(24)).min(t.len());
        let n = rng.below(24);
        let fresh = bytes(rng, n, alphabet);
        t.splice(at..end, fresh);
    }
    t
}

fn json_doc(rng: &mut Rng, entries: usize) -> String {
    let rows: Vec<String> = (0..entries)
        .map(|i| {
            format!(
                r#"{{"p":"{}.{:02}","q":{},"id":"r{i}"}}"#,
                100 + i,
                rng.below(100),
                rng.below(5000)
            )
        })
        .collect();
    format!(r#"{{"type":"book","levels":[{}]}}"#, rows.join(","))
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seed = args.first().copied().unwrap_or(51);
    let count = args.get(1).copied().unwrap_or(500);
    let mut rng = Rng(seed);
    let any: Vec<u8> = (0..=255).collect();
    let text = "abc {}\":,0123é€😀".as_bytes().to_vec();
    for case in 0..count {
        let (base, target) = match case % 4 {
            0 => {
                let n = rng.below(3000);
                let b = bytes(&mut rng, n, &any);
                let t = edit(&mut rng, &b, &any);
                (b, t)
            }
            1 => {
                let n = rng.below(2000);
                let b = bytes(&mut rng, n, b"abc{}\":,0123");
                let t = edit(&mut rng, &b, b"abc{}\":,0123");
                (b, t)
            }
            2 => {
                let entries = 1 + rng.below(80);
                let b = json_doc(&mut rng, entries);
                let mut r2 = Rng(rng.next());
                let t = json_doc(&mut r2, entries);
                // Keep most rows: splice half of the new document's rows into the old one.
                let cut = b.len() / 2;
                let t = format!("{}{}", &b[..cut], &t[cut.min(t.len())..]);
                (b.into_bytes(), t.into_bytes())
            }
            _ => {
                let n = rng.below(1500);
                let b = String::from_utf8_lossy(&bytes(&mut rng, n, &text)).into_owned();
                let t = String::from_utf8_lossy(&edit(&mut rng, b.as_bytes(), &text)).into_owned();
                (b.into_bytes(), t.into_bytes())
            }
        };
        for (encoder, d) in [
            ("block", delta::encode(&base, &target)),
            ("splice", delta::encode_splice(&base, &target)),
        ] {
            let Some(d) = d else { continue };
            println!(
                r#"{{"encoder":"{encoder}","base":"{}","target":"{}","delta":"{}"}}"#,
                STANDARD.encode(&base),
                STANDARD.encode(&target),
                STANDARD.encode(&d)
            );
        }
    }
}
