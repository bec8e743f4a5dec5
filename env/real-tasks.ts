import { editDistance } from '../lib/model-io/text';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { locateWithProjectPython, NOT_INSTALLED_STATUS } from './project-python';

/**
 * The REAL v2 task registry, read at run time from the installed `agisdk` Python package (pinned 0.3.5):
 * `agisdk/REAL/browsergym/webclones/v2/tasks/<id>.json` and `v2/eval_scripts/eval_<site>_<n>.py`.
 * Nothing of agisdk is copied into this repository.
 */

/** The version the project pins (launch.sh); other versions load, and the snapshot records what was loaded. */
export const EXPECTED_AGISDK_VERSION = '0.3.5';

/** The package-relative folder holding the v2 tasks and eval scripts. */
const V2_RELATIVE = join('REAL', 'browsergym', 'webclones', 'v2');

const INSTALL_HINT = 'pip install --no-deps agisdk==0.3.5 into .venv; ./launch.sh does it';

export interface RealTask {
  /** The task's own id, e.g. `gomail-18`. */
  id: string;
  /** What /config and the leaderboard call it: `v2.<id>`. */
  canonicalId: string;
  goal: string;
  /** `website.id`, e.g. `gomail`. */
  site: string;
  /** `website.url` as written in the task (v2 URLs end with `/`). */
  startUrl: string;
  /** Origin of startUrl: /config and /finish are built from it (never `startUrl + "/config"`). */
  origin: string;
  /** File name of the eval script, e.g. `eval_gomail_18.py`. */
  evalScript: string;
  evalScriptPath: string;
  /** sha256 (hex) of the script's bytes; null when the file is missing. */
  evalSha256: string | null;
  /** False when the task can never be scored (empty or missing script, unsupported eval). */
  scorable: boolean;
  unscorableReason?: string;
  /**
   * Why a verdict on this task may not mean what its goal says, beyond the agent's actions: an eval script that
   * reads outside its state file, a task on a different deployment than the rest of its site. Empty for most.
   */
  caveats: string[];
}

export interface RealRegistry {
  agisdkDir: string;
  agisdkVersion: string;
  tasksDir: string;
  evalScriptsDir: string;
  /** Sorted by site, then task number. */
  tasks: RealTask[];
  byId: Map<string, RealTask>;
}

export interface RegistrySnapshotTask {
  id: string;
  goal: string;
  site: string;
  start_url: string;
  eval_script: string;
  eval_sha256: string | null;
  scorable: boolean;
  /** RealTask.caveats (absent in snapshots written before they were kept). */
  caveats?: string[];
}

export interface RegistrySnapshot {
  agisdk_version: string;
  tasks: RegistrySnapshotTask[];
}

export class UnknownRealTaskError extends Error {
  readonly suggestions: string[];
  constructor(id: string, suggestions: string[], total: number) {
    const hint = suggestions.length > 0 ? `; did you mean ${suggestions.map((t) => `"${t}"`).join(', ')}?` : '';
    super(`unknown REAL task "${id}" (${total} v2 tasks in agisdk ${EXPECTED_AGISDK_VERSION})${hint}`);
    this.name = 'UnknownRealTaskError';
    this.suggestions = suggestions;
  }
}

// find_spec on a top-level package locates it without executing its __init__; importlib.metadata reads the
// dist-info without importing either.
const FIND_SPEC_SCRIPT = [
  'import importlib.util, importlib.metadata, json, sys',
  "s = importlib.util.find_spec('agisdk')",
  `if s is None or not s.submodule_search_locations: sys.exit(${NOT_INSTALLED_STATUS})`,
  'try:',
  "    v = importlib.metadata.version('agisdk')",
  'except Exception:',
  "    v = 'unknown'",
  "print(json.dumps({'dir': list(s.submodule_search_locations)[0], 'version': v}))",
].join('\n');

function looksLikeAgisdk(dir: string): boolean {
  return existsSync(join(dir, V2_RELATIVE, 'tasks')) && existsSync(join(dir, V2_RELATIVE, 'eval_scripts'));
}

