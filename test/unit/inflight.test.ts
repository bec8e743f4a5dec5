import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Context } from '@temporalio/activity';
import { InflightLedger } from '../../workers/inflight';

const info = (token: number[], type = 'stepSession') =>
  ({ taskToken: new Uint8Array(token), activityType: type, workflowExecution: { workflowId: 'wf', runId: 'r' }, attempt: 1 }) as unknown as Context['info'];

/** A pid that belonged to a process that has exited. */
function deadPid(): number {
  return spawnSync(process.execPath, ['-e', '0']).pid!;
}

test('the ledger holds exactly the running attempts and disappears when none runs', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-inflight-'));
  const ledger = new InflightLedger(dir, 'browser-worker');
  const a = ledger.begin(info([1, 2, 3]));
  const b = ledger.begin(info([4, 5], 'startSession'));
  const onDisk = JSON.parse(readFileSync(ledger.file, 'utf8'));
  assert.equal(onDisk.pid, process.pid);
  assert.deepEqual(
    onDisk.running.map((e: { token: string; type: string }) => [Buffer.from(e.token, 'base64').toJSON().data, e.type]),
    [
      [[1, 2, 3], 'stepSession'],
      [[4, 5], 'startSession'],
    ],
  );
  ledger.end(a);
  assert.equal(JSON.parse(readFileSync(ledger.file, 'utf8')).running.length, 1);
  ledger.end(b);
  assert.equal(existsSync(ledger.file), false);
});

test('orphans: ledgers of dead processes of the same role and host, and our own pid; live ones and other roles are left alone', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-inflight-'));
  const host = hostname();
  const body = (pid: number) => JSON.stringify({ pid, host, role: 'browser-worker', running: [{ token: 'AQI=', type: 'stepSession', workflowId: 'w', attempt: 1 }] });
  const dead = deadPid();
  writeFileSync(join(dir, `browser-worker-${host}-${dead}.json`), body(dead));
  writeFileSync(join(dir, `browser-worker-${host}-${process.pid}.json`), body(process.pid)); // a reused pid
  writeFileSync(join(dir, `browser-worker-${host}-${process.ppid}.json`), body(process.ppid)); // alive
  writeFileSync(join(dir, `control-worker-${host}-${dead}.json`), body(dead)); // another role
  writeFileSync(join(dir, `browser-worker-otherhost-${dead}.json`), body(dead)); // another host
  writeFileSync(join(dir, `browser-worker-${host}-1.json`), '{"pid": 1, "runn'); // damaged
  const found = new InflightLedger(dir, 'browser-worker').orphans();
  const names = found.map((o) => o.file.slice(dir.length + 1)).sort();
  assert.deepEqual(names, [`browser-worker-${host}-${dead}.json`, `browser-worker-${host}-${process.pid}.json`, `browser-worker-${host}-1.json`].sort());
  assert.equal(found.find((o) => o.file.endsWith('-1.json'))?.ledger, null, 'a damaged ledger is dropped without releasing anything');
});

test('a ledger is readable by its owner only (0600 in a 0700 folder), even under a permissive umask', () => {
  const dir = join(mkdtempSync(join(tmpdir(), 'halo-inflight-')), 'inflight');
  const old = process.umask(0o000);
  try {
    const ledger = new InflightLedger(dir, 'browser-worker');
    ledger.begin(info([9]));
    assert.equal(statSync(ledger.file).mode & 0o777, 0o600);
    assert.equal(statSync(dir).mode & 0o777, 0o700);
    assert.equal(ledger.file, join(dir, `browser-worker-${hostname()}-${process.pid}.json`));
    assert.deepEqual(readdirSync(dir), [`browser-worker-${hostname()}-${process.pid}.json`], 'no temp file left behind');
  } finally {
    process.umask(old);
  }
});

test('orphans: a role or host that only starts like ours is not ours', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-inflight-'));
  const host = hostname();
  const dead = deadPid();
  const body = (role: string, h: string) => JSON.stringify({ pid: dead, host: h, role, running: [] });
  writeFileSync(join(dir, `browser-worker-${host}-x-${dead}.json`), body('browser-worker', `${host}-x`));
  writeFileSync(join(dir, `browser-worker-${host}-${dead}.json`), body('browser-worker-2', host));
  assert.deepEqual(new InflightLedger(dir, 'browser-worker').orphans(), []);
});
