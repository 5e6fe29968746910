// Issue 46's proof: an upgrade keeps every kind of connection real clients make. Under a
// publisher sending 20 messages a second, SIGUSR1 to a lone server and to a `--processes 3`
// group on a private Redis must move all of these with no close, no reconnect, no gap, every
// message once and in order:
//  - headless Chromium over HTTPS (self-signed, --ignore-certificate-errors), ALPN h2: an
//    `EventSource`, the browser client (`@clarion/client`) on a WebSocket (with deflate; it
//    rides the page's HTTP/2 connection, RFC 8441, when Chromium pools it there), and a page
//    WebSocket that publishes one message in-band after the upgrade;
//  - h2c from Node's own `http2` client (Chromium cannot speak h2c): one connection with an SSE
//    stream, an RFC 8441 WebSocket (extended CONNECT) and a GRIP held stream;
//  - the Node client on `ws` (compressing its subscribe) and on Node's own WebSocket (Node 20
//    has it behind --experimental-websocket: a child node process runs with the flag);
//  - the Python `Subscriber`;
//  - a GRIP held stream over HTTP/1.1 (a Node backend answers `Grip-Hold: stream`).
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const http2 = require('node:http2');
const net = require('node:net');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
const { spawn, execFileSync } = require('node:child_process');
const WS = require('ws');
const { binary, waitFor } = require('./helpers');

const root = path.resolve(__dirname, '..', '..');
const clientModule = path.join(root, 'node', 'client', 'index.js');
const publishModule = path.join(root, 'node', 'clarion', 'index.js');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const venvPython = path.join(root, '.ci', '.venv', 'bin', 'python');
const python = process.env.PYTHON || (fs.existsSync(venvPython) ? venvPython : 'python3');
const EVERY_MS = 50; // 20 messages a second
const AFTER = 20; // messages published once the upgrade is done
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const children = new Set();
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-ho-mix-'));
after(() => {
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});
execFileSync(binary(), ['cert', '--dev', '--dir', dir]);

function track(child) {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
}

async function startRedis() {
  const exe = '/usr/bin/redis-server';
  if (!fs.existsSync(exe)) {
    // Under CI a missing redis-server is a failure, not a skip.
    if (process.env.CI === 'true') assert.fail('redis-server is missing (apt-get install redis-server)');
    return null;
  }
  const port = await freePort();
  const rdir = fs.mkdtempSync(path.join(dir, 'redis-'));
  track(spawn(exe, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', rdir], { stdio: 'ignore' }));
  await waitFor(() => new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => { s.end(); resolve(true); });
    s.on('error', () => resolve(false));
  }), 10000, 'redis-server');
  return `redis://127.0.0.1:${port}`;
}

