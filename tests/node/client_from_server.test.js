// The quick start as one HTML file: a page on another origin imports the browser client from
// the server itself (GET /client.js on the client listener), subscribes, and receives what the
// API publishes, in headless Chromium. GET / names the transports; /client.js revalidates with
// its ETag.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { startServer, publish, stopAll, waitFor } = require('./helpers');

after(stopAll);

const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';

test('GET / names the transports and GET /client.js is the package module with an ETag', async () => {
  const s = await startServer();
  const index = await fetch(`http://${s.clients}/`);
  assert.equal(index.status, 200);
  const text = await index.text();
  for (const word of ['/ws?topic=', '/sse?topic=', '/stream?topic=', '/poll?topic=', '/client.js', 'API listener']) {
    assert.ok(text.includes(word), `${word} in ${text}`);
  }
  const js = await fetch(`http://${s.clients}/client.js`);
  assert.equal(js.status, 200);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  assert.equal(js.headers.get('access-control-allow-origin'), '*');
  const shipped = fs.readFileSync(path.resolve(__dirname, '..', '..', 'node', 'client', 'index.js'), 'utf8');
  assert.equal(await js.text(), shipped);
  const etag = js.headers.get('etag');
  const again = await fetch(`http://${s.clients}/client.js`, { headers: { 'If-None-Match': etag } });
  assert.equal(again.status, 304);
  const head = await fetch(`http://${s.clients}/client.js`, { method: 'HEAD' });
  assert.equal(head.status, 200);
  assert.equal(Number(head.headers.get('content-length')), Buffer.byteLength(shipped));
  // The module the client imports as './delta.js' is served beside it.
  const delta = await fetch(`http://${s.clients}/delta.js`);
  assert.equal(delta.status, 200);
  assert.match(delta.headers.get('content-type'), /^text\/javascript/);
  assert.equal(await delta.text(), fs.readFileSync(path.resolve(__dirname, '..', '..', 'node', 'client', 'delta.js'), 'utf8'));
  assert.equal((await fetch(`http://${s.clients}/nothing-here`)).status, 404);
});

test('a page on another origin imports the client from the server and receives a publish', async () => {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  const s = await startServer();
  // The whole app: one HTML file, as docs/clients.md shows it.
  const page = `<!doctype html><meta charset="utf-8"><title>one file</title>
<script type="module">
  import { ClarionClient } from 'http://${s.clients}/client.js';
  window.got = [];
  const client = new ClarionClient('ws://${s.clients}/ws');
  const sub = client.subscribe('news', { onMessage: (m) => window.got.push(m.data) });
  window.subState = () => sub.state;
</script>`;
  const origin = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/html' });
    res.end(page);
  });
  await new Promise((r) => origin.listen(0, '127.0.0.1', r));
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking'],
  });
  try {
    const tab = await browser.newPage();
    const errors = [];
    tab.on('pageerror', (e) => errors.push(String(e)));
    await tab.goto(`http://localhost:${origin.address().port}/`);
    await waitFor(async () => (await tab.evaluate('window.subState && window.subState()')) === 'subscribed', 10000, 'the page to subscribe');
    await publish(s.api, 'news', 'hello from the API');
    await waitFor(async () => (await tab.evaluate('window.got.length')) === 1, 5000, 'the message');
    assert.deepEqual(await tab.evaluate('window.got'), ['hello from the API']);
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
    origin.close();
  }
});
