// A browser's EventSource through a Redis outage (issue 33): Chromium gives up for good on any
// answer to an EventSource request that is not a 200 event stream, so a node that answered
// `503` while its broker reconnects would leave every page that happened to reconnect then
// without updates until it is reloaded. Here the page's stream is cut while Redis is down, so
// the browser reconnects during the outage: it must be told to come back (a 200 stream with
// `retry:` and an `unavailable` event), keep retrying, and receive what is published once
// Redis is back.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const fs = require('node:fs');
const { waitFor } = require('./helpers');
const { relay: startRelay, killAll, freePort, startRedis, Node } = require('./client_util');

const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
after(killAll);

const PAGE = `<!doctype html><meta charset="utf-8"><title>outage</title>
<script>
  const q = new URLSearchParams(location.search);
  window.got = []; window.opens = 0; window.unavailable = []; window.closed = false;
  const es = new EventSource('http://' + q.get('sse') + '/sse?topic=news');
  es.onopen = () => window.opens++;
  es.onmessage = (e) => window.got.push(e.data);
  es.addEventListener('unavailable', (e) => window.unavailable.push(e.data));
  // readyState CLOSED after an error is the browser giving up for good.
  es.onerror = () => { if (es.readyState === EventSource.CLOSED) window.closed = true; };
</script>`;

async function publish(api, topic, body) {
  const res = await fetch(`http://${api}/publish/${topic}`, { method: 'POST', body });
  return res.status;
}

test('browser: an EventSource that reconnects while Redis is down keeps retrying and gets what is published after', async () => {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  const redisPort = await freePort();
  let redis = (await startRedis(redisPort)).child;
  const node = await new Node(['--broker', `redis://127.0.0.1:${redisPort}`, '--node-name', 'a']).start();
  const relay = await startRelay(() => node.clients);
  const site = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
    res.end(PAGE);
  });
  await new Promise((r) => site.listen(0, '127.0.0.1', r));
  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  try {
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${site.address().port}/?sse=${relay.address}`);
    const read = (expr) => page.evaluate(expr);
    await waitFor(async () => (await read('window.opens')) === 1, 10000, 'the stream to open');
    assert.equal(await publish(node.api, 'news', 'before'), 200);
    await waitFor(async () => (await read('window.got.length')) === 1, 10000, 'the first message');

    // Redis goes away; then the page's connection drops, so the browser reconnects during the
    // outage and is turned away (at least twice: it keeps retrying).
    redis.kill('SIGKILL');
    await waitFor(async () => (await fetch(`http://${node.api}/healthz`)).status === 503, 10000, 'the node to see Redis gone');
    relay.cut();
    await waitFor(async () => (await read('window.unavailable.length')) >= 2, 20000, 'two answers saying the broker is unavailable');
    assert.equal(await read('window.closed'), false, 'the EventSource gave up');
    assert.match((await read('window.unavailable'))[0], /broker unavailable/);

    redis = (await startRedis(redisPort)).child;
    await waitFor(async () => (await fetch(`http://${node.api}/healthz`)).status === 200, 20000, 'the node to see Redis back');
    // A later retry subscribes; what is published from then on reaches the page. Publish
    // until it does (the browser comes back within its retry: of 4 to 6 s).
    let n = 0;
    await waitFor(async () => {
      assert.equal(await publish(node.api, 'news', `after ${n++}`), 200);
      await new Promise((r) => setTimeout(r, 200));
      return (await read('window.got')).some((m) => m.startsWith('after'));
    }, 30000, 'a message published after Redis came back');
    assert.equal(await read('window.closed'), false);
    const got = await read('window.got');
    assert.equal(got[0], 'before');
    const after = got.slice(1).map((m) => Number(m.split(' ')[1]));
    assert.ok(after.every((k, i) => i === 0 || k === after[i - 1] + 1), `in order, once: ${got}`);
  } finally {
    await browser.close();
    site.close();
    relay.close();
    await node.kill9();
    redis.kill('SIGKILL');
  }
});
