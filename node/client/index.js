// @clarion/client: a Clarion subscriber for browsers and Node (>= 20). ESM, no dependencies.
//
// One connection carries every subscription (a `clarion.v1` WebSocket, or one SSE stream per
// topic read with fetch). The client keeps the last id of every topic and resumes each one with
// it after every reconnect, on whichever node answers; gap notices reach the app as `gap`
// events. Reconnects wait an exponential backoff with full jitter. Tokens come from the app's
// `getToken()`: before connecting, on the server's `expiring` warning, and after a refusal.
// Nothing the server sends and nothing an app callback throws escapes into the app: both
// become `error` events. With `presence: true` a subscription also keeps the topic's members
// (docs/clients.md, "Presence"). docs/clients.md describes the states and every server answer.

import { applyDelta, fromBase64, utf8, fromUtf8 } from './delta.js';

export { applyDelta };

/** Close codes and what they mean to the client (docs/protocol.md, docs/auth.md). */
const AWAY = 1001;
const RESTART = 1012;
const TRY_AGAIN = 1013;
const EXPIRED = 4001;
const AUTH_REQUIRED = 4002;
// Closes every peer sends in normal operation; any other code is reported as an error.
const KNOWN_CLOSES = new Set([1000, AWAY, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1011, RESTART, TRY_AGAIN, EXPIRED, AUTH_REQUIRED]);

/** Defaults, each with the reason for its value. */
export const DEFAULTS = Object.freeze({
  // A single client that lost its network is back within about a second.
  initialDelayMs: 1000,
  // Keeps a client that cannot reach any node from trying more than twice a minute.
  maxDelayMs: 30000,
  factor: 2,
  // After a close that says the server is going away or busy (1001, 1013) every client of that
  // server is reconnecting at once: the first wait is drawn from [0, restartDelayMs), which
  // spreads 100,000 clients over ~10 s (about 10,000 handshakes a second) rather than one.
  restartDelayMs: 10000,
  // After 1012 the server is restarting (an upgrade or reload): the new process is listening
  // already and the resume must land while its history still holds what was published
  // meanwhile (the default 100 messages per topic last 5 s at 20 messages a second). The first
  // wait is drawn from [0, reloadDelayMs).
  reloadDelayMs: 1000,
  // A handshake that takes longer is abandoned (and retried on the next node).
  connectTimeoutMs: 10000,
  // A connection that lived this long resets the backoff; a shorter one counts as a failure,
  // so a server that accepts and drops at once cannot make the client loop fast.
  stableMs: 5000,
  // Frames larger than this are refused as hostile (the server's default max_message_size is
  // 1 MiB; an envelope adds the JSON around it, base64 adds a third).
  maxFrameBytes: 2 * 1024 * 1024,
  // A page hidden this long may have slept: when it becomes visible it reconnects at once.
  sleepMs: 60000,
});

const TRANSPORTS = new Set(['websocket', 'sse', 'auto']);

// Compares two ids `EPOCH-SEQ`: true when `b` is at or before `a` in the same epoch.
function notAfter(b, a) {
  const i = a.lastIndexOf('-');
  const j = b.lastIndexOf('-');
  if (i < 0 || j < 0 || a.slice(0, i) !== b.slice(0, j)) return false;
  const x = a.slice(i + 1);
  const y = b.slice(j + 1);
  return y.length < x.length || (y.length === x.length && y <= x);
}

/** What `client.presence()` rejects with: `kind` is 'server' (the server's error reply: not a
 * presence topic, not granted, a limit), 'disconnected' (no connection, or it ended before the
 * answer) or 'unsupported' (the SSE transport has no in-band member query). */
export class PresenceError extends Error {
  constructor(kind, message, topic) {
    super(message);
    this.name = 'PresenceError';
    this.kind = kind;
    this.topic = topic;
  }
}

// What a subscription without presence shows as its members.
const NO_MEMBERS = new Map();

