import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadDotEnv } from '../../host/env-file';

const ROOT = join(__dirname, '..', '..');

test('.env fills in what the environment does not set, and never overrides a set variable', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-envfile-'));
  try {
    const file = join(dir, '.env');
    writeFileSync(file, ['# keys', 'OPENAI_API_KEY=sk-from-file', 'export HALO_LOG_LEVEL=debug', 'EMPTY_SET=from-file', 'QUOTED="a b # not a comment"', 'HALO_X=1 # a comment', ''].join('\n'));
    const env: NodeJS.ProcessEnv = { HALO_LOG_LEVEL: 'warn', EMPTY_SET: '' };
    const set = loadDotEnv(env, file);
    assert.deepEqual(set.sort(), ['HALO_X', 'OPENAI_API_KEY', 'QUOTED']);
    assert.equal(env.OPENAI_API_KEY, 'sk-from-file');
    assert.equal(env.HALO_LOG_LEVEL, 'warn', 'a variable already set wins');
    assert.equal(env.EMPTY_SET, '', 'set to empty is set');
    assert.equal(env.QUOTED, 'a b # not a comment');
    assert.equal(env.HALO_X, '1');
    assert.deepEqual(loadDotEnv({}, join(dir, 'missing.env')), [], 'no file, nothing to do');
    const named: NodeJS.ProcessEnv = { HALO_ENV_FILE: file };
    loadDotEnv(named);
    assert.equal(named.OPENAI_API_KEY, 'sk-from-file', 'HALO_ENV_FILE names the file');
    const none: NodeJS.ProcessEnv = { HALO_ENV_FILE: '' };
    assert.deepEqual(loadDotEnv(none), []);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('.env is never committed, and the CLI and every worker read it first', () => {
  const ignored = execFileSync('git', ['check-ignore', '.env'], { cwd: ROOT, encoding: 'utf8' }).trim();
  assert.equal(ignored, '.env');
  for (const f of ['client/cli.ts', 'workers/control.ts', 'workers/browser.ts']) {
    const first = readFileSync(join(ROOT, f), 'utf8').split('\n').find((l) => l.startsWith('import '));
    assert.match(first ?? '', /^import '\.\.\/host\/load-env';/, `${f} loads .env before any other import`);
  }
  assert.match(readFileSync(join(ROOT, 'workers/learner/halo_learner/worker.py'), 'utf8'), /def main\(\) -> int:\n\s+load_dotenv\(\)/);
});
