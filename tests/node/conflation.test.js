// The rule of docs/conflation.md in the project's Node client, without a server: a `conflated`
// notice is understood (not a protocol error), the message right after it is delivered but does
// not move the subscription's resume id, and the next message does.
'use strict';
const { test } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');

const clientModule = path.resolve(__dirname, '..', '..', 'node', 'client', 'index.js');

test('a message after a conflated notice is delivered without moving the resume id', async () => {
  const { ClarionClient, Subscription } = await import(clientModule);
  const client = new ClarionClient('ws://127.0.0.1:9/ws', { transport: 'sse' });
  const sub = new Subscription(client, 'px', 'e-10', false);
  client.subs.set('px', sub);
  const failures = [];
  const conn = { fail: (...why) => failures.push(why) };
  const got = [];
  sub.on('message', (m) => got.push(m.data));
  const ids = [];
  for (const m of [
    { type: 'conflated', topic: 'px', skipped: 3 },
    { type: 'message', topic: 'px', id: 'e-40', data: 'a latest' },
    { type: 'message', topic: 'px', id: 'e-12', data: 'b' },
  ]) {
    client._onFrame(conn, JSON.stringify(m));
    ids.push(sub.lastId);
  }
  assert.deepEqual(failures, []);
  assert.deepEqual(got, ['a latest', 'b']);
  assert.deepEqual(ids, ['e-10', 'e-10', 'e-12']);
});