/** One topic the app follows; `lastId` is where it resumes. */
export class Subscription {
  constructor(client, topic, since, presence, delta) {
    this.client = client;
    this.topic = topic;
    this.lastId = since || null;
    // Messages as deltas of the previous one where the server can (docs/delta.md); the last
    // message's bytes are what the next delta applies to.
    this.delta = Boolean(delta);
    this.deltaFailures = 0;
    this._base = null;
    this._resyncing = false;
    // A `conflated` notice came: the next message replaced older ones of its key and may be
    // newer than messages still to come, so it does not move lastId (docs/conflation.md).
    this._conflated = false;
    // 'pending' until the server confirms, 'subscribed', 'failed' (refused for good), 'closed'.
    this.state = 'pending';
    this._on = new Map();
    // Presence state, only on presence subscriptions (one field for the others).
    this._p = null;
    if (presence) this._presence();
  }

  _presence() {
    // members: sub -> info (undefined without one), kept by every list, join and leave; count
    // and connections: from the last list; pages: the map a list assembled from pages (more:
    // true) will become; listed: a list has been shown.
    this._p = { members: new Map(), count: 0, connections: 0, pages: null, listed: false };
  }

  get presence() {
    return !!this._p;
  }

  get members() {
    return this._p ? this._p.members : NO_MEMBERS;
  }

  get count() {
    return this._p ? this._p.count : 0;
  }

  get connections() {
    return this._p ? this._p.connections : 0;
  }

  /** Adds a listener for `message`, `gap`, `subscribed`, `error`, and with presence `presence`,
   * `join`, `leave`; returns its remover. */
  on(event, fn) {
    return on(this._on, event, fn);
  }

  // A member list (or one page of it) for this subscription.
  _list(conn, m) {
    const p = this._p;
    const map = p.pages || new Map();
    for (const x of Array.isArray(m.members) ? m.members : []) if (x && typeof x.sub === 'string') map.set(x.sub, x.info);
    p.count = m.count;
    p.connections = m.connections;
    if (m.more && typeof m.next === 'string' && conn.ws) {
      // Truncated at presence_max_members: ask for the rest before showing anything.
      p.pages = map;
      return this.client._ask(conn, this.topic, m.next, 'P');
    }
    p.pages = null;
    const old = p.members;
    const again = p.listed;
    p.members = map;
    p.listed = true;
    // A fresh list (after a reconnect) is the truth: tell the app what changed meanwhile.
    if (again) {
      for (const [sub, info] of old) if (!map.has(sub)) this._member('leave', { sub, info });
      for (const [sub, info] of map) if (!old.has(sub)) this._member('join', { sub, info });
    }
    this.client._emit(this._on, 'presence', { topic: this.topic, count: p.count, connections: p.connections, members: map });
  }

  // A join or leave from the server.
  _change(type, member) {
    if (!member || typeof member.sub !== 'string') return;
    const p = this._p;
    const map = p.pages || p.members;
    if (type === 'join') map.set(member.sub, member.info);
    else map.delete(member.sub);
    // While pages are assembled the change is part of the list the app will get.
    if (!p.pages) this._member(type, member);
  }

  _member(type, { sub, info }) {
    this.client._emit(this._on, type, { topic: this.topic, sub, info });
  }

  /** Stops following the topic. */
  unsubscribe() {
    this.client._unsubscribe(this);
  }
}

function on(map, event, fn) {
  let set = map.get(event);
  if (!set) map.set(event, (set = new Set()));
  set.add(fn);
  return () => set.delete(fn);
}

/** A Clarion subscriber. `new ClarionClient(url | [urls], options)`; see index.d.ts. */
export class ClarionClient {
  constructor(url, options = {}) {
    this.urls = (Array.isArray(url) ? url : [url]).map(String);
    if (!this.urls.length) throw new TypeError('ClarionClient needs at least one URL');
    this.options = { ...DEFAULTS, ...options };
    const o = this.options;
    if (!TRANSPORTS.has(o.transport || 'websocket')) throw new TypeError(`unknown transport ${o.transport}`);
    this.WebSocket = o.WebSocket || globalThis.WebSocket;
    this.transport = o.transport || (this.WebSocket ? 'websocket' : 'sse');
    if (this.transport === 'auto') this.transport = this.WebSocket ? 'websocket' : 'sse';
    if (this.transport === 'websocket' && !this.WebSocket) {
      throw new TypeError('no WebSocket: pass options.WebSocket (for example from the ws package on Node 20)');
    }
    this.random = o.random || Math.random;
    this.state = 'idle';
    this.subs = new Map();
    this._on = new Map();
    this.attempt = 0;
    this.urlIndex = 0;
    this.conn = null;
    this.timer = null;
    this.token = null;
    this.hiddenAt = 0;
    this._browser(true);
  }

