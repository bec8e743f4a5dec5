import type { Browser, BrowserContext } from 'playwright-core';
import type { MiniWobEnv } from '../env/miniwob';
import { episodeMaxTimeMs } from '../env/miniwob-scoring';
import type { EnvOptions, TaskRef } from '../lib/episode/episode-types';

/** Loaded MiniWoB++ pages a browser worker keeps after their sessions close (0 turns the pool off). */
export const DEFAULT_WARM_PAGES = 16;
/** A pooled page nobody took for this long is closed. */
export const DEFAULT_WARM_IDLE_MS = 5 * 60_000;

export interface WarmPage {
  key: string;
  context: BrowserContext;
  env: MiniWobEnv;
  browser: Browser;
  since: number;
}

/**
 * Which pooled pages can serve a start: the same task page, loaded with the same time limit and reward mode
 * (both are fixed when the page's environment is made). The seed is not part of it: a MiniWoB++ page starts
 * an episode of any seed in place.
 */
export function warmKey(spec: TaskRef, envOptions: Pick<EnvOptions, 'miniwobTimeLimit' | 'miniwobReward'> | undefined): string | undefined {
  if (spec.env !== 'miniwob') return undefined;
  return JSON.stringify([spec.task, episodeMaxTimeMs(envOptions?.miniwobTimeLimit), envOptions?.miniwobReward ?? 'raw']);
}

/** The key a page serves: the task it has loaded, with the options its environment was made with. */
export function pageKey(env: MiniWobEnv): string | undefined {
  const task = env.loadedTask;
  return task === undefined ? undefined : JSON.stringify([task, env.episodeMaxTimeMs, env.rewardMode]);
}

/**
 * Closed sessions' pages, kept loaded so the next session of the same task resets in place instead of opening
 * a context and loading the page (most of a one-step episode's browser time). A pooled page is no session: it
 * has no id, no episode and no path, so losing it (a crash, a worker that dies) loses nothing.
 */
export class WarmPages {
  private readonly pages: WarmPage[] = [];
  readonly counters = { warm_starts: 0, cold_starts: 0, warm_misses: 0 };

  constructor(
    readonly limit: number,
    private readonly idleMs: number,
  ) {
    if (!(Number.isInteger(limit) && limit >= 0)) throw new Error(`warm page limit must be a whole number >= 0, got ${limit}`);
  }

  get size(): number {
    return this.pages.length;
  }

  /** Keeps a page; the oldest one goes when the pool is full. False: not kept (the caller closes it). */
  put(page: Omit<WarmPage, 'since'>, now = Date.now()): boolean {
    if (this.limit === 0 || page.env.page.isClosed() || !page.browser.isConnected()) return false;
    this.pages.push({ ...page, since: now });
    while (this.pages.length > this.limit) void closeWarm(this.pages.shift() as WarmPage);
    return true;
  }

  /** The most recently kept page of this key, taken out of the pool. */
  take(key: string): WarmPage | undefined {
    for (let i = this.pages.length - 1; i >= 0; i--) {
      if (this.pages[i].key !== key) continue;
      return this.pages.splice(i, 1)[0];
    }
    return undefined;
  }

  /** Closes pages idle for longer than the pool keeps them, and those of a browser that is gone. */
  async sweep(now = Date.now(), gone?: Browser): Promise<void> {
    const stale = this.pages.filter((p) => p.browser === gone || !p.browser.isConnected() || now - p.since > this.idleMs);
    for (const p of stale) this.pages.splice(this.pages.indexOf(p), 1);
    await Promise.all(stale.map(closeWarm));
  }

  async closeAll(): Promise<void> {
    await Promise.all(this.pages.splice(0).map(closeWarm));
  }
}

export async function closeWarm(p: Pick<WarmPage, 'env' | 'context'>): Promise<void> {
  await p.env.close().catch(() => {});
  await p.context.close().catch(() => {});
}

/** `HALO_WARM_PAGES`: the browser worker's pool size (unset: the default; 0: every session loads its page). */
export function warmPagesFromEnv(value = process.env.HALO_WARM_PAGES): number {
  if (value === undefined || value === '') return DEFAULT_WARM_PAGES;
  const n = Number(value);
  if (!(Number.isInteger(n) && n >= 0)) throw new Error(`HALO_WARM_PAGES must be a whole number >= 0 (0 turns the pool off), got ${JSON.stringify(value)}`);
  return n;
}
