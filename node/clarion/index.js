// The Clarion publish client for Node (18+), on the global `fetch`.
//
// `new Client({ baseUrl, apiKey })` publishes through the server's HTTP API: `publish(topic,
// data, { event })` for one message (a string is a text message, a Uint8Array/Buffer a binary
// one), `publishBatch(messages)` for several in one request. Every error answer becomes an
// `ApiError` subclass chosen by its status; failures to reach the server are `TransportError`s.

import { randomUUID } from 'node:crypto';

export { BINARY_PATH_VARIABLE, BinaryNotFoundError, findClarionBinary } from './lib/binary.js';

/** The publish API's default address (`api_listen`). */
export const DEFAULT_BASE_URL = 'http://127.0.0.1:8081';
/** Milliseconds a request may take, from sending to the end of the answer. */
export const DEFAULT_TIMEOUT_MS = 10_000;

/** Base class of every error this package throws. */
export class ClarionError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The request got no answer: connection refused or reset, DNS, TLS. */
export class TransportError extends ClarionError {}
/** The API listener could not be reached. */
export class ConnectionFailed extends TransportError {}
/** The request took longer than the client's timeout. */
export class Timeout extends TransportError {}

/** The server answered with an error status; `status`, `message` (its `error` text), `body`. */
export class ApiError extends ClarionError {
  constructor(status, message, body = '') {
    super(`${status}: ${message}`);
    this.status = status;
    this.serverMessage = message;
    this.body = body;
  }
}
/** 400: invalid topic or event name, text that is not UTF-8, malformed batch or query. */
export class BadRequest extends ApiError {}
/** A batch in which the server refused some messages and published the others (a BadRequest,
 * as a bad batch was before servers answered per message). `status` and `serverMessage` are the
 * first refused message's; `results` has one entry per message, in order: a receipt, or
 * `{ error, status }` (424: held back because another message of its topic was refused). */
export class BatchPartlyRefused extends BadRequest {
  constructor(results) {
    const refused = results.map((r, i) => [i, r]).filter(([, r]) => r.error != null);
    const [first, why] = refused[0];
    super(why.status ?? 400, `${refused.length} of ${results.length} messages not published; messages[${first}]: ${why.error}`);
    this.results = results;
  }
}
/** 401: the bearer key or token is missing or wrong. */
export class Unauthorized extends ApiError {}
/** 403: valid credentials that do not allow publishing to this topic. */
export class Forbidden extends ApiError {}
/** 404: no such API path (the base URL probably points at the wrong listener). */
export class NotFound extends ApiError {}
/** 405: wrong method for the path. */
export class MethodNotAllowed extends ApiError {}
/** 413: the body is larger than the server's `max_publish_size`. */
export class PayloadTooLarge extends ApiError {}
/** 414 or 431: the request line or headers exceed the server's head limits. */
export class RequestHeadTooLarge extends ApiError {}
/** 500 or another 5xx not listed here. */
export class ServerError extends ApiError {}
/** 503: the server is stopping or holds its maximum of API connections; retry later. */
export class Unavailable extends ApiError {}

const BY_STATUS = {
  400: BadRequest,
  401: Unauthorized,
  403: Forbidden,
  404: NotFound,
  405: MethodNotAllowed,
  413: PayloadTooLarge,
  414: RequestHeadTooLarge,
  431: RequestHeadTooLarge,
  503: Unavailable,
};

/** The error for an answer's status: a subclass, else ServerError for 5xx, else ApiError. */
export function errorFor(status, message, body = '') {
  const Cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : ApiError);
  return new Cls(status, message, body);
}

/** How long a 503 publish keeps being retried when it carries Retry-After: an upgrade's freeze
 * lasts well under a second, a Redis failover a few seconds. */
export const DEFAULT_RETRY_FOR_MS = 10000;

// Retry-After in seconds (the server sends whole seconds), as ms; null when absent or not a
// number (an HTTP date is not sent by Clarion).
function retryAfterMs(value) {
  if (value == null || !/^\d{1,6}$/.test(value.trim())) return null;
  return Number(value.trim()) * 1000;
}

