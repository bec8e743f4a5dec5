/**
 * Per-site (per-origin) admission for the REAL clones, which are third-party hosted services: at most `limit`
 * episodes of one origin hold a slot at a time in this process; others wait in FIFO order.
 *
 * A slot belongs to an episode, not to a session. Every session of one episode (its main session, the forks
 * of a step group, the simulations of a search) names the same holder and shares the holder's slot, counted
 * by reference: an episode that holds a slot is admitted again at once, so a step group never waits for the
 * slot its own main session holds. The slot is freed when the holder's last session lets go of it.
 */

/** How long a session waits for a slot when HALO_SITE_SLOT_TIMEOUT_MS does not say. */
export const DEFAULT_SITE_SLOT_TIMEOUT_MS = 10 * 60_000;

/** HALO_SITE_SLOT_TIMEOUT_MS, or the default; anything but a positive integer is a configuration error. */
export function siteSlotTimeoutFromEnv(env: Record<string, string | undefined> = process.env): number {
  const raw = env.HALO_SITE_SLOT_TIMEOUT_MS;
  if (raw === undefined || raw.trim() === '') return DEFAULT_SITE_SLOT_TIMEOUT_MS;
  const ms = Number(raw);
  if (!Number.isInteger(ms) || ms < 1) throw new Error(`HALO_SITE_SLOT_TIMEOUT_MS must be a whole number of milliseconds >= 1, got ${JSON.stringify(raw)}`);
  return ms;
}

/**
 * The slot holder of a session's episode id. An MCTS search opens `<search>#<sim>` (one search is one
 * episode), and a test-time search runs as `<episode>-search<step>` while its episode keeps its own session
 * open: it belongs to that episode, or the search would wait for the slot of the episode waiting for it.
 */
