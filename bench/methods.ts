/**
 * The methods comparison: one config, one list of held-out tasks and seeds, every training method of the
 * system trained as an ordinary run on the user's stack (`npx halo up`), then one evaluation of them all.
 *
 *   node --import tsx bench/methods.ts [--config configs/multistep.yaml] [--tag methods]
 *        [--rows base,grpo-episode,grpo-step,grpo-anchor,mcts-dpo] [--row-config ROW=FILE,…] [--no-search]
 *        [--out bench/methods]
 *
 * - Rows `grpo-episode`, `grpo-step`, `grpo-anchor`: `trainGrpo` runs `<tag>-<row>` with the config's train
 *   section and that grouping; `mcts-dpo`: a `trainMcts` run with its mcts section (same training tasks and
 *   held-out seeds, or it refuses); `base`: no training. One run after another (start, or attach by run id).
 * - `--row-config grpo-anchor=configs/multistep-anchor.yaml`: that row trains with its own config file (a
 *   method that needs other rewards or a learning rate of its own), which must name the same environment, policy,
 *   tasks and held-out seeds; the table's notes say which row used which file.
 * - Then the evaluation `<tag>-eval` (an `evaluate` workflow): base and each trained adapter (its last
 *   version) greedily, and, unless --no-search, each with test-time MCTS (mcts.maxChildren simulations per step,
 *   no critic); train.heldOutTasks × train.evalSeeds for every mode.
 * - Everything is a workflow with a fixed id: after a killed worker, a killed bench or a restart, the same
 *   command attaches to the runs and the evaluation and goes on. A run that failed stays in the table as failed.
 * - Writes <out>/<tag>/{table.md, curve.vl.json, sample-efficiency.vl.json, rows.json} and the evaluation's
 *   files in <out>/<tag>/eval/; prints the command and the table.
 *
 * Exit status: 0 done, 1 bad arguments or config, 2 the stack does not answer (run `npx halo up`).
 */
import '../host/load-env'; // first: .env fills in what the environment does not set (HALO_CHECKPOINTS, TEMPORAL_ADDRESS, …)
import type { Client } from '@temporalio/client';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { runEval } from '../client/commands/eval';
import { loadConfigFile } from '../host/config-file';
import { ConfigError, mctsCriticSchema, type HaloConfig } from '../lib/config/config';
import { parseEvalConfig, testTimeSearchParams, type EvalConfigInput } from '../lib/eval/eval-config';
import type { EpisodeResult } from '../lib/episode/episode-types';
import type { EvalSummaryRow } from '../lib/eval/eval-summary';
import {
  SUCCESS_THRESHOLD,
  algorithmOf,
  comparisonProblems,
  curveSpec,
  groupingOf,
  methodRow,
  methodsMarkdown,
  sampleEfficiencySpec,
  type Method,
  type MethodInput,
  type MethodsReport,
  type TaskEvalEpisode,
} from './methods-table';
import { benchCommandLine, printBenchHeader, printLoadAtEnd } from './bench-run';
import {
  StackDown,
  parseBenchCli,
  rowArgs,
  checkTasks,
  checkWorkers,
  connectOrExit,
  mapLimit,
  reasonOf,
  unavailable,
  rowConfigNotes,
  rowPlans,
  runRow,
  type RowOutcome,
} from './method-runs';

const USAGE = `usage: node --import tsx bench/methods.ts [options]

Trains every method on the running stack (npx halo up), one run after another, evaluates them on the same
held-out tasks and seeds, and writes <out>/<tag>/{table.md, curve.vl.json, sample-efficiency.vl.json, rows.json}.
The same command again attaches to the runs and the evaluation it started (after a crash or restart).

  --config FILE   halo config with train and mcts sections (default configs/multistep.yaml)
  --tag TAG       run ids <tag>-<row>, evaluation <tag>-eval (default methods)
  --rows LIST     comma-separated, run in the order given (default base,grpo-episode,grpo-step,grpo-anchor,mcts-dpo)
  --row-config LIST  ROW=FILE,…: those rows train with that config file instead of --config's (e.g.
                  grpo-anchor=configs/multistep-anchor.yaml): same environment, policy, tasks and held-out
                  seeds, its own rewards, learning rate and so on; the table's notes name them
  --no-search     leave test-time MCTS out of the evaluation
  --out DIR       output folder (default bench/methods)
  -h, --help      this text

Exit status: 0 done, 1 bad arguments or config, 2 the stack does not answer (run npx halo up).`;

