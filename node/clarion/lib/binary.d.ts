/** The environment variable that overrides the binary's path: `CLARION_BINARY_PATH`. */
export declare const BINARY_PATH_VARIABLE: 'CLARION_BINARY_PATH';
/** Whether this Linux runs musl (Alpine) rather than glibc. */
export declare function isMusl(): boolean;
/** `${process.platform}-${process.arch}`, with `-musl` on musl Linux. */
export declare function platformKey(): string;
/** The npm package holding the binary for a platform key, if one is published. */
export declare function platformPackage(key?: string): string | undefined;
/** No binary: the message names the missing platform package and what to do. */
export declare class BinaryNotFoundError extends Error {}
/** The error for a platform without a published binary (musl gets its own advice). */
export declare function unsupportedPlatform(key: string): BinaryNotFoundError;
/** The absolute path of the clarion binary ($CLARION_BINARY_PATH, else the platform package). */
export declare function findClarionBinary(): string;
