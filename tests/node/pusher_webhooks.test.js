// Pusher's webhooks from Clarion (docs/pusher.md, "Webhooks") checked by the official npm
// `pusher` library, unchanged: every request is `pusher.webhook({headers, rawBody}).isValid()`,
// and pusher-js's subscriptions (a public channel, a presence channel) and its leaving make
// `channel_occupied`, `member_added`, `member_removed` and `channel_vacated`.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const Pusher = require('pusher');
const PusherJs = require('pusher-js');
const { startServer, stopAll, waitFor, PUSHER_APP, pusherArgs } = require('./helpers');

const APP = PUSHER_APP;
const closers = [];
after(() => {
  closers.forEach((c) => c());
  stopAll();
});

// A webhook receiver checking each request with the library's `webhook().isValid()`.
function receiver(lib) {
  const got = { events: [], invalid: 0 };
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (d) => chunks.push(d));
    req.on('end', () => {
      const hook = lib.webhook({ headers: req.headers, rawBody: Buffer.concat(chunks).toString() });
      if (hook.isValid()) got.events.push(...hook.getEvents());
      else got.invalid++;
      res.writeHead(200).end();
    });
  });
  closers.push(() => server.close());
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => {
    got.url = `http://127.0.0.1:${server.address().port}/pusher/webhooks`;
    resolve(got);
  }));
}

test('webhooks in Pusher format pass the npm pusher library\'s isValid()', async () => {
  const lib = new Pusher({ ...APP, host: '127.0.0.1', port: '1', useTLS: false });
  const other = new Pusher({ ...APP, secret: 'not-the-secret', host: '127.0.0.1', port: '1', useTLS: false });
  const got = await receiver(lib);
  const { clients } = await startServer([
    ...pusherArgs(),
    '--pusher-webhook-url', got.url, '--webhook-batch-ms', '20',
  ]);
  const i = clients.lastIndexOf(':');
  const c = new PusherJs(APP.key, {
    cluster: 'mt1', wsHost: clients.slice(0, i), wsPort: Number(clients.slice(i + 1)), forceTLS: false,
    enabledTransports: ['ws'], disableStats: true,
    channelAuthorization: {
      customHandler: ({ socketId, channelName }, cb) => cb(null, lib.authorizeChannel(socketId, channelName, { user_id: 'ada' })),
    },
  });
  closers.push(() => c.disconnect());
  for (const name of ['orders', 'presence-room']) {
    const ch = c.subscribe(name);
    await new Promise((resolve) => ch.bind('pusher:subscription_succeeded', resolve));
  }
  const names = () => got.events.map((e) => `${e.name} ${e.channel}${e.user_id ? ` ${e.user_id}` : ''}`).sort();
  await waitFor(() => got.events.length === 3, 5000, 'occupied twice and ada added');
  c.disconnect();
  await waitFor(() => got.events.length === 6, 5000, 'vacated twice and ada removed');
  assert.deepEqual(names(), [
    'channel_occupied orders', 'channel_occupied presence-room',
    'channel_vacated orders', 'channel_vacated presence-room',
    'member_added presence-room ada', 'member_removed presence-room ada',
  ]);
  assert.equal(got.invalid, 0);
  // Not vacuous: a body signed with the secret is valid, and under another secret it is not.
  const rawBody = JSON.stringify({ time_ms: Date.now(), events: [] });
  const headers = {
    'content-type': 'application/json', 'x-pusher-key': APP.key,
    'x-pusher-signature': require('node:crypto').createHmac('sha256', APP.secret).update(rawBody).digest('hex'),
  };
  assert.equal(lib.webhook({ headers, rawBody }).isValid(), true);
  assert.equal(other.webhook({ headers, rawBody }).isValid(), false);
});