interface Args {
  config: string;
  tag: string;
  methods: Method[];
  /** Rows that train with a config file of their own (`--row-config`). */
  rowConfigs: Map<Method, string>;
  search: boolean;
  out: string;
}

function parseCli(argv: string[]): Args {
  const values = parseBenchCli(
    argv,
    {
      config: { type: 'string', default: 'configs/multistep.yaml' },
      tag: { type: 'string', default: 'methods' },
      rows: { type: 'string', default: 'base,grpo-episode,grpo-step,grpo-anchor,mcts-dpo' },
      'row-config': { type: 'string', default: '' },
      'no-search': { type: 'boolean', default: false },
      out: { type: 'string', default: 'bench/methods' },
    },
    USAGE,
  );
  // The longest id made from the tag: <tag>-grpo-episode, within a run id's 81 characters.
  const { tag, methods, rowConfigs } = rowArgs(values, 68);
  return { config: values.config as string, tag, methods, rowConfigs, search: !values['no-search'], out: values.out as string };
}

const say = (line: string) => console.error(`methods: ${line}`);

/** The evaluation's modes: base, each trained adapter, and (with search) each again with test-time MCTS. */
function evalModes(cfg: HaloConfig, outcomes: readonly RowOutcome[], search: boolean): NonNullable<EvalConfigInput['modes']> {
  const backend = cfg.policy.backend;
  const served = backend === 'openai' ? { baseUrl: cfg.policy.baseUrl } : {};
  const testTimeMcts = { simulations: cfg.mcts.maxChildren, critic: { backend: 'none' as const } };
  const ready = outcomes.filter((o) => !o.failed);
  const greedy = ready.map((o) =>
    o.method === 'base'
      ? { name: 'qwen3vl_base' as const, label: 'base', backend, ...served, adapter: { run: 'base', version: 0 } }
      : {
          name: algorithmOf(o.method) === 'mcts' ? ('qwen3vl_mcts' as const) : ('qwen3vl_grpo' as const),
          label: o.method,
          backend,
          ...served,
          adapter: { run: o.runId!, version: o.adapterVersion! },
        },
  );
  const searched = search
    ? ready.map((o) => ({
        name: 'qwen3vl_mcts' as const,
        label: `${o.method}-search`,
        backend,
        ...served,
        adapter: o.method === 'base' ? { run: 'base', version: 0 } : { run: o.runId!, version: o.adapterVersion! },
        testTimeMcts,
      }))
    : [];
  return [...greedy, ...searched];
}

/** The summary row of a mode: its only site, or `all` when it spans several. */
function summaryRowOf(rows: readonly EvalSummaryRow[], label: string): EvalSummaryRow | undefined {
  const mine = rows.filter((r) => r.mode === label);
  return mine.length === 1 ? mine[0] : mine.find((r) => r.site === 'all');
}

interface Evaluation {
  evalId: string;
  rows: EvalSummaryRow[];
  /** Why there are no results at all. */
  failed?: string;
  notes: string[];
}

