// Delta messages (docs/delta.md): applying a Fossil-format delta to the previous message of a
// topic, refusing any delta that does not produce exactly the target it describes.

// Copies use `Uint8Array.set` (the npm fossil-delta package copies byte by byte).
const DIGITS = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~';
const DIGIT = new Int8Array(128).fill(-1);
for (let i = 0; i < DIGITS.length; i++) DIGIT[DIGITS.charCodeAt(i)] = i;
export const utf8 = new TextEncoder();
export const fromUtf8 = new TextDecoder('utf-8', { fatal: true });

/** The target `delta` (bytes) makes of `base` (bytes); throws when it does not apply (a
 * malformed delta, one for another base, a checksum mismatch): never a wrong message. */
export function applyDelta(base, delta, limit = 64 << 20) {
  let pos = 0;
  const int = () => {
    const start = pos;
    let v = 0;
    while (pos < delta.length && delta[pos] < 128 && DIGIT[delta[pos]] >= 0) {
      v = v * 64 + DIGIT[delta[pos++]];
    }
    if (pos === start || v > 0xffffffff) throw new Error('bad integer in delta');
    return v;
  };
  const op = () => {
    if (pos >= delta.length) throw new Error('delta ends before its terminator');
    return delta[pos++];
  };
  const size = int();
  if (op() !== 10) throw new Error('bad delta header');
  if (size > limit) throw new Error(`delta target of ${size} bytes over the limit`);
  const out = new Uint8Array(size);
  let at = 0;
  for (;;) {
    const n = int();
    const c = op();
    if (c === 64 /* @ */) {
      const from = int();
      if (op() !== 44 /* , */) throw new Error('bad copy command');
      if (from + n > base.length) throw new Error('copy reads past the end of the base');
      if (at + n > size) throw new Error('delta writes past its declared size');
      out.set(base.subarray(from, from + n), at);
      at += n;
    } else if (c === 58 /* : */) {
      if (pos + n > delta.length) throw new Error('insert runs past the end of the delta');
      if (at + n > size) throw new Error('delta writes past its declared size');
      out.set(delta.subarray(pos, pos + n), at);
      at += n;
      pos += n;
    } else if (c === 59 /* ; */) {
      if (at !== size) throw new Error('delta output is shorter than its declared size');
      if (checksum(out) !== n) throw new Error('delta checksum mismatch');
      if (pos !== delta.length) throw new Error('bytes after the delta terminator');
      return out;
    } else throw new Error(`unexpected byte ${c} in delta`);
  }
}

// The sum modulo 2^32 of the bytes read as big-endian 32-bit words, zero-padded.
// Whole words are read with a DataView (a third of the byte-by-byte loop's time on a 2 KB message).
function checksum(b) {
  let sum = 0;
  const whole = b.length - (b.length % 4);
  const words = new DataView(b.buffer, b.byteOffset, whole);
  for (let i = 0; i < whole; i += 4) sum = (sum + words.getUint32(i)) >>> 0;
  let last = 0;
  for (let i = whole, shift = 24; i < b.length; i++, shift -= 8) last |= b[i] << shift;
  return (sum + (last >>> 0)) >>> 0;
}

export function fromBase64(text) {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