/** Version from a sibling `agisdk-<version>.dist-info` (pip's layout), else 'unknown'. */
function versionFromDistInfo(pkgDir: string): string {
  const parent = dirname(pkgDir);
  let entries: string[];
  try {
    entries = readdirSync(parent);
  } catch {
    return 'unknown';
  }
  for (const e of entries) {
    if (!/^agisdk-.+\.dist-info$/i.test(e)) continue;
    try {
      const meta = readFileSync(join(parent, e, 'METADATA'), 'utf8');
      const m = /^Version:\s*(\S+)\s*$/m.exec(meta);
      if (m) return m[1];
    } catch {
      // try the next one
    }
  }
  return 'unknown';
}

export interface AgisdkLocation {
  /** The `agisdk` package folder (site-packages/agisdk). */
  dir: string;
  version: string;
}

let cachedLocation: AgisdkLocation | undefined;

/**
 * The installed `agisdk` package: HALO_AGISDK_DIR (the package folder, e.g. .../site-packages/agisdk), else
 * asked from <repo>/.venv/bin/python (fallback python3) without importing the package.
 */
export function findAgisdk(): AgisdkLocation {
  const fromEnv = process.env.HALO_AGISDK_DIR;
  if (fromEnv) {
    const dir = resolve(fromEnv);
    if (!looksLikeAgisdk(dir)) {
      throw new Error(`HALO_AGISDK_DIR=${fromEnv} is not an agisdk package folder (no ${join(V2_RELATIVE, 'tasks')})`);
    }
    return { dir, version: versionFromDistInfo(dir) };
  }
  if (cachedLocation) return cachedLocation;
  cachedLocation = locateWithProjectPython(
    'agisdk',
    FIND_SPEC_SCRIPT,
    (out) => {
      const found = JSON.parse(out) as { dir: string; version: string };
      if (!looksLikeAgisdk(found.dir)) throw new Error(`${found.dir} has no ${join(V2_RELATIVE, 'tasks')}`);
      return { dir: found.dir, version: found.version === 'unknown' ? versionFromDistInfo(found.dir) : found.version };
    },
    INSTALL_HINT,
  );
  return cachedLocation;
}

interface RawTask {
  id?: unknown;
  goal?: unknown;
  website?: { id?: unknown; url?: unknown };
  evals?: unknown;
}

function taskNumber(id: string): number {
  const m = /-(\d+)$/.exec(id);
  return m ? Number(m[1]) : Number.MAX_SAFE_INTEGER;
}

function compareTasks(a: RealTask, b: RealTask): number {
  return a.site.localeCompare(b.site) || taskNumber(a.id) - taskNumber(b.id) || a.id.localeCompare(b.id);
}

/**
 * What an eval script reads besides the state file it is given. agisdk writes that file into the shared temporary
 * folder; the project writes it alone into a folder of its own (env/real-eval.ts), so a script that looks around
 * it can judge the same state differently in the two harnesses.
 */
