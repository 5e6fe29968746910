// Clarion with the Node `ws` client: subscribe, publish through the API, receive in order.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const WebSocket = require('ws');
const { startServer, publish, stopAll } = require('./helpers');

after(stopAll);

function open(url, protocols) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, protocols);
    const queue = [];
    const waiters = [];
    ws.on('message', (data, isBinary) => {
      const item = isBinary ? Buffer.from(data) : data.toString('utf8');
      const w = waiters.shift();
      if (w) w(item);
      else queue.push(item);
    });
    ws.next = () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((r) => waiters.push(r)));
    ws.once('open', () => resolve(ws));
    ws.once('error', reject);
  });
}

test('text and binary messages arrive in publish order', async () => {
  const { clients, api } = await startServer();
  const a = await open(`ws://${clients}/ws?topic=scores`);
  const b = await open(`ws://${clients}/ws?topic=scores&topic=chat`);
  const sent = [];
  for (let i = 0; i < 100; i++) {
    if (i % 4 === 0) {
      sent.push(Buffer.from([i, 1, 2, 255]));
      assert.equal((await publish(api, 'scores', sent[i], true)).subscribers, 2);
    } else {
      sent.push(`goal ${i} ⚽`);
      assert.equal((await publish(api, 'scores', sent[i])).subscribers, 2);
    }
  }
  for (const ws of [a, b]) {
    for (const expected of sent) {
      assert.deepEqual(await ws.next(), expected);
    }
    ws.close();
  }
});

test('clarion.v1 envelope and in-band subscribe', async () => {
  const { clients, api } = await startServer();
  const ws = await open(`ws://${clients}/ws`, 'clarion.v1');
  assert.equal(ws.protocol, 'clarion.v1');
  ws.send(JSON.stringify({ type: 'subscribe', topic: 'chat' }));
  assert.deepEqual(JSON.parse(await ws.next()), { type: 'subscribed', topic: 'chat' });
  const r = await publish(api, 'chat', 'hi');
  assert.deepEqual(JSON.parse(await ws.next()), { type: 'message', topic: 'chat', id: r.id, data: 'hi' });
  ws.close();
});

test('graceful shutdown sends 1001', async () => {
  const { clients, child } = await startServer();
  const ws = await open(`ws://${clients}/ws?topic=t`);
  const closed = new Promise((resolve) => ws.once('close', (code, reason) => resolve([code, reason.toString()])));
  const exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));
  child.kill('SIGTERM');
  assert.deepEqual(await closed, [1001, 'server shutting down']);
  assert.equal(await exited, 0);
});
