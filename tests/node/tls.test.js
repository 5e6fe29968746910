// Clarion over TLS with the Node `ws` client: the certificate `clarion cert --dev` makes is
// trusted through `ca`, and messages arrive in order over wss://, compressed or not.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { binary, startServer, publish, stopAll, openWs: open } = require('./helpers');

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-node-tls-'));
after(() => {
  stopAll();
  fs.rmSync(dir, { recursive: true, force: true });
});
execFileSync(binary(), ['cert', '--dev', '--dir', dir]);
const ca = fs.readFileSync(path.join(dir, 'ca.pem'));

test('wss:// with the dev CA: messages arrive in order, with and without compression', async () => {
  const { api, tls } = await startServer([
    '--tls-listen', '127.0.0.1:0',
    '--tls-cert', path.join(dir, 'cert.pem'),
    '--tls-key', path.join(dir, 'key.pem'),
  ]);
  const port = tls.slice(tls.lastIndexOf(':') + 1);
  const url = `wss://localhost:${port}/ws?topic=secure`;
  const plain = await open(url, { ca, perMessageDeflate: false });
  const deflated = await open(url, { ca });
  assert.match(deflated._socket.getProtocol(), /TLSv1\.3/);
  assert.equal(deflated.extensions, 'permessage-deflate');
  const sent = [];
  for (let i = 0; i < 60; i++) {
    sent.push(`${i} `.padEnd(i % 3 === 0 ? 600 : 10, 'z'));
    assert.equal((await publish(api, 'secure', sent[i])).subscribers, 2);
  }
  for (const ws of [plain, deflated]) {
    for (let i = 0; i < sent.length; i++) assert.equal(await ws.next(), sent[i]);
    ws.close();
  }
});

test('an untrusted certificate is refused by the client, and the server carries on', async () => {
  const { api, tls } = await startServer([
    '--tls-listen', '127.0.0.1:0',
    '--tls-cert', path.join(dir, 'cert.pem'),
    '--tls-key', path.join(dir, 'key.pem'),
  ]);
  const port = tls.slice(tls.lastIndexOf(':') + 1);
  await assert.rejects(open(`wss://localhost:${port}/ws?topic=x`, {}), /self[- ]signed|unable to verify|local issuer/i);
  const ws = await open(`wss://localhost:${port}/ws?topic=x`, { ca });
  await publish(api, 'x', 'after the refusal');
  assert.equal(await ws.next(), 'after the refusal');
  ws.close();
});
