// The live dashboard in a real browser (headless Chromium through playwright-core): the numbers it
// shows are /metrics' numbers, they move when clients connect and messages flow, its publish
// action reaches a `ws` client, it works behind the API key, and its feeds are bounded and freed
// when a tab closes. Writes a screenshot for people to look at: to $DASHBOARD_SCREENSHOT, else to
// clarion-dashboard.png in the temporary directory (printed); the picture in docs/ is refreshed
// with DASHBOARD_SCREENSHOT=../../docs/dashboard.png node --test dashboard.test.js.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const WebSocket = require('ws');
const { startServer, publish, stopAll, waitFor } = require('./helpers');

after(stopAll);

// Chromium from the Debian package (`apt-get install chromium`); .ci/run installs it.
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
// Not into the source tree by default: a test run should leave the checkout clean.
const screenshot = path.resolve(process.env.DASHBOARD_SCREENSHOT || path.join(os.tmpdir(), 'clarion-dashboard.png'));

async function launch() {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  return chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
}

function openWs(url) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url);
    ws.got = [];
    ws.on('message', (d) => ws.got.push(d.toString('utf8')));
    ws.once('open', () => resolve(ws));
    ws.once('error', reject);
  });
}

// The samples /metrics gives, by full name with labels.
async function metrics(api, headers = {}) {
  const text = await (await fetch(`http://${api}/metrics`, { headers })).text();
  const out = {};
  for (const line of text.split('\n')) {
    const m = /^(\S+) (\S+)$/.exec(line);
    if (m && !line.startsWith('#')) out[m[1]] = Number(m[2]);
  }
  return out;
}

// What the page shows, by its data-k key (the raw numbers behind the formatted text).
const shown = (page) =>
  page.$$eval('[data-k]', (els) => Object.fromEntries(els.map((e) => [e.dataset.k, e.dataset.raw === '' ? null : Number(e.dataset.raw)])));

// The page's figures and /metrics' for the same families.
const PAIRS = [
  ['connections.ws', 'clarion_connections{transport="ws"}'],
  ['connections.sse', 'clarion_connections{transport="sse"}'],
  ['connections.poll', 'clarion_connections{transport="poll"}'],
  ['subscriptions', 'clarion_subscriptions'],
  ['topics', 'clarion_topics'],
  ['published_total', 'clarion_messages_published_total'],
  ['delivered_total', 'clarion_messages_delivered_total'],
  ['history_messages', 'clarion_history_messages'],
  ['history_bytes', 'clarion_history_bytes'],
  ['slow_consumers_total', 'clarion_slow_consumers_total'],
  ['tls_handshakes_total', 'clarion_tls_handshakes_total'],
  ['refused.capacity', 'clarion_connections_refused_total{reason="capacity"}'],
];

// Waits until the page and /metrics agree on every pair (both read once a second apart, so a
// quiet server is needed) and returns what the page shows.
async function agree(page, api, headers) {
  let last = '';
  return waitFor(async () => {
    const [s, m] = [await shown(page), await metrics(api, headers)];
    const diff = PAIRS.filter(([k, name]) => s[k] !== m[name]).map(([k, name]) => `${k}=${s[k]} vs ${m[name]}`);
    last = diff.join(', ');
    return diff.length === 0 ? s : null;
  }, 10000, 'page numbers to match /metrics').catch((e) => {
    throw new Error(`${e.message}: ${last}`);
  });
}

