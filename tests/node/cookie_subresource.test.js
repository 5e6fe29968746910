// The token cookie on a subresource another page made (issue 55, item 6), in headless Chromium.
// A page on a sibling subdomain (blog.example.com) points an <img> and a no-cors fetch at
// Clarion (push.example.com, over TLS: browsers send `Sec-Fetch-*` to secure origins only): the
// browser sends `Sec-Fetch-Site: same-site`, no `Origin`, and the user's `SameSite=Lax` cookie.
// The cookie must not count there, while the server's own page and a page of an allowed origin
// still connect with it. docs/auth.md, docs/security.md.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const jwt = require('jsonwebtoken');
const { binary, startServer, stopAll } = require('./helpers');

const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const SECRET = 'a-cookie-secret-that-is-long-enough-01234';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-node-cookie-'));
execFileSync(binary(), ['cert', '--dev', '--dir', dir]);

after(() => {
  stopAll();
  fs.rmSync(dir, { recursive: true, force: true });
});

async function metric(api, line) {
  const text = await (await fetch(`http://${api}/metrics`)).text();
  const found = text.split('\n').find((l) => l.startsWith(line + ' '));
  return found === undefined ? 0 : Number(found.slice(line.length + 1));
}

test('the token cookie does not count on a sibling subdomain\'s subresource; own and allowed pages still connect', async () => {
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}: apt-get install chromium`);
  const { chromium } = require('playwright-core');
  const server = await startServer([
    '--tls-listen', '127.0.0.1:0',
    '--tls-cert', path.join(dir, 'cert.pem'),
    '--tls-key', path.join(dir, 'key.pem'),
    '--auth-secret', SECRET,
    '--allowed-origins', 'https://app.example.com',
  ]);
  const port = server.tls.slice(server.tls.lastIndexOf(':') + 1);
  const push = `https://push.example.com:${port}`;
  // The pages of app.example.com, blog.example.com and push.example.com/own.html are answered
  // by interception; the rest of push.example.com reaches the server on loopback.
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: [
      '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--ignore-certificate-errors',
      '--host-resolver-rules=MAP push.example.com 127.0.0.1',
      // Intercepted pages look public to Chromium's local-network checks.
      '--disable-features=LocalNetworkAccessChecks',
    ],
  });
  try {
    const context = await browser.newContext();
    const tok = jwt.sign({ sub: 'alice', clarion: { subscribe: ['private'] } }, SECRET, { expiresIn: 300 });
    await context.addCookies([{
      name: 'clarion_token', value: tok, domain: 'push.example.com', path: '/',
      sameSite: 'Lax', httpOnly: true, secure: true,
    }]);
    // The headers each request of ours (tagged `via=...`) went out with and the status Clarion
    // answered, as the browser's network stack saw them (an <img> of JSON is blocked by ORB and
    // a CORS failure hides the answer from the page; the DevTools protocol still reports both).
    const sent = {};
    const status = {};
    const tags = {};
    async function watch(page) {
      const cdp = await context.newCDPSession(page);
      await cdp.send('Network.enable');
      cdp.on('Network.requestWillBeSent', (e) => {
        if (e.request.url.startsWith(push)) tags[e.requestId] = new URL(e.request.url).searchParams.get('via');
      });
      cdp.on('Network.requestWillBeSentExtraInfo', (e) => {
        if (tags[e.requestId]) sent[tags[e.requestId]] = e.headers;
      });
      cdp.on('Network.responseReceivedExtraInfo', (e) => {
        if (tags[e.requestId]) status[tags[e.requestId]] = e.statusCode;
      });
    }
    const pages = {
      'https://blog.example.com/attack.html': `<!doctype html><title>attack</title>
<img src="${push}/poll?topic=private&timeout=1&via=img">
<script>fetch('${push}/poll?topic=private&timeout=1&via=fetch', { mode: 'no-cors', credentials: 'include' }).catch(() => {});</script>`,
      [`${push}/own.html`]: `<!doctype html><title>own</title>
<script>new EventSource('/sse?topic=private&via=own');</script>`,
      'https://app.example.com/app.html': `<!doctype html><title>app</title>
<script>new EventSource('${push}/sse?topic=private&via=app', { withCredentials: true });</script>`,
    };
    const before = await metric(server.api, 'clarion_auth_failures_total{reason="origin"}');
    for (const [url, body] of Object.entries(pages)) {
      const page = await context.newPage();
      await watch(page);
      await page.route((u) => u.href === url, (route) =>
        route.fulfill({ status: 200, contentType: 'text/html; charset=utf-8', body }));
      await page.goto(url);
    }
    const deadline = Date.now() + 10000;
    while (['img', 'fetch', 'own', 'app'].some((v) => status[v] === undefined) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
    }
    // The attack has the shape of the issue: same-site, no-cors, no Origin, the cookie along.
    for (const v of ['img', 'fetch']) {
      const h = sent[v] || {};
      assert.equal(h['sec-fetch-site'], 'same-site', JSON.stringify(h));
      assert.equal(h['sec-fetch-mode'], 'no-cors', JSON.stringify(h));
      assert.equal(h.origin, undefined, JSON.stringify(h));
      assert.match(h.cookie || '', /clarion_token=/);
      assert.equal(status[v], 403, `the ${v} subresource was served as the user (${status[v]})`);
    }
    assert.equal(status.own, 200, 'the server\'s own page connects with the cookie');
    assert.equal(status.app, 200, 'an allowed origin\'s page connects with the cookie');
    const after = await metric(server.api, 'clarion_auth_failures_total{reason="origin"}');
    assert.equal(after - before, 2, 'both refusals are counted');
  } finally {
    await browser.close();
  }
});
