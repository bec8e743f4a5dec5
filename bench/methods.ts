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
import type { Client, Connection, WorkflowHandle } from '@temporalio/client';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { runEval } from '../client/commands/eval';
import { startOrAttachMcts } from '../client/commands/mcts';
import { preflightTasks } from '../client/run-flags';
import { connectClient, stackStatus } from '../client/stack';
import { followStatus, progressNumbers, startOrAttachTrain } from '../client/train';
import { findMiniwobHtml } from '../env/miniwob-server';
import { assertMiniwobTask, listMiniwobTasks } from '../env/miniwob-tasks';
import { loadConfigFile } from '../host/config-file';
import { adapterVersionsOnDisk, defaultCheckpoints } from '../host/eval-config-file';
import { runMetricsFile } from '../host/run-metrics-file';
import { ConfigError, identicalCandidatesProblem, mctsCriticSchema, parseConfig, type HaloConfig } from '../lib/config';
import { parseEvalConfig, testTimeSearchParams, type EvalConfigInput } from '../lib/eval-config';
import type { EpisodeResult } from '../lib/episode-types';
import type { EvalSummaryRow } from '../lib/eval-summary';
import {
  SUCCESS_THRESHOLD,
  algorithmOf,
  comparisonProblems,
  curveSpec,
  groupingOf,
  methodRow,
  methodsMarkdown,
  parseMethods,
  parseRowConfigs,
  rowConfigProblems,
  sampleEfficiencySpec,
  type Method,
  type MethodInput,
  type MethodsReport,
  type TaskEvalEpisode,
} from '../lib/methods-table';
import { parseMetricsJsonl, type MetricsLine } from '../lib/run-metrics';
import type { TrainingResult } from '../workflows/train-engine';
import { printBenchHeader, printLoadAtEnd } from './bench-run';

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

/** Temporal or a worker does not answer: exit 2. */
class StackDown extends Error {}

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
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        config: { type: 'string', default: 'configs/multistep.yaml' },
        tag: { type: 'string', default: 'methods' },
        rows: { type: 'string', default: 'base,grpo-episode,grpo-step,grpo-anchor,mcts-dpo' },
        'row-config': { type: 'string', default: '' },
        'no-search': { type: 'boolean', default: false },
        out: { type: 'string', default: 'bench/methods' },
        help: { type: 'boolean', short: 'h', default: false },
      },
    }));
  } catch (err) {
    throw new ConfigError(`${(err as Error).message}\n\n${USAGE}`);
  }
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const tag = values.tag as string;
  // The longest id made from it: <tag>-grpo-episode, within a run id's 81 characters.
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,67}$/.test(tag)) throw new ConfigError(`--tag ${JSON.stringify(tag)}: letters, digits, . _ - (at most 68)`);
  let methods: Method[];
  let rowConfigs: Map<Method, string>;
  try {
    methods = parseMethods(values.rows as string);
    rowConfigs = parseRowConfigs(values['row-config'] as string, methods);
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  return { config: values.config as string, tag, methods, rowConfigs, search: !values['no-search'], out: values.out as string };
}

const shellWord = (s: string) => (/^[A-Za-z0-9_./,=:@%+-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);
const commandLine = () => ['node --import tsx bench/methods.ts', ...process.argv.slice(2).map(shellWord)].join(' ');
const say = (line: string) => console.error(`methods: ${line}`);
const pct = (x: number) => `${Math.round(x * 100)}%`;

/** What the bench knows about one row after its run. */
interface RowOutcome {
  method: Method;
  runId?: string;
  metrics: MetricsLine[];
  adapterVersion?: number;
  failed?: string;
  note?: string;
}

interface RowPlan {
  method: Method;
  runId: string;
  cfg: HaloConfig;
}

/**
 * Each trained row's config: the shared one (or the row's own file, `--row-config`) with its run id (and
 * grouping), validated like `halo train` / `halo mcts`.
 */
function rowPlans(cfg: HaloConfig, tag: string, methods: readonly Method[], rowFiles: ReadonlyMap<Method, string>): RowPlan[] {
  return methods.flatMap((method) => {
    if (method === 'base') return [];
    const runId = `${tag}-${method}`;
    const grouping = groupingOf(method);
    const file = rowFiles.get(method);
    const src = file ? loadRowConfig(cfg, method, file) : cfg;
    const raw = grouping ? { ...src, train: { ...src.train, runId, grouping } } : { ...src, mcts: { ...src.mcts, runId } };
    const rowCfg = parseConfig(raw, `config of row ${method}`);
    const same = grouping ? identicalCandidatesProblem(rowCfg) : undefined;
    if (same) throw new ConfigError(`row ${method}: ${same}`);
    return [{ method, runId, cfg: rowCfg }];
  });
}

function loadRowConfig(shared: HaloConfig, method: Method, file: string): HaloConfig {
  const own = loadConfigFile(resolve(file)); // a missing or bad file: its ConfigError names it
  const problems = rowConfigProblems(shared, own, method);
  if (problems.length) throw new ConfigError(`--row-config ${method}=${file} cannot stand in this comparison:\n${problems.map((p) => `  ${p}`).join('\n')}`);
  return own;
}

/** One note per file of `--row-config`: which rows trained with it. */
function rowConfigNotes(files: ReadonlyMap<Method, string>): string[] {
  const byFile = new Map<string, Method[]>();
  for (const [method, file] of files) byFile.set(file, [...(byFile.get(file) ?? []), method]);
  return [...byFile].map(([file, rows]) => `${rows.length > 1 ? 'rows' : 'row'} ${rows.join(', ')} trained with the config file ${file}; the other rows with --config's`);
}

/** The tasks exist (MiniWoB++: in the installed package; REAL: known and reachable), before anything starts. */
async function checkTasks(cfg: HaloConfig): Promise<void> {
  const names = [...new Set([...cfg.train.tasks, ...cfg.train.heldOutTasks, ...cfg.mcts.tasks])];
  if (cfg.episode.env === 'real') return preflightTasks('real', names, undefined, 'methods comparison');
  const known = listMiniwobTasks(findMiniwobHtml());
  try {
    for (const name of names) assertMiniwobTask(name, known);
  } catch (err) {
    throw new ConfigError(`train.tasks / train.heldOutTasks / mcts.tasks: ${(err as Error).message}`);
  }
}

async function connectOrExit(cfg: HaloConfig): Promise<{ client: Client; connection: Connection }> {
  try {
    return await connectClient(cfg);
  } catch (err) {
    throw new StackDown((err as Error).message);
  }
}

/** Every queue the runs need has a worker: else nothing would move, and the bench would wait for ever. */
async function checkWorkers(connection: Connection, cfg: HaloConfig): Promise<void> {
  const { namespace } = stackStatus(cfg);
  const queues = [
    { name: cfg.temporal.controlTaskQueue, type: 1 /* WORKFLOW */, what: 'control worker' },
    { name: cfg.temporal.browserTaskQueue, type: 2 /* ACTIVITY */, what: 'browser worker' },
    { name: cfg.train.gpuTaskQueue, type: 2, what: 'learner' },
  ];
  const missing: string[] = [];
  for (const q of queues) {
    const res = await connection.workflowService.describeTaskQueue({ namespace, taskQueue: { name: q.name }, taskQueueType: q.type });
    if ((res.pollers ?? []).length === 0) missing.push(`${q.what} (task queue ${q.name})`);
  }
  if (missing.length) throw new StackDown(`Temporal answers, but no worker polls for: ${missing.join(', ')}; run \`npx halo up\` first`);
}

/** The root cause's message, on one line. */
function reasonOf(err: unknown): string {
  let e = err as Error & { cause?: unknown };
  while (e.cause instanceof Error && e.cause.message) e = e.cause as Error & { cause?: unknown };
  const first = (e.message || String(err)).split('\n')[0];
  return first.length > 240 ? `${first.slice(0, 239)}…` : first;
}

/** A gRPC UNAVAILABLE anywhere in the cause chain: the server went away, which is not the run's failure. */
function unavailable(err: unknown): boolean {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined; e; e = e.cause as typeof e) if (e.code === 14) return true;
  return false;
}

