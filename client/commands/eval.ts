import type { Command } from 'commander';
import { WorkflowExecutionAlreadyStartedError, WorkflowIdReusePolicy, type Client, type WorkflowHandle } from '@temporalio/client';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { findMiniwobHtml } from '../../env/miniwob-server';
import { listMiniwobTasks } from '../../env/miniwob-tasks';
import { realTasksBySite } from '../../env/real-tasks';
import { ConfigError, parseConfig, type HaloConfig } from '../../lib/config/config';
import { loadConfigFile, readConfigRaw } from '../../host/config-file';
import { evalConfigSchema, parseEvalConfig, selectEvalModes, type EvalConfig, type RealTaskInfo, type ResolveOptions } from '../../lib/eval/eval-config';
import { loadEvalConfigFile, readEvalConfigRaw, resolveEvalPlanOnHost } from '../../host/eval-config-file';
import { applyEvalOverrides, parseWithFlags } from '../config-overrides';
import { addOverrideOptions, flagDefaults, loadPin, overrideContext, overrideFlagsOf, parseHaloWithFlags, preflightTasks, type TaskRegistryPin } from '../run-flags';
import { snapshotSites } from '../real-preflight';
import { summaryMarkdown, type EvalEpisodeRecord, type EvalSummary } from '../../lib/eval/eval-summary';
import { KIND, MODE, RUN_ID, TASK } from '../../lib/episode/search-attributes';
import { evalProgressQuery, type EvaluateInput, type EvaluateResult } from '../../workflows/evaluate';
import { REPO_ROOT } from '../processes';
import { blobStoreFor, type BlobStore } from '../../blob/store';
import { connectClient, stackStatus } from '../stack';
import { formatFailure, lastFailure, resultOf } from '../failure';
import { tokenIdsNote, withOptionalTokenIds } from '../token-ids';

// `halo eval --config FILE`: greedy evaluation of several policy modes on the same tasks and seeds, as one
// `evaluate` workflow (id = the eval id; running it again attaches). Results land in
// <stack.home>/evals/<id>/{episodes.jsonl, summary.json, summary.md}.

export interface EvalFiles {
  dir: string;
  episodes: string;
  summaryJson: string;
  summaryMd: string;
}

/** What `summary.json` holds (and `--json` prints). */
export interface EvalReport extends EvalSummary {
  modesEvaluated: EvaluateResult['modes'];
  resultsRef: string;
  files: EvalFiles;
}

export interface RunEvalOptions {
  /** The HALO config of the stack (Temporal queues, reward weights, REAL options, learner queue). */
  base: HaloConfig;
  /** Folder for the three files (default <stack.home>/evals/<evalId>). */
  outDir?: string;
  /** Where API keys are looked up for the skip decision (default process.env). */
  env?: NodeJS.ProcessEnv;
  /** The learner's checkpoints root for `version: latest` (default HALO_CHECKPOINTS, else <repo>/checkpoints). */
  checkpoints?: string;
  /** Progress lines (episodes done / total); none when absent. */
  progress?: (line: string) => void;
  /** How often progress is polled (default 1 s). */
  pollMs?: number;
  /** A plan already made by planEval (else made here). */
  plan?: EvaluateInput;
}

export interface RunEvalOutput {
  result: EvaluateResult;
  attached: boolean;
  markdown: string;
  report: EvalReport;
  files: EvalFiles;
}

/** The installed task registries, for checking names and expanding REAL sites. */
export function taskRegistries(cfg: EvalConfig): Pick<ResolveOptions, 'miniwobTasks' | 'realSites'> {
  if (cfg.env === 'miniwob') return { miniwobTasks: listMiniwobTasks(findMiniwobHtml()) };
  const sites: Record<string, RealTaskInfo[]> = {};
  for (const [site, tasks] of Object.entries(realTasksBySite())) {
    sites[site] = tasks.map((t) => ({ id: t.id, site: t.site, scorable: t.scorable, unscorableReason: t.unscorableReason, caveats: t.caveats }));
  }
  return { realSites: sites };
}

/** The workflow input for an eval config: registries read, `latest` adapters and skip decisions resolved. */
export function planEval(cfg: EvalConfig, opts: Pick<RunEvalOptions, 'base' | 'env' | 'checkpoints'> & { realSites?: ResolveOptions['realSites'] }): EvaluateInput {
  const plan = resolveEvalPlanOnHost(cfg, opts.base, {
    env: opts.env,
    checkpoints: opts.checkpoints,
    // A pinned registry (--task-registry) names the REAL tasks; else the installed agisdk does.
    ...(opts.realSites && cfg.env === 'real' ? { realSites: opts.realSites } : taskRegistries(cfg)),
  });
  // Nothing trains on an evaluation's samples: a served mode goes on where its server gives no token ids.
  return { ...plan, modes: plan.modes.map((m) => ({ ...m, policy: withOptionalTokenIds(m.policy) })) };
}

