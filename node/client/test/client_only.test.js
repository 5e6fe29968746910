// @clarion/client installed on its own (packaging/test.sh runs this in a fresh npm project
// holding the client's tarball and `ws`): it brings no server and no other package, and a
// subscription receives what is published to a real server, over the WebSocket and over SSE.
// The server is the binary the `clarion` packages ship, named by CLARION_TEST_SERVER.
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { existsSync, readFileSync } from 'node:fs';
import WebSocket from 'ws';
import { ClarionClient } from '@clarion/client';

async function startServer() {
  const proc = spawn(process.env.CLARION_TEST_SERVER, ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0'], {
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  const [line] = await Promise.race([
    createInterface({ input: proc.stdout })[Symbol.asyncIterator]().next().then((r) => [r.value]),
    new Promise((_, fail) => setTimeout(() => fail(new Error('no ready line in 10 s')), 10000).unref()),
  ]);
  assert.match(line, /^clarion ready/);
  const fields = Object.fromEntries(line.split(' ').filter((p) => p.includes('=')).map((p) => p.split('=')));
  return { proc, clients: fields.clients, api: fields.api };
}

async function publish(api, topic, data) {
  const res = await fetch(`http://${api}/publish/${topic}`, { method: 'POST', body: data });
  assert.equal(res.status, 200);
  return (await res.json()).id;
}

test('the client package installs alone: no server, no dependencies', () => {
  const pkg = JSON.parse(readFileSync('node_modules/@clarion/client/package.json', 'utf8'));
  assert.equal(pkg.version, process.env.CLARION_EXPECTED_VERSION);
  assert.deepEqual(Object.keys(pkg.dependencies ?? {}), []);
  assert.ok(!existsSync('node_modules/clarion'), 'the server package came along');
  assert.ok(!existsSync('node_modules/@clarion/linux-x64'), 'the binary came along');
});

for (const transport of ['websocket', 'sse']) {
  test(`a ${transport} subscription receives what is published`, async (t) => {
    const { proc, clients, api } = await startServer();
    // Following from the first message's id makes the order of subscribe and publish moot.
    const since = await publish(api, 'orders', 'before');
    const url = transport === 'sse' ? `http://${clients}/sse` : `ws://${clients}/ws`;
    const client = new ClarionClient(url, { WebSocket, transport });
    t.after(async () => {
      client.close();
      proc.kill('SIGTERM');
      await new Promise((r) => proc.once('exit', r));
    });
    const got = new Promise((resolve) => client.subscribe('orders', { since, onMessage: resolve }));
    await publish(api, 'orders', 'after');
    const m = await Promise.race([got, new Promise((_, fail) => setTimeout(() => fail(new Error('nothing in 10 s')), 10000).unref())]);
    assert.equal(m.topic, 'orders');
    assert.equal(m.data, 'after');
  });
}
