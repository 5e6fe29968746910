#!/usr/bin/env node
// The `clarion` command: runs the platform package's binary with the same arguments, streams
// and exit status. Signals sent to this process are passed on, so stopping `npx clarion serve`
// (Ctrl-C, or SIGTERM from a process manager) stops the server, not just the launcher.

import { spawn } from 'node:child_process';
import { BinaryNotFoundError, findClarionBinary } from '../lib/binary.js';

let binary;
try {
  binary = findClarionBinary();
} catch (e) {
  if (!(e instanceof BinaryNotFoundError)) throw e;
  process.stderr.write(`clarion: ${e.message}\n`);
  process.exit(1);
}

const child = spawn(binary, process.argv.slice(2), { stdio: 'inherit' });
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2']) {
  process.on(signal, () => child.kill(signal));
}
// `npm exec` (npx) runs this through `sh -c`; SIGTERM to npm ends npm and the shell but reaches
// neither this process nor the server, which would run on, orphaned, holding its ports. The
// process that started this one going away is the same request to stop: this process is then
// adopted, and its parent changes.
const parent = process.ppid;
const orphaned = setInterval(() => {
  if (process.ppid !== parent) {
    clearInterval(orphaned);
    child.kill('SIGTERM');
  }
}, 250);
orphaned.unref();
child.on('error', (e) => {
  process.stderr.write(`clarion: cannot run ${binary}: ${e.message}\n`);
  process.exit(1);
});
child.on('exit', (code, signal) => {
  if (signal) {
    // Die of the same signal, so the caller sees what the server saw.
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
  } else {
    process.exit(code ?? 1);
  }
});
