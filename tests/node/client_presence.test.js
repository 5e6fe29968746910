// Presence in the subscriber client (node/client): `subscribe(topic, { presence: true })` keeps
// the topic's members and emits `presence`, `join` and `leave`; `client.presence()` pages. Against
// the real server with presence_topics: two identities in a room, one identity with two
// connections, the member map after a cut connection and after a server restart (the fresh list
// replaces the map, the differences come as events), paging at presence_max_members, refusals,
// and the SSE transport.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const WebSocket = require('ws');
const jwt = require('jsonwebtoken');
const { waitFor } = require('./helpers');
const { relay: startRelay, SECRET, clientModule, killAll, Node } = require('./client_util');

after(killAll);

const load = () => import(clientModule);
const FAST = { initialDelayMs: 50, maxDelayMs: 400, restartDelayMs: 300, stableMs: 2000 };
const ARGS = ['--auth-secret', SECRET, '--api-key', SECRET, '--presence-topics', 'room.*', '--presence-max-members', '2'];

function token(sub, info) {
  const claim = { subscribe: ['room.*', 'news'] };
  if (info) claim.info = info;
  return jwt.sign({ sub, exp: Math.floor(Date.now() / 1000) + 300, clarion: claim }, SECRET, { algorithm: 'HS256' });
}

// A client for identity `sub`; `url` defaults to the node's /ws.
async function member(node, sub, info, url, extra = {}) {
  const { ClarionClient } = await load();
  const client = new ClarionClient(url || `ws://${node.clients}/ws`, { WebSocket, ...FAST, getToken: () => token(sub, info), ...extra });
  const errors = [];
  client.on('error', (e) => errors.push(e));
  client.errors = errors;
  return client;
}

// Subscribes with presence and records every presence event in order.
function watch(client, topic) {
  const log = [];
  const sub = client.subscribe(topic, { presence: true });
  sub.on('presence', (p) => log.push(['presence', [...p.members.keys()].join(',')]));
  sub.on('join', (m) => log.push(['join', m.sub, m.info]));
  sub.on('leave', (m) => log.push(['leave', m.sub, m.info]));
  sub.log = log;
  return sub;
}

const names = (sub) => [...sub.members.keys()].sort().join(',');

test('two identities in a room: list, join with info, leave; each sees the other', async () => {
  const node = await new Node(ARGS).start();
  const alice = await member(node, 'alice', { name: 'Alice' });
  const bob = await member(node, 'bob');
  try {
    const a = watch(alice, 'room.a');
    await waitFor(() => a.log.length === 1, 5000, "alice's first list");
    assert.deepEqual(a.log, [['presence', 'alice']]);
    assert.deepEqual(a.members.get('alice'), { name: 'Alice' });
    assert.equal(a.count, 1);
    assert.equal(a.connections, 1);

    const b = watch(bob, 'room.a');
    await waitFor(() => b.log.length === 1 && a.log.length === 2, 5000, "bob's list and alice's join");
    assert.deepEqual(b.log, [['presence', 'alice,bob']]);
    assert.deepEqual(b.members.get('alice'), { name: 'Alice' });
    assert.ok(b.members.has('bob') && b.members.get('bob') === undefined);
    assert.deepEqual(a.log[1], ['join', 'bob', undefined]);
    assert.equal(names(a), 'alice,bob');

    bob.close();
    await waitFor(() => a.log.length === 3, 5000, "bob's leave");
    assert.deepEqual(a.log[2], ['leave', 'bob', undefined]);
    assert.equal(names(a), 'alice');
    assert.deepEqual(alice.errors, []);
  } finally {
    alice.close();
    bob.close();
    await node.kill9();
  }
});

test('one identity with two connections is one member; it leaves with its last connection', async () => {
  const node = await new Node(ARGS).start();
  const watcher = await member(node, 'watcher');
  const tab1 = await member(node, 'carol', { name: 'Carol' });
  const tab2 = await member(node, 'carol', { name: 'Carol' });
  try {
    const w = watch(watcher, 'room.b');
    await waitFor(() => w.log.length === 1, 5000, 'first list');
    const t1 = tab1.subscribe('room.b');
    await waitFor(() => w.log.length === 2, 5000, "carol's join");
    assert.deepEqual(w.log[1], ['join', 'carol', { name: 'Carol' }]);
    const t2 = tab2.subscribe('room.b');
    await waitFor(() => t1.state === 'subscribed' && t2.state === 'subscribed', 5000, 'both tabs subscribed');
    // The second connection of the same identity is no event; a page counts it as a connection.
    const page = await watcher.presence('room.b');
    assert.equal(page.count, 2);
    assert.equal(page.connections, 3);
    assert.deepEqual(page.members, [{ sub: 'carol', info: { name: 'Carol' } }, { sub: 'watcher' }]);
    tab1.close();
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(w.log.length, 2, JSON.stringify(w.log));
    assert.equal(names(w), 'carol,watcher');
    tab2.close();
    await waitFor(() => w.log.length === 3, 5000, "carol's leave");
    assert.deepEqual(w.log[2], ['leave', 'carol', { name: 'Carol' }]);
    assert.equal(names(w), 'watcher');
  } finally {
    for (const c of [watcher, tab1, tab2]) c.close();
    await node.kill9();
  }
});

