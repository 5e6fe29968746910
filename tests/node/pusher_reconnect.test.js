// pusher-js (its Node build) reacts to Clarion's close codes as the Pusher protocol says, one
// code of each class, each sent by Clarion for a reason of its own (docs/pusher.md, "Error
// codes"): 4001 (unknown key, 4000-4099) it does not reconnect; 4100 (a slow consumer,
// 4100-4199) it reconnects after a while (pusher-js: a second); 4201 (no pong, 4200-4299) it
// reconnects at once. The client goes through a TCP relay of the test's that counts connection
// attempts and can stop carrying one direction, to make the client look stalled or silent.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const PusherJs = require('pusher-js');
const { startServer, stopAll, waitFor, PUSHER_APP, pusherArgs } = require('./helpers');

const APP = PUSHER_APP;
const closers = [];
after(() => {
  closers.forEach((c) => c());
  stopAll();
});

function start(extra = []) {
  return startServer([
    ...pusherArgs(), ...extra,
  ]);
}

// A relay to `target`: `accepted` holds each client connection's arrival time; `stall()` stops
// reading the server's side of the live connections (the client looks like it stopped reading),
// `mute()` drops what the client sends (it looks silent); `resume()` undoes both.
function relay(target) {
  const i = target.lastIndexOf(':');
  const live = [];
  const accepted = [];
  const server = net.createServer((client) => {
    accepted.push(Date.now());
    const upstream = net.connect(Number(target.slice(i + 1)), target.slice(0, i));
    const c = { client, upstream, muted: false };
    live.push(c);
    for (const s of [client, upstream]) s.on('error', () => { client.destroy(); upstream.destroy(); });
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.end());
    client.on('data', (d) => { if (!c.muted) upstream.write(d); });
    upstream.pipe(client);
  });
  closers.push(() => { live.forEach((c) => { c.client.destroy(); c.upstream.destroy(); }); server.close(); });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    port: server.address().port,
    accepted,
    stall: () => live.forEach((c) => { c.upstream.unpipe(c.client); c.upstream.pause(); }),
    resume: () => live.forEach((c) => { c.upstream.pipe(c.client); c.upstream.resume(); }),
    mute: () => live.forEach((c) => { c.muted = true; }),
  })));
}

function client(port, key = APP.key) {
  const c = new PusherJs(key, {
    cluster: 'mt1', wsHost: '127.0.0.1', wsPort: port, forceTLS: false,
    enabledTransports: ['ws'], disableStats: true,
  });
  const closes = [];
  c.connection.bind('state_change', ({ current }) => {
    if (current !== 'connected') closes.push({ state: current, at: Date.now() });
  });
  c.connection.bind('error', (e) => closes.push({ code: e?.error?.data?.code, at: Date.now() }));
  closers.push(() => c.disconnect());
  return { c, closes };
}

const connected = (c) => waitFor(() => c.connection.state === 'connected', 5000, 'connected');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function metric(api, name) {
  const text = await (await fetch(`http://${api}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
  return line ? Number(line.split(' ').pop()) : 0;
}

test('4001 (unknown key): pusher-js gives up, no second attempt', async () => {
  const { clients } = await start();
  const r = await relay(clients);
  const { c, closes } = client(r.port, 'no-such-key');
  await waitFor(() => closes.some((e) => e.code === 4001), 5000, 'the 4001 error');
  await sleep(2500); // past pusher-js's backoff (1 s): a reconnect would have come by now
  assert.equal(r.accepted.length, 1, 'one connection attempt only');
  assert.notEqual(c.connection.state, 'connected');
});

test('4100 (slow consumer): pusher-js reconnects after a while', async () => {
  const { clients, api } = await start(['--max-backlog', '65536']);
  const r = await relay(clients);
  const { c, closes } = client(r.port);
  await connected(c);
  const ch = c.subscribe('feed');
  await new Promise((resolve) => ch.bind('pusher:subscription_succeeded', resolve));
  r.stall();
  const big = 'x'.repeat(256 * 1024);
  for (let n = 0; n < 200 && (await metric(api, 'clarion_slow_consumers_total')) === 0; n++) {
    await fetch(`http://${api}/publish/feed`, { method: 'POST', body: big });
  }
  assert.ok((await metric(api, 'clarion_slow_consumers_total')) >= 1, 'closed as a slow consumer');
  r.resume();
  await waitFor(() => closes.some((e) => e.code === 4100), 10000, 'the 4100 error');
  const closedAt = closes.find((e) => e.code === 4100).at;
  await waitFor(() => r.accepted.length === 2, 5000, 'the reconnect');
  const waited = r.accepted[1] - closedAt;
  assert.ok(waited >= 900, `reconnected after ${waited} ms, not at once`);
  await connected(c);
});

test('4201 (no pong): pusher-js reconnects at once', async () => {
  const { clients } = await start(['--ping-interval', '1', '--idle-timeout', '2']);
  const r = await relay(clients);
  const { c, closes } = client(r.port);
  await connected(c);
  r.mute();
  await waitFor(() => closes.some((e) => e.code === 4201), 6000, 'the 4201 error');
  const closedAt = closes.find((e) => e.code === 4201).at;
  await waitFor(() => r.accepted.length === 2, 5000, 'the reconnect');
  const waited = r.accepted[1] - closedAt;
  assert.ok(waited < 500, `reconnected after ${waited} ms`);
  await connected(c);
});
