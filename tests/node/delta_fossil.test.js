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