export function slotHolder(episodeId: string): string {
  return episodeId.replace(/#\d+$/, '').replace(/-search\d+$/, '');
}

export class SiteSlotTimeoutError extends Error {
  readonly origin: string;
  constructor(origin: string, limit: number, waitedMs: number, holders: string[], waiting: number) {
    const shown = holders.slice(0, 4).join(', ') + (holders.length > 4 ? ', …' : '');
    const held = holders.length === 1 ? '1 episode holds' : `${holders.length} episodes hold`;
    super(
      `no free slot for ${origin} after ${waitedMs} ms: ${held} all ${limit} slots of this browser worker` +
        ` (${shown}), ${waiting} more waiting. Each browser worker admits HALO_SITE_CONCURRENCY (${limit}) episodes per site:` +
        ` raise it where the site can take the load, lower train.parallelism (mcts.parallelism), or add browser workers;` +
        ` HALO_SITE_SLOT_TIMEOUT_MS sets how long a session waits`,
    );
    this.name = 'SiteSlotTimeoutError';
    this.origin = origin;
  }
}

export interface AcquireOptions {
  /** The episode the session belongs to (see `slotHolder`); without one, the call is an episode of its own. */
  holder?: string;
  /** Give up after this long (SiteSlotTimeoutError); default: wait forever. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Releases one reference to a slot; calling it more than once is harmless. */
export type ReleaseSlot = () => void;

interface Holder {
  name: string;
  /** Sessions holding the slot. */
  refs: number;
  granted: boolean;
  /** Calls of a holder still in the queue, all admitted together. */
  waiters: Set<() => void>;
}

interface SiteState {
  holders: Map<string, Holder>;
  /** Holders waiting for a slot, first come first served. */
  queue: Holder[];
  active: number;
}

/** The key of a URL or origin string: its origin (`https://host[:port]`). */
export function siteKey(urlOrOrigin: string): string {
  try {
    return new URL(urlOrOrigin).origin;
  } catch {
    return urlOrOrigin;
  }
}

export class SiteLimiter {
  private readonly sites = new Map<string, SiteState>();
  private unnamed = 0;

  /** `limit`: slots per origin, or per-origin limits with a `default`. */
  constructor(private readonly limit: number | { default: number; [origin: string]: number }) {
    const values = typeof limit === 'number' ? [limit] : Object.values(limit);
    for (const v of values) {
      if (!Number.isInteger(v) || v < 1) throw new Error(`site concurrency limit must be an integer >= 1, got ${v}`);
    }
  }

  limitFor(origin: string): number {
    const key = siteKey(origin);
    return typeof this.limit === 'number' ? this.limit : (this.limit[key] ?? this.limit.default);
  }

  /** Slots in use and episodes waiting for one, for an origin. */
  stats(origin: string): { active: number; waiting: number; limit: number } {
    const s = this.sites.get(siteKey(origin));
    return { active: s?.active ?? 0, waiting: s?.queue.length ?? 0, limit: this.limitFor(origin) };
  }

  /** The holders of an origin's slots and how many sessions each has. */
  holders(origin: string): { holder: string; sessions: number }[] {
    const s = this.sites.get(siteKey(origin));
    return [...(s?.holders.values() ?? [])].filter((h) => h.granted).map((h) => ({ holder: h.name, sessions: h.refs }));
  }

  async acquire(origin: string, opts: AcquireOptions = {}): Promise<ReleaseSlot> {
    opts.signal?.throwIfAborted();
    const key = siteKey(origin);
    const limit = this.limitFor(key);
    // An unnamed call gets a name no episode id can have.
    const name = opts.holder ?? `\u0000unnamed-${++this.unnamed}`;
    let state = this.sites.get(key);
    if (!state) {
      state = { holders: new Map(), queue: [], active: 0 };
      this.sites.set(key, state);
    }
    const site = state;
    let h = site.holders.get(name);
    if (h?.granted) {
      h.refs++;
      return this.releaser(key, site, h);
    }
    if (!h && site.active < limit && site.queue.length === 0) {
      h = { name, refs: 1, granted: true, waiters: new Set() };
      site.holders.set(name, h);
      site.active++;
      return this.releaser(key, site, h);
    }
    if (!h) {
      h = { name, refs: 0, granted: false, waiters: new Set() };
      site.holders.set(name, h);
      site.queue.push(h);
    }
    const holder = h;
    const started = Date.now();
    return new Promise<ReleaseSlot>((ok, fail) => {
      let timer: NodeJS.Timeout | undefined;
      const stopWaiting = (): void => {
        if (timer) clearTimeout(timer);
        opts.signal?.removeEventListener('abort', onAbort);
        holder.waiters.delete(grant);
      };
      const grant = (): void => {
        stopWaiting();
        holder.refs++;
        ok(this.releaser(key, site, holder));
      };
      // The last call of a queued holder that gives up takes the holder out of the queue.
      const giveUp = (err: unknown): void => {
        stopWaiting();
        if (!holder.granted && holder.waiters.size === 0) {
          const i = site.queue.indexOf(holder);
          if (i >= 0) site.queue.splice(i, 1);
          if (site.holders.get(holder.name) === holder) site.holders.delete(holder.name);
          this.gc(key, site);
        }
        fail(err);
      };
      const onAbort = (): void => giveUp(opts.signal?.reason ?? new Error('aborted'));
      holder.waiters.add(grant);
      if (opts.timeoutMs !== undefined) {
        timer = setTimeout(() => {
          const names = [...site.holders.values()].filter((x) => x.granted).map((x) => (x.name.startsWith('\u0000') ? '(unnamed)' : x.name));
          giveUp(new SiteSlotTimeoutError(key, limit, Date.now() - started, names, site.queue.length - (site.queue.includes(holder) ? 1 : 0)));
        }, opts.timeoutMs);
      }
      opts.signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Runs `fn` while holding a slot for `origin`. */
  async run<T>(origin: string, fn: () => Promise<T>, opts: AcquireOptions = {}): Promise<T> {
    const release = await this.acquire(origin, opts);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  private releaser(key: string, site: SiteState, holder: Holder): ReleaseSlot {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      if (--holder.refs > 0) return;
      if (site.holders.get(holder.name) === holder) site.holders.delete(holder.name);
      site.active--;
      this.admitNext(key, site);
      this.gc(key, site);
    };
  }

  private admitNext(key: string, site: SiteState): void {
    const limit = this.limitFor(key);
    while (site.queue.length > 0 && site.active < limit) {
      const next = site.queue.shift()!;
      next.granted = true;
      site.active++;
      for (const grant of [...next.waiters]) grant();
    }
  }

  private gc(key: string, site: SiteState): void {
    if (site.active === 0 && site.queue.length === 0 && this.sites.get(key) === site) this.sites.delete(key);
  }
}
