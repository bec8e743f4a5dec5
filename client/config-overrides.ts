import { ConfigError } from '../lib/config/config-error';
import { parseConfig } from '../lib/config/config';
import { parseEvalConfig } from '../lib/eval/eval-config';
import { fnv1a32 } from '../lib/rewards/shaping';

// Command-line overrides of `halo train`, `halo mcts` and `halo eval` on top of a config file. Each flag is
// written into the parsed YAML object at the path the file would use, the same zod schema validates the
// result, and an issue on such a path is reported under the flag's name ("--lr: must be > 0").

export type OverrideCommand = 'train' | 'mcts' | 'eval';

/** Flag values as the command line gives them (strings); numbers are parsed here so errors name the flag. */
export interface OverrideFlags {
  task?: string;
  tasks?: string;
  domain?: string;
  env?: string;
  episodes?: string;
  iterations?: string;
  numGenerations?: string;
  lr?: string;
  temperature?: string;
  simulations?: string;
  ucbC?: string;
  sampleSize?: string;
  seed?: string;
  policyUrl?: string;
  lossType?: string;
}

export type OverrideKey = keyof OverrideFlags;

/** A REAL task as --domain and --sample-size need it (from the installed registry or a pinned snapshot). */
export interface SiteTask {
  id: string;
  site: string;
  scorable: boolean;
  caveats?: string[];
}

export interface OverrideContext {
  /** REAL tasks by site; read only when a flag needs them (--domain, --sample-size of site names). */
  realSites?: () => Record<string, SiteTask[]>;
  /** The config file the flags apply to, for error messages. */
  file?: string;
}

/** The configs made for REAL runs: what a REAL task flag on the local test config is told to use. */
export const REAL_CONFIG: Record<'train' | 'mcts', string> = { train: 'configs/grpo-real.yaml', mcts: 'configs/mcts-real.yaml' };

/** The learner's local test model (random weights): fine for MiniWoB++ smoke runs, never for REAL. */
export const LOCAL_TEST_MODEL = 'tiny-random';

/**
 * A policy URL as the OpenAI client needs it. The client appends `/chat/completions` to the URL as given, and vLLM
 * serves that API under `/v1`, so a bare server root (`http://localhost:8000`, the seeds' spelling) would answer
 * every sample with a 404: it gets `/v1`. A URL with any path is someone's proxy route and is left alone.
 */
export function completePolicyUrl(url: string): { url: string; completed: boolean } {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return { url, completed: false };
  }
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || u.pathname !== '/' || u.search || u.hash) return { url, completed: false };
  return { url: `${url.replace(/\/+$/, '')}/v1`, completed: true };
}

/** Whether the task flags alone make the run a REAL one (a v2.* task, --domain, --env real). */
export function flagsImplyReal(flags: OverrideFlags): boolean {
  const tasks = [flags.task, ...(flags.tasks ?? '').split(',')].filter((t): t is string => t !== undefined);
  return flags.domain !== undefined || flags.env === 'real' || tasks.some((t) => REAL_ID.test(t.trim()));
}

export interface FlagDef {
  key: OverrideKey;
  flag: string;
  arg: string;
  /** Help text per command; a command without one does not take the flag. */
  help: Partial<Record<OverrideCommand, string>>;
  /** Config path of the value (its default is shown in --help), per command. */
  path?: Partial<Record<OverrideCommand, string>>;
}

