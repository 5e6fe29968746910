// The subscriber client (node/client, `@clarion/client`) in Node with the `ws` constructor:
// against a fake server that misbehaves (garbage, unknown control messages, oversized frames,
// unknown close codes, an app callback that throws), and against real Clarion nodes sharing a
// private redis-server while a publisher keeps publishing: a TCP cut through a relay, kill -9 and
// restart, a token that expires and is refreshed, a move to a second node. Every message must
// arrive once, in order. And `close()` leaves nothing behind: a Node process exits.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const WebSocket = require('ws');
const { waitFor } = require('./helpers');
const { relay: startRelay, SECRET, clientModule, killAll, startRedis, Node, token, publisher, verify } = require('./client_util');

after(killAll);

const load = () => import(clientModule);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Fast backoff for tests (the defaults are tuned for 100,000 clients, not for a test's clock).
const FAST = { initialDelayMs: 50, maxDelayMs: 400, restartDelayMs: 300, stableMs: 2000 };

// A fake server: `behave(socket, request)` decides what each connection gets.
function fakeServer(behave) {
  const wss = new WebSocket.Server({ port: 0, host: '127.0.0.1', handleProtocols: () => 'clarion.v1' });
  wss.on('connection', behave);
  return new Promise((resolve) => wss.on('listening', () => resolve({ wss, url: `ws://127.0.0.1:${wss.address().port}/ws` })));
}

// Runs a client against a fake server until it has reconnected `n` times; returns its errors and
// the delays it chose.
async function misbehave(behave, n = 3) {
  const { ClarionClient } = await load();
  const { wss, url } = await fakeServer(behave);
  const client = new ClarionClient(url, { WebSocket, ...FAST });
  const errors = [];
  const delays = [];
  let connects = 0;
  client.on('error', (e) => errors.push(e));
  client.on('reconnecting', (e) => delays.push(e.delay));
  client.on('connected', () => connects++);
  client.subscribe('t', { onMessage: () => {} });
  try {
    await waitFor(() => connects >= n && delays.length >= n, 15000, `${n} reconnects`);
  } finally {
    client.close();
    wss.close();
  }
  return { errors, delays, state: client.state };
}

test('bad input: garbage from the server is an error event, then a reconnect with backoff', async () => {
  const r = await misbehave((ws) => ws.send('this is not json'));
  assert.ok(r.errors.length >= 3 && r.errors.every((e) => e.kind === 'protocol'), JSON.stringify(r.errors.map((e) => e.message)));
  // Full jitter stays under the growing cap; the cap grows because no connection was stable.
  assert.ok(r.delays.every((d, i) => d >= 0 && d <= Math.min(400, 50 * 2 ** i)), `delays ${r.delays}`);
  assert.equal(r.state, 'closed');
});

test('a server that cannot be reached is a connect failure, in the words the Python Subscriber uses', async () => {
  const { ClarionClient } = await load();
  // A port nothing listens on: taken, then let go.
  const { wss, url } = await fakeServer(() => {});
  await new Promise((r) => wss.close(r));
  const client = new ClarionClient(url, { WebSocket, ...FAST });
  const lost = [];
  const errors = [];
  client.on('disconnected', (d) => lost.push(d));
  client.on('error', (e) => errors.push(e.kind));
  client.subscribe('t', { onMessage: () => {} });
  try {
    await waitFor(() => lost.length >= 2, 10000, 'two failed connects');
  } finally {
    client.close();
  }
  // Not {reason: 'closed', code: 1006}: no close came from a server.
  assert.deepEqual(lost[0], { reason: 'connect', code: 0, closeReason: '' });
  assert.ok(errors.includes('connect'), JSON.stringify(errors));
});

test('bad input: an unknown control message, a binary frame, an oversized frame', async () => {
  for (const [what, behave, kind] of [
    ['unknown type', (ws) => ws.send('{"type":"surprise","topic":"t"}'), 'protocol'],
    ['binary', (ws) => ws.send(Buffer.from([1, 2, 3])), 'protocol'],
    ['oversized', (ws) => ws.send(JSON.stringify({ type: 'message', topic: 't', id: 'a-1', data: 'x'.repeat(3 << 20) })), 'protocol'],
    ['no type', (ws) => ws.send('[1,2]'), 'protocol'],
  ]) {
    const r = await misbehave(behave, 2);
    assert.ok(r.errors.length >= 2 && r.errors.every((e) => e.kind === kind), `${what}: ${r.errors.map((e) => e.message)}`);
  }
});

test('bad input: a close with an unknown code is an error event and a reconnect', async () => {
  const r = await misbehave((ws) => ws.close(4999, 'who knows'), 2);
  assert.ok(r.errors.some((e) => e.kind === 'close' && /4999/.test(e.message)), r.errors.map((e) => e.message).join());
});

test('a listener that throws becomes an error event; the client keeps delivering', async () => {
  const { ClarionClient } = await load();
  let n = 0;
  const { wss, url } = await fakeServer((ws) => {
    ws.on('message', (raw) => {
      const m = JSON.parse(raw);
      if (m.type !== 'subscribe') return;
      ws.send(JSON.stringify({ type: 'subscribed', topic: 't' }));
      for (let i = 1; i <= 3; i++) ws.send(JSON.stringify({ type: 'message', topic: 't', id: `e-${i}`, data: `m${i}` }));
    });
  });
  const client = new ClarionClient(url, { WebSocket, ...FAST });
  const errors = [];
  client.on('error', (e) => {
    errors.push(e);
    throw new Error('and the error listener throws too');
  });
  client.subscribe('t', {
    onMessage: () => {
      n++;
      throw new Error('app bug');
    },
  });
  try {
    await waitFor(() => n === 3, 5000, 'three deliveries');
    assert.equal(errors.length, 3);
    assert.ok(errors.every((e) => e.kind === 'callback' && e.cause.message === 'app bug'));
    assert.equal(client.state, 'connected');
  } finally {
    client.close();
    wss.close();
  }
});

test('after 1012 (a restart: upgrade or reload) the first reconnect comes within reloadDelayMs; after 1001 within restartDelayMs', async () => {
  const { ClarionClient, DEFAULTS } = await load();
  assert.equal(DEFAULTS.reloadDelayMs, 1000);
  // The first wait after each close code, with the longest draw the jitter can make.
  async function firstDelay(code, options = {}) {
    const { wss, url } = await fakeServer((ws) => ws.close(code, 'bye'));
    const client = new ClarionClient(url, { WebSocket, random: () => 0.999, ...options });
    const closes = [];
    let delay = null;
    client.on('disconnected', (d) => closes.push(d.code));
    client.on('reconnecting', (e) => {
      if (delay === null) delay = e.delay;
    });
    client.subscribe('t');
    await waitFor(() => delay !== null, 5000, 'a reconnect');
    client.close();
    wss.close();
    assert.equal(closes[0], code);
    return delay;
  }
  assert.equal(await firstDelay(1012), 999);
  assert.equal(await firstDelay(1001), 9990);
  assert.equal(await firstDelay(1013), 9990);
  assert.equal(await firstDelay(1012, { reloadDelayMs: 300 }), 300);
});

test('close() clears every timer: a Node process using the client exits', () => {
  // Connects to a port nobody listens on (so a reconnect timer is pending), then closes.
  const script = `
    import WebSocket from ${JSON.stringify(require.resolve('ws'))};
    import { ClarionClient } from ${JSON.stringify(clientModule)};
    const c = new ClarionClient('ws://127.0.0.1:9/ws', { WebSocket, initialDelayMs: 60000, maxDelayMs: 60000, connectTimeoutMs: 60000 });
    c.subscribe('t');
    c.on('reconnecting', () => { c.close(); console.log('closed while reconnecting'); });
  `;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { timeout: 10000, encoding: 'utf8' });
  assert.equal(r.error, undefined, 'the process did not exit by itself');
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /closed while reconnecting/);
});

