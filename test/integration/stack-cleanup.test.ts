import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { REPO_ROOT, isAlive, sleep } from '../../client/processes';
import { cmdline, descendants } from '../../testing/process-tree';

// Node's test runner ends a file past its timeout with SIGTERM. The stack that file started (testing/stack.ts) must
// go with it: left behind, a dev server, workers and a learner would run beside every file after it.

for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  test(`a test file ended by ${signal} takes its stack with it: no server or worker outlives it`, { timeout: 240_000 }, async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'test/helpers/stack-until-signal.ts'], { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
    });
    child.stderr.on('data', (d) => {
      out += d;
    });
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    let under: number[] = [];
    try {
      for (const deadline = Date.now() + 180_000; !out.includes('ready\n'); await sleep(200)) {
        assert.ok(Date.now() < deadline && child.exitCode === null, `the stack did not start:\n${out}`);
      }
      under = descendants(child.pid as number);
      const names = under.map((p) => cmdline(p) ?? '(gone)');
      assert.ok(names.some((c) => /temporal/.test(c)) && names.filter((c) => /workers\/(control|browser)/.test(c)).length >= 2, names.join('\n'));
      child.kill(signal);
      await exited;
      let left = under.filter(isAlive);
      for (const deadline = Date.now() + 60_000; left.length > 0 && Date.now() < deadline; await sleep(500)) left = left.filter(isAlive);
      assert.deepEqual(
        left.map((p) => `${p} ${cmdline(p) ?? '(gone)'}`),
        [],
        'still running after the file ended',
      );
    } finally {
      child.kill('SIGKILL');
      for (const p of under.filter(isAlive)) process.kill(p, 'SIGKILL');
    }
  });
}
