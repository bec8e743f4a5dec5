import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { logCapFromEnv, RotatingLog } from '../../client/log-rotation';
import { isAlive, spawnBackground } from '../../client/processes';

function logFiles(dir: string): string[] {
  return readdirSync(dir).filter((f) => f.startsWith('w.log'));
}

test('a log written far past its cap keeps at most HALO_LOG_FILES files, none above HALO_LOG_MAX_MB', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-logrot-'));
  const log = new RotatingLog(join(dir, 'w.log'), { maxBytes: 1000, files: 3 });
  const line = Buffer.from(`${'x'.repeat(299)}\n`);
  for (let i = 0; i < 100; i++) log.write(line);
  log.write(Buffer.alloc(5000, 'y'));
  log.close();
  const files = logFiles(dir).sort();
  assert.deepEqual(files, ['w.log', 'w.log.1', 'w.log.2']);
  for (const f of files) assert.ok(statSync(join(dir, f)).size <= 1000, `${f} is ${statSync(join(dir, f)).size} bytes`);
  // The newest bytes are in w.log, the ones before them in w.log.1.
  assert.match(readFileSync(join(dir, 'w.log'), 'utf8'), /^y+$/);
});

test('the cap comes from HALO_LOG_MAX_MB and HALO_LOG_FILES; bad values are refused by name', () => {
  assert.deepEqual(logCapFromEnv({}), { maxBytes: 50 * 1024 * 1024, files: 3 });
  assert.deepEqual(logCapFromEnv({ HALO_LOG_MAX_MB: '0.5', HALO_LOG_FILES: '2' }), { maxBytes: 512 * 1024, files: 2 });
  assert.throws(() => logCapFromEnv({ HALO_LOG_MAX_MB: '0' }), /HALO_LOG_MAX_MB/);
  assert.throws(() => logCapFromEnv({ HALO_LOG_MAX_MB: 'lots' }), /HALO_LOG_MAX_MB/);
  assert.throws(() => logCapFromEnv({ HALO_LOG_FILES: '1.5' }), /HALO_LOG_FILES/);
});

test('a background process started as halo up starts its workers has its running log capped', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-logrot-home-'));
  // 64 KiB per file, 2 files; the process writes 1 MiB to stdout and stderr while it runs.
  const env = { ...process.env, HALO_LOG_MAX_MB: String(64 / 1024), HALO_LOG_FILES: '2' };
  const script = "const b='z'.repeat(1023)+'\\n'; for (let i=0;i<512;i++){process.stdout.write(b);process.stderr.write(b);} console.log('last line');";
  const proc = spawnBackground(home, 'w', process.execPath, ['-e', script], env);
  const dir = join(home, 'logs');
  while (isAlive(proc.pid) || !readFileSync(join(dir, 'w.log'), 'utf8').includes('last line')) await new Promise((r) => setTimeout(r, 50));
  const files = logFiles(dir).sort();
  assert.deepEqual(files, ['w.log', 'w.log.1']);
  for (const f of files) assert.ok(statSync(join(dir, f)).size <= 64 * 1024, `${f} is ${statSync(join(dir, f)).size} bytes`);
  assert.ok(!existsSync(join(dir, 'w.log.2')));
});
