/**
 * What the benches that train methods side by side share (bench/methods.ts, bench/repeats.ts): each row's config,
 * the checks before anything starts, and one training run started or attached, followed to its end and read back.
 */
import type { Client, Connection, WorkflowHandle } from '@temporalio/client';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { startOrAttachMcts } from '../client/commands/mcts';
import { preflightTasks } from '../client/run-flags';
import { connectClient, stackStatus } from '../client/stack';
import { followStatus, progressNumbers, startOrAttachTrain } from '../client/train';
import { findMiniwobHtml } from '../env/miniwob-server';
import { assertMiniwobTask, listMiniwobTasks } from '../env/miniwob-tasks';
import { loadConfigFile } from '../host/config-file';
import { adapterVersionsOnDisk, defaultCheckpoints } from '../host/eval-config-file';
import { runMetricsFile } from '../host/run-metrics-file';
import { ConfigError, parseConfig, type HaloConfig } from '../lib/config/config';
import { identicalCandidatesProblem } from '../lib/config/config-checks';
import { algorithmOf, groupingOf, parseMethods, parseRowConfigs, rowConfigProblems, type Method } from './methods-table';
import { parseMetricsJsonl, type MetricsLine } from '../lib/training/run-metrics';
import type { TrainingResult } from '../workflows/train-engine';

const pct = (x: number) => `${Math.round(x * 100)}%`;

export type BenchValues = Record<string, string | boolean | undefined>;

/** A bench's flags: a bad one is a ConfigError followed by the usage; --help prints the usage and exits. */
export function parseBenchCli(argv: string[], options: NonNullable<ParseArgsConfig['options']>, usage: string): BenchValues {
  let values: BenchValues;
  try {
    ({ values } = parseArgs({ args: argv, options: { ...options, help: { type: 'boolean', short: 'h', default: false } } }));
  } catch (err) {
    throw new ConfigError(`${(err as Error).message}\n\n${usage}`);
  }
  if (values.help) {
    console.log(usage);
    process.exit(0);
  }
  return values;
}

