// The README's browser snippet, exactly as printed there, in a real browser (headless Chromium
// through playwright-core): its WebSocket and its EventSource both log a published message.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { startServer, publish, stopAll } = require('./helpers');

test.after(stopAll);

const readme = fs.readFileSync(path.join(__dirname, '..', '..', 'README.md'), 'utf8');

test('the README browser snippet receives over WebSocket and EventSource', async () => {
  const m = /```html\n([\s\S]*?)```/.exec(readme);
  assert.ok(m, 'README has an html snippet');
  assert.ok(m[1].includes('127.0.0.1:8080'), 'the snippet names the default client listener');
  const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}`);
  const { chromium } = require('playwright-core');
  const { clients, api } = await startServer();
  // The snippet as written, pointed at this test's server instead of the default port.
  const page = m[1].replaceAll('127.0.0.1:8080', clients);
  const site = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
    res.end(page);
  });
  await new Promise((r) => site.listen(0, '127.0.0.1', r));
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  try {
    const tab = await browser.newPage();
    const logged = [];
    tab.on('console', (msg) => logged.push(msg.text()));
    await tab.goto(`http://127.0.0.1:${site.address().port}/`);
    // Both subscriptions are open once the server counts them; publish until both logged it
    // (a publish before a subscription lands is not replayed to it), at most 10 s.
    const deadline = Date.now() + 10000;
    while (Date.now() < deadline) {
      await publish(api, 'news', 'hello');
      await new Promise((r) => setTimeout(r, 250));
      if (logged.some((l) => l.startsWith('websocket: hello')) && logged.some((l) => l.startsWith('sse: hello'))) break;
    }
    assert.ok(logged.some((l) => l === 'websocket: hello'), JSON.stringify(logged));
    assert.ok(logged.some((l) => /^sse: hello id \S+-\d+$/.test(l)), JSON.stringify(logged));
  } finally {
    await browser.close();
    site.close();
  }
});
