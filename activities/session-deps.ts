import type { BlobStore } from '../blob/store';

/** What a browser worker gives its SessionManager (activities/session.ts). */
export interface SessionDeps {
  blobs: BlobStore;
  miniwobBaseUrl: string;
  miniwobTasks: string[];
  /** This worker's own task queue: session activities after the first are routed here. */
  workerTaskQueue: string;
  workerName: string;
  viewport?: { width: number; height: number };
  /** Serve every REAL task from this origin instead of its own (a local mirror, or the test site). */
  realOriginOverride?: string;
  /** Concurrent REAL episodes per site on this worker (all sessions of one episode share its slot). */
  siteConcurrency?: number;
  /** How long a session waits for a site slot; default HALO_SITE_SLOT_TIMEOUT_MS, else 10 minutes. */
  siteSlotTimeoutMs?: number;
  /** A session no activity touched for this long is closed (default 1 hour). */
  sessionIdleMs?: number;
  /**
   * Loaded MiniWoB++ pages kept after their sessions close, for later sessions of the same task to reset in
   * place (0: every session opens a context and loads its page). Default: none (the browser worker sets it).
   */
  warmPages?: number;
  /**
   * Replays with a lived state to check their end against restart without the frame wait and skip their settle
   * waits first (session-replay.ts); false: they never do.
   */
  fastReplay?: boolean;
  miniwobSettleMs?: number;
  /**
   * REAL tasks whose client state after /config is kept, so later starts of the task copy it instead of visiting
   * /config (activities/real-start-states.ts). Default: none (the browser worker sets it).
   */
  realStartStates?: number;
  /** How long a kept REAL start state serves (default 10 minutes). */
  realStartStateTtlMs?: number;
  /** How long a kept page waits to be taken (default 5 minutes). */
  warmIdleMs?: number;
}