export const OVERRIDE_FLAGS: readonly FlagDef[] = [
  {
    key: 'task',
    flag: '--task',
    arg: 'id',
    help: { train: 'train on this one task (REAL: v2.<site>-<n> or <site>-<n>, implies --env real)', mcts: 'search this one task', eval: 'evaluate this one task' },
    path: { train: 'train.tasks', mcts: 'mcts.tasks', eval: 'tasks' },
  },
  {
    key: 'tasks',
    flag: '--tasks',
    arg: 'a,b,…',
    help: {
      train: 'train on these tasks (comma-separated)',
      mcts: 'search these tasks (comma-separated)',
      eval: 'evaluate these tasks (comma-separated; REAL site names expand to their tasks)',
    },
    path: { train: 'train.tasks', mcts: 'mcts.tasks', eval: 'tasks' },
  },
  {
    key: 'domain',
    flag: '--domain',
    arg: 'site',
    help: {
      train: 'every scorable task of a REAL site, e.g. gomail (comma-separated for several; implies --env real)',
      mcts: 'every scorable task of a REAL site (implies --env real)',
      eval: 'every scorable task of a REAL site (implies --env real)',
    },
  },
  {
    key: 'env',
    flag: '--env',
    arg: 'env',
    help: { train: 'miniwob or real', mcts: 'miniwob or real', eval: 'miniwob or real' },
    path: { train: 'episode.env', mcts: 'episode.env', eval: 'env' },
  },
  {
    key: 'episodes',
    flag: '--episodes',
    arg: 'n',
    help: {
      train: 'episode budget: split into iterations × episodes per iteration, never more than n (see docs/cli.md)',
      mcts: 'search budget: one search per task per iteration, so n / (number of tasks) iterations, never more than n searches',
    },
  },
  { key: 'iterations', flag: '--iterations', arg: 'n', help: { train: 'iterations', mcts: 'iterations' }, path: { train: 'train.iterations', mcts: 'mcts.iterations' } },
  {
    key: 'numGenerations',
    flag: '--num-generations',
    arg: 'n',
    help: { train: 'N: candidates per state (step grouping) or rollouts per task', mcts: 'K: candidate actions sampled per expanded state' },
    path: { train: 'train.numGenerations', mcts: 'mcts.maxChildren' },
  },
  { key: 'lr', flag: '--lr', arg: 'rate', help: { train: 'learning rate', mcts: 'DPO learning rate' }, path: { train: 'train.learningRate', mcts: 'mcts.learningRate' } },
  {
    key: 'temperature',
    flag: '--temperature',
    arg: 't',
    help: { train: 'sampling temperature', mcts: 'sampling temperature of expansions and rollouts' },
    path: { train: 'policy.temperature', mcts: 'mcts.temperature' },
  },
  {
    key: 'simulations',
    flag: '--simulations',
    arg: 'n',
    help: { mcts: 'simulations per search', eval: 'test-time MCTS simulations per step of every qwen3vl_mcts mode' },
    path: { mcts: 'mcts.numSimulations' },
  },
  {
    key: 'ucbC',
    flag: '--ucb-c',
    arg: 'c',
    help: { mcts: 'UCB1 exploration constant c', eval: 'UCB1 constant c of the test-time search (mcts.ucbConstant of the HALO config)' },
    path: { mcts: 'mcts.ucbConstant', eval: 'mcts.ucbConstant' },
  },
  {
    key: 'sampleSize',
    flag: '--sample-size',
    arg: 'n',
    help: {
      train: 'use n tasks of the task list, drawn deterministically from --seed',
      mcts: 'search n tasks of the task list, drawn deterministically from --seed',
      eval: 'evaluate n tasks of the task list, drawn deterministically from --seed',
    },
  },
  {
    key: 'seed',
    flag: '--seed',
    arg: 'n',
    help: {
      train: 'seed of the episodes: tasks and task seeds come from (seed, iteration, episode) instead of the run id',
      mcts: "seed of the searches: each task's seed comes from (seed, iteration, task) instead of the run id",
      eval: 'the task seed of every episode (replaces the seeds list)',
    },
    path: { train: 'train.seed', mcts: 'mcts.seed', eval: 'seeds' },
  },
  {
    key: 'policyUrl',
    flag: '--policy-url',
    arg: 'url',
    help: {
      train:
        'OpenAI-compatible base URL of the policy (vLLM; a bare http://host:port gets /v1), or several separated by commas (a pool of replicas, policy.baseUrls): policy.backend openai there, and new adapters loaded into it (every replica) unless train.vllmBaseUrl is set; without --config, REAL tasks take configs/grpo-real.yaml and the model the server serves',
      mcts: 'OpenAI-compatible base URL of the policy (vLLM; a bare http://host:port gets /v1), or several separated by commas (a pool of replicas, policy.baseUrls): policy.backend openai there, and new adapters loaded into it (every replica) unless mcts.vllmBaseUrl is set; without --config, REAL tasks take configs/mcts-real.yaml and the model the server serves',
    },
    path: { train: 'policy.baseUrl', mcts: 'policy.baseUrl' },
  },
  { key: 'lossType', flag: '--loss-type', arg: 'type', help: { train: 'GRPO loss; dr_grpo is the one implemented' }, path: { train: 'train.lossType' } },
];

