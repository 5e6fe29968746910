// Publishing with the package's client to a server started by its test helper, received by a
// real WebSocket client (ws).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { Client } from 'clarion';
import { startServer, useClarionServer, ClarionServer } from 'clarion/testing';

const handle = await useClarionServer();

function subscribe(url, count, options = {}) {
  const ws = new WebSocket(url, options.protocols);
  const frames = [];
  const done = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out with ${frames.length} frames`)), 10_000);
    ws.on('message', (data, isBinary) => {
      frames.push(isBinary ? new Uint8Array(data) : data.toString());
      if (frames.length === count) {
        clearTimeout(timer);
        ws.close();
        resolve(frames);
      }
    });
    ws.on('error', reject);
  });
  const open = new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  });
  return { open, done };
}

test('the helper gives a running server and a client for it', async () => {
  const server = handle.server;
  assert.ok(server instanceof ClarionServer);
  assert.ok(server.running);
  assert.equal(await server.client().healthy(), true);
});

test('publish and publishBatch reach a ws subscriber', async () => {
  const server = handle.server;
  const sub = subscribe(server.wsUrl('node-a', 'node-b'), 5);
  await sub.open;
  const client = new Client({ baseUrl: server.apiUrl });
  const one = await client.publish('node-a', 'hello');
  const two = await client.publish('node-a', new Uint8Array([0, 255]), { event: 'bin' });
  const batch = await client.publishBatch([
    { topic: 'node-b', data: 'second' },
    ['node-a', Buffer.from([1, 2])],
    ['node-b', 'third', 'named'],
  ]);
  assert.deepEqual(await sub.done, ['hello', new Uint8Array([0, 255]), 'second', new Uint8Array([1, 2]), 'third']);
  assert.equal(one.subscribers, 1);
  assert.notEqual(one.id, two.id);
  assert.deepEqual(
    batch.map((r) => r.topic),
    ['node-b', 'node-a', 'node-b'],
  );
});

test('publishBatch carries fragments of appendable messages and answers their receipts', async () => {
  const server = handle.server;
  const sub = subscribe(server.wsUrl('node-ai'), 3);
  await sub.open;
  const client = new Client({ baseUrl: server.apiUrl });
  const [opened, plain] = await client.publishBatch([
    { topic: 'node-ai', data: 'Hel', stream: 'open' },
    ['node-ai', 'a plain one'],
  ]);
  const [closed] = await client.publishBatch([
    { topic: 'node-ai', data: 'lo', append_to: opened.stream, done: true, key: 'node-ai-2' },
  ]);
  assert.deepEqual([opened.stream, opened.seq, opened.done], [opened.id, 1, false]);
  assert.equal(plain.stream, undefined);
  assert.deepEqual([closed.stream, closed.seq, closed.done], [opened.stream, 2, true]);
  const [first, middle, last] = await sub.done;
  assert.deepEqual([JSON.parse(first).data, middle, JSON.parse(last).data], ['Hel', 'a plain one', 'lo']);
  assert.equal(JSON.parse(last).type, 'append');
});

test('a StreamWriter appends fragments, a retried one once, and closes', async () => {
  const server = handle.server;
  const sub = subscribe(server.wsUrl('node-answer'), 4);
  await sub.open;
  const client = new Client({ baseUrl: server.apiUrl });
  const answer = await client.openStream('node-answer', 'The');
  const first = await answer.append(' answer', { idempotencyKey: 'node-answer-2' });
  const again = await answer.append(' answer', { idempotencyKey: 'node-answer-2' });
  assert.deepEqual([again.repeat, again.id, answer.seq], [true, first.id, 2]);
  await answer.append(' is');
  const last = await answer.close('!');
  assert.deepEqual([last.seq, last.done, answer.done], [4, true, true]);
  const frames = (await sub.done).map((f) => JSON.parse(f));
  assert.deepEqual(
    frames.map((m) => [m.stream, m.seq, m.data]),
    [[answer.id, 1, 'The'], [answer.id, 2, ' answer'], [answer.id, 3, ' is'], [answer.id, 4, '!']],
  );
});

test('envelopes under clarion.v1 carry the receipt id', async () => {
  const server = handle.server;
  const sub = subscribe(server.wsUrl('node-env'), 1, { protocols: ['clarion.v1'] });
  await sub.open;
  const r = await server.client().publish('node-env', 'x');
  const [env] = await sub.done;
  assert.deepEqual(JSON.parse(env).id, r.id);
});

test('separate servers get separate ports and stop', async () => {
  const a = await startServer();
  const b = await startServer();
  try {
    assert.notEqual(a.api, b.api);
    assert.equal((await a.client().publish('t', 'x')).subscribers, 0);
  } finally {
    await a.stop();
    await b.stop();
  }
  assert.equal(a.running, false);
  assert.equal(await a.stop(), a.process.exitCode); // twice is harmless
});