// The server (lone or a group's supervisor), with its stderr kept.
function startServer(args) {
  const child = track(spawn(binary(), ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] }));
  const log = [];
  readline.createInterface({ input: child.stderr }).on('line', (l) => log.push(l));
  const stdout = readline.createInterface({ input: child.stdout });
  const ready = [];
  stdout.on('line', (l) => ready.push(l));
  return new Promise((resolve, reject) => {
    stdout.once('line', (line) => {
      const m = /clients=(\S+) api=(\S+)(?: tls=(\S+))?/.exec(line);
      if (m) resolve({ clients: m[1], api: m[2], tls: m[3], child, log, ready });
      else reject(new Error(`unexpected first line: ${line}`));
    });
    child.once('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
}

// A GRIP backend: every request is held as a stream on channel `gfeed`.
function gripBackend() {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/plain', 'Grip-Hold': 'stream', 'Grip-Channel': 'gfeed', 'Content-Length': '6' });
    res.end('start\n');
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

// Lines of a streamed body, with whether (and why) it ended.
function lines() {
  const s = { buf: '', got: [], ended: null };
  s.feed = (chunk) => {
    s.buf += chunk;
    let i;
    while ((i = s.buf.indexOf('\n')) >= 0) {
      const line = s.buf.slice(0, i);
      s.buf = s.buf.slice(i + 1);
      if (/^(m\d+|page)$/.test(line)) s.got.push(line);
    }
  };
  return s;
}

// SSE `data:` lines of a stream.
function sseLines() {
  const s = lines();
  const feed = s.feed;
  s.feed = (chunk) => feed(String(chunk).replace(/^data: ?/gm, ''));
  return s;
}

// Unmasked server frames of a WebSocket (no extension), text messages kept.
function wsReader() {
  const s = { buf: Buffer.alloc(0), got: [], ended: null, other: [] };
  s.feed = (chunk) => {
    s.buf = Buffer.concat([s.buf, chunk]);
    for (;;) {
      if (s.buf.length < 2) return;
      const op = s.buf[0] & 0x0f;
      let len = s.buf[1] & 0x7f;
      let at = 2;
      if (len === 126) { if (s.buf.length < 4) return; len = s.buf.readUInt16BE(2); at = 4; }
      else if (len === 127) { if (s.buf.length < 10) return; len = Number(s.buf.readBigUInt64BE(2)); at = 10; }
      if (s.buf.length < at + len) return;
      const payload = s.buf.subarray(at, at + len);
      s.buf = s.buf.subarray(at + len);
      if (op === 1) s.got.push(payload.toString());
      else s.other.push(op);
    }
  };
  return s;
}

// One h2c connection from Node's http2 client: an SSE stream, an RFC 8441 WebSocket and a
// GRIP held stream. `closed` records a GOAWAY, a reset or a close of any of them.
async function h2cClient(addr) {
  const session = http2.connect(`http://${addr}`);
  const c = { sse: sseLines(), ws: wsReader(), grip: lines(), events: [] };
  session.on('goaway', (code) => c.events.push(`goaway ${code}`));
  session.on('close', () => c.events.push('session closed'));
  session.on('error', (e) => c.events.push(`session error ${e.message}`));
  await new Promise((resolve) => session.once('remoteSettings', resolve));
  assert.equal(session.remoteSettings.enableConnectProtocol, true, 'the server offers RFC 8441');
  const watch = (req, name, sink) => {
    req.on('data', (d) => sink.feed(d));
    req.on('close', () => c.events.push(`${name} closed (${req.rstCode})`));
    req.on('error', (e) => c.events.push(`${name} error ${e.message}`));
  };
  const sse = session.request({ ':path': '/sse?topic=feed' });
  watch(sse, 'sse', c.sse);
  const ws = session.request({ ':method': 'CONNECT', ':protocol': 'websocket', ':path': '/ws?topic=feed', ':scheme': 'http', 'sec-websocket-version': '13' });
  watch(ws, 'ws', c.ws);
  const grip = session.request({ ':path': '/grip/h2' });
  watch(grip, 'grip', c.grip);
  c.status = {};
  for (const [name, req] of [['sse', sse], ['ws', ws], ['grip', grip]]) {
    req.on('response', (h) => (c.status[name] = h[':status']));
  }
  c.session = session;
  return c;
}

// A GRIP held stream over HTTP/1.1.
function gripH1(addr) {
  const s = lines();
  const req = http.get(`http://${addr}/grip/h1`, { agent: false }, (res) => {
    res.setEncoding('utf8');
    res.on('data', (d) => s.feed(d));
    res.on('close', () => (s.ended = s.ended || 'closed'));
    res.on('aborted', () => (s.ended = 'aborted'));
  });
  req.on('error', (e) => (s.ended = e.message));
  s.req = req;
  return s;
}

// The Python Subscriber in a child process: one JSON line per delivery and event.
const PY_SUBSCRIBER = `
import asyncio, json, sys
from clarion_client import Subscriber
from clarion_client.subscriber import Delivery

def on_event(name, detail):
    print(json.dumps({"event": name}), flush=True)

async def main(url):
    client = Subscriber(url, on_event=on_event)
    async for item in client.subscribe("feed"):
        if isinstance(item, Delivery):
            print(json.dumps({"data": item.data}), flush=True)
        else:
            print(json.dumps({"other": repr(item)}), flush=True)

asyncio.run(main(sys.argv[1]))
`;

// The Node client on Node's own WebSocket (a child with --experimental-websocket).
const NODE_NATIVE = `
const url = process.argv[1];
import(process.argv[2]).then(({ ClarionClient }) => {
  const c = new ClarionClient(url, { WebSocket: globalThis.WebSocket });
  c.on('connected', () => console.log(JSON.stringify({ event: 'connected' })));
  c.on('disconnected', (d) => console.log(JSON.stringify({ event: 'disconnected', detail: String(d && d.code) })));
  c.on('gap', () => console.log(JSON.stringify({ event: 'gap' })));
  c.subscribe('feed', { onMessage: (m) => console.log(JSON.stringify({ data: m.data })) });
});
`;

function jsonChild(cmd, args, env) {
  const child = track(spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, ...env } }));
  const s = { got: [], events: [], others: [], child };
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    const v = JSON.parse(line);
    if ('data' in v) s.got.push(v.data);
    else if ('event' in v) s.events.push(v.event);
    else s.others.push(v);
  });
  return s;
}

