import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Connection } from '@temporalio/client';
import { REPO_ROOT, isAlive, temporalBinary } from '../../client/processes';
import { freePort } from '../../client/temporal-server';
import { startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';

// The user's path: `halo up`, `halo episode`, `temporal workflow execute`, `halo down`, on a private home
// folder and private ports so it never touches a developer's running stack.
const exec = promisify(execFile);
let home: string;
let cfgFile: string;
let port: number;
let uiPort: number;
let policy: FakePolicyServer;

function halo(...args: string[]) {
  return exec(process.execPath, [join(REPO_ROOT, 'bin', 'halo.cjs'), ...args, '--config', cfgFile], {
    cwd: REPO_ROOT,
    env: { ...process.env, TEMPORAL_ADDRESS: '', TEMPORAL_NAMESPACE: '' },
    timeout: 240_000,
  });
}

before(async () => {
  home = mkdtempSync(join(tmpdir(), 'halo-cli-'));
  port = await freePort();
  uiPort = await freePort();
  policy = await startFakePolicyServer({ kind: 'scripted' });
  cfgFile = join(home, 'halo.yaml');
  writeFileSync(
    cfgFile,
    [
      'temporal:',
      `  address: 127.0.0.1:${port}`,
      '  controlTaskQueue: cli-control',
      '  browserTaskQueue: cli-browser',
      'stack:',
      `  home: ${home}`,
      `  uiPort: ${uiPort}`,
      'policy:',
      '  model: fake-qwen',
    ].join('\n'),
  );
});

after(async () => {
  await halo('down').catch(() => {});
  await policy.close();
  rmSync(home, { recursive: true, force: true });
});

test('halo up twice, episode, temporal CLI, restart keeps history, halo down twice', async () => {
  const first = JSON.parse((await halo('up', '--json')).stdout);
  assert.ok(first.temporal && first.control && first.browsers[0], JSON.stringify(first));
  const second = JSON.parse((await halo('up', '--json')).stdout);
  assert.deepEqual([second.temporal, second.control, second.browsers[0]], [first.temporal, first.control, first.browsers[0]], 'a second up starts nothing new');
  assert.ok(existsSync(join(home, 'temporal.db')), 'the dev server keeps its state in a SQLite file under the home folder');

  const ui = await fetch(`http://127.0.0.1:${uiPort}/`);
  assert.equal(ui.status, 200, 'the Temporal UI answers');

  const conn = await Connection.connect({ address: `127.0.0.1:${port}` });
  try {
    const ns = await conn.workflowService.describeNamespace({ namespace: 'default' });
    assert.equal(Number(ns.config?.workflowExecutionRetentionTtl?.seconds), 30 * 86_400);
    const attrs = await conn.operatorService.listSearchAttributes({ namespace: 'default' });
    for (const k of ['HaloRunId', 'HaloTask', 'HaloMode', 'HaloKind']) assert.ok(k in (attrs.customAttributes ?? {}), `${k} is registered`);
  } finally {
    await conn.close();
  }

  const { stdout } = await halo('episode', '--env', 'miniwob', '--task', 'click-button', '--seed', '3', '--policy-url', policy.url, '--json');
  const result = JSON.parse(stdout);
  assert.equal(result.success, true, stdout);
  assert.ok(result.reward > 0);
  assert.equal(result.steps, 1);
  assert.equal(result.actionValidity, 1);
  assert.match(result.workflowId, /^episode-miniwob-click-button-s3-/);
  assert.match(result.trajectoryRef, /^sha256:/);
  assert.ok(existsSync(result.trajectoryPath));

  // The same workflow type started with Temporal's own CLI (the successor of `tctl workflow start`).
  const input = JSON.stringify({
    task: { env: 'miniwob', task: 'click-button', seed: 4 },
    maxSteps: 3,
    policy: { baseUrl: policy.url, model: 'fake-qwen', apiKeyEnv: 'HALO_POLICY_API_KEY', temperature: 0, maxTokens: 256, timeoutMs: 10000, historyLength: 5 },
    browserTaskQueue: 'cli-browser',
  });
  const cli = await exec(
    temporalBinary(),
    [
      'workflow',
      'execute',
      '--address',
      `127.0.0.1:${port}`,
      '--type',
      'episode',
      '--task-queue',
      'cli-control',
      '--workflow-id',
      'cli-started-episode',
      '--input',
      input,
      '--output',
      'json',
    ],
    { timeout: 120_000 },
  );
  assert.match(cli.stdout, /"success":\s*true/);

  await halo('down');
  assert.ok(!isAlive(first.temporal) && !isAlive(first.control) && !isAlive(first.browsers[0]), 'down stops every process');
  await halo('down'); // harmless the second time

  // Preemption: the data is on disk; a new `up` shows the earlier episodes.
  await halo('up');
  const conn2 = await Connection.connect({ address: `127.0.0.1:${port}` });
  try {
    const d = await conn2.workflowService.describeWorkflowExecution({ namespace: 'default', execution: { workflowId: result.workflowId } });
    assert.equal(d.workflowExecutionInfo?.status, 2 /* COMPLETED */);
  } finally {
    await conn2.close();
  }
});

test('halo tasks lists the 121 REAL v2 tasks by site; tasks snapshot pins each eval script by sha256', async () => {
  const { stdout } = await halo('tasks', '--env', 'real');
  assert.match(stdout, /^121 REAL v2 tasks in 11 sites$/m);
  assert.match(stdout, /^gomail \(21\)$/m);
  assert.match(stdout, /gocalendar-11 +\[unscorable/);
  // The registry's caveats under their task: a script reading beside its state file, a task on a production alias.
  assert.match(stdout, /^ {2}omnizon-28 .*\n +\[caveat: its eval script also reads the files next to its state file/m);
  assert.match(stdout, /^ {2}opendining-17 .*\n +\[caveat: runs on https:\/\/real-opendining\.vercel\.app, not /m);
  const out = join(home, 'snapshot.json');
  await halo('tasks', 'snapshot', '--out', out);
  const snap = JSON.parse(readFileSync(out, 'utf8'));
  assert.equal(snap.agisdk_version, '0.3.5');
  assert.equal(snap.tasks.length, 121);
  const t = snap.tasks.find((x: { id: string }) => x.id === 'gomail-18');
  assert.match(t.eval_sha256, /^[0-9a-f]{64}$/);
  assert.match(t.start_url, /^https:\/\//);
  assert.equal(t.site, 'gomail');
  const mw = JSON.parse((await halo('tasks', '--env', 'miniwob', '--json')).stdout);
  assert.equal(mw.length, 125);
});

test('every command has --help; a wrong argument is a clear error with a non-zero exit', async () => {
  const { stdout } = await halo('--help');
  const commands = [...stdout.matchAll(/^ {2}([a-z-]+)(?: |$)/gm)].map((m) => m[1]).filter((c) => c !== 'help');
  for (const expected of ['up', 'down', 'episode', 'train', 'status', 'pause', 'resume', 'stop', 'tasks', 'eval', 'runs', 'episodes', 'mcts', 'view', 'report']) {
    assert.ok(commands.includes(expected), `${expected} is listed in --help: ${commands.join(' ')}`);
  }
  for (const c of commands) {
    const out = await halo(c, '--help');
    assert.match(out.stdout, new RegExp(`^Usage: halo ${c}`, 'm'), c);
  }
  for (const bad of [['episode', '--seed', 'abc'], ['tasks', '--env', 'nope'], ['runs', '--status', 'Sleeping'], ['frobnicate']]) {
    await assert.rejects(halo(...bad), (err: { code: number; stderr: string }) => {
      assert.notEqual(err.code, 0, bad.join(' '));
      assert.match(err.stderr, /(must be|invalid|unknown command|Allowed choices)/i, `${bad.join(' ')}: ${err.stderr}`);
      return true;
    });
  }
});
