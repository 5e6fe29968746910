// An upgrade keeps the connections real clients make (docs/operations.md, "Upgrades that keep
// connections"). A lone server with --history-dir is sent SIGUSR1 while a publisher sends 20
// messages a second; three subscribers, each over a permessage-deflate WebSocket that has sent
// a compressed message (its in-band subscribe), must be moved to the new process with no
// close, no reconnect, every message once and in order:
//  - headless Chromium running the browser client (node/client, `@clarion/client`);
//  - the same client on Node with the `ws` package, compressing every message (threshold 0, so
//    its short subscribe is compressed as a browser's is);
//  - the Python `Subscriber` (python/client/src/clarion_client), whose `websockets` connection compresses too.
// The publisher is the Node package's `Client`, which sends a publish refused during the
// hand-over's freeze (503 with Retry-After) again.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const WS = require('ws');
const { binary } = require('./helpers');
const { waitFor } = require('./helpers');

const root = path.resolve(__dirname, '..', '..');
const clientModule = path.join(root, 'node', 'client', 'index.js');
const publishModule = path.join(root, 'node', 'clarion', 'index.js');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
// The repository's own test venv (.ci/.venv, made by .ci/run), else the system's python3.
const venvPython = path.join(root, '.ci', '.venv', 'bin', 'python');
const python = process.env.PYTHON || (fs.existsSync(venvPython) ? venvPython : 'python3');
const TOTAL = 300;
const EVERY_MS = 50; // 20 messages a second
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const children = new Set();
// The processes SIGUSR1 started (not our children: they hold the old one's output pipes).
const successors = new Set();
function stopSuccessors() {
  for (const pid of successors) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  successors.clear();
}
after(() => {
  for (const c of children) c.kill('SIGKILL');
  stopSuccessors();
});

const PAGE = `<!doctype html><meta charset="utf-8"><title>clarion hand-over</title>
<script type="module">
  import { ClarionClient } from './client.js';
  const params = new URLSearchParams(location.search);
  window.got = []; window.gaps = []; window.on = []; window.closes = []; window.errors = [];
  const client = new ClarionClient(params.get('url'), { transport: 'websocket' });
  client.on('connected', (c) => window.on.push(c.url));
  client.on('disconnected', (d) => window.closes.push(d));
  client.on('error', (e) => window.errors.push(e.kind + ': ' + e.message));
  client.on('gap', (g) => window.gaps.push(g));
  const sub = client.subscribe('feed', { onMessage: (m) => window.got.push(m.data) });
  window.subState = () => sub.state;
</script>`;

function pageServer() {
  const server = http.createServer((req, res) => {
    if (req.url.startsWith('/client.js')) {
      res.writeHead(200, { 'Content-Type': 'text/javascript' });
      res.end(fs.readFileSync(clientModule));
    } else if (req.url.startsWith('/delta.js')) {
      // The client's own import, beside it as the package ships it.
      res.writeHead(200, { 'Content-Type': 'text/javascript' });
      res.end(fs.readFileSync(path.join(path.dirname(clientModule), 'delta.js')));
    } else {
      res.writeHead(200, { 'Content-Type': 'text/html' });
      res.end(PAGE);
    }
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, origin: `http://127.0.0.1:${server.address().port}` })));
}

// The lone server, with its stderr kept (the hand-over's log line is read from it).
function startLone(args) {
  const child = spawn(binary(), ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(child);
  const log = [];
  readline.createInterface({ input: child.stderr }).on('line', (l) => log.push(l));
  const stdout = readline.createInterface({ input: child.stdout });
  const ready = [];
  stdout.on('line', (l) => ready.push(l));
  return new Promise((resolve, reject) => {
    stdout.once('line', (line) => {
      const m = /clients=(\S+) api=(\S+)/.exec(line);
      if (m) resolve({ clients: m[1], api: m[2], child, log, ready });
      else reject(new Error(`unexpected first line: ${line}`));
    });
    child.once('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
}

// The Python Subscriber in a child process: one JSON line per delivery, gap and event.
const PY_SUBSCRIBER = `
import asyncio, json, sys
from clarion_client import Subscriber
from clarion_client.subscriber import Delivery

def on_event(name, detail):
    print(json.dumps({"event": name, "detail": {k: str(v) for k, v in detail.items()}}), flush=True)

async def main(url, n):
    client = Subscriber(url, on_event=on_event)
    got = 0
    async for item in client.subscribe("feed"):
        if isinstance(item, Delivery):
            print(json.dumps({"data": item.data}), flush=True)
            got += 1
            if got == n:
                break
        else:
            print(json.dumps({"other": repr(item)}), flush=True)
    await client.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
`;

function pythonSubscriber(url) {
  const child = spawn(python, ['-c', PY_SUBSCRIBER, url, String(TOTAL)], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, PYTHONPATH: path.join(root, 'python', 'client', 'src') },
  });
  children.add(child);
  const s = { got: [], events: [], others: [], child };
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    const v = JSON.parse(line);
    if ('data' in v) s.got.push(v.data);
    else if ('event' in v) s.events.push(v);
    else s.others.push(v);
  });
  return s;
}

// `ws` compressing every message, its subscribe included (its default threshold is 1 KiB).
const opened = [];
class DeflatingWs extends WS {
  constructor(url, protocols) {
    super(url, protocols, { perMessageDeflate: { threshold: 0 } });
    this.once('upgrade', (res) => (this.answered = res.headers['sec-websocket-extensions']));
    opened.push(this);
  }
}