function isBytes(data) {
  return data instanceof Uint8Array || data instanceof ArrayBuffer;
}

function toBase64(data) {
  const bytes = data instanceof ArrayBuffer ? new Uint8Array(data) : data;
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64');
}

// An object item is sent with all its fields (`key`, `tags`, `conflation_key`, a fragment's
// `stream`, `append_to` and `done`): the server answers a field it does not know in the item's
// place. Bytes go as base64.
function batchItem(m) {
  const item = Array.isArray(m) ? { topic: m[0], data: m[1], event: m[2] } : { ...m };
  if (item.event == null) delete item.event;
  if (isBytes(item.data)) {
    item.data = toBase64(item.data);
    item.encoding = 'base64';
  } else if (typeof item.data !== 'string') {
    throw new TypeError('message data is a string or a Uint8Array');
  }
  return item;
}

// Characters the server accepts in topics need no escaping; others are escaped so the server
// sees (and refuses with 400) the name as given.
function publishPath(topic) {
  return `/publish/${encodeURIComponent(topic).replace(/%2F/gi, '/').replace(/%40/g, '@').replace(/%3A/gi, ':')}`;
}

/** An appendable message being written (`Client.openStream`). See index.d.ts. */
export class StreamWriter {
  #send;

  constructor(send, opened) {
    this.#send = send;
    this.topic = opened.topic;
    this.id = opened.stream ?? opened.id;
    this.seq = opened.seq ?? 1;
    this.done = false;
  }

  async append(text, options = {}) {
    const done = options.done === true;
    const query = `append_to=${encodeURIComponent(this.id)}${done ? '&done=1' : ''}`;
    const r = await this.#send(query, text, options);
    this.seq = r.seq ?? this.seq;
    this.done = r.done === true;
    return r;
  }

  close(text = '', options = {}) {
    return this.append(text, { ...options, done: true });
  }
}

function receipt(v) {
  if (!v || typeof v.topic !== 'string' || typeof v.id !== 'string' || typeof v.subscribers !== 'number') {
    throw new ClarionError(`unexpected answer from the server: ${JSON.stringify(v)}`);
  }
  const r = { topic: v.topic, id: v.id, subscribers: v.subscribers, repeat: v.repeat === true };
  // A fragment of an appendable message: its stream, its place in it, whether it closed it.
  if (typeof v.stream === 'string') Object.assign(r, { stream: v.stream, seq: v.seq, done: v.done === true });
  return r;
}

/** A publish client. See index.d.ts for the options. */
export class Client {
  constructor(options = {}) {
    if (options.apiKey != null && options.token != null) {
      throw new TypeError('give either apiKey or token, not both');
    }
    this.baseUrl = (options.baseUrl ?? DEFAULT_BASE_URL).replace(/\/+$/, '');
    this.apiKey = options.apiKey;
    this.token = options.token;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.fetch = options.fetch ?? globalThis.fetch;
    this.headers = options.headers ?? {};
    this.retryForMs = options.retryForMs ?? DEFAULT_RETRY_FOR_MS;
  }

