import { z } from 'zod';
import { servedAdapterName, type ServedAdapter } from '../serving/iteration-policy';
import type { RealScoring } from '../episode/episode-types';
import { realScoringOf, runContextFromConfig } from '../episode/run-context';
import { ConfigError, formatConfigIssues, type IssueLike } from '../config/config-error';
import { MAX_SEED, MAX_TASKS, mctsCriticSchema, type HaloConfig, type PolicyConfig } from '../config/config';
import { miniwobSettingsNote, realScoringNote, type EvalNote, type EvalSkip } from './eval-summary';
import { evalSizeProblem, type EvalModeName, type EvalModePlan, type EvaluateInput } from './eval-types';
import { criticParams, mctsParams, type MctsParams } from '../search/mcts-params';
import { CREDENTIAL_NAMES, credentialEnvVar, type CredentialName } from '../serving/credentials';

/**
 * Eval config files (`halo eval --config FILE`, e.g. configs/eval-default.yaml): which modes run greedily on
 * which tasks and seeds. Every value has a default; an error names the bad field by its dotted path. The
 * stack itself (Temporal, task queues, reward weights, REAL options) comes from a HALO config
 * (`haloConfig`, default configs/default.yaml).
 *
 * Validation and planning only: reading the file, the environment and the checkpoints folder is
 * host/eval-config-file.ts's job, so the plan can be computed (and tested) from plain values.
 */

export const OPENAI_DEFAULT_BASE_URL = 'https://api.openai.com/v1';
export const MODE_NAMES = ['qwen3vl_base', 'qwen3vl_grpo', 'qwen3vl_mcts', 'openai_baseline', 'gpt5_baseline'] as const;

const ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$/;
const LABEL = /^[A-Za-z0-9][A-Za-z0-9._-]{0,40}$/;
/** `…/<run>/v<N>` (the learner's checkpoint layout: checkpoints/<run_id>/v<N>/). */
const ADAPTER_PATH = /(?:^|[\\/])([A-Za-z0-9][A-Za-z0-9._-]*)[\\/]v(\d+)[\\/]*$/;

const label = z.string().regex(LABEL, 'letters, digits, . _ - (max 41); used in episode workflow ids');
const maxTokens = z.number().int().min(1).max(8192);
const timeoutMs = z.number().int().min(1000).max(600_000);

export const adapterSchema = z.union([
  z.strictObject({
    run: z.string().regex(ID, 'a run id: letters, digits, . _ - (max 81)'),
    version: z
      .union([z.number().int().min(0).max(1_000_000), z.literal('latest')])
      .default(0)
      .describe("0 = the base model; N = adapter v<N> of the run; 'latest' = its highest version under the checkpoints folder (0 if none)"),
  }),
  z.strictObject({
    path: z
      .string()
      .regex(ADAPTER_PATH, 'an adapter folder in the learner layout, …/<run>/v<N> (e.g. checkpoints/grpo-local/v3)')
      .describe("an adapter folder …/<run>/v<N>: the learner loads that run's v<N> from its own checkpoints root"),
  }),
]);
export type AdapterSpec = z.infer<typeof adapterSchema>;

function qwenMode<N extends Exclude<EvalModeName, BaselineModeName>>(name: N, adapter: { run: string; version: number | 'latest' }) {
  return z.strictObject({
    name: z.literal(name),
    label: label.optional().describe('unique name of this mode in the results (default: name)'),
    backend: z
      .enum(['colocated', 'openai'])
      .default('colocated')
      .describe('colocated: the learner samples with its resident model and the adapter; openai: a vLLM (OpenAI-compatible) server'),
    adapter: adapterSchema.default(adapter),
    model: z
      .string()
      .min(1)
      .optional()
      .describe('openai backend: the served model or adapter name (default: <run>-v<N> for an adapter version ≥ 1, else the HALO config policy.model)'),
    baseUrl: z.string().url().default('http://127.0.0.1:8000/v1').describe('openai backend: the server'),
    credential: z.enum(CREDENTIAL_NAMES).default('policy').describe('openai backend: the API key by name; the control worker maps it to its environment'),
    apiKeyEnv: z.string().min(1).optional().describe('deprecated: accepted only when it names the variable credential maps to'),
    maxTokens: maxTokens.optional().describe('default: policy.maxTokens of the HALO config'),
    timeoutMs: timeoutMs.optional().describe('default: policy.timeoutMs of the HALO config'),
  });
}

