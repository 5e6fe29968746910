// GRIP proxy mode against the npm GRIP libraries, and the same scenarios against real Pushpin:
// a backend written with @fanoutio/serve-grip (holds SSE streams and long-polls, speaks
// WebSocket-over-HTTP through its WebSocket context), publishing with @fanoutio/grip's
// Publisher (http-stream, http-response and ws-message formats) to the proxy's Pushpin-style
// `/publish/` API. Clients: raw `http` and `eventsource` for SSE, fetch for long-polls, `ws`.
// Every scenario runs behind Pushpin and behind Clarion and must show the clients the same
// bytes; the last test compares the two transcripts.
//
// Pushpin (Debian `pushpin`) is started from a copy of /etc/pushpin/pushpin.conf with free
// ports and its own routes file, and its whole process group is killed at the end.
//
//   cd tests/node && npm ci && CLARION_BIN=../../target/release/clarion node --test grip.test.js
//   GRIP_TRACE=1 ...   prints every request a proxy makes to the backend, and the answer
'use strict';

const { test, describe, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const WebSocket = require('ws');
const { EventSource } = require('eventsource');
const { startServer, stopAll, waitFor } = require('./helpers');

const SIG_KEY = 'changeme';
const SIG_ISS = 'pushpin';
const PUSHPIN = process.env.PUSHPIN_BIN || 'pushpin';

let grip; // @fanoutio/grip (ESM only)
let ServeGrip; // @fanoutio/serve-grip (ESM only)

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Ports for Pushpin, below the kernel's ephemeral range (32768-60999 by default): a client
// connection of a test file running in parallel can then never take one between the probe and
// Pushpin's bind (condure binds 0.0.0.0, so that is what is probed). Never the same port twice.
const handedOut = new Set();
function freePort() {
  return new Promise((resolve, reject) => {
    const attempt = (left) => {
      const port = 20000 + Math.floor(Math.random() * 12000);
      if (handedOut.has(port)) return attempt(left);
      const s = net.createServer();
      s.once('error', () => (left > 0 ? attempt(left - 1) : reject(new Error('no free port'))));
      s.listen({ port, host: '0.0.0.0', exclusive: true }, () => {
        handedOut.add(port);
        s.close(() => resolve(port));
      });
    };
    attempt(100);
  });
}

// The backend behind a proxy: the routes every scenario uses, written with serve-grip.
// `log` keeps what the proxy sent it (WebSocket-over-HTTP requests: headers and events).
class Backend {
  constructor() {
    this.log = [];
    this.sigs = []; // whether each proxied request's Grip-Sig verified
    this.holds = new Map(); // channel -> number of holds answered
    this.serveGrip = null;
  }

  configure(controlUri) {
    // With verify_key, serve-grip treats only requests with a Grip-Sig as proxied. (It does not
    // check the signature: serve-grip 2.0.0 tests the Promise of the async validateSig for
    // truth, so any Grip-Sig passes. handle() verifies each one itself, into `sigs`.)
    this.serveGrip = new ServeGrip({
      grip: { control_uri: controlUri, verify_key: SIG_KEY, verify_iss: SIG_ISS },
    });
    this.publisher = this.serveGrip.getPublisher();
  }

  listen() {
    this.server = http.createServer((req, res) => {
      this.handle(req, res).catch((e) => {
        res.statusCode = 500;
        res.end(`backend error: ${e.stack}\n`);
      });
    });
    return new Promise((resolve) => this.server.listen(0, '127.0.0.1', () => resolve(this.server.address().port)));
  }

  held(channel) {
    return this.holds.get(channel) || 0;
  }

  async handle(req, res) {
    const url = new URL(req.url, 'http://backend');
    const channel = url.searchParams.get('ch');
    if (req.headers['grip-sig']) {
      this.sigs.push(await grip.validateSig(req.headers['grip-sig'], SIG_KEY, SIG_ISS));
    }
    if (url.pathname === '/plain') {
      // Not GRIP: the proxy passes it through.
      res.writeHead(200, { 'Content-Type': 'text/plain', 'X-Backend': 'plain' });
      res.end('plain body\n');
      return;
    }
    if (process.env.GRIP_TRACE) trace(req, res);
    if (!(await this.serveGrip.run(req, res))) return;
    if (!req.grip.isProxied) {
      res.writeHead(403, { 'Content-Type': 'text/plain' });
      res.end('not proxied\n');
      return;
    }
    if (url.pathname === '/sse') {
      const instruct = res.grip.startInstruct();
      instruct.addChannel(channel);
      instruct.setHoldStream();
      if (url.searchParams.get('ka')) instruct.setKeepAlive(':ka\n\n', 1);
      res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
      res.end('event: hello\ndata: ready\n\n');
    } else if (url.pathname === '/poll') {
      const instruct = res.grip.startInstruct();
      instruct.addChannel(channel);
      instruct.setHoldLongPoll(Number(url.searchParams.get('timeout') || 20));
      res.writeHead(200, { 'Content-Type': 'application/json', 'X-Held': 'yes' });
      res.end('{"timeout":true}\n');
    } else if (url.pathname.startsWith('/ws/')) {
      const ws = req.grip.wsContext;
      assert.ok(ws, 'a WebSocket-over-HTTP request');
      const entry = {
        headers: { ...req.headers },
        events: ws._inEvents.map((e) => e.type),
        meta: { ...ws.meta },
      };
      this.log.push(entry);
      if (ws.isOpening()) {
        ws.accept();
        ws.subscribe(channel);
        ws.meta.user = 'alice';
      }
      while (ws.canRecv()) {
        let m;
        try {
          m = ws.recv();
        } catch {
          break; // DISCONNECT: serve-grip throws "Client disconnected unexpectedly."
        }
        if (m === null) {
          ws.close(ws.closeCode ?? 1000);
          break;
        }
        if (m === 'leave') ws.unsubscribe(channel);
        ws.send(`${ws.meta.user}:${m}`);
      }
      res.writeHead(200);
      res.end();
    } else {
      res.writeHead(404, { 'Content-Type': 'text/plain' });
      res.end('no such route\n');
    }
    if (channel && res.getHeader) this.holds.set(channel, this.held(channel) + 1);
  }

  close() {
    this.server?.closeAllConnections?.();
    this.server?.close();
  }
}

// GRIP_TRACE=1: print every request the proxy makes to the backend and the backend's answer.
function trace(req, res) {
  const chunks = [];
  const body = [];
  req.on('data', (d) => body.push(d));
  const write = res.write;
  res.write = function (c, ...rest) { if (c) chunks.push(Buffer.from(c)); return write.call(this, c, ...rest); };
  let head = null;
  const writeHead = res.writeHead;
  res.writeHead = function (...args) { head = args; return writeHead.apply(this, args); };
  const end = res.end;
  res.end = function (c, ...rest) {
    if (c && typeof c !== 'function') chunks.push(Buffer.from(c));
    return end.call(this, c, ...rest);
  };
  res.on('finish', () => {
    const t = new Date().toISOString().slice(11, 23);
    console.error(`--> ${t} ${req.method} ${req.url}\n${JSON.stringify(req.headers, null, 1)}\n${JSON.stringify(Buffer.concat(body).toString('latin1'))}`);
    console.error(`<-- ${res.statusCode} ${JSON.stringify(head)}\n${JSON.stringify(Buffer.concat(chunks).toString('latin1'))}`);
  });
}

function writeRoutes(dir, backendPort) {
  const file = path.join(dir, 'routes');
  // First match wins: WebSocket paths become WebSocket-over-HTTP, everything else plain GRIP.
  fs.writeFileSync(file, `*,path_beg=/ws/ 127.0.0.1:${backendPort},over_http\n* 127.0.0.1:${backendPort}\n`);
  return file;
}

// Real Pushpin on free ports from a copy of the system configuration. Resolves once a request
// goes through to the backend and the publish endpoint answers.
async function startPushpin(backendPort, configure) {
  // The free ports are only free when probed: if one is taken before Pushpin binds it, one of
  // its processes exits at once, and the runner with it. Then try again on other ports.
  for (let attempt = 1; ; attempt++) {
    try {
      return await startPushpinOnce(backendPort, configure);
    } catch (e) {
      if (attempt === 3 || !e.message.includes('pushpin exited')) throw e;
    }
  }
}

// `configure(controlUri)` is called before Pushpin starts: the readiness check needs the backend.
async function startPushpinOnce(backendPort, configure) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-grip-pushpin-'));
  fs.mkdirSync(path.join(dir, 'run'));
  fs.mkdirSync(path.join(dir, 'log'));
  const routes = writeRoutes(dir, backendPort);
  const [httpPort, pushIn, pushHttp, pushSub, command] = await Promise.all([1, 2, 3, 4, 5].map(freePort));
  const swap = (text, from, to) => {
    assert.ok(text.includes(from), `pushpin.conf has no "${from}"`);
    return text.replace(from, to);
  };
  let conf = fs.readFileSync('/etc/pushpin/pushpin.conf', 'utf8');
  for (const [from, to] of [
    ['rundir=/var/run/pushpin', `rundir=${path.join(dir, 'run')}`],
    ['logdir=/var/log/pushpin', `logdir=${path.join(dir, 'log')}`],
    ['http_port=7999', `http_port=${httpPort}`],
    ['client_maxconn=50000', 'client_maxconn=1000'],
    ['routesfile=routes', `routesfile=${routes}`],
    ['push_in_spec=tcp://127.0.0.1:5560', `push_in_spec=tcp://127.0.0.1:${pushIn}`],
    ['push_in_http_port=5561', `push_in_http_port=${pushHttp}`],
    ['push_in_sub_specs=tcp://127.0.0.1:5562', `push_in_sub_specs=tcp://127.0.0.1:${pushSub}`],
    ['command_spec=tcp://127.0.0.1:5563', `command_spec=tcp://127.0.0.1:${command}`],
    [`sig_key=changeme`, `sig_key=${SIG_KEY}`],
    // Requests to the origin go through zurl, a system service by default: the runner starts
    // its own, on IPC sockets in this run directory.
    ['services=condure,pushpin-proxy,pushpin-handler', 'services=condure,zurl,pushpin-proxy,pushpin-handler'],
    ['[proxy]\n', '[proxy]\nzurl_out_specs=ipc://{rundir}/{ipc_prefix}zurl-in\n'
      + 'zurl_out_stream_specs=ipc://{rundir}/{ipc_prefix}zurl-in-stream\n'
      + 'zurl_in_specs=ipc://{rundir}/{ipc_prefix}zurl-out\n'],
  ]) conf = swap(conf, from, to);
  configure(`http://127.0.0.1:${pushHttp}`);
  const confFile = path.join(dir, 'pushpin.conf');
  fs.writeFileSync(confFile, conf);
  const child = spawn(PUSHPIN, ['--config', confFile], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let output = '';
  for (const s of [child.stdout, child.stderr]) s.on('data', (d) => { output = (output + d).slice(-4000); });
  let exited = null;
  child.once('exit', (code) => { exited = code; });
  const stop = async () => {
    if (exited === null) {
      try { process.kill(-child.pid, 'SIGTERM'); } catch { /* gone */ }
      for (let i = 0; i < 30 && exited === null; i++) await sleep(100);
      try { process.kill(-child.pid, 'SIGKILL'); } catch { /* gone */ }
    }
    fs.rmSync(dir, { recursive: true, force: true });
  };
  try {
    // Pushpin's processes find each other over ZeroMQ after they listen: until then requests
    // get 502. Wait for one to reach the backend, then for the publish endpoint.
    await waitFor(async () => {
      if (exited !== null) throw new Error(`pushpin exited with ${exited}: ${output}`);
      try {
        // Early requests may get 502 or no answer at all: each try has its own deadline.
        const r = await fetch(`http://127.0.0.1:${httpPort}/plain`, { signal: AbortSignal.timeout(2000) });
        await r.text();
        return r.status === 200;
      } catch { return false; }
    }, 30000, 'pushpin to proxy a request');
    // A pass-through working is not enough: the first GRIP holds may still get 500 or 502.
    await waitFor(() => holdWorks(`http://127.0.0.1:${httpPort}/sse?ch=warmup`), 30000, 'pushpin to hold a stream');
    await waitFor(async () => {
      try {
        const r = await fetch(`http://127.0.0.1:${pushHttp}/publish/`, {
          method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"items":[]}',
          signal: AbortSignal.timeout(2000),
        });
        await r.text();
        return r.status === 200;
      } catch { return false; }
    }, 10000, 'pushpin publish endpoint');
  } catch (e) {
    const logs = fs.readdirSync(path.join(dir, 'log'))
      .map((f) => `${f}: ${fs.readFileSync(path.join(dir, 'log', f), 'utf8').slice(-1500)}`).join('\n');
    await stop();
    throw new Error(`${e.message}\n${logs}`);
  }
  return { clients: `127.0.0.1:${httpPort}`, controlUri: `http://127.0.0.1:${pushHttp}`, stop };
}

