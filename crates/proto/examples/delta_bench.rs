//! Delta compression on ticker payloads: encode CPU per publication, delta size against the
//! full message, with and without permessage-deflate after it (the server's shared mode: each
//! frame compressed alone, level 6, 15-bit window), for both encoders. Writes the cases to a
//! JSON file for the JavaScript decode benchmark (`bench/delta_decode.mjs`). docs/benchmarks.md,
//! "Delta compression", has the command and the results:
//!
//! ```sh
//! cargo run --release -p clarion-proto --example delta_bench -- target/delta_cases.json
//! ```

use std::hint::black_box;

use clarion_proto::delta;
use clarion_proto::ws::deflate::compress_message;

/// Consecutive publications per payload kind.
const UPDATES: usize = 2000;
/// Timing repeats; the median is reported.
const REPEATS: usize = 3;
/// Cases written for the JavaScript benchmark, per kind.
const JS_CASES: usize = 500;

/// This thread's time on a CPU, in nanoseconds (`/proc/thread-self/schedstat`): unlike the wall
/// clock, it leaves out the time spent waiting for a core on a busy machine.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Microseconds of CPU per call, `f` making `n` calls: repeated for at least 200 ms, as the
/// kernel updates the figure only at scheduler ticks (a few ms).
fn cpu_us_per(n: usize, mut f: impl FnMut()) -> f64 {
    let t = cpu_ns();
    let mut rounds = 0;
    while cpu_ns() - t < 200_000_000 || rounds == 0 {
        f();
        rounds += 1;
    }
    (cpu_ns() - t) as f64 / 1e3 / (n * rounds) as f64
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A 2 KB order book, 40 levels a side; each update changes 12 quantities, now and then moves
/// a price level, and bumps `seq` and `ts` (about 5 % of the bytes).
fn order_book(rng: &mut Rng) -> Vec<String> {
    let mut bids: Vec<(u64, u64)> = (0..40)
        .map(|i| (9_612_050 - i * 25, 1000 + rng.below(90_000)))
        .collect();
    let mut asks: Vec<(u64, u64)> = (0..40)
        .map(|i| (9_612_075 + i * 25, 1000 + rng.below(90_000)))
        .collect();
    let side = |levels: &[(u64, u64)]| {
        levels
            .iter()
            .map(|(p, q)| {
                format!(
                    r#"["{}.{:02}","{}.{:04}"]"#,
                    p / 100,
                    p % 100,
                    q / 10_000,
                    q % 10_000
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    (0..UPDATES as u64)
        .map(|seq| {
            for _ in 0..12 {
                let i = rng.below(40) as usize;
                let q = 1000 + rng.below(90_000);
                if rng.below(2) == 0 {
                    bids[i].1 = q;
                } else {
                    asks[i].1 = q;
                }
            }
            if rng.below(10) == 0 {
                bids.remove(rng.below(40) as usize);
                let low = bids.last().map_or(0, |l| l.0) - 25;
                bids.push((low, 1000 + rng.below(90_000)));
            }
            format!(
                r#"{{"type":"book","symbol":"BTC-USD","seq":{},"ts":{},"bids":[{}],"asks":[{}]}}"#,
                1_000_000 + seq,
                1_764_280_000_000 + seq * 5 + rng.below(5),
                side(&bids),
                side(&asks)
            )
        })
        .collect()
}

/// A 200-byte price tick: bid, ask, last, time and sequence change every time.
fn price_tick(rng: &mut Rng) -> Vec<String> {
    let mut mid: i64 = 108_125;
    (0..UPDATES as u64)
        .map(|seq| {
            mid += rng.below(7) as i64 - 3;
            let (bid, ask) = (mid - 2, mid + 2);
            format!(
                r#"{{"type":"tick","symbol":"EUR/USD","venue":"LMAX","bid":"1.{:05}","ask":"1.{:05}","bid_size":"{}","ask_size":"{}","last":"1.{:05}","ts":{},"seq":{},"status":"open"}}"#,
                bid % 100_000,
                ask % 100_000,
                (1 + rng.below(50)) * 100_000,
                (1 + rng.below(50)) * 100_000,
                mid % 100_000,
                1_764_280_000_000 + seq * 37,
                1_000_000 + seq
            )
        })
        .collect()
}

/// A 10 KB document of 150 fields; each update changes one field's value.
fn document(rng: &mut Rng) -> Vec<String> {
    let mut values: Vec<String> = (0..150)
        .map(|i| {
            format!(
                "initial value of field number {i}, {}",
                rng.below(1_000_000)
            )
        })
        .collect();
    (0..UPDATES)
        .map(|_| {
            let i = rng.below(150) as usize;
            values[i] = format!(
                "updated value of field number {i}, {}",
                rng.below(1_000_000)
            );
            let fields: Vec<String> = values
                .iter()
                .enumerate()
                .map(|(i, v)| format!(r#""field_{i:03}":"{v}""#))
                .collect();
            format!(r#"{{"type":"doc","id":"d-42",{}}}"#, fields.join(","))
        })
        .collect()
}

/// The bytes a WebSocket `clarion.v1` subscriber receives for one message: the envelope (the
/// delta one names its base) and the frame header.
fn on_wire(data: &str, delta_of: Option<u64>, seq: u64, deflate: bool) -> usize {
    let body = serde_json::to_string(data).unwrap_or_default();
    let envelope = match delta_of {
        None => format!(r#"{{"type":"message","topic":"t","id":"k3x9q2mf-{seq}","data":{body}}}"#),
        Some(base) => format!(
            r#"{{"type":"message","topic":"t","id":"k3x9q2mf-{seq}","delta":"k3x9q2mf-{base}","data":{body}}}"#
        ),
    };
    let payload = if deflate {
        compress_message(envelope.as_bytes(), 15, 6).len()
    } else {
        envelope.len()
    };
    payload
        + if payload < 126 {
            2
        } else if payload < 65_536 {
            4
        } else {
            10
        }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

type Encoder = fn(&[u8], &[u8]) -> Option<Vec<u8>>;

fn main() {
    let out_path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/delta_cases.json".into());
    let mut rng = Rng(51);
    let kinds = [
        ("order book 2 KB", order_book(&mut rng)),
        ("price tick 200 B", price_tick(&mut rng)),
        ("document 10 KB", document(&mut rng)),
    ];
    let encoders: [(&str, Encoder); 2] =
        [("block", delta::encode), ("splice", delta::encode_splice)];
    println!("| payload | mean size | encoder | encode µs/publication | delta/full | delta/full, both deflated | deflate µs full / delta |");
    println!("|---|---|---|---|---|---|---|");
    let mut js = serde_json::Map::new();
    for (kind, msgs) in &kinds {
        let mean = msgs.iter().map(String::len).sum::<usize>() / msgs.len();
        let mut case = serde_json::Map::new();
        case.insert("base".into(), msgs[..JS_CASES].to_vec().into());
        case.insert("target".into(), msgs[1..=JS_CASES].to_vec().into());
        for (name, enc) in encoders {
            let times: Vec<f64> = (0..REPEATS)
                .map(|_| {
                    cpu_us_per(msgs.len() - 1, || {
                        for w in msgs.windows(2) {
                            black_box(enc(black_box(w[0].as_bytes()), black_box(w[1].as_bytes())));
                        }
                    })
                })
                .collect();
            let deltas: Vec<String> = msgs
                .windows(2)
                .map(|w| {
                    let d = enc(w[0].as_bytes(), w[1].as_bytes()).unwrap_or_default();
                    // The encoders keep a delta of UTF-8 text UTF-8.
                    String::from_utf8(d).unwrap_or_default()
                })
                .collect();
            let (mut full, mut dl, mut full_z, mut dl_z) = (0usize, 0usize, 0usize, 0usize);
            for (i, d) in deltas.iter().enumerate() {
                let seq = i as u64 + 1;
                let target = &msgs[i + 1];
                full += on_wire(target, None, seq, false);
                full_z += on_wire(target, None, seq, true);
                // The server sends the full message when the delta is not smaller.
                let use_delta = d.len() < target.len();
                let (data, base) = if use_delta {
                    (d.as_str(), Some(seq - 1))
                } else {
                    (target.as_str(), None)
                };
                dl += on_wire(data, base, seq, false);
                dl_z += on_wire(data, base, seq, true);
            }
            let deflate_us = |items: &[&str]| {
                median(
                    (0..REPEATS)
                        .map(|_| {
                            cpu_us_per(items.len(), || {
                                for s in items {
                                    black_box(compress_message(black_box(s.as_bytes()), 15, 6));
                                }
                            })
                        })
                        .collect(),
                )
            };
            let full_refs: Vec<&str> = msgs[1..].iter().map(String::as_str).collect();
            let delta_refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
            println!(
                "| {kind} | {mean} B | {name} | {:.2} | {:.3} ({} / {} B) | {:.3} ({} / {} B) | {:.1} / {:.1} |",
                median(times),
                dl as f64 / full as f64,
                dl / deltas.len(),
                full / deltas.len(),
                dl_z as f64 / full_z as f64,
                dl_z / deltas.len(),
                full_z / deltas.len(),
                deflate_us(&full_refs),
                deflate_us(&delta_refs),
            );
            case.insert(name.into(), deltas[..JS_CASES].to_vec().into());
        }
        js.insert((*kind).into(), case.into());
    }
    if let Err(e) = std::fs::write(&out_path, serde_json::Value::Object(js).to_string()) {
        eprintln!("cannot write {out_path}: {e}");
        std::process::exit(1);
    }
    eprintln!("cases for bench/delta_decode.mjs written to {out_path}");
}
