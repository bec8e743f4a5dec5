import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadDotEnv, parseDotEnv } from '../../host/env-file';

const ROOT = join(__dirname, '..', '..');
const FIXTURE = join(ROOT, 'test', 'fixtures', 'dotenv', 'grammar.env');
const EXPECTED: Record<string, string> = JSON.parse(readFileSync(join(ROOT, 'test', 'fixtures', 'dotenv', 'expected.json'), 'utf8'));

// One .env grammar (the npm dotenv package's) for the CLI and the workers, the learner
// (workers/learner/tests/test_envfile.py asserts the same map on the same file) and launch.sh's reader.
test('.env grammar: the shared fixture gives the expected map (dotenv rules: a hash ends an unquoted value, quoted values span lines)', () => {
  assert.deepEqual(parseDotEnv(readFileSync(FIXTURE, 'utf8')), EXPECTED);
  assert.equal(EXPECTED.HASH_NO_SPACE, 'abc');
  assert.equal(EXPECTED.MULTI_DOUBLE, 'line one\nline two\n  line three');
  const env: NodeJS.ProcessEnv = {};
  loadDotEnv(env, FIXTURE);
  assert.deepEqual(env, EXPECTED);
});

test("launch.sh's .env reader (bin/launch-gpu.sh gpu_dotenv_get) agrees with the grammar on every key of the fixture", () => {
  const keys = Object.keys(EXPECTED);
  const script = `say() { echo "$*" >&2; }; . bin/launch-gpu.sh; for k in "$@"; do if v="$(gpu_dotenv_get "$k"; rc=$?; printf x; exit $rc)"; then printf '%s\\0' "$k=\${v%x}"; fi; done; ! gpu_dotenv_get NOT_IN_FILE || echo found`;
  const out = execFileSync('bash', ['-c', script, 'bash', ...keys], { cwd: ROOT, env: { ...process.env, HALO_ENV_FILE: FIXTURE }, encoding: 'utf8' });
  const got: Record<string, string> = {};
  for (const kv of out.split('\0').filter((x) => x !== '')) got[kv.slice(0, kv.indexOf('='))] = kv.slice(kv.indexOf('=') + 1);
  assert.deepEqual(got, EXPECTED);
  assert.doesNotMatch(out, /found/, 'a key not in the file is not found');
});

test('.env fills in what the environment does not set, and never overrides a set variable', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-envfile-'));
  try {
    const file = join(dir, '.env');
    writeFileSync(
      file,
      ['# keys', 'OPENAI_API_KEY=sk-from-file', 'export HALO_LOG_LEVEL=debug', 'EMPTY_SET=from-file', 'QUOTED="a b # not a comment"', 'HALO_X=1 # a comment', ''].join('\n'),
    );
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
    const first = readFileSync(join(ROOT, f), 'utf8')
      .split('\n')
      .find((l) => l.startsWith('import '));
    assert.match(first ?? '', /^import '\.\.\/host\/load-env';/, `${f} loads .env before any other import`);
  }
  assert.match(readFileSync(join(ROOT, 'workers/learner/halo_learner/worker.py'), 'utf8'), /def main\(\) -> int:\n\s+load_dotenv\(\)/);
});
