// JWT authentication with tokens from the `jsonwebtoken` package (the usual Node backend's
// choice): each algorithm (HS256 with a rotated secret, RS256 from a PEM key, ES256 from a JWKS
// chosen by kid), each place a token can come from (header, query, cookie, the WebSocket `auth`
// message), the refusals, wildcard grants, refresh before and after expiry, and headless Chromium
// subscribing with `?token=` and with the `auth` message.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');
const jwt = require('jsonwebtoken');
const WebSocket = require('ws');
const { EventSource } = require('eventsource');
const { startServer, stopAll, waitFor } = require('./helpers');

after(stopAll);

const SECRET = 'a-node-hs256-secret-long-enough-0123456789';
const OLD = 'the-previous-node-secret-long-enough-98765';
const now = () => Math.floor(Date.now() / 1000);
const grants = (subscribe = [], publish = []) => ({ clarion: { subscribe, publish } });
const hs = (claims, opts = {}) =>
  jwt.sign({ sub: 'bob', ...claims }, opts.secret || SECRET, { algorithm: 'HS256', expiresIn: opts.exp ?? 300, ...(opts.sign || {}) });

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-auth-'));
const rsa = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const ecA = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
const ecB = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
const rsaPem = rsa.publicKey.export({ type: 'spki', format: 'pem' });
fs.writeFileSync(path.join(dir, 'rsa.pem'), rsaPem);
fs.writeFileSync(
  path.join(dir, 'jwks.json'),
  JSON.stringify({
    keys: [
      { ...ecA.publicKey.export({ format: 'jwk' }), kid: 'a', use: 'sig', alg: 'ES256' },
      { ...ecB.publicKey.export({ format: 'jwk' }), kid: 'b', use: 'sig', alg: 'ES256' },
    ],
  }),
);

// The status and JSON body of an SSE request (the body is read only for refusals).
async function sse(clients, query, headers = {}) {
  const ctl = new AbortController();
  const res = await fetch(`http://${clients}/sse?${query}`, { headers, signal: ctl.signal });
  const body = res.status === 200 ? null : await res.json();
  ctl.abort();
  return [res.status, body];
}

// Opens a WebSocket; resolves with it once open, or with the refusal's status.
function ws(url, options = {}) {
  return new Promise((resolve) => {
    const w = new WebSocket(url, options);
    const inbox = [];
    w.inbox = inbox;
    w.on('message', (m) => inbox.push(m.toString()));
    w.once('open', () => resolve(w));
    w.once('unexpected-response', (_req, res) => resolve({ status: res.statusCode }));
    w.once('error', () => {});
  });
}

const next = (w, pred = () => true, ms = 5000) =>
  waitFor(() => {
    const i = w.inbox.findIndex(pred);
    return i >= 0 ? w.inbox.splice(i, 1)[0] : null;
  }, ms, 'a message');

test('HS256 tokens from the header, the query, the cookie and the auth message', async () => {
  const { clients, api } = await startServer(['--auth-secret', SECRET, '--auth-previous-secret', OLD]);
  const tok = hs(grants(['news']));
  assert.equal((await sse(clients, 'topic=news', { Authorization: `Bearer ${tok}` }))[0], 200);
  assert.equal((await sse(clients, `topic=news&token=${tok}`))[0], 200);
  assert.equal((await sse(clients, 'topic=news', { Cookie: `clarion_token=${tok}` }))[0], 200);
  assert.equal((await sse(clients, `topic=news&token=${hs(grants(['news']), { secret: OLD })}`))[0], 200);
  const a = await ws(`ws://${clients}/ws?topic=news`, { headers: { Authorization: `Bearer ${tok}` } });
  const b = await ws(`ws://${clients}/ws?topic=news&token=${tok}`);
  const c = await ws(`ws://${clients}/ws`);
  c.send(JSON.stringify({ type: 'auth', token: tok }));
  assert.equal(JSON.parse(await next(c)).type, 'authenticated');
  c.send(JSON.stringify({ type: 'subscribe', topic: 'news' }));
  assert.equal(JSON.parse(await next(c)).type, 'subscribed');
  const res = await fetch(`http://${api}/publish/news`, { method: 'POST', body: 'hi', headers: { Authorization: `Bearer ${hs(grants([], ['news']))}` } });
  assert.equal(res.status, 200);
  for (const w of [a, b, c]) {
    assert.equal(await next(w, (m) => m === 'hi'), 'hi');
    w.close();
  }
});