test('a 403 for one topic fails that subscription only', async () => {
  const { ClarionClient } = await load();
  const node = await new Node(['--auth-secret', SECRET, '--api-key', SECRET]).start();
  try {
    const client = new ClarionClient(`ws://${node.clients}/ws`, { WebSocket, ...FAST, getToken: () => token(60, ['allowed']) });
    const got = [];
    const refused = [];
    const ok = client.subscribe('allowed', { onMessage: (m) => got.push(m.data) });
    const no = client.subscribe('secret', { onError: (e) => refused.push(e) });
    await waitFor(() => ok.state === 'subscribed' && refused.length === 1, 5000, 'subscribe answers');
    assert.equal(no.state, 'failed');
    assert.equal(refused[0].kind, 'subscription');
    await fetch(`http://${node.api}/publish/allowed`, { method: 'POST', body: 'hi', headers: { Authorization: `Bearer ${SECRET}` } });
    await waitFor(() => got.length === 1, 5000, 'the allowed topic to deliver');
    assert.equal(client.state, 'connected');
    client.close();
  } finally {
    await node.kill9();
  }
});

test('Node client on a Redis cluster: cut, kill -9 and restart, token refresh, move to the second node; nothing lost', async () => {
  const { ClarionClient } = await load();
  const redis = await startRedis();
  const args = ['--broker', redis.url, '--auth-secret', SECRET, '--api-key', SECRET, '--auth-expiry-warning', '2', '--auth-anonymous', 'false'];
  const a = await new Node([...args, '--node-name', 'a']).start();
  const b = await new Node([...args, '--node-name', 'b']).start();
  const relay = await startRelay(() => a.clients);
  let tokens = 0;
  const client = new ClarionClient([`ws://${relay.address}/ws`, `ws://${b.clients}/ws`], {
    WebSocket,
    ...FAST,
    // Tokens live 4 s and the warning comes 2 s before: several refreshes during the test.
    getToken: async () => {
      tokens++;
      return token(4);
    },
  });
  const got = [];
  const gaps = [];
  const closes = [];
  const on = [];
  client.on('disconnected', (d) => closes.push(d));
  client.on('connected', (c) => on.push(c.url));
  client.on('gap', (g) => gaps.push(g));
  if (process.env.DEBUG_CLIENT) client.on('state', (s) => console.log(Date.now() % 100000, JSON.stringify(s)));
  const sub = client.subscribe('feed', { onMessage: (m) => got.push(m) });
  await waitFor(() => sub.state === 'subscribed', 5000, 'subscribed');
  const pub = publisher(() => [b.api, a.api], 'feed');
  const reconnected = (n, what) => waitFor(() => on.length >= n && client.state === 'connected', 10000, what);
  try {
    await waitFor(() => got.length >= 20, 5000, 'first messages');
    relay.cut(); // (b) the TCP connection is cut: back through the relay
    await reconnected(2, 'reconnect after the cut');
    assert.equal(on[1], `ws://${relay.address}/ws`);
    await sleep(4500); // (c) the 4-second token is warned about and refreshed at least once
    await a.stop(); // (d) the first node is stopped: the client moves to the second
    await reconnected(3, 'the move to node b');
    assert.equal(on[on.length - 1], `ws://${b.clients}/ws`);
    await a.start();
    await sleep(500);
    await b.kill9(); // (a) kill -9 of the node the client is on; it goes back to a, b restarts
    const n = on.length;
    await b.start();
    await reconnected(n + 1, 'reconnect after kill -9');
    await sleep(500);
  } finally {
    await pub.stop();
  }
  await waitFor(() => got.length && got[got.length - 1].id === pub.ids[pub.ids.length - 1], 10000, 'the last message');
  client.close();
  relay.close();
  await a.kill9();
  await b.kill9();
  redis.child.kill('SIGKILL');
  verify(pub.ids, got, gaps);
  assert.ok(got.length >= 100, `only ${got.length} messages`);
  assert.ok(tokens >= 3, `getToken called ${tokens} times: the token was not refreshed`);
  assert.ok(!closes.some((c) => c.code === 4001), `a connection ended with 4001: ${JSON.stringify(closes)}`);
  assert.ok(closes.length >= 3, JSON.stringify(closes));
  assert.ok(pub.errors < 50, `${pub.errors} publish errors`);
});