/** --tag (at most `maxTag` characters, so the longest run id made from it fits), --rows and --row-config. */
export function rowArgs(values: BenchValues, maxTag: number): { tag: string; methods: Method[]; rowConfigs: Map<Method, string> } {
  const tag = values.tag as string;
  if (!new RegExp(`^[A-Za-z0-9][A-Za-z0-9._-]{0,${maxTag - 1}}$`).test(tag)) {
    throw new ConfigError(`--tag ${JSON.stringify(tag)}: letters, digits, . _ - (at most ${maxTag})`);
  }
  try {
    const methods = parseMethods(values.rows as string);
    return { tag, methods, rowConfigs: parseRowConfigs(values['row-config'] as string, methods) };
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
}

/** Temporal or a worker does not answer: exit 2. */
export class StackDown extends Error {}

/** What the bench knows about one row after its run. */
export interface RowOutcome {
  method: Method;
  runId?: string;
  metrics: MetricsLine[];
  adapterVersion?: number;
  failed?: string;
  note?: string;
}

export interface RowPlan {
  method: Method;
  runId: string;
  cfg: HaloConfig;
}

/** A bench's progress line (stderr, prefixed with the bench's name). */
export type Say = (line: string) => void;

/**
 * Each trained row's config: the shared one (or the row's own file, `--row-config`) with its run id (and
 * grouping), validated like `halo train` / `halo mcts`.
 */
export function rowPlans(cfg: HaloConfig, tag: string, methods: readonly Method[], rowFiles: ReadonlyMap<Method, string>): RowPlan[] {
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

export function loadRowConfig(shared: HaloConfig, method: Method, file: string): HaloConfig {
  const own = loadConfigFile(resolve(file)); // a missing or bad file: its ConfigError names it
  const problems = rowConfigProblems(shared, own, method);
  if (problems.length) throw new ConfigError(`--row-config ${method}=${file} cannot stand in this comparison:\n${problems.map((p) => `  ${p}`).join('\n')}`);
  return own;
}

/** One note per file of `--row-config`: which rows trained with it. */
export function rowConfigNotes(files: ReadonlyMap<Method, string>, methods: readonly Method[]): string[] {
  const byFile = new Map<string, Method[]>();
  for (const [method, file] of files) byFile.set(file, [...(byFile.get(file) ?? []), method]);
  const others = methods.some((m) => !files.has(m)) ? "; the other rows with --config's" : '';
  return [...byFile].map(([file, rows]) => `${rows.length > 1 ? 'rows' : 'row'} ${rows.join(', ')} trained with the config file ${file}${others}`);
}

/** The tasks exist (MiniWoB++: in the installed package; REAL: known and reachable), before anything starts. */
export async function checkTasks(cfg: HaloConfig): Promise<void> {
  const names = [...new Set([...cfg.train.tasks, ...cfg.train.heldOutTasks, ...cfg.mcts.tasks])];
  if (cfg.episode.env === 'real') return preflightTasks('real', names, undefined, 'methods comparison');
  const known = listMiniwobTasks(findMiniwobHtml());
  try {
    for (const name of names) assertMiniwobTask(name, known);
  } catch (err) {
    throw new ConfigError(`train.tasks / train.heldOutTasks / mcts.tasks: ${(err as Error).message}`);
  }
}

export async function connectOrExit(cfg: HaloConfig): Promise<{ client: Client; connection: Connection }> {
  try {
    return await connectClient(cfg);
  } catch (err) {
    throw new StackDown((err as Error).message);
  }
}

/** Every queue the runs need has a worker: else nothing would move, and the bench would wait for ever. */
export async function checkWorkers(connection: Connection, cfg: HaloConfig): Promise<void> {
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
export function reasonOf(err: unknown): string {
  let e = err as Error & { cause?: unknown };
  while (e.cause instanceof Error && e.cause.message) e = e.cause as Error & { cause?: unknown };
  const first = (e.message || String(err)).split('\n')[0];
  return first.length > 240 ? `${first.slice(0, 239)}…` : first;
}

/** A gRPC UNAVAILABLE anywhere in the cause chain: the server went away, which is not the run's failure. */
export function unavailable(err: unknown): boolean {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined; e; e = e.cause as typeof e) if (e.code === 14) return true;
  return false;
}

/** Waits for a run, printing a line whenever its iteration, phase or last numbers change. */
export function followRun(handle: WorkflowHandle, label: string, say: Say): Promise<TrainingResult> {
  return followStatus(
    handle,
    (st) => {
      const m = st.lastMetrics;
      const last = m ? ` · last: ${progressNumbers(m)}${m.eval ? `, held-out ${pct(m.eval.success_rate)}` : ''}` : '';
      return `${label}: iteration ${st.iteration}/${st.iterations} · ${st.phase}${st.paused ? ' (paused)' : ''}${last} · adapter v${st.adapterVersion}`;
    },
    say,
    2000,
  );
}

export function readMetrics(cfg: HaloConfig, runId: string): MetricsLine[] {
  const file = runMetricsFile(join(stackStatus(cfg).home, runId));
  if (!existsSync(file)) return [];
  return parseMetricsJsonl(readFileSync(file, 'utf8'), file);
}

/** One training row: start or attach, follow to the end, then its metrics and the adapter the evaluation takes. */
export async function runRow(client: Client, plan: RowPlan, say: Say, label: string = plan.method): Promise<RowOutcome> {
  const { method, runId, cfg } = plan;
  const out: RowOutcome = { method, runId, metrics: [] };
  try {
    const { handle, attached } = algorithmOf(method) === 'mcts' ? await startOrAttachMcts(client, cfg) : await startOrAttachTrain(client, cfg);
    say(`${label}: ${attached ? 'attached to' : 'started'} run ${runId}${attached ? ' (it keeps the config it started with)' : ''}`);
    const result = await followRun(handle, label, say);
    say(`${label}: run ${runId} finished: ${result.iterations} iterations, adapter v${result.adapterVersion}${result.stoppedEarly ? ' (stopped early)' : ''}`);
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
  if (out.failed) say(`${label}: failed: ${out.failed}`);
  return out;
}

/** Runs `fn` over `items`, at most `limit` at once, results in order. */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
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
