// Clarion's delta encoders against a Fossil delta decoder nobody here wrote: the npm
// `fossil-delta` package applies every generated delta (random bytes, edits, JSON documents,
// UTF-8 text; both encoders) and must give the target byte for byte, checksum verified.
// The cases come from `cargo run --release -p clarion-proto --example delta_vectors`
// (DELTA_VECTORS_BIN to use a built one).
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..', '..');

function vectors(seed, count) {
  const built = process.env.DELTA_VECTORS_BIN;
  const out = built && fs.existsSync(built)
    ? execFileSync(built, [String(seed), String(count)], { maxBuffer: 1 << 28 })
    : execFileSync('cargo', ['run', '--release', '-q', '-p', 'clarion-proto', '--example', 'delta_vectors', '--',
      String(seed), String(count)], { cwd: root, maxBuffer: 1 << 28, stdio: ['ignore', 'pipe', 'inherit'] });
  return out.toString('utf8').trim().split('\n').map((l) => JSON.parse(l));
}

const b64 = (s) => new Uint8Array(Buffer.from(s, 'base64'));

test('fossil-delta applies every Clarion delta and gets the target byte for byte', async () => {
  const { applyDelta, getDeltaTargetSize } = await import('fossil-delta');
  const cases = vectors(51, 1000);
  assert.equal(cases.length, 2000, 'both encoders, 1,000 pairs');
  let spliceBytes = 0;
  let blockBytes = 0;
  for (const [i, c] of cases.entries()) {
    const base = b64(c.base);
    const target = b64(c.target);
    const delta = b64(c.delta);
    assert.equal(getDeltaTargetSize(delta), target.length, `case ${i} (${c.encoder}): declared size`);
    const out = applyDelta(base, delta, { verifyChecksum: true });
    assert.deepEqual(Buffer.from(out), Buffer.from(target), `case ${i} (${c.encoder})`);
    if (c.encoder === 'block') blockBytes += delta.length; else spliceBytes += delta.length;
  }
  // Pins that the block matcher did find copies the splice cannot (so its commands were used).
  assert.ok(blockBytes < spliceBytes * 0.8, `block ${blockBytes} vs splice ${spliceBytes}`);
});

test('fossil-delta refuses a Clarion delta applied to the wrong base (the checksum catches it)', async () => {
  const { applyDelta } = await import('fossil-delta');
  const cases = vectors(7, 200).filter((c) => c.encoder === 'block');
  let refused = 0;
  for (const c of cases) {
    const base = b64(c.base);
    const target = b64(c.target);
    if (base.length < 16 || Buffer.from(base).equals(Buffer.from(target))) continue;
    const wrong = base.slice();
    // Flip a byte every delta copies from: the middle of the longest common prefix is not always
    // copied, so flip every byte in turn until one copied byte changes the output.
    for (let k = 0; k < wrong.length; k++) wrong[k] ^= 0x01;
    let out;
    try {
      out = applyDelta(wrong, b64(c.delta), { verifyChecksum: true });
    } catch {
      refused++;
      continue;
    }
    // Only a delta that copies nothing applies to any base.
    assert.deepEqual(Buffer.from(out), Buffer.from(target));
  }
  assert.ok(refused > cases.length / 2, `refused ${refused} of ${cases.length}`);
});

// Deltas taken off a live server: a `clarion.v1` subscriber with `delta=1` (and
// permessage-deflate, which `ws` negotiates) gets a full order book, then deltas that
// fossil-delta applies to the previous message; the subscriber client (`node/client`) applies
// them too and delivers whole messages; and on a delta that does not apply it resubscribes.
const { startServer, publish, stopAll, openWs, waitFor } = require('./helpers');
const WebSocket = require('ws');

const clientModule = path.resolve(root, 'node', 'client', 'index.js');

function books(n) {
  let x = 7;
  const rnd = () => ((x = (x * 1103515245 + 12345) % 2147483648) / 2147483648);
  const side = (p0, s) => Array.from({ length: 40 }, (_, i) => [Math.round((p0 + s * i * 0.05) * 100) / 100, 1 + Math.floor(rnd() * 500)]);
  const b = { symbol: 'BTC-USD', seq: 0, bids: side(100, -1), asks: side(100.05, 1) };
  const out = [];
  for (let i = 0; i < n; i++) {
    b.seq = i;
    for (let k = 0; k < 4; k++) (rnd() < 0.5 ? b.bids : b.asks)[Math.floor(rnd() * 40)][1] = 1 + Math.floor(rnd() * 500);
    out.push(JSON.stringify(b));
  }
  return out;
}