test('without a refresh the server closes with 4001 and the client reconnects with a fresh token, resuming', async () => {
  const { ClarionClient } = await load();
  const node = await new Node(['--auth-secret', SECRET, '--api-key', SECRET, '--auth-expiry-warning', '1']).start();
  let tokens = 0;
  // The getToken answer to the warning is late (2.5 s): the token expires first, the server
  // closes with 4001, and the client starts again with a fresh token.
  const client = new ClarionClient(`ws://${node.clients}/ws`, {
    WebSocket,
    ...FAST,
    getToken: async () => {
      tokens++;
      if (tokens === 2) await sleep(2500);
      return token(2);
    },
  });
  const got = [];
  const gaps = [];
  const closes = [];
  client.on('disconnected', (d) => closes.push(d.code));
  client.on('gap', (g) => gaps.push(g));
  const sub = client.subscribe('feed', { onMessage: (m) => got.push(m) });
  await waitFor(() => sub.state === 'subscribed', 5000, 'subscribed');
  const pub = publisher(() => [node.api], 'feed');
  await waitFor(() => closes.includes(4001), 8000, 'a 4001 close');
  await waitFor(() => client.state === 'connected', 5000, 'reconnect');
  await sleep(300);
  await pub.stop();
  await waitFor(() => got.length && got[got.length - 1].id === pub.ids[pub.ids.length - 1], 10000, 'the last message');
  client.close();
  await node.kill9();
  verify(pub.ids, got, gaps);
});

