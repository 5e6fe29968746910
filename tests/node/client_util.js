// For the subscriber client's tests (client.test.js, client_browser.test.js, client_herd.test.js):
// a private redis-server, Clarion nodes on fixed ports (so a killed node comes back on the same
// address), HS256 tokens, and a publisher that numbers its messages and remembers their ids.
'use strict';

const { spawn } = require('node:child_process');
const net = require('node:net');
const os = require('node:os');
const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const jwt = require('jsonwebtoken');
const { binary, waitFor } = require('./helpers');

const SECRET = 'client-tests-secret-0123456789abcdef';
const clientModule = path.resolve(__dirname, '..', '..', 'node', 'client', 'index.js');
const children = new Set();

function killAll() {
  for (const c of children) c.kill('SIGKILL');
  children.clear();
}

// A free loopback port below the ephemeral range, so no outgoing connection takes it while
// its server is down.
const handed = new Set();
async function freePort() {
  for (;;) {
    const p = 10000 + Math.floor(Math.random() * 22000);
    if (handed.has(p)) continue;
    const ok = await new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(p, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (ok) {
      handed.add(p);
      return p;
    }
  }
}

// A private redis-server, on `port` when given (to start it again at the same address).
async function startRedis(port) {
  port = port || await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-redis-'));
  const child = spawn('/usr/bin/redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
  children.add(child);
  await waitFor(() => new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => {
      s.end();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  }), 10000, 'redis-server');
  return { url: `redis://127.0.0.1:${port}`, child };
}

// A `clarion serve` on fixed ports; `kill9()`, `stop()` (SIGTERM, graceful) and `start()` again.
class Node {
  constructor(args) {
    this.args = args;
  }

  async start() {
    if (!this.port) {
      this.port = await freePort();
      this.apiPort = await freePort();
    }
    this.clients = `127.0.0.1:${this.port}`;
    this.api = `127.0.0.1:${this.apiPort}`;
    const child = spawn(binary(), ['serve', '--listen', this.clients, '--api-listen', this.api, ...this.args], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    children.add(child);
    this.child = child;
    await new Promise((resolve, reject) => {
      const lines = readline.createInterface({ input: child.stdout });
      lines.once('line', resolve);
      child.once('exit', (code) => reject(new Error(`clarion exited with ${code}`)));
    });
    // The broker link is up once /healthz says so.
    await waitFor(async () => {
      try {
        return (await fetch(`http://${this.api}/healthz`)).status === 200;
      } catch {
        return false;
      }
    }, 10000, 'healthz');
    return this;
  }

  kill9() {
    return this._end('SIGKILL');
  }

  stop() {
    return this._end('SIGTERM');
  }

  _end(signal) {
    const child = this.child;
    if (!child || child.exitCode !== null) return Promise.resolve();
    return new Promise((resolve) => {
      child.once('exit', () => {
        children.delete(child);
        resolve();
      });
      child.kill(signal);
    });
  }
}

// A TCP relay to `target()` (a function, so a test can point it elsewhere) whose connections
// the test can cut. When the far side refuses, the near side is closed at once, as a load
// balancer with no healthy backend does.
function relay(target) {
  const sockets = new Set();
  const server = net.createServer((near) => {
    const [host, port] = target().split(':');
    const far = net.connect(Number(port), host);
    const pair = [near, far];
    for (const s of pair) {
      sockets.add(s);
      s.on('close', () => {
        sockets.delete(s);
        pair.forEach((o) => o.destroy());
      });
      s.on('error', () => pair.forEach((o) => o.destroy()));
    }
    near.pipe(far);
    far.pipe(near);
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({
      address: `127.0.0.1:${server.address().port}`,
      cut: () => sockets.forEach((s) => s.destroy()),
      close: () => {
        sockets.forEach((s) => s.destroy());
        server.close();
      },
    }));
  });
}

function token(seconds, topics = ['*']) {
  const now = Math.floor(Date.now() / 1000);
  return jwt.sign({ sub: 'tester', iat: now, exp: now + seconds, clarion: { subscribe: topics } }, SECRET, { algorithm: 'HS256' });
}

// Publishes `topic` messages "0", "1", ... every `everyMs` through whichever API in `apis()`
// answers (a 503 or a refused connection is retried on the next one, so nothing is skipped).
function publisher(apis, topic, everyMs = 20) {
  const p = { ids: [], running: true, errors: 0 };
  p.done = (async () => {
    let n = 0;
    let i = 0;
    while (p.running) {
      const list = apis();
      const api = list[i % list.length];
      try {
        const res = await fetch(`http://${api}/publish/${topic}`, { method: 'POST', body: String(n), headers: { Authorization: `Bearer ${SECRET}` } });
        if (res.status === 200) {
          p.ids.push((await res.json()).id);
          n++;
        } else {
          p.errors++;
          i++;
        }
      } catch {
        p.errors++;
        i++;
      }
      await new Promise((r) => setTimeout(r, everyMs));
    }
  })();
  p.stop = async () => {
    p.running = false;
    await p.done;
  };
  return p;
}

// Checks what a subscriber got against what was published: every message once and in order,
// or a gap naming where the loss started. Returns a summary for the assertion message.
function verify(published, got, gaps) {
  // The publisher sends a message again when it saw no answer (the node it asked was killed
  // after Redis took the message): the first copy is then in the stream under an id with no
  // receipt. It is a second publish, not a second delivery; only copies of a payload that was
  // published under another id are set aside.
  const receipts = new Set(published);
  got = got.filter((m) => receipts.has(m.id) || !/^\d+$/.test(String(m.data)) || published[Number(m.data)] === undefined);
  const expected = published.map((id, n) => `${id}=${n}`);
  const seen = got.map((m) => `${m.id}=${m.data}`);
  const ids = new Set();
  for (const m of got) {
    if (ids.has(m.id)) throw new Error(`duplicate ${m.id}`);
    ids.add(m.id);
  }
  if (gaps.length === 0) {
    // Nothing lost: exactly the published sequence (from the first message the client saw).
    const start = expected.indexOf(seen[0]);
    if (start < 0) throw new Error(`first message ${seen[0]} was never published`);
    const want = expected.slice(start);
    if (seen.length !== want.length || seen.some((s, i) => s !== want[i])) {
      const i = seen.findIndex((s, k) => s !== want[k]);
      throw new Error(`got ${seen.length} of ${want.length}; first difference at ${i}: ${seen[i]} vs ${want[i]}`);
    }
    return `${seen.length} messages in order`;
  }
  throw new Error(`gap events: ${JSON.stringify(gaps)}`);
}

module.exports = { relay, SECRET, clientModule, killAll, freePort, startRedis, Node, token, publisher, verify };
