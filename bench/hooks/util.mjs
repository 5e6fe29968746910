// What the hook benchmarks share: a private redis-server, a clarion group started and awaited,
// the CPU time of its processes from /proc, percentiles.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import readline from 'node:readline';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The first line a child process writes on stdout. */
export function firstLine(proc) {
  return new Promise((resolve, reject) => {
    const rl = readline.createInterface({ input: proc.stdout });
    rl.once('line', (l) => resolve(l));
    proc.once('exit', (c) => reject(new Error(`exited with ${c}`)));
  });
}

const ticks = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }));

/** User + system CPU seconds of these live processes, from /proc/<pid>/stat. */
export function cpuSeconds(pids) {
  let t = 0;
  for (const pid of pids) {
    try {
      const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
      t += Number(f[11]) + Number(f[12]);
    } catch {
      // gone since
    }
  }
  return t / ticks;
}

/** The process ids whose parent is `pid`. */
export function children(pid) {
  return fs.readdirSync('/proc').filter((e) => /^\d+$/.test(e)).filter((e) => {
    try {
      return fs.readFileSync(`/proc/${e}/stat`, 'utf8').split(') ')[1].split(' ')[1] === String(pid);
    } catch {
      return false;
    }
  }).map(Number);
}

/** [status, body] of a GET; [0, ''] when it cannot connect. */
export function get(url) {
  return new Promise((resolve) => {
    http.get(url, (res) => {
      let b = '';
      res.on('data', (d) => (b += d));
      res.on('end', () => resolve([res.statusCode, b]));
    }).on('error', () => resolve([0, '']));
  });
}

export const pct = (xs, p) => xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
export const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** The environment without CLARION_* settings, so only the flags given count. */
export const serverEnv = () => Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CLARION_')));

/** A redis-server on a random loopback port, without persistence: { url, proc }. */
export async function startRedis() {
  const port = 20000 + Math.floor(Math.random() * 20000);
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  await sleep(300);
  return { url: `redis://127.0.0.1:${port}`, proc };
}

/** Waits until every process of a group answers its /healthz (at most 10 s). */
export async function waitHealthy(api, processes) {
  for (let i = 0; i < 200; i++) {
    const [status, body] = await get(`http://${api}/healthz`);
    if (status === 200 && body.startsWith(`ok (${processes} of ${processes}`)) return;
    await sleep(50);
  }
  throw new Error(`the group at ${api} is not healthy`);
}