// Resolves true once a GRIP stream hold through the proxy answers 200 with its first event.
function holdWorks(url) {
  return new Promise((resolve) => {
    const req = http.get(url, { agent: false, timeout: 2000 }, (res) => {
      if (res.statusCode !== 200) {
        req.destroy();
        resolve(false);
        return;
      }
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        body += d;
        if (body.includes('data: ready\n\n')) {
          req.destroy();
          resolve(true);
        }
      });
      res.on('end', () => resolve(false));
      res.on('error', () => resolve(false));
    });
    req.on('timeout', () => { req.destroy(); resolve(false); });
    req.on('error', () => resolve(false));
  });
}

async function startClarion(backendPort, configure) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-grip-'));
  const routes = writeRoutes(dir, backendPort);
  const s = await startServer(['--grip-routes', routes, '--grip-sig-key', SIG_KEY, '--grip-sig-iss', SIG_ISS])
    .catch((e) => {
      fs.rmSync(dir, { recursive: true, force: true });
      throw e;
    });
  configure(`http://${s.api}`);
  return {
    clients: s.clients,
    stop: async () => {
      s.child.kill('SIGKILL');
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

// A raw HTTP stream: the decoded body as it arrives (what an SSE client gets, byte for byte).
function openStream(url) {
  return new Promise((resolve, reject) => {
    // A connection of its own (agent: false): a pooled keep-alive socket is tested apart.
    const req = http.get(url, { agent: false }, (res) => {
      const s = { status: res.statusCode, headers: res.headers, body: '', ended: false };
      res.setEncoding('utf8');
      res.on('data', (d) => { s.body += d; });
      res.on('end', () => { s.ended = true; });
      res.on('error', () => { s.ended = true; });
      s.close = () => req.destroy();
      resolve(s);
    });
    req.on('error', reject);
  });
}

// What a client sees of a response, without the headers that differ between any two servers.
function visible(status, headers, body) {
  const keep = ['content-type', 'cache-control', 'x-backend', 'x-held', 'x-published'];
  const h = {};
  for (const k of keep) if (headers[k] !== undefined) h[k] = headers[k];
  return { status, headers: h, body };
}

function gripHeaders(headers) {
  return Object.keys(headers).filter((k) => k.startsWith('grip-'));
}

const transcripts = {};

for (const name of ['pushpin', 'clarion']) {
  describe(`GRIP behind ${name}`, () => {
    let proxy;
    let backend;
    const record = (key, value) => {
      transcripts[name] ??= {};
      transcripts[name][key] = value;
    };

    before(async () => {
      grip ??= await import('@fanoutio/grip');
      ServeGrip ??= (await import('@fanoutio/serve-grip')).ServeGrip;
      backend = new Backend();
      const port = await backend.listen();
      // The backend's publisher gets the proxy's API address (`http://API`) once it is known.
      const configure = (controlUri) => backend.configure(controlUri);
      proxy = await (name === 'pushpin' ? startPushpin : startClarion)(port, configure).catch((e) => {
        backend.close();
        throw e;
      });
    });

    after(async () => {
      await proxy?.stop();
      backend?.close();
      if (name === 'clarion') stopAll();
    });

    test('a response without Grip- headers passes through', async () => {
      const r = await fetch(`http://${proxy.clients}/plain`);
      const body = await r.text();
      const v = visible(r.status, Object.fromEntries(r.headers), body);
      assert.deepEqual(v, { status: 200, headers: { 'content-type': 'text/plain', 'x-backend': 'plain' }, body: 'plain body\n' });
      record('plain', v);
      const missing = await fetch(`http://${proxy.clients}/nothing-here`);
      assert.equal(missing.status, 404);
      assert.equal(await missing.text(), 'no such route\n');
    });

    test('SSE: Grip-Hold stream, http-stream publishes (text and binary), close', async () => {
      const url = `http://${proxy.clients}/sse?ch=news`;
      const raw = await openStream(url);
      const es = new EventSource(url);
      const events = [];
      let opened = false;
      es.onopen = () => { opened = true; };
      for (const type of ['hello', 'update', 'message']) es.addEventListener(type, (e) => events.push([type, e.data]));
      try {
        assert.equal(raw.status, 200);
        assert.equal(raw.headers['content-type'], 'text/event-stream');
        assert.deepEqual(gripHeaders(raw.headers), [], 'Grip- headers reach the client');
        const initial = 'event: hello\ndata: ready\n\n';
        await waitFor(() => raw.body === initial && opened && events.length === 1, 10000, 'initial event on both clients')
          .catch((e) => { throw new Error(`${e.message}: raw ${JSON.stringify(raw.body)} opened ${opened} events ${JSON.stringify(events)}`); });
        await sleep(100);
        const pub = backend.publisher;
        await pub.publishHttpStream('news', 'event: update\ndata: one\n\n');
        await pub.publishHttpStream('news', new grip.HttpStreamFormat('data: two\ndata: lines\n\n'));
        await pub.publishHttpStream('news', new grip.HttpStreamFormat(new TextEncoder().encode('data: bytes \u00e9\n\n')));
        const expected = `${initial}event: update\ndata: one\n\ndata: two\ndata: lines\n\ndata: bytes \u00e9\n\n`;
        await waitFor(() => raw.body.length >= expected.length && events.length === 4, 10000, 'three publishes');
        assert.equal(raw.body, expected);
        assert.deepEqual(events, [['hello', 'ready'], ['update', 'one'], ['message', 'two\nlines'], ['message', 'bytes \u00e9']]);
        es.close();
        await pub.publishHttpStream('news', new grip.HttpStreamFormat(null, true));
        await waitFor(() => raw.ended, 10000, 'the stream to end after action close');
        assert.equal(raw.body, expected);
        record('sse', visible(raw.status, raw.headers, raw.body));
      } finally {
        es.close();
        raw.close();
      }
    });

    test('SSE: after a publish closes the stream, the connection is reusable or announced closed', async () => {
      const [host, port] = proxy.clients.split(':');
      const sock = net.connect(Number(port), host);
      let data = '';
      let closed = false;
      sock.setEncoding('latin1');
      sock.on('data', (d) => { data += d; });
      sock.on('close', () => { closed = true; });
      sock.on('error', () => {});
      try {
        sock.write('GET /sse?ch=reuse HTTP/1.1\r\nHost: test\r\n\r\n');
        await waitFor(() => data.includes('data: ready\n\n'), 10000, 'the stream');
        await sleep(100);
        await backend.publisher.publishHttpStream('reuse', new grip.HttpStreamFormat(null, true));
        await waitFor(() => data.includes('\r\n0\r\n\r\n') || closed, 10000, 'the end of the stream');
        const head = data.slice(0, data.indexOf('\r\n\r\n')).toLowerCase();
        assert.match(head, /\r\ntransfer-encoding: chunked/);
        assert.ok(data.endsWith('\r\n0\r\n\r\n'), `the stream ends with the last chunk: ${JSON.stringify(data.slice(-40))}`);
        const announced = /\r\nconnection: [^\r]*close/.test(head);
        const before = data.length;
        if (!closed) sock.write('GET /plain HTTP/1.1\r\nHost: test\r\n\r\n');
        await waitFor(() => closed || data.slice(before).includes('plain body\n'), 5000, 'an answer on the same connection').catch(() => {});
        const reused = data.slice(before).startsWith('HTTP/1.1 200') && data.endsWith('plain body\n');
        assert.ok(reused || announced, 'the proxy closed the connection after the stream without "Connection: close" '
          + `(Pushpin keeps it open for the next request); response head: ${JSON.stringify(head)}`);
        record('stream-close', 'ok');
      } finally {
        sock.destroy();
      }
    });

    test('SSE: Grip-Keep-Alive sends its data on an idle stream', async () => {
      const raw = await openStream(`http://${proxy.clients}/sse?ch=quiet&ka=1`);
      try {
        await waitFor(() => raw.body.startsWith('event: hello\ndata: ready\n\n:ka\n\n'), 8000, 'a keep-alive');
        assert.match(raw.body, /^event: hello\ndata: ready\n\n(:ka\n\n)+$/);
        record('keepalive', 'event: hello\ndata: ready\n\n:ka\n\n');
      } finally {
        raw.close();
      }
    });

    test('long-poll: Grip-Hold response answered by an http-response publish', async () => {
      const started = Date.now();
      const pending = fetch(`http://${proxy.clients}/poll?ch=lp&timeout=20`).then(async (r) => ({
        status: r.status, headers: Object.fromEntries(r.headers), body: await r.text(),
      }));
      let done = null;
      pending.then((v) => { done = v; }, (e) => { done = e; });
      await waitFor(() => backend.held('lp') >= 1, 10000, 'the backend to answer the hold');
      // A publish arriving before the proxy subscribed is dropped: repeat until one lands.
      for (let i = 0; i < 10 && done === null; i++) {
        await sleep(i === 0 ? 200 : 500);
        if (done !== null) break;
        await backend.publisher.publishHttpResponse('lp', new grip.HttpResponseFormat({
          code: 202, reason: 'Accepted', headers: { 'Content-Type': 'text/plain', 'X-Published': 'yes' }, body: 'published body\n',
        }));
        await waitFor(() => done !== null, 500, 'response').catch(() => {});
      }
      const r = await pending;
      assert.ok(Date.now() - started < 15000);
      assert.deepEqual(gripHeaders(r.headers), []);
      const v = visible(r.status, r.headers, r.body);
      record('longpoll', v);
      assert.deepEqual(v, { status: 202, headers: { 'content-type': 'text/plain', 'x-held': 'yes', 'x-published': 'yes' }, body: 'published body\n' });
    });

    test('long-poll: Grip-Timeout answers with the held response', async () => {
      const started = Date.now();
      const r = await fetch(`http://${proxy.clients}/poll?ch=idle&timeout=2`);
      const body = await r.text();
      const elapsed = Date.now() - started;
      assert.ok(elapsed >= 1500 && elapsed < 10000, `answered after ${elapsed} ms`);
      assert.deepEqual(gripHeaders(Object.fromEntries(r.headers)), []);
      const v = visible(r.status, Object.fromEntries(r.headers), body);
      record('timeout', v);
      assert.deepEqual(v, { status: 200, headers: { 'content-type': 'application/json', 'x-held': 'yes' }, body: '{"timeout":true}\n' });
    });

    test('WebSocket-over-HTTP: accept, subscribe, meta, echo, ws-message publishes, close', async () => {
      const first = backend.log.length;
      const ws = new WebSocket(`ws://${proxy.clients}/ws/chat?ch=room`);
      const got = [];
      let closed = null;
      ws.on('message', (data, isBinary) => got.push(isBinary ? ['binary', [...data]] : ['text', data.toString()]));
      ws.on('close', (code, reason) => { closed = { code, reason: reason.toString() }; });
      await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
      try {
        ws.send('hello');
        await waitFor(() => got.length === 1, 10000, 'echo');
        assert.deepEqual(got[0], ['text', 'alice:hello']);
        await sleep(100);
        const pub = backend.publisher;
        await pub.publishFormats('room', new grip.WebSocketMessageFormat('pushed text'));
        await pub.publishFormats('room', new grip.WebSocketMessageFormat(new Uint8Array([0, 1, 2, 255])));
        await waitFor(() => got.length === 3, 10000, 'two publishes');
        ws.send('again');
        await waitFor(() => got.length === 4, 10000, 'second echo');
        await pub.publishFormats('room', new grip.WebSocketMessageFormat(null, true, 4001));
        await waitFor(() => closed !== null, 10000, 'close from a publish');
        // The proxy tells the backend the connection closed (checked below).
        await waitFor(() => backend.log.slice(first).some((e) => e.events.includes('CLOSE') || e.events.includes('DISCONNECT')), 5000, 'CLOSE or DISCONNECT at the backend');
        await sleep(100);
      } finally {
        ws.terminate();
      }
      const expected = [['text', 'alice:hello'], ['text', 'pushed text'], ['binary', [0, 1, 2, 255]], ['text', 'alice:again']];
      record('ws', { messages: got, close: closed });
      assert.deepEqual(got, expected);
      assert.equal(closed.code, 4001);

      // What the proxy sent the backend, as Pushpin sends it: every difference at once.
      const log = backend.log.slice(first);
      const events = log.map((e) => e.events.join(','));
      record('ws-backend', events);
      const problems = [];
      const expect = (ok, what) => { if (!ok) problems.push(what); };
      expect(JSON.stringify(events) === JSON.stringify(['OPEN', 'TEXT', 'TEXT', 'CLOSE']),
        `events: expected OPEN, TEXT, TEXT, CLOSE (Pushpin sends "CLOSE\\r\\n" after a publish closed the connection), got ${events.join(' | ')}`);
      const open = log[0] || { headers: {}, meta: {} };
      expect(/^application\/websocket-events/.test(open.headers['content-type']), `OPEN Content-Type: ${open.headers['content-type']}`);
      expect(/application\/websocket-events/.test(open.headers.accept), `OPEN Accept: ${open.headers.accept}`);
      expect(open.headers['connection-id'], 'OPEN without Connection-Id');
      expect(/(^|[ ,])grip($|[ ,;])/.test(open.headers['sec-websocket-extensions'] || ''),
        `OPEN Sec-WebSocket-Extensions: expected an offer of "grip" (Pushpin: "grip"), got ${JSON.stringify(open.headers['sec-websocket-extensions'])}`);
      expect(open.headers['grip-sig'], 'OPEN without Grip-Sig');
      expect(JSON.stringify(open.meta) === '{}', `OPEN meta: ${JSON.stringify(open.meta)}`);
      for (const e of log.slice(1)) {
        expect(e.headers['connection-id'] === open.headers['connection-id'], `Connection-Id changed: ${e.headers['connection-id']}`);
        expect(e.meta.user === 'alice', `Set-Meta-User did not come back as Meta-User: ${JSON.stringify(e.meta)}`);
      }
      assert.deepEqual(problems, []);
    });

    test('WebSocket-over-HTTP: c:unsubscribe stops publishes to that connection', async () => {
      const ws = new WebSocket(`ws://${proxy.clients}/ws/chat?ch=lobby`);
      const got = [];
      ws.on('message', (data) => got.push(data.toString()));
      await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
      try {
        await sleep(100);
        await backend.publisher.publishFormats('lobby', new grip.WebSocketMessageFormat('before'));
        await waitFor(() => got.length === 1, 10000, 'a publish while subscribed');
        ws.send('leave');
        await waitFor(() => got.length === 2, 10000, 'echo of leave');
        await backend.publisher.publishFormats('lobby', new grip.WebSocketMessageFormat('after'));
        ws.send('ping');
        await waitFor(() => got.length >= 3, 10000, 'echo of ping');
        await sleep(200);
      } finally {
        ws.terminate();
      }
      record('ws-unsubscribe', got);
      assert.deepEqual(got, ['before', 'alice:leave', 'alice:ping']);
    });

    test('WebSocket-over-HTTP: a client close reaches the backend, which closes back', async () => {
      const first = backend.log.length;
      const ws = new WebSocket(`ws://${proxy.clients}/ws/chat?ch=bye`);
      let closed = null;
      ws.on('close', (code) => { closed = code; });
      await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
      // Without a reason: serve-grip reads the code only from a 2-byte CLOSE payload.
      ws.close(4321);
      try {
        await waitFor(() => closed !== null, 10000, 'close handshake');
        await waitFor(() => backend.log.slice(first).some((e) => e.events.includes('CLOSE')), 5000, 'CLOSE at the backend');
      } finally {
        ws.terminate();
      }
      assert.equal(closed, 4321);
      record('ws-close', closed);
    });

    test('every proxied request carried a valid Grip-Sig', () => {
      assert.ok(backend.sigs.length > 0);
      assert.deepEqual(backend.sigs.filter((ok) => !ok), []);
    });
  });
}

test('Pushpin and Clarion show the clients the same data', () => {
  assert.ok(transcripts.pushpin && transcripts.clarion, 'both ran');
  const keys = [...new Set([...Object.keys(transcripts.pushpin), ...Object.keys(transcripts.clarion)])];
  const diffs = keys
    .filter((k) => JSON.stringify(transcripts.pushpin[k]) !== JSON.stringify(transcripts.clarion[k]))
    .map((k) => `${k}: Pushpin ${JSON.stringify(transcripts.pushpin[k])}, Clarion ${JSON.stringify(transcripts.clarion[k])}`);
  assert.deepEqual(diffs, []);
});