  /** Adds a listener; events: state, connecting, connected, disconnected, reconnecting,
   * message, gap, error, closed. Returns its remover. */
  on(event, fn) {
    return on(this._on, event, fn);
  }

  /** Follows `topic` (resuming after `options.since` when given); connects if needed. */
  subscribe(topic, options = {}) {
    if (this.state === 'closed') throw new Error('client is closed');
    let sub = this.subs.get(topic);
    if (sub) {
      if (options.presence && !sub._p) {
        // Presence asked for later: subscribing again (resuming at lastId) brings the list.
        sub._presence();
        if (this.state === 'connected') this._sendSubscribe(sub);
      }
      return sub;
    }
    sub = new Subscription(this, topic, options.since, options.presence, options.delta);
    // Only messages whose tags pass it (docs/filters.md): the text form, or the JSON form as
    // an object. Sent with every (re)subscribe, so a resume replays only matching messages.
    if (options.filter !== undefined) sub.filter = options.filter;
    if (options.onMessage) sub.on('message', options.onMessage);
    if (options.onGap) sub.on('gap', options.onGap);
    if (options.onAppend) sub.on('append', options.onAppend);
    if (options.onError) sub.on('error', options.onError);
    this.subs.set(topic, sub);
    if (this.state === 'connected') this._sendSubscribe(sub);
    else if (this.state === 'idle') this.connect();
    return sub;
  }

  /** One page of `topic`'s members (`after`: the `next` of the previous page), asked over the
   * WebSocket; any topic the token may subscribe to, followed or not. */
  presence(topic, options = {}) {
    const conn = this.conn;
    if (!conn || !conn.ready) return Promise.reject(new PresenceError('disconnected', 'not connected', topic));
    if (!conn.ws) return Promise.reject(new PresenceError('unsupported', 'member pages need the WebSocket transport', topic));
    return new Promise((resolve, reject) => this._ask(conn, topic, options.after, { resolve, reject }));
  }

  // Sends a presence query; its answer goes to `what` (a promise's resolve/reject, or 'P': the
  // subscription's own list).
  _ask(conn, topic, after, what) {
    this._expect(conn, topic, what);
    const m = { type: 'presence', topic };
    if (after != null) m.after = String(after);
    conn.send(m);
  }

  // The server answers a connection's requests in order: per topic, the answers still due are
  // 'S' (subscribed or an error), 'P' (a list for the subscription) and presence() promises.
  _expect(conn, topic, what) {
    if (!conn.expect) conn.expect = new Map();
    let q = conn.expect.get(topic);
    if (!q) conn.expect.set(topic, (q = []));
    q.push(what);
  }

  _shift(conn, topic, test) {
    const q = conn.expect && conn.expect.get(topic);
    if (!q || !test(q[0])) return;
    if (q.length === 1) {
      conn.expect.delete(topic);
      if (!conn.expect.size) conn.expect = null;
    }
    return q.shift();
  }

  /** Opens the connection (subscribe() does it by itself). */
  connect() {
    if (this.state === 'idle' || this.state === 'disconnected' || this.state === 'reconnecting') this._open();
  }

  /** Ends everything: the connection, every timer and listener. Idempotent. */
  close() {
    if (this.state === 'closed') return;
    clearTimeout(this.timer);
    this.timer = null;
    this._browser(false);
    const conn = this.conn;
    this.conn = null;
    if (conn) {
      clearTimeout(conn.timeout);
      conn.drop(1000, 'client closed');
      unanswered(conn);
    }
    for (const sub of this.subs.values()) sub.state = 'closed';
    this._setState('closed');
    this._emit(this._on, 'closed', {});
  }

  // ---- connection lifecycle

