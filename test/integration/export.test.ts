import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { BlobStore } from '../../blob/store';
import { exportRun, type ProvenanceRecord, type StepExportRecord } from '../../client/commands/export';
import { SampledTokensSchema } from '../../lib/training/experience';
import { startOrAttachTrain } from '../../client/train';
import { stackGrpoConfig } from '../../testing/grpo-config';
import { startTestStack, type TestStack } from '../../testing/stack';

// `halo export` of a finished local GRPO run (one iteration, two episodes of the tiny colocated model on click-button).
let stack: TestStack;
let out: string;
before(async () => {
  stack = await startTestStack({ browserWorkers: 1, learner: true });
  out = mkdtempSync(join(tmpdir(), 'halo-export-'));
});
after(async () => {
  await stack?.stop();
  rmSync(out, { recursive: true, force: true });
});

test('halo export: one JSONL per episode under <mode>/<run>/<task>__attempt_<i>.jsonl, provenance first, one record per step', async () => {
  const cfg = stackGrpoConfig(stack, { runId: 'export-run', iterations: 1, maxSteps: 2, episode: { sessionStartTimeoutMs: 10_000 }, train: { episodesPerIteration: 2 } });
  const { handle } = await startOrAttachTrain(stack.client, cfg);
  await handle.result();

  const blobs = new BlobStore(join(stack.home, 'blobs'));
  const res = await exportRun(stack.client, blobs, 'export-run', out);
  assert.deepEqual(res.skipped, []);
  assert.deepEqual(res.files.map((f) => relative(out, f)).sort(), ['grpo/export-run/click-button__attempt_0.jsonl', 'grpo/export-run/click-button__attempt_1.jsonl']);
  assert.deepEqual(readdirSync(out), ['grpo']);

  const hashes = new Set<string>();
  for (const [i, file] of res.files.sort().entries()) {
    const records = readFileSync(file, 'utf8')
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l));
    const prov = records[0] as ProvenanceRecord;
    assert.equal(prov.type, 'provenance');
    assert.equal(prov.run, 'export-run');
    assert.equal(prov.workflowId, `export-run-it1-ep${i}`, 'attempts in start order');
    assert.equal(prov.mode, 'grpo');
    assert.equal(prov.env, 'miniwob');
    assert.equal(prov.task, 'click-button');
    assert.ok(Number.isInteger(prov.seed));
    assert.equal(prov.attempt, i);
    assert.equal(prov.temperature, 1);
    assert.equal(prov.model, 'tiny-random');
    assert.equal(prov.adapterVersion, 0, 'iteration 1 samples the base model');
    assert.match(prov.configHash ?? '', /^[0-9a-f]{16}$/);
    hashes.add(prov.configHash!);
    assert.match(prov.trajectoryRef, /^sha256:[0-9a-f]{64}\.json$/);

    const steps = records.slice(1) as StepExportRecord[];
    assert.ok(steps.length >= 1);
    assert.equal(steps.length, prov.steps, 'one record per step');
    steps.forEach((s, k) => {
      assert.equal(s.type, 'step');
      assert.equal(s.step, k + 1, 'steps in order, numbered from 1');
      assert.equal(typeof s.modelText, 'string');
      // The colocated sampler's tokens travel by reference: every step names its token blob, which is the sampler's.
      assert.match(s.tokensRef ?? '', /^sha256:[0-9a-f]{64}\.json$/);
      assert.ok(s.action && typeof (s.action as { type?: unknown }).type === 'string');
      assert.equal(typeof (s.rewardBreakdown as { total?: unknown }).total, 'number');
      assert.equal(typeof s.reward, 'number');
      assert.match(s.screenshotRef, /^sha256:[0-9a-f]{64}\.png$/);
      assert.ok(existsSync(s.screenshot), 'the screenshot reference points at a file of the blob store');
    });
    for (const s of steps) {
      const tokens = SampledTokensSchema.parse(await blobs.getJson(s.tokensRef!));
      assert.ok(tokens.logprobs !== null && tokens.logprobs.length === tokens.token_ids.length);
    }
  }
  assert.equal(hashes.size, 1, 'both episodes name the same run config');
});
