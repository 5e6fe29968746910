// A minimal application backend for Clarion's hooks (docs/hooks.md), Node's standard library only.
//
//   CLARION_HOOK_SECRET=s3cret node backend.js 8000
//
// It answers the three hooks at /hooks/connect, /hooks/subscribe and /hooks/publish, and takes
// webhook events at /hooks/events. Sessions are an object here; a real application looks the
// cookie up in its session store. Every request's Clarion-Signature is checked first; a request
// it cannot trust gets 401. GET /stats shows what it was asked and told (for tests).
'use strict';
const crypto = require('node:crypto');
const http = require('node:http');

const SECRET = process.env.CLARION_HOOK_SECRET || '';
const SESSIONS = { 's-alice': 'alice', 's-admin': 'admin' };
const CALLS = { connect: 0, subscribe: 0, publish: 0 };
const EVENTS = {}; // webhook events by type
const SEEN = new Set(); // webhook event ids: a batch whose answer was lost is sent again
const ONLINE = new Map(); // connection id -> user, from `connected` / `disconnected`

// Checks `Clarion-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`.
function verified(header, body, maxAge = 300) {
  const fields = Object.fromEntries((header || '').split(',').map((p) => p.split('=', 2)));
  const t = Number(fields.t);
  if (!Number.isInteger(t) || Math.abs(Date.now() / 1000 - t) > maxAge) return false;
  const want = crypto.createHmac('sha256', SECRET).update(`${t}.`).update(body).digest();
  const got = Buffer.from(fields.v1 || '', 'hex');
  return got.length === want.length && crypto.timingSafeEqual(got, want);
}

function decide(kind, req) {
  if (kind === 'connect') {
    const user = SESSIONS[req.cookies.session || ''];
    if (!user) return { allow: false, status: 401, reason: 'log in first' };
    return {
      allow: true,
      sub: user,
      info: { name: user[0].toUpperCase() + user.slice(1) },
      subscribe: ['chat.*', `user.${user}`],
      topics: [`user.${user}`],
    };
  }
  if (kind === 'subscribe') {
    if (req.topic.startsWith('admin.') && req.sub !== 'admin') {
      return { allow: false, reason: 'admins only' };
    }
    return { allow: true };
  }
  return { allow: true, data: req.data.replaceAll('darn', '****') };
}

// Webhook events, at least once and in order: an id seen before is a repeat.
function record(events) {
  for (const event of events) {
    if (SEEN.has(event.id)) continue;
    SEEN.add(event.id);
    EVENTS[event.type] = (EVENTS[event.type] || 0) + 1;
    if (event.type === 'connected') ONLINE.set(event.conn, event.sub);
    else if (event.type === 'disconnected') ONLINE.delete(event.conn);
    // topic_occupied / topic_vacated, and types added later: counted, nothing else.
  }
}

function stats() {
  const online = [...ONLINE.values()].filter(Boolean).sort();
  return { ...CALLS, events: EVENTS, online };
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    const answer = (status, obj) => {
      const out = JSON.stringify(obj);
      res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(out) });
      res.end(out);
    };
    if (req.method === 'GET') return answer(200, stats()); // /stats, for tests
    if (SECRET && !verified(req.headers['clarion-signature'], body)) {
      return answer(401, { allow: false, reason: 'bad signature' });
    }
    const kind = req.url.split('/').filter(Boolean).pop();
    if (kind === 'events') {
      record(JSON.parse(body).events);
      return answer(200, {});
    }
    if (!(kind in CALLS)) return answer(404, { error: 'no such hook' });
    CALLS[kind] += 1;
    answer(200, decide(kind, JSON.parse(body)));
  });
});
server.listen(Number(process.argv[2] || 8000), '127.0.0.1', () => {
  console.log(`listening ${server.address().port}`);
});