// `ws` compressing every message, its subscribe included.
let lastWs;
class DeflatingWs extends WS {
  constructor(url, protocols) {
    super(url, protocols, { perMessageDeflate: { threshold: 0 } });
    this.once('upgrade', (res) => (this.answered = res.headers['sec-websocket-extensions']));
    lastWs = this;
  }
}

const PAGE = `<!doctype html><meta charset="utf-8"><title>hand-over mix</title>
<script type="module">
  import { ClarionClient } from './client.js';
  const origin = location.origin;
  window.es = []; window.esErrors = 0; window.esOpens = 0;
  const es = new EventSource(origin + '/sse?topic=feed');
  es.onopen = () => window.esOpens++;
  es.onerror = () => window.esErrors++;
  es.onmessage = (e) => window.es.push(e.data);
  window.got = []; window.gaps = []; window.on = []; window.closes = []; window.errors = [];
  window.start = () => {
    const client = new ClarionClient(origin.replace('https:', 'wss:') + '/ws', { transport: 'websocket' });
    client.on('connected', (c) => window.on.push(c.url));
    client.on('disconnected', (d) => window.closes.push(String(d && d.code)));
    client.on('error', (e) => window.errors.push(e.kind + ': ' + e.message));
    client.on('gap', (g) => window.gaps.push(g));
    const sub = client.subscribe('feed', { onMessage: (m) => window.got.push(m.data) });
    window.subState = () => sub.state;
    const pubWs = new WebSocket(origin.replace('https:', 'wss:') + '/ws');
    window.pubCloses = [];
    window.pubAnswers = [];
    pubWs.onopen = () => (window.pubOpen = pubWs.extensions);
    pubWs.onclose = (e) => window.pubCloses.push(e.code);
    pubWs.onmessage = (e) => window.pubAnswers.push(e.data);
    window.publishFromPage = (data) => pubWs.send(JSON.stringify({ type: 'publish', topic: 'feed', data }));
  };
</script>`;

async function gripPublish(api, data) {
  const body = JSON.stringify({ items: [{ channel: 'gfeed', formats: { 'http-stream': { content: `${data}\n` } } }] });
  for (let i = 0; i < 200; i++) {
    const res = await fetch(`http://${api}/publish/`, { method: 'POST', body, headers: { 'Content-Type': 'application/json' } });
    await res.arrayBuffer();
    if (res.status === 200) return;
    assert.equal(res.status, 503, `GRIP publish answered ${res.status}`);
    await sleep(20);
  }
  assert.fail('a GRIP publish was refused for 4 s');
}

// waitFor, saying what was seen when it times out.
async function waitSeen(check, ms, what, seen) {
  try {
    await waitFor(check, ms, what);
  } catch (e) {
    throw new Error(`${e.message}: ${JSON.stringify(await seen())}`);
  }
}

async function metric(api, line) {
  const text = await (await fetch(`http://${api}/metrics`)).text();
  return text.split('\n').filter((l) => l.startsWith(line)).reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
}

