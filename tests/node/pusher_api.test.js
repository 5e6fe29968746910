// Pusher's HTTP API with the official Node server library (npm `pusher`), unchanged: trigger,
// batch trigger and channel queries; a wrong secret and a stale timestamp refused; and a
// Clarion WebSocket subscriber of the channel's topic receives what the library triggers
// (docs/pusher.md).
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const Pusher = require('pusher');
const { startServer, stopAll, openWs: subscribe, PUSHER_APP, pusherArgs } = require('./helpers');

after(stopAll);

const APP = PUSHER_APP;

async function start() {
  return startServer(pusherArgs());
}

function library(api, secret = APP.secret) {
  const [host, port] = [api.slice(0, api.lastIndexOf(':')), api.slice(api.lastIndexOf(':') + 1)];
  return new Pusher({ ...APP, secret, host, port, useTLS: false });
}

async function subscribers(pusher, channel, want) {
  const deadline = Date.now() + 5000;
  for (;;) {
    const res = await pusher.get({ path: `/channels/${channel}`, params: { info: 'subscription_count' } });
    const body = await res.json();
    if (body.subscription_count === want || Date.now() > deadline) return body;
    await new Promise((r) => setTimeout(r, 50));
  }
}

test('trigger and batch trigger reach a Clarion subscriber of the topic', async () => {
  const { clients, api } = await start();
  const pusher = library(api);
  const ws = await subscribe(`ws://${clients}/ws?topic=orders`);
  assert.deepEqual(await subscribers(pusher, 'orders', 1), { occupied: true, subscription_count: 1 });
  const res = await pusher.trigger('orders', 'order-shipped', { id: 7 });
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), {});
  assert.deepEqual(JSON.parse(await ws.next()), { id: 7 });
  await pusher.trigger(['orders', 'audit'], 'note', 'plain', { socket_id: '123.456' });
  assert.equal(await ws.next(), 'plain');
  const batch = await pusher.triggerBatch([
    { channel: 'orders', name: 'e1', data: { n: 1 } },
    { channel: 'orders', name: 'e2', data: { n: 2 } },
  ]);
  assert.equal(batch.status, 200);
  assert.deepEqual([JSON.parse(await ws.next()), JSON.parse(await ws.next())], [{ n: 1 }, { n: 2 }]);
  const list = await (await pusher.get({ path: '/channels' })).json();
  assert.deepEqual(list, { channels: { orders: {} } });
  const users = await pusher.get({ path: '/channels/presence-room/users' });
  assert.deepEqual(await users.json(), { users: [] });
  ws.close();
});

test('a wrong secret and a stale timestamp are refused with 401', async () => {
  const { api } = await start();
  await assert.rejects(library(api, 'wrong-secret').trigger('a', 'e', 'x'), (e) => {
    assert.equal(e.status, 401);
    assert.match(e.body, /invalid signature/);
    return true;
  });
  const realNow = Date.now;
  Date.now = () => realNow() - 11 * 60 * 1000;
  try {
    await assert.rejects(library(api).trigger('a', 'e', 'x'), (e) => {
      assert.equal(e.status, 401);
      assert.match(e.body, /timestamp expired/);
      return true;
    });
  } finally {
    Date.now = realNow;
  }
  const ok = await library(api).trigger('a', 'e', 'x');
  assert.equal(ok.status, 200);
});
