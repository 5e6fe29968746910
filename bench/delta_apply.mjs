// JavaScript client CPU to take the order-book ticker as deltas against as full messages (issue
// 51's third figure), with the shipped Node/browser client (node/client) on frames a real
// server sent. Capture the frames, then run (Node 20):
//
//   python3 bench/delta_wire.py --cases target/delta_frames.json 200
//   node bench/delta_apply.mjs target/delta_frames.json
//
// Each pass feeds every frame, in order, to the client's own frame handler (`_onFrame`: JSON.parse
// of the envelope, and for a delta the id check, UTF-8 encoding, applying with the checksum
// verified, UTF-8 decoding, keeping the bytes for the next delta) with a message listener that
// does what the app does with a message (JSON.parse of its data). `full`: a subscription
// without `delta` fed the frames of a subscriber without `delta=1`; `delta`: one with `delta`
// fed the frames of a `delta=1` subscriber (the first is the full message, the rest deltas).
// CPU time (process.cpuUsage) of loops of at least 300 ms, medians of `--repeats` (3), the two
// modes interleaved; the ratio of each repeat is printed too.
import { readFileSync } from 'node:fs';
import { ClarionClient, Subscription } from '../node/client/index.js';

const frames = JSON.parse(readFileSync(process.argv[2] || 'target/delta_frames.json', 'utf8'));
const repeats = Number(process.argv[3] || 3);

// No connection is made: the client only parses the frames it is handed.
class NoSocket {}
function subscriber(delta) {
  const client = new ClarionClient('ws://127.0.0.1:9/ws', { WebSocket: NoSocket });
  const sub = new Subscription(client, 'book', undefined, false, delta);
  client.subs.set('book', sub);
  let sink = 0;
  sub.on('message', (m) => { sink += JSON.parse(m.data).seq; });
  sub.on('error', (e) => { throw new Error(`the client refused a frame: ${e.message}`); });
  client._resync = (_, why) => { throw new Error(`the client refused a delta: ${why}`); };
  return { client, sub, sum: () => sink };
}

function pass(s, list) {
  s.sub.lastId = null;
  s.sub._base = null;
  for (const f of list) s.client._onFrame(null, f);
}

function cpuUsPerMessage(s, list) {
  const start = process.cpuUsage();
  let rounds = 0;
  let used = 0;
  do {
    pass(s, list);
    rounds++;
    const u = process.cpuUsage(start);
    used = u.user + u.system;
  } while (used < 300_000);
  return used / (list.length * rounds);
}

const full = subscriber(false);
const delta = subscriber(true);
// Checked once: both deliver the same messages (every delta applied, nothing refused).
pass(full, frames.full);
pass(delta, frames.delta);
if (full.sum() !== delta.sum()) throw new Error('the delta subscription delivered other messages');
const deltas = frames.delta.filter((f) => JSON.parse(f).delta !== undefined).length;

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const runs = { full: [], delta: [] };
for (let r = 0; r < repeats; r++) {
  runs.full.push(cpuUsPerMessage(full, frames.full));
  runs.delta.push(cpuUsPerMessage(delta, frames.delta));
}
const fullBytes = frames.full.reduce((a, f) => a + f.length, 0) / frames.full.length;
const deltaBytes = frames.delta.reduce((a, f) => a + f.length, 0) / frames.delta.length;
console.log(`${frames.full.length} messages (${deltas} deltas); frame ${fullBytes.toFixed(0)} B full, ${deltaBytes.toFixed(0)} B with delta=1`);
console.log(`full:  ${runs.full.map((x) => x.toFixed(2)).join(', ')} µs/message, median ${median(runs.full).toFixed(2)}`);
console.log(`delta: ${runs.delta.map((x) => x.toFixed(2)).join(', ')} µs/message, median ${median(runs.delta).toFixed(2)}`);
console.log(`delta / full: ${(median(runs.delta) / median(runs.full)).toFixed(2)}x (per repeat: ${runs.delta.map((x, i) => (x / runs.full[i]).toFixed(2)).join(', ')})`);
