// The real pusher-js client (its Node build) across a hand-over upgrade (SIGUSR1 to a lone
// server, docs/pusher.md "Upgrades"): a client in a public and a presence channel, with a
// second member watching, sees no state change (no `connecting`, no reconnect, the same
// socket id) and gets the events triggered after the upgrade; the watcher sees no
// `member_removed` / `member_added`.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const Pusher = require('pusher');
const { binary, waitFor, PUSHER_APP, pusherArgs, pusherJsClient } = require('./helpers');

const APP = PUSHER_APP;
const clients = [];
const pids = [];

after(() => {
  clients.forEach((c) => c.disconnect());
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
});

// The server, with every line of its stdout kept (its successor writes its ready line there).
function startServer(args) {
  const child = spawn(binary(), ['serve', '--listen', '127.0.0.1:0', '--api-listen', '127.0.0.1:0', ...args], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  pids.push(child.pid);
  const lines = [];
  const stdout = readline.createInterface({ input: child.stdout });
  stdout.on('line', (l) => lines.push(l));
  return new Promise((resolve, reject) => {
    stdout.once('line', (line) => {
      const m = /clients=(\S+) api=(\S+)/.exec(line);
      if (m) resolve({ clients: m[1], api: m[2], child, lines });
      else reject(new Error(`unexpected first line: ${line}`));
    });
  });
}

function client(addr, lib, user) {
  const c = pusherJsClient(addr, lib, APP.key, user);
  clients.push(c);
  return c;
}

function subscribed(c, name) {
  const ch = c.subscribe(name);
  return new Promise((resolve, reject) => {
    ch.bind('pusher:subscription_succeeded', () => resolve(ch));
    ch.bind('pusher:subscription_error', reject);
  });
}

test('pusher-js lives through SIGUSR1: no reconnect, the same socket id, events after it, no member_removed', async () => {
  const pidFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'clarion-pusher-')), 'pid');
  const old = await startServer([...pusherArgs(), '--pid-file', pidFile]);
  const i = old.api.lastIndexOf(':');
  const lib = new Pusher({ ...APP, host: old.api.slice(0, i), port: old.api.slice(i + 1), useTLS: false });
  const a = client(old.clients, lib, { user_id: 'ada', user_info: { name: 'Ada' } });
  const states = [];
  a.connection.bind('state_change', (s) => states.push(s.current));
  const ticker = await subscribed(a, 'ticker');
  const roomA = await subscribed(a, 'presence-room');
  const b = client(old.clients, lib, { user_id: 'bob' });
  const roomB = await subscribed(b, 'presence-room');
  await waitFor(() => roomA.members.count === 2, 5000, 'ada to see bob');
  const sid = a.connection.socket_id;
  const seen = { a: [], b: [], members: [] };
  ticker.bind('quote', (d) => seen.a.push(d.n));
  roomA.bind('said', (d) => seen.a.push(d.n));
  roomB.bind('said', (d) => seen.b.push(d.n));
  for (const ch of [roomA, roomB]) {
    ch.bind('pusher:member_removed', (m) => seen.members.push(`-${m.id}`));
    ch.bind('pusher:member_added', (m) => seen.members.push(`+${m.id}`));
  }
  const before = states.length;

  old.child.kill('SIGUSR1');
  await waitFor(() => old.lines.some((l) => l.startsWith('clarion ready')), 20000, 'the successor');
  await new Promise((resolve) => (old.child.exitCode !== null ? resolve() : old.child.once('exit', resolve)));
  pids.push(Number(fs.readFileSync(pidFile, 'utf8')));

  await lib.trigger('ticker', 'quote', { n: 1 });
  await lib.trigger('presence-room', 'said', { n: 2 });
  await waitFor(() => seen.a.length === 2 && seen.b.length === 1, 10000, 'the events after the upgrade');
  await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(seen.a, [1, 2]);
  assert.deepEqual(seen.b, [2]);
  assert.deepEqual(seen.members, [], 'no member left or joined');
  assert.deepEqual(states.slice(before), [], 'no state change: no reconnect');
  assert.equal(a.connection.socket_id, sid);
  assert.equal(roomB.members.count, 2);
});
