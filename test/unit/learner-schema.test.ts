import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { BLOB_REF, LEARNER_SCHEMAS } from '../../lib/training/learner-types';
import { mctsSchema, policySchema, trainSchema } from '../../lib/config/config';
import { PAYLOADS_PATH, PYTHON_RULES, generatePayloads, learnerJsonSchema } from '../../client/commands/learner-schema';
import { REPO_ROOT, pythonBinary } from '../../client/processes';

// One source for the learner contract: the pydantic models are generated from the zod schemas. Regenerating must
// give the committed file byte for byte, so a field changed on one side only (zod edited without regenerating,
// or payloads.py edited by hand) fails here.

test('payloads.py is exactly what the zod contract generates (regenerate: npx halo learner-schema --write)', () => {
  const current = readFileSync(PAYLOADS_PATH, 'utf8');
  assert.equal(current, generatePayloads(), 'payloads.py is stale: run `npx halo learner-schema --write`');
});

test('every model, blob type and limit comes across', () => {
  const { $defs } = learnerJsonSchema() as { $defs: Record<string, { properties?: Record<string, Record<string, unknown>> }> };
  assert.deepEqual(Object.keys($defs), Object.keys(LEARNER_SCHEMAS));
  const text = readFileSync(PAYLOADS_PATH, 'utf8');
  for (const name of Object.keys(LEARNER_SCHEMAS)) assert.match(text, new RegExp(`^(class ${name}\\(|${name} = TypeAliasType)`, 'm'), name);
  // Blobs the learner reads, limits and patterns (the hand-kept mirror missed these).
  assert.match(text, /^class PromptTokenIds\(ContractModel\):\n(.*\n)*? {4}prompt_token_ids: Annotated\[list\[PromptTokenId\], Field\(min_length=1\)\]/m);
  assert.match(text, /clip_epsilon: Annotated\[float, Field\(gt=0\.0, lt=1\.0\)\]/);
  assert.ok(text.includes('run_id: Annotated[str, Field(min_length=1, pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")]'), 'run_id pattern');
  assert.match(text, /tokens_ref: Annotated\[str \| None, Field\(pattern="\^sha256:/);
  assert.match(text, /n: Annotated\[int, Field\(ge=1, le=64\)\] = 1/);
  // zod's safe-integer range is not a limit of the contract.
  assert.doesNotMatch(text, /9007199254740991/);
});

test('a check JSON Schema cannot state (a refine) has its Python rule', () => {
  type Checked = { _zod: { def: { checks?: { _zod: { def: { check: string } } }[] } } };
  const refined = Object.entries(LEARNER_SCHEMAS)
    .filter(([, s]) => ((s as unknown as Checked)._zod.def.checks ?? []).some((c) => c._zod.def.check === 'custom'))
    .map(([name]) => name);
  assert.ok(refined.length >= 3, `expected the refined models, got ${refined}`);
  for (const name of refined) assert.ok(PYTHON_RULES[name as keyof typeof LEARNER_SCHEMAS], `${name} has a refine but no rules class in payload_rules.py`);
  const text = readFileSync(PAYLOADS_PATH, 'utf8');
  for (const [name, base] of Object.entries(PYTHON_RULES)) assert.match(text, new RegExp(`^class ${name}\\(${base}\\):`, 'm'));
});

test('hyperparameter defaults are the run config defaults, in TypeScript and in Python', () => {
  const train = trainSchema.parse(undefined);
  const mcts = mctsSchema.parse(undefined);
  const policy = policySchema.parse(undefined);
  const py = JSON.parse(
    execFileSync(
      pythonBinary(),
      ['-c', 'import json; from halo_learner import payloads as p; print(json.dumps([p.GrpoHyperparameters().model_dump(), p.DpoHyperparameters().model_dump()]))'],
      { cwd: join(REPO_ROOT, 'workers', 'learner'), encoding: 'utf8' },
    ),
  ) as [Record<string, unknown>, Record<string, unknown>];
  const grpo = LEARNER_SCHEMAS.GrpoHyperparameters.parse({});
  const dpo = LEARNER_SCHEMAS.DpoHyperparameters.parse({});
  for (const side of [grpo, py[0]]) {
    assert.deepEqual(side, {
      learning_rate: train.learningRate,
      kl_coef: train.klCoef,
      clip_epsilon: train.clipEpsilon,
      temperature: policy.temperature,
      max_grad_norm: train.maxGradNorm,
      loss_type: train.lossType,
      stale_weight_cap: null,
    });
  }
  for (const side of [dpo, py[1]]) assert.deepEqual(side, { learning_rate: mcts.learningRate, beta: mcts.beta, max_grad_norm: mcts.maxGradNorm });
});

test('the JSON Schema states nullability, defaults and the discriminator as zod does', () => {
  const { $defs } = learnerJsonSchema() as { $defs: Record<string, Record<string, unknown>> };
  const item = $defs.GrpoItem as { properties: Record<string, Record<string, unknown>>; required: string[] };
  assert.deepEqual(item.properties.tokens_ref, { default: null, type: ['string', 'null'], pattern: BLOB_REF.source });
  assert.deepEqual(item.required, ['prompt', 'completion', 'advantage']);
  assert.deepEqual(($defs.PromptPart as { discriminator: unknown }).discriminator, { propertyName: 'type' });
});
