// Webhook throughput at a mass disconnect (docs/hooks.md "Webhooks", docs/benchmarks.md
// "Backend hooks"). A `clarion serve --processes P` group on a private redis-server posts its
// events to a receiver (a minimal Node backend in its own process that answers 200 and counts).
// `clarion bench --scenario idle` opens N WebSockets over 1,000 topics from its worker
// processes (one per 10,000 connections, each from its own loopback address), holds them,
// proves them alive with one message, and exits: every connection closes within about a
// second, a harsher burst than N disconnects spread over ten seconds. Reported: the time from
// the first `disconnected` event the receiver got to the last, the events per second over
// that window, request bytes per event (request line and headers included) and events per
// request, and clarion_webhook_dropped_total. Medians over REPEATS.
//
//   cargo build --release -p clarion
//   cd bench/hooks && npm ci && node webhooks.mjs    # N=100000 PROCESSES=6 REPEATS=3
import { spawn } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { firstLine, get, median, serverEnv, startRedis, waitHealthy } from './util.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const env = (name, dflt) => Number(process.env[name] || dflt);
const N = env('N', 100000);
const PROCESSES = env('PROCESSES', 6);
const REPEATS = env('REPEATS', 3);
const bin = process.env.CLARION_BIN || path.resolve(here, '../../target/release/clarion');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// --- the receiver: 200 to every batch; counts events by type, requests and bytes -------------
function receiver() {
  let stats;
  const reset = () => {
    stats = { requests: 0, bytes: 0, events: {}, firstDisconnectedAt: 0, lastDisconnectedAt: 0 };
  };
  reset();
  const server = http.createServer((req, res) => {
    if (req.method === 'GET') {
      res.end(JSON.stringify(stats));
      if (req.url === '/reset') reset();
      return;
    }
    // Request line and headers as they came, plus the body.
    let bytes = req.method.length + req.url.length + 12;
    for (let i = 0; i < req.rawHeaders.length; i += 2) bytes += req.rawHeaders[i].length + req.rawHeaders[i + 1].length + 4;
    const chunks = [];
    req.on('data', (d) => chunks.push(d));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      stats.requests++;
      stats.bytes += bytes + body.length;
      for (const e of JSON.parse(body).events) {
        stats.events[e.type] = (stats.events[e.type] || 0) + 1;
        if (e.type === 'disconnected') {
          stats.lastDisconnectedAt = Date.now();
          stats.firstDisconnectedAt ||= stats.lastDisconnectedAt;
        }
      }
      res.end();
    });
  });
  server.keepAliveTimeout = 60000;
  server.listen(0, '127.0.0.1', () => console.log(server.address().port));
}

async function stats(port, reset = false) {
  return JSON.parse((await get(`http://127.0.0.1:${port}/${reset ? 'reset' : 'stats'}`))[1]);
}

async function run(redisUrl, port) {
  const server = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0',
    '--processes', String(PROCESSES), '--broker', redisUrl, '--max-connections-per-address', '0',
    '--webhook-url', `http://127.0.0.1:${port}/events`], { stdio: ['pipe', 'pipe', 'ignore'], env: serverEnv() });
  const ready = await firstLine(server);
  const clientsAddr = / clients=(\S+)/.exec(ready)[1];
  const api = / api=(\S+)/.exec(ready)[1];
  await waitHealthy(api, PROCESSES);
  await stats(port, true);
  const bench = spawn(bin, ['bench', '--scenario', 'idle', '--target', clientsAddr, '--api', api,
    '-n', String(N), '--topics', '1000', '--connect-rate', '5000', '--hold', '5', '-m', '1', '--drain', '10'],
  { stdio: ['ignore', 'ignore', 'inherit'], env: serverEnv() });
  const code = await new Promise((r) => bench.once('exit', r));
  if (code !== 0) throw new Error(`clarion bench exited with ${code}`);
  const until = async (check, ms, what) => {
    const end = Date.now() + ms;
    while (!(await check())) {
      if (Date.now() > end) throw new Error(`timed out: ${what}`);
      await sleep(100);
    }
  };
  const opened = (await stats(port)).events.connected || 0;
  await until(async () => ((await stats(port)).events.disconnected || 0) >= opened, 120000, 'disconnected events');
  const s = await stats(port);
  const [, metrics] = await get(`http://${api}/metrics`);
  const dropped = metrics.split('\n').filter((l) => l.startsWith('clarion_webhook_dropped_total'))
    .reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
  server.kill('SIGTERM');
  await new Promise((r) => server.once('exit', r));
  const events = Object.values(s.events).reduce((a, b) => a + b, 0);
  const seconds = (s.lastDisconnectedAt - s.firstDisconnectedAt) / 1000;
  return { opened, seconds, perSecond: s.events.disconnected / seconds, bytesPerEvent: s.bytes / events, perRequest: events / s.requests, events: s.events, dropped };
}

async function main() {
  const redis = await startRedis();
  const recv = spawn(process.execPath, [fileURLToPath(import.meta.url), '--receiver'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = Number(await firstLine(recv));
  const out = [];
  try {
    for (let r = 0; r < REPEATS; r++) {
      const o = await run(redis.url, port);
      console.error(JSON.stringify(o));
      out.push(o);
    }
  } finally {
    recv.kill();
    redis.proc.kill();
  }
  const m = (f) => median(out.map(f));
  console.log(`${N} WebSockets on clarion serve --processes ${PROCESSES}, all closed at once by clarion bench; median of ${REPEATS}`);
  console.log('| first to last disconnected event | events delivered per second | bytes per event | events per request | dropped |');
  console.log('|---|---|---|---|---|');
  console.log(`| ${m((o) => o.seconds).toFixed(2)} s | ${Math.round(m((o) => o.perSecond))} | ${m((o) => o.bytesPerEvent).toFixed(0)} | ${m((o) => o.perRequest).toFixed(0)} | ${m((o) => o.dropped)} |`);
}

const [, , role, ...rest] = process.argv;
if (role === '--receiver') receiver();
else if (role === '--clients') clients(Number(rest[0]), Number(rest[1]), rest[2], rest[3]);
else await main();