/** Seed spellings of the flags: underscores for hyphens (--num_generations, --policy_url, --loss_type, --ucb_c, …). */
export const ALSO_ACCEPTED = 'also accepted: every flag with underscores for hyphens (--policy_url, --loss_type, --num_generations, --sample_size, --ucb_c, --run_id, …)';

/**
 * The command line with the underscore spellings of known flags (`--num_generations 8`, `--policy_url=URL`)
 * written with hyphens, as commander knows them. Unknown flags, values and everything after `--` stay as given.
 */
export function normalizeFlagSpellings(argv: readonly string[], known: ReadonlySet<string>): string[] {
  const out: string[] = [];
  let rest = false;
  for (const a of argv) {
    if (rest || !a.startsWith('--') || a === '--') {
      if (a === '--') rest = true;
      out.push(a);
      continue;
    }
    const eq = a.indexOf('=');
    const name = eq < 0 ? a : a.slice(0, eq);
    const hyphened = '--' + name.slice(2).replace(/_/g, '-');
    out.push(name.includes('_') && known.has(hyphened) ? hyphened + (eq < 0 ? '' : a.slice(eq)) : a);
  }
  return out;
}

/** The flags a command takes. */
export function flagsOf(command: OverrideCommand): FlagDef[] {
  return OVERRIDE_FLAGS.filter((f) => f.help[command] !== undefined);
}

type Raw = Record<string, unknown>;

const isRecord = (v: unknown): v is Raw => typeof v === 'object' && v !== null && !Array.isArray(v);

function section(raw: Raw, key: string): Raw {
  const s = raw[key];
  if (isRecord(s)) return s;
  const fresh: Raw = {};
  raw[key] = fresh;
  return fresh;
}

function setPath(raw: Raw, path: string, value: unknown): void {
  const parts = path.split('.');
  let at = raw;
  for (const p of parts.slice(0, -1)) at = section(at, p);
  at[parts[parts.length - 1]] = value;
}

function getPath(raw: unknown, path: string): unknown {
  let at: unknown = raw;
  for (const p of path.split('.')) at = isRecord(at) ? at[p] : undefined;
  return at;
}

const flagName = (key: OverrideKey) => OVERRIDE_FLAGS.find((f) => f.key === key)!.flag;

/** A number from the command line; anything else is an error naming the flag. */
export function flagNumber(key: OverrideKey, value: string): number {
  const n = value.trim() === '' ? NaN : Number(value);
  if (!Number.isFinite(n)) throw new ConfigError(`${flagName(key)}: must be a number, got ${JSON.stringify(value)}`);
  return n;
}

function flagInt(key: OverrideKey, value: string, min: number): number {
  const n = flagNumber(key, value);
  if (!Number.isInteger(n)) throw new ConfigError(`${flagName(key)}: must be an integer, got ${JSON.stringify(value)}`);
  if (n < min) throw new ConfigError(`${flagName(key)}: must be >= ${min}`);
  return n;
}