/** Waits for a run, printing a line whenever its iteration, phase or last numbers change. */
function followRun(handle: WorkflowHandle, method: Method): Promise<TrainingResult> {
  return followStatus(
    handle,
    (st) => {
      const m = st.lastMetrics;
      const last = m ? ` · last: ${progressNumbers(m)}${m.eval ? `, held-out ${pct(m.eval.success_rate)}` : ''}` : '';
      return `${method}: iteration ${st.iteration}/${st.iterations} · ${st.phase}${st.paused ? ' (paused)' : ''}${last} · adapter v${st.adapterVersion}`;
    },
    say,
    2000,
  );
}

function readMetrics(cfg: HaloConfig, runId: string): MetricsLine[] {
  const file = runMetricsFile(join(stackStatus(cfg).home, runId));
  if (!existsSync(file)) return [];
  return parseMetricsJsonl(readFileSync(file, 'utf8'), file);
}

/** One training row: start or attach, follow to the end, then its metrics and the adapter the evaluation takes. */
async function runRow(client: Client, plan: RowPlan): Promise<RowOutcome> {
  const { method, runId, cfg } = plan;
  const out: RowOutcome = { method, runId, metrics: [] };
  try {
    const { handle, attached } = algorithmOf(method) === 'mcts' ? await startOrAttachMcts(client, cfg) : await startOrAttachTrain(client, cfg);
    say(`${method}: ${attached ? 'attached to' : 'started'} run ${runId}${attached ? ' (it keeps the config it started with)' : ''}`);
    const result = await followRun(handle, method);
    say(`${method}: run ${runId} finished: ${result.iterations} iterations, adapter v${result.adapterVersion}${result.stoppedEarly ? ' (stopped early)' : ''}`);
    out.adapterVersion = result.adapterVersion;
    if (result.stoppedEarly)
      out.note = `run ${runId} was stopped early, after ${result.iterations} of ${algorithmOf(method) === 'mcts' ? cfg.mcts.iterations : cfg.train.iterations} iterations`;
    const root = defaultCheckpoints();
    const onDisk = adapterVersionsOnDisk(root, runId);
    if (result.adapterVersion === 0) out.failed = 'no adapter: the run made no update';
    else if (!onDisk.includes(result.adapterVersion)) {
      out.failed = `adapter v${result.adapterVersion} missing under ${join(root, runId)} (on disk: ${onDisk.length ? onDisk.map((v) => `v${v}`).join(', ') : 'none'})`;
    }
  } catch (err) {
    if (unavailable(err)) throw new StackDown(`Temporal stopped answering (${reasonOf(err)}); run \`npx halo up\`, then this command again: it attaches`);
    out.failed = reasonOf(err);
  }
  try {
    out.metrics = readMetrics(cfg, runId);
  } catch (err) {
    out.failed ??= `metrics unreadable: ${reasonOf(err)}`;
  }
  if (out.failed) say(`${method}: failed: ${out.failed}`);
  return out;
}

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

/** Runs `fn` over `items`, at most `limit` at once, results in order. */
async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const lane = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  return out;
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
  const notes: string[] = rowConfigNotes(args.rowConfigs);
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
      outcomes.push(plan ? await runRow(client, plan) : { method, metrics: [] });
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
      command: commandLine(),
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
