// A connect storm through the `connect` hook against the same storm with JWTs (docs/hooks.md,
// docs/benchmarks.md "Backend hooks"). Each run starts a fresh `clarion serve --processes 2`
// on a private redis-server (20,000 sockets do not fit one process's 20,000 files), opens N
// WebSockets at RATE per second from PROCS client processes, and reports the server's CPU per
// connection (its processes' utime + stime over the storm, from /proc), the connect latency
// (from `new WebSocket` to the 101) p50/p99 over every connection, refusals, and the number of
// requests the backend saw. Three kinds of run, interleaved so that they share the machine's
// noise, medians over REPEATS:
//
//   jwt        each client sends `Authorization: Bearer <HS256 token>`; no hook
//   hook       each client sends `Cookie: session=s-<user>`; the connect hook (a minimal Node
//              backend in its own process) answers {"allow": true, "sub": user}
//   hook+cache the same with hook_cache_ttl = 60: USERS users with N/USERS tabs each
//
//   cargo build --release -p clarion
//   cd bench/hooks && npm ci && node storm.mjs          # N=20000 RATE=2000 PROCS=2 USERS=1000 REPEATS=3
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';
import { children, cpuSeconds, firstLine, get, median, pct, startRedis, serverEnv, waitHealthy } from './util.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const env = (name, dflt) => Number(process.env[name] || dflt);
const N = env('N', 20000);
const RATE = env('RATE', 2000);
const PROCS = env('PROCS', 2);
const USERS = env('USERS', 1000);
const REPEATS = env('REPEATS', 3);
const SECRET = 'storm-benchmark-secret-of-32-bytes!';
const bin = process.env.CLARION_BIN || path.resolve(here, '../../target/release/clarion');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const b64 = (x) => Buffer.from(typeof x === 'string' ? x : JSON.stringify(x)).toString('base64url');
function token(sub) {
  const head = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub, exp: Math.floor(Date.now() / 1000) + 3600, clarion: { subscribe: ['*'] } })}`;
  return `${head}.${createHmac('sha256', SECRET).update(head).digest('base64url')}`;
}

// --- the backend: answers every connect hook call, counts them -------------------------------
function backend() {
  let calls = 0;
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/calls') {
      res.end(String(calls));
      calls = 0;
      return;
    }
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      calls++;
      let sub = null;
      try {
        sub = JSON.parse(body).cookies?.session ?? null;
      } catch {
        sub = null;
      }
      res.setHeader('Content-Type', 'application/json');
      res.end(JSON.stringify(sub ? { allow: true, sub } : { allow: false, status: 401, reason: 'no session' }));
    });
  });
  server.keepAliveTimeout = 60000;
  server.listen(0, '127.0.0.1', () => console.log(server.address().port));
}

// --- one client process: n connections at rate per second ------------------------------------
async function clients(n, rate, url, kind, first) {
  const lat = [];
  let failed = 0;
  const socks = [];
  const start = Date.now();
  let opened = 0;
  while (opened < n) {
    const due = Math.min(n, Math.floor(((Date.now() - start) / 1000) * rate) + 1);
    for (; opened < due; opened++) {
      const user = `u${(first + opened) % USERS}`;
      const headers = kind === 'jwt' ? { Authorization: `Bearer ${token(user)}` } : { Cookie: `session=${user}` };
      const t0 = process.hrtime.bigint();
      const ws = new WebSocket(url, { headers, perMessageDeflate: false });
      ws.on('open', () => lat.push(Number(process.hrtime.bigint() - t0) / 1e6));
      ws.on('unexpected-response', (_, res) => {
        failed++;
        res.resume();
        ws.terminate();
      });
      ws.on('error', () => {});
      socks.push(ws);
    }
    await sleep(5);
  }
  const deadline = Date.now() + 60000;
  while (lat.length + failed < n && Date.now() < deadline) await sleep(20);
  console.log(JSON.stringify({ lat, failed, missing: n - lat.length - failed }));
  // Hold until the parent has read the server's CPU, then go.
  process.stdin.resume();
  process.stdin.on('end', () => process.exit(0));
}

// --- the orchestrator ------------------------------------------------------------------------
async function run(kind, redisUrl, hookPort) {
  const args = ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0', '--processes', '2',
    '--broker', redisUrl, '--max-connections-per-address', '0'];
  if (kind === 'jwt') args.push('--auth-secret', SECRET);
  else args.push('--hook-connect-url', `http://127.0.0.1:${hookPort}/connect`);
  if (kind === 'hook+cache') args.push('--hook-cache-ttl', '60');
  const server = spawn(bin, args, { stdio: ['pipe', 'pipe', 'ignore'], env: serverEnv() });
  const ready = await firstLine(server);
  const clientsAddr = / clients=(\S+)/.exec(ready)[1];
  const api = / api=(\S+)/.exec(ready)[1];
  await waitHealthy(api, 2);
  await get(`http://127.0.0.1:${hookPort}/calls`);
  const pids = [server.pid, ...children(server.pid)];
  const cpu0 = cpuSeconds(pids);
  const url = `ws://${clientsAddr}/ws?topic=storm`;
  const procs = [];
  for (let p = 0; p < PROCS; p++) {
    const n = Math.floor(N / PROCS) + (p < N % PROCS ? 1 : 0);
    const first = p * Math.ceil(N / PROCS);
    procs.push(spawn(process.execPath, [fileURLToPath(import.meta.url), '--clients', n, RATE / PROCS, url, kind, first],
      { stdio: ['pipe', 'pipe', 'inherit'] }));
  }
  const outs = await Promise.all(procs.map((c) => firstLine(c).then(JSON.parse)));
  const cpu = cpuSeconds(pids) - cpu0;
  const [, calls] = await get(`http://127.0.0.1:${hookPort}/calls`);
  for (const c of procs) c.stdin.end();
  await Promise.all(procs.map((c) => new Promise((r) => c.once('exit', r))));
  server.kill('SIGTERM');
  await new Promise((r) => server.once('exit', r));
  const lat = outs.flatMap((o) => o.lat).sort((a, b) => a - b);
  return {
    kind,
    cpuUsPerConn: (cpu * 1e6) / N,
    p50: pct(lat, 50),
    p99: pct(lat, 99),
    failed: outs.reduce((s, o) => s + o.failed + o.missing, 0),
    backendCalls: Number(calls),
  };
}

