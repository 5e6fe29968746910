// Headless Chromium over https with HTTP/2 (issue 32): one page opens 20 EventSources to one
// origin and all of them receive a publish within a second; a WebSocket on the same page rides
// the same HTTP/2 connection (RFC 8441), as the server's metrics show. With HTTP/2 off the same
// page gets the browser's six connections per origin, and the other EventSources wait.
// pusher-js on the same page opens its Pusher connection (`/app/{key}`) over that HTTP/2
// connection too, as a Laravel Echo page does when its EventSources are open.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { binary, startServer, publish, stopAll, PUSHER_APP, pusherArgs } = require('./helpers');
const { waitFor } = require('./helpers');

const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-node-h2-'));
after(() => {
  stopAll();
  fs.rmSync(dir, { recursive: true, force: true });
});
execFileSync(binary(), ['cert', '--dev', '--dir', dir]);

const STREAMS = 20;
const PUSHER_JS = path.join(__dirname, 'node_modules', 'pusher-js', 'dist', 'web', 'pusher.js');
const PAGE = `<!doctype html><meta charset="utf-8"><title>h2</title>
<script src="/pusher.js"></script>
<script>
  const origin = new URLSearchParams(location.search).get('origin');
  window.opens = 0; window.got = []; window.wsOpen = false; window.wsGot = [];
  window.openSse = (n) => {
    for (let i = 0; i < n; i++) {
      const es = new EventSource(origin.replace('wss:', 'https:') + '/sse?topic=h2page');
      es.onopen = () => window.opens++;
      es.onmessage = (e) => window.got.push([i, e.data, performance.now()]);
    }
  };
  if (!new URLSearchParams(location.search).has('defer')) window.openSse(${STREAMS});
  window.openWs = () => {
    const ws = new WebSocket(origin + '/ws?topic=h2page');
    ws.onopen = () => { window.wsOpen = true; };
    ws.onmessage = (e) => window.wsGot.push(e.data);
  };
  window.pusherGot = [];
  window.openPusher = () => {
    const port = Number(new URL(origin).port);
    const pusher = new Pusher('${PUSHER_APP.key}', {
      cluster: 'mt1', wsHost: 'localhost', wssPort: port, forceTLS: true,
      enabledTransports: ['ws'], disableStats: true,
    });
    pusher.connection.bind('state_change', (s) => { window.pusherState = s.current; });
    pusher.subscribe('h2page').bind('message', (d) => window.pusherGot.push(d));
    pusher.connection.bind('connected', () => { window.pusherId = pusher.connection.socket_id; });
    window.pusher = pusher;
  };
</script>`;

async function withPage(serverArgs, run, { deferSse = false } = {}) {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  const server = await startServer([
    '--tls-listen', '127.0.0.1:0',
    '--tls-cert', path.join(dir, 'cert.pem'),
    '--tls-key', path.join(dir, 'key.pem'),
    ...serverArgs,
  ]);
  const port = server.tls.slice(server.tls.lastIndexOf(':') + 1);
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: [
      '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--ignore-certificate-errors',
      // The page's origin is answered by interception, which Chromium's local-network checks
      // take for a public page reaching localhost.
      '--disable-features=LocalNetworkAccessChecks',
    ],
  });
  try {
    const page = await browser.newPage();
    // The page comes from the server's own origin (answered by the browser's interception,
    // never by the server), so its EventSources and its WebSocket are same-origin requests
    // with the same credentials mode: Chromium pools them onto one HTTP/2 connection.
    const origin = `https://localhost:${port}`;
    await page.route(`${origin}/page.html**`, (route) =>
      route.fulfill({ status: 200, contentType: 'text/html; charset=utf-8', body: PAGE }));
    await page.route(`${origin}/pusher.js`, (route) =>
      route.fulfill({ status: 200, contentType: 'text/javascript', body: fs.readFileSync(PUSHER_JS) }));
    await page.goto(`${origin}/page.html?origin=wss://localhost:${port}${deferSse ? '&defer' : ''}`);
    await run(page, server);
  } finally {
    await browser.close();
  }
}

async function metric(api, line) {
  const text = await (await fetch(`http://${api}/metrics`)).text();
  const found = text.split('\n').find((l) => l.startsWith(line + ' '));
  return found === undefined ? undefined : Number(found.slice(line.length + 1));
}

