// The npm packages as a user installs them (packaging/test.sh installs the tarballs into a fresh
// directory, with --ignore-scripts, and runs these files there).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync, chmodSync, mkdtempSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { findClarionBinary } from 'clarion';
import { platformKey, platformPackage, unsupportedPlatform } from 'clarion/binary';

const require = createRequire(import.meta.url);
const bin = join(process.cwd(), 'node_modules', '.bin', 'clarion');

test('the clarion command runs the platform package binary', () => {
  const out = execFileSync(bin, ['--help'], { encoding: 'utf8', timeout: 30_000 });
  assert.match(out, /serve/);
  assert.match(out, /publish/);
  assert.equal(platformKey(), 'linux-x64');
  assert.match(findClarionBinary(), /node_modules\/@clarion\/linux-x64\/bin\/clarion$/);
});

test('npx clarion --version prints the package version, the workspace version', () => {
  const { version } = require('clarion/package.json');
  const out = execFileSync('npx', ['--no-install', 'clarion', '--version'], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(out.trim(), `clarion ${version}`);
  assert.equal(version, process.env.CLARION_EXPECTED_VERSION);
  assert.equal(require('@clarion/linux-x64/package.json').version, version);
});

test('arguments and exit status pass through the launcher', () => {
  const r = spawnSync(bin, ['no-such-subcommand'], { encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.status, 2); // clap's usage error
  assert.match(r.stderr, /no-such-subcommand/);
});

test('CLARION_BINARY_PATH overrides the binary; a wrong one is reported', () => {
  const dir = mkdtempSync(join(tmpdir(), 'clarion-override-'));
  const fake = join(dir, 'clarion');
  writeFileSync(fake, '#!/bin/sh\necho overridden "$@"\n');
  chmodSync(fake, 0o755);
  const env = { ...process.env, CLARION_BINARY_PATH: fake };
  assert.equal(execFileSync(bin, ['x'], { encoding: 'utf8', env }).trim(), 'overridden x');
  const r = spawnSync(bin, [], { encoding: 'utf8', env: { ...process.env, CLARION_BINARY_PATH: join(dir, 'none') } });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /CLARION_BINARY_PATH=.*does not exist/);
});

test('the typed entry points are in the package', () => {
  const pkg = JSON.parse(readFileSync(require.resolve('clarion/package.json'), 'utf8'));
  assert.equal(pkg.exports['.'].types, './index.d.ts');
  assert.match(readFileSync(require.resolve('clarion/package.json').replace('package.json', 'index.d.ts'), 'utf8'), /publish\(topic: string/);
  const v = pkg.version;
  assert.deepEqual(pkg.optionalDependencies, {
    '@clarion/linux-x64': v, '@clarion/linux-arm64': v, '@clarion/linux-x64-musl': v, '@clarion/linux-arm64-musl': v,
  });
  assert.equal(pkg.scripts?.postinstall, undefined); // nothing to run at install time
});

test('SIGTERM to the launcher stops the server it started', async () => {
  const { spawn } = await import('node:child_process');
  const child = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0'], {
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  const ready = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no ready line')), 20_000);
    child.stdout.once('data', (d) => {
      clearTimeout(timer);
      resolve(d.toString());
    });
  });
  const api = /api=(\S+)/.exec(ready)[1];
  child.kill('SIGTERM');
  const [code, signal] = await new Promise((resolve) => child.once('exit', (c, s) => resolve([c, s])));
  assert.ok(code === 0 || signal === 'SIGTERM', `exit ${code} ${signal}`);
  // The server itself is gone: its API no longer accepts connections.
  await assert.rejects(fetch(`http://${api}/healthz`, { signal: AbortSignal.timeout(5000) }));
});

test('SIGTERM to npm exec (npx) stops the launcher and the server it started', async () => {
  const { spawn } = await import('node:child_process');
  // npm runs the launcher through `sh -c`, and passes SIGTERM to neither.
  const npx = spawn('npx', ['--no-install', 'clarion', 'serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0'], {
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  const ready = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no ready line')), 60_000);
    npx.stdout.once('data', (d) => {
      clearTimeout(timer);
      resolve(d.toString());
    });
  });
  const api = /api=(\S+)/.exec(ready)[1];
  const launchers = () =>
    execFileSync('ps', ['-eo', 'pid=,args='], { encoding: 'utf8' })
      .split('\n')
      .filter((l) => l.includes('.bin/clarion serve') && l.includes('127.0.0.1:0'));
  assert.equal(launchers().length, 1, launchers().join('\n'));
  npx.kill('SIGTERM');
  // The server stops (its API refuses connections) and so does the launcher.
  const deadline = Date.now() + 15_000;
  for (;;) {
    const up = await fetch(`http://${api}/healthz`, { signal: AbortSignal.timeout(1000) }).then(() => true, () => false);
    if (!up && launchers().length === 0) break;
    assert.ok(Date.now() < deadline, `still running after SIGTERM to npx: api ${up}, ${launchers().join('; ')}`);
    await new Promise((r) => setTimeout(r, 200));
  }
});

test('other platforms than Linux x64/arm64 get a message naming the supported ones', () => {
  assert.equal(platformPackage('linux-x64'), '@clarion/linux-x64');
  assert.equal(platformPackage('linux-arm64-musl'), '@clarion/linux-arm64-musl');
  const mac = unsupportedPlatform('darwin-arm64').message;
  assert.match(mac, /no prebuilt binary for darwin-arm64: the supported platforms are .*\(linux-x64, linux-arm64, linux-x64-musl, linux-arm64-musl\)/);
  assert.match(mac, /CLARION_BINARY_PATH/);
});