test('a cut connection: the fresh list replaces the map and the changes meanwhile come as join/leave', async () => {
  const node = await new Node(ARGS).start();
  let target = () => node.clients;
  const relay = await startRelay(() => target());
  const watcher = await member(node, 'watcher', undefined, `ws://${relay.address}/ws`);
  const dave = await member(node, 'dave');
  const erin = await member(node, 'erin', { name: 'Erin' });
  try {
    const w = watch(watcher, 'room.c');
    const d = dave.subscribe('room.c');
    await waitFor(() => d.state === 'subscribed' && names(w) === 'dave,watcher', 5000, 'dave and the watcher listed');
    const before = w.log.length;
    let disconnects = 0;
    watcher.on('disconnected', () => disconnects++);
    // The watcher is away (cut, and the relay refuses) while dave leaves and erin comes.
    target = () => '127.0.0.1:9';
    relay.cut();
    await waitFor(() => disconnects >= 1, 5000, 'the cut');
    dave.close();
    const e = erin.subscribe('room.c');
    await waitFor(() => e.state === 'subscribed', 5000, 'erin subscribed');
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(w.log.length, before, 'no event while away');
    target = () => node.clients;
    await waitFor(() => w.log.length >= before + 3, 10000, 'the fresh list after the reconnect');
    assert.deepEqual(w.log.slice(before), [
      ['leave', 'dave', undefined],
      ['join', 'erin', { name: 'Erin' }],
      ['presence', 'erin,watcher'],
    ]);
    assert.equal(names(w), 'erin,watcher');
    assert.deepEqual(w.members.get('erin'), { name: 'Erin' });
  } finally {
    for (const c of [watcher, dave, erin]) c.close();
    relay.close();
    await node.kill9();
  }
});

test('a server restart: every client resubscribes and the maps match who is really there', async () => {
  const node = await new Node(ARGS).start();
  const watcher = await member(node, 'watcher');
  const bob = await member(node, 'bob');
  const gone = await member(node, 'gone');
  try {
    const w = watch(watcher, 'room.d');
    const b = watch(bob, 'room.d');
    gone.subscribe('room.d');
    await waitFor(() => names(w) === 'bob,gone,watcher' && names(b) === 'bob,gone,watcher', 5000, 'three members');
    const lists = w.log.filter((x) => x[0] === 'presence').length;
    await node.kill9();
    gone.close(); // never comes back: only the fresh list can tell the others
    await node.start();
    await waitFor(() => w.log.filter((x) => x[0] === 'presence').length > lists && names(w) === 'bob,watcher', 10000, "the watcher's fresh list");
    await waitFor(() => names(b) === 'bob,watcher', 10000, "bob's fresh list");
    assert.ok(w.log.some((x) => x[0] === 'leave' && x[1] === 'gone'), JSON.stringify(w.log));
    assert.ok(b.log.some((x) => x[0] === 'leave' && x[1] === 'gone'), JSON.stringify(b.log));
    // The map agrees with the server's own answer.
    const page = await watcher.presence('room.d');
    assert.deepEqual(page.members.map((m) => m.sub), ['bob', 'watcher']);
  } finally {
    for (const c of [watcher, bob, gone]) c.close();
    await node.kill9();
  }
});

