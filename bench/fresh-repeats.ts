/**
 * Does a config learn in most runs, and is a run a function of its config and seed? K training runs of one config,
 * each on a stack of its own started fresh for it (Temporal dev server, control and browser workers, the learner:
 * the tiny model of the run's `--models` entry), with `train.seed` the run's seed. A run reached the target when
 * its training success over its last five iterations averages ≥ --threshold; with held-out evaluations in the
 * config (train.heldOutTasks + evalEvery), its last greedy held-out success is reported beside it. A seed listed
 * twice runs twice, on two stacks: the two curves and the last adapters' hashes must be equal (reproducibility).
 *
 *   node --import tsx bench/fresh-repeats.ts [--config configs/default.yaml] [--seeds 1,2,3] [--models tiny-random]
 *        [--parallel 1] [--threshold 0.8] [--tag default] [--out bench/repeats]
 *
 * Writes <out>/<tag>/{table.md, runs.json}. Exit status: 0 done (whatever the runs learned), 1 bad arguments.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { startOrAttachTrain } from '../client/train';
import { loadConfigFile } from '../host/config-file';
import { ConfigError, parseConfig, type HaloConfig } from '../lib/config/config';
import { isGrpoMetrics, parseMetricsJsonl } from '../lib/training/run-metrics';
import { freshRunSummary, freshRunsMarkdown, type FreshRun } from './repeat-runs';
import { startTestStack } from '../testing/stack';
import { benchCommandLine, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';
import { mapLimit, parseBenchCli, type BenchValues } from './method-runs';

const USAGE = `usage: node --import tsx bench/fresh-repeats.ts [options]

Trains one config K times, each run on a freshly started stack of its own, and writes <out>/<tag>/{table.md, runs.json}.

  --config FILE      halo config (default configs/default.yaml)
  --seeds LIST       comma-separated train.seed values, one run each; a seed listed twice runs twice (default 1,2,3)
  --models LIST      tiny models the runs cycle through: tiny-random, tiny-random-s<seed> (default tiny-random)
  --parallel P       stacks at once (default 1)
  --threshold X      target of the mean training success over the last five iterations (default 0.8)
  --iterations N     train.iterations override (default: the config's)
  --rollout MODE     train.rollout override: iterations or stream (docs/streaming.md)
  --max-staleness K  train.maxStaleness override
  --tag TAG          names the output folder and the run ids (default fresh)
  --out DIR          output folder (default bench/repeats)
  -h, --help         this text`;

function list(flag: string, text: string): string[] {
  const items = text
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (items.length === 0) throw new ConfigError(`--${flag}: at least one value`);
  return items;
}

function adapterHash(checkpoints: string, runId: string, version: number): string | null {
  const dir = join(checkpoints, runId, `v${version}`);
  if (!existsSync(dir)) return null;
  const h = createHash('sha256');
  for (const f of readdirSync(dir)
    .filter((f) => f.endsWith('.safetensors'))
    .sort())
    h.update(f).update(readFileSync(join(dir, f)));
  return h.digest('hex').slice(0, 16);
}

/** A fresh stack; one more try when it does not come up (workers slow to poll on a loaded machine), since that is not the run's doing. */
async function startStack(model: string): ReturnType<typeof startTestStack> {
  try {
    return await startTestStack({ browserWorkers: 1, learner: { model } });
  } catch (err) {
    console.error(`stack did not start (${(err as Error).message.split('\n')[0]}); starting another`);
    return startTestStack({ browserWorkers: 1, learner: { model } });
  }
}

