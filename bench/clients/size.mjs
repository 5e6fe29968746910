// Browser bundle size of @clarion/client beside centrifuge-js and pusher-js, measured the same
// way for all three: esbuild bundles `import * as lib from PACKAGE` for the browser (ESM,
// minified, everything the import pulls in), then gzip -9. Prints a Markdown table.
//
//   cd bench/clients && npm ci && node size.mjs
import { build } from 'esbuild';
import { gzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import fs from 'node:fs';

const here = path.dirname(fileURLToPath(import.meta.url));
const version = (name) => JSON.parse(fs.readFileSync(path.join(here, 'node_modules', name, 'package.json'))).version;

const rows = [
  ['@clarion/client (this repository)', path.resolve(here, '../../node/client/index.js'), 'ClarionClient'],
  [`centrifuge ${version('centrifuge')}`, 'centrifuge', 'Centrifuge'],
  [`pusher-js ${version('pusher-js')}`, 'pusher-js', 'default'],
];

console.log('| client | minified | minified + gzip -9 |');
console.log('|---|---|---|');
for (const [name, entry, used] of rows) {
  // Uses the main class, so a bundler keeps everything a real app pulls in.
  const contents = `import * as lib from ${JSON.stringify(entry)}; globalThis.__used = lib[${JSON.stringify(used)}];`;
  const out = await build({
    stdin: { contents, resolveDir: here, loader: 'js' },
    bundle: true,
    minify: true,
    format: 'esm',
    platform: 'browser',
    target: 'es2020',
    write: false,
    logLevel: 'error',
  });
  const code = out.outputFiles[0].contents;
  const gz = gzipSync(code, { level: 9 }).length;
  console.log(`| ${name} | ${(code.length / 1024).toFixed(1)} KB | ${(gz / 1024).toFixed(2)} KB |`);
}
