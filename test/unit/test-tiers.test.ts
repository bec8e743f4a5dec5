import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { REPO_ROOT } from '../../client/processes';

// The tiers of `./launch.sh test`: fast (`npm test`), integration and slow; nothing runs them all (CI). `--dry-run`
// prints each command a tier would run, so what runs where is read here without running it. Which of the learner's
// tests `-m 'not model'` keeps: test/integration/learner-fast-marker.test.ts (it collects the whole pytest suite).

function launchTest(...args: string[]) {
  return spawnSync('bash', ['launch.sh', '--skip-setup', 'test', ...args], { cwd: REPO_ROOT, encoding: 'utf8', timeout: 60_000 });
}

/** The commands a tier runs, one per line, as `--dry-run` prints them. */
function plan(tier?: string): string[] {
  const r = launchTest(...(tier ? [tier] : []), '--dry-run');
  assert.equal(r.status, 0, r.stdout + r.stderr);
  return r.stdout.trim().split('\n');
}

/** The test files of node's command in `lines` whose results go to `<name>.jsonl`. */
function nodeFiles(lines: string[], name: string): string[] {
  const line = lines.find((l) => l.includes(`/${name}.jsonl`));
  assert.ok(line, `a node command for ${name} in:\n${lines.join('\n')}`);
  return line.split(' ').filter((w) => w.endsWith('.test.ts'));
}

const testFiles = (dir: string) =>
  readdirSync(`${REPO_ROOT}/${dir}`)
    .filter((f) => f.endsWith('.test.ts'))
    .map((f) => `${dir}/${f}`)
    .sort();

test('./launch.sh test takes fast, integration, slow or nothing, and names the tiers on anything else', () => {
  const r = launchTest('quick');
  assert.equal(r.status, 2, `exit ${r.status}: ${r.stderr}`);
  assert.match(r.stderr, /no tier 'quick' \(fast: .*; integration: .*; slow: .*learning\.test\.ts.*; nothing: everything\)/);
  const two = launchTest('fast', 'slow');
  assert.equal(two.status, 2, two.stderr);
  assert.match(two.stderr, /one tier at most, not 'fast slow'/);
});

test('the tiers split the suite: fast is unit and workflow files, integration and slow share test/integration/ without overlap', () => {
  const fast = plan('fast');
  assert.deepEqual(nodeFiles(fast, 'node-fast').sort(), [...testFiles('test/unit'), ...testFiles('test/workflows')].sort());
  assert.ok(
    fast.some((l) => l.includes('-m not\\ model') && l.includes('learner-fast.xml')),
    fast.join('\n'),
  );
  assert.match(fast.find((l) => l.includes('node-fast.jsonl')) ?? '', /--test-concurrency=[2-9]/);

  const integrationPlan = plan('integration');
  // The files that mostly sleep run in a runner of their own beside the pool.
  const asleep = nodeFiles(integrationPlan, 'node-asleep');
  assert.ok(asleep.includes('test/integration/real-scoring.test.ts'), asleep.join(' '));
  const integration = [...nodeFiles(integrationPlan, 'node-integration'), ...asleep];
  assert.equal(new Set(integration).size, integration.length, 'no file twice');
  const slow = nodeFiles(plan('slow'), 'node-slow');
  assert.ok(slow.includes('test/integration/learning.test.ts') && slow.includes('test/integration/chaos.test.ts'), slow.join(' '));
  assert.deepEqual(
    integration.filter((f) => slow.includes(f)),
    [],
  );
  assert.deepEqual([...integration, ...slow].sort(), testFiles('test/integration'));
  assert.ok(
    plan('integration').some((l) => l.includes('-m model') && l.includes('learner-model.xml')),
    'the learner tests marked model run in the integration tier',
  );
});

test('everything: type check and lint, fast, then the integration and slow files in one pool on one prebuilt bundle, then the durations', () => {
  const all = plan();
  const at = (what: string) => {
    const i = all.findIndex((l) => l.includes(what));
    assert.ok(i >= 0, `${what} in:\n${all.join('\n')}`);
    return i;
  };
  const order = ['npx tsc --noEmit', 'npm run lint', 'node-fast.jsonl', 'learner-model.xml', 'build-workflow-bundle.ts', 'node-integration.jsonl', 'tools/test_durations.py'].map(
    at,
  );
  assert.deepEqual(
    order,
    [...order].sort((a, b) => a - b),
  );
  assert.equal(all.filter((l) => l.includes('build-workflow-bundle.ts')).length, 1, 'the bundle is built once');
  assert.match(all.find((l) => l.includes('/node-integration.jsonl')) ?? '', /^HALO_WORKFLOW_BUNDLE=\S+\/bundles\/\S+ node /);
  assert.equal(all.filter((l) => l.includes('.jsonl')).length, 3, 'node runs fast, then integration and slow together, the asleep files beside');
  // Every integration file once, the slow tier's first: the longest files start first, none runs alone at the end.
  const pool = nodeFiles(all, 'node-integration');
  const slow = nodeFiles(plan('slow'), 'node-slow');
  assert.deepEqual(pool.slice(0, slow.length), slow);
  assert.deepEqual([...pool, ...nodeFiles(all, 'node-asleep')].sort(), testFiles('test/integration'));
});

test('every node run takes HALO_TEST_CONCURRENCY files at once (two by default)', () => {
  const withEnv = (v: string | undefined) => {
    const env = { ...process.env };
    if (v === undefined) delete env.HALO_TEST_CONCURRENCY;
    else env.HALO_TEST_CONCURRENCY = v;
    const r = spawnSync('bash', ['launch.sh', '--skip-setup', 'test', '--dry-run'], { cwd: REPO_ROOT, encoding: 'utf8', timeout: 60_000, env });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    return r.stdout.split('\n').filter((l) => /node-(fast|integration)\.jsonl/.test(l));
  };
  for (const [v, n] of [
    [undefined, '2'],
    ['1', '1'],
    ['3', '3'],
  ] as const) {
    const lines = withEnv(v);
    assert.equal(lines.length, 2);
    for (const l of lines) assert.ok(l.includes(`--test-concurrency=${n} `), `${v}: ${l}`);
  }
});
