import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT } from '../../client/processes';
import { freePort } from '../../client/temporal-server';
import { startPlainChatServer, type PlainChatServer } from '../../testing/plain-chat-server';

// Each command that starts or attaches to a workflow, on a failing run, through the CLI on a private stack: the
// failing child workflow and activity, the error type, its message and its fix are printed, and the exit code
// tells a configuration error (2) from a runtime failure (1). The policy is a plain OpenAI-compatible server that
// gives no token ids: a single episode and an evaluation run on it, a training run refuses it.
const exec = promisify(execFile);
let home: string;
let cfgFile: string;
let plain: PlainChatServer;

interface Out {
  code: number;
  stdout: string;
  stderr: string;
}

async function halo(...args: string[]): Promise<Out> {
  try {
    const r = await exec(process.execPath, [join(REPO_ROOT, 'bin', 'halo.cjs'), '--config', cfgFile, ...args], {
      cwd: REPO_ROOT,
      env: { ...process.env, TEMPORAL_ADDRESS: '', TEMPORAL_NAMESPACE: '', HALO_ENV_FILE: '', HALO_LEARNER: '0' },
      timeout: 240_000,
    });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** The printed failure of a run refused for lack of token ids: every part of the chain, not one line. */
function assertTokenIdsFailure(o: Out, run: string, runType: string, childType: string) {
  assert.equal(o.code, 2, o.stderr);
  assert.match(o.stderr, new RegExp(`where: +workflow ${run} \\(${runType}\\) → child workflow ${run}-it1-\\S+ \\(${childType}\\) → activity samplePolicy`), o.stderr);
  assert.match(o.stderr, /error: +PolicyTokenIdsMissing \(non-retryable\)/);
  assert.match(o.stderr, /message: +policy server .* answered without the sampled token ids/);
  assert.match(o.stderr, /fix: +to sample without them, set policy\.tokenIds: off/);
  assert.match(o.stderr, /kind: +a configuration error.*\(exit 2\)/);
}

before(async () => {
  home = mkdtempSync(join(tmpdir(), 'halo-cli-failures-'));
  plain = await startPlainChatServer('plain-model');
  cfgFile = join(home, 'halo.yaml');
  writeFileSync(
    cfgFile,
    [
      'temporal:',
      `  address: 127.0.0.1:${await freePort()}`,
      '  controlTaskQueue: failures-control',
      '  browserTaskQueue: failures-browser',
      'stack:',
      `  home: ${home}`,
      `  uiPort: ${await freePort()}`,
      'policy:',
      '  model: plain-model',
      '  maxAttempts: 2',
    ].join('\n'),
  );
  writeFileSync(
    join(home, 'eval.yaml'),
    [
      'runId: failures-eval',
      'haloConfig: halo.yaml',
      'env: miniwob',
      'tasks: [click-button]',
      'seeds: [0]',
      'maxSteps: 2',
      'modes:',
      '  - name: qwen3vl_base',
      '    backend: openai',
      `    baseUrl: ${plain.url}`,
      '    model: plain-model',
      '  - name: openai_baseline',
      '    model: no-such-model',
      `    baseUrl: ${plain.url}`,
    ].join('\n'),
  );
  const up = await halo('up');
  assert.equal(up.code, 0, up.stderr);
});

after(async () => {
  await halo('down');
  await plain.close();
  rmSync(home, { recursive: true, force: true });
});

test('halo episode: a server without token ids runs the episode (counted, said once)', async () => {
  const o = await halo('episode', '--env', 'miniwob', '--task', 'click-checkboxes', '--seed', '7', '--max-steps', '3', '--policy-url', plain.url);
  assert.equal(o.code, 0, o.stderr);
  assert.ok(plain.askedForTokenIds > 0, 'token ids were asked for');
  assert.match(o.stdout, /3 steps/);
  assert.equal(o.stderr.match(/gave no token ids for 3 of 3 steps/g)?.length, 1, o.stderr);
  const j = await halo('episode', '--env', 'miniwob', '--task', 'click-button', '--seed', '7', '--policy-url', plain.url, '--json');
  assert.equal(JSON.parse(j.stdout).tokenIdsMissing, JSON.parse(j.stdout).steps);
});

test('halo episode and halo status: an unknown model is a configuration error with its cause; a server down is a runtime failure', async () => {
  const o = await halo('episode', '--env', 'miniwob', '--task', 'click-button', '--seed', '1', '--policy-url', plain.url, '--model', 'no-such-model', '--id', 'failures-unknown');
  assert.equal(o.code, 2, o.stderr);
  assert.match(o.stderr, /where: +workflow failures-unknown \(episode\) → activity samplePolicy/);
  assert.match(o.stderr, /error: +PolicyRequestRejected \(non-retryable\)/);
  assert.match(o.stderr, /The model `no-such-model` does not exist/);
  assert.match(o.stderr, /fix: +serve that model or adapter/);
  const st = await halo('status', 'failures-unknown');
  assert.match(st.stdout, /FAILED[\s\S]*last failure: [\s\S]*error: +PolicyRequestRejected[\s\S]*fix: +serve that model/);
  const sj = JSON.parse((await halo('status', 'failures-unknown', '--json')).stdout);
  assert.equal(sj.failure.type, 'PolicyRequestRejected');
  assert.equal(sj.failure.activity.activityType, 'samplePolicy');

  const down = await halo('episode', '--env', 'miniwob', '--task', 'click-button', '--seed', '1', '--policy-url', `http://127.0.0.1:${await freePort()}/v1`, '--json');
  assert.equal(down.code, 1, down.stderr);
  const e = JSON.parse(down.stdout).error;
  assert.equal(e.type, 'PolicyServerUnreachable');
  assert.equal(e.category, 'runtime');
  assert.equal(e.activity.retryState, 'MAXIMUM_ATTEMPTS_REACHED');
  assert.match(e.fix, /start the policy server/);
});

test('halo train, attaching again, halo resume: a served run without token ids fails with the cause named', async () => {
  const args = ['train', '--run-id', 'failures-train', '--policy-url', plain.url, '--tasks', 'click-button', '--iterations', '1', '--episodes', '2'];
  assertTokenIdsFailure(await halo(...args), 'failures-train', 'trainGrpo', 'episode');
  const again = await halo('train', '--run-id', 'failures-train');
  assertTokenIdsFailure(again, 'failures-train', 'trainGrpo', 'episode');
  assert.match(again.stderr, /To train again, start a new run/);
  assertTokenIdsFailure(await halo('resume', 'failures-train'), 'failures-train', 'trainGrpo', 'episode');
  const j = await halo(...args, '--json');
  assert.equal(j.code, 2);
  assert.equal(JSON.parse(j.stdout).error.type, 'PolicyTokenIdsMissing');
});

test('halo mcts: a search without token ids fails the run with the search and activity named', async () => {
  const o = await halo('mcts', '--config', cfgFile, '--run-id', 'failures-mcts', '--policy-url', plain.url, '--tasks', 'click-button', '--iterations', '1');
  assertTokenIdsFailure(o, 'failures-mcts', 'trainMcts', 'mctsSearch');
});

test("halo eval: episodes run without token ids; a mode whose episodes failed shows the first one's cause", async () => {
  const o = await halo('eval', '--config', join(home, 'eval.yaml'));
  assert.equal(o.code, 0, o.stderr);
  assert.match(o.stderr, /gave no token ids for/);
  assert.match(o.stderr, /mode openai_baseline: 1 episode failed; the first: episode failures-eval-openai_baseline-\S+ failed/);
  assert.match(o.stderr, /error: +PolicyRequestRejected \(non-retryable\)/);
  assert.match(o.stdout, /\| qwen3vl_base \| miniwob \| 1 \|/);
});
