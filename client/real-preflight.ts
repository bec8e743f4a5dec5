import { readFileSync } from 'node:fs';
import { ConfigError } from '../lib/config/config';
import type { SiteTask } from './config-overrides';
import { getRealTask, loadRealRegistry, UnknownRealTaskError, type RealRegistry, type RegistrySnapshot, type RegistrySnapshotTask } from '../env/real-tasks';

// What a REAL run or evaluation checks before anything starts: the task ids exist and can be scored, a pinned
// registry snapshot (`--task-registry FILE`, written by `halo tasks snapshot`) matches the installed agisdk
// task by task, and the REAL sites answer. Every problem found is reported at once.

/** A registry snapshot read from `file`; its shape is checked so a wrong file is named as such. */
export function loadTaskRegistryFile(file: string): RegistrySnapshot {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(`--task-registry: cannot read ${file}: ${(err as Error).message}`);
  }
  const bad = (what: string) => new ConfigError(`--task-registry: ${file} is not a registry snapshot of \`halo tasks snapshot\` (${what})`);
  if (!raw || typeof raw !== 'object' || !Array.isArray((raw as RegistrySnapshot).tasks)) throw bad('no "tasks" list');
  const snap = raw as RegistrySnapshot;
  if (typeof snap.agisdk_version !== 'string') throw bad('no "agisdk_version"');
  snap.tasks.forEach((t, i) => {
    if (!t || typeof t.id !== 'string' || typeof t.site !== 'string' || typeof t.eval_script !== 'string') throw bad(`tasks[${i}] lacks id, site or eval_script`);
    if (t.eval_sha256 !== null && !/^[0-9a-f]{64}$/.test(String(t.eval_sha256))) throw bad(`tasks[${i}] (${t.id}): eval_sha256 is not a sha256`);
  });
  return snap;
}

/** The snapshot's tasks by site, for --domain: the tasks come from the pinned registry. */
export function snapshotSites(snap: RegistrySnapshot): Record<string, SiteTask[]> {
  const out: Record<string, SiteTask[]> = {};
  for (const t of snap.tasks) {
    out[t.site] ??= [];
    out[t.site].push({ id: t.id, site: t.site, scorable: t.scorable !== false, ...(t.caveats?.length ? { caveats: t.caveats } : {}) });
  }
  return out;
}

const short = (h: string | null) => (h ? `${h.slice(0, 12)}…` : 'none');
const normalise = (id: string) => id.trim().replace(/^v2\./i, '');

/**
 * The run's tasks checked against the pinned snapshot and the installed agisdk: each task must be in the
 * snapshot, scorable there, and installed with the same eval script (name and sha256), goal and start URL.
 * One line per problem, naming the task.
 */
export function pinProblems(
  snap: RegistrySnapshot,
  file: string,
  ids: readonly string[],
  installed: Pick<RealRegistry, 'byId' | 'agisdkVersion'>,
  allowUnscorable = false,
): string[] {
  const pinned = new Map<string, RegistrySnapshotTask>(snap.tasks.map((t) => [t.id, t]));
  const problems: string[] = [];
  for (const id of [...new Set(ids.map(normalise))]) {
    const p = pinned.get(id);
    if (!p) {
      problems.push(`task ${id} is not in the pinned registry ${file} (agisdk ${snap.agisdk_version}, ${snap.tasks.length} tasks)`);
      continue;
    }
    if (p.scorable === false && !allowUnscorable) problems.push(`task ${id} is unscorable in the pinned registry ${file}`);
    const t = installed.byId.get(id);
    if (!t) {
      problems.push(`task ${id}: pinned by ${file} but not in the installed agisdk ${installed.agisdkVersion}`);
      continue;
    }
    if (t.evalScript !== p.eval_script) problems.push(`task ${id}: eval script is ${t.evalScript} in the installed agisdk ${installed.agisdkVersion}, ${p.eval_script} in ${file}`);
    else if (t.evalSha256 !== p.eval_sha256) {
      problems.push(
        `task ${id}: eval script ${t.evalScript} has sha256 ${short(t.evalSha256)} in the installed agisdk ${installed.agisdkVersion}, ${file} pins ${short(p.eval_sha256)}`,
      );
    }
    if (typeof p.goal === 'string' && t.goal !== p.goal) problems.push(`task ${id}: its goal differs between the installed agisdk ${installed.agisdkVersion} and ${file}`);
    if (typeof p.start_url === 'string' && t.startUrl !== p.start_url) problems.push(`task ${id}: start URL ${t.startUrl} in the installed agisdk, ${p.start_url} in ${file}`);
  }
  return problems;
}