test('SSE transport (fetch streaming): a cut and a restart on a Redis cluster lose nothing', async () => {
  const { ClarionClient } = await load();
  const redis = await startRedis();
  const args = ['--broker', redis.url, '--api-key', SECRET];
  const a = await new Node(args).start();
  const relay = await startRelay(() => a.clients);
  const client = new ClarionClient(`ws://${relay.address}/sse`, { transport: 'sse', ...FAST });
  const got = [];
  const gaps = [];
  client.on('gap', (g) => gaps.push(g));
  const sub = client.subscribe('feed', { onMessage: (m) => got.push(m) });
  await waitFor(() => sub.state === 'subscribed', 5000, 'subscribed');
  const pub = publisher(() => [a.api], 'feed');
  try {
    await waitFor(() => got.length >= 10, 5000, 'first messages');
    relay.cut();
    await waitFor(() => got.length >= 30, 5000, 'messages after the cut');
    await a.kill9();
    await a.start();
    await waitFor(() => got.length >= 60, 10000, 'messages after the restart');
  } finally {
    await pub.stop();
  }
  await waitFor(() => got.length && got[got.length - 1].id === pub.ids[pub.ids.length - 1], 10000, 'the last message');
  client.close();
  relay.close();
  await a.kill9();
  redis.child.kill('SIGKILL');
  verify(pub.ids, got, gaps);
});

test('a gap the server reports reaches the app as a gap event (memory mode, server restarted)', async () => {
  const { ClarionClient } = await load();
  const node = await new Node([]).start();
  const client = new ClarionClient(`ws://${node.clients}/ws`, { WebSocket, ...FAST });
  const gaps = [];
  const got = [];
  const sub = client.subscribe('feed', { onMessage: (m) => got.push(m), onGap: (g) => gaps.push(g) });
  await waitFor(() => sub.state === 'subscribed', 5000, 'subscribed');
  const first = await (await fetch(`http://${node.api}/publish/feed`, { method: 'POST', body: 'before' })).json();
  await waitFor(() => got.length === 1, 5000, 'first message');
  await node.kill9();
  await node.start(); // a new epoch: the id the client holds means nothing to this run
  await waitFor(() => gaps.length === 1, 10000, 'the gap event');
  assert.deepEqual(gaps[0], { topic: 'feed', since: first.id, reason: 'epoch' });
  client.close();
  await node.kill9();
});

test('a filter option goes with every subscribe, and a refused filter fails that subscription', async () => {
  const { ClarionClient } = await load();
  const seen = [];
  const { wss, url } = await fakeServer((ws) => {
    ws.on('message', (raw) => {
      const m = JSON.parse(raw);
      seen.push(m);
      if (m.topic === 'bad') ws.send(JSON.stringify({ type: 'error', topic: 'bad', error: 'invalid filter: at byte 7: expected a value' }));
      else ws.send(JSON.stringify({ type: 'subscribed', topic: m.topic }));
    });
  });
  const client = new ClarionClient(url, { WebSocket, ...FAST });
  const errors = [];
  try {
    client.subscribe('fx', { filter: { in: ['pair', ['EURUSD']] } });
    client.subscribe('bad', { filter: 'pair ==', onError: (e) => errors.push(e) });
    await waitFor(() => seen.length >= 2 && errors.length >= 1, 5000, 'both subscribes answered');
    assert.deepEqual(seen.find((m) => m.topic === 'fx').filter, { in: ['pair', ['EURUSD']] });
    assert.equal(seen.find((m) => m.topic === 'bad').filter, 'pair ==');
    assert.equal(client.subs.get('bad'), undefined, 'a refused subscription is dropped');
    assert.equal(errors[0].kind, 'subscription');
    assert.equal(client.state, 'connected', 'the other subscription goes on');
  } finally {
    client.close();
    wss.close();
  }
});
