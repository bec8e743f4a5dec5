/**
 * A per-site (per-origin) concurrency cap for the REAL clones, which are third-party hosted services: at
 * most `limit` episodes of one origin hold a slot at a time in this process; others wait in FIFO order.
 */

export class SiteSlotTimeoutError extends Error {
  constructor(origin: string, limit: number, waitedMs: number) {
    super(`no free slot for ${origin} after ${waitedMs} ms (at most ${limit} concurrent episodes per site)`);
    this.name = 'SiteSlotTimeoutError';
  }
}

export interface AcquireOptions {
  /** Give up after this long (SiteSlotTimeoutError); default: wait forever. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Releases a slot; calling it more than once is harmless. */
export type ReleaseSlot = () => void;

interface Waiter {
  grant: () => void;
}

interface SiteState {
  active: number;
  queue: Waiter[];
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

  /** Slots in use and waiters for an origin. */
  stats(origin: string): { active: number; waiting: number; limit: number } {
    const s = this.sites.get(siteKey(origin));
    return { active: s?.active ?? 0, waiting: s?.queue.length ?? 0, limit: this.limitFor(origin) };
  }

  async acquire(origin: string, opts: AcquireOptions = {}): Promise<ReleaseSlot> {
    const key = siteKey(origin);
    const limit = this.limitFor(key);
    let s = this.sites.get(key);
    if (!s) {
      s = { active: 0, queue: [] };
      this.sites.set(key, s);
    }
    const state = s;
    opts.signal?.throwIfAborted();
    if (state.active < limit && state.queue.length === 0) {
      state.active++;
      return this.releaser(key, state);
    }
    const started = Date.now();
    return new Promise<ReleaseSlot>((ok, fail) => {
      let timer: NodeJS.Timeout | undefined;
      const onAbort = (): void => {
        cleanup();
        fail(opts.signal?.reason ?? new Error('aborted'));
      };
      const waiter: Waiter = {
        grant: () => {
          if (timer) clearTimeout(timer);
          opts.signal?.removeEventListener('abort', onAbort);
          state.active++;
          ok(this.releaser(key, state));
        },
      };
      const cleanup = (): void => {
        if (timer) clearTimeout(timer);
        opts.signal?.removeEventListener('abort', onAbort);
        const i = state.queue.indexOf(waiter);
        if (i >= 0) state.queue.splice(i, 1);
        this.gc(key, state);
      };
      if (opts.timeoutMs !== undefined) {
        timer = setTimeout(() => {
          cleanup();
          fail(new SiteSlotTimeoutError(key, limit, Date.now() - started));
        }, opts.timeoutMs);
      }
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      state.queue.push(waiter);
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

  private releaser(key: string, state: SiteState): ReleaseSlot {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      state.active--;
      const next = state.queue.shift();
      if (next) next.grant();
      else this.gc(key, state);
    };
  }

  private gc(key: string, state: SiteState): void {
    if (state.active === 0 && state.queue.length === 0 && this.sites.get(key) === state) this.sites.delete(key);
  }
}