const splitList = (v: string) =>
  v
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');

/**
 * How an episode budget becomes iterations × episodes per iteration, never more than `budget` episodes.
 * With `iterations` given: budget / iterations per iteration (rounded down). Otherwise the file's batch
 * (`perIteration`) is kept when it divides the budget; else the batch between half the file's and the file's
 * that uses most of the budget (a larger batch on a tie): 20 with a batch of 8 → 4 × 5; 23 → 3 × 7.
 */
export function splitEpisodeBudget(budget: number, perIteration: number, iterations?: number): { iterations: number; episodesPerIteration: number } {
  if (iterations !== undefined) {
    const per = Math.floor(budget / iterations);
    if (per < 1) throw new ConfigError(`--episodes: ${budget} episodes cannot fill ${iterations} iterations (--iterations): at least one episode per iteration`);
    return { iterations, episodesPerIteration: per };
  }
  const top = Math.max(1, Math.min(perIteration, budget));
  let best = { iterations: Math.floor(budget / top), episodesPerIteration: top };
  for (let per = top - 1; per >= Math.max(1, Math.ceil(top / 2)); per--) {
    const its = Math.floor(budget / per);
    if (its * per > best.iterations * best.episodesPerIteration) best = { iterations: its, episodesPerIteration: per };
  }
  return best;
}

/** `n` of `list`, drawn deterministically from `seed`, in the list's order. */
export function sampleTasks(list: readonly string[], n: number, seed: number): string[] {
  if (n > list.length) throw new ConfigError(`--sample-size: must be <= ${list.length} (the number of tasks to draw from)`);
  const rank = [...list].sort((a, b) => fnv1a32(`${seed}:${a}`).localeCompare(fnv1a32(`${seed}:${b}`)) || a.localeCompare(b));
  const keep = new Set(rank.slice(0, n));
  return list.filter((t) => keep.has(t));
}

const REAL_ID = /^v2\./i;
const stripV2 = (t: string) => t.replace(REAL_ID, '');

/**
 * Task list and environment from --task/--tasks/--domain/--env; undefined when none of them is given. `keepSites`:
 * --domain's sites stay site names (checked here) for the evaluation to expand under its scoring.
 */
function resolveTaskFlags(flags: OverrideFlags, fileEnv: unknown, ctx: OverrideContext, notes: string[], keepSites = false): { env?: string; tasks?: string[] } {
  const given = [flags.task, flags.tasks, flags.domain].filter((v) => v !== undefined).length;
  if (flags.task !== undefined && flags.tasks !== undefined) throw new ConfigError('--task and --tasks: give one of them');
  let tasks: string[] | undefined;
  if (flags.task !== undefined) {
    if (flags.task.trim() === '' || flags.task.includes(',')) throw new ConfigError(`--task: one task id, got ${JSON.stringify(flags.task)} (use --tasks a,b for several)`);
    tasks = [flags.task.trim()];
  }
  if (flags.tasks !== undefined) {
    tasks = splitList(flags.tasks);
    if (tasks.length === 0) throw new ConfigError('--tasks: must name at least one task');
  }
  let env = flags.env;
  const realImplied = flags.domain !== undefined || (tasks ?? []).some((t) => REAL_ID.test(t));
  if (env === undefined && realImplied && fileEnv !== 'real') {
    env = 'real';
    notes.push(`--env real (implied by ${flags.domain !== undefined ? '--domain' : 'a v2.* task'})`);
  }
  if (flags.domain !== undefined) {
    if ((env ?? fileEnv) !== 'real') throw new ConfigError(`--domain: REAL sites need --env real (the environment is ${String(env ?? fileEnv ?? 'miniwob')})`);
    const sites = ctx.realSites?.();
    if (!sites) throw new ConfigError('--domain: the REAL task registry is not available');
    const fromSites: string[] = [];
    for (const site of splitList(flags.domain)) {
      const list = sites[site];
      if (!list) throw new ConfigError(`--domain: unknown REAL site ${JSON.stringify(site)} (sites: ${Object.keys(sites).sort().join(', ')})`);
      if (keepSites) {
        fromSites.push(site);
        continue;
      }
      const unscorable = list.filter((t) => !t.scorable).map((t) => t.id);
      if (unscorable.length) notes.push(`--domain ${site}: left out ${unscorable.join(', ')} (unscorable)`);
      fromSites.push(...list.filter((t) => t.scorable).map((t) => t.id));
    }
    if (fromSites.length === 0) throw new ConfigError(`--domain: ${flags.domain} has no scorable task`);
    tasks = [...new Set([...(tasks ?? []), ...fromSites])];
  }
  if (tasks && (env ?? fileEnv) === 'real') tasks = [...new Set(tasks.map(stripV2))];
  return given > 0 || env !== undefined ? { env, tasks } : {};
}