export const qwenBaseModeSchema = qwenMode('qwen3vl_base', { run: 'base', version: 0 });
export const qwenGrpoModeSchema = qwenMode('qwen3vl_grpo', { run: 'grpo-local', version: 'latest' });
export const qwenMctsModeSchema = qwenMode('qwen3vl_mcts', { run: 'mcts-local', version: 'latest' }).extend({
  testTimeMcts: z
    .strictObject({
      simulations: z.number().int().min(1).max(10_000).default(16).describe('simulations of the search before every step'),
      maxChildren: z.number().int().min(1).max(32).optional().describe('K candidates per expanded state (default: mcts.maxChildren of the HALO config)'),
      maxDepth: z
        .number()
        .int()
        .min(1)
        .max(200)
        .optional()
        .describe('search depth below the current state (default: mcts.maxDepth of the HALO config; never beyond the steps left)'),
      // z.undefined first: the critic section's own defaults would otherwise fill in an absent one.
      critic: z
        .union([z.undefined(), mctsCriticSchema])
        .optional()
        .describe('the critic that ranks candidates and judges ended episodes (default: mcts.critic of the HALO config); { backend: none } searches without one'),
    })
    .optional()
    .describe(
      "test-time MCTS (Agent Q at inference): before every step a search from the current state picks the action; UCB, value mode, temperature and critic come from the HALO config's mcts section, and ended states are judged by that critic (neutral 0.5 without one), never by the task's success signal",
    ),
});

export const openaiBaselineModeSchema = z.strictObject({
  name: z.literal('openai_baseline'),
  label: label.optional(),
  model: z.string().min(1).default('gpt-4o').describe('any OpenAI chat model with image input (gpt-4o, gpt-4.1, …)'),
  baseUrl: z.string().url().default(OPENAI_DEFAULT_BASE_URL),
  credential: z.enum(CREDENTIAL_NAMES).default('baseline').describe('the API key by name; the control worker maps it to its environment (baseline: OPENAI_API_KEY)'),
  apiKeyEnv: z.string().min(1).optional().describe('deprecated: accepted only when it names the variable credential maps to'),
  maxTokens: maxTokens.default(512),
  timeoutMs: timeoutMs.optional(),
});

/**
 * The seeds' GPT-5 baseline: OpenAI's API with gpt-5, needing only OPENAI_API_KEY. gpt-5 reasons before it answers
 * and its reasoning tokens count against max_completion_tokens, so the openai_baseline's 512 would often end the
 * call before the action is written.
 */
export const gpt5BaselineModeSchema = openaiBaselineModeSchema.extend({
  name: z.literal('gpt5_baseline'),
  model: z.string().min(1).default('gpt-5').describe('a GPT-5 class OpenAI model with image input (gpt-5, gpt-5-mini, …)'),
  maxTokens: maxTokens.default(4096).describe('max_completion_tokens: the reasoning tokens and the answer together'),
});

export const evalModeSchema = z.discriminatedUnion('name', [qwenBaseModeSchema, qwenGrpoModeSchema, qwenMctsModeSchema, openaiBaselineModeSchema, gpt5BaselineModeSchema]);
export type EvalMode = z.infer<typeof evalModeSchema>;
type BaselineModeName = 'openai_baseline' | 'gpt5_baseline';
const isBaseline = (m: EvalMode): m is Extract<EvalMode, { name: BaselineModeName }> => m.name === 'openai_baseline' || m.name === 'gpt5_baseline';

