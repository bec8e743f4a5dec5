import type { Command } from 'commander';
import { existsSync } from 'node:fs';
import { isAbsolute, join, relative } from 'node:path';
import { configSchema, ConfigError, parseConfig, type HaloConfig } from '../lib/config/config';
import { identicalCandidatesProblem } from '../lib/config/config-checks';
import {
  ALSO_ACCEPTED,
  applyRunOverrides,
  flagsImplyReal,
  flagsOf,
  parseWithFlags,
  REAL_CONFIG,
  type OverrideCommand,
  type OverrideContext,
  type OverrideFlags,
  type Overridden,
} from './config-overrides';
import { readConfigRaw } from '../host/config-file';
import { realTasksBySite, type RegistrySnapshot } from '../env/real-tasks';
import { loadTaskRegistryFile, realPreflight, snapshotSites } from './real-preflight';
import { REPO_ROOT } from './processes';

// The common overrides of `halo train`, `halo mcts` and `halo eval` (client/config-overrides.ts) as commander
// options, and what a run checks before it starts.

export interface TaskRegistryPin {
  snapshot: RegistrySnapshot;
  file: string;
}

/** Adds the command's override flags, `--task-registry`, and a help section with the default config's values. */
export function addOverrideOptions(cmd: Command, command: OverrideCommand, defaults: () => { file: string; values: Record<string, unknown> }): Command {
  for (const f of flagsOf(command)) {
    const path = f.path?.[command];
    cmd.option(`${f.flag} <${f.arg}>`, `${f.help[command]}${path && f.key !== 'task' && f.key !== 'tasks' && !f.help[command]!.includes(path) ? ` (${path})` : ''}`);
  }
  cmd.option(
    '--task-registry <file>',
    'pin the REAL tasks to a `halo tasks snapshot` file: tasks come from it, and every eval script must match the installed agisdk (sha256) before anything starts',
  );
  cmd.addHelpText('after', () => {
    let d: { file: string; values: Record<string, unknown> };
    try {
      d = defaults();
    } catch (err) {
      return `\nDefaults: the config file's values (${(err as Error).message})`;
    }
    const lines = Object.entries(d.values).map(([flag, v]) => `  ${flag.padEnd(18)} ${typeof v === 'string' ? v : JSON.stringify(v)}`);
    return `\nDefaults of the flags above: the config file's values; without --config, ${d.file}:\n${lines.join('\n')}\nFlags override the file and are validated like its values; ${ALSO_ACCEPTED}.`;
  });
  return cmd;
}

/** The override flags among commander's parsed options (it camel-cases `--num-generations` → numGenerations). */
export function overrideFlagsOf(opts: Record<string, unknown>): OverrideFlags {
  const keys: (keyof OverrideFlags)[] = [
    'task',
    'tasks',
    'domain',
    'env',
    'episodes',
    'iterations',
    'numGenerations',
    'lr',
    'temperature',
    'simulations',
    'ucbC',
    'sampleSize',
    'seed',
    'policyUrl',
    'lossType',
  ];
  const out: OverrideFlags = {};
  for (const k of keys) if (typeof opts[k] === 'string') out[k] = opts[k] as string;
  return out;
}

export function loadPin(file: string | undefined): TaskRegistryPin | undefined {
  return file ? { snapshot: loadTaskRegistryFile(file), file } : undefined;
}

/** REAL tasks by site: from the pinned snapshot when there is one, else from the installed agisdk. */
export function overrideContext(pin: TaskRegistryPin | undefined, file?: string): OverrideContext {
  let sites: ReturnType<NonNullable<OverrideContext['realSites']>> | undefined;
  return {
    ...(file ? { file } : {}),
    realSites: () =>
      (sites ??= pin
        ? snapshotSites(pin.snapshot)
        : Object.fromEntries(Object.entries(realTasksBySite()).map(([s, list]) => [s, list.map((t) => ({ id: t.id, site: t.site, scorable: t.scorable }))]))),
  };
}

/** Validates an overridden HALO config: errors on flag-set values name the flag. */
export function parseHaloWithFlags(o: Overridden, source: string): HaloConfig {
  return parseWithFlags(
    o,
    (raw) => configSchema.safeParse(raw),
    (raw) => parseConfig(raw, source),
  );
}

/**
 * `halo train` / `halo mcts`: the config file (or `defaultFile` when it exists, else the defaults) with the
 * flags and `--run-id` applied and validated. Without a config file, REAL tasks on a policy server
 * (`--policy-url … --domain gomail`, the seeds' command) take the REAL config: the default one trains the local
 * tiny-random model, which no policy server serves.
 */