export function scriptReadsOutsideState(source: string): string | undefined {
  if (/\bos\.(listdir|scandir|walk)\s*\(|\bglob\.(i?glob)\s*\(/.test(source)) {
    return 'its eval script also reads the files next to its state file (the shared temporary folder under agisdk, an empty private folder here): its verdict can depend on them';
  }
  if (/\bos\.path\.dirname\s*\(/.test(source)) {
    return "its eval script reads the name of its state file's folder (a SUCCESS for one recorded folder name): its verdict can depend on where the state was written";
  }
  return undefined;
}

/**
 * Tasks whose start URL is not the one the rest of their site's tasks use: agisdk pins most sites to one preview
 * deployment, and a task on another one (a production alias) runs on a site that may have drifted from the
 * deployment its script was written against.
 */
function deploymentCaveats(tasks: RealTask[]): void {
  const bySite = new Map<string, Map<string, number>>();
  for (const t of tasks) {
    const urls = bySite.get(t.site) ?? new Map<string, number>();
    urls.set(t.origin, (urls.get(t.origin) ?? 0) + 1);
    bySite.set(t.site, urls);
  }
  for (const t of tasks) {
    const urls = [...(bySite.get(t.site) ?? new Map<string, number>()).entries()].sort((a, b) => b[1] - a[1]);
    const [main, count] = urls[0] ?? [t.origin, 0];
    if (urls.length < 2 || t.origin === main || (urls[1]?.[1] ?? 0) === count) continue;
    t.caveats.push(`runs on ${t.origin}, not ${main} where the other ${count} ${t.site} tasks run: that deployment may have drifted from what its eval script was written against`);
  }
}

function loadTask(file: string, evalScriptsDir: string): RealTask {
  let raw: RawTask;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8')) as RawTask;
  } catch (err) {
    throw new Error(`cannot read REAL task ${file}: ${(err as Error).message}`);
  }
  const bad = (what: string): Error => new Error(`REAL task ${file}: ${what}`);
  if (typeof raw.id !== 'string' || raw.id === '') throw bad('no "id"');
  if (typeof raw.goal !== 'string') throw bad('no "goal"');
  if (!raw.website || typeof raw.website.url !== 'string' || typeof raw.website.id !== 'string') {
    throw bad('no "website.id" / "website.url"');
  }
  let origin: string;
  try {
    const u = new URL(raw.website.url);
    if (u.protocol !== 'https:' && u.protocol !== 'http:') throw new Error(u.protocol);
    origin = u.origin;
  } catch {
    throw bad(`"website.url" ${JSON.stringify(raw.website.url)} is not an http(s) URL`);
  }
  const evals = Array.isArray(raw.evals) ? (raw.evals as Array<Record<string, unknown>>) : [];
  let evalScript = '';
  let unscorableReason: string | undefined;
  if (evals.length !== 1 || typeof evals[0]?.script !== 'string' || evals[0].script === '') {
    unscorableReason = `evals ${JSON.stringify(raw.evals)} are not one script eval (only v2 script evals are supported)`;
    const s = evals.find((e) => typeof e?.script === 'string' && e.script !== '');
    evalScript = s ? String(s.script) : '';
  } else if (evals[0].type !== undefined && evals[0].type !== '' && evals[0].type !== 'script') {
    unscorableReason = `eval type ${JSON.stringify(evals[0].type)} is not supported`;
    evalScript = evals[0].script as string;
  } else {
    evalScript = evals[0].script as string;
  }
  if (evalScript !== '' && !/^[A-Za-z0-9_.-]+\.py$/.test(evalScript)) throw bad(`eval script name ${JSON.stringify(evalScript)}`);
  const evalScriptPath = evalScript === '' ? '' : join(evalScriptsDir, evalScript);
  let evalSha256: string | null = null;
  const caveats: string[] = [];
  if (evalScriptPath !== '') {
    let bytes: Buffer | undefined;
    try {
      bytes = readFileSync(evalScriptPath);
    } catch {
      unscorableReason ??= `eval script ${evalScript} is missing from ${evalScriptsDir}`;
    }
    if (bytes) {
      evalSha256 = createHash('sha256').update(bytes).digest('hex');
      if (bytes.toString('utf8').trim() === '') unscorableReason ??= `eval script ${evalScript} is empty (${bytes.length} bytes)`;
      const outside = scriptReadsOutsideState(bytes.toString('utf8'));
      if (outside) caveats.push(outside);
    }
  }
  const id = raw.id;
  return {
    id,
    canonicalId: `v2.${id}`,
    goal: raw.goal,
    site: raw.website.id,
    startUrl: raw.website.url,
    origin,
    evalScript,
    evalScriptPath,
    evalSha256,
    scorable: unscorableReason === undefined,
    ...(unscorableReason !== undefined ? { unscorableReason } : {}),
    caveats,
  };
}

const registries = new Map<string, RealRegistry>();

/** Loads (once per folder) the v2 registry of the agisdk package at `agisdkDir` (default findAgisdk()). */
export function loadRealRegistry(agisdkDir?: string): RealRegistry {
  const loc = agisdkDir ? { dir: resolve(agisdkDir), version: versionFromDistInfo(resolve(agisdkDir)) } : findAgisdk();
  const hit = registries.get(loc.dir);
  if (hit) return hit;
  const tasksDir = join(loc.dir, V2_RELATIVE, 'tasks');
  const evalScriptsDir = join(loc.dir, V2_RELATIVE, 'eval_scripts');
  if (!statSync(tasksDir, { throwIfNoEntry: false })?.isDirectory()) {
    throw new Error(`${tasksDir} does not exist; ${INSTALL_HINT}`);
  }
  const files = readdirSync(tasksDir).filter((f) => f.endsWith('.json'));
  const tasks: RealTask[] = [];
  const byId = new Map<string, RealTask>();
  for (const f of files) {
    const task = loadTask(join(tasksDir, f), evalScriptsDir);
    // agisdk itself names a task by its file; they agree in 0.3.5, and a disagreement would mean a broken package.
    if (`${task.id}.json` !== f) throw new Error(`REAL task file ${f} has id "${task.id}"`);
    if (byId.has(task.id)) throw new Error(`duplicate REAL task id "${task.id}" in ${tasksDir}`);
    byId.set(task.id, task);
    tasks.push(task);
  }
  if (tasks.length === 0) throw new Error(`no REAL v2 tasks in ${tasksDir}; ${INSTALL_HINT}`);
  tasks.sort(compareTasks);
  deploymentCaveats(tasks);
  const registry: RealRegistry = { agisdkDir: loc.dir, agisdkVersion: loc.version, tasksDir, evalScriptsDir, tasks, byId };
  registries.set(loc.dir, registry);
  return registry;
}

/** All v2 tasks (121 in agisdk 0.3.5), sorted by site then number. */
export function listRealTasks(registry: RealRegistry = loadRealRegistry()): RealTask[] {
  return [...registry.tasks];
}

/** Tasks grouped by site (keys sorted), each group sorted by task number. */
export function realTasksBySite(registry: RealRegistry = loadRealRegistry()): Record<string, RealTask[]> {
  const out: Record<string, RealTask[]> = {};
  for (const t of registry.tasks) {
    out[t.site] ??= [];
    out[t.site].push(t);
  }
  return out;
}

function normaliseId(id: string): string {
  return id
    .trim()
    .replace(/^v2\./i, '')
    .replace(/\.json$/i, '');
}

/** Up to `n` known ids closest to `id` (same site first, then by edit distance). */
export function closeRealTaskIds(id: string, ids: readonly string[], n = 5): string[] {
  const q = normaliseId(id).toLowerCase();
  const site = q.replace(/[-_ ]?\d+$/, '');
  const limit = Math.max(2, Math.ceil(q.length / 3));
  return ids
    .map((t) => ({ t, d: editDistance(q, t), sameSite: site.length >= 3 && t.startsWith(`${site}-`) }))
    .filter((s) => s.d <= limit)
    .sort((a, b) => a.d - b.d || Number(b.sameSite) - Number(a.sameSite) || a.t.localeCompare(b.t))
    .slice(0, n)
    .map((s) => s.t);
}

/** A task by id (`gomail-18` or `v2.gomail-18`); unknown ids throw UnknownRealTaskError with suggestions. */
export function getRealTask(id: string, registry: RealRegistry = loadRealRegistry()): RealTask {
  const hit = registry.byId.get(normaliseId(id));
  if (hit) return hit;
  const ids = registry.tasks.map((t) => t.id);
  throw new UnknownRealTaskError(id, closeRealTaskIds(id, ids), ids.length);
}

/** JSON-able record of exactly which tasks and eval scripts a run used. */
export function registrySnapshot(registry: RealRegistry = loadRealRegistry()): RegistrySnapshot {
  return {
    agisdk_version: registry.agisdkVersion,
    tasks: registry.tasks.map((t) => ({
      id: t.id,
      goal: t.goal,
      site: t.site,
      start_url: t.startUrl,
      eval_script: t.evalScript,
      eval_sha256: t.evalSha256,
      scorable: t.scorable,
      ...(t.caveats.length ? { caveats: [...t.caveats] } : {}),
    })),
  };
}