export const evalConfigSchema = z.strictObject({
  runId: z.string().regex(ID, 'letters, digits, . _ - (max 81)').default('eval-local').describe('the eval id: workflow id of the evaluation'),
  haloConfig: z.string().min(1).optional().describe('HALO config file for the stack (Temporal, queues, rewards, REAL), relative to this file; default configs/default.yaml'),
  env: z.enum(['miniwob', 'real']).default('miniwob'),
  tasks: z
    .array(z.string().min(1))
    .min(1)
    .max(MAX_TASKS)
    .default(['click-button', 'enter-text', 'click-link', 'focus-text'])
    .superRefine(noDuplicates((t) => `task "${t}"`))
    .describe('MiniWoB++ task names, or REAL task ids and site names (a site means all its tasks)'),
  seeds: z
    .array(z.number().int().min(0).max(MAX_SEED))
    .min(1)
    .max(10_000)
    .superRefine(noDuplicates((s) => `seed ${s}`))
    .default([0, 1]),
  maxSteps: z.number().int().min(1).max(200).default(5),
  parallelism: z.number().int().min(1).max(64).default(2).describe('episodes running at once, over all modes'),
  gpuTaskQueue: z.string().min(1).optional().describe('the learner queue (default: train.gpuTaskQueue of the HALO config)'),
  modes: z
    .array(evalModeSchema)
    .min(1)
    .max(64)
    .superRefine((modes, ctx) => {
      const seen = new Map<string, number>();
      modes.forEach((m, i) => {
        const l = m.label ?? m.name;
        const first = seen.get(l);
        if (first !== undefined) {
          ctx.addIssue({ code: 'custom', path: [i, 'label'], message: `mode label "${l}" is already used by modes.${first}; give this one its own label` });
        } else seen.set(l, i);
      });
    })
    .prefault([{ name: 'qwen3vl_base' }, { name: 'qwen3vl_grpo' }, { name: 'qwen3vl_mcts' }, { name: 'openai_baseline' }]),
});

function noDuplicates<T>(what: (v: T) => string) {
  return (list: T[], ctx: z.RefinementCtx) => {
    list.forEach((v, i) => {
      if (list.indexOf(v) !== i) ctx.addIssue({ code: 'custom', path: [i], message: `${what(v)} is listed twice` });
    });
  };
}

export type EvalConfig = z.infer<typeof evalConfigSchema>;
export type EvalConfigInput = z.input<typeof evalConfigSchema>;

/** Validate a parsed eval config; the error lists every bad field by its dotted path. */
export function parseEvalConfig(raw: unknown, source = 'eval config'): EvalConfig {
  const input = raw ?? {};
  const result = evalConfigSchema.safeParse(input);
  if (result.success) return result.data;
  const lines = formatConfigIssues(result.error.issues, evalConfigSchema, input, describeIssue);
  throw new ConfigError(`invalid ${source}:\n${lines.join('\n')}`);
}

/** zod's union errors say only "Invalid input"; say what was expected instead. */
function describeIssue(i: IssueLike): string {
  if (i.code === 'invalid_union' && i.path.at(-1) === 'adapter') {
    return 'expected { run: RUN_ID, version: N | latest } or { path: …/<run>/v<N> }';
  }
  if (i.code === 'invalid_union' && 'note' in i && i.note === 'No matching discriminator') {
    return `name must be one of ${MODE_NAMES.join(', ')}`;
  }
  return i.message;
}

// ---- resolving a config into the workflow's input ----------------------------------------------------

export interface RealTaskInfo {
  id: string;
  site: string;
  scorable: boolean;
  unscorableReason?: string;
  /** Why its verdict may depend on more than the agent's actions (env/real-tasks.ts RealTask.caveats). */
  caveats?: string[];
}