/** For --sample-size: REAL site names in a list expand to their scorable tasks. */
function expandSites(list: string[], env: unknown, ctx: OverrideContext): string[] {
  if (env !== 'real' || !ctx.realSites) return list;
  const sites = ctx.realSites();
  const out: string[] = [];
  for (const t of list) for (const x of sites[t] ? sites[t].filter((s) => s.scorable).map((s) => s.id) : [stripV2(t)]) if (!out.includes(x)) out.push(x);
  return out;
}

export interface Overridden {
  /** The config object with the flags written in (the input is not changed). */
  raw: Raw;
  /** Config path → the flag that set it, for error messages. */
  flagPaths: Map<string, string>;
  /** What the flags did beyond setting a value (implied env, episode budget split, left-out tasks). */
  notes: string[];
}

/**
 * `halo train` / `halo mcts`: the HALO config object with the flags applied. Overriding the tasks empties
 * `train.heldOutTasks` (they belong to the file's task list).
 */
export function applyRunOverrides(command: 'train' | 'mcts', fileRaw: unknown, flags: OverrideFlags, ctx: OverrideContext = {}): Overridden {
  const raw: Raw = isRecord(fileRaw) ? structuredClone(fileRaw) : {};
  const flagPaths = new Map<string, string>();
  const notes: string[] = [];
  const set = (path: string, value: unknown, flag: string) => {
    setPath(raw, path, value);
    flagPaths.set(path, flag);
  };
  const sec = command === 'train' ? 'train' : 'mcts';
  const tasksFlag = flags.domain !== undefined ? '--domain' : flags.task !== undefined ? '--task' : '--tasks';

  const fileEnv = getPath(raw, 'episode.env');
  const { env, tasks } = resolveTaskFlags(flags, fileEnv, ctx, notes);
  if (env === 'real' && fileEnv !== 'real' && getPath(raw, 'policy.model') === LOCAL_TEST_MODEL && flags.policyUrl === undefined) {
    const flag = flags.env === 'real' ? '--env real' : flags.domain !== undefined ? `--domain ${flags.domain}` : `${tasksFlag} ${flags.task ?? flags.tasks}`;
    throw new ConfigError(
      `${flag}: ${ctx.file ?? 'the config'} is not a REAL config: it would train the local ${LOCAL_TEST_MODEL} test model ` +
        `(policy.model ${LOCAL_TEST_MODEL}, random weights) on REAL. Use the REAL config: --config ${REAL_CONFIG[command]} ` +
        `(Qwen3-VL-8B on vLLM), e.g. npx halo ${command} --config ${REAL_CONFIG[command]} ${flag}`,
    );
  }
  if (env !== undefined) set('episode.env', env, flags.env !== undefined ? '--env' : tasksFlag);
  if (tasks !== undefined) {
    set(`${sec}.tasks`, tasks, tasksFlag);
    if (command === 'train' && Array.isArray(getPath(raw, 'train.heldOutTasks')) && (getPath(raw, 'train.heldOutTasks') as unknown[]).length) {
      setPath(raw, 'train.heldOutTasks', []);
      notes.push(`${tasksFlag}: no held-out tasks (the file's train.heldOutTasks belong to its own task list)`);
    }
  }
  let seed: number | undefined;
  if (flags.seed !== undefined) {
    seed = flagNumber('seed', flags.seed);
    set(`${sec}.seed`, seed, '--seed');
  }
  if (flags.sampleSize !== undefined) {
    const n = flagInt('sampleSize', flags.sampleSize, 1);
    const given = getPath(raw, `${sec}.tasks`);
    // A file without a task list draws from the default one.
    const current = Array.isArray(given) ? given.map(String) : parseConfig({})[sec].tasks;
    const from = expandSites(current, getPath(raw, 'episode.env'), ctx);
    set(`${sec}.tasks`, sampleTasks(from, n, seed ?? 0), '--sample-size');
  }
  const num = (key: OverrideKey, path: string) => {
    const v = flags[key];
    if (v !== undefined) set(path, flagNumber(key, v), flagName(key));
  };
  if (flags.policyUrl !== undefined) {
    // A policy URL means an OpenAI-compatible server (vLLM), as with `halo episode --policy-url`; the run's
    // adapters go there too unless the file names another server, so later iterations sample them.
    // A comma-separated list is a pool of replicas (policy.baseUrls, ./launch.sh gpu on several GPUs); the first
    // is policy.baseUrl. It replaces any pool the file names.
    const given = flags.policyUrl.split(',').map((u) => u.trim());
    if (given.some((u) => u === '')) throw new ConfigError(`--policy-url ${JSON.stringify(flags.policyUrl)}: an empty URL in the list (one URL, or several separated by commas)`);
    const pool = given.map(completePolicyUrl);
    for (const [i, p] of pool.entries()) if (p.completed) notes.push(`--policy-url ${given[i]}: completed to ${p.url} (vLLM's OpenAI API is under /v1)`);
    const policy = pool[0];
    set('policy.baseUrl', policy.url, '--policy-url');
    if (pool.length > 1 || getPath(raw, 'policy.baseUrls') !== undefined)
      set(
        'policy.baseUrls',
        pool.map((p) => p.url),
        '--policy-url',
      );
    set('policy.backend', 'openai', '--policy-url');
    if (getPath(raw, `${sec}.vllmBaseUrl`) === undefined) {
      set(`${sec}.vllmBaseUrl`, policy.url, '--policy-url');
      notes.push(`--policy-url: new adapters are loaded into ${policy.url} (${sec}.vllmBaseUrl)`);
    }
  }
  if (command === 'train') {
    if (flags.lossType !== undefined) {
      if (flags.lossType !== 'dr_grpo') {
        throw new ConfigError(
          `--loss-type: only dr_grpo is implemented (train.lossType: advantages r − mean(r), no std division, a constant length normaliser), got ${JSON.stringify(flags.lossType)}`,
        );
      }
      set('train.lossType', flags.lossType, '--loss-type');
    }
    num('iterations', 'train.iterations');
    num('numGenerations', 'train.numGenerations');
    num('lr', 'train.learningRate');
    num('temperature', 'policy.temperature');
    if (flags.episodes !== undefined) {
      const budget = flagInt('episodes', flags.episodes, 1);
      const its = flags.iterations !== undefined ? flagInt('iterations', flags.iterations, 1) : undefined;
      const filePer = getPath(raw, 'train.episodesPerIteration');
      const per = typeof filePer === 'number' && Number.isInteger(filePer) && filePer >= 1 ? filePer : 2;
      const split = splitEpisodeBudget(budget, per, its);
      set('train.iterations', split.iterations, its !== undefined ? '--iterations' : '--episodes (train.iterations)');
      set('train.episodesPerIteration', split.episodesPerIteration, '--episodes (train.episodesPerIteration)');
      const used = split.iterations * split.episodesPerIteration;
      notes.push(
        `--episodes ${budget}: ${split.iterations} iterations × ${split.episodesPerIteration} episodes = ${used}${used < budget ? ` (${budget - used} left over: less than one more iteration)` : ''}`,
      );
    }
  } else {
    num('iterations', 'mcts.iterations');
    num('numGenerations', 'mcts.maxChildren');
    num('lr', 'mcts.learningRate');
    num('temperature', 'mcts.temperature');
    num('simulations', 'mcts.numSimulations');
    num('ucbC', 'mcts.ucbConstant');
    if (flags.episodes !== undefined) {
      // mcts.searchesPerTask searches per task per iteration: the budget is iterations × that many searches.
      const budget = flagInt('episodes', flags.episodes, 1);
      const defaults = parseConfig({}).mcts;
      const given = getPath(raw, 'mcts.tasks');
      const givenRepeats = getPath(raw, 'mcts.searchesPerTask');
      const repeats = typeof givenRepeats === 'number' ? givenRepeats : defaults.searchesPerTask;
      const count = (Array.isArray(given) ? given.length : defaults.tasks.length) * repeats;
      const perIteration = repeats === 1 ? 'one search per task per iteration' : `${repeats} searches per task per iteration`;
      if (flags.iterations !== undefined) throw new ConfigError(`--episodes and --iterations: give one of them (halo mcts runs ${perIteration})`);
      const iterations = Math.floor(budget / count);
      if (iterations < 1) throw new ConfigError(`--episodes: ${budget} searches cannot cover the ${count} searches of one iteration (${perIteration})`);
      set('mcts.iterations', iterations, '--episodes (mcts.iterations)');
      const used = iterations * count;
      notes.push(
        `--episodes ${budget}: ${iterations} iterations × ${count} searches = ${used} searches${used < budget ? ` (${budget - used} left over: less than one more iteration)` : ''}`,
      );
    }
  }
  return { raw, flagPaths, notes };
}