async function runEvaluation(client: Client, cfg: HaloConfig, tag: string, outcomes: readonly RowOutcome[], search: boolean, dir: string): Promise<Evaluation> {
  const evalId = `${tag}-eval`;
  const modes = evalModes(cfg, outcomes, search);
  if (modes.length === 0) return { evalId, rows: [], failed: 'nothing to evaluate', notes: [] };
  try {
    const evalCfg = parseEvalConfig(
      { runId: evalId, env: cfg.episode.env, tasks: cfg.train.heldOutTasks, seeds: cfg.train.evalSeeds, maxSteps: cfg.episode.maxSteps, parallelism: cfg.train.parallelism, modes },
      'evaluation of the methods comparison',
    );
    const out = await runEval(evalCfg, client, { base: cfg, outDir: dir, progress: (line) => say(`eval: ${line}`) });
    const done = new Set(out.result.modes.map((m) => m.label));
    const absent = modes.map((m) => m.label!).filter((l) => !done.has(l));
    const notes = absent.length
      ? [
          `evaluation ${evalId} was started earlier without ${absent.join(', ')} (attaching keeps its plan); to evaluate them, delete it (temporal workflow delete --workflow-id ${evalId}) and run this again`,
        ]
      : [];
    if (out.result.stoppedEarly) notes.push(`evaluation ${evalId} was stopped early: some episodes were not run`);
    return { evalId, rows: out.report.rows, notes };
  } catch (err) {
    if (unavailable(err)) throw new StackDown(`Temporal stopped answering (${reasonOf(err)}); run \`npx halo up\`, then this command again: it attaches`);
    return { evalId, rows: [], failed: `evaluation ${evalId}: ${reasonOf(err)}`, notes: [] };
  }
}

/**
 * The per-iteration evaluations split by task. metrics.jsonl keeps only their totals; each evaluation episode is
 * a child workflow `<run>-it<N>-eval<j>` whose result names its task, kept by Temporal for the namespace's
 * retention period. Any one missing, and the charts fall back to all tasks together.
 */
async function taskEpisodes(client: Client, outcomes: readonly RowOutcome[]): Promise<{ ok: true; byMethod: Map<Method, TaskEvalEpisode[]> } | { ok: false; reason: string }> {
  const wanted = outcomes.flatMap((o) =>
    o.runId
      ? o.metrics.flatMap((m) =>
          Array.from({ length: m.eval?.episodes ?? 0 }, (_, j) => ({ method: o.method, iteration: m.iteration, id: `${o.runId}-it${m.iteration}-eval${j}` })),
        )
      : [],
  );
  if (outcomes.some((o) => o.runId && o.metrics.some((m) => m.eval === undefined && m.mcts?.eval_success_rate !== undefined))) {
    return { ok: false, reason: 'an MCTS run from before metrics.jsonl recorded no evaluation episode count' };
  }
  if (wanted.length === 0) return { ok: false, reason: 'no per-iteration evaluation episodes' };
  say(`reading the ${wanted.length} per-iteration evaluation episodes to split them by task`);
  try {
    const results = await mapLimit(wanted, 8, async (w) => {
      const r = (await client.workflow.getHandle(w.id).result()) as EpisodeResult;
      return { method: w.method, iteration: w.iteration, task: r.task.task, success: r.success };
    });
    const byMethod = new Map<Method, TaskEvalEpisode[]>();
    for (const r of results) byMethod.set(r.method, [...(byMethod.get(r.method) ?? []), { iteration: r.iteration, task: r.task, success: r.success }]);
    return { ok: true, byMethod };
  } catch (err) {
    return { ok: false, reason: `evaluation episodes not readable from Temporal (${reasonOf(err)})` };
  }
}