/** What a plan needs from outside the config: the host fills these in (host/eval-config-file.ts). */
export interface ResolveOptions {
  /** Where API keys are looked up. */
  env: Record<string, string | undefined>;
  /**
   * The learner's checkpoints root (absolute): named in the note on a run without adapters, and where a served
   * mode's adapter folder `<checkpoints>/<run>/v<N>` is, as vLLM reads it (the path training loads it from).
   */
  checkpoints: string;
  /** The complete adapter versions of a run, ascending, for `version: latest` and the check of served versions. */
  listAdapterVersions: (run: string) => number[];
  /** Known MiniWoB++ tasks: unknown names are an error when given. */
  miniwobTasks?: readonly string[];
  /** REAL tasks by site: task ids are checked and site names expanded when given. */
  realSites?: Record<string, RealTaskInfo[]>;
}

/** `…/<run>/v<N>` → { run, version }. */
export function adapterFromPath(path: string): { run: string; version: number } {
  const m = ADAPTER_PATH.exec(path);
  if (!m) throw new ConfigError(`adapter path ${path} is not …/<run>/v<N>`);
  return { run: m[1], version: Number(m[2]) };
}

const sameUrl = (a: string, b: string) => a.replace(/\/+$/, '') === b.replace(/\/+$/, '');

/**
 * Why an `openai_baseline` or `gpt5_baseline` mode cannot run, or null: it needs either its API key in the environment or a
 * non-default baseUrl (a local OpenAI-compatible server needs no key).
 */
export function baselineSkipReason(mode: Extract<EvalMode, { name: BaselineModeName }>, env: Record<string, string | undefined>): string | null {
  const envVar = credentialEnvVar(mode.credential, env);
  if (env[envVar]) return null;
  if (!sameUrl(mode.baseUrl, OPENAI_DEFAULT_BASE_URL)) return null;
  return `no API key: ${envVar} (credential ${mode.credential}) is not set and baseUrl is the default ${OPENAI_DEFAULT_BASE_URL} (set ${envVar} for the CLI and the control worker, or point baseUrl at an OpenAI-compatible server)`;
}

/** A legacy `apiKeyEnv` must name the variable the credential maps to; anything else is a config error saying what to write. */
function checkLegacyKeyEnv(m: { credential: CredentialName; apiKeyEnv?: string }, where: string, env: Record<string, string | undefined>): void {
  if (m.apiKeyEnv === undefined) return;
  const envVar = credentialEnvVar(m.credential, env);
  if (m.apiKeyEnv === envVar) return;
  throw new ConfigError(
    `invalid eval config:\n  ${where}.apiKeyEnv: ${m.apiKeyEnv} is not read any more: name a credential (${where}.credential: ${CREDENTIAL_NAMES.join(' | ')}; "${m.credential}" is read from ${envVar}, and HALO_CREDENTIAL_${m.credential.toUpperCase()}_ENV=${m.apiKeyEnv} on the control worker and the CLI maps it to ${m.apiKeyEnv})`,
  );
}

function resolveTasks(cfg: EvalConfig, opts: ResolveOptions, notes: EvalNote[], scoring: RealScoring): { task: string; site: string }[] {
  if (cfg.env === 'miniwob') {
    const known = opts.miniwobTasks;
    cfg.tasks.forEach((t, i) => {
      if (known && !known.includes(t)) {
        throw new ConfigError(`invalid eval config:\n  tasks.${i}: unknown MiniWoB task "${t}" (${known.length} registered tasks)`);
      }
    });
    return cfg.tasks.map((task) => ({ task, site: 'miniwob' }));
  }
  const sites = opts.realSites;
  const out: { task: string; site: string }[] = [];
  const add = (task: string, site: string, caveats?: string[]) => {
    if (out.some((o) => o.task === task)) return;
    out.push({ task, site });
    for (const c of caveats ?? []) notes.push({ mode: 'all', note: `${task}: ${c}` });
  };
  if (!sites) {
    // No registry at hand: ids as given, their site is the id without its number.
    for (const t of cfg.tasks) add(t, t.replace(/^v2\./, '').replace(/-\d+$/, ''));
    return out;
  }
  const byId = new Map(
    Object.values(sites)
      .flat()
      .map((t) => [t.id, t]),
  );
  cfg.tasks.forEach((entry, i) => {
    const id = entry.replace(/^v2\./, '');
    const site = sites[entry];
    if (site) {
      for (const t of site) {
        // The benchmark's denominator has every task: officially an unscorable one is run and scores 0, as in agisdk.
        if (t.scorable || scoring === 'official') add(t.id, t.site, t.caveats);
        if (!t.scorable) notes.push({ mode: 'all', note: unscorableNote(t, scoring, entry) });
      }
      return;
    }
    const t = byId.get(id);
    if (!t) {
      throw new ConfigError(`invalid eval config:\n  tasks.${i}: "${entry}" is neither a REAL v2 task id nor a site (sites: ${Object.keys(sites).sort().join(', ')})`);
    }
    if (!t.scorable) notes.push({ mode: 'all', note: unscorableNote(t, scoring) });
    add(t.id, t.site, t.caveats);
  });
  return out;
}

