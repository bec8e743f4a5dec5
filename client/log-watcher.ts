/**
 * `node --import tsx client/log-watcher.ts <file> <maxBytes> <files> <pid> [identity…]`: keeps the log of the
 * background process `pid` within its cap (`rotateIfOver`) for as long as that process runs, then checks once
 * more and exits. `spawnBackground` starts one beside each process, in a session of its own, so it outlives the
 * CLI that started both and no terminal hangup or signal aimed at the stack's process group reaches it. The
 * process writes to its file directly, never through this one: if the watcher is gone, the log only grows.
 */
import { watch } from 'node:fs';
import { rotateIfOver } from './log-rotation';
import { isAlive, processIdentity } from './processes';

const [file, maxBytesText, filesText, pidText, ...identityWords] = process.argv.slice(2);
const maxBytes = Number(maxBytesText);
const files = Number(filesText);
const pid = Number(pidText);
if (!file || !Number.isInteger(maxBytes) || maxBytes < 1 || !Number.isInteger(files) || files < 1 || !Number.isInteger(pid) || pid < 1) {
  console.error('usage: log-watcher.ts <file> <maxBytes ≥ 1> <files ≥ 1> <pid> [identity…]');
  process.exit(2);
}
const cap = { maxBytes, files };
const identity = identityWords.join(' ');

process.on('SIGHUP', () => {});

/** The process is gone, or its pid now names another process (its identity, as in its pid file, differs). */
function writerGone(): boolean {
  if (!isAlive(pid)) return true;
  if (identity === '') return false;
  const now = processIdentity(pid);
  return now !== undefined && now !== identity;
}

function check(): void {
  try {
    rotateIfOver(file, cap);
  } catch (err) {
    // A full disk or a file an operator moved: the next change tries again.
    console.error(`log-watcher: ${file}: ${(err as Error).message}`);
  }
}

// Every change of the file is looked at, so the live file overshoots the cap by at most what one write adds;
// the timer catches changes a watch can miss and notices the end of the process.
let watcher: ReturnType<typeof watch> | undefined;
try {
  watcher = watch(file, { persistent: false }, check);
  watcher.on('error', () => {});
} catch {
  /* no inotify left: the timer alone */
}
const timer = setInterval(() => {
  check();
  if (writerGone()) {
    clearInterval(timer);
    watcher?.close();
    check();
  }
}, 500);
check();
