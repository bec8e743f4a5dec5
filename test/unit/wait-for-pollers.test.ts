import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Connection } from '@temporalio/client';
import { waitForPollers } from '../../client/stack';

/** A connection whose task queue lists `answers[i]` as its pollers at the i-th look (the last one from then on). */
function listing(answers: string[][]) {
  let calls = 0;
  const conn = {
    workflowService: {
      describeTaskQueue: async () => ({ pollers: (answers[Math.min(calls++, answers.length - 1)] ?? []).map((identity) => ({ identity })) }),
    },
  } as unknown as Connection;
  return { conn, calls: () => calls };
}

const home = mkdtempSync(join(tmpdir(), 'halo-pollers-'));
const stale = '888888@host';

test('a started process: the wait is for its own poller, not one a dead predecessor left listed', async () => {
  const me = `${process.pid}@host`;
  const { conn, calls } = listing([[stale], [stale], [stale, me]]);
  await waitForPollers(conn, 'default', [{ name: 'q', type: 'activity', process: { name: 'browser worker', pid: process.pid, logFile: '/dev/null' } }], home);
  assert.equal(calls(), 3);
});

test('a plain queue name: any poller will do', async () => {
  const { conn, calls } = listing([[stale]]);
  await waitForPollers(conn, 'default', ['q-control'], home);
  assert.equal(calls(), 1);
});

test('a started process that died before polling: the error names it and shows its log', async () => {
  const logFile = join(home, 'w.log');
  writeFileSync(logFile, 'TransportError: tcp connect error\n');
  const { conn } = listing([[stale]]);
  await assert.rejects(
    waitForPollers(conn, 'default', [{ name: 'q', type: 'activity', process: { name: 'browser worker', pid: 999999, logFile } }], home),
    /browser worker \(pid 999999\) exited before polling task queue q[\s\S]*tcp connect error/,
  );
});