export interface SiteProbe {
  site: string;
  origin: string;
}

/** Whether an origin answers HTTP at all (any status counts); the network error otherwise. */
export async function probeOrigin(origin: string, timeoutMs: number): Promise<string | null> {
  try {
    const res = await fetch(origin, { method: 'HEAD', redirect: 'manual', signal: AbortSignal.timeout(timeoutMs) });
    await res.body?.cancel().catch(() => {});
    return null;
  } catch (err) {
    const e = err as Error & { cause?: { code?: string; message?: string } };
    if (e.name === 'TimeoutError') return `no answer within ${Math.round(timeoutMs / 1000)} s`;
    return e.cause?.message || e.cause?.code || e.message;
  }
}

/** One line per site that does not answer. */
export async function unreachableSites(sites: readonly SiteProbe[], timeoutMs = 10_000, probe = probeOrigin): Promise<string[]> {
  const results = await Promise.all(sites.map(async (s) => ({ s, why: await probe(s.origin, timeoutMs) })));
  return results
    .filter((r) => r.why !== null)
    .map(
      (r) =>
        `REAL site ${r.s.site} is unreachable (${r.s.origin}: ${r.why}). REAL tasks run on the live REAL sites, so this machine needs internet access to them: check the network, DNS or proxy, then start again`,
    );
}

export interface RealPreflightOptions {
  /** Task ids as the config names them (`v2.` prefix allowed). */
  tasks: readonly string[];
  /** `--task-registry`: the snapshot and its file name. */
  pin?: { snapshot: RegistrySnapshot; file: string };
  /** HALO_REAL_ORIGIN: the browser workers send every REAL page there, so that is what must answer. */
  originOverride?: string;
  registry?: RealRegistry;
  timeoutMs?: number;
  probe?: typeof probeOrigin;
  /** An unscorable task is no problem (an evaluation names it in its notes). */
  allowUnscorable?: boolean;
  /** What the error's first line says was checked (default "REAL run"). */
  what?: string;
}

/**
 * Every task known and scorable, the pin honoured, every site the tasks live on reachable; otherwise one
 * ConfigError listing every problem, before anything starts.
 */
export async function realPreflight(opts: RealPreflightOptions): Promise<void> {
  const registry = opts.registry ?? loadRealRegistry();
  const problems: string[] = [];
  const sites = new Map<string, string>();
  const siteOrigin = (site: string) => registry.tasks.find((t) => t.site === site)?.origin;
  for (const id of opts.tasks) {
    try {
      const t = getRealTask(id, registry);
      if (!t.scorable && !opts.allowUnscorable) problems.push(`REAL task ${t.id} is unscorable (${t.unscorableReason ?? 'empty eval script'})`);
      sites.set(t.site, t.origin);
    } catch (err) {
      if (!(err instanceof UnknownRealTaskError)) throw err;
      problems.push(err.message);
      // Its site still tells whether the REAL sites can be reached at all.
      const site = normalise(id).replace(/-\d+$/, '');
      const origin = siteOrigin(site);
      if (origin) sites.set(site, origin);
    }
  }
  if (opts.pin) problems.push(...pinProblems(opts.pin.snapshot, opts.pin.file, opts.tasks, registry, opts.allowUnscorable));
  const probes: SiteProbe[] = opts.originOverride
    ? [{ site: `(all sites, HALO_REAL_ORIGIN)`, origin: new URL(opts.originOverride).origin }]
    : [...sites].map(([site, origin]) => ({ site, origin }));
  // The sites first: offline, that is the one thing to fix.
  problems.unshift(...(await unreachableSites(probes, opts.timeoutMs, opts.probe)));
  if (problems.length) throw new ConfigError(`${opts.what ?? 'REAL run'} not started:\n${problems.map((p) => `  ${p}`).join('\n')}`);
}
