import type { ChildProcess } from 'node:child_process';
import type { Client, ClientOptions } from './index.js';

export declare const START_TIMEOUT_MS: number;
export declare const STOP_TIMEOUT_MS: number;

/** The server exited or printed no ready line in time; the message holds its stderr. */
export declare class ServerStartError extends Error {}

export interface StartOptions {
  /** More `clarion serve` flags, e.g. `['--api-key', 'secret']`. */
  args?: string[];
  /** Environment for the server (this process's CLARION_* variables are not passed on). */
  env?: Record<string, string>;
  /** The binary (default: findClarionBinary()). */
  binary?: string;
  /** Milliseconds to wait for the server to be ready (default 20 000). */
  startTimeoutMs?: number;
}

/** A running `clarion serve` on loopback ports. */
export declare class ClarionServer {
  readonly process: ChildProcess;
  /** HOST:PORT of the client listener. */
  readonly clients: string;
  /** HOST:PORT of the publish API. */
  readonly api: string;
  /** http://HOST:PORT of the publish API. */
  readonly apiUrl: string;
  /** The --api-key given, if any. */
  readonly apiKey: string | undefined;
  readonly running: boolean;
  url(path: string, topics?: string[], options?: { scheme?: string; query?: Record<string, string> }): string;
  wsUrl(...topics: string[]): string;
  client(options?: ClientOptions): Client;
  stderr(): string;
  /** SIGTERM, then SIGKILL after STOP_TIMEOUT_MS; resolves to the exit code. */
  stop(): Promise<number | null>;
}

/** Starts a server; resolves once both listeners are bound. */
export declare function startServer(options?: StartOptions): Promise<ClarionServer>;

/** Starts a server in node:test's `before` and stops it in `after`; `handle.server` is set then. */
export declare function useClarionServer(options?: StartOptions): Promise<{ server: ClarionServer | undefined }>;