test('refusals: expired, not yet valid, audience, key, tampering, alg none, confusion', async () => {
  const { clients } = await startServer(['--auth-public-key', path.join(dir, 'rsa.pem'), '--auth-audience', 'app']);
  const rs = (claims, opts = {}) =>
    jwt.sign({ ...grants(['news']), ...claims }, rsa.privateKey, { algorithm: 'RS256', expiresIn: 60, audience: 'app', ...opts });
  assert.equal((await sse(clients, `topic=news&token=${rs({})}`))[0], 200);
  const cases = [
    [rs({}, { expiresIn: -10 }), 'token expired'],
    [rs({}, { notBefore: 120 }), 'token not yet valid'],
    [rs({}, { audience: 'other' }), 'token audience not accepted'],
    [jwt.sign({ exp: now() + 60, aud: 'app' }, crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey, { algorithm: 'RS256' }), 'bad token signature'],
    [(() => {
      const [h, , s] = rs({}).split('.');
      const p = Buffer.from(JSON.stringify({ exp: now() + 60, aud: 'app', ...grants(['*']) })).toString('base64url');
      return `${h}.${p}.${s}`;
    })(), 'bad token signature'],
    [jwt.sign({ exp: now() + 60, aud: 'app', ...grants(['news']) }, null, { algorithm: 'none' }), 'token algorithm not accepted'],
    [(() => {
      // HS256 with the RSA public key's PEM as the HMAC secret.
      const h = Buffer.from('{"alg":"HS256","typ":"JWT"}').toString('base64url');
      const p = Buffer.from(JSON.stringify({ exp: now() + 60, aud: 'app', ...grants(['news']) })).toString('base64url');
      const s = crypto.createHmac('sha256', rsaPem).update(`${h}.${p}`).digest('base64url');
      return `${h}.${p}.${s}`;
    })(), 'token algorithm not accepted'],
  ];
  for (const [tok, reason] of cases) {
    assert.deepEqual(await sse(clients, `topic=news&token=${tok}`), [401, { error: reason }], reason);
    const w = await ws(`ws://${clients}/ws?topic=news&token=${tok}`);
    assert.equal(w.status, 401, reason);
  }
  assert.deepEqual(await sse(clients, `topic=news&token=${rs(grants(['other']))}`), [403, { error: 'the token does not grant this topic' }]);
});

test('ES256 keys from a JWKS, chosen by kid', async () => {
  const { clients } = await startServer(['--auth-jwks', path.join(dir, 'jwks.json'), '--auth-algorithm', 'ES256']);
  const es = (key, kid) => jwt.sign(grants(['news']), key, { algorithm: 'ES256', expiresIn: 60, keyid: kid });
  assert.equal((await sse(clients, `topic=news&token=${es(ecA.privateKey, 'a')}`))[0], 200);
  assert.equal((await sse(clients, `topic=news&token=${es(ecB.privateKey, 'b')}`))[0], 200);
  assert.deepEqual(await sse(clients, `topic=news&token=${es(ecA.privateKey, 'b')}`), [401, { error: 'bad token signature' }]);
  assert.deepEqual(await sse(clients, `topic=news&token=${es(ecA.privateKey, 'z')}`), [401, { error: 'unknown signing key' }]);
});

test('wildcard grants: a prefix needs one more character, * alone is everything', async () => {
  const { clients } = await startServer(['--auth-secret', SECRET]);
  const cases = [
    [['room.*'], 'room.1', 200], [['room.*'], 'room.a.b', 200], [['room.*'], 'room', 403],
    [['room.*'], 'room.', 403], [['room.*'], 'roomy', 403], [['*'], 'x', 200],
    [['a:1/*'], 'a:1/b', 200], [['a:1/*'], 'a:10/b', 403], [['exact'], 'exact', 200], [['exact'], 'exactly', 403],
  ];
  for (const [patterns, topic, status] of cases) {
    assert.equal((await sse(clients, `topic=${topic}&token=${hs(grants(patterns))}`))[0], status, `${patterns} ${topic}`);
  }
  // An invalid pattern makes the whole token invalid, not a broader grant.
  assert.deepEqual(await sse(clients, `topic=x&token=${hs(grants(['a*b']))}`), [401, { error: 'invalid token claims' }]);
});

