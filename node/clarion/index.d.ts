export { BINARY_PATH_VARIABLE, BinaryNotFoundError, findClarionBinary } from './lib/binary.js';

/** The publish API's default address: `http://127.0.0.1:8081`. */
export declare const DEFAULT_BASE_URL: string;
/** Default request timeout in milliseconds (10 000). */
export declare const DEFAULT_TIMEOUT_MS: number;
/** How long a publish answered 503 with `Retry-After` is retried by default (ms). */
export declare const DEFAULT_RETRY_FOR_MS: number;

/** A string is published as a text message, bytes as a binary one. */
export type Data = string | Uint8Array | ArrayBuffer;

/** What the server answered for one published message. */
export interface Receipt {
  /** The topic it was published to. */
  topic: string;
  /** Its id (`EPOCH-SEQ`); subscribers can resume after it with `since=ID`. */
  id: string;
  /** How many subscribers it was handed to at publish time. */
  subscribers: number;
  /** The publish repeated an `Idempotency-Key` the server saw within its `idempotency_window`:
   * nothing was delivered, and `id` is the first publish's. */
  repeat: boolean;
  /** For a fragment of an appendable message: its stream's id (later fragments append to it). */
  stream?: string;
  /** For a fragment: its place in its stream (1 for the opening one). */
  seq?: number;
  /** For a fragment: whether it closed its stream. */
  done?: boolean;
}

/** One message of a batch, or one fragment of an appendable message. */
export interface Message {
  topic: string;
  data: Data;
  /** The Server-Sent Events event name. */
  event?: string;
  /** Its idempotency key (as `idempotencyKey` for one publish). */
  key?: string;
  /** Filter tags. */
  tags?: Record<string, string>;
  /** Its conflation key. */
  conflation_key?: string;
  /** `'open'`: the data opens an appendable message (text only). */
  stream?: 'open';
  /** The id of the appendable message the data is appended to. */
  append_to?: string;
  /** With `append_to`: the fragment closes the stream. */
  done?: boolean;
}

export interface ClientOptions {
  /** The API listener, `http://HOST:PORT` (default `http://127.0.0.1:8081`). */
  baseUrl?: string;
  /** The server's `api_key`, sent as `Authorization: Bearer KEY`. */
  apiKey?: string;
  /** A bearer token instead (a JWT, for example), or a function giving a fresh one per request. */
  token?: string | (() => string | Promise<string>);
  /** Milliseconds a request may take (default 10 000). */
  timeoutMs?: number;
  /** How long (ms, in all) a publish answered 503 with `Retry-After` is sent again, waiting
   * what the header says each time (default 10000; 0: never). */
  retryForMs?: number;
  /** More request headers. */
  headers?: Record<string, string>;
  /** A fetch implementation (default: the global one). */
  fetch?: typeof fetch;
}

export interface PublishOptions {
  /** The Server-Sent Events event name subscribers over `/sse` see. */
  event?: string;
  /** Sent as `Idempotency-Key` (1 to 128 characters `!` to `~`): a publish repeating a key the
   * topic saw within the server's `idempotency_window` is not delivered again and answers the
   * first id. Give your own to make your retries safe; by default each publish gets a random
   * key, reused by the client's own 503 retries. */
  idempotencyKey?: string;
  /** Aborts the request. */
  signal?: AbortSignal;
}

export interface FragmentOptions {
  /** Sent as `Idempotency-Key` (random unless given, and reused by the client's own 503
   * retries): a retried fragment is never appended twice. */
  idempotencyKey?: string;
  /** Aborts the request. */
  signal?: AbortSignal;
}

/** An appendable message being written (an AI answer, token by token): subscribers get each
 * fragment live as an `append`, and one that reconnects gets the text so far as one message. */
export declare class StreamWriter {
  /** Its topic. */
  readonly topic: string;
  /** The stream's id (its opening fragment's), which subscribers see as `stream`. */
  readonly id: string;
  /** Fragments written so far. */
  readonly seq: number;
  /** Whether it was closed. */
  readonly done: boolean;
  /** Appends `text` (`done: true` also closes the stream); resolves to its receipt. */
  append(text: string, options?: FragmentOptions & { done?: boolean }): Promise<Receipt>;
  /** Closes the stream with `text` (default empty) as its last fragment. */
  close(text?: string, options?: FragmentOptions): Promise<Receipt>;
}

/** A publish client for the Clarion HTTP API. */
export declare class Client {
  constructor(options?: ClientOptions);
  readonly baseUrl: string;
  /** Publishes one message. Rejects with an ApiError subclass or a TransportError. */
  publish(topic: string, data: Data, options?: PublishOptions): Promise<Receipt>;
  /** Publishes several messages (and fragments of appendable messages) in one request, in
   * order; one receipt per item. */
  publishBatch(
    messages: Iterable<Message | [topic: string, data: Data, event?: string]>,
    options?: { signal?: AbortSignal },
  ): Promise<Receipt[]>;
  /** Opens an appendable message on `topic` with `text` (default empty) as its first
   * fragment; `append` the rest to the writer, then `close` it. */
  openStream(topic: string, text?: string, options?: FragmentOptions): Promise<StreamWriter>;
  /** Whether `GET /healthz` answers 200. */
  healthy(): Promise<boolean>;
}

/** Base class of every error this package throws. */
export declare class ClarionError extends Error {}
/** The request got no answer. */
export declare class TransportError extends ClarionError {}
/** The API listener could not be reached. */
export declare class ConnectionFailed extends TransportError {}
/** The request took longer than `timeoutMs`. */
export declare class Timeout extends TransportError {}
/** The server answered with an error status. */
export declare class ApiError extends ClarionError {
  constructor(status: number, message: string, body?: string);
  /** The HTTP status. */
  readonly status: number;
  /** The server's explanation (the `error` field of its JSON answer). */
  readonly serverMessage: string;
  /** The raw answer body. */
  readonly body: string;
}
/** 400: invalid topic or event name, text not UTF-8, malformed batch or query. */
export declare class BadRequest extends ApiError {}
/** Some messages of a batch refused, the others published; one result per message. */
export declare class BatchPartlyRefused extends BadRequest {
  readonly results: Array<Receipt | { error: string; status: number }>;
}
/** 401: the bearer key or token is missing or wrong. */
export declare class Unauthorized extends ApiError {}
/** 403: valid credentials that do not allow this topic. */
export declare class Forbidden extends ApiError {}
/** 404: no such API path. */
export declare class NotFound extends ApiError {}
/** 405: wrong method for the path. */
export declare class MethodNotAllowed extends ApiError {}
/** 413: body over `max_publish_size`. */
export declare class PayloadTooLarge extends ApiError {}
/** 414 or 431: request line or headers over the head limits. */
export declare class RequestHeadTooLarge extends ApiError {}
/** 500 or another unlisted 5xx. */
export declare class ServerError extends ApiError {}
/** 503: stopping, or too many API connections. */
export declare class Unavailable extends ApiError {}
/** The error for an answer's status. */
export declare function errorFor(status: number, message: string, body?: string): ApiError;