  async _open() {
    clearTimeout(this.timer);
    this.timer = null;
    const seq = (this.openSeq = (this.openSeq || 0) + 1);
    this._setState('connecting');
    this._emit(this._on, 'connecting', { attempt: this.attempt, url: this.urls[this.urlIndex] });
    if (seq !== this.openSeq || this.state !== 'connecting') return;
    if (this.options.getToken) {
      try {
        this.token = await this.options.getToken();
      } catch (err) {
        if (seq !== this.openSeq || this.state === 'closed') return;
        this._error('token', 'getToken failed', err);
        return this._lost({ reason: 'token', code: 0 });
      }
      if (seq !== this.openSeq || this.state === 'closed') return;
    }
    const url = this.urls[this.urlIndex];
    let conn;
    try {
      conn = this.transport === 'sse' ? new SseConn(this, url) : new WsConn(this, url);
    } catch (err) {
      this._error('connect', `cannot open ${url}`, err);
      return this._lost({ reason: 'connect', code: 0 });
    }
    this.conn = conn;
    this.openedAt = 0;
    conn.timeout = setTimeout(() => conn.fail('connect', 'handshake timed out', 0), this.options.connectTimeoutMs);
  }

  // The transport is open: authenticate if there is a token, then subscribe to everything.
  _onOpen(conn) {
    clearTimeout(conn.timeout);
    this.openedAt = Date.now();
    if (this.token && conn.ws) conn.send({ type: 'auth', token: this.token });
    else this._ready(conn);
  }

  _ready(conn) {
    conn.ready = true;
    this._setState('connected');
    this._emit(this._on, 'connected', { url: conn.url, transport: this.transport });
    for (const sub of this.subs.values()) if (sub.state !== 'failed') this._sendSubscribe(sub);
  }

  _sendSubscribe(sub) {
    const conn = this.conn;
    if (!conn || !conn.ready) return;
    sub.state = 'pending';
    if (sub._p) sub._p.pages = null;
    const msg = { type: 'subscribe', topic: sub.topic };
    if (sub.presence) msg.presence = true;
    if (sub.filter !== undefined) msg.filter = sub.filter;
    if (sub.delta) msg.delta = true;
    if (conn.ws) {
      this._expect(conn, sub.topic, 'S');
      if (sub.presence) this._expect(conn, sub.topic, 'P');
    }
    if (sub.lastId) msg.since = sub.lastId;
    else if (sub.everSubscribed) {
      // Nothing arrived on this topic before the connection was lost: there is no id to resume
      // from, so what was published meanwhile cannot be named. Say so rather than hide it.
      this._gap(sub, { type: 'gap', topic: sub.topic, since: null, reason: 'unpositioned' });
    }
    sub.everSubscribed = true;
    conn.send(msg);
  }

  // A delta did not apply (kind 'delta'), or fragments of an appendable message are missing
  // ('stream'): subscribe again from the last good message (the server sends what follows in
  // full first). Nothing of the bad delta reaches the app.
  _resync(sub, why, kind = 'delta') {
    if (kind === 'delta') sub.deltaFailures++;
    sub._resyncing = true;
    const err = this._error(kind, why, undefined, sub.topic);
    this._emit(sub._on, 'error', err);
    const conn = this.conn;
    if (!conn || !conn.ready) return;
    conn.send({ type: 'unsubscribe', topic: sub.topic });
    this._sendSubscribe(sub);
  }

  _unsubscribe(sub) {
    if (this.subs.get(sub.topic) !== sub) return;
    this.subs.delete(sub.topic);
    sub.state = 'closed';
    if (this.conn && this.conn.ready) this.conn.send({ type: 'unsubscribe', topic: sub.topic });
  }