/** One evaluation per eval id: starting an id that exists (running or finished) attaches to it. */
export async function startOrAttachEval(client: Client, input: EvaluateInput): Promise<{ handle: WorkflowHandle; attached: boolean }> {
  const id = input.evalId;
  try {
    const handle = await client.workflow.start('evaluate', {
      taskQueue: input.controlTaskQueue,
      workflowId: id,
      args: [input],
      workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
      staticSummary: `eval ${id}: ${input.modes.map((m) => m.label).join(', ') || 'no modes'} on ${input.env} (${input.tasks.length} tasks × ${input.seeds.length} seeds)`,
      typedSearchAttributes: [
        { key: RUN_ID, value: id },
        { key: KIND, value: 'eval' },
        {
          key: MODE,
          value:
            input.modes
              .map((m) => m.label)
              .join(',')
              .slice(0, 200) || 'none',
        },
        { key: TASK, value: `${input.env}/${input.tasks.map((t) => t.task).join(',')}`.slice(0, 200) },
      ],
    });
    return { handle, attached: false };
  } catch (err) {
    if (err instanceof WorkflowExecutionAlreadyStartedError) return { handle: client.workflow.getHandle(id), attached: true };
    throw err;
  }
}

function progressBar(done: number, total: number, width = 20): string {
  const filled = Math.round((Math.max(0, Math.min(done, total)) / Math.max(1, total)) * width);
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
}

/** Waits for the evaluation, printing `episodes done / total` whenever it changes. */
export async function followEval(handle: WorkflowHandle, say?: (line: string) => void, pollMs = 1000): Promise<EvaluateResult> {
  let shown = '';
  const timer = say
    ? setInterval(async () => {
        try {
          const p = await handle.query(evalProgressQuery);
          const line = `${progressBar(p.done, p.total)} ${p.done}/${p.total} episodes done${p.failed ? ` (${p.failed} failed)` : ''} · ${p.running} running`;
          if (line !== shown) {
            shown = line;
            say(line);
          }
        } catch {
          /* no worker answered the query yet */
        }
      }, pollMs)
    : undefined;
  try {
    return await resultOf<EvaluateResult>(handle);
  } finally {
    if (timer) clearInterval(timer);
  }
}

/** The evaluation's records as JSON lines: from its records blob, or inline for an evaluation from before them. */
export async function evalRecordsJsonl(result: EvaluateResult, blobs: BlobStore): Promise<string> {
  if (result.episodes) return result.episodes.map((e) => JSON.stringify(e)).join('\n') + (result.episodes.length ? '\n' : '');
  if (!result.recordsRef) throw new Error(`evaluation ${result.evalId} returned neither records nor a records blob`);
  return (await blobs.get(result.recordsRef)).toString('utf8');
}

/** episodes.jsonl (one record per line), summary.json and summary.md. */
export function writeEvalFiles(dir: string, result: EvaluateResult, recordsJsonl: string): { files: EvalFiles; report: EvalReport; markdown: string } {
  mkdirSync(dir, { recursive: true });
  const files: EvalFiles = {
    dir,
    episodes: join(dir, 'episodes.jsonl'),
    summaryJson: join(dir, 'summary.json'),
    summaryMd: join(dir, 'summary.md'),
  };
  const markdown = summaryMarkdown(result.summary);
  const report: EvalReport = { ...result.summary, modesEvaluated: result.modes, resultsRef: result.resultsRef, files };
  writeFileSync(files.episodes, recordsJsonl);
  writeFileSync(files.summaryJson, JSON.stringify(report, null, 2) + '\n');
  writeFileSync(files.summaryMd, markdown);
  return { files, report, markdown };
}

/**
 * The whole `halo eval` minus argument parsing: plan (resolve tasks, adapters, skips), start or attach to the
 * `evaluate` workflow, follow it, write the files. An attached evaluation keeps the plan it was started with.
 */