/**
 * `halo eval`: the eval config object and the HALO config object with the flags applied. --ucb-c goes to the
 * HALO config's mcts section (the test-time search reads it there); --simulations sets the test-time search of
 * every qwen3vl_mcts mode; --seed replaces the seeds list.
 */
export function applyEvalOverrides(evalFileRaw: unknown, haloFileRaw: unknown, flags: OverrideFlags, ctx: OverrideContext = {}): { eval: Overridden; halo: Overridden } {
  const raw: Raw = isRecord(evalFileRaw) ? structuredClone(evalFileRaw) : {};
  const halo: Raw = isRecord(haloFileRaw) ? structuredClone(haloFileRaw) : {};
  const flagPaths = new Map<string, string>();
  const haloPaths = new Map<string, string>();
  const notes: string[] = [];
  const set = (path: string, value: unknown, flag: string) => {
    setPath(raw, path, value);
    flagPaths.set(path, flag);
  };
  const tasksFlag = flags.domain !== undefined ? '--domain' : flags.task !== undefined ? '--task' : '--tasks';
  // A site stays a site: the plan expands it into agisdk's task set for the site under the evaluation's scoring
  // (every task officially, gocalendar-11 included; the scorable ones under training scoring).
  const { env, tasks } = resolveTaskFlags(flags, raw.env, ctx, notes, true);
  if (env !== undefined) set('env', env, flags.env !== undefined ? '--env' : tasksFlag);
  if (tasks !== undefined) set('tasks', tasks, tasksFlag);
  let seed: number | undefined;
  if (flags.seed !== undefined) {
    seed = flagNumber('seed', flags.seed);
    set('seeds', [seed], '--seed');
  }
  if (flags.sampleSize !== undefined) {
    const n = flagInt('sampleSize', flags.sampleSize, 1);
    const current = Array.isArray(raw.tasks) ? raw.tasks.map(String) : parseEvalConfig({}).tasks;
    set('tasks', sampleTasks(expandSites(current, raw.env ?? 'miniwob', ctx), n, seed ?? 0), '--sample-size');
  }
  if (flags.simulations !== undefined) {
    const sims = flagNumber('simulations', flags.simulations);
    const modes = Array.isArray(raw.modes) ? raw.modes : undefined;
    const mcts = (modes ?? []).map((m, i) => [m, i] as const).filter(([m]) => isRecord(m) && m.name === 'qwen3vl_mcts');
    if (mcts.length === 0) throw new ConfigError('--simulations: the eval config has no qwen3vl_mcts mode to search with');
    for (const [m, i] of mcts) {
      const mode = m as Raw;
      mode.testTimeMcts = { ...(isRecord(mode.testTimeMcts) ? mode.testTimeMcts : {}), simulations: sims };
      flagPaths.set(`modes.${i}.testTimeMcts.simulations`, '--simulations');
    }
  }
  if (flags.ucbC !== undefined) {
    setPath(halo, 'mcts.ucbConstant', flagNumber('ucbC', flags.ucbC));
    haloPaths.set('mcts.ucbConstant', '--ucb-c');
  }
  return { eval: { raw, flagPaths, notes }, halo: { raw: halo, flagPaths: haloPaths, notes: [] } };
}