async function main(): Promise<void> {
  const args = parseCli(process.argv.slice(2));
  const configPath = resolve(args.config);
  if (!existsSync(configPath)) throw new ConfigError(`config ${args.config} does not exist: pass --config FILE, a halo config with train and mcts sections`);
  const cfg = loadConfigFile(configPath);
  const problems = comparisonProblems(cfg, args.methods);
  if (problems.length) throw new ConfigError(`config ${args.config} cannot compare the methods:\n${problems.map((p) => `  ${p}`).join('\n')}`);
  const plans = rowPlans(cfg, args.tag, args.methods, args.rowConfigs);
  if (args.search) testTimeSearchParams(cfg, { simulations: cfg.mcts.maxChildren, critic: mctsCriticSchema.parse({ backend: 'none' }) });
  await checkTasks(cfg);
  const outDir = resolve(args.out, args.tag);

  printBenchHeader('methods');
  const notes: string[] = rowConfigNotes(args.rowConfigs, args.methods);
  if (cfg.train.seed === undefined && plans.filter((p) => groupingOf(p.method)).length > 1) {
    notes.push('train.seed is not set, so each GRPO run draws its training seeds from its own run id (set it for the same training episodes in every run)');
  }
  const { client, connection } = await connectOrExit(cfg);
  try {
    await checkWorkers(connection, cfg);
    mkdirSync(outDir, { recursive: true });
    say(
      `rows ${args.methods.join(', ')}; runs ${plans.map((p) => p.runId).join(', ') || 'none'}; evaluation ${args.tag}-eval. Interrupted? The same command attaches and goes on.`,
    );
    const outcomes: RowOutcome[] = [];
    for (const method of args.methods) {
      const plan = plans.find((p) => p.method === method);
      outcomes.push(plan ? await runRow(client, plan, say) : { method, metrics: [] });
    }
    const evaluation = await runEvaluation(client, cfg, args.tag, outcomes, args.search, join(outDir, 'eval'));
    if (evaluation.failed) say(evaluation.failed);
    notes.push(...outcomes.flatMap((o) => (o.note ? [o.note] : [])), ...evaluation.notes);
    const split = await taskEpisodes(client, outcomes);

    const inputs: MethodInput[] = outcomes.map((o) => {
      const greedy = summaryRowOf(evaluation.rows, o.method);
      const searchRow = summaryRowOf(evaluation.rows, `${o.method}-search`);
      const notIn = `not in evaluation ${evaluation.evalId}`;
      const failed = o.failed ?? evaluation.failed ?? (greedy ? undefined : notIn);
      return {
        method: o.method,
        ...(o.runId ? { runId: o.runId } : {}),
        metrics: o.metrics,
        ...(failed ? { failed } : {}),
        ...(greedy ? { greedy } : {}),
        ...(searchRow ? { search: searchRow } : args.search ? { searchFailed: evaluation.failed ?? notIn } : {}),
        ...(split.ok && o.runId ? { taskEpisodes: split.byMethod.get(o.method) ?? [] } : {}),
      };
    });
    const report: MethodsReport = {
      command: benchCommandLine('methods'),
      env: cfg.episode.env,
      tasks: cfg.train.heldOutTasks,
      seeds: cfg.train.evalSeeds ?? [],
      threshold: SUCCESS_THRESHOLD,
      search: args.search ? { simulations: cfg.mcts.maxChildren } : null,
      rows: inputs.map((i) => methodRow(i)),
      perTask: split.ok ? { ok: true } : { ok: false, reason: split.reason },
      notes,
    };
    const markdown = methodsMarkdown(report);
    const files = { table: join(outDir, 'table.md'), curve: join(outDir, 'curve.vl.json'), efficiency: join(outDir, 'sample-efficiency.vl.json'), rows: join(outDir, 'rows.json') };
    writeFileSync(files.table, markdown);
    writeFileSync(files.curve, JSON.stringify(curveSpec(report), null, 2) + '\n');
    writeFileSync(files.efficiency, JSON.stringify(sampleEfficiencySpec(report), null, 2) + '\n');
    writeFileSync(files.rows, JSON.stringify({ config: relative(process.cwd(), configPath), tag: args.tag, evalId: evaluation.evalId, ...report }, null, 2) + '\n');
    console.log('');
    console.log(markdown);
    console.log(`written: ${Object.values(files).join(', ')}; evaluation files in ${join(outDir, 'eval')}`);
    printLoadAtEnd();
  } finally {
    await connection.close();
  }
}

main().catch((err) => {
  if (err instanceof StackDown) {
    console.error(`methods: ${err.message}`);
    process.exit(2);
  }
  console.error(err instanceof ConfigError ? `methods: ${err.message}` : err);
  process.exit(1);
});
