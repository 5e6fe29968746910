// Finds the clarion binary: $CLARION_BINARY_PATH, else the platform package for this machine.
//
// The binary ships in one package per platform (`@clarion/linux-x64`, ...), each limited by
// `os`/`cpu`/`libc` and listed in the main package's `optionalDependencies`: the package
// manager installs only the one matching this machine, and no install script is involved, so
// `--ignore-scripts` installs work. What can still go wrong is that the matching package is
// absent (optional dependencies omitted, a lockfile made on another platform, an unsupported
// platform); the error then says which package is missing and how to get it.

import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';

const require = createRequire(import.meta.url);

/** The environment variable that overrides the binary's path. */
export const BINARY_PATH_VARIABLE = 'CLARION_BINARY_PATH';

/** Platform packages that exist, by `${process.platform}-${process.arch}[-musl]`. */
const PACKAGES = {
  'linux-x64': '@clarion/linux-x64',
};

/** Whether this Linux runs musl (Alpine) rather than glibc. */
export function isMusl() {
  if (process.platform !== 'linux') return false;
  try {
    // Node's diagnostic report names the glibc it runs on; a musl build has none.
    const header = process.report?.getReport()?.header;
    return header ? !header.glibcVersionRuntime : false;
  } catch {
    return false;
  }
}

/** The key of this machine in PACKAGES. */
export function platformKey() {
  return `${process.platform}-${process.arch}${isMusl() ? '-musl' : ''}`;
}

/** The platform package this machine needs, or undefined when none is published. */
export function platformPackage(key = platformKey()) {
  return PACKAGES[key];
}

/** An error whose message tells the user what is missing and what to do. */
export class BinaryNotFoundError extends Error {
  constructor(message) {
    super(message);
    this.name = 'BinaryNotFoundError';
  }
}

/** The error for a platform without a published binary (a musl one gets its own advice). */
export function unsupportedPlatform(key) {
  const musl = key.endsWith('-musl')
    ? ' This is a musl system (Alpine, for example); the published binary needs glibc: use a' +
      ' glibc-based image (Debian, Ubuntu) or build clarion from source with cargo.'
    : '';
  return new BinaryNotFoundError(
    `clarion has no prebuilt binary for ${key} (available: ${Object.keys(PACKAGES).join(', ')}).` +
      `${musl} Set ${BINARY_PATH_VARIABLE} to a clarion binary built for this machine.`,
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
  const key = platformKey();
  const pkg = platformPackage(key);
  if (!pkg) throw unsupportedPlatform(key);
  let dir;
  try {
    dir = dirname(require.resolve(`${pkg}/package.json`));
  } catch {
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
  const path = join(dir, 'bin', 'clarion');
  if (!existsSync(path)) {
    throw new BinaryNotFoundError(`${pkg} is installed at ${dir} but has no bin/clarion`);
  }
  return path;
}
