import type { StartSessionInput } from '../lib/episode/episode-types';
import type { ClientSnapshot } from '../env/real-snapshot';

/** REAL tasks whose start state a browser worker keeps (0 turns it off). */
export const DEFAULT_REAL_START_STATES = 32;
/** A kept start state older than this is taken again from /config (the site's clock and data move on). */
export const DEFAULT_REAL_START_STATE_TTL_MS = 10 * 60_000;
/**
 * The bytes of all kept start states together (their JSON): a site's localStorage can hold megabytes, and 32 of
 * them per browser worker would otherwise grow without a bound the operator can see.
 */
export const DEFAULT_REAL_START_STATE_BYTES = 64 * 2 ** 20;
/** Tasks remembered as refused at most; the oldest refusal goes first (it is the first to expire anyway). */
export const MAX_REFUSED_START_STATES = 1024;

/**
 * REAL's warm start. A REAL task starts from the same client state every time: /config writes it into the
 * browser's storage and the site root renders it. The first start of a task on a worker goes through /config
 * (its network-idle wait alone is 0.5 s) and keeps a copy of that state; later starts of the task with the same
 * run id open a context seeded with the copy, like a step group's fork, and keep it only if /finish then renders
 * what it rendered at the first start. Else the start goes through /config, and so do the task's starts for the
 * next `ttlMs`: a site whose state cannot be copied would otherwise pay for a copy and a /config visit every time.
 * A lost copy loses nothing: the next start takes it again. Off where forks are (`real.forkMode: replay`).
 */
export class RealStartStates {
  private readonly states = new Map<string, { snap: ClientSnapshot; since: number; bytes: number }>();
  private keptBytes = 0;
  /** Tasks whose copy differed, until when they start through /config. */
  private readonly refused = new Map<string, number>();
  /** Starts from a kept copy, and copies whose /finish differed (those starts went through /config). */
  readonly counters = { start_state_copies: 0, start_state_misses: 0 };

  constructor(
    readonly limit: number,
    private readonly ttlMs: number = DEFAULT_REAL_START_STATE_TTL_MS,
    readonly maxBytes: number = DEFAULT_REAL_START_STATE_BYTES,
  ) {
    if (!(Number.isInteger(limit) && limit >= 0)) throw new Error(`REAL start state limit must be a whole number >= 0, got ${limit}`);
    if (!(Number.isInteger(maxBytes) && maxBytes > 0)) throw new Error(`REAL start state byte cap must be a whole number > 0, got ${maxBytes}`);
  }

  /** Which kept state can start `input`: the task with its run id (/config's query), when copies are allowed. */
  key(input: StartSessionInput): string | undefined {
    if (this.limit === 0 || input.spec.env !== 'real') return undefined;
    // Official scoring copies no state: agisdk starts every episode from /config.
    if ((input.envOptions?.realForkMode ?? 'snapshot') !== 'snapshot' || input.envOptions?.realScoring === 'official') return undefined;
    return JSON.stringify([input.spec.task, input.envOptions?.realRunId ?? '0']);
  }

  get(key: string, now = Date.now()): ClientSnapshot | undefined {
    const kept = this.states.get(key);
    if (!kept || this.isRefused(key, now)) return undefined;
    if (now - kept.since <= this.ttlMs) return kept.snap;
    this.drop(key);
    return undefined;
  }

  /** Whether a start through /config should keep its state: none is kept for the task, and it is not refused. */
  wants(key: string, now = Date.now()): boolean {
    return this.limit > 0 && !this.isRefused(key, now) && this.get(key, now) === undefined;
  }

  /** Keeps a task's start state; the ones kept longest go while there are more than `limit` or `maxBytes`. */
  put(key: string, snap: ClientSnapshot, now = Date.now()): void {
    if (this.limit === 0 || snap.steps !== 0 || this.isRefused(key, now)) return;
    this.drop(key);
    const bytes = Buffer.byteLength(JSON.stringify(snap));
    if (bytes > this.maxBytes) return; // alone over the cap: its starts go through /config
    this.states.set(key, { snap, since: now, bytes });
    this.keptBytes += bytes;
    while (this.states.size > this.limit || this.keptBytes > this.maxBytes) this.drop(this.states.keys().next().value as string);
  }

  /** The task's copy started no session (another /finish, a page that failed): dropped, and none is kept for `ttlMs`. */
  refuse(key: string, now = Date.now()): void {
    this.drop(key);
    this.refused.delete(key);
    this.refused.set(key, now + this.ttlMs);
    if (this.refused.size > MAX_REFUSED_START_STATES) {
      for (const [k, until] of this.refused) if (now >= until) this.refused.delete(k);
      while (this.refused.size > MAX_REFUSED_START_STATES) this.refused.delete(this.refused.keys().next().value as string);
    }
  }

  private drop(key: string): void {
    const kept = this.states.get(key);
    if (!kept) return;
    this.states.delete(key);
    this.keptBytes -= kept.bytes;
  }

  private isRefused(key: string, now: number): boolean {
    const until = this.refused.get(key);
    if (until !== undefined && now >= until) this.refused.delete(key);
    return until !== undefined && now < until;
  }

  get size(): number {
    return this.states.size;
  }

  /** The bytes of the kept states (their JSON). */
  get bytes(): number {
    return this.keptBytes;
  }

  /** Tasks remembered as refused. */
  get refusedCount(): number {
    return this.refused.size;
  }
}

/** `HALO_REAL_START_STATES`: how many REAL tasks' start states a browser worker keeps (0: every start visits /config). */
export function realStartStatesFromEnv(value = process.env.HALO_REAL_START_STATES): number {
  if (value === undefined || value === '') return DEFAULT_REAL_START_STATES;
  const n = Number(value);
  if (!(Number.isInteger(n) && n >= 0)) throw new Error(`HALO_REAL_START_STATES must be a whole number >= 0 (0 turns it off), got ${JSON.stringify(value)}`);
  return n;
}
