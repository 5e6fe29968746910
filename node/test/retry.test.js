// The publish client sends a publish refused with 503 and Retry-After (a server in an upgrade's
// freeze, a broker away) again, for a bounded time; other refusals are not retried.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import * as clarion from 'clarion';

// A stand-in API: its first `refusals` publishes are answered as a server in a hand-over's
// freeze answers them, then 200 with a receipt.
function upgrading(refusals, retryAfter = '1') {
  const requests = [];
  const keys = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      requests.push(Date.now());
      keys.push(req.headers['idempotency-key']);
      if (requests.length <= refusals) {
        const headers = { 'content-type': 'application/json' };
        if (retryAfter != null) headers['retry-after'] = retryAfter;
        res.writeHead(503, headers);
        res.end(JSON.stringify({ error: 'message not published: an upgrade is in progress' }));
      } else {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ topic: 't', id: 'e-1', subscribers: 0 }));
      }
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, requests, keys, url: `http://127.0.0.1:${server.address().port}` })));
}

test('a publish refused during an upgrade is sent again after Retry-After', async () => {
  const api = await upgrading(2);
  try {
    const receipt = await new clarion.Client({ baseUrl: api.url }).publish('t', 'x');
    assert.equal(receipt.id, 'e-1');
    assert.equal(api.requests.length, 3);
    assert.ok(api.requests[1] - api.requests[0] >= 950);
    assert.ok(api.requests[2] - api.requests[1] >= 950);
    assert.equal(clarion.DEFAULT_RETRY_FOR_MS, 10000);
  } finally {
    api.server.close();
  }
});

test('a retried publish carries the same Idempotency-Key, and each publish its own', async () => {
  const api = await upgrading(1);
  try {
    const c = new clarion.Client({ baseUrl: api.url });
    await c.publish('t', 'x');
    await c.publish('t', 'y', { idempotencyKey: 'order-17' });
    const [first, retry, own] = api.keys;
    assert.ok(first && retry === first, JSON.stringify(api.keys));
    assert.equal(own, 'order-17');
  } finally {
    api.server.close();
  }
});

test('retrying is bounded by retryForMs, and a 503 without Retry-After is not retried', async () => {
  let api = await upgrading(100);
  try {
    const started = Date.now();
    await assert.rejects(new clarion.Client({ baseUrl: api.url, retryForMs: 2500 }).publish('t', 'x'), (e) => e instanceof clarion.Unavailable && /upgrade is in progress/.test(e.message));
    assert.equal(api.requests.length, 3);
    assert.ok(Date.now() - started < 3000);
    await assert.rejects(new clarion.Client({ baseUrl: api.url, retryForMs: 0 }).publish('t', 'x'), clarion.Unavailable);
    assert.equal(api.requests.length, 4);
  } finally {
    api.server.close();
  }
  api = await upgrading(1, null);
  try {
    await assert.rejects(new clarion.Client({ baseUrl: api.url }).publish('t', 'x'), clarion.Unavailable);
    assert.equal(api.requests.length, 1);
  } finally {
    api.server.close();
  }
});
