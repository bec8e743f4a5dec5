import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { runEval } from '../../client/commands/eval';
import type { HaloConfig } from '../../lib/config/config';
import { parseEvalConfig } from '../../lib/eval/eval-config';
import type { EvalEpisodeRecord } from '../../lib/eval/eval-summary';
import type { TestStack } from '../../testing/stack';

export interface HeldOutPlay {
  runId: string;
  tasks: string[];
  seeds: number[];
  maxSteps: number;
  parallelism: number;
  /** The trained adapter's mode name (qwen3vl_grpo, qwen3vl_mcts), run and version. */
  trained: { name: string; run: string; version: number };
}

/**
 * The learning tests' judgement: the base model and a trained adapter play the same held-out seeds greedily (an
 * `evaluate` workflow on the test's stack). Every episode must have run; returns the successes of each and the
 * episodes per mode.
 */
export async function greedyBaseVsTrained(stack: TestStack, base: HaloConfig, outDir: string, play: HeldOutPlay): Promise<{ base: number; trained: number; episodes: number }> {
  const evalCfg = parseEvalConfig({
    runId: play.runId,
    env: 'miniwob',
    tasks: play.tasks,
    seeds: play.seeds,
    maxSteps: play.maxSteps,
    parallelism: play.parallelism,
    modes: [
      { name: 'qwen3vl_base', backend: 'colocated', adapter: { run: 'base', version: 0 } },
      { name: play.trained.name, backend: 'colocated', adapter: { run: play.trained.run, version: play.trained.version } },
    ],
  });
  const run = await runEval(evalCfg, stack.client, { base, outDir: join(outDir, 'eval'), checkpoints: stack.checkpoints, pollMs: 500 });
  const episodes = readFileSync(run.files.episodes, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as EvalEpisodeRecord);
  for (const e of episodes) assert.equal(e.error, undefined, `${e.workflowId}: ${e.error}`);
  const wins = (mode: string) => episodes.filter((e) => e.mode === mode && e.success).length;
  return { base: wins('qwen3vl_base'), trained: wins(play.trained.name), episodes: episodes.filter((e) => e.mode === 'qwen3vl_base').length };
}