export function runConfigFromFlags(
  command: 'train' | 'mcts',
  file: string | undefined,
  defaultFile: string,
  opts: Record<string, unknown> & { runId?: string; taskRegistry?: string },
): { cfg: HaloConfig; notes: string[]; pin?: TaskRegistryPin } {
  const flags = overrideFlagsOf(opts);
  const pre: string[] = [];
  let path = file ?? (existsSync(defaultFile) ? defaultFile : undefined);
  if (file === undefined && flags.policyUrl !== undefined && flagsImplyReal(flags)) {
    path = join(REPO_ROOT, REAL_CONFIG[command]);
    pre.push(`no --config: ${REAL_CONFIG[command]} (REAL tasks on the policy server of --policy-url)`);
  }
  const raw = path ? readConfigRaw(path) : {};
  const pin = loadPin(opts.taskRegistry);
  const o = applyRunOverrides(command, raw, flags, overrideContext(pin, path ? relativeToCwd(path) : undefined));
  o.notes.unshift(...pre);
  if (opts.runId !== undefined) {
    o.raw[command] ??= {};
    const sec = o.raw[command] as Record<string, unknown>;
    sec.runId = opts.runId;
    o.flagPaths.set(`${command}.runId`, '--run-id');
  }
  const cfg = parseHaloWithFlags(o, path ? `config file ${path}` : 'config');
  // A GRPO run at temperature 0 samples N identical candidates: every advantage 0, nothing learned.
  const greedyGroups = command === 'train' ? identicalCandidatesProblem(cfg) : undefined;
  if (greedyGroups) {
    const flags = ['policy.temperature', 'train.numGenerations'].map((p) => o.flagPaths.get(p)).filter((f) => f !== undefined);
    throw new ConfigError(`${flags.length ? `${[...new Set(flags)].join(', ')}: ` : ''}${greedyGroups}`);
  }
  return { cfg, notes: o.notes, ...(pin ? { pin } : {}) };
}

/** The long flags commander knows, on every command and subcommand (for the underscore spellings). */
export function knownLongFlags(program: Command): Set<string> {
  const out = new Set<string>();
  const walk = (c: Command) => {
    for (const o of c.options) if (o.long) out.add(o.long);
    for (const sub of c.commands) walk(sub);
  };
  walk(program);
  return out;
}

function relativeToCwd(path: string): string {
  const rel = relative(process.cwd(), path);
  return rel && !rel.startsWith('..') && !isAbsolute(rel) ? rel : path;
}

/**
 * Before a run or evaluation starts: on REAL, every task known (and scorable unless `allowUnscorable`), the
 * pinned registry matched, and the sites reachable (HALO_REAL_ORIGIN instead when set); a pin on MiniWoB++ is
 * an error.
 */
export async function preflightTasks(
  env: 'miniwob' | 'real',
  tasks: readonly string[],
  pin: TaskRegistryPin | undefined,
  what: string,
  opts: { allowUnscorable?: boolean } = {},
): Promise<void> {
  if (env !== 'real') {
    if (pin) throw new ConfigError(`--task-registry: pins REAL tasks, and this ${what} runs on ${env}`);
    return;
  }
  await realPreflight({
    tasks,
    ...(pin ? { pin } : {}),
    originOverride: process.env.HALO_REAL_ORIGIN || undefined,
    what,
    allowUnscorable: opts.allowUnscorable,
  });
}

/** The default config's value of every flag that maps to one config path, for --help. */
export function flagDefaults(command: OverrideCommand, cfg: unknown): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const f of flagsOf(command)) {
    const path = f.path?.[command];
    if (!path) continue;
    let v: unknown = cfg;
    for (const p of path.split('.')) v = v && typeof v === 'object' ? (v as Record<string, unknown>)[p] : undefined;
    if (f.key === 'task') continue;
    out[f.flag] = v === undefined ? (f.key === 'seed' ? 'the run id' : '(unset)') : Array.isArray(v) ? v.join(',') : v;
  }
  if (command === 'train' && cfg && typeof cfg === 'object') {
    const t = (cfg as HaloConfig).train;
    if (t) out['--episodes'] = `${t.iterations * t.episodesPerIteration} (${t.iterations} iterations × ${t.episodesPerIteration})`;
  }
  return out;
}
