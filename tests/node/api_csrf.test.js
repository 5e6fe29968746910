// CSRF against the publish API in a real browser (headless Chromium through playwright-core):
// an attack page on another origin posts a text/plain `fetch` to the API (a "simple" request,
// sent without a preflight), with and without an API key the browser could hold; none of them
// may publish. The same page served by an allowed origin may. docs/security.md.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const fs = require('node:fs');
const { startServer, stopAll } = require('./helpers');

after(stopAll);

const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';

// A page that posts to the API as soon as it loads and records what it could see.
function attackPage(api, topic) {
  return `<!doctype html><meta charset="utf-8"><title>attack</title>
<script>
  window.done = (async () => {
    const out = [];
    for (const mode of ['no-cors', 'cors']) {
      try {
        const r = await fetch('http://${api}/publish/${topic}', {
          method: 'POST', mode, body: 'pwned-' + mode,
          headers: { 'Content-Type': 'text/plain' },
        });
        out.push(mode + ':' + r.status);
      } catch (e) {
        out.push(mode + ':error');
      }
    }
    return out;
  })();
</script>`;
}

function pageServer(html, host) {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/html' });
    res.end(html);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, origin: `http://${host}:${server.address().port}` })));
}

async function published(api, topic) {
  const r = await fetch(`http://${api}/dashboard/topics?q=${topic}&limit=5`);
  const j = await r.json();
  const t = j.topics.find((x) => x.topic === topic);
  return t ? t.published : 0;
}

test('a page of another origin cannot publish through the browser; an allowed origin can', async () => {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  const servers = [];
  try {
    // Cross-site (localhost vs 127.0.0.1) and same-site (another port of 127.0.0.1) pages.
    const attackers = [];
    for (const host of ['localhost', '127.0.0.1']) {
      attackers.push(await pageServer('', host));
    }
    servers.push(...attackers.map((a) => a.server));
    const allowed = attackers[1].origin;
    const api = await startServer(['--allowed-origins', allowed]);
    for (const [i, a] of attackers.entries()) {
      const topic = `csrf${i}`;
      a.server.removeAllListeners('request');
      a.server.on('request', (req, res) => {
        res.writeHead(200, { 'Content-Type': 'text/html' });
        res.end(attackPage(api.api, topic));
      });
      const page = await browser.newPage();
      await page.goto(a.origin + '/');
      const outcome = await page.evaluate(() => window.done);
      await page.close();
      const n = await published(api.api, topic);
      if (a.origin === allowed) {
        assert.equal(n, 2, `the allowed origin published (${outcome})`);
      } else {
        assert.equal(n, 0, `a foreign page published: ${outcome}`);
        assert.ok(outcome.includes('cors:error') || outcome.some((o) => o.endsWith(':403')), String(outcome));
      }
    }
  } finally {
    await browser.close();
    servers.forEach((s) => s.close());
  }
});
