// Backend hooks with the Node example backend from docs/hooks/backend.js: identity from a session
// cookie, a subscribe refused for one topic only, publish data replaced, a bad signature refused,
// and signed webhook events received by a Node `http` server.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const crypto = require('node:crypto');
const http = require('node:http');
const path = require('node:path');
const readline = require('node:readline');
const WebSocket = require('ws');
const { startServer, publish, stopAll } = require('./helpers');

const SECRET = 'node-hook-secret';
const children = [];
after(() => {
  stopAll();
  children.forEach((c) => c.kill('SIGKILL'));
});

function startBackend() {
  const file = path.resolve(__dirname, '..', '..', 'docs', 'hooks', 'backend.js');
  const child = spawn(process.execPath, [file, '0'], {
    env: { ...process.env, CLARION_HOOK_SECRET: SECRET },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.push(child);
  return new Promise((resolve) => {
    readline.createInterface({ input: child.stdout }).once('line', (line) => {
      resolve(`http://127.0.0.1:${line.split(' ')[1]}`);
    });
  });
}

// The command line of docs/hooks.md, but for the addresses.
function hookArgs(base, secret) {
  return [
    '--hook-connect-url', `${base}/hooks/connect`,
    '--hook-subscribe-url', `${base}/hooks/subscribe`,
    '--hook-publish-url', `${base}/hooks/publish`,
    '--webhook-url', `${base}/hooks/events`,
    '--hook-secret', secret,
    '--allow-client-publish',
  ];
}

async function statsWhen(backend, pred) {
  const deadline = Date.now() + 10000;
  for (;;) {
    const stats = await (await fetch(`${backend}/stats`)).json();
    if (pred(stats)) return stats;
    assert.ok(Date.now() < deadline, JSON.stringify(stats));
    await new Promise((r) => setTimeout(r, 50));
  }
}

function open(url, headers) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    const messages = [];
    const waiters = [];
    ws.on('message', (m) => {
      messages.push(m.toString());
      waiters.splice(0).forEach((w) => w());
    });
    ws.next = async () => {
      while (messages.length === 0) await new Promise((r) => waiters.push(r));
      return messages.shift();
    };
    ws.once('open', () => resolve(ws));
    ws.once('unexpected-response', (req, res) => reject(Object.assign(new Error('refused'), { status: res.statusCode })));
    ws.once('error', reject);
  });
}

test('the Node example backend decides connect, subscribe and publish', async () => {
  const backend = await startBackend();
  const s = await startServer(hookArgs(backend, SECRET));
  await assert.rejects(open(`ws://${s.clients}/ws`), (e) => e.status === 401);
  const ws = await open(`ws://${s.clients}/ws?topic=chat.lobby`, { Cookie: 'session=s-alice' });
  await publish(s.api, 'user.alice', 'for alice');
  assert.equal(await ws.next(), 'for alice');
  ws.send(JSON.stringify({ type: 'subscribe', topic: 'admin.panel' }));
  assert.deepEqual(JSON.parse(await ws.next()), { type: 'error', error: 'admins only', topic: 'admin.panel' });
  ws.send(JSON.stringify({ type: 'subscribe', topic: 'news' }));
  assert.deepEqual(JSON.parse(await ws.next()), { type: 'subscribed', topic: 'news' });
  ws.send(JSON.stringify({ type: 'publish', topic: 'chat.lobby', data: 'darn it' }));
  const got = [await ws.next(), await ws.next()];
  assert.ok(got.includes('**** it'), got);
  ws.close();
  // Its webhook events reached the example backend at the documented URL, signed.
  const stats = await statsWhen(backend, (st) => st.events.disconnected === 1);
  assert.deepEqual(
    { connect: stats.connect, subscribe: stats.subscribe, publish: stats.publish },
    { connect: 2, subscribe: 2, publish: 1 },
  );
  assert.equal(stats.events.connected, 1);
  assert.deepEqual(stats.online, []);
  const metrics = await (await fetch(`http://${s.api}/metrics`)).text();
  assert.match(metrics, /^clarion_webhook_rejected_total 0$/m);
  assert.match(metrics, /^clarion_webhook_retries_total 0$/m);
});

test('a server with the wrong secret is not trusted: 503', async () => {
  const backend = await startBackend();
  const s = await startServer(hookArgs(backend, 'wrong'));
  await assert.rejects(open(`ws://${s.clients}/ws`, { Cookie: 'session=s-alice' }), (e) => e.status === 503);
});

test('webhook events arrive signed, batched, with ids', async () => {
  const batches = [];
  const receiver = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const fields = Object.fromEntries(req.headers['clarion-signature'].split(',').map((p) => p.split('=', 2)));
      const want = crypto.createHmac('sha256', SECRET).update(`${fields.t}.`).update(body).digest('hex');
      assert.equal(fields.v1, want);
      batches.push(JSON.parse(body).events);
      res.end();
    });
  });
  await new Promise((r) => receiver.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${receiver.address().port}/events`;
  const s = await startServer(['--webhook-url', url, '--hook-secret', SECRET]);
  const ws = await open(`ws://${s.clients}/ws?topic=room`);
  ws.close();
  const deadline = Date.now() + 5000;
  let events = [];
  while (Date.now() < deadline) {
    events = batches.flat();
    if (events.some((e) => e.type === 'topic_vacated')) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.deepEqual(events.map((e) => e.type), ['connected', 'topic_occupied', 'disconnected', 'topic_vacated']);
  assert.equal(new Set(events.map((e) => e.id)).size, 4);
  receiver.close();
});