test('browser over HTTP/2: 20 EventSources and a WebSocket share one connection', async () => {
  await withPage([], async (page, server) => {
    const read = (expr) => page.evaluate(expr);
    await waitFor(async () => (await read('window.opens')) === STREAMS, 15000, `${STREAMS} EventSources to open`);
    await page.evaluate('window.openWs()');
    await waitFor(async () => read('window.wsOpen'), 10000, 'the WebSocket to open');
    const sent = await read('performance.now()');
    assert.equal((await publish(server.api, 'h2page', 'hello')).subscribers, STREAMS + 1);
    await waitFor(async () => (await read('window.got.length')) === STREAMS, 5000, 'every EventSource to get the message');
    await waitFor(async () => (await read('window.wsGot.length')) === 1, 5000, 'the WebSocket to get the message');
    const got = await read('window.got');
    assert.deepEqual(new Set(got.map((g) => g[0])).size, STREAMS);
    assert.ok(got.every((g) => g[1] === 'hello'));
    const slowest = Math.max(...got.map((g) => g[2])) - sent;
    assert.ok(slowest < 1000, `the last EventSource got it after ${slowest} ms`);
    assert.deepEqual(await read('window.wsGot'), ['hello']);
    // One HTTP/2 connection carries all of it: 20 SSE streams and the WebSocket (RFC 8441).
    // (Chromium may keep a spare connection open besides, idle: it carries nothing.)
    assert.equal(await metric(server.api, 'clarion_protocol_connections{protocol="h2"}'), 1);
    assert.equal(await metric(server.api, 'clarion_h2_streams'), STREAMS + 1);
    assert.equal(await metric(server.api, 'clarion_connections{transport="ws"}'), 1);
    assert.equal(await metric(server.api, 'clarion_connections{transport="sse"}'), STREAMS);
  });
});

test('browser over HTTP/2: pusher-js opens its Pusher connection as a stream of the same connection (RFC 8441)', async () => {
  await withPage(pusherArgs(), async (page, server) => {
    const read = (expr) => page.evaluate(expr);
    await waitFor(async () => (await read('window.opens')) === STREAMS, 15000, `${STREAMS} EventSources to open`);
    await page.evaluate('window.openPusher()');
    await waitFor(async () => (await read('window.pusherId')) !== undefined, 10000, 'pusher-js to connect');
    // Its channel's subscription reaches the topic before the publish.
    await waitFor(async () => (await metric(server.api, 'clarion_subscriptions')) === STREAMS + 1, 5000,
      'the Pusher channel to be subscribed');
    // A message published with Clarion's API reaches Pusher subscribers as event `message`.
    assert.equal((await publish(server.api, 'h2page', '{"n":1}')).subscribers, STREAMS + 1);
    await waitFor(async () => (await read('window.pusherGot.length')) === 1, 5000, 'pusher-js to get the event');
    assert.deepEqual(await read('window.pusherGot'), [{ n: 1 }]);
    assert.equal(await read('window.pusherState'), 'connected');
    assert.equal(await metric(server.api, 'clarion_protocol_connections{protocol="h2"}'), 1);
    assert.equal(await metric(server.api, 'clarion_h2_streams'), STREAMS + 1);
  });
});

test('browser over HTTPS: a WebSocket opened before any other request goes over HTTP/1.1; EventSources after it share an HTTP/2 connection', async () => {
  // What the load generator's mix must match (issue 53): Chromium carries a WebSocket over
  // HTTP/2 (RFC 8441) only on an HTTP/2 connection it already holds to the origin; the first
  // request of a page whose own HTML came from elsewhere (a CDN, here the interception) is the
  // WebSocket, so it gets an HTTP/1.1 connection of its own, and stays on it.
  await withPage([], async (page, server) => {
    const read = (expr) => page.evaluate(expr);
    // The page's EventSources open at load: this test's page waits for its own signal.
    await page.evaluate('window.openWs()');
    await waitFor(async () => read('window.wsOpen'), 10000, 'the WebSocket to open');
    assert.equal(await metric(server.api, 'clarion_protocol_connections{protocol="h2"}'), 0,
      'the first request, a WebSocket, opened no HTTP/2 connection');
    assert.equal(await metric(server.api, 'clarion_h2_streams'), 0);
    // (Chromium may open a spare HTTP/1.1 connection besides, idle: so count the WebSocket.)
    assert.equal(await metric(server.api, 'clarion_connections{transport="ws"}'), 1);
    await page.evaluate(`window.openSse(${STREAMS})`);
    await waitFor(async () => (await read('window.opens')) === STREAMS, 15000, `${STREAMS} EventSources to open`);
    assert.equal(await metric(server.api, 'clarion_protocol_connections{protocol="h2"}'), 1);
    assert.equal(await metric(server.api, 'clarion_h2_streams'), STREAMS,
      'the SSE streams only: the WebSocket stays on its HTTP/1.1 connection');
    assert.equal(await metric(server.api, 'clarion_connections{transport="sse"}'), STREAMS);
    assert.equal(await metric(server.api, 'clarion_connections{transport="ws"}'), 1);
    assert.equal((await publish(server.api, 'h2page', 'both')).subscribers, STREAMS + 1);
    await waitFor(async () => (await read('window.wsGot.length')) === 1, 5000, 'the WebSocket to get the message');
    await waitFor(async () => (await read('window.got.length')) === STREAMS, 5000, 'every EventSource to get it');
  }, { deferSse: true });
});

test('browser over HTTP/1.1 (http2 off): six EventSources per origin, the rest wait', async () => {
  await withPage(['--http2', 'false'], async (page, server) => {
    const read = (expr) => page.evaluate(expr);
    await waitFor(async () => (await read('window.opens')) === 6, 15000, 'six EventSources to open');
    await new Promise((r) => setTimeout(r, 2000));
    assert.equal(await read('window.opens'), 6, 'no seventh connection to the origin');
    assert.equal(await metric(server.api, 'clarion_protocol_connections{protocol="h2"}'), 0);
  });
});