function unscorableNote(t: RealTaskInfo, scoring: RealScoring, site?: string): string {
  const why = t.unscorableReason ?? 'empty eval script';
  if (scoring === 'official') return `${t.id} is unscorable (${why}): run and counted as a failure, as agisdk scores it`;
  return site !== undefined ? `${t.id} left out of site ${site}: unscorable (${why})` : `${t.id} is unscorable (${why}): it can only score 0`;
}

/**
 * The `evaluate` workflow's input: tasks resolved (REAL sites expanded), `latest` adapters resolved to a version
 * number, each mode's greedy policy settings, and the modes that cannot run listed with their reason.
 */
export function resolveEvalPlan(cfg: EvalConfig, base: HaloConfig, opts: ResolveOptions): EvaluateInput {
  const { env, checkpoints, listAdapterVersions: versions } = opts;
  // First: under which MiniWoB++ rules every number of the summary was taken.
  const scoring = realScoringOf(base, 'evaluation');
  const notes: EvalNote[] = cfg.env === 'miniwob' ? [miniwobSettingsNote(base.miniwob)] : [realScoringNote(scoring)];
  const skipped: EvalSkip[] = [];
  const tasks = resolveTasks(cfg, opts, notes, scoring);
  const modes: EvalModePlan[] = [];
  // The HALO config's legacy key variable belongs to its own credential, not to a mode's.
  const { apiKeyEnv: _baseKeyEnv, ...basePolicy } = base.policy;
  const greedy = (p: Partial<PolicyConfig>): PolicyConfig => ({ ...basePolicy, ...p, temperature: 0 });

  for (const [i, m] of cfg.modes.entries()) {
    const labelOf = m.label ?? m.name;
    checkLegacyKeyEnv(m, `modes.${i}`, env);
    if (isBaseline(m)) {
      const why = baselineSkipReason(m, env);
      if (why) {
        skipped.push({ mode: labelOf, reason: why });
        continue;
      }
      modes.push({
        label: labelOf,
        name: m.name,
        backend: 'openai',
        policy: greedy({
          backend: 'openai',
          baseUrl: m.baseUrl,
          model: m.model,
          credential: m.credential,
          ...(m.apiKeyEnv !== undefined ? { apiKeyEnv: m.apiKeyEnv } : {}),
          maxTokens: m.maxTokens,
          timeoutMs: m.timeoutMs ?? base.policy.timeoutMs,
          // OpenAI's own API has no structured_outputs field; the baseline answers unconstrained.
          constrained: false,
        }),
        runId: cfg.runId,
        adapterVersion: 0,
        describe: `${m.model} at ${m.baseUrl}`,
      });
      continue;
    }

    // Qwen3-VL modes: which adapter.
    let run: string;
    let version: number;
    if ('path' in m.adapter) {
      ({ run, version } = adapterFromPath(m.adapter.path));
      notes.push({ mode: labelOf, note: `adapter ${m.adapter.path} = run ${run} v${version} (the learner loads it from its own checkpoints root)` });
    } else if (m.adapter.version === 'latest') {
      run = m.adapter.run;
      const have = versions(run);
      version = have.length ? have[have.length - 1] : 0;
      notes.push({
        mode: labelOf,
        note: have.length
          ? `latest adapter of run ${run}: v${version}`
          : `run ${run} has no adapter under ${checkpoints.replace(/[\\/]+$/, '')}/${run}: evaluated version 0 (the base model)`,
      });
    } else {
      run = m.adapter.run;
      version = m.adapter.version;
    }
    const adapterText = version === 0 ? 'base model (v0)' : `adapter ${run}/v${version}`;
    let search: MctsParams | undefined;
    if (m.name === 'qwen3vl_mcts' && m.testTimeMcts) {
      search = testTimeSearchParams(base, m.testTimeMcts, `modes.${cfg.modes.indexOf(m)}.testTimeMcts`);
      notes.push({ mode: labelOf, note: describeTestTimeSearch(search) });
    }
    const searchText = search ? ` + test-time MCTS (${search.numSimulations} simulations per step)` : '';
    const runId = version === 0 ? cfg.runId : run;
    if (m.backend === 'colocated') {
      modes.push({
        label: labelOf,
        name: m.name,
        backend: 'colocated',
        policy: greedy({
          backend: 'colocated',
          model: version === 0 ? base.policy.model : servedAdapterName(run, version),
          maxTokens: m.maxTokens ?? base.policy.maxTokens,
          timeoutMs: m.timeoutMs ?? base.policy.timeoutMs,
        }),
        runId,
        adapterVersion: version,
        describe: `colocated learner, ${adapterText}${searchText}`,
        ...(search ? { search } : {}),
      });
    } else {
      // vLLM serves adapters by name (`<run>-v<N>`, see activities/adapters.ts); version 0 is the base model.
      const model = m.model ?? (version === 0 ? base.policy.model : servedAdapterName(run, version));
      // A model named otherwise is served by other means: nothing to load.
      const adapter = version >= 1 && model === servedAdapterName(run, version) ? servedAdapterFolder(run, version, m.baseUrl, opts, `modes.${i}.adapter`) : undefined;
      modes.push({
        label: labelOf,
        name: m.name,
        backend: 'openai',
        policy: greedy({
          backend: 'openai',
          baseUrl: m.baseUrl,
          model,
          credential: m.credential,
          ...(m.apiKeyEnv !== undefined ? { apiKeyEnv: m.apiKeyEnv } : {}),
          maxTokens: m.maxTokens ?? base.policy.maxTokens,
          timeoutMs: m.timeoutMs ?? base.policy.timeoutMs,
        }),
        runId,
        adapterVersion: version,
        ...(adapter ? { adapter } : {}),
        describe: `${model} at ${m.baseUrl}${searchText}`,
        ...(search ? { search } : {}),
      });
    }
  }
  const tooBig = evalSizeProblem({ modes: modes.length, tasks: tasks.length, seeds: cfg.seeds.length });
  if (tooBig) throw new ConfigError(`invalid eval config:\n  ${tooBig}`);

  return {
    evalId: cfg.runId,
    env: cfg.env,
    tasks,
    seeds: cfg.seeds,
    maxSteps: cfg.maxSteps,
    parallelism: cfg.parallelism,
    modes,
    skipped,
    notes,
    controlTaskQueue: base.temporal.controlTaskQueue,
    run: { ...runContextFromConfig(base, cfg.runId, 'evaluation'), gpuTaskQueue: cfg.gpuTaskQueue ?? base.train.gpuTaskQueue },
  };
}