test('refresh before expiry keeps the WebSocket; without one it closes with 4001', async () => {
  const { clients } = await startServer(['--auth-secret', SECRET, '--auth-expiry-warning', '2']);
  const w = await ws(`ws://${clients}/ws?topic=t&token=${hs(grants(['t']), { exp: 3 })}`);
  const closed = new Promise((r) => w.once('close', (code) => r(code)));
  const warn = JSON.parse(await next(w, (m) => m.includes('expiring')));
  assert.ok(warn.seconds <= 2);
  w.send(JSON.stringify({ type: 'refresh', token: hs(grants(['t']), { exp: 5 }) }));
  assert.equal(JSON.parse(await next(w, (m) => m.includes('authenticated'))).type, 'authenticated');
  // After the first token's exp it is still open; a stale refresh is refused, then 4001.
  await new Promise((r) => setTimeout(r, 2500));
  assert.equal(w.readyState, WebSocket.OPEN);
  w.send(JSON.stringify({ type: 'refresh', token: hs(grants(['t']), { exp: -5 }) }));
  assert.equal(JSON.parse(await next(w, (m) => m.includes('error'))).error, 'token expired');
  assert.equal(await closed, 4001);
});

const PAGE = `<!doctype html><meta charset="utf-8"><ul id="sse"></ul><ul id="ws"></ul>
<script>
  const q = new URLSearchParams(location.search);
  const add = (list, text) => {
    const li = document.createElement('li');
    li.textContent = text;
    document.getElementById(list).appendChild(li);
  };
  const es = new EventSource('http://' + q.get('server') + '/sse?topic=private&token=' + q.get('token'));
  es.onopen = () => { window.sseOpen = true; };
  es.onmessage = (e) => add('sse', e.data);
  // The auth message keeps the token out of the URL.
  const ws = new WebSocket('ws://' + q.get('server') + '/ws');
  ws.onopen = () => ws.send(JSON.stringify({ type: 'auth', token: q.get('token') }));
  ws.onmessage = (e) => {
    const m = e.data.startsWith('{') ? JSON.parse(e.data) : null;
    if (m && m.type === 'authenticated') ws.send(JSON.stringify({ type: 'subscribe', topic: 'private' }));
    else if (m && m.type === 'subscribed') window.wsReady = true;
    else add('ws', e.data);
  };
</script>`;

test('browser: EventSource with ?token= and WebSocket with the auth message', async () => {
  const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
  assert.ok(fs.existsSync(chromiumPath), `no browser at ${chromiumPath}`);
  const { chromium } = require('playwright-core');
  const { clients, api } = await startServer(['--auth-secret', SECRET]);
  const site = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
    res.end(PAGE);
  });
  await new Promise((r) => site.listen(0, '127.0.0.1', r));
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  try {
    const page = await browser.newPage();
    const tok = hs(grants(['private']));
    await page.goto(`http://127.0.0.1:${site.address().port}/?server=${clients}&token=${tok}`);
    await page.waitForFunction(() => window.sseOpen === true && window.wsReady === true, null, { timeout: 15000 });
    const res = await fetch(`http://${api}/publish/private`, { method: 'POST', body: 'for alice only', headers: { Authorization: `Bearer ${hs(grants([], ['private']))}` } });
    assert.equal(res.status, 200);
    const list = (id) => page.$$eval(`#${id} li`, (lis) => lis.map((li) => li.textContent));
    await waitFor(async () => (await list('sse')).length === 1 && (await list('ws')).length === 1, 10000, 'the browser got it');
    assert.deepEqual(await list('sse'), ['for alice only']);
    assert.deepEqual(await list('ws'), ['for alice only']);
  } finally {
    await browser.close();
    site.close();
  }
});

test('an EventSource is ended with an expired event at exp', async () => {
  const { clients } = await startServer(['--auth-secret', SECRET]);
  const es = new EventSource(`http://${clients}/sse?topic=t&token=${hs(grants(['t']), { exp: 2 })}`);
  try {
    const expired = await new Promise((resolve, reject) => {
      es.addEventListener('expired', (e) => resolve(JSON.parse(e.data)));
      setTimeout(() => reject(new Error('no expired event')), 6000);
    });
    assert.deepEqual(expired, { error: 'token expired' });
  } finally {
    es.close();
  }
});
