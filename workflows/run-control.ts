import { condition, setHandler } from '@temporalio/workflow';
import type { BestEval } from '../lib/serving/iteration-policy';
import { pauseSignal, pauseUpdate, resumeSignal, resumeUpdate, statusQuery, stopSignal, stopUpdate, type RunStatus } from './messages';
import { workflowClockMs } from './clock';

/** How a training run (GRPO or MCTS) ends. */
export interface TrainingResult {
  runId: string;
  iterations: number;
  adapterVersion: number;
  stoppedEarly: boolean;
  /** With held-out evaluations: the adapter they scored best (the latest of equals), which may not be the latest. */
  best?: BestEval;
}

/**
 * Pause, resume, stop and status for a long-running workflow, in one place. Handlers are installed by the
 * constructor, so a run answers `status` and takes signals from its first moment (before its config is
 * even loaded). Phase timings use the workflow clock (deterministic on replay).
 */
export class RunControl<Extra extends object = object> {
  phase = 'starting';
  paused = false;
  stopping = false;
  /** Set when the run paused itself; cleared by resume. */
  pauseReason: string | undefined;
  /** Workflow-clock seconds per phase of the current unit of work. */
  seconds: Record<string, number> = {};
  private extra: () => Extra & { runId: string };

  /** `initial`: what the previous run of a continue-as-new chain had been told, so no signal is lost across it. */
  constructor(runId: string, initial?: { paused?: boolean; stopping?: boolean }) {
    this.paused = initial?.paused ?? false;
    this.stopping = initial?.stopping ?? false;
    this.extra = () => ({ runId }) as Extra & { runId: string };
    const pause = () => {
      this.paused = true;
    };
    const resume = () => {
      this.paused = false;
      this.pauseReason = undefined;
    };
    const stop = () => {
      this.stopping = true;
    };
    setHandler(pauseSignal, pause);
    setHandler(resumeSignal, resume);
    setHandler(stopSignal, stop);
    // Updates answer with the status after the change (they add no command: histories from before replay).
    setHandler(pauseUpdate, () => {
      pause();
      return this.status();
    });
    setHandler(resumeUpdate, () => {
      resume();
      return this.status();
    });
    setHandler(stopUpdate, () => {
      stop();
      return this.status();
    });
    setHandler(statusQuery, () => this.status());
  }

  /** The workflow's own status fields, read at query time. */
  describe(extra: () => Extra & { runId: string }): void {
    this.extra = extra;
  }

  status(): Extra & RunStatus {
    return { ...this.extra(), phase: this.phase, paused: this.paused, stopping: this.stopping, ...(this.pauseReason ? { pauseReason: this.pauseReason } : {}) };
  }

  /** Waits while paused (a stop ends the wait too); returns whether the run should go on. */
  async proceed(): Promise<boolean> {
    if (this.paused && !this.stopping) {
      const before = this.phase;
      this.phase = 'paused';
      await condition(() => !this.paused || this.stopping);
      this.phase = before;
    }
    return !this.stopping;
  }

  /**
   * Checks free disk before an iteration: below the threshold the run pauses itself with the reason in its
   * status, instead of failing half-written; a resume checks again. Returns whether the run should go on.
   */
  async waitForDisk(check: () => Promise<{ ok: boolean; freeBytes: number; minFreeBytes: number; path: string }>): Promise<boolean> {
    for (;;) {
      const disk = await check();
      if (disk.ok) return !this.stopping;
      const gib = (n: number) => `${(n / 2 ** 30).toFixed(2)} GiB`;
      this.pauseReason =
        `disk almost full: ${gib(disk.freeBytes)} free at ${disk.path}, below stack.minFreeDiskGiB (${gib(disk.minFreeBytes)}); ` +
        `free space (halo gc removes unreferenced blobs) and resume the run`;
      this.paused = true;
      if (!(await this.proceed())) return false;
    }
  }

  /**
   * The run's result when the iteration just finished ends it (stopped, or the last one); null when the run
   * goes on to `iteration + 1`.
   */
  ended(runId: string, iteration: number, iterations: number, adapterVersion: number): TrainingResult | null {
    if (!this.stopping && iteration < iterations) return null;
    return { runId, iterations: iteration, adapterVersion, stoppedEarly: iteration < iterations };
  }

  /**
   * Runs `fn` as phase `name`, adding its workflow-clock duration to `into[key]` (by default this run's
   * `seconds`; phases of two iterations that overlap keep their own).
   */
  async timed<T>(name: string, fn: () => Promise<T>, key = name, into: Record<string, number> = this.seconds): Promise<T> {
    this.phase = name;
    const t0 = workflowClockMs();
    try {
      return await fn();
    } finally {
      into[key] = (into[key] ?? 0) + (workflowClockMs() - t0) / 1000;
    }
  }
}