export async function runEval(cfg: EvalConfig, client: Client, opts: RunEvalOptions): Promise<RunEvalOutput> {
  const input = opts.plan ?? planEval(cfg, opts);
  if (input.evalId !== cfg.runId) throw new ConfigError(`plan ${input.evalId} does not belong to eval config ${cfg.runId}`);
  const { handle, attached } = await startOrAttachEval(client, input);
  opts.progress?.(
    `${attached ? 'attached to' : 'started'} eval ${input.evalId} (workflow id ${input.evalId}, queue ${input.controlTaskQueue}): ` +
      `${input.modes.length} modes × ${input.tasks.length} tasks × ${input.seeds.length} seeds` +
      (input.skipped.length ? `; skipped ${input.skipped.map((s) => s.mode).join(', ')}` : ''),
  );
  const result = await followEval(handle, opts.progress, opts.pollMs);
  const dir = resolve(opts.outDir ?? join(stackStatus(opts.base).home, 'evals', result.evalId));
  const home = stackStatus(opts.base).home;
  const { files, report, markdown } = writeEvalFiles(dir, result, await evalRecordsJsonl(result, blobStoreFor(home)));
  return { result, attached, markdown, report, files };
}

const DEFAULT_HALO_CONFIG = join(REPO_ROOT, 'configs', 'default.yaml');

function defaultLoadConfig(path?: string): HaloConfig {
  if (path) return loadConfigFile(path);
  return existsSync(DEFAULT_HALO_CONFIG) ? loadConfigFile(DEFAULT_HALO_CONFIG) : parseConfig({});
}

/**
 * The eval config with the command-line flags, `--id` and `--mode` applied, and the HALO config of the stack
 * (with --ucb-c); errors on flag-set values name the flag.
 */
export function evalConfigFromFlags(
  file: string,
  opts: Record<string, unknown> & { haloConfig?: string; id?: string; taskRegistry?: string; mode?: string[] },
  ctx: { loadConfig: (path?: string) => HaloConfig },
): { cfg: EvalConfig; base: HaloConfig; notes: string[]; pin?: TaskRegistryPin } {
  const evalRaw = readEvalConfigRaw(file);
  const haloFromFile =
    evalRaw && typeof evalRaw === 'object' && typeof (evalRaw as { haloConfig?: unknown }).haloConfig === 'string'
      ? resolve(dirname(file), (evalRaw as { haloConfig: string }).haloConfig)
      : undefined;
  const haloPath = opts.haloConfig ?? haloFromFile;
  const pin = loadPin(opts.taskRegistry);
  const flags = overrideFlagsOf(opts);
  const haloRawPath = haloPath ?? (existsSync(DEFAULT_HALO_CONFIG) ? DEFAULT_HALO_CONFIG : undefined);
  const o = applyEvalOverrides(evalRaw, flags.ucbC !== undefined && haloRawPath ? readConfigRaw(haloRawPath) : {}, flags, overrideContext(pin));
  if (opts.id) {
    o.eval.raw.runId = opts.id;
    o.eval.flagPaths.set('runId', '--id');
  }
  const cfg = selectEvalModes(
    parseWithFlags(
      o.eval,
      (r) => evalConfigSchema.safeParse(r),
      (r) => parseEvalConfig(r, `eval config ${file}`),
    ),
    opts.mode ?? [],
  );
  // The stack's config as the caller loads it, unless a flag changes it.
  const base = o.halo.flagPaths.size ? parseHaloWithFlags(o.halo, haloRawPath ? `config file ${haloRawPath}` : 'config') : ctx.loadConfig(haloPath);
  return { cfg, base, notes: o.eval.notes, ...(pin ? { pin } : {}) };
}

function evalFlagDefaults(ctx: { loadConfig: (path?: string) => HaloConfig }): Record<string, unknown> {
  const file = join(REPO_ROOT, 'configs', 'eval-default.yaml');
  const { config, haloConfigPath } = loadEvalConfigFile(file);
  const halo = ctx.loadConfig(haloConfigPath);
  const mctsMode = config.modes.find((m) => m.name === 'qwen3vl_mcts');
  return {
    ...flagDefaults('eval', config),
    '--seed': config.seeds.join(','),
    '--simulations': mctsMode && 'testTimeMcts' in mctsMode && mctsMode.testTimeMcts ? mctsMode.testTimeMcts.simulations : '(no test-time search)',
    '--ucb-c': halo.mcts.ucbConstant,
  };
}

/** Commander's collector for the repeatable `--mode`: every value, commas splitting one into several. */
export function collectModes(value: string, previous: string[] = []): string[] {
  return [...previous, ...value.split(',').map((v) => v.trim())];
}

