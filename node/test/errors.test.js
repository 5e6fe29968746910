// The client's error mapping against a real server.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import net from 'node:net';
import * as clarion from 'clarion';
import { startServer, ServerStartError } from 'clarion/testing';

const KEY = 's3cret-key';
let server;
before(async () => {
  server = await startServer({ args: ['--api-key', KEY, '--max-publish-size', '1024'] });
});
after(() => server.stop());

function hs256(key, claims) {
  const b64 = (b) => Buffer.from(b).toString('base64url');
  const head = `${b64(JSON.stringify({ alg: 'HS256', typ: 'JWT' }))}.${b64(JSON.stringify(claims))}`;
  return `${head}.${createHmac('sha256', key).update(head).digest('base64url')}`;
}

test('api key and JWT bearer are accepted', async () => {
  assert.equal((await server.client().publish('k', 'ok')).topic, 'k');
  const exp = Math.floor(Date.now() / 1000) + 60;
  const c = new clarion.Client({ baseUrl: server.apiUrl, token: () => hs256(KEY, { exp }) });
  assert.equal((await c.publishBatch([['k', 'a']])).length, 1);
  assert.throws(() => new clarion.Client({ apiKey: 'a', token: 'b' }), TypeError);
});

test('401 Unauthorized: no key, a wrong key, a token signed with another key, an expired one', async () => {
  for (const options of [{}, { apiKey: 'wrong' }, { token: hs256('other', { exp: 2 ** 40 }) }, { token: hs256(KEY, { exp: 1 }) }]) {
    const c = new clarion.Client({ baseUrl: server.apiUrl, ...options });
    await assert.rejects(c.publish('k', 'x'), (e) => e instanceof clarion.Unauthorized && e.status === 401);
  }
});

test('400 BadRequest for topics, event names and batches', async () => {
  const c = server.client();
  await assert.rejects(c.publish('bad topic', 'x'), (e) => e instanceof clarion.BadRequest && /invalid topic/.test(e.serverMessage));
  await assert.rejects(c.publish('t', 'x', { event: 'no spaces' }), clarion.BadRequest);
  await assert.rejects(c.publishBatch([['ok', 'x'], ['not ok!', 'y']]), clarion.BadRequest);
});

test('a batch with a refused message publishes the other topics and says which (BatchPartlyRefused)', async () => {
  const c = server.client();
  await assert.rejects(
    c.publishBatch([['ok', 'x'], ['not ok!', 'y']]),
    (e) => e instanceof clarion.BatchPartlyRefused && e.status === 400 && typeof e.results[0].id === 'string' && e.results[1].status === 400,
  );
});

test('413 PayloadTooLarge, 414 and 431 RequestHeadTooLarge', async () => {
  const c = server.client();
  await assert.rejects(c.publish('t', 'x'.repeat(2000)), (e) => e instanceof clarion.PayloadTooLarge && e.status === 413);
  await assert.rejects(c.publish('t'.repeat(9000), 'x'), (e) => e instanceof clarion.RequestHeadTooLarge && e.status === 414);
  const headers = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`x-${i}`, 'v']));
  await assert.rejects(server.client({ headers }).publish('t', 'x'), (e) => e instanceof clarion.RequestHeadTooLarge && e.status === 431);
  assert.equal((await c.publish('t', 'x'.repeat(1000))).topic, 't');
});

test('404 NotFound for a wrong base URL', async () => {
  const c = new clarion.Client({ baseUrl: `${server.apiUrl}/nowhere`, apiKey: KEY });
  await assert.rejects(c.publish('t', 'x'), clarion.NotFound);
});

test('publishing to the client listener is NotFound, saying which listener to use', async () => {
  const c = new clarion.Client({ baseUrl: `http://${server.clients}`, apiKey: KEY });
  for (const publish of [() => c.publish('t', 'x'), () => c.publishBatch([['t', 'x']])]) {
    await assert.rejects(
      publish(),
      (e) => e instanceof clarion.NotFound && e.status === 404 && /this is the client listener/.test(e.serverMessage) && /api_listen/.test(e.serverMessage),
    );
  }
});

test('transport errors: refused, and a timeout', async () => {
  const held = [];
  const idle = net.createServer((s) => held.push(s)); // accepts, never answers
  await new Promise((r) => idle.listen(0, '127.0.0.1', r));
  const { port } = idle.address();
  try {
    await assert.rejects(new clarion.Client({ baseUrl: `http://127.0.0.1:${port}`, timeoutMs: 300 }).publish('t', 'x'), clarion.Timeout);
  } finally {
    idle.close();
    for (const s of held) s.destroy();
  }
  await new Promise((r) => setTimeout(r, 50));
  await assert.rejects(new clarion.Client({ baseUrl: `http://127.0.0.1:${port}` }).publish('t', 'x'), clarion.ConnectionFailed);
});

test('every documented status maps to its class', () => {
  const expected = {
    400: clarion.BadRequest,
    401: clarion.Unauthorized,
    403: clarion.Forbidden,
    404: clarion.NotFound,
    405: clarion.MethodNotAllowed,
    413: clarion.PayloadTooLarge,
    414: clarion.RequestHeadTooLarge,
    431: clarion.RequestHeadTooLarge,
    500: clarion.ServerError,
    503: clarion.Unavailable,
  };
  for (const [status, Cls] of Object.entries(expected)) {
    assert.equal(clarion.errorFor(Number(status), 'm').constructor, Cls);
  }
  assert.equal(clarion.errorFor(418, 'm').constructor, clarion.ApiError);
  assert.ok(new clarion.Timeout('t') instanceof clarion.TransportError);
});

test('a server that cannot start reports why', async () => {
  await assert.rejects(startServer({ args: ['--workers', 'nope'] }), (e) => e instanceof ServerStartError && /workers/.test(e.message));
});

test('503 Unavailable when every API connection is taken', async () => {
  // A server of its own: fetch's pool keeps alive connections to the shared one, which would
  // still be served.
  const own = await startServer();
  const [host, port] = [own.api.slice(0, own.api.lastIndexOf(':')), Number(own.api.slice(own.api.lastIndexOf(':') + 1))];
  const held = [];
  try {
    for (let i = 0; i < 256; i++) {
      const s = net.connect(port, host);
      s.on('error', () => {});
      held.push(s);
      await new Promise((resolve, reject) => {
        s.once('connect', resolve);
        s.once('error', reject);
      });
    }
    const c = own.client();
    const deadline = Date.now() + 10_000;
    for (;;) {
      try {
        await c.publish('t', 'x');
      } catch (e) {
        if (e instanceof clarion.Unavailable) {
          assert.match(e.serverMessage, /too many API connections/);
          break;
        }
        // The refusal may close the connection before fetch reads the answer.
        assert.ok(e instanceof clarion.ConnectionFailed, e);
      }
      assert.ok(Date.now() < deadline, 'no 503 with every API connection taken');
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    for (const s of held) s.destroy();
    await own.stop();
  }
});
