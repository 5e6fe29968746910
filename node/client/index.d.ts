// Types of @clarion/client (hand-written; index.js is the implementation).

/** Where the client stands; `state` events carry it (docs/clients.md draws the machine). */
export type State = 'idle' | 'connecting' | 'connected' | 'disconnected' | 'reconnecting' | 'closed';

/** A message of a followed topic. `data` is a string for text, a Uint8Array for binary. */
export interface Message {
  topic: string;
  /** `EPOCH-SEQ`; the client resumes after it. */
  id: string;
  data: string | Uint8Array;
  /** The event name the publisher gave, if any. */
  event?: string;
}

/**
 * Messages of `topic` after `since` that will never arrive. `trimmed`: history no longer holds
 * them (the ones still held follow); `epoch`: `since` is from another server run or broker
 * epoch (this run's history follows); `unpositioned`: the subscription had received nothing
 * before the connection dropped, so there was no id to resume from (client-side notice).
 */
export interface Gap {
  topic: string;
  since: string | null;
  reason: 'trimmed' | 'epoch' | 'unpositioned' | (string & {});
}

/** Why the client reports an error; none of them is thrown at the app. */
export type ErrorKind =
  | 'protocol' // the server sent something that is not Clarion's protocol (the client reconnects)
  | 'close' // a close code the client does not know (it reconnects)
  | 'connect' | 'send' // the transport failed
  | 'token' // getToken() threw or rejected
  | 'unauthorized' // the server refused the token (a fresh one is asked for)
  | 'subscription' // one topic was refused for good (403, invalid name): that subscription only
  | 'server' // an error reply without a topic
  | 'callback' // an app listener threw
  | 'refused' | 'http' | 'expired' | 'closed' | 'sleep';

export interface ClarionError extends Error {
  kind: ErrorKind;
  topic?: string;
  cause?: unknown;
}

export interface Disconnected {
  reason: string;
  /** The WebSocket close code (0 when the client ended the connection). */
  code: number;
  closeReason: string;
}

export interface ClientEvents {
  state: { state: State; delay?: number; reason?: string; code?: number };
  connecting: { attempt: number; url: string };
  connected: { url: string; transport: 'websocket' | 'sse' };
  disconnected: Disconnected;
  reconnecting: { delay: number; attempt: number };
  message: Message;
  gap: Gap;
  error: ClarionError;
  closed: Record<string, never>;
}

export interface SubscriptionEvents {
  message: Message;
  gap: Gap;
  subscribed: { topic: string };
  error: ClarionError;
}

/** The WebSocket constructor the client uses: the global one, or `ws`'s on Node 20. */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => any;

export interface ClientOptions {
  /** `'websocket'` (default when a WebSocket exists), `'sse'` (fetch-streamed SSE, one stream
   * per topic) or `'auto'` (WebSocket when available, else SSE). */
  transport?: 'websocket' | 'sse' | 'auto';
  /** A WebSocket constructor; needed on Node 20 (`import WebSocket from 'ws'`). */
  WebSocket?: WebSocketConstructor;
  /** Returns a token (JWT): called before connecting, on `expiring`, after a refusal. */
  getToken?: () => string | Promise<string>;
  /** Backoff: wait a random time in [0, min(maxDelayMs, initialDelayMs * factor^attempt)). */
  initialDelayMs?: number;
  maxDelayMs?: number;
  factor?: number;
  /** First wait after a close announcing a restart (1001, 1012, 1013) or a 429/503. */
  restartDelayMs?: number;
  connectTimeoutMs?: number;
  /** A connection that lived this long resets the backoff. */
  stableMs?: number;
  /** Larger frames are a protocol error. */
  maxFrameBytes?: number;
  /** A page hidden this long reconnects at once when it becomes visible. */
  sleepMs?: number;
  /** Random numbers in [0, 1) for the jitter (tests pass a seeded one). */
  random?: () => number;
}

export const DEFAULTS: Readonly<Required<Pick<ClientOptions,
  'initialDelayMs' | 'maxDelayMs' | 'factor' | 'restartDelayMs' | 'connectTimeoutMs' | 'stableMs' | 'maxFrameBytes' | 'sleepMs'>>>;

export interface SubscribeOptions {
  /** Resume after this id (from an earlier run of the app). */
  since?: string;
  onMessage?: (m: Message) => void;
  onGap?: (g: Gap) => void;
  onError?: (e: ClarionError) => void;
}

export declare class Subscription {
  readonly topic: string;
  /** The id of the last message delivered: where the next resume starts. */
  readonly lastId: string | null;
  readonly state: 'pending' | 'subscribed' | 'failed' | 'closed';
  on<K extends keyof SubscriptionEvents>(event: K, fn: (value: SubscriptionEvents[K]) => void): () => void;
  unsubscribe(): void;
}

export declare class ClarionClient {
  /** One URL (`wss://push.example.com/ws`) or several, tried in turn when one fails. */
  constructor(url: string | URL | Array<string | URL>, options?: ClientOptions);
  readonly state: State;
  on<K extends keyof ClientEvents>(event: K, fn: (value: ClientEvents[K]) => void): () => void;
  subscribe(topic: string, options?: SubscribeOptions): Subscription;
  connect(): void;
  /** Ends the connection and every timer; the client cannot be used again. */
  close(): void;
}