async function handOver(extraArgs) {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  const { ClarionClient } = await import(clientModule);
  const { Client } = await import(publishModule);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-ho-'));
  const pidFile = path.join(dir, 'clarion.pid');
  const old = await startLone(['--history-dir', path.join(dir, 'hist'), '--pid-file', pidFile, ...extraArgs]);
  const url = `ws://${old.clients}/ws`;
  const { server, origin } = await pageServer();
  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  const nodeSeen = { got: [], closes: [], gaps: [], on: 0, ext: null };
  let node;
  try {
    // The page.
    const page = await browser.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    await page.goto(`${origin}/?${new URLSearchParams([['url', url]])}`);
    const read = (expr) => page.evaluate(expr);
    await waitFor(async () => (await read('window.subState && window.subState()')) === 'subscribed', 10000, 'the page to subscribe');
    // The Node client on `ws`.
    node = new ClarionClient(url, { WebSocket: DeflatingWs });
    node.on('connected', () => nodeSeen.on++);
    node.on('disconnected', (d) => nodeSeen.closes.push(d));
    node.on('gap', (g) => nodeSeen.gaps.push(g));
    const nodeSub = node.subscribe('feed', { onMessage: (m) => nodeSeen.got.push(m.data) });
    await waitFor(() => nodeSub.state === 'subscribed', 10000, 'the ws client to subscribe');
    nodeSeen.ext = opened[opened.length - 1].answered;
    // The Python Subscriber.
    const py = pythonSubscriber(url);
    await waitFor(() => py.events.some((e) => e.event === 'connected'), 15000, 'the Python subscriber to connect');
    const pub = new Client({ baseUrl: `http://${old.api}` });
    // Its subscribe (sent once connected) is answered before the first counted message.
    await sleep(500);

    const receipts = [];
    let refusedAgain = 0;
    // Refusals the client gave up on (it retries a 503 with Retry-After itself); sent again
    // here so that the subscribers' side is checked whatever the server answered.
    const unretried = [];
    const publishing = (async () => {
      for (let i = 0; i < TOTAL; i++) {
        const t0 = Date.now();
        for (;;) {
          try {
            receipts.push(await pub.publish('feed', `m${i}`));
            break;
          } catch (e) {
            unretried.push(e.message);
            await sleep(20);
          }
        }
        if (Date.now() - t0 > 200) refusedAgain++;
        await sleep(EVERY_MS);
      }
    })();
    await waitFor(() => receipts.length >= 100, 20000, '100 messages published');
    old.child.kill('SIGUSR1');
    await waitFor(() => old.ready.some((l) => l.startsWith('clarion ready')), 20000, 'the successor to be ready');
    const oldExit = await new Promise((resolve) => (old.child.exitCode !== null ? resolve(old.child.exitCode) : old.child.once('exit', resolve)));
    const successor = Number(fs.readFileSync(pidFile, 'utf8'));
    successors.add(successor);
    assert.equal(oldExit, 0);
    assert.notEqual(successor, old.child.pid);
    await publishing;

    await waitFor(async () => (await read('window.got.length')) >= TOTAL, 20000, 'the page to get every message');
    await waitFor(() => nodeSeen.got.length >= TOTAL, 20000, 'the ws client to get every message');
    await waitFor(() => py.got.length >= TOTAL, 20000, 'the Python subscriber to get every message');
    const want = Array.from({ length: TOTAL }, (_, i) => `m${i}`);
    const handover = old.log.find((l) => l.includes('hand-over:') && l.includes('moved'));
    // No close, no reconnect, no gap, every message once and in order, for each of them.
    assert.deepEqual(await read('window.closes'), [], `the page saw a close; old log: ${handover}`);
    assert.equal((await read('window.on')).length, 1, 'the page connected once');
    assert.deepEqual(await read('window.gaps'), []);
    assert.deepEqual(await read('window.got'), want);
    assert.deepEqual(nodeSeen.closes, [], `the ws client saw a close; old log: ${handover}`);
    assert.equal(nodeSeen.on, 1);
    assert.deepEqual(nodeSeen.gaps, []);
    assert.deepEqual(nodeSeen.got, want);
    const pyEvents = py.events.map((e) => e.event);
    assert.deepEqual(pyEvents.filter((e) => e !== 'connecting' && e !== 'connected'), [], `the Python subscriber: ${JSON.stringify(py.events)}`);
    assert.equal(pyEvents.filter((e) => e === 'connected').length, 1);
    assert.deepEqual(py.others, []);
    assert.deepEqual(py.got, want);
    assert.deepEqual(pageErrors, []);
    // Each of them had negotiated compression, and the server told it to keep no context.
    assert.match(nodeSeen.ext || '', /permessage-deflate.*client_no_context_takeover/);
    // The ids go on in one sequence across the two processes.
    const seqs = receipts.map((r) => Number(r.id.split('-').pop()));
    assert.ok(seqs.every((s, i) => i === 0 || s > seqs[i - 1]), 'ids increase across the upgrade');
    assert.match(handover || '', /0 stay/, `every connection moved: ${handover}`);
    assert.deepEqual(unretried, [], 'the publish client sent every refused publish again itself');
    return { handover, refusedAgain };
  } finally {
    if (node) node.close();
    await browser.close();
    server.close();
    stopSuccessors();
  }
}

test('SIGUSR1 moves deflate WebSockets of Chromium, ws and the Python Subscriber with no close and every message once, in order (shared compression)', async () => {
  const r = await handOver([]);
  console.log(`shared: ${r.handover}; publishes that waited for the freeze: ${r.refusedAgain}`);
});

test('the same with dedicated compression: each connection\'s compressor window moves with it', async () => {
  const r = await handOver(['--compression', 'dedicated', '--compression-threshold', '0']);
  console.log(`dedicated: ${r.handover}; publishes that waited for the freeze: ${r.refusedAgain}`);
});
