// Shared by the Node test files: run the real `clarion` binary on ephemeral loopback ports and
// publish through its API.
'use strict';

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const fs = require('node:fs');
const readline = require('node:readline');
const WebSocket = require('ws');

const root = path.resolve(__dirname, '..', '..');

function binary() {
  if (process.env.CLARION_BIN) return process.env.CLARION_BIN;
  for (const profile of ['release', 'debug']) {
    const p = path.join(root, 'target', profile, 'clarion');
    if (fs.existsSync(p)) return p;
  }
  throw new Error('build clarion first (cargo build --release)');
}

const servers = [];

// Kills every server started by this test file (call from an `after` hook).
function stopAll() {
  servers.forEach((s) => s.kill('SIGKILL'));
}

// Starts `clarion serve` on ephemeral ports and resolves with its addresses.
function startServer(args = []) {
  const child = spawn(binary(), ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0', ...args], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  servers.push(child);
  return new Promise((resolve, reject) => {
    const lines = readline.createInterface({ input: child.stdout });
    lines.once('line', (line) => {
      const m = /clients=(\S+) api=(\S+)(?: tls=(\S+))?/.exec(line);
      if (m) resolve({ clients: m[1], api: m[2], tls: m[3], child });
      else reject(new Error(`unexpected first line: ${line}`));
    });
    child.once('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
}

async function publish(api, topic, body, binary = false) {
  const res = await fetch(`http://${api}/publish/${topic}`, {
    method: 'POST',
    body,
    headers: { 'Content-Type': binary ? 'application/octet-stream' : 'text/plain' },
  });
  assert.equal(res.status, 200);
  return res.json();
}

// The Pusher application the Pusher tests configure (docs/pusher.md), and the flags that do it.
const PUSHER_APP = Object.freeze({ appId: '123', key: 'app1-key', secret: 'app1-secret' });
function pusherArgs(app = PUSHER_APP) {
  return ['--pusher-app-id', app.appId, '--pusher-app-key', app.key, '--pusher-app-secret', app.secret];
}

// A pusher-js client of `clientsAddr` ("host:port") over plain WebSockets, authorizing its
// private and presence channels with `lib` (the official `pusher` server library), as a
// backend's auth endpoint using `authorizeChannel` would answer; `user` is its presence member.
function pusherJsClient(clientsAddr, lib, key = PUSHER_APP.key, user = null) {
  const PusherJs = require('pusher-js');
  const i = clientsAddr.lastIndexOf(':');
  return new PusherJs(key, {
    cluster: 'mt1',
    wsHost: clientsAddr.slice(0, i),
    wsPort: Number(clientsAddr.slice(i + 1)),
    forceTLS: false,
    enabledTransports: ['ws'],
    disableStats: true,
    channelAuthorization: {
      customHandler: ({ socketId, channelName }, cb) => cb(null, lib.authorizeChannel(socketId, channelName, user)),
    },
  });
}

module.exports = { PUSHER_APP, pusherArgs, pusherJsClient, binary, startServer, publish, stopAll };

// A TCP proxy in front of `target` ("host:port") whose connections can all be cut at once, to
// drop clients the way a flaky network does while the server keeps running.
function startProxy(target) {
  const net = require('node:net');
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(port, host);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => s.destroy());
    }
    client.pipe(upstream);
    upstream.pipe(client);
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      resolve({
        address: `127.0.0.1:${server.address().port}`,
        cut: () => sockets.forEach((s) => s.destroy()),
        close: () => {
          sockets.forEach((s) => s.destroy());
          server.close();
        },
      });
    });
  });
}

// Polls `check` (async or not) until it returns a truthy value, or fails after `ms`.
async function waitFor(check, ms = 10000, what = 'condition') {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

module.exports.startProxy = startProxy;
module.exports.waitFor = waitFor;

// A WebSocket whose text messages are queued: `await ws.next()` takes the next one.
function openWs(url, options) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, options);
    const queue = [];
    const waiters = [];
    ws.on('message', (data) => {
      const w = waiters.shift();
      if (w) w(data.toString('utf8'));
      else queue.push(data.toString('utf8'));
    });
    ws.next = () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((r) => waiters.push(r)));
    ws.once('open', () => resolve(ws));
    ws.once('error', reject);
  });
}
module.exports.openWs = openWs;
