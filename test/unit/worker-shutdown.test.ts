import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { WORKER_SHUTDOWN, WORKER_STOP_GRACE_MS } from '../../workers/shutdown';

const ROOT = join(__dirname, '..', '..');

test("halo down waits past the SDK's forced shutdown before it SIGKILLs a worker", () => {
  // A SIGKILL before the SDK gives up on its activities would cut their cancellation short and leave the
  // in-flight ledger to fail them at the next start instead.
  assert.ok(WORKER_STOP_GRACE_MS > WORKER_SHUTDOWN.forceMs, `${WORKER_STOP_GRACE_MS} ms ≤ ${WORKER_SHUTDOWN.forceMs} ms`);
  assert.ok(WORKER_SHUTDOWN.graceMs < WORKER_SHUTDOWN.forceMs);
  // Every worker takes its shutdown times from the one constant, and `halo down` its wait.
  for (const file of ['workers/control.ts', 'workers/browser.ts']) {
    const text = readFileSync(join(ROOT, file), 'utf8');
    const grace = [...text.matchAll(/shutdownGraceTime: ([^,\n]+)/g)].map((m) => m[1]);
    const force = [...text.matchAll(/shutdownForceTime: ([^,\n]+)/g)].map((m) => m[1]);
    assert.ok(grace.length > 0 && grace.every((v) => v === 'WORKER_SHUTDOWN.graceMs'), `${file}: ${grace}`);
    assert.ok(force.length === grace.length && force.every((v) => v === 'WORKER_SHUTDOWN.forceMs'), `${file}: ${force}`);
  }
  const stack = readFileSync(join(ROOT, 'client', 'stack.ts'), 'utf8');
  for (const m of stack.matchAll(/stopProcess\((?:st\.home|home), ([^)]+)\)/g)) {
    if (/learner|temporal|vllm/i.test(m[1])) continue;
    assert.match(m[1], /, WORKER_STOP_GRACE_MS$/, `a worker stopped without WORKER_STOP_GRACE_MS: ${m[0]}`);
  }
});
