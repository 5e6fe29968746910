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

/** An appendable message's text so far (docs/protocol.md, "Appendable messages"): given after
 * every fragment, and once after a resume with the whole text so far. */
export interface AppendText {
  topic: string;
  /** The latest fragment's id. */
  id: string;
  stream: string;
  text: string;
  /** Fragments included. */
  seq: number;
  done: boolean;
  /** `"timeout"` when the server closed the stream. */
  reason?: string;
}

/** Why the client reports an error; none of them is thrown at the app. */
export type ErrorKind =
  | 'protocol' // the server sent something that is not Clarion's protocol (the client reconnects)
  | 'close' // a close code the client does not know (it reconnects)
  | 'connect' | 'send' // the transport failed
  | 'token' // getToken() threw or rejected
  | 'delta' // a delta did not apply (another base, a checksum mismatch): the client resubscribes
  | 'stream' // fragments of an appendable message are missing: the client resubscribes
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

/** Presence: a member of a topic, one per identity (the token's `sub`), however many
 * connections it has. `info` is the token's `clarion.info` object, when it has one. */
export interface Member {
  sub: string;
  info?: Record<string, unknown>;
}

/** A `join` or `leave` of a presence subscription (the member, with the topic). */
export interface MemberEvent extends Member {
  topic: string;
}

/** A complete member list of a presence subscription: after subscribing, and again after every
 * reconnect. It replaced `subscription.members`; `join`/`leave` events for what changed
 * meanwhile came just before it. `members` is that same Map. */
export interface PresenceList {
  topic: string;
  /** Listed members (identities) when the list was made. */
  count: number;
  /** Connections on the topic, anonymous ones included (they are counted, never listed). */
  connections: number;
  members: ReadonlyMap<string, Record<string, unknown> | undefined>;
}

/** One page of members from `client.presence()`, sorted by `sub`. */
export interface PresencePage {
  topic: string;
  count: number;
  connections: number;
  members: Member[];
  /** True when more members follow: ask again with `{ after: next }`. */
  more: boolean;
  /** The last `sub` of this page, when `more`. */
  next?: string;
}

/** How `client.presence()` fails. `server`: the server's error reply (not a presence topic,
 * the token does not grant it, presence_max_topics, presence not configured); `disconnected`:
 * no connection, or it ended before the answer; `unsupported`: the SSE transport (no in-band
 * query there). */
export declare class PresenceError extends Error {
  readonly name: 'PresenceError';
  readonly kind: 'server' | 'disconnected' | 'unsupported';
  readonly topic: string;
}

export interface SubscriptionEvents {
  message: Message;
  gap: Gap;
  subscribed: { topic: string };
  error: ClarionError;
  /** With `presence: true`: a full member list arrived (initial, or after a reconnect). */
  presence: PresenceList;
  /** With `presence: true`: a member joined (live, or found in a fresh list after a reconnect). */
  join: MemberEvent;
  /** With `presence: true`: a member left (live, or missing from a fresh list after a reconnect). */
  leave: MemberEvent;
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
  /** First wait after a close saying the server goes away or is busy (1001, 1013) or a 429/503. */
  restartDelayMs?: number;
  /** First wait after 1012 (the server is restarting; its new process holds the history). */
  reloadDelayMs?: number;
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
  'initialDelayMs' | 'maxDelayMs' | 'factor' | 'restartDelayMs' | 'reloadDelayMs' | 'connectTimeoutMs' | 'stableMs' | 'maxFrameBytes' | 'sleepMs'>>>;

export interface SubscribeOptions {
  /** Resume after this id (from an earlier run of the app). */
  since?: string;
  /** Keep the topic's members (a `presence_topics` topic): `members`, and `presence`, `join`,
   * `leave` events. A topic that keeps no presence fails the subscription (`error` event,
   * kind `subscription`). Passing it for a topic already followed adds presence to it. */
  presence?: boolean;
  /** Take messages as deltas of the previous one where the server can (a `delta_topics`
   * topic; another one fails the subscription). The client applies each delta and delivers the
   * whole message; a delta that does not apply is never delivered: the client resubscribes
   * from `lastId` (an `error` event of kind `delta`). */
  delta?: boolean;
  onMessage?: (m: Message) => void;
  onGap?: (g: Gap) => void;
  onAppend?: (a: AppendText) => void;
  onError?: (e: ClarionError) => void;
}

export declare class Subscription {
  readonly topic: string;
  /** The id of the last message delivered: where the next resume starts. */
  readonly lastId: string | null;
  readonly state: 'pending' | 'subscribed' | 'failed' | 'closed';
  /** Whether the subscription keeps members. */
  readonly presence: boolean;
  /** Whether it takes deltas, and how many did not apply (each answered by a resubscribe). */
  readonly delta: boolean;
  readonly deltaFailures: number;
  /** The current members (sub -> info), live: replaced by every full list, changed by every
   * join and leave. Empty until the first list. */
  readonly members: ReadonlyMap<string, Record<string, unknown> | undefined>;
  /** `count` and `connections` of the last full list (not moved by join/leave). */
  readonly count: number;
  readonly connections: number;
  on<K extends keyof SubscriptionEvents>(event: K, fn: (value: SubscriptionEvents[K]) => void): () => void;
  unsubscribe(): void;
}

export declare class ClarionClient {
  /** One URL (`wss://push.example.com/ws`) or several, tried in turn when one fails. */
  constructor(url: string | URL | Array<string | URL>, options?: ClientOptions);
  readonly state: State;
  on<K extends keyof ClientEvents>(event: K, fn: (value: ClientEvents[K]) => void): () => void;
  subscribe(topic: string, options?: SubscribeOptions): Subscription;
  /** One page of `topic`'s members (WebSocket transport), followed or not; `after` is the
   * previous page's `next`. Rejects with a PresenceError. */
  presence(topic: string, options?: { after?: string }): Promise<PresencePage>;
  connect(): void;
  /** Ends the connection and every timer; the client cannot be used again. */
  close(): void;
}

/** Applies a Fossil-format delta (docs/delta.md) to `base`; throws when it does not apply. */
export declare function applyDelta(base: Uint8Array, delta: Uint8Array, limit?: number): Uint8Array;