  // The connection ended (or never opened): report it and schedule the next attempt.
  _lost({ reason, code, closeReason }) {
    const conn = this.conn;
    this.conn = null;
    if (conn) {
      clearTimeout(conn.timeout);
      unanswered(conn);
    }
    if (this.state === 'closed') return;
    const lived = this.openedAt ? Date.now() - this.openedAt : 0;
    if (lived >= this.options.stableMs) this.attempt = 0;
    const wasUp = this.state === 'connected';
    if (!wasUp) this.urlIndex = (this.urlIndex + 1) % this.urls.length;
    if (code && !KNOWN_CLOSES.has(code)) this._error('close', `unexpected close code ${code}`);
    this._setState('disconnected', { reason, code, closeReason });
    this._emit(this._on, 'disconnected', { reason, code, closeReason: closeReason || '' });
    if (code === EXPIRED || code === AUTH_REQUIRED || reason === 'unauthorized') this.token = null;
    const o = this.options;
    let delay;
    if (code === RESTART && this.attempt === 0) {
      delay = this.random() * o.reloadDelayMs;
    } else if ((code === AWAY || code === TRY_AGAIN || reason === 'refused') && this.attempt === 0) {
      delay = this.random() * o.restartDelayMs;
    } else {
      delay = this.random() * Math.min(o.maxDelayMs, o.initialDelayMs * o.factor ** this.attempt);
    }
    if (conn && conn.retryAfterMs) delay = Math.max(delay, conn.retryAfterMs * (1 + this.random()));
    this.attempt++;
    this._schedule(delay);
  }

  _schedule(delay) {
    // A listener of the events above may have closed the client.
    if (this.state === 'closed') return;
    delay = Math.round(delay);
    // The timer exists before the app hears of it, so a close() from a listener clears it.
    this.timer = setTimeout(() => this._open(), delay);
    this._setState('reconnecting', { delay });
    this._emit(this._on, 'reconnecting', { delay, attempt: this.attempt });
  }

  // Reconnects now (network back, page woke up): resumes are exact, so it costs only a handshake.
  _now() {
    if (this.state === 'reconnecting') this._open();
    else if (this.state === 'connected' && this.conn) this.conn.fail('sleep', 'woke up after a long sleep', 0, true);
  }

  // ---- what the server sends

  _onFrame(conn, text) {
    let m;
    try {
      m = JSON.parse(text);
    } catch {
      return conn.fail('protocol', 'the server sent something that is not JSON');
    }
    if (!m || typeof m !== 'object' || typeof m.type !== 'string') {
      return conn.fail('protocol', 'the server sent JSON without a type');
    }
    const handler = CONTROL[m.type];
    if (!handler) return conn.fail('protocol', `unknown message type ${JSON.stringify(m.type).slice(0, 64)}`);
    handler(this, conn, m);
  }

  _gap(sub, m) {
    const gap = { topic: m.topic, since: m.since ?? null, reason: m.reason };
    this._emit(sub._on, 'gap', gap);
    this._emit(this._on, 'gap', gap);
  }

  // ---- helpers

  _setState(state, detail = {}) {
    this.state = state;
    this._emit(this._on, 'state', { state, ...detail });
  }

  _error(kind, message, cause, topic) {
    const err = new Error(message);
    err.kind = kind;
    if (cause !== undefined) err.cause = cause;
    if (topic) err.topic = topic;
    this._emit(this._on, 'error', err);
    return err;
  }

  // Calls the app's listeners; what they throw becomes an `error` event (and what an error
  // listener throws is dropped), never an exception in the client's own code.
  _emit(map, event, value) {
    const set = map.get(event);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        fn(value);
      } catch (err) {
        if (event !== 'error') this._error('callback', `a ${event} listener threw`, err);
      }
    }
  }

  _browser(add) {
    const g = globalThis;
    if (typeof g.addEventListener !== 'function' || typeof document === 'undefined') return;
    if (add) {
      this._onOnline = () => this._now();
      this._onVisible = () => {
        if (document.visibilityState === 'hidden') this.hiddenAt = Date.now();
        else if (this.hiddenAt && Date.now() - this.hiddenAt >= this.options.sleepMs) this._now();
      };
      g.addEventListener('online', this._onOnline);
      document.addEventListener('visibilitychange', this._onVisible);
    } else if (this._onOnline) {
      g.removeEventListener('online', this._onOnline);
      document.removeEventListener('visibilitychange', this._onVisible);
    }
  }
}

// Rejects the presence() promises a connection will never answer.
function unanswered(conn) {
  if (!conn.expect) return;
  for (const [topic, q] of conn.expect) {
    for (const x of q) if (x.reject) x.reject(new PresenceError('disconnected', 'the connection ended before the answer', topic));
  }
  conn.expect = null;
}

