import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { logCapFromEnv, rotateIfOver } from '../../client/log-rotation';
import { isAlive, readPid, spawnBackground } from '../../client/processes';

const REPO = resolve(__dirname, '../..');

function logFiles(dir: string, name: string): string[] {
  return readdirSync(dir)
    .filter((f) => f.startsWith(`${name}.log`))
    .sort();
}

async function until(what: string, ok: () => boolean): Promise<void> {
  for (let i = 0; !ok(); i++) {
    if (i > 1200) assert.fail(`never: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test('a log far past its cap keeps at most HALO_LOG_FILES files, none above HALO_LOG_MAX_MB, the newest bytes kept', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-logrot-'));
  const file = join(dir, 'w.log');
  writeFileSync(file, `${'a'.repeat(999)}\n`);
  assert.equal(rotateIfOver(file, { maxBytes: 1000, files: 3 }), false, 'at the cap is not over it');
  writeFileSync(file, `${'b'.repeat(4999)}\n`, { flag: 'a' });
  assert.equal(rotateIfOver(file, { maxBytes: 1000, files: 3 }), true);
  assert.deepEqual(logFiles(dir, 'w'), ['w.log', 'w.log.1', 'w.log.2']);
  assert.equal(statSync(file).size, 0, 'the live file is cut in place');
  assert.equal(readFileSync(`${file}.1`, 'utf8'), `${'b'.repeat(999)}\n`);
  assert.equal(readFileSync(`${file}.2`, 'utf8'), 'b'.repeat(1000));
  writeFileSync(file, 'c'.repeat(1500), { flag: 'a' });
  rotateIfOver(file, { maxBytes: 1000, files: 3 });
  assert.equal(readFileSync(`${file}.1`, 'utf8'), 'c'.repeat(1000));
  assert.equal(readFileSync(`${file}.2`, 'utf8'), 'c'.repeat(500), 'the older rotations are dropped, not kept past the count');
  rmSync(dir, { recursive: true, force: true });
});

test('the cap comes from HALO_LOG_MAX_MB and HALO_LOG_FILES; bad values are refused by name', () => {
  assert.deepEqual(logCapFromEnv({}), { maxBytes: 50 * 1024 * 1024, files: 3 });
  assert.deepEqual(logCapFromEnv({ HALO_LOG_MAX_MB: '0.5', HALO_LOG_FILES: '2' }), { maxBytes: 512 * 1024, files: 2 });
  assert.throws(() => logCapFromEnv({ HALO_LOG_MAX_MB: '0' }), /HALO_LOG_MAX_MB/);
  assert.throws(() => logCapFromEnv({ HALO_LOG_MAX_MB: 'lots' }), /HALO_LOG_MAX_MB/);
  assert.throws(() => logCapFromEnv({ HALO_LOG_FILES: '1.5' }), /HALO_LOG_FILES/);
  const home = mkdtempSync(join(tmpdir(), 'halo-logrot-bad-'));
  assert.throws(() => spawnBackground(home, 'w', 'true', [], { ...process.env, HALO_LOG_FILES: '0' }), /HALO_LOG_FILES/);
  rmSync(home, { recursive: true, force: true });
});

// 64 KiB per file, 2 files. The process waits for `go`, then writes 1 MiB to stdout and stderr, its last line,
// and a `done` file (it must live through its whole output, whatever happened to the watcher). With
// `afterRotation` it writes its last line only once its log is back under the cap: a line that lands between a
// rotation's last look and its truncation is lost by design (copytruncate), so the test of what rotation keeps
// must not race one.
const CAP_ENV = { HALO_LOG_MAX_MB: String(64 / 1024), HALO_LOG_FILES: '2' };
const writer = (afterRotation: boolean) =>
  [
    "const fs = require('node:fs'); const [go, done] = process.argv.slice(1);",
    'const t = setInterval(() => { if (!fs.existsSync(go)) return; clearInterval(t);',
    "const b = 'z'.repeat(1023) + '\\n'; for (let i = 0; i < 512; i++) { process.stdout.write(b); process.stderr.write(b); }",
    `const w = setInterval(() => { if (${afterRotation} && fs.fstatSync(1).size > 64 * 1024) return; clearInterval(w);`,
    "console.log('last line'); fs.writeFileSync(done, ''); }, 20); }, 20);",
  ].join(' ');

/** Starts the writer as `halo up` starts a worker, from a CLI process that exits at once; returns the pids. */
function startFromExitedCli(home: string, afterRotation = false): { pid: number; watcher: number } {
  const cli = [
    "const { spawnBackground } = require('./client/processes');",
    `const p = spawnBackground(${JSON.stringify(home)}, 'w', process.execPath, ['-e', ${JSON.stringify(writer(afterRotation))}, ${JSON.stringify(join(home, 'go'))}, ${JSON.stringify(join(home, 'done'))}], { ...process.env, ...${JSON.stringify(CAP_ENV)} });`,
    'console.log(JSON.stringify({ pid: p.pid, watcher: p.logWatcherPid }));',
  ].join(' ');
  const r = spawnSync(process.execPath, ['--import', 'tsx', '-e', cli], { cwd: REPO, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const started = JSON.parse(r.stdout.trim().split('\n').pop() ?? '{}');
  assert.ok(started.pid && started.watcher, `pids: ${r.stdout}`);
  return started;
}

test("a process started by halo up's spawn has its running log capped after the CLI exited, and a hangup leaves the watcher be", async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-logrot-home-'));
  const { pid, watcher } = startFromExitedCli(home, true);
  assert.equal(readPid(home, 'w'), pid);
  // A session of its own keeps terminal hangups away; one sent anyway, once Node has its handler, is ignored.
  await until('the watcher catches SIGHUP', () => (BigInt(`0x${/^SigCgt:\s*([0-9a-f]+)$/m.exec(readFileSync(`/proc/${watcher}/status`, 'utf8'))?.[1] ?? '0'}`) & 1n) === 1n);
  process.kill(watcher, 'SIGHUP');
  writeFileSync(join(home, 'go'), '');
  await until('the writer and its log watcher end', () => !isAlive(pid) && !isAlive(watcher));
  assert.ok(existsSync(join(home, 'done')));
  const dir = join(home, 'logs');
  assert.deepEqual(logFiles(dir, 'w'), ['w.log', 'w.log.1']);
  for (const f of logFiles(dir, 'w')) assert.ok(statSync(join(dir, f)).size <= 64 * 1024, `${f} is ${statSync(join(dir, f)).size} bytes`);
  const newest = readFileSync(join(dir, 'w.log.1'), 'utf8') + readFileSync(join(dir, 'w.log'), 'utf8');
  assert.match(newest, /last line\n$/, 'the newest lines are kept');
  rmSync(home, { recursive: true, force: true });
});

test('a process whose log watcher was killed keeps running and writing (its output is a file, never a pipe)', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-logrot-killed-'));
  const { pid, watcher } = startFromExitedCli(home);
  process.kill(watcher, 'SIGKILL');
  await until('the watcher is gone', () => !isAlive(watcher));
  writeFileSync(join(home, 'go'), '');
  await until('the writer ends', () => !isAlive(pid));
  assert.ok(existsSync(join(home, 'done')), 'the writer lived through all of its output');
  assert.match(readFileSync(join(home, 'logs', 'w.log'), 'utf8'), /last line\n$/);
  rmSync(home, { recursive: true, force: true });
});