/**
 * A served mode's adapter: the run's version folder under the checkpoints root, which every sampling request
 * carries so that a vLLM without it (restarted, or holding only the newest versions) loads it on the 404. A
 * version that is not on disk (never written, or deleted by retention) would only fail at its first
 * request: it fails here, naming the versions there are.
 */
function servedAdapterFolder(run: string, version: number, baseUrl: string, opts: ResolveOptions, where: string): ServedAdapter {
  const root = opts.checkpoints.replace(/[\\/]+$/, '');
  const have = opts.listAdapterVersions(run);
  if (!have.includes(version)) {
    const onDisk = have.length ? have.map((v) => `v${v}`).join(', ') : 'none';
    throw new ConfigError(
      `invalid eval config:\n  ${where}: adapter ${run}/v${version} is not on disk under ${root}/${run} (versions on disk: ${onDisk}); ` +
        `pick one of those or version: latest (retention, halo gc --run ${run}, deletes old versions)`,
    );
  }
  if (!root.startsWith('/')) {
    throw new ConfigError(
      `invalid eval config:\n  ${where}: the checkpoints root ${root} is not an absolute path, and vLLM reads a relative adapter path as a Hugging Face repo id`,
    );
  }
  return { base_url: baseUrl, lora_name: servedAdapterName(run, version), lora_path: `${root}/${run}/v${version}` };
}

