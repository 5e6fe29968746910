// JavaScript client CPU to take a delta message against a full one (Node, the npm
// `fossil-delta` decoder a client would use). Reads the cases `delta_bench` writes:
//
//   cargo run --release -p clarion-proto --example delta_bench -- target/delta_cases.json
//   (cd tests/node && npm ci)
//   node bench/delta_decode.mjs target/delta_cases.json
//
// Full: JSON.parse of the `clarion.v1` envelope, then of its data (what the app does anyway).
// Delta: JSON.parse of the envelope, UTF-8 encode of the delta, applyDelta against the previous
// message's bytes (kept by the client) with the checksum verified, UTF-8 decode, JSON.parse.
// CPU time (process.cpuUsage), each loop repeated for at least 300 ms; medians of 3.
import { readFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const lib = path.join(here, '..', 'tests', 'node', 'node_modules', 'fossil-delta', 'fossil-delta.js');
const { applyDelta } = await import(pathToFileURL(lib).href);
const cases = JSON.parse(readFileSync(process.argv[2] || 'target/delta_cases.json', 'utf8'));

function cpuUsPer(n, f) {
  const start = process.cpuUsage();
  let rounds = 0;
  let used = 0;
  do {
    f();
    rounds++;
    const u = process.cpuUsage(start);
    used = u.user + u.system;
  } while (used < 300_000);
  return used / (n * rounds);
}
// A Fossil decoder written for this comparison: copies with Uint8Array.set instead of a byte
// loop, no checksum-free shortcut (the checksum is verified as the format requires).
const DIGIT = new Int8Array(128).fill(-1);
[...'0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~'].forEach((ch, i) => { DIGIT[ch.charCodeAt(0)] = i; });
function fastApply(base, delta) {
  let at = 0;
  const int = () => {
    let v = 0;
    let d;
    while (at < delta.length && (d = DIGIT[delta[at]]) >= 0) { v = v * 64 + d; at++; }
    return v;
  };
  const size = int();
  if (delta[at++] !== 10) throw new Error('bad header');
  const out = new Uint8Array(size);
  let w = 0;
  for (;;) {
    const n = int();
    const op = delta[at++];
    if (op === 64) {
      const from = int();
      if (delta[at++] !== 44 || from + n > base.length || w + n > size) throw new Error('bad copy');
      out.set(base.subarray(from, from + n), w);
      w += n;
    } else if (op === 58) {
      if (at + n > delta.length || w + n > size) throw new Error('bad insert');
      out.set(delta.subarray(at, at + n), w);
      w += n;
      at += n;
    } else if (op === 59) {
      if (w !== size) throw new Error('short');
      const view = new DataView(out.buffer);
      let sum = 0;
      let i = 0;
      for (; i + 4 <= size; i += 4) sum = (sum + view.getUint32(i)) >>> 0;
      let last = 0;
      for (let k = 0; i + k < size; k++) last |= out[i + k] << (24 - 8 * k);
      if (((sum + (last >>> 0)) >>> 0) !== n) throw new Error('bad checksum');
      return out;
    } else throw new Error('bad op');
  }
}

const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const enc = new TextEncoder();
const dec = new TextDecoder();

console.log('| payload | encoder | full: parse µs | delta: apply only µs | delta: parse+apply+parse µs | delta / full |');
console.log('|---|---|---|---|---|---|');
let sink = 0;
for (const [kind, c] of Object.entries(cases)) {
  const n = c.target.length;
  const fullEnv = c.target.map((t, i) => JSON.stringify({ type: 'message', topic: 't', id: `k-${i + 1}`, data: t }));
  const baseBytes = c.base.map((b) => enc.encode(b));
  const full = median([0, 1, 2].map(() => cpuUsPer(n, () => {
    for (const e of fullEnv) sink += JSON.parse(JSON.parse(e).data) ? 1 : 0;
  })));
  for (const name of ['block', 'splice']) {
    const deltaEnv = c[name].map((d, i) => JSON.stringify({ type: 'message', topic: 't', id: `k-${i + 1}`, delta: `k-${i}`, data: d }));
    const deltaBytes = c[name].map((d) => enc.encode(d));
    // Checked once: every delta gives its target.
    c[name].forEach((_, i) => {
      if (dec.decode(applyDelta(baseBytes[i], deltaBytes[i])) !== c.target[i]) throw new Error(`${kind} ${name} ${i}`);
    });
    const apply = median([0, 1, 2].map(() => cpuUsPer(n, () => {
      for (let i = 0; i < n; i++) sink += applyDelta(baseBytes[i], deltaBytes[i]).length;
    })));
    const whole = median([0, 1, 2].map(() => cpuUsPer(n, () => {
      for (let i = 0; i < n; i++) {
        const m = JSON.parse(deltaEnv[i]);
        const out = applyDelta(baseBytes[i], enc.encode(m.data), { verifyChecksum: true });
        sink += JSON.parse(dec.decode(out)) ? 1 : 0;
      }
    })));
    console.log(`| ${kind} | ${name}, fossil-delta | ${full.toFixed(2)} | ${apply.toFixed(2)} | ${whole.toFixed(2)} | ${(whole / full).toFixed(2)}× |`);
    c[name].forEach((_, i) => {
      if (dec.decode(fastApply(baseBytes[i], deltaBytes[i])) !== c.target[i]) throw new Error(`fast ${kind} ${name} ${i}`);
    });
    const fastOnly = median([0, 1, 2].map(() => cpuUsPer(n, () => {
      for (let i = 0; i < n; i++) sink += fastApply(baseBytes[i], deltaBytes[i]).length;
    })));
    const fastWhole = median([0, 1, 2].map(() => cpuUsPer(n, () => {
      for (let i = 0; i < n; i++) {
        const m = JSON.parse(deltaEnv[i]);
        sink += JSON.parse(dec.decode(fastApply(baseBytes[i], enc.encode(m.data)))) ? 1 : 0;
      }
    })));
    console.log(`| ${kind} | ${name}, Uint8Array.set decoder | ${full.toFixed(2)} | ${fastOnly.toFixed(2)} | ${fastWhole.toFixed(2)} | ${(fastWhole / full).toFixed(2)}× |`);
  }
}
// The floor of a splice applied to JavaScript strings (a format counting UTF-16 units, which
// needs no UTF-8 round trip): slice the base, concatenate, parse.
for (const [kind, c] of Object.entries(cases)) {
  const n = c.target.length;
  const cuts = c.target.map((t, i) => {
    const b = c.base[i];
    let p = 0;
    while (p < b.length && p < t.length && b[p] === t[p]) p++;
    let q = 0;
    while (q < b.length - p && q < t.length - p && b[b.length - 1 - q] === t[t.length - 1 - q]) q++;
    return { p, q, mid: t.slice(p, t.length - q) };
  });
  const env = cuts.map((x, i) => JSON.stringify({ type: 'message', topic: 't', id: `k-${i + 1}`, delta: `k-${i}`, data: [x.p, x.q, x.mid] }));
  const fullEnv = c.target.map((t, i) => JSON.stringify({ type: 'message', topic: 't', id: `k-${i + 1}`, data: t }));
  const full = median([0, 1, 2].map(() => cpuUsPer(n, () => {
    for (const e of fullEnv) sink += JSON.parse(JSON.parse(e).data) ? 1 : 0;
  })));
  const sp = median([0, 1, 2].map(() => cpuUsPer(n, () => {
    for (let i = 0; i < n; i++) {
      const [p, q, mid] = JSON.parse(env[i]).data;
      const b = c.base[i];
      sink += JSON.parse(b.slice(0, p) + mid + b.slice(b.length - q)) ? 1 : 0;
    }
  })));
  console.log(`| ${kind} | string splice (no checksum) | ${full.toFixed(2)} | - | ${sp.toFixed(2)} | ${(sp / full).toFixed(2)}× |`);
}
if (sink < 0) console.log(sink);