  /** Publishes one message; resolves to its receipt `{ topic, id, subscribers, repeat }`. It is
   * sent with `Idempotency-Key: options.idempotencyKey`, or a random key kept for the client's own
   * retries, so a retry of a publish the server took is not delivered twice. */
  async publish(topic, data, options = {}) {
    let body;
    let type;
    if (isBytes(data)) {
      body = data;
      type = 'application/octet-stream';
    } else if (typeof data === 'string') {
      body = data;
      type = 'text/plain; charset=utf-8';
    } else {
      throw new TypeError('message data is a string or a Uint8Array');
    }
    let path = publishPath(topic);
    if (options.event != null) path += `?event=${encodeURIComponent(options.event)}`;
    const key = { 'idempotency-key': options.idempotencyKey ?? randomUUID() };
    return receipt(await this.#post(path, body, type, options.signal, key));
  }

  /** Publishes several messages in one request, in order and atomically with respect to other
   * publishes. When the server refuses some messages it still publishes the other topics' (a
   * topic's messages go all or none) and this throws BatchPartlyRefused with every result. */
  async publishBatch(messages, options = {}) {
    const body = JSON.stringify({ messages: Array.from(messages, batchItem) });
    const answer = await this.#post('/publish', body, 'application/json', options.signal);
    if (!Array.isArray(answer?.results)) {
      throw new ClarionError(`unexpected answer from the server: ${JSON.stringify(answer)}`);
    }
    const results = answer.results.map((r) => (r && typeof r.error === 'string' ? { error: r.error, status: r.status } : receipt(r)));
    if (results.some((r) => r.error != null)) throw new BatchPartlyRefused(results);
    return results;
  }

  /** Opens an appendable message on `topic` with `text` as its first fragment; resolves to its
   * StreamWriter: `append` the rest, then `close`. */
  async openStream(topic, text = '', options = {}) {
    const send = async (query, fragment, opts) => {
      if (typeof fragment !== 'string') throw new TypeError("a stream's fragments are strings");
      const key = { 'idempotency-key': opts.idempotencyKey ?? randomUUID() };
      const path = `${publishPath(topic)}?${query}`;
      return receipt(await this.#post(path, fragment, 'text/plain; charset=utf-8', opts.signal, key));
    };
    return new StreamWriter(send, await send('stream=open', text, options));
  }

  /** Whether `GET /healthz` answers 200 (false while the server is stopping). */
  async healthy() {
    const res = await this.#request(`${this.baseUrl}/healthz`, { method: 'GET' });
    await res.arrayBuffer();
    return res.status === 200;
  }

  async #authorization() {
    const bearer = this.apiKey ?? (typeof this.token === 'function' ? await this.token() : this.token);
    return bearer == null ? {} : { authorization: `Bearer ${bearer}` };
  }

  async #request(url, init, signal) {
    const timeout = AbortSignal.timeout(this.timeoutMs);
    let combined = timeout;
    if (signal) {
      // AbortSignal.any is Node 20.3+; this works on 18 too.
      const both = new AbortController();
      for (const s of [signal, timeout]) {
        if (s.aborted) both.abort(s.reason);
        else s.addEventListener('abort', () => both.abort(s.reason), { once: true });
      }
      combined = both.signal;
    }
    try {
      return await this.fetch(url, { ...init, signal: combined });
    } catch (e) {
      if (timeout.aborted) throw new Timeout(`timed out after ${this.timeoutMs} ms`, { cause: e });
      if (signal?.aborted) throw e;
      throw new ConnectionFailed(`cannot reach the Clarion API at ${this.baseUrl}: ${e.cause?.code ?? e.message}`, {
        cause: e,
      });
    }
  }

  async #post(path, body, type, signal, extra = {}) {
    // A 503 with Retry-After (an upgrade in progress, a broker away) published nothing: send
    // it again after the wait, for at most retryForMs in all.
    const deadline = Date.now() + this.retryForMs;
    for (;;) {
      const headers = { ...this.headers, 'content-type': type, ...extra, ...(await this.#authorization()) };
      const res = await this.#request(`${this.baseUrl}${path}`, { method: 'POST', headers, body }, signal);
      const waitMs = res.status === 503 ? retryAfterMs(res.headers.get('retry-after')) : null;
      if (waitMs == null || Date.now() + waitMs > deadline || signal?.aborted) return this.#answer(res);
      await res.arrayBuffer().catch(() => {});
      await new Promise((resolve) => setTimeout(resolve, waitMs));
    }
  }

  async #answer(res) {
    let text;
    try {
      text = await res.text();
    } catch (e) {
      throw new ConnectionFailed(`the answer was cut off: ${e.message}`, { cause: e });
    }
    if (res.status !== 200) {
      let message = text.trim() || res.statusText;
      try {
        const parsed = JSON.parse(text);
        if (typeof parsed?.error === 'string') message = parsed.error;
      } catch {
        // Not JSON: the body itself is the explanation.
      }
      throw errorFor(res.status, message, text);
    }
    try {
      return JSON.parse(text);
    } catch {
      throw new ClarionError(`the server's answer is not JSON: ${text.slice(0, 200)}`);
    }
  }
}