/**
 * `halo eval --mode NAME…`: the config with only the named modes, in the file's order. A mode's name here is
 * its label (the name in the results, `name` unless the file gives one).
 */
export function selectEvalModes(cfg: EvalConfig, names: readonly string[]): EvalConfig {
  if (names.length === 0) return cfg;
  const labels = cfg.modes.map((m) => m.label ?? m.name);
  const unknown = [...new Set(names.filter((n) => !labels.includes(n)))];
  if (unknown.length > 0) {
    throw new ConfigError(`--mode ${unknown.map((n) => JSON.stringify(n)).join(', ')}: no such mode in this eval config (its modes: ${labels.join(', ')})`);
  }
  return { ...cfg, modes: cfg.modes.filter((m) => names.includes(m.label ?? m.name)) };
}

/**
 * The search of a `testTimeMcts` mode: the HALO config's mcts section with the mode's budget, valuing ended
 * states by self-evaluation. The sampling temperature stays the search's (greedy decoding would give K equal
 * candidates); the episode itself plays the search's decision at each step.
 */
export function testTimeSearchParams(
  base: HaloConfig,
  t: { simulations: number; maxChildren?: number; maxDepth?: number; critic?: HaloConfig['mcts']['critic'] },
  where = 'testTimeMcts',
): MctsParams {
  const p = mctsParams(base);
  const critic = t.critic ? criticParams(t.critic) : p.critic;
  if (!critic && p.valueMode === 'critic') {
    throw new ConfigError(
      `invalid eval config:\n  ${where}.critic: the search values states by the critic (mcts.valueMode of the HALO config) and needs one; configure a critic or set mcts.valueMode: rollout`,
    );
  }
  return {
    ...p,
    // A shaped return counts the task's success: a test-time search must not read it.
    valueMode: p.valueMode === 'shaped' ? 'rollout' : p.valueMode,
    numSimulations: t.simulations,
    maxChildren: t.maxChildren ?? p.maxChildren,
    maxDepth: t.maxDepth ?? p.maxDepth,
    critic,
    outcome: 'self-evaluation',
  };
}

/** The summary's note on a test-time search: its budget and what judges an ended episode. */
export function describeTestTimeSearch(p: MctsParams): string {
  const judge = p.critic
    ? `ended episodes are judged by the critic ${p.critic.model} at ${p.critic.baseUrl}`
    : 'no critic (critic backend none): every ended episode counts 0.5 (an answer as much as a page the task ended), so the search only tells ended episodes from unparseable actions and depth caps, and among equally valued actions plays the one the policy proposed most';
  return (
    `test-time MCTS: ${p.numSimulations} simulations before every step (K=${p.maxChildren}, depth ≤ ${p.maxDepth}, ` +
    `value by ${p.valueMode}, temperature ${p.temperature}; depth also capped at the steps left); ${judge}; the task's success signal is never read by the search`
  );
}