test('presence() pages at presence_max_members; a subscription assembles every page', async () => {
  const node = await new Node(ARGS).start();
  const others = await Promise.all(['m1', 'm2', 'm3', 'm4'].map((s) => member(node, s)));
  const asker = await member(node, 'asker');
  try {
    const subs = others.map((c) => c.subscribe('room.p'));
    await waitFor(() => subs.every((s) => s.state === 'subscribed'), 5000, 'four members');
    // Not followed by the asker: pages of any topic it may subscribe to.
    asker.connect();
    await waitFor(() => asker.state === 'connected', 5000, 'connected');
    const first = await asker.presence('room.p');
    assert.deepEqual(first.members.map((m) => m.sub), ['m1', 'm2']);
    assert.equal(first.more, true);
    assert.equal(first.next, 'm2');
    assert.equal(first.count, 4);
    const second = await asker.presence('room.p', { after: first.next });
    assert.deepEqual(second.members.map((m) => m.sub), ['m3', 'm4']);
    assert.equal(second.more, false);
    assert.equal(second.next, undefined);
    const past = await asker.presence('room.p', { after: 'm4' });
    assert.deepEqual(past.members, []);
    // Concurrent queries get their own answers.
    const [x, y] = await Promise.all([asker.presence('room.p', { after: 'm1' }), asker.presence('room.p', { after: 'm3' })]);
    assert.deepEqual([x.members.map((m) => m.sub), y.members.map((m) => m.sub)], [['m2', 'm3'], ['m4']]);
    // A presence subscription shows the whole room (five with itself), not the first page.
    const w = watch(asker, 'room.p');
    await waitFor(() => w.log.length === 1, 5000, 'the assembled list');
    assert.deepEqual(w.log, [['presence', 'asker,m1,m2,m3,m4']]);
    assert.equal(w.members.size, 5);
  } finally {
    for (const c of [...others, asker]) c.close();
    await node.kill9();
  }
});

test('refusals: a topic without presence, a query while not connected', async () => {
  const { PresenceError } = await load();
  const node = await new Node(ARGS).start();
  const client = await member(node, 'alice');
  try {
    await assert.rejects(client.presence('room.a'), (e) => e instanceof PresenceError && e.kind === 'disconnected' && e.topic === 'room.a');
    const refused = [];
    const news = client.subscribe('news', { presence: true, onError: (e) => refused.push(e) });
    const room = watch(client, 'room.a');
    await waitFor(() => refused.length === 1 && room.log.length === 1, 5000, 'the refusal and the room list');
    assert.equal(news.state, 'failed');
    assert.equal(refused[0].kind, 'subscription');
    assert.match(refused[0].message, /presence/);
    await assert.rejects(client.presence('news'), (e) => e instanceof PresenceError && e.kind === 'server' && /presence/.test(e.message));
    // The connection goes on.
    assert.equal(client.state, 'connected');
    assert.deepEqual((await client.presence('room.a')).members, [{ sub: 'alice' }]);
  } finally {
    client.close();
    await node.kill9();
  }
});

test('SSE transport: presence=1, the named events, and a fresh list after a cut', async () => {
  const { PresenceError } = await load();
  const node = await new Node(ARGS).start();
  const relay = await startRelay(() => node.clients);
  const sse = await member(node, 'sse-user', { name: 'S' }, `http://${relay.address}/sse`, { transport: 'sse' });
  const bob = await member(node, 'bob');
  const carol = await member(node, 'carol');
  try {
    const s = watch(sse, 'room.s');
    const got = [];
    s.on('message', (m) => got.push(m.data));
    await waitFor(() => s.log.length === 1, 5000, 'the SSE list');
    assert.deepEqual(s.log, [['presence', 'sse-user']]);
    assert.deepEqual(s.members.get('sse-user'), { name: 'S' });
    bob.subscribe('room.s');
    await waitFor(() => s.log.length === 2, 5000, "bob's join over SSE");
    assert.deepEqual(s.log[1], ['join', 'bob', undefined]);
    // Messages still arrive (and the presence events carry no id the client would resume from).
    await fetch(`http://${node.api}/publish/room.s`, { method: 'POST', body: 'hi', headers: { Authorization: `Bearer ${SECRET}` } });
    await waitFor(() => got.length === 1, 5000, 'the message');
    relay.cut();
    bob.close();
    carol.subscribe('room.s');
    await waitFor(() => names(s) === 'carol,sse-user' && s.log.filter((x) => x[0] === 'presence').length === 2, 10000, 'the fresh SSE list');
    assert.ok(s.log.some((x) => x[0] === 'leave' && x[1] === 'bob'), JSON.stringify(s.log));
    assert.deepEqual(got, ['hi'], 'nothing replayed twice');
    await assert.rejects(sse.presence('room.s'), (e) => e instanceof PresenceError && e.kind === 'unsupported');
    // A topic without presence fails its subscription (HTTP 400 on SSE), not the client.
    const refused = [];
    sse.subscribe('news', { presence: true, onError: (e) => refused.push(e) });
    await waitFor(() => refused.length === 1, 5000, 'the refusal');
    assert.match(refused[0].message, /presence/);
  } finally {
    for (const c of [sse, bob, carol]) c.close();
    relay.close();
    await node.kill9();
  }
});
