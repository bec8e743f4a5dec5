import type { SessionHandle } from '../lib/episode/episode-types';
import type { DurableSession, Sessions } from './durable-session';
import type { SessionReuseCounters } from '../lib/search/mcts-search';
import type { ParkedSpot } from '../lib/search/parked-choice';

/** A parked session, or one being reset to `node` in the background (`session` settles when it is there). */
export interface Parked {
  /** Null for a new session still being opened. */
  handle: SessionHandle | null;
  node: number | null;
  /** When the session's episode began (workflow clock). */
  begunAt: number;
  /** Undefined when a background reset failed (the session is gone). */
  session: Promise<DurableSession | undefined>;
  /** Still being reset in the background. */
  preparing: boolean;
}

/**
 * Browser sessions an MCTS search keeps open between simulations, least recently used first, each tagged
 * with the tree node it is at (null: past the tree or its episode ended). Opening a session costs a new
 * browser context and page load; most restores can instead take one of these (lib/search/parked-choice.ts).
 * Workflow state only: all are closed before a continue-as-new and at the end.
 */
export class ParkedSessions {
  private parked: Parked[] = [];

  constructor(
    private readonly sessions: Sessions,
    readonly limit: number,
    /** Past this age (workflow clock, from the episode's reset) a session serves resets only (lib/search/parked-choice.ts `parkedMaxAgeMs`). */
    private readonly maxAgeMs: number,
    /**
     * Where the spares' browser work is counted: the search's counters (a getter, since a continued search
     * replaces them with its snapshot's). Absent: not counted.
     */
    private readonly reuse?: () => SessionReuseCounters,
  ) {}

  get size(): number {
    return this.parked.length;
  }

  spots(now: number): (ParkedSpot & { busy: boolean })[] {
    return this.parked.map((p) => ({ node: now - p.begunAt < this.maxAgeMs ? p.node : null, busy: p.preparing }));
  }

  /** Removes the `index`-th session (of `spots()`) and hands it over. */
  take(index: number): Parked {
    const [p] = this.parked.splice(index, 1);
    if (!p) throw new RangeError(`no parked session ${index} (${this.parked.length} parked)`);
    return p;
  }

  /** Keeps a session as the most recently used; the least recently used beyond the limit are closed. */
  park(session: DurableSession, node: number | null, begunAt: number): void {
    this.keep({ handle: session.handle, node, begunAt, session: Promise.resolve(session), preparing: false });
  }

  /** Keeps a session that a background reset is bringing to `node` (`session` must never reject). */
  prepare(handle: SessionHandle | null, node: number, begunAt: number, session: Promise<DurableSession | undefined>): void {
    const entry: Parked = { handle, node, begunAt, session, preparing: true };
    void session.then((s) => {
      entry.preparing = false;
      if (s) this.countSpare(s, handle === null);
    });
    this.keep(entry);
  }

  /**
   * A spare that got to its node: a new session (`opened`) or a parked one reset in place, either way having
   * replayed the root path and the node's path. Counted here, before anything else waits on the spare, so a
   * snapshot taken after `closeAll` and `flush` has it.
   */
  private countSpare(s: DurableSession, opened: boolean): void {
    const r = this.reuse?.();
    if (!r) return;
    if (opened) r.spareSessions = (r.spareSessions ?? 0) + 1;
    r.spareReplayedActions = (r.spareReplayedActions ?? 0) + (this.sessions.settings.base?.length ?? 0) + s.path.length;
  }

  private keep(entry: Parked): void {
    this.parked.push(entry);
    while (this.parked.length > this.limit) this.close(this.parked.shift()!);
  }

  /** A worker that lost one session most likely lost all of them: they are dropped without waiting for it. */
  dropQueue(taskQueue: string): void {
    const lost = (p: Parked) => p.handle?.taskQueue === taskQueue;
    for (const p of this.parked.filter(lost)) void p.session.then((s) => s && this.sessions.closeAndForget(s.handle));
    this.parked = this.parked.filter((p) => !lost(p));
  }

  /** Closes every parked session in the background (the caller's `sessions.flush()` waits for them). */
  closeAll(): void {
    for (const p of this.parked.splice(0)) this.close(p);
  }

  /** Closed once any background reset is over (a close in the middle of one would only make it fail). */
  private close(p: Parked): void {
    this.sessions.closeWhenReady(p.session);
  }
}
