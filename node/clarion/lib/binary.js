// Finds the clarion binary: $CLARION_BINARY_PATH, else the platform package for this machine.
//
// The binary ships in one package per platform (PACKAGES below), each limited by `os`/`cpu`/
// `libc` and listed in the main package's `optionalDependencies`: the package manager installs
// only the one matching this machine, and no install script is involved, so `--ignore-scripts`
// installs work. What can still go wrong is that the matching package is absent (optional
// dependencies omitted, a lockfile made on another platform, an unsupported platform); the
// error then says which package is missing and how to get it.
//
// The choice (docs/packaging.md, "Which npm package runs"): Linux only; `process.arch` x64 or
// arm64; the C library from Node's diagnostic report (`header.glibcVersionRuntime` present:
// glibc; a report without it: musl, as Node built for Alpine reports no glibc); only when no
// report can be had, the loaders on disk (a musl loader and no glibc loader: musl). A musl
// loader alone proves nothing: Debian's musl-tools installs one beside glibc. The musl binaries
// are static, so on glibc the musl package is the fallback when the glibc one is absent (npm
// before 10.4 ignores `libc` and may install both; a user may add only the static one).

import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';

const require = createRequire(import.meta.url);

/** The environment variable that overrides the binary's path. */
export const BINARY_PATH_VARIABLE = 'CLARION_BINARY_PATH';

/** Platform packages that exist, by `${process.platform}-${process.arch}[-musl]`. */
export const PACKAGES = Object.freeze({
  'linux-x64': '@clarion/linux-x64',
  'linux-arm64': '@clarion/linux-arm64',
  'linux-x64-musl': '@clarion/linux-x64-musl',
  'linux-arm64-musl': '@clarion/linux-arm64-musl',
});

/** The dynamic loaders by arch: glibc's and musl's (their presence is the last resort). */
const LOADERS = {
  x64: { glibc: ['/lib64/ld-linux-x86-64.so.2', '/lib/ld-linux-x86-64.so.2'], musl: ['/lib/ld-musl-x86_64.so.1'] },
  arm64: { glibc: ['/lib/ld-linux-aarch64.so.1', '/lib64/ld-linux-aarch64.so.1'], musl: ['/lib/ld-musl-aarch64.so.1'] },
};

/** Node's diagnostic report header, without the slow network part; undefined when unavailable. */
function reportHeader() {
  try {
    const report = process.report;
    if (!report) return undefined;
    if (!('excludeNetwork' in report)) return report.getReport()?.header;
    // The network part can take seconds (reverse lookups); the caller's setting is restored.
    const saved = report.excludeNetwork;
    report.excludeNetwork = true;
    try {
      return report.getReport()?.header;
    } finally {
      report.excludeNetwork = saved;
    }
  } catch {
    return undefined;
  }
}

/** The facts the choice depends on, read from this process and machine. */
export function currentFacts() {
  return { platform: process.platform, arch: process.arch, header: reportHeader(), exists: existsSync };
}

/**
 * The C library of a Linux machine: 'glibc' or 'musl' (null off Linux).
 * @param facts `{ platform, arch, header, exists }`: the report header (undefined when no report
 *   could be had) and a function telling whether a path exists.
 */
export function detectLibc(facts = currentFacts()) {
  if (facts.platform !== 'linux') return null;
  if (facts.header) return facts.header.glibcVersionRuntime ? 'glibc' : 'musl';
  const loaders = LOADERS[facts.arch];
  if (!loaders) return 'glibc';
  const any = (paths) => paths.some((p) => facts.exists(p));
  return any(loaders.musl) && !any(loaders.glibc) ? 'musl' : 'glibc';
}

/** Whether this Linux runs musl (Alpine) rather than glibc. */
export function isMusl() {
  return detectLibc() === 'musl';
}

/** The key of a machine in PACKAGES (of this one by default). */
export function platformKey(facts = currentFacts()) {
  return `${facts.platform}-${facts.arch}${detectLibc(facts) === 'musl' ? '-musl' : ''}`;
}

/** The platform package a machine needs, or undefined when none is published. */
export function platformPackage(key = platformKey()) {
  return Object.hasOwn(PACKAGES, key) ? PACKAGES[key] : undefined;
}

/** The packages that can serve a key, best first: its own, then on glibc the static musl one. */
export function candidatePackages(key) {
  const own = platformPackage(key);
  if (!own) return [];
  const musl = platformPackage(`${key}-musl`);
  return musl && !key.endsWith('-musl') ? [own, musl] : [own];
}

/** An error whose message tells the user what is missing and what to do. */
export class BinaryNotFoundError extends Error {
  constructor(message) {
    super(message);
    this.name = 'BinaryNotFoundError';
  }
}

/** The error for a platform without a published binary: it names the supported ones. */
export function unsupportedPlatform(key) {
  return new BinaryNotFoundError(
    `clarion has no prebuilt binary for ${key}: the supported platforms are Linux on x64 and ` +
      `arm64, with glibc or musl (${Object.keys(PACKAGES).join(', ')}). Build clarion from ` +
      `source with cargo and set ${BINARY_PATH_VARIABLE} to the binary, or run it in a Linux ` +
      `container.`,
  );
}

/** The directory of an installed package, or undefined when it is not installed. */
function resolvePackageDir(pkg) {
  try {
    return dirname(require.resolve(`${pkg}/package.json`));
  } catch {
    return undefined;
  }
}

/**
 * The binary for a machine described by `facts`, looked up with `resolve` (package name to its
 * directory, or undefined) and `exists`. findClarionBinary() is this for the running machine.
 * @throws {BinaryNotFoundError}
 */
export function locateBinary(facts = currentFacts(), resolve = resolvePackageDir, exists = existsSync) {
  const key = platformKey(facts);
  const candidates = candidatePackages(key);
  if (candidates.length === 0) throw unsupportedPlatform(key);
  for (const pkg of candidates) {
    const dir = resolve(pkg);
    if (dir === undefined) continue;
    const path = join(dir, 'bin', 'clarion');
    if (!exists(path)) {
      throw new BinaryNotFoundError(`${pkg} is installed at ${dir} but has no bin/clarion`);
    }
    return path;
  }
  const pkg = candidates[0];
  throw new BinaryNotFoundError(
    `the clarion binary for this platform (${key}) comes in the package ${pkg}, which is not ` +
      `installed. It is an optional dependency of clarion, so it is skipped when optional ` +
      `dependencies are omitted (npm --omit=optional, --no-optional) or when the lockfile was ` +
      `made on another platform and lacks it. Reinstall with optional dependencies ` +
      `(npm install, or delete package-lock.json and node_modules and install again on this ` +
      `platform), add it explicitly (npm install ${pkg}), or set ${BINARY_PATH_VARIABLE} to a ` +
      `clarion binary.`,
  );
}

/**
 * The absolute path of the clarion binary.
 * @throws {BinaryNotFoundError} when no binary can be found.
 */
export function findClarionBinary() {
  const override = process.env[BINARY_PATH_VARIABLE];
  if (override) {
    if (!existsSync(override)) {
      throw new BinaryNotFoundError(`${BINARY_PATH_VARIABLE}=${override} does not exist`);
    }
    return override;
  }
  return locateBinary();
}
