// The subscriber client's fold rule for appendable messages (docs/protocol.md, "Appendable
// messages"), on frames handed to its own frame handler, no server: fragments build the text,
// a resume's folded message replaces it, repeats are dropped, and a fragment past the next one
// (fragments missing) is never applied: an `error` of kind `stream`, then a resubscription.
// Fast: CI runs it (node --test node/test/unit).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ClarionClient, Subscription } from '../../client/index.js';

// No connection is made: the client only parses the frames it is handed.
class NoSocket {}

function subscriber() {
  const client = new ClarionClient('ws://127.0.0.1:9/ws', { WebSocket: NoSocket });
  const sub = new Subscription(client, 'answer');
  client.subs.set('answer', sub);
  const got = [];
  const errors = [];
  sub.on('append', (a) => got.push([a.text, a.seq, a.done]));
  sub.on('error', (e) => errors.push([e.kind, sub._resyncing]));
  const frame = (m) => client._onFrame(null, JSON.stringify({ topic: 'answer', stream: 's1', ...m }));
  return { sub, got, errors, frame };
}

test('fragments build the text; a folded resume message replaces it; repeats are dropped', () => {
  const { sub, got, errors, frame } = subscriber();
  frame({ type: 'append', id: 'e-1', seq: 1, data: 'To' });
  frame({ type: 'append', id: 'e-2', seq: 2, data: ' be' });
  // A resume's replay: the text so far (3 fragments), then a live repeat of the third.
  frame({ type: 'message', id: 'e-4', seq: 3, data: 'To be or' });
  frame({ type: 'append', id: 'e-4', seq: 3, data: ' or' });
  frame({ type: 'append', id: 'e-5', seq: 4, data: ' not', done: true });
  assert.deepEqual(got, [['To', 1, false], ['To be', 2, false], ['To be or', 3, false], ['To be or not', 4, true]]);
  assert.equal(sub.lastId, 'e-5');
  assert.deepEqual(errors, []);
});

test('a fragment past the next one is not applied: an error of kind stream, and a resubscription', () => {
  const { sub, got, errors, frame } = subscriber();
  frame({ type: 'append', id: 'e-1', seq: 1, data: 'To' });
  frame({ type: 'append', id: 'e-3', seq: 3, data: ' or' });
  assert.deepEqual(got, [['To', 1, false]]);
  assert.deepEqual(errors, [['stream', true]]);
  assert.equal(sub.lastId, 'e-1', 'the resubscription resumes after the last fragment applied');
  assert.equal(sub.deltaFailures, 0, 'not a delta failure');
});