async function handOver(group) {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  const { ClarionClient } = await import(clientModule);
  const { Client } = await import(publishModule);
  const backend = await gripBackend();
  const routes = path.join(dir, `routes-${group ? 'group' : 'lone'}`);
  fs.writeFileSync(routes, `*,path_beg=/grip/ 127.0.0.1:${backend.address().port}\n`);
  const pidFile = path.join(dir, `pid-${group ? 'group' : 'lone'}`);
  const args = [
    '--tls-listen', '127.0.0.1:0', '--tls-cert', path.join(dir, 'cert.pem'), '--tls-key', path.join(dir, 'key.pem'),
    '--grip-routes', routes, '--allow-client-publish',
  ];
  if (group) {
    const redis = await startRedis();
    if (!redis) return null;
    args.push('--processes', '3', '--broker', redis);
  } else {
    args.push('--history-dir', path.join(dir, 'hist'), '--pid-file', pidFile);
  }
  const old = await startServer(args);
  const tlsPort = old.tls.slice(old.tls.lastIndexOf(':') + 1);
  const origin = `https://localhost:${tlsPort}`;
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--ignore-certificate-errors', '--disable-features=LocalNetworkAccessChecks'],
  });
  let node;
  let successor;
  try {
    const page = await browser.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    await page.route(`${origin}/page.html**`, (r) => r.fulfill({ status: 200, contentType: 'text/html; charset=utf-8', body: PAGE }));
    await page.route(`${origin}/client.js**`, (r) => r.fulfill({ status: 200, contentType: 'text/javascript', body: fs.readFileSync(clientModule, 'utf8') }));
    await page.route(`${origin}/delta.js**`, (r) => r.fulfill({ status: 200, contentType: 'text/javascript', body: fs.readFileSync(path.join(path.dirname(clientModule), 'delta.js'), 'utf8') }));
    await page.goto(`${origin}/page.html`);
    const read = (expr) => page.evaluate(expr);
    await waitFor(async () => (await read('window.esOpens')) === 1, 15000, 'the EventSource to open');
    await page.evaluate('window.start()');
    await waitFor(async () => (await read('window.subState && window.subState()')) === 'subscribed', 15000, 'the page to subscribe');
    await waitFor(async () => (await read('window.pubOpen')) !== undefined, 10000, 'the page\'s publishing WebSocket');
    if (!group) {
      // The page reached the server over HTTP/2 (ALPN h2 on TLS).
      assert.ok(await metric(old.api, 'clarion_protocol_connections{protocol="h2"}') >= 1, 'Chromium negotiated h2');
      // Its EventSource and both its WebSockets are streams of it (RFC 8441 for the sockets).
      assert.equal(await metric(old.api, 'clarion_h2_streams '), 3, 'Chromium\'s WebSockets ride HTTP/2');
    }
    const url = `ws://${old.clients}/ws`;
    const nodeSeen = { got: [], closes: [], gaps: [], on: 0 };
    node = new ClarionClient(url, { WebSocket: DeflatingWs });
    node.on('connected', () => nodeSeen.on++);
    node.on('disconnected', (d) => nodeSeen.closes.push(d));
    node.on('gap', (g) => nodeSeen.gaps.push(g));
    const nodeSub = node.subscribe('feed', { onMessage: (m) => nodeSeen.got.push(m.data) });
    await waitFor(() => nodeSub.state === 'subscribed', 10000, 'the ws client to subscribe');
    assert.match(lastWs.answered || '', /permessage-deflate.*client_no_context_takeover/);
    const native = jsonChild(process.execPath, ['--experimental-websocket', '-e', NODE_NATIVE, url, clientModule]);
    const py = jsonChild(python, ['-c', PY_SUBSCRIBER, url], { PYTHONPATH: path.join(root, 'python', 'client', 'src') });
    const h2c = await h2cClient(old.clients);
    const grip = gripH1(old.clients);
    await waitFor(() => native.events.includes('connected'), 15000, 'the native WebSocket client');
    await waitFor(() => py.events.includes('connected'), 15000, 'the Python subscriber');
    await waitFor(() => h2c.status.sse === 200 && h2c.status.ws === 200 && h2c.status.grip === 200, 10000, 'the h2c streams');
    await sleep(700); // every subscription (in-band ones included) is in place

    const pub = new Client({ baseUrl: `http://${old.api}` });
    // A kept API connection that the process being replaced closed fails the next request
    // before it is read (the client retries a 503 itself, not that): sent again, counted.
    let resent = 0;
    const again = async (send) => {
      for (let tries = 0; ; tries++) {
        try {
          return await send();
        } catch (e) {
          if (tries >= 50 || !/UND_ERR_SOCKET|ECONNRESET|fetch failed|cannot reach/.test(`${e.message} ${e.cause && e.cause.code}`)) throw e;
          resent++;
          await sleep(20);
        }
      }
    };
    const want = [];
    let upgraded = false;
    let afterCount = 0;
    const publishing = (async () => {
      for (let i = 0; afterCount < AFTER; i++) {
        await again(() => pub.publish('feed', `m${i}`));
        await again(() => gripPublish(old.api, `m${i}`));
        want.push(`m${i}`);
        if (upgraded) afterCount++;
        await sleep(EVERY_MS);
      }
    })();
    await waitFor(() => want.length >= 40, 20000, '40 messages published');
    const t0 = Date.now();
    old.child.kill('SIGUSR1');
    if (group) {
      await waitFor(() => old.log.some((l) => l.includes('rolling upgrade done')), 40000, 'the rolling upgrade');
    } else {
      await waitFor(() => old.ready.some((l) => l.startsWith('clarion ready')), 20000, 'the successor');
      await new Promise((resolve) => (old.child.exitCode !== null ? resolve() : old.child.once('exit', resolve)));
      successor = Number(fs.readFileSync(pidFile, 'utf8'));
      await waitFor(() => old.log.some((l) => /hand-over: .* moved/.test(l)), 10000, 'the hand-over log line');
    }
    upgraded = true;
    const upgradeMs = Date.now() - t0;
    await publishing;
    // One publish from the page, in-band on its (moved) WebSocket, after the upgrade.
    await page.evaluate('window.publishFromPage("page")');
    await waitFor(async () => (await read('window.pubAnswers.length')) >= 1, 10000, 'the page\'s publish to be answered');
    want.push('page');
    const gripWant = want.filter((m) => m !== 'page');
    const n = want.length;
    await waitFor(async () => (await read('window.got.length')) >= n && (await read('window.es.length')) >= n, 20000, 'the page to get every message');
    await waitFor(() => nodeSeen.got.length >= n && native.got.length >= n && py.got.length >= n, 20000, 'the Node and Python clients');
    const h2cSeen = () => ({ n, sse: h2c.sse.got.length, ws: h2c.ws.got.length, other: h2c.ws.other, grip: h2c.grip.got.length, h1grip: grip.got.length, events: h2c.events, h1ended: grip.ended, log: old.log.slice(-6) });
    await waitSeen(() => h2c.sse.got.length >= n && h2c.ws.got.length >= n, 20000, 'the h2c streams', h2cSeen);
    await waitSeen(() => h2c.grip.got.length >= gripWant.length && grip.got.length >= gripWant.length, 20000, 'the GRIP streams', h2cSeen);

    const summary = old.log.filter((l) => /hand-over: .* moved|rolling upgrade done|stay and are told/.test(l)).join(' | ');
    // No close, no reconnect, no gap, every message once and in order, for each of them.
    assert.deepEqual(await read('window.closes'), [], `the page's client saw a close: ${summary}`);
    assert.equal((await read('window.on')).length, 1, 'the page connected once');
    assert.deepEqual(await read('window.gaps'), []);
    assert.deepEqual(await read('window.got'), want, 'the page\'s client');
    assert.deepEqual(await read('window.es'), want, 'the page\'s EventSource over h2');
    assert.equal(await read('window.esErrors'), 0, 'the EventSource never reconnected');
    assert.equal(await read('window.esOpens'), 1);
    assert.deepEqual(await read('window.pubCloses'), []);
    assert.deepEqual(nodeSeen.closes, [], `the ws client saw a close: ${summary}`);
    assert.equal(nodeSeen.on, 1);
    assert.deepEqual(nodeSeen.gaps, []);
    assert.deepEqual(nodeSeen.got, want, 'the ws client');
    assert.deepEqual(native.events, ['connected'], 'the native WebSocket client');
    assert.deepEqual(native.got, want, 'the native WebSocket client');
    assert.deepEqual(py.events.filter((e) => e !== 'connecting'), ['connected'], 'the Python subscriber');
    assert.deepEqual(py.others, []);
    assert.deepEqual(py.got, want, 'the Python subscriber');
    assert.deepEqual(h2c.events, [], `the h2c connection: ${summary}`);
    assert.deepEqual(h2c.sse.got, want, 'the h2c SSE stream');
    assert.deepEqual(h2c.ws.got, want, 'the h2c RFC 8441 WebSocket');
    assert.deepEqual(h2c.grip.got, gripWant, 'the h2c GRIP stream');
    assert.equal(grip.ended, null, 'the HTTP/1.1 GRIP stream');
    assert.deepEqual(grip.got, gripWant, 'the HTTP/1.1 GRIP stream');
    assert.deepEqual(pageErrors, []);
    assert.ok(!/[1-9]\d* stay and are told/.test(summary), `every connection moved: ${summary}`);
    if (group) assert.match(summary, /rolling upgrade done: 3 processes handed over/);
    h2c.session.close();
    grip.req.destroy();
    return { summary, upgradeMs, n, resent };
  } finally {
    if (node) node.close();
    await browser.close();
    backend.close();
    old.child.kill('SIGTERM');
    if (successor) {
      try {
        process.kill(successor, 'SIGKILL');
      } catch {
        // gone already
      }
    }
  }
}

test('SIGUSR1 to a lone server moves Chromium (h2 EventSource, deflate WebSocket), h2c SSE/RFC 8441/GRIP streams, ws, Node\'s WebSocket, Python and a GRIP stream: no close, every message once, in order', async () => {
  const r = await handOver(false);
  console.log(`lone: ${r.n} messages; upgrade ${r.upgradeMs} ms; publishes sent again: ${r.resent}; ${r.summary}`);
});

test('the same for a --processes 3 group on Redis (a rolling upgrade)', async (t) => {
  const r = await handOver(true);
  if (!r) return t.skip('no redis-server');
  console.log(`group: ${r.n} messages; upgrade ${r.upgradeMs} ms; publishes sent again: ${r.resent}; ${r.summary}`);
});