function presenceChange(client, conn, m) {
  const sub = client.subs.get(m.topic);
  if (sub && sub.presence) sub._change(m.type, m.member);
}

// What the client does with each message type; a type not in this table is a protocol error.
const CONTROL = {
  // Appendable messages (docs/protocol.md): a live fragment, or (as `message` with `stream`)
  // a resume's text so far. The fold rule gives the app `{topic, id, stream, text, seq, done}`.
  append(client, conn, m) {
    const sub = client.subs.get(m.topic);
    if (!sub || typeof m.id !== 'string' || typeof m.seq !== 'number') return;
    const held = (sub._streams ||= new Map()).get(m.stream) || { text: '', seq: 0 };
    if (m.seq <= held.seq) return; // already in the text held
    if (m.type === 'append' && m.seq !== held.seq + 1) return client._resync(sub, 'fragments of a stream are missing', 'stream');
    const text = m.type === 'append' ? held.text + m.data : m.data;
    sub._streams.set(m.stream, { text, seq: m.seq });
    sub.lastId = m.id;
    const item = { topic: m.topic, id: m.id, stream: m.stream, text, seq: m.seq, done: !!m.done, reason: m.reason };
    client._emit(sub._on, 'append', item);
    client._emit(client._on, 'append', item);
  },
  message(client, conn, m) {
    if (m.stream !== undefined) return CONTROL.append(client, conn, m);
    const sub = client.subs.get(m.topic);
    if (!sub || typeof m.id !== 'string') return;
    // A message at or before the last one delivered is a repeat (never expected): drop it.
    if (sub.lastId && notAfter(m.id, sub.lastId)) return;
    const binary = m.encoding === 'base64';
    let data = m.data;
    let bytes = null;
    if (m.delta !== undefined) {
      // The resubscription's full message is on its way: this one belongs to the old stream.
      if (sub._resyncing) return;
      try {
        if (!sub.delta || !sub._base || m.delta !== sub.lastId) {
          throw new Error(`a delta of ${m.delta}, the last message is ${sub.lastId}`);
        }
        bytes = applyDelta(sub._base, binary ? fromBase64(m.data) : utf8.encode(m.data));
        data = binary ? bytes : fromUtf8.decode(bytes);
      } catch (err) {
        return client._resync(sub, String(err.message || err));
      }
    } else if (binary) {
      data = bytes = fromBase64(data);
    }
    if (sub._conflated) sub._conflated = false;
    else sub.lastId = m.id;
    sub._resyncing = false;
    if (sub.delta) sub._base = bytes || utf8.encode(data);
    const msg = { topic: m.topic, id: m.id, data, event: m.event };
    client._emit(sub._on, 'message', msg);
    client._emit(client._on, 'message', msg);
  },
  gap(client, conn, m) {
    const sub = client.subs.get(m.topic);
    if (sub) client._gap(sub, m);
  },
  // A slow subscriber of a conflating topic: the next message replaced `skipped` older ones
  // of its key. Nothing to reload; only the resume position waits.
  conflated(client, conn, m) {
    const sub = client.subs.get(m.topic);
    if (sub) sub._conflated = true;
  },
  subscribed(client, conn, m) {
    client._shift(conn, m.topic, (x) => x === 'S');
    const sub = client.subs.get(m.topic);
    if (!sub) return;
    sub.state = 'subscribed';
    client._emit(sub._on, 'subscribed', { topic: m.topic });
  },
  unsubscribed() {},
  // A member list: a presence() answer, or the subscription's (on subscribe, after a reconnect).
  presence(client, conn, m) {
    const head = client._shift(conn, m.topic, (x) => x !== 'S');
    if (head && head !== 'P') {
      const { type, ...page } = m;
      return head.resolve(page);
    }
    const sub = client.subs.get(m.topic);
    if (sub && sub.presence) sub._list(conn, m);
  },
  join: presenceChange,
  leave: presenceChange,
  authenticated(client, conn) {
    if (!conn.ready) client._ready(conn);
  },
  expiring(client, conn) {
    const get = client.options.getToken;
    if (!get) return;
    Promise.resolve()
      .then(get)
      .then((token) => {
        client.token = token;
        if (client.conn === conn) conn.send({ type: 'refresh', token });
      })
      .catch((err) => client._error('token', 'getToken failed on expiring', err));
  },
  error(client, conn, m) {
    const text = String(m.error || '');
    const head = client._shift(conn, m.topic, () => true);
    if (head && head.reject) return head.reject(new PresenceError('server', text, m.topic));
    // A refused subscribe: no member list follows it.
    if (head === 'S') client._shift(conn, m.topic, (x) => x === 'P');
    const sub = m.topic ? client.subs.get(m.topic) : null;
    if (!sub) {
      // A refused auth/refresh: drop the token and start again with a fresh one.
      if (!conn.ready || /token/.test(text)) return conn.fail('unauthorized', text);
      return void client._error('server', text);
    }
    if (/grant|token|invalid topic|invalid filter|max_subscriptions|more than|presence|delta/.test(text)) {
      // Refused for good (403 and friends): that subscription fails, the others go on.
      sub.state = 'failed';
      client.subs.delete(sub.topic);
      const err = client._error('subscription', text, undefined, sub.topic);
      client._emit(sub._on, 'error', err);
    } else {
      // A passing refusal (the broker is unreachable): try again on a new connection.
      conn.fail('server', text);
    }
  },
};

