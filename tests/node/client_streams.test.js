// Appendable messages in the subscriber client (node/client): `subscribe(topic, { onAppend })`
// gives the app the text so far after every fragment; after a cut connection, the resume's one
// folded message brings the text so far and the rest follows, with no fragment doubled or lost.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const WebSocket = require('ws');
const { waitFor } = require('./helpers');
const { relay: startRelay, clientModule, killAll, Node } = require('./client_util');

after(killAll);

const FAST = { initialDelayMs: 50, maxDelayMs: 400, restartDelayMs: 300, stableMs: 2000 };

async function post(node, query, body = '') {
  const r = await fetch(`http://${node.api}/publish/answer?${query}`, { method: 'POST', body, headers: { 'Content-Type': 'text/plain' } });
  assert.equal(r.status, 200);
  return r.json();
}

test('onAppend gives the text so far; after a cut the resume brings it in one item, then the rest', async () => {
  const node = await new Node([]).start();
  const relay = await startRelay(() => node.clients);
  const { ClarionClient } = await import(clientModule);
  const client = new ClarionClient(`ws://${relay.address}/ws`, { WebSocket, ...FAST });
  const got = [];
  try {
    const sub = client.subscribe('answer', { onAppend: (a) => got.push(a) });
    await waitFor(() => sub.state === 'subscribed', 5000, 'subscribed');
    const { stream } = await post(node, 'stream=open', 'To');
    await waitFor(() => got.length === 1, 5000, 'first fragment');
    assert.deepEqual([got[0].text, got[0].seq, got[0].done], ['To', 1, false]);
    relay.cut();
    for (const w of [' be', ' or', ' not']) await post(node, `append_to=${stream}`, w);
    await waitFor(() => got.length === 2, 10000, 'the text so far after the resume');
    assert.deepEqual([got[1].text, got[1].seq], ['To be or not', 4]);
    await post(node, `append_to=${stream}&done=1`, ' to be');
    await waitFor(() => got.length === 3, 5000, 'the last fragment');
    assert.deepEqual([got[2].text, got[2].seq, got[2].done, got[2].stream], ['To be or not to be', 5, true, stream]);
  } finally {
    client.close();
    relay.close();
    node.stop();
  }
});
