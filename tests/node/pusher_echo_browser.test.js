// Laravel Echo (npm `laravel-echo`, its browser build) over pusher-js (`pusher-with-encryption`)
// in headless Chromium against Clarion's Pusher protocol, as a Laravel app's pages use it: the
// test's backend serves the pages and the auth endpoint (`/broadcasting/auth`, answered with
// the official `pusher` library's `authorizeChannel`) and triggers events with that library.
// Two pages (ada and bob): a public channel with Laravel's default event name, a private
// channel, presence (here / joining / leaving), whispers (client events), and an encrypted
// channel (end-to-end: Clarion relays what it cannot read). docs/pusher.md.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const Pusher = require('pusher');
const { startServer, stopAll, waitFor, PUSHER_APP, pusherArgs } = require('./helpers');

const APP = PUSHER_APP;
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const modules = path.join(__dirname, 'node_modules');
const SCRIPTS = {
  '/pusher.js': path.join(modules, 'pusher-js', 'dist', 'web', 'pusher-with-encryption.js'),
  '/echo.js': path.join(modules, 'laravel-echo', 'dist', 'echo.iife.js'),
};

let browser;
after(async () => {
  if (browser) await browser.close();
  stopAll();
});

const page = (wsPort) => `<!doctype html><meta charset="utf-8"><title>echo</title>
<script src="/pusher.js"></script>
<script src="/echo.js"></script>
<script>
  const user = new URLSearchParams(location.search).get('user');
  window.log = []; window.ready = [];
  window.echo = new Echo.default({
    broadcaster: 'pusher', key: '${APP.key}', cluster: 'mt1',
    wsHost: '127.0.0.1', wsPort: ${wsPort}, forceTLS: false, enabledTransports: ['ws'],
    disableStats: true, authEndpoint: '/broadcasting/auth', auth: { headers: { 'X-User': user } },
  });
  const note = (what) => (e) => window.log.push([what, e]);
  const ready = (what) => () => window.ready.push(what);
  window.listenAll = () => {
    echo.channel('orders').listen('OrderShipped', note('orders')).subscribed(ready('orders'));
    echo.private('orders.' + user).listen('.shipped', note('private')).subscribed(ready('private'));
    echo.encryptedPrivate('vault').listen('.secret', note('encrypted')).subscribed(ready('encrypted'));
  };
  window.joinRoom = () => {
    window.room = echo.join('room')
      // Echo hands over each member's user_info.
      .here((users) => window.log.push(['here', users.map((u) => u.name).sort()]))
      .joining((u) => window.log.push(['joining', u.name]))
      .leaving((u) => window.log.push(['leaving', u.name]))
      .listenForWhisper('typing', note('whisper'));
  };
</script>`;

// The app's backend: pages, scripts, and the auth endpoint signing with the `pusher` library.
function backend(lib, wsPort) {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://x');
    if (SCRIPTS[url.pathname]) {
      res.writeHead(200, { 'Content-Type': 'text/javascript' });
      res.end(fs.readFileSync(SCRIPTS[url.pathname]));
    } else if (url.pathname === '/broadcasting/auth' && req.method === 'POST') {
      let body = '';
      req.on('data', (d) => { body += d; });
      req.on('end', () => {
        const form = new URLSearchParams(body);
        const user = req.headers['x-user'];
        const channel = form.get('channel_name');
        const member = channel.startsWith('presence-') ? { user_id: user, user_info: { name: user } } : undefined;
        const answer = lib.authorizeChannel(form.get('socket_id'), channel, member);
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify(answer));
      });
    } else {
      res.writeHead(200, { 'Content-Type': 'text/html' });
      res.end(page(wsPort));
    }
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, origin: `http://127.0.0.1:${server.address().port}` })));
}

async function logOf(p, what) {
  return (await p.evaluate(() => window.log)).filter(([w]) => w === what).map(([, e]) => e);
}

test('Laravel Echo: public, private, encrypted, presence with two pages, whispers', async () => {
  const { clients, api } = await startServer([
    ...pusherArgs(),
    '--pusher-client-messages',
  ]);
  const i = api.lastIndexOf(':');
  const lib = new Pusher({
    ...APP, host: api.slice(0, i), port: api.slice(i + 1), useTLS: false,
    encryptionMasterKeyBase64: crypto.randomBytes(32).toString('base64'),
  });
  const { server, origin } = await backend(lib, Number(clients.slice(clients.lastIndexOf(':') + 1)));
  after(() => server.close());
  const { chromium } = require('playwright-core');
  browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  const ctx = await browser.newContext();
  const ada = await ctx.newPage();
  const bob = await ctx.newPage();
  const errors = [];
  for (const p of [ada, bob]) p.on('pageerror', (e) => errors.push(String(e)));
  await ada.goto(`${origin}/?user=ada`);
  await bob.goto(`${origin}/?user=bob`);

  await ada.evaluate(() => window.listenAll());
  await waitFor(async () => (await ada.evaluate(() => window.ready.length)) === 3, 10000, 'three subscriptions');
  await lib.trigger('orders', 'App\\Events\\OrderShipped', { id: 7 });
  await lib.trigger('private-orders.ada', 'shipped', { id: 8 });
  await lib.trigger('private-encrypted-vault', 'secret', { code: 'swordfish' });
  await waitFor(async () => (await ada.evaluate(() => window.log.length)) === 3, 5000, 'three events');
  assert.deepEqual(await logOf(ada, 'orders'), [{ id: 7 }]);
  assert.deepEqual(await logOf(ada, 'private'), [{ id: 8 }]);
  assert.deepEqual(await logOf(ada, 'encrypted'), [{ code: 'swordfish' }]);

  await ada.evaluate(() => window.joinRoom());
  await waitFor(async () => (await logOf(ada, 'here')).length === 1, 5000, "ada's member list");
  assert.deepEqual(await logOf(ada, 'here'), [['ada']]);
  await bob.evaluate(() => window.joinRoom());
  await waitFor(async () => (await logOf(bob, 'here')).length === 1, 5000, "bob's member list");
  assert.deepEqual(await logOf(bob, 'here'), [['ada', 'bob']]);
  await waitFor(async () => (await logOf(ada, 'joining')).length === 1, 5000, 'bob joining');
  assert.deepEqual(await logOf(ada, 'joining'), ['bob']);

  await bob.evaluate(() => window.room.whisper('typing', { who: 'bob' }));
  await waitFor(async () => (await logOf(ada, 'whisper')).length === 1, 5000, 'the whisper');
  assert.deepEqual(await logOf(ada, 'whisper'), [{ who: 'bob' }]);
  assert.deepEqual(await logOf(bob, 'whisper'), [], 'not echoed to its sender');

  await bob.close();
  await waitFor(async () => (await logOf(ada, 'leaving')).length === 1, 5000, 'bob leaving');
  assert.deepEqual(await logOf(ada, 'leaving'), ['bob']);
  assert.deepEqual(errors, []);
});
