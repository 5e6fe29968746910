// The subscriber client (node/client/index.js, as shipped) in headless Chromium: a page loads it
// with <script type="module"> and follows a topic through two Clarion nodes that share a private
// redis-server, while a publisher keeps publishing. The test (b) cuts the TCP connection through
// a relay it controls, (c) lets the page's 4-second tokens expire (the page's getToken fetches a
// fresh one from the test's server on each `expiring` warning), (d) stops the first node so the
// page moves to the second, and (a) kills that one with kill -9 and starts it again. Every
// message must arrive once, in order, with no gap event.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const fs = require('node:fs');
const path = require('node:path');
const { waitFor } = require('./helpers');
const { relay: startRelay, SECRET, clientModule, killAll, startRedis, Node, token, publisher, verify } = require('./client_util');

after(killAll);

const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const PAGE = `<!doctype html><meta charset="utf-8"><title>clarion client</title>
<script type="module">
  import { ClarionClient } from './client.js';
  const params = new URLSearchParams(location.search);
  window.got = []; window.gaps = []; window.on = []; window.closes = []; window.errors = []; window.tokens = 0;
  const client = new ClarionClient(params.getAll('url'), {
    initialDelayMs: 50, maxDelayMs: 400, restartDelayMs: 300, stableMs: 2000,
    getToken: async () => { window.tokens++; return (await fetch('/token')).text(); },
  });
  client.on('connected', (c) => window.on.push(c.url));
  client.on('disconnected', (d) => window.closes.push(d));
  client.on('error', (e) => window.errors.push(e.kind + ': ' + e.message));
  client.on('gap', (g) => window.gaps.push(g));
  const sub = client.subscribe('feed', { onMessage: (m) => window.got.push({ id: m.id, data: m.data }) });
  window.state = () => client.state;
  window.subState = () => sub.state;
  window.stop = () => client.close();
</script>`;

// Serves the page, the client module exactly as the package ships it, and 4-second tokens.
function pageServer() {
  const server = http.createServer((req, res) => {
    if (req.url.startsWith('/client.js')) {
      res.writeHead(200, { 'Content-Type': 'text/javascript' });
      res.end(fs.readFileSync(clientModule));
    } else if (req.url.startsWith('/delta.js')) {
      // The client's own import, beside it as the package ships it.
      res.writeHead(200, { 'Content-Type': 'text/javascript' });
      res.end(fs.readFileSync(path.join(path.dirname(clientModule), 'delta.js')));
    } else if (req.url === '/token') {
      res.writeHead(200, { 'Content-Type': 'text/plain' });
      res.end(token(4));
    } else {
      res.writeHead(200, { 'Content-Type': 'text/html' });
      res.end(PAGE);
    }
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, origin: `http://127.0.0.1:${server.address().port}` })));
}

test('browser: cut, token expiry with refresh, move to the second node, kill -9 and restart; every message once, in order', async () => {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  const redis = await startRedis();
  const args = ['--broker', redis.url, '--auth-secret', SECRET, '--api-key', SECRET, '--auth-expiry-warning', '2', '--auth-anonymous', 'false'];
  const a = await new Node([...args, '--node-name', 'a']).start();
  const b = await new Node([...args, '--node-name', 'b']).start();
  const relay = await startRelay(() => a.clients);
  const { server, origin } = await pageServer();
  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  let pub;
  try {
    const page = await browser.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    const q = new URLSearchParams([['url', `ws://${relay.address}/ws`], ['url', `ws://${b.clients}/ws`]]);
    await page.goto(`${origin}/?${q}`);
    const read = (expr) => page.evaluate(expr);
    await waitFor(async () => (await read('window.subState && window.subState()')) === 'subscribed', 10000, 'the page to subscribe');
    pub = publisher(() => [b.api, a.api], 'feed');
    const reconnected = (n, what) => waitFor(async () => (await read('window.on.length')) >= n && (await read('window.state()')) === 'connected', 10000, what);

    await waitFor(async () => (await read('window.got.length')) >= 20, 5000, 'first messages');
    relay.cut(); // (b)
    await reconnected(2, 'reconnect after the cut');
    await sleep(4500); // (c): at least one expiring warning answered with a fresh token
    await a.stop(); // (d)
    await reconnected(3, 'the move to node b');
    assert.equal(await read('window.on[window.on.length - 1]'), `ws://${b.clients}/ws`);
    await a.start();
    await sleep(500);
    const n = await read('window.on.length');
    await b.kill9(); // (a)
    await b.start();
    await reconnected(n + 1, 'reconnect after kill -9');
    await sleep(500);
    await pub.stop();
    const last = pub.ids[pub.ids.length - 1];
    await waitFor(async () => (await read('window.got.length && window.got[window.got.length - 1].id')) === last, 10000, 'the last message');
    const got = await read('window.got');
    const gaps = await read('window.gaps');
    const closes = await read('window.closes');
    const tokens = await read('window.tokens');
    await read('window.stop()');
    const summary = verify(pub.ids, got, gaps);
    assert.ok(got.length >= 100, summary);
    assert.ok(tokens >= 4, `getToken called ${tokens} times`);
    assert.ok(!closes.some((c) => c.code === 4001), JSON.stringify(closes));
    assert.deepEqual(pageErrors, []);
  } finally {
    if (pub) await pub.stop();
    await browser.close();
    server.close();
    relay.close();
    await a.kill9();
    await b.kill9();
    redis.child.kill('SIGKILL');
  }
});
