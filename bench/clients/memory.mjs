// Node memory of @clarion/client (with the `ws` WebSocket) per connection and per subscription,
// against a real `clarion serve` on loopback. Each measurement runs in a fresh Node process:
// heap and RSS with no client, with N clients of one topic each (all confirmed by the server),
// then with K topics each, after forced GCs. The baseline is N bare `ws` sockets that each send
// one subscribe message and get its answer, in their own fresh process. Medians of REPEATS.
//
//   cargo build --release -p clarion
//   cd bench/clients && npm ci && node memory.mjs                 # N=1000 K=50 REPEATS=3
//   DEFLATE=0 node memory.mjs                                      # sockets without permessage-deflate
import { spawn, execFileSync } from 'node:child_process';
import readline from 'node:readline';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Ws from 'ws';
import { ClarionClient } from '../../node/client/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const N = Number(process.env.N || 1000);
const K = Number(process.env.K || 50);
const REPEATS = Number(process.env.REPEATS || 3);
const bin = process.env.CLARION_BIN || path.resolve(here, '../../target/release/clarion');
// DEFLATE=0: sockets without permessage-deflate (ws allocates zlib state on the first send).
const deflate = process.env.DEFLATE !== '0';
class WebSocket extends Ws {
  constructor(u, p) {
    super(u, p, { perMessageDeflate: deflate });
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function settle() {
  for (let i = 0; i < 4; i++) {
    global.gc();
    await sleep(50);
  }
  const m = process.memoryUsage();
  return { heap: m.heapUsed + m.external + m.arrayBuffers, rss: m.rss };
}

async function until(check, ms, what) {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await sleep(20);
  }
}

// One measurement in this (fresh) process; prints JSON.
async function child(kind, url) {
  const base = await settle();
  if (kind === 'bare') {
    let answered = 0;
    const socks = [];
    for (let i = 0; i < N; i++) {
      const ws = new WebSocket(url, 'clarion.v1');
      ws.on('open', () => ws.send(JSON.stringify({ type: 'subscribe', topic: `t0.${i % 100}` })));
      ws.on('message', () => answered++);
      socks.push(ws);
      if (i % 200 === 199) await sleep(10);
    }
    await until(() => answered === N, 30000, 'bare sockets');
    const one = await settle();
    console.log(JSON.stringify({ conn: { heap: (one.heap - base.heap) / N, rss: (one.rss - base.rss) / N } }));
    process.exit(0);
  }
  const list = [];
  const subs = [];
  for (let i = 0; i < N; i++) {
    const c = new ClarionClient(url, { WebSocket });
    list.push(c);
    subs.push(c.subscribe(`t0.${i % 100}`));
    if (i % 200 === 199) await sleep(10);
  }
  await until(() => subs.every((s) => s.state === 'subscribed'), 30000, 'connections');
  const one = await settle();
  for (const c of list) for (let k = 1; k < K; k++) subs.push(c.subscribe(`t${k}.${k}`));
  await until(() => subs.every((s) => s.state === 'subscribed'), 30000, 'subscriptions');
  const many = await settle();
  console.log(JSON.stringify({
    conn: { heap: (one.heap - base.heap) / N, rss: (one.rss - base.rss) / N },
    sub: { heap: (many.heap - one.heap) / (N * (K - 1)), rss: (many.rss - one.rss) / (N * (K - 1)) },
  }));
  process.exit(0);
}

if (process.argv[2] === '--child') {
  await child(process.argv[3], process.argv[4]);
} else {
  const server = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0', '--max-subscriptions', String(K + 1)], { stdio: ['ignore', 'pipe', 'ignore'] });
  const line = await new Promise((resolve) => readline.createInterface({ input: server.stdout }).once('line', resolve));
  const url = `ws://${/clients=(\S+)/.exec(line)[1]}/ws`;
  const runs = { bare: [], client: [] };
  try {
    for (let r = 0; r < REPEATS; r++) {
      for (const kind of ['bare', 'client']) {
        const out = execFileSync(process.execPath, ['--expose-gc', fileURLToPath(import.meta.url), '--child', kind, url], { encoding: 'utf8', timeout: 120000 });
        runs[kind].push(JSON.parse(out));
      }
    }
  } finally {
    server.kill('SIGKILL');
  }
  const med = (xs) => Math.round(xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)]);
  const show = (kind, part) => `heap ${med(runs[kind].map((x) => x[part].heap))} B, RSS ${med(runs[kind].map((x) => x[part].rss))} B`;
  console.log(`N=${N} connections, K=${K} topics each, permessage-deflate ${deflate ? 'on' : 'off'}, median of ${REPEATS} (heap = heapUsed + external + arrayBuffers)`);
  console.log(`| per connection, @clarion/client + ws | ${show('client', 'conn')} |`);
  console.log(`| per connection, bare ws (baseline) | ${show('bare', 'conn')} |`);
  console.log(`| per subscription, @clarion/client | ${show('client', 'sub')} |`);
}