test('dashboard: live numbers match /metrics, move with traffic, publish reaches a ws client', async (t) => {
  const { clients, api } = await startServer();
  const subs = [];
  for (let i = 0; i < 3; i++) subs.push(await openWs(`ws://${clients}/ws?topic=scores`));
  subs.push(await openWs(`ws://${clients}/ws?topic=news&topic=weather`));
  for (let i = 0; i < 3; i++) await publish(api, 'news', `headline ${i}`);
  const sse = await new Promise((resolve) => {
    const req = http.get(`http://${clients}/sse?topic=news`, (res) => resolve({ req, res }));
  });
  const browser = await launch();
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(`http://${api}/dashboard`);
    await page.waitForFunction(() => document.querySelector('#status').textContent === 'live', null, { timeout: 15000 });
    let s = await agree(page, api);
    assert.equal(s['connections.ws'], 4);
    assert.equal(s['connections.sse'], 1);
    assert.equal(s.subscriptions, 6);
    assert.equal(s.topics, 3);
    assert.ok(s.rss_bytes > 0 && s.rss_bytes_per_connection > 0);

    // More clients and a flow of messages: the numbers move, and the rates show it.
    for (let i = 0; i < 2; i++) subs.push(await openWs(`ws://${clients}/ws?topic=scores`));
    const flow = setInterval(() => publish(api, 'scores', 'tick').catch(() => {}), 50);
    try {
      await page.waitForFunction(
        () => Number(document.querySelector('[data-k="delivered_per_s"]').dataset.raw) > 0
          && Number(document.querySelector('[data-k="connections.ws"]').dataset.raw) === 6,
        null, { timeout: 15000 });
      // The busiest topic is the one the flow goes to, with its five subscribers.
      await page.waitForFunction(() => {
        const row = document.querySelector('#topics tbody tr');
        return row && row.cells[0].textContent === 'scores' && row.cells[1].textContent === '5' && Number(row.cells[2].textContent) > 0;
      }, null, { timeout: 15000 });
      // The flow goes on until ten publishes have reached the five subscribers: on a quiet
      // machine the page catches up within two ticks, before that many were made.
      await waitFor(async () => (await metrics(api))['clarion_messages_delivered_total'] >= 5 * 10,
        15000, 'ten publishes delivered');
    } finally {
      clearInterval(flow);
    }
    await new Promise((r) => setTimeout(r, 300));
    s = await agree(page, api);
    assert.equal(s['connections.ws'], 6);
    assert.ok(s.delivered_total >= 5 * 10, `delivered ${s.delivered_total}`);

    // Search narrows the list to matching names.
    await page.fill('#search', 'wea');
    await page.waitForFunction(() => {
      const rows = [...document.querySelectorAll('#topics tbody tr')];
      return rows.length === 1 && rows[0].cells[0].textContent === 'weather';
    }, null, { timeout: 10000 });

    // Publish from the page, by keyboard: a real WebSocket client gets it.
    await page.focus('#pub-topic');
    await page.keyboard.type('news');
    await page.keyboard.press('Tab');
    await page.keyboard.press('Tab');
    await page.keyboard.type('from the dashboard');
    await page.keyboard.press('Tab');
    await page.keyboard.press('Enter');
    await waitFor(() => subs[3].got.includes('from the dashboard'), 10000, 'the ws client to get the publish');
    await page.waitForFunction(() => /^Published \S+ to 2 subscribers/.test(document.querySelector('#pub-out').textContent), null, { timeout: 5000 });

    // Look at a topic: its subscriber count and its history, newest first.
    await page.fill('#in-topic', 'news');
    await page.click('#inspect button');
    await page.waitForSelector('#in-summary', { timeout: 5000 });
    assert.equal(await page.$eval('#in-summary', (p) => p.dataset.subscribers), '2');
    const hist = await page.$$eval('#in-out li', (lis) => lis.map((li) => li.textContent));
    assert.equal(hist.length, 4);
    assert.match(hist[0], / from the dashboard$/);
    assert.match(hist[3], / headline 0$/);

    // The one node: this process, reporting.
    assert.equal(await page.$eval('#nodes tbody td[data-state]', (td) => td.dataset.state), 'up');

    // Every form control has a label; plots describe themselves.
    assert.equal(await page.$$eval('input, textarea', (els) => els.filter((e) => e.labels.length === 0).length), 0);
    assert.match(await page.$eval('#p-conn', (c) => c.getAttribute('aria-label')), /^Connections over the last (1 minute|\d+ minutes); now 7$/);

    await page.fill('#search', '');
    await page.waitForFunction(() => document.querySelectorAll('#topics tbody tr').length === 3, null, { timeout: 10000 });
    await page.screenshot({ path: screenshot, fullPage: true });
    t.diagnostic(`screenshot: ${screenshot}`);

    // Narrow window: nothing overflows sideways.
    await page.setViewportSize({ width: 360, height: 800 });
    await new Promise((r) => setTimeout(r, 200));
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1), 'page wider than a phone');
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
    sse.req.destroy();
    subs.forEach((w) => w.terminate());
  }
});

test('dashboard: behind the API key, a browser signs in with Basic credentials', async () => {
  const { clients, api } = await startServer(['--api-key', 'dash-secret']);
  const ws = await openWs(`ws://${clients}/ws?topic=alerts`);
  for (const p of ['/dashboard', '/dashboard/feed', '/topics/alerts', '/dashboard/topics?q=a']) {
    const r = await fetch(`http://${api}${p}`);
    assert.equal(r.status, 401, p);
    assert.match(r.headers.get('www-authenticate'), /^Basic realm=/);
  }
  const wrong = await fetch(`http://${api}/topics/alerts`, { headers: { Authorization: 'Bearer nope' } });
  assert.equal(wrong.status, 401);
  const bearer = await fetch(`http://${api}/topics/alerts`, { headers: { Authorization: 'Bearer dash-secret' } });
  assert.equal(bearer.status, 200);
  assert.equal((await bearer.json()).subscribers, 1);
  const browser = await launch();
  try {
    const context = await browser.newContext({ httpCredentials: { username: 'admin', password: 'dash-secret' } });
    const page = await context.newPage();
    await page.goto(`http://${api}/dashboard`);
    await page.waitForFunction(() => document.querySelector('#status').textContent === 'live', null, { timeout: 15000 });
    const s = await agree(page, api);
    assert.equal(s['connections.ws'], 1);
    await page.fill('#pub-topic', 'alerts');
    await page.fill('#pub-data', 'behind the key');
    await page.click('#publish button');
    await waitFor(() => ws.got.includes('behind the key'), 10000, 'the publish behind the key');
  } finally {
    await browser.close();
    ws.terminate();
  }
});

// Opens the feed and resolves with the response once its head arrived.
function openFeed(api) {
  return new Promise((resolve, reject) => {
    const req = http.get(`http://${api}/dashboard/feed`, (res) => resolve({ req, res }));
    req.on('error', reject);
  });
}

test('dashboard: feeds are capped, and a closed tab frees its thread within a second or two', async () => {
  const { api } = await startServer(['--dashboard-max-feeds', '1']);
  const first = await openFeed(api);
  assert.equal(first.res.statusCode, 200);
  assert.equal(first.res.headers['content-type'], 'text/event-stream');
  let text = '';
  first.res.on('data', (d) => { text += d; });
  await waitFor(() => text.includes('event: window') && text.includes('event: stats'), 5000, 'window and stats events');
  assert.match(text, /^retry: \d+$/m);
  assert.equal((await metrics(api)).clarion_dashboard_feeds, 1);
  const second = await openFeed(api);
  assert.equal(second.res.statusCode, 503);
  second.res.resume();
  const closedAt = Date.now();
  first.req.destroy();
  await waitFor(async () => (await metrics(api)).clarion_dashboard_feeds === 0, 3000, 'the feed to be freed');
  assert.ok(Date.now() - closedAt < 3000);
  const third = await openFeed(api);
  assert.equal(third.res.statusCode, 200);
  third.req.destroy();
});