async function oneRun(base: HaloConfig, seed: number, model: string, k: number, tag: string): Promise<FreshRun> {
  const started = Date.now();
  const stack = await startStack(model);
  const runId = `${tag}-r${k}-s${seed}`;
  try {
    const cfg = parseConfig({
      ...base,
      temporal: { ...base.temporal, controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
      stack: { ...base.stack, home: stack.home },
      policy: { ...base.policy, model },
      train: { ...base.train, runId, seed, gpuTaskQueue: stack.gpuQueue },
    });
    const { handle } = await startOrAttachTrain(stack.client, cfg);
    let error: string | undefined;
    await handle.result().catch((err: Error) => {
      error = err.message;
    });
    const lines = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8')).filter(isGrpoMetrics);
    const last = lines.at(-1)?.adapter_version ?? 0;
    const evals = lines.flatMap((l) => (l.eval ? [{ iteration: l.iteration, success: l.eval.success_rate }] : []));
    return {
      runId,
      seed,
      model,
      success: lines.map((l) => l.success_rate),
      zeroStdFirstDraw: lines.map((l) => l.frac_reward_zero_std_first_draw ?? l.frac_reward_zero_std ?? 0),
      zeroStd: lines.map((l) => l.frac_reward_zero_std ?? 0),
      evals,
      adapterHash: adapterHash(stack.checkpoints, runId, last),
      seconds: Math.round((Date.now() - started) / 1000),
      ...(error ? { error } : {}),
    };
  } finally {
    await stack.stop();
  }
}

runBench(async () => {
  let values: BenchValues;
  try {
    values = parseBenchCli(
      process.argv.slice(2),
      {
        config: { type: 'string', default: 'configs/default.yaml' },
        seeds: { type: 'string', default: '1,2,3' },
        models: { type: 'string', default: 'tiny-random' },
        parallel: { type: 'string', default: '1' },
        threshold: { type: 'string', default: '0.8' },
        iterations: { type: 'string' },
        rollout: { type: 'string' },
        'max-staleness': { type: 'string' },
        tag: { type: 'string', default: 'fresh' },
        out: { type: 'string', default: 'bench/repeats' },
      },
      USAGE,
    );
  } catch (err) {
    console.error((err as Error).message);
    process.exit(1);
  }
  const seeds = list('seeds', values.seeds as string).map((s) => {
    const n = Number(s);
    if (!Number.isSafeInteger(n) || n < 0) throw new ConfigError(`--seeds: ${JSON.stringify(s)} is not a seed`);
    return n;
  });
  const models = list('models', values.models as string);
  for (const m of models) if (!/^tiny-random(-s\d{1,9})?$/.test(m)) throw new ConfigError(`--models: ${m} is not a tiny model (tiny-random, tiny-random-s<seed>)`);
  const threshold = Number(values.threshold);
  const parallel = Number(values.parallel);
  const tag = values.tag as string;
  const base = loadConfigFile(values.config as string);
  if (values.iterations) base.train.iterations = Number(values.iterations);
  if (values.rollout || values['max-staleness']) {
    // Through the schema again, so a bad value is the config's own error.
    const train = { ...base.train, ...(values.rollout ? { rollout: values.rollout } : {}), ...(values['max-staleness'] ? { maxStaleness: Number(values['max-staleness']) } : {}) };
    Object.assign(base, parseConfig({ ...base, train }, 'config with --rollout/--max-staleness'));
  }
  printBenchHeader('fresh-repeats');
  const runs = await mapLimit(
    seeds.map((seed, k) => ({ seed, k })),
    parallel,
    async ({ seed, k }) => {
      const r = await oneRun(base, seed, models[k % models.length], k + 1, tag);
      const s = freshRunSummary(r, threshold);
      console.log(
        `${r.runId} (${r.model}): success ${r.success.map((x) => x.toFixed(2)).join(' ')} · last five ${s.lastFive.toFixed(2)} · ${r.seconds} s${r.error ? ` · FAILED ${r.error}` : ''}`,
      );
      return r;
    },
  );
  const dir = resolve(values.out as string, tag);
  mkdirSync(dir, { recursive: true });
  const md = freshRunsMarkdown(runs, threshold, { command: benchCommandLine('fresh-repeats'), config: values.config as string });
  writeFileSync(join(dir, 'table.md'), md);
  writeFileSync(join(dir, 'runs.json'), `${JSON.stringify(runs, null, 1)}\n`);
  console.log(`\n${md}`);
  printLoadAtEnd();
});