test.after(stopAll);

test('fossil-delta applies the deltas a live server sends (clarion.v1 with permessage-deflate)', async () => {
  const { applyDelta } = await import('fossil-delta');
  const client = await import(clientModule);
  const s = await startServer(['--delta-topics', 'book.*']);
  const ws = await openWs(`ws://${s.clients}/ws?topic=book.js&delta=1`, 'clarion.v1');
  assert.match(ws.extensions, /permessage-deflate/);
  const msgs = books(6);
  for (const m of msgs) await publish(s.api, 'book.js', m);
  let prev = null;
  let prevId = null;
  const kinds = [];
  for (const want of msgs) {
    const m = JSON.parse(await ws.next());
    let text = m.data;
    if (m.delta !== undefined) {
      assert.equal(m.delta, prevId);
      const delta = new Uint8Array(Buffer.from(m.data, 'utf8'));
      text = Buffer.from(applyDelta(prev, delta, { verifyChecksum: true })).toString('utf8');
      // The subscriber client's own decoder agrees byte for byte.
      assert.equal(Buffer.from(client.applyDelta(prev, delta)).toString('utf8'), text);
      kinds.push('delta');
    } else kinds.push('full');
    assert.equal(text, want);
    prev = new Uint8Array(Buffer.from(text, 'utf8'));
    prevId = m.id;
  }
  assert.deepEqual(kinds, ['full', 'delta', 'delta', 'delta', 'delta', 'delta']);
  ws.close();
});

test('the subscriber client delivers whole messages from deltas, over WebSocket and SSE', async () => {
  const { ClarionClient } = await import(clientModule);
  const s = await startServer(['--delta-topics', 'book.*']);
  const msgs = books(5);
  for (const transport of ['websocket', 'sse']) {
    const topic = `book.${transport}`;
    const c = new ClarionClient(`ws://${s.clients}/ws`, { WebSocket, transport });
    const got = [];
    const errors = [];
    c.on('error', (e) => errors.push(e));
    const sub = c.subscribe(topic, { delta: true, onMessage: (m) => got.push(m.data) });
    await waitFor(() => sub.state === 'subscribed', 10000, `${transport} subscribed`);
    for (const m of msgs) await publish(s.api, topic, m);
    await waitFor(() => got.length === msgs.length, 10000, `${transport} messages`);
    c.close();
    assert.deepEqual(got, msgs, transport);
    assert.equal(sub.deltaFailures, 0, JSON.stringify(errors));
  }
});

test('the subscriber client never delivers a delta that does not apply: it resubscribes from its last message', async () => {
  const { ClarionClient } = await import(clientModule);
  const good = 'H\n6@0,6:there 5@6,OPwXW;'; // "hello world" -> "hello there world"
  const seen = [];
  const wss = new WebSocket.Server({ host: '127.0.0.1', port: 0, handleProtocols: () => 'clarion.v1' });
  wss.on('connection', (ws) => ws.on('message', (raw) => {
    const m = JSON.parse(raw.toString());
    seen.push(m);
    if (m.type !== 'subscribe') return;
    const send = (x) => ws.send(JSON.stringify(x));
    send({ type: 'subscribed', topic: 't' });
    if (seen.filter((x) => x.type === 'subscribe').length === 1) {
      send({ type: 'message', topic: 't', id: 'e-1', data: 'hello world' });
      send({ type: 'message', topic: 't', id: 'e-2', delta: 'e-1', data: good.replace('OPwXW', 'OPwXX') });
    } else {
      send({ type: 'message', topic: 't', id: 'e-2', data: 'hello there world' });
    }
  }));
  await new Promise((r) => wss.once('listening', r));
  const c = new ClarionClient(`ws://127.0.0.1:${wss.address().port}/ws`, { WebSocket });
  const got = [];
  const errors = [];
  c.on('error', (e) => errors.push(e.kind));
  const sub = c.subscribe('t', { delta: true, onMessage: (m) => got.push([m.id, m.data]) });
  await waitFor(() => got.length === 2, 10000, 'two messages');
  c.close();
  wss.close();
  assert.deepEqual(got, [['e-1', 'hello world'], ['e-2', 'hello there world']]);
  assert.equal(sub.deltaFailures, 1);
  assert.deepEqual(errors, ['delta']);
  assert.deepEqual(seen.map((m) => [m.type, m.since, m.delta]), [
    ['subscribe', undefined, true],
    ['unsubscribe', undefined, undefined],
    ['subscribe', 'e-1', true],
  ]);
});
