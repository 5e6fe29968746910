// Which platform package the `clarion` launcher runs, for every machine it may meet, without
// installing anything: the facts (platform, arch, Node's report header, files on disk) and the
// installed packages are given to locateBinary(). Fast: CI runs it (node --test node/test/unit).
// packaging/test.sh runs the binary each choice names, under its arch.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  PACKAGES,
  detectLibc,
  locateBinary,
  platformKey,
  platformPackage,
  unsupportedPlatform,
} from '../../clarion/lib/binary.js';

const GLIBC = { glibcVersionRuntime: '2.36' };
const MUSL = {}; // Node built for musl: a report header without a glibc version
const none = () => false;
const facts = (platform, arch, header, exists = none) => ({ platform, arch, header, exists });
// Every platform package installed, each under node_modules/<name>, each with its bin/clarion.
const all = (pkg) => `/app/node_modules/${pkg}`;
const only = (...pkgs) => (pkg) => (pkgs.includes(pkg) ? all(pkg) : undefined);
const yes = () => true;

for (const [arch, header, pkg] of [
  ['x64', GLIBC, '@clarion/linux-x64'],
  ['arm64', GLIBC, '@clarion/linux-arm64'],
  ['x64', MUSL, '@clarion/linux-x64-musl'],
  ['arm64', MUSL, '@clarion/linux-arm64-musl'],
]) {
  const libc = header === GLIBC ? 'glibc' : 'musl';
  test(`linux ${arch} ${libc} runs ${pkg}`, () => {
    const f = facts('linux', arch, header);
    assert.equal(detectLibc(f), libc);
    assert.equal(platformPackage(platformKey(f)), pkg);
    assert.equal(locateBinary(f, all, yes), `/app/node_modules/${pkg}/bin/clarion`);
  });
}

test('without a report, the loaders decide; a musl loader beside glibc is still glibc', () => {
  const on = (...paths) => (p) => paths.includes(p);
  // Alpine: only musl's loader.
  assert.equal(detectLibc(facts('linux', 'x64', undefined, on('/lib/ld-musl-x86_64.so.1'))), 'musl');
  assert.equal(detectLibc(facts('linux', 'arm64', undefined, on('/lib/ld-musl-aarch64.so.1'))), 'musl');
  // Debian with musl-tools installed: both loaders.
  const debian = on('/lib/ld-musl-x86_64.so.1', '/lib64/ld-linux-x86-64.so.2');
  assert.equal(detectLibc(facts('linux', 'x64', undefined, debian)), 'glibc');
  assert.equal(detectLibc(facts('linux', 'arm64', undefined, on('/lib/ld-linux-aarch64.so.1'))), 'glibc');
  // Nothing known: glibc, the common case (its package falls back to the static one anyway).
  assert.equal(detectLibc(facts('linux', 'x64', undefined, none)), 'glibc');
  assert.equal(detectLibc(facts('darwin', 'arm64', undefined, yes)), null);
});

test('the report wins over the loaders on disk', () => {
  assert.equal(detectLibc(facts('linux', 'x64', GLIBC, (p) => p.includes('musl'))), 'glibc');
  assert.equal(detectLibc(facts('linux', 'x64', MUSL, (p) => p.includes('linux-x86-64'))), 'musl');
});

test('on glibc without its package, the static musl binary of the same arch runs', () => {
  for (const arch of ['x64', 'arm64']) {
    const musl = `@clarion/linux-${arch}-musl`;
    assert.equal(locateBinary(facts('linux', arch, GLIBC), only(musl), yes), `/app/node_modules/${musl}/bin/clarion`);
  }
});

test('on musl, the glibc package is never run', () => {
  assert.throws(
    () => locateBinary(facts('linux', 'x64', MUSL), only('@clarion/linux-x64', '@clarion/linux-arm64-musl'), yes),
    { name: 'BinaryNotFoundError', message: /\(linux-x64-musl\) comes in the package @clarion\/linux-x64-musl, which is not installed/ },
  );
});

test('a missing platform package is named, with how to get it', () => {
  for (const [arch, header, pkg] of [
    ['x64', GLIBC, '@clarion/linux-x64'],
    ['arm64', GLIBC, '@clarion/linux-arm64'],
    ['arm64', MUSL, '@clarion/linux-arm64-musl'],
  ]) {
    assert.throws(() => locateBinary(facts('linux', arch, header), only('@clarion/client'), yes), (e) => {
      assert.equal(e.name, 'BinaryNotFoundError');
      assert.ok(e.message.includes(`comes in the package ${pkg}, which is not installed`), e.message);
      assert.match(e.message, /npm --omit=optional/);
      assert.ok(e.message.includes(`npm install ${pkg}`), e.message);
      return true;
    });
  }
  // Installed but empty (a broken unpack): said so, not run.
  assert.throws(() => locateBinary(facts('linux', 'x64', GLIBC), all, none), /@clarion\/linux-x64 is installed at .* but has no bin\/clarion/);
});

test('unsupported platforms get an error naming the supported ones', () => {
  const supported = 'linux-x64, linux-arm64, linux-x64-musl, linux-arm64-musl';
  assert.deepEqual(Object.keys(PACKAGES).join(', '), supported);
  for (const [platform, arch, header, key] of [
    ['darwin', 'arm64', undefined, 'darwin-arm64'],
    ['darwin', 'x64', undefined, 'darwin-x64'],
    ['win32', 'x64', undefined, 'win32-x64'],
    ['linux', 'ia32', GLIBC, 'linux-ia32'],
    ['linux', 'arm', MUSL, 'linux-arm-musl'],
    ['freebsd', 'x64', undefined, 'freebsd-x64'],
  ]) {
    const f = facts(platform, arch, header);
    assert.equal(platformKey(f), key);
    assert.equal(platformPackage(key), undefined);
    assert.throws(() => locateBinary(f, all, yes), (e) => {
      assert.equal(e.name, 'BinaryNotFoundError');
      assert.ok(e.message.includes(`no prebuilt binary for ${key}`), e.message);
      assert.ok(e.message.includes(`(${supported})`), e.message);
      assert.match(e.message, /CLARION_BINARY_PATH/);
      return true;
    });
  }
  // Keys are not looked up through the prototype.
  assert.equal(platformPackage('constructor'), undefined);
  assert.match(unsupportedPlatform('linux-ppc64').message, /Linux on x64 and arm64, with glibc or musl/);
});

test('this machine has a key and, on Linux x64/arm64, a package', () => {
  const key = platformKey();
  assert.match(key, /^[a-z0-9]+-[a-z0-9]+(-musl)?$/);
  if (process.platform === 'linux' && ['x64', 'arm64'].includes(process.arch)) assert.ok(platformPackage(key));
});
