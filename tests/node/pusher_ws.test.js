// The real pusher-js client (its Node build) against Clarion's Pusher protocol on /app/{key},
// with the official `pusher` server library as the backend: connect, a public trigger
// received, a private channel authorized with the library's `authorizeChannel`, client events
// between two clients (not echoed), presence with two clients (members, added, removed), a
// cache channel's last event, and a wrong key refused with 4001 without pusher-js reconnecting
// (docs/pusher.md).
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const Pusher = require('pusher');
const { startServer, stopAll, waitFor, PUSHER_APP, pusherArgs, pusherJsClient } = require('./helpers');

const APP = PUSHER_APP;
const clients = [];

after(() => {
  clients.forEach((c) => c.disconnect());
  stopAll();
});

function start(extra = []) {
  return startServer([
    ...pusherArgs(), ...extra,
  ]);
}

function backend(api) {
  const i = api.lastIndexOf(':');
  return new Pusher({ ...APP, host: api.slice(0, i), port: api.slice(i + 1), useTLS: false });
}

// A pusher-js client on Clarion, its private channels authorized by `lib` in-process (as an
// auth endpoint using `authorizeChannel` would answer).
function client(clientsAddr, lib, key = APP.key, user = null) {
  const c = pusherJsClient(clientsAddr, lib, key, user);
  clients.push(c);
  return c;
}

function connected(c) {
  return new Promise((resolve) => {
    if (c.connection.state === 'connected') resolve();
    else c.connection.bind('connected', resolve);
  });
}

function subscribed(c, name) {
  const ch = c.subscribe(name);
  return new Promise((resolve, reject) => {
    ch.bind('pusher:subscription_succeeded', () => resolve(ch));
    ch.bind('pusher:subscription_error', reject);
  });
}

function next(ch, event) {
  return new Promise((resolve) => ch.bind(event, (data, meta) => resolve(data, meta)));
}

async function subscribers(lib, channel, want) {
  await waitFor(async () => {
    const res = await lib.get({ path: `/channels/${channel}`, params: { info: 'subscription_count' } });
    return (await res.json()).subscription_count === want;
  }, 5000, `${want} subscribers of ${channel}`);
}

test('pusher-js connects, receives a public trigger and a private one it was authorized for', async () => {
  const { clients: addr, api } = await start();
  const lib = backend(api);
  const c = client(addr, lib);
  await connected(c);
  assert.match(c.connection.socket_id, /^\d+\.\d+$/);
  const pub = await subscribed(c, 'orders');
  const priv = await subscribed(c, 'private-orders');
  await subscribers(lib, 'private-orders', 1);
  const got = next(pub, 'order-shipped');
  const gotPrivate = next(priv, 'secret');
  await lib.trigger('orders', 'order-shipped', { id: 7 });
  await lib.trigger('private-orders', 'secret', { n: 1 });
  assert.deepEqual(await got, { id: 7 });
  assert.deepEqual(await gotPrivate, { n: 1 });
});

test('client events reach the other client and not the sender', async () => {
  const { clients: addr, api } = await start(['--pusher-client-messages']);
  const lib = backend(api);
  const [a, b] = [client(addr, lib), client(addr, lib)];
  await Promise.all([connected(a), connected(b)]);
  const [chA, chB] = await Promise.all([subscribed(a, 'private-chat'), subscribed(b, 'private-chat')]);
  await subscribers(lib, 'private-chat', 2);
  let echoed = false;
  chA.bind('client-typing', () => { echoed = true; });
  const got = next(chB, 'client-typing');
  assert.equal(chA.trigger('client-typing', { who: 'a' }), true);
  assert.deepEqual(await got, { who: 'a' });
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(echoed, false);
});

test('presence: two clients see each other, joins and leaves', async () => {
  const { clients: addr, api } = await start();
  const lib = backend(api);
  const a = client(addr, lib, APP.key, { user_id: 'ada', user_info: { name: 'Ada' } });
  const chA = await subscribed(a, 'presence-room');
  assert.equal(chA.members.count, 1);
  assert.deepEqual(chA.members.me, { id: 'ada', info: { name: 'Ada' } });
  const added = new Promise((resolve) => chA.bind('pusher:member_added', resolve));
  const b = client(addr, lib, APP.key, { user_id: 'bob' });
  const chB = await subscribed(b, 'presence-room');
  assert.equal(chB.members.count, 2);
  assert.deepEqual(chB.members.get('ada'), { id: 'ada', info: { name: 'Ada' } });
  assert.equal((await added).id, 'bob');
  assert.equal(chA.members.count, 2);
  const removed = new Promise((resolve) => chA.bind('pusher:member_removed', resolve));
  b.disconnect();
  assert.equal((await removed).id, 'bob');
  assert.equal(chA.members.count, 1);
});

test('a cache channel gives a new subscriber the last event', async () => {
  const { clients: addr, api } = await start();
  const lib = backend(api);
  await lib.trigger('cache-ticker', 'price', { v: 1 });
  await lib.trigger('cache-ticker', 'price', { v: 2 });
  const c = client(addr, lib);
  await connected(c);
  const ch = c.subscribe('cache-ticker');
  assert.deepEqual(await next(ch, 'price'), { v: 2 });
  const d = client(addr, lib);
  await connected(d);
  const miss = next(d.subscribe('cache-empty'), 'pusher:cache_miss');
  await miss;
});

test('a wrong key is refused with 4001 and pusher-js does not reconnect', async () => {
  const { clients: addr, api } = await start();
  const c = client(addr, backend(api), 'not-the-key');
  const error = await new Promise((resolve) => c.connection.bind('error', resolve));
  assert.equal(error.error.data.code, 4001);
  await new Promise((r) => setTimeout(r, 1500));
  assert.notEqual(c.connection.state, 'connected');
  const metrics = await (await fetch(`http://${api}/metrics`)).text();
  assert.match(metrics, /clarion_pusher_ws_total\{outcome="unknown_app"\} 1\n/);
});