// A `clarion.v1` WebSocket.
class WsConn {
  constructor(client, url) {
    this.client = client;
    this.url = url;
    this.ready = false;
    const ws = (this.ws = new client.WebSocket(url, 'clarion.v1'));
    ws.binaryType = 'arraybuffer';
    ws.onopen = () => {
      this.opened = true;
      if (this.alive()) client._onOpen(this);
    };
    ws.onmessage = (e) => {
      if (!this.alive()) return;
      const d = e.data;
      if (typeof d !== 'string') return this.fail('protocol', 'the server sent a binary frame');
      if (d.length > client.options.maxFrameBytes) return this.fail('protocol', `frame of ${d.length} bytes over maxFrameBytes`);
      client._onFrame(this, d);
    };
    ws.onerror = () => {};
    ws.onclose = (e) => {
      if (!this.alive()) return;
      // Never open: the server could not be reached or refused the handshake. Said as the
      // Python Subscriber and the SSE transport say it, not as a close the server never sent.
      if (!this.opened) return this.fail('connect', `cannot reach ${this.url}`);
      this.dead = true;
      client._lost({ reason: e.code === EXPIRED ? 'expired' : 'closed', code: e.code, closeReason: e.reason });
    };
  }

  alive() {
    return !this.dead && this.client.conn === this;
  }

  send(m) {
    try {
      this.ws.send(JSON.stringify(m));
    } catch (err) {
      this.fail('send', 'send failed', 0);
    }
  }

  // Ends the connection on the client's side and reports why (silently when `quiet`).
  fail(reason, message, _code, quiet) {
    if (!this.alive()) return;
    if (!quiet) this.client._error(reason, message);
    this.drop(1000, reason);
    this.dead = true;
    this.client._lost({ reason, code: 0 });
  }

  drop(code, why) {
    this.dead = true;
    try {
      this.ws.close(code, why);
    } catch {
      // closing a socket that never opened: nothing to release
    }
  }
}

// SSE read with fetch: one stream per topic (`format=json`, resumed with `since=`), so every
// topic resumes exactly on every node; the token goes in the Authorization header.
class SseConn {
  constructor(client, url) {
    this.client = client;
    this.url = url.replace(/^ws/, 'http');
    this.ready = false;
    this.streams = new Map();
    queueMicrotask(() => this.alive() && client._onOpen(this));
  }

  alive() {
    return !this.dead && this.client.conn === this;
  }

  send(m) {
    if (m.type === 'subscribe') this.open(m.topic, m.since, m.presence, m.filter, m.delta);
    else if (m.type === 'unsubscribe') {
      const c = this.streams.get(m.topic);
      if (c) c.abort();
      this.streams.delete(m.topic);
    }
  }

