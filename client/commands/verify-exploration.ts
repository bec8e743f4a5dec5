import type { Client } from '@temporalio/client';
import { Option, type Command } from 'commander';
import { blobStoreFor } from '../../blob/store';
import { describeAction } from '../../lib/model-io/actions';
import { ConfigError, parseConfig, type HaloConfig } from '../../lib/config/config';
import type { EpisodeResult } from '../../lib/episode/episode-types';
import { KIND, MODE, RUN_ID, TASK } from '../../lib/episode/search-attributes';
import { singleEpisodeInput } from '../episode-input';
import { connectClient, stackStatus } from '../stack';
import { loadTrajectory } from './view';

// `halo verify-exploration`: does the sampling temperature change what the policy does on the same seed? Two
// episodes of one task and seed, one per temperature, and the first step where their actions part.

export interface ExplorationSide {
  temperature: number;
  workflowId: string;
  actions: string[];
  success: boolean;
  reward: number;
}

export interface ExplorationResult {
  env: string;
  task: string;
  seed: number;
  model: string;
  a: ExplorationSide;
  b: ExplorationSide;
  /** The first step (0-based) whose actions differ, or where one episode ended and the other went on; null: identical. */
  firstDifference: number | null;
}

export function firstDifference(a: string[], b: string[]): number | null {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? null : n;
}

async function runSide(client: Client, cfg: HaloConfig, temperature: number, tag: string): Promise<ExplorationSide> {
  const c = parseConfig({ ...cfg, policy: { ...cfg.policy, temperature } }, 'command line');
  const e = c.episode;
  const workflowId = `verify-${e.env}-${e.task}-s${e.seed}-${tag}-t${temperature}-${Date.now().toString(36)}`;
  const input = singleEpisodeInput(c, workflowId);
  const result = (await client.workflow.execute('episode', {
    taskQueue: c.temporal.controlTaskQueue,
    workflowId,
    args: [{ ...input, mode: 'verify-exploration' }],
    staticSummary: `verify-exploration ${e.env}/${e.task} seed ${e.seed} · temperature ${temperature}`,
    typedSearchAttributes: [
      { key: KIND, value: 'episode' },
      { key: TASK, value: `${e.env}/${e.task}` },
      { key: RUN_ID, value: workflowId },
      { key: MODE, value: 'verify-exploration' },
    ],
  })) as EpisodeResult;
  const t = await loadTrajectory(result.trajectoryRef, blobStoreFor(stackStatus(c).home));
  return { temperature, workflowId, actions: t.steps.map((s) => describeAction(s.completion.action)), success: result.success, reward: result.reward };
}

export async function verifyExploration(client: Client, cfg: HaloConfig, temperatures: [number, number]): Promise<ExplorationResult> {
  // One after the other: the same seed, and neither episode competes with the other for the policy.
  const a = await runSide(client, cfg, temperatures[0], 'a');
  const b = await runSide(client, cfg, temperatures[1], 'b');
  const e = cfg.episode;
  return { env: e.env, task: e.task, seed: e.seed, model: cfg.policy.model, a, b, firstDifference: firstDifference(a.actions, b.actions) };
}

export function formatExploration(r: ExplorationResult): string {
  const lines = [`${r.env}/${r.task} seed ${r.seed} · ${r.model}`];
  const w = Math.max(r.a.actions.length, r.b.actions.length);
  const col = Math.max(12, ...r.a.actions.map((s) => s.length));
  lines.push(`step  ${`temperature ${r.a.temperature}`.padEnd(col)}  temperature ${r.b.temperature}`);
  for (let i = 0; i < w; i++) {
    const mark = r.firstDifference !== null && i === r.firstDifference ? '*' : ' ';
    lines.push(`${String(i).padStart(3)}${mark}  ${(r.a.actions[i] ?? '(ended)').padEnd(col)}  ${r.b.actions[i] ?? '(ended)'}`);
  }
  lines.push(r.firstDifference === null ? `identical: both temperatures took the same ${r.a.actions.length} actions` : `the sequences part at step ${r.firstDifference}`);
  lines.push(`episodes: ${r.a.workflowId} (reward ${r.a.reward}), ${r.b.workflowId} (reward ${r.b.reward})`);
  return lines.join('\n');
}

const num = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n)) throw new ConfigError(`--${name} must be a number, got ${JSON.stringify(v)}`);
  return n;
};

export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('verify-exploration')
    .description('run two episodes of one task and seed at two sampling temperatures; print both action sequences and the first step where they differ')
    .addOption(new Option('--env <env>', 'environment (default: episode.env of the config)').choices(['miniwob', 'real']))
    .requiredOption('--task <task>', 'task name, e.g. click-button')
    .option('--seed <n>', 'task seed', num('seed'), 0)
    .option('--temperature-a <t>', 'first temperature', num('temperature-a'), 0)
    .option('--temperature-b <t>', 'second temperature', num('temperature-b'), 0.7)
    .option('--steps <n>', 'step cap of each episode', num('steps'), 10)
    .option('--json', 'print JSON')
    .action(async (opts: { env?: 'miniwob' | 'real'; task: string; seed: number; temperatureA: number; temperatureB: number; steps: number; json?: boolean }) => {
      const base = ctx.loadConfig(program.opts().config);
      // Each temperature is validated like the config's own (policy.temperature), the error naming the flag.
      for (const [flag, t] of [
        ['--temperature-a', opts.temperatureA],
        ['--temperature-b', opts.temperatureB],
      ] as const) {
        try {
          parseConfig({ ...base, policy: { ...base.policy, temperature: t } }, flag);
        } catch (err) {
          throw new ConfigError(`${flag} ${t}: ${(err as Error).message}`);
        }
      }
      if (!Number.isInteger(opts.steps) || opts.steps < 1) throw new ConfigError(`--steps must be a positive integer, got ${opts.steps}`);
      const cfg = parseConfig(
        {
          ...base,
          episode: { ...base.episode, ...(opts.env ? { env: opts.env } : {}), task: opts.task, seed: opts.seed, maxSteps: opts.steps },
          policy: { ...base.policy, temperature: opts.temperatureA },
        },
        'command line',
      );
      const { client, connection } = await connectClient(cfg);
      try {
        const r = await verifyExploration(client, cfg, [opts.temperatureA, opts.temperatureB]);
        console.log(opts.json ? JSON.stringify(r) : formatExploration(r));
      } finally {
        await connection.close();
      }
    });
}