async function main() {
  const redis = await startRedis();
  const hook = spawn(process.execPath, [fileURLToPath(import.meta.url), '--backend'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const hookPort = Number(await firstLine(hook));
  const kinds = ['jwt', 'hook', 'hook+cache'];
  const results = Object.fromEntries(kinds.map((k) => [k, []]));
  try {
    for (let r = 0; r < REPEATS; r++) {
      for (const kind of kinds) {
        const out = await run(kind, redis.url, hookPort);
        console.error(JSON.stringify(out));
        results[kind].push(out);
      }
    }
  } finally {
    hook.kill();
    redis.proc.kill();
  }
  console.log(`${N} WebSockets at ${RATE}/s from ${PROCS} processes, ${USERS} users, clarion serve --processes 2; median of ${REPEATS}`);
  console.log('| storm | server CPU per connection | connect p50 | connect p99 | refused or lost | backend requests |');
  console.log('|---|---|---|---|---|---|');
  const base = median(results.jwt.map((o) => o.cpuUsPerConn));
  for (const kind of kinds) {
    const rs = results[kind];
    const cpu = median(rs.map((o) => o.cpuUsPerConn));
    console.log(`| ${kind} | ${cpu.toFixed(1)} µs (${(cpu / base).toFixed(2)}x jwt) | ${median(rs.map((o) => o.p50)).toFixed(2)} ms | ${median(rs.map((o) => o.p99)).toFixed(2)} ms | ${median(rs.map((o) => o.failed))} | ${median(rs.map((o) => o.backendCalls))} |`);
  }
}

const [, , role, ...rest] = process.argv;
if (role === '--backend') backend();
else if (role === '--clients') clients(Number(rest[0]), Number(rest[1]), rest[2], rest[3], Number(rest[4]));
else await main();
