import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { REPO_ROOT, pythonBinary } from '../../client/processes';

// The fast tier (`./launch.sh test fast`, `npm test`) leaves out the learner's tests that load the tiny Qwen3-VL or
// start a Temporal server; the integration tier runs them (`-m model`). Collecting the suite imports torch and
// transformers, which is why this check is not in the fast tier itself.

test("pytest -m 'not model' keeps the learner's pure tests and leaves out every test that loads the model or a server", () => {
  const r = spawnSync(pythonBinary(), ['-m', 'pytest', '-q', '--collect-only', '-p', 'no:cacheprovider', '-m', 'not model'], {
    cwd: join(REPO_ROOT, 'workers', 'learner'),
    encoding: 'utf8',
    timeout: 300_000,
  });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  const ids = r.stdout.split('\n').filter((l) => l.includes('::'));
  const files = new Set(ids.map((id) => id.split('::')[0]));
  for (const pure of ['tests/test_blobs.py', 'tests/test_envfile.py', 'tests/test_memory.py']) assert.ok(files.has(pure), `${pure} is in the fast tier`);
  // The worker-kill tests start a Temporal server and learner workers; the GRPO step tests take the policy fixture.
  assert.ok(!files.has('tests/test_worker_kill.py'), 'test_worker_kill.py is left out');
  assert.ok(!ids.includes('tests/test_grpo.py::test_loss_matches_hand_computation'), 'a test that takes the learner fixture is left out');
  assert.ok(ids.includes('tests/test_grpo.py::test_stale_samples_keep_their_gradient_under_the_decoupled_objective'), 'a pure test of a model file stays');
  assert.match(r.stdout, /deselected/);
  assert.doesNotMatch(r.stdout + r.stderr, /PytestUnknownMarkWarning/);
});
