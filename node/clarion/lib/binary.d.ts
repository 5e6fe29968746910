/** The environment variable that overrides the binary's path: `CLARION_BINARY_PATH`. */
export declare const BINARY_PATH_VARIABLE: 'CLARION_BINARY_PATH';
/** The platform packages, by platform key (`linux-x64`, `linux-arm64`, `linux-x64-musl`, `linux-arm64-musl`). */
export declare const PACKAGES: Readonly<Record<string, string>>;
/** What the choice of binary depends on (currentFacts() reads them from this machine). */
export interface PlatformFacts {
  /** `process.platform`. */
  platform: string;
  /** `process.arch`. */
  arch: string;
  /** The diagnostic report's header (`glibcVersionRuntime` on glibc); undefined without a report. */
  header?: { glibcVersionRuntime?: string } | undefined;
  /** Whether a path exists (used for the loaders only when there is no report). */
  exists: (path: string) => boolean;
}
/** The facts of the running process and machine. */
export declare function currentFacts(): PlatformFacts;
/** The C library of a Linux machine, `'glibc'` or `'musl'`; null off Linux. */
export declare function detectLibc(facts?: PlatformFacts): 'glibc' | 'musl' | null;
/** Whether this Linux runs musl (Alpine) rather than glibc. */
export declare function isMusl(): boolean;
/** `${platform}-${arch}`, with `-musl` on musl Linux (this machine's by default). */
export declare function platformKey(facts?: PlatformFacts): string;
/** The npm package holding the binary for a platform key, if one is published. */
export declare function platformPackage(key?: string): string | undefined;
/** The packages that can serve a key, best first (on glibc, the static musl one second). */
export declare function candidatePackages(key: string): string[];
/** No binary: the message names the missing platform package and what to do. */
export declare class BinaryNotFoundError extends Error {}
/** The error for a platform without a published binary: it names the supported ones. */
export declare function unsupportedPlatform(key: string): BinaryNotFoundError;
/** The binary for the machine `facts` describe, found with `resolve` (package name to directory). */
export declare function locateBinary(
  facts?: PlatformFacts,
  resolve?: (pkg: string) => string | undefined,
  exists?: (path: string) => boolean,
): string;
/** The absolute path of the clarion binary ($CLARION_BINARY_PATH, else the platform package). */
export declare function findClarionBinary(): string;
