// Runs a real Clarion server in a test suite, on free loopback ports (port 0, chosen by the
// kernel). `startServer()` resolves once the binary printed `clarion ready clients=ADDR
// api=ADDR`, i.e. both listeners are bound. With node:test:
//
//   import { before, after } from 'node:test';
//   import { startServer } from 'clarion/testing';
//   let server;
//   before(async () => { server = await startServer(); });
//   after(() => server.stop());

import { spawn } from 'node:child_process';
import { Client } from './index.js';
import { findClarionBinary } from './lib/binary.js';

/** Milliseconds startServer waits for the ready line. */
export const START_TIMEOUT_MS = 20_000;
/** Milliseconds stop() waits after SIGTERM before SIGKILL. */
export const STOP_TIMEOUT_MS = 10_000;

/** The server exited or printed no ready line in time; the message holds its stderr. */
export class ServerStartError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ServerStartError';
  }
}

function flagValue(args, flag) {
  for (let i = 0; i < args.length; i++) {
    if (args[i] === flag && i + 1 < args.length) return args[i + 1];
    if (args[i].startsWith(`${flag}=`)) return args[i].slice(flag.length + 1);
  }
  return undefined;
}

/** A running `clarion serve`. */
export class ClarionServer {
  constructor(child, fields, apiKey, stderr) {
    this.process = child;
    this.clients = fields.clients;
    this.api = fields.api;
    this.apiUrl = `http://${fields.api}`;
    this.apiKey = apiKey;
    this._stderr = stderr;
    this._exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      else child.once('exit', () => resolve());
    });
  }

  /** A client-listener URL: url('/sse', ['news']) is http://HOST:PORT/sse?topic=news. */
  url(path, topics = [], { scheme = 'http', query = {} } = {}) {
    const params = new URLSearchParams();
    for (const t of topics) params.append('topic', t);
    for (const [k, v] of Object.entries(query)) params.append(k, v);
    const qs = params.toString();
    return `${scheme}://${this.clients}${path}${qs ? `?${qs}` : ''}`;
  }

  /** ws://HOST:PORT/ws?topic=... */
  wsUrl(...topics) {
    return this.url('/ws', topics, { scheme: 'ws' });
  }

  /** A publish Client for this server (with its --api-key, if any). */
  client(options = {}) {
    return new Client({ baseUrl: this.apiUrl, apiKey: this.apiKey, ...options });
  }

  /** Everything the server wrote to stderr so far. */
  stderr() {
    return this._stderr.join('');
  }

  /** Whether the process is still alive. */
  get running() {
    return this.process.exitCode === null && this.process.signalCode === null;
  }

  /** Stops the server (SIGTERM, then SIGKILL after STOP_TIMEOUT_MS); harmless twice. */
  async stop() {
    if (this.running) {
      this.process.kill('SIGTERM');
      let timer;
      const killed = new Promise((resolve) => {
        timer = setTimeout(() => {
          this.process.kill('SIGKILL');
          resolve();
        }, STOP_TIMEOUT_MS);
      });
      await Promise.race([this._exited, killed]);
      clearTimeout(timer);
    }
    await this._exited;
    return this.process.exitCode;
  }
}

/**
 * Starts `clarion serve` on loopback ports 0 with more `args`; resolves to a ClarionServer.
 * CLARION_* variables of this process are not passed on (they would silently change the server
 * under test); give them in `env`.
 */
export function startServer({ args = [], env = {}, binary, startTimeoutMs = START_TIMEOUT_MS } = {}) {
  const childEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CLARION_')));
  Object.assign(childEnv, env);
  const bin = binary ?? findClarionBinary();
  const child = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0', ...args], {
    env: childEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const stderr = [];
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d) => stderr.push(d));
  const apiKey = flagValue(args, '--api-key') ?? env.CLARION_API_KEY;
  return new Promise((resolve, reject) => {
    let out = '';
    let settled = false;
    const fail = (why) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      child.kill('SIGKILL');
      // Give stderr a moment to arrive so the error says why.
      setTimeout(() => reject(new ServerStartError(`${why}\n${stderr.join('')}`)), 50);
    };
    const timer = setTimeout(() => fail(`no ready line after ${startTimeoutMs} ms`), startTimeoutMs);
    child.on('error', (e) => fail(`cannot run ${bin}: ${e.message}`));
    child.on('exit', (code, signal) => fail(`clarion serve exited (${signal ?? code})`));
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (d) => {
      if (settled) return; // later output is read and dropped, so the pipe never fills
      out += d;
      const nl = out.indexOf('\n');
      if (nl < 0) return;
      const line = out.slice(0, nl);
      if (!line.startsWith('clarion ready')) return fail(`unexpected first line ${JSON.stringify(line)}`);
      settled = true;
      clearTimeout(timer);
      const fields = Object.fromEntries(
        line
          .split(/\s+/)
          .slice(2)
          .filter((p) => p.includes('='))
          .map((p) => [p.slice(0, p.indexOf('=')), p.slice(p.indexOf('=') + 1)]),
      );
      resolve(new ClarionServer(child, fields, apiKey, stderr));
    });
  });
}

/**
 * Registers a server for the current node:test suite: started in `before`, stopped in `after`.
 * Returns an object whose `server` property is set once it runs.
 */
export async function useClarionServer(options = {}) {
  const { before, after } = await import('node:test');
  const handle = { server: undefined };
  before(async () => {
    handle.server = await startServer(options);
  });
  after(async () => {
    await handle.server?.stop();
  });
  return handle;
}