/** The part of a zod issue read here. */
export interface IssueLike {
  code: string;
  path: readonly PropertyKey[];
  message: string;
  minimum?: unknown;
  maximum?: unknown;
  inclusive?: boolean;
  origin?: string;
  expected?: string;
  values?: readonly unknown[];
}

/** A zod issue as a short phrase: "must be > 0", "must be an integer", "must be one of miniwob, real". */
export function describeFlagIssue(i: IssueLike): string {
  if (i.code === 'too_small' && i.origin === 'array') return `must name at least ${String(i.minimum)}`;
  if (i.code === 'too_big' && i.origin === 'array') return `must name at most ${String(i.maximum)}`;
  if (i.code === 'too_small') return `must be ${i.inclusive ? '>=' : '>'} ${String(i.minimum)}`;
  if (i.code === 'too_big') return `must be ${i.inclusive ? '<=' : '<'} ${String(i.maximum)}`;
  if (i.code === 'invalid_type' && i.expected === 'int') return 'must be an integer';
  if (i.code === 'invalid_type' && i.expected === 'number') return 'must be a number';
  if (i.code === 'invalid_value' && i.values) return `must be one of ${i.values.map(String).join(', ')}`;
  return i.message;
}

/** The flag that set the value an issue is about (its path, or a parent of it), if any. */
export function flagOfIssue(path: readonly PropertyKey[], flagPaths: Map<string, string>): string | undefined {
  for (let n = path.length; n > 0; n--) {
    const hit = flagPaths.get(path.slice(0, n).map(String).join('.'));
    if (hit) return hit;
  }
  return undefined;
}

/**
 * Validates an overridden config object: an issue on a value a flag set is an error naming the flag
 * ("--lr: must be > 0"); anything else is left to `parse`, the file's own parser, so the file's mistakes read
 * as they always do.
 */
export function parseWithFlags<T>(
  o: Overridden,
  safeParse: (raw: unknown) => { success: true } | { success: false; error: { issues: readonly IssueLike[] } },
  parse: (raw: unknown) => T,
): T {
  const r = safeParse(o.raw);
  if (!r.success) {
    const lines: string[] = [];
    for (const i of r.error.issues) {
      const flag = flagOfIssue(i.path, o.flagPaths);
      if (!flag) continue;
      const line = `${flag}: ${describeFlagIssue(i)}`;
      if (!lines.includes(line)) lines.push(line);
    }
    if (lines.length) throw new ConfigError(lines.join('\n'));
  }
  return parse(o.raw);
}
