// What apps build on, in headless Chromium with the subscriber client as shipped:
// - "read the state, then follow it" (docs/history.md, "The latest value"): the page fetches
//   `GET /topics/{t}/latest` from the client listener, and subscribes with `since: 'latest'` over
//   the WebSocket and over SSE. Each subscription starts with the topic's last message (published
//   before the page subscribed, with its id), then gets every later one once, in order, while a
//   publisher keeps publishing;
// - appendable messages (docs/protocol.md, "Appendable messages"): the page subscribes from before
//   a stream that already has fragments, over both transports; `onAppend` gives it the text so far
//   in one item, then each later fragment, and the close.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const fs = require('node:fs');
const path = require('node:path');
const { waitFor } = require('./helpers');
const { SECRET, clientModule, killAll, Node, publisher, verify } = require('./client_util');

after(killAll);

const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';

const PAGE = `<!doctype html><meta charset="utf-8"><title>clarion latest</title>
<script type="module">
  import { ClarionClient } from './client.js';
  const base = new URLSearchParams(location.search).get('server');
  window.got = { websocket: [], sse: [] }; window.gaps = []; window.errors = [];
  window.state = null;
  window.start = async () => {
    const r = await fetch('http://' + base + '/topics/feed/latest');
    window.state = { status: r.status, body: await r.json() };
    for (const transport of ['websocket', 'sse']) {
      const client = new ClarionClient('ws://' + base + '/ws', { transport, initialDelayMs: 50 });
      client.on('gap', (g) => window.gaps.push(g));
      client.on('error', (e) => window.errors.push(transport + ': ' + e.kind + ': ' + e.message));
      client.subscribe('feed', { since: 'latest', onMessage: (m) => window.got[transport].push({ id: m.id, data: m.data }) });
    }
  };
  window.appends = { websocket: [], sse: [] };
  window.follow = (since) => {
    for (const transport of ['websocket', 'sse']) {
      const client = new ClarionClient('ws://' + base + '/ws', { transport, initialDelayMs: 50 });
      client.on('error', (e) => window.errors.push(transport + ': ' + e.kind + ': ' + e.message));
      client.subscribe('answer', { since, onAppend: (a) => window.appends[transport].push({ text: a.text, seq: a.seq, done: a.done }) });
    }
  };
</script>`;

function pageServer() {
  const server = http.createServer((req, res) => {
    if (req.url.startsWith('/client.js') || req.url.startsWith('/delta.js')) {
      const file = req.url.startsWith('/client.js') ? clientModule : path.join(path.dirname(clientModule), 'delta.js');
      res.writeHead(200, { 'Content-Type': 'text/javascript' });
      res.end(fs.readFileSync(file));
    } else {
      res.writeHead(200, { 'Content-Type': 'text/html' });
      res.end(PAGE);
    }
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, origin: `http://127.0.0.1:${server.address().port}` })));
}

async function publish(api, n, topic = 'feed', query = '') {
  const res = await fetch(`http://${api}/publish/${topic}${query}`, { method: 'POST', body: String(n), headers: { Authorization: `Bearer ${SECRET}` } });
  assert.equal(res.status, 200);
  return res.json();
}

async function launch() {
  const { chromium } = require('playwright-core');
  return chromium.launch({ executablePath: chromiumPath, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
}

test('browser: the latest value, then every later message once, over the WebSocket and SSE', async () => {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const node = await new Node(['--api-key', SECRET]).start();
  const { server, origin } = await pageServer();
  const browser = await launch();
  let pub;
  try {
    // The state before the page comes: messages 0..9, then nothing until it has subscribed.
    const before = [];
    for (let n = 0; n < 10; n++) before.push((await publish(node.api, n)).id);
    const page = await browser.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    await page.goto(`${origin}/?server=${node.clients}`);
    const read = (expr) => page.evaluate(expr);
    await read('window.start()');
    const state = await read('window.state');
    assert.deepEqual(state, { status: 200, body: { type: 'message', topic: 'feed', id: before[9], data: '9' } });
    // Both subscriptions start with message 9, which was published before they subscribed.
    await waitFor(async () => (await read('window.got.websocket.length')) >= 1 && (await read('window.got.sse.length')) >= 1, 10000, 'the latest value on both transports');
    for (const t of ['websocket', 'sse']) assert.deepEqual((await read(`window.got.${t}`))[0], { id: before[9], data: '9' }, t);
    // Then a publisher runs flat out (its messages count on from 0 under their own ids).
    pub = publisher(() => [node.api], 'feed', 5);
    await waitFor(async () => pub.ids.length >= 100, 20000, '100 more publishes');
    await pub.stop();
    const last = pub.ids[pub.ids.length - 1];
    for (const t of ['websocket', 'sse']) {
      await waitFor(async () => (await read(`window.got.${t}.length && window.got.${t}[window.got.${t}.length - 1].id`)) === last, 10000, `the last message over ${t}`);
      const got = (await read(`window.got.${t}`)).slice(1);
      assert.equal(verify(pub.ids, got, []), `${pub.ids.length} messages in order`, t);
    }
    assert.deepEqual(await read('window.gaps'), []);
    assert.deepEqual(await read('window.errors'), []);
    assert.deepEqual(pageErrors, []);
  } finally {
    if (pub) await pub.stop();
    await browser.close();
    server.close();
    await node.kill9();
  }
});

test('browser: an appendable message joined mid-stream gives the text so far, then each fragment, over the WebSocket and SSE', async () => {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const node = await new Node(['--api-key', SECRET]).start();
  const { server, origin } = await pageServer();
  const browser = await launch();
  try {
    const mark = (await publish(node.api, 'before', 'answer')).id;
    const { stream } = await publish(node.api, 'The', 'answer', '?stream=open');
    for (const w of [' answer', ' is']) await publish(node.api, w, 'answer', `?append_to=${stream}`);
    const page = await browser.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    await page.goto(`${origin}/?server=${node.clients}`);
    const read = (expr) => page.evaluate(expr);
    await read(`window.follow(${JSON.stringify(mark)})`);
    const first = { text: 'The answer is', seq: 3, done: false };
    await waitFor(async () => (await read('window.appends.websocket.length')) >= 1 && (await read('window.appends.sse.length')) >= 1, 10000, 'the text so far on both transports');
    await publish(node.api, ' 42', 'answer', `?append_to=${stream}`);
    await publish(node.api, '.', 'answer', `?append_to=${stream}&done=1`);
    for (const t of ['websocket', 'sse']) {
      await waitFor(async () => (await read(`window.appends.${t}.length`)) >= 3, 10000, `the rest over ${t}`);
      assert.deepEqual(await read(`window.appends.${t}`), [
        first,
        { text: 'The answer is 42', seq: 4, done: false },
        { text: 'The answer is 42.', seq: 5, done: true },
      ], t);
    }
    assert.deepEqual(await read('window.errors'), []);
    assert.deepEqual(pageErrors, []);
  } finally {
    await browser.close();
    server.close();
    await node.kill9();
  }
});