  async open(topic, since, presence, filter, delta) {
    const ctl = new AbortController();
    const old = this.streams.get(topic);
    if (old) old.abort();
    this.streams.set(topic, ctl);
    const u = new URL(this.url);
    u.searchParams.append('topic', topic);
    u.searchParams.set('format', 'json');
    if (since) u.searchParams.set('since', since);
    if (presence) u.searchParams.set('presence', '1');
    if (filter !== undefined) {
      u.searchParams.set('filter', typeof filter === 'string' ? filter : jsonFilterText(filter));
    }
    if (delta) u.searchParams.set('delta', '1');
    const headers = { Accept: 'text/event-stream' };
    if (this.client.token) headers.Authorization = `Bearer ${this.client.token}`;
    let res;
    try {
      res = await fetch(u, { headers, signal: ctl.signal, cache: 'no-store' });
    } catch (err) {
      return this.fail('connect', `cannot reach ${this.url}`);
    }
    if (!this.alive()) return ctl.abort();
    if (res.status === 403) {
      ctl.abort();
      return CONTROL.error(this.client, this, { topic, error: 'the token does not grant this topic' });
    }
    if (res.status === 400) {
      // Presence refused (not a presence topic), an invalid topic: the server says which.
      const text = await res.text().catch(() => '');
      if (!this.alive()) return;
      return CONTROL.error(this.client, this, { topic, error: text.trim() || 'HTTP 400' });
    }
    if (res.status !== 200 || !res.body) {
      ctl.abort();
      const after = Number(res.headers.get('retry-after'));
      if (after > 0) this.retryAfterMs = after * 1000;
      const reason = res.status === 401 ? 'unauthorized' : res.status === 429 || res.status === 503 ? 'refused' : 'http';
      return this.fail(reason, `HTTP ${res.status}`);
    }
    this.client._onFrame(this, JSON.stringify({ type: 'subscribed', topic }));
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    let data = [];
    let event = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done || !this.alive()) break;
        buf += value;
        if (buf.length > this.client.options.maxFrameBytes) return this.fail('protocol', 'SSE event over maxFrameBytes');
        let nl;
        while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + (buf[nl] === '\r' && buf[nl + 1] === '\n' ? 2 : 1));
          if (line === '') {
            if (event === 'expired') return this.fail('expired', 'token expired', 0, true);
            if (data.length) this.client._onFrame(this, data.join('\n'));
            if (!this.alive()) return;
            data = [];
            event = '';
          } else if (line.startsWith('data:')) data.push(line.slice(line[5] === ' ' ? 6 : 5));
          else if (line.startsWith('event:')) event = line.slice(6).trim();
        }
      }
    } catch {
      // the stream broke: handled below like its end
    }
    if (this.alive() && this.streams.get(topic) === ctl) this.fail('closed', 'stream ended', 0, true);
  }

  fail(reason, message, _code, quiet) {
    if (!this.alive()) return;
    if (!quiet) this.client._error(reason, message);
    this.drop();
    this.client._lost({ reason, code: reason === 'expired' ? EXPIRED : 0 });
  }

  drop() {
    this.dead = true;
    for (const c of this.streams.values()) c.abort();
    this.streams.clear();
  }
}

// The text form of a filter given in its JSON form (docs/filters.md), for the URL of the SSE
// fallback; the server reads both to the same filter.
function jsonFilterText(f) {
  const str = (v) => '"' + String(v).replace(/[\\"]/g, (c) => '\\' + c) + '"';
  const [op] = Object.keys(f);
  const a = f[op];
  const cmp = { eq: '==', ne: '!=', lt: '<', lte: '<=', gt: '>', gte: '>=' };
  if (op === 'eq' || op === 'ne') return `${a[0]} ${cmp[op]} ${str(a[1])}`;
  if (op in cmp) return `${a[0]} ${cmp[op]} ${Number(a[1])}`;
  if (op === 'in') return `${a[0]} in [${a[1].map(str).join(', ')}]`;
  if (op === 'not') return `not (${jsonFilterText(a)})`;
  if (op === 'and' || op === 'or') return a.map((x) => `(${jsonFilterText(x)})`).join(` ${op} `);
  throw new Error(`unknown filter operator ${op}`);
}