export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig } = { loadConfig: defaultLoadConfig }): void {
  const evalCommand = program
    .command('eval')
    .description('greedy evaluation of policy modes (Qwen3-VL base / GRPO / MCTS adapters, an OpenAI baseline) on the same tasks and seeds; an existing eval id attaches')
    .option('--config <file>', 'eval config (YAML), e.g. configs/eval-default.yaml')
    .option('--halo-config <file>', 'HALO config of the stack (Temporal, queues, rewards); default: haloConfig of the eval file, else configs/default.yaml')
    .option('--id <evalId>', 'eval id (default: runId of the eval config)')
    .option(
      '--mode <name>',
      "evaluate only this mode of the eval config, by its name in the results (label, else name); repeatable or comma-separated. The eval id stays the file's runId, and an id already run attaches to that evaluation: give a new selection its own --id",
      collectModes,
    )
    .option('--out <dir>', 'folder for episodes.jsonl, summary.json, summary.md (default <stack.home>/evals/<id>)')
    .option('--detach', 'return as soon as the evaluation is started (results: run it again without --detach, which attaches)')
    .option('--json', 'print the summary as JSON instead of the Markdown table');
  addOverrideOptions(evalCommand, 'eval', () => ({ file: 'configs/eval-default.yaml', values: evalFlagDefaults(ctx) }));
  evalCommand.action(
    async (
      opts: { config?: string; haloConfig?: string; id?: string; mode?: string[]; out?: string; json?: boolean; detach?: boolean; taskRegistry?: string } & Record<string, unknown>,
    ) => {
      // `--config` is also the program's own option, and commander gives it to the program wherever it
      // appears: for `halo eval` it names the eval config.
      const file = opts.config ?? program.opts().config;
      if (!file) throw new ConfigError('halo eval needs --config FILE: an eval config such as configs/eval-default.yaml');
      if (opts.id && !/^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$/.test(opts.id)) {
        throw new ConfigError(`--id ${JSON.stringify(opts.id)}: letters, digits, . _ - (max 81)`);
      }
      const { cfg, base, notes, pin } = evalConfigFromFlags(file, opts, ctx);
      for (const n of notes) if (!opts.json) console.error(`halo: ${n}`);
      // Plan before connecting: a bad task name or adapter path is reported without a stack.
      const plan = planEval(cfg, { base, ...(pin ? { realSites: snapshotSites(pin.snapshot) } : {}) });
      await preflightTasks(
        plan.env,
        plan.tasks.map((t) => t.task),
        pin,
        `evaluation ${plan.evalId}`,
        { allowUnscorable: true },
      );
      const { client, connection } = await connectClient(base);
      try {
        if (opts.detach) {
          const { attached } = await startOrAttachEval(client, plan);
          console.error(`halo: ${attached ? 'attached to' : 'started'} eval ${plan.evalId} (workflow id ${plan.evalId}, queue ${plan.controlTaskQueue})`);
          if (opts.json) console.log(JSON.stringify({ evalId: plan.evalId, attached }));
          return;
        }
        const out = await runEval(cfg, client, {
          base,
          plan,
          outDir: opts.out,
          progress: opts.json ? undefined : (line) => console.error(`halo: ${line}`),
        });
        if (opts.json) console.log(JSON.stringify(out.report));
        else {
          const records = readFileSync(out.files.episodes, 'utf8')
            .split('\n')
            .filter(Boolean)
            .map((l) => JSON.parse(l) as EvalEpisodeRecord);
          const note = tokenIdsNote(sum(records.map((r) => r.tokenIdsMissing ?? 0)), sum(records.map((r) => r.steps)));
          if (note) console.error(`halo: ${note}`);
          for (const line of await failedEpisodes(client, records)) console.error(`halo: ${line}`);
          console.log(out.markdown);
          console.log(`episodes: ${out.files.episodes}\nsummary:  ${out.files.summaryJson}\n          ${out.files.summaryMd}`);
        }
      } finally {
        await connection.close();
      }
    },
  );
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

/** Per mode with failed episodes: how many, and the first one's failure as the episode workflow recorded it. */
async function failedEpisodes(client: Client, records: EvalEpisodeRecord[]): Promise<string[]> {
  const lines: string[] = [];
  for (const mode of [...new Set(records.map((r) => r.mode))]) {
    const failed = records.filter((r) => r.mode === mode && r.error);
    if (!failed.length) continue;
    const failure = await lastFailure(client.workflow.getHandle(failed[0].workflowId)).catch(() => undefined);
    lines.push(`mode ${mode}: ${failed.length} episode${failed.length > 1 ? 's' : ''} failed; the first: ${failure ? formatFailure(failure) : failed[0].error}`);
  }
  return lines;
}
