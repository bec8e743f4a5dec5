/**
 * Streaming rollouts (`train.rollout: stream`): which episode starts when, which finished groups an update
 * takes, and what is dropped. Pure (no clock, no I/O, deterministic), so the training workflow drives it with
 * real episodes and `bench/streaming.ts` drives the very same rules in simulated time.
 *
 * - A **unit** is what one group needs complete: with step grouping one episode (its step groups are inside
 *   it), with episode or anchor grouping the `numGenerations` rollouts of one task and seed. An update takes
 *   `batchUnits` complete units; a unit is never split across updates, and each member records the adapter
 *   version it sampled from.
 * - **Slots:** at most `slots` episodes run at once; when one ends, the next starts at once, sampled with the
 *   newest adapter served. Episodes of admitted units wait in a queue until a slot frees.
 * - **Admission** is AReaL's staleness bound (`areal/infra/staleness_manager.py`): a unit is admitted only while
 *   the units admitted and not dropped stay below (k + updates done + 1) × batchUnits. k = 0 admits one batch
 *   per update: today's synchronous iterations.
 * - **Staleness at use:** an update judged against adapter v drops (and counts) a unit sampled from a version
 *   older than v − k; the oldest complete units go first, as in AReaL.
 * - **Failures without bias:** a failed episode starts again in a fresh session up to `episodeRetries` times;
 *   past that its whole unit is dropped (a partial group would bias its baseline) and counted.
 */

export interface StreamSettings {
  /** Complete units per update (train.episodesPerIteration). */
  batchUnits: number;
  /** Episodes per unit: 1 with step grouping, train.numGenerations otherwise. */
  unitSize: number;
  /** Episodes in flight at most (train.parallelism). */
  slots: number;
  /** k: how many updates behind the newest adapter a sample may be when it is used. */
  maxStaleness: number;
  /** Fresh-session attempts after an episode's first. */
  episodeRetries: number;
  /** Updates the whole run makes (train.iterations). */
  updates: number;
}

/** One episode of a unit: `member` of `unit`, its `attempt` (0: first). */
export interface StreamEpisode {
  unit: number;
  member: number;
  attempt: number;
}

/** An episode as it starts: the adapter version it samples from. */
export interface StartedEpisode extends StreamEpisode {
  version: number;
}

export interface StreamUnit<R> {
  unit: number;
  /** Each member's sampled version (null: not started yet). */
  versions: (number | null)[];
  results: (R | null)[];
  attempts: number[];
}

export interface StreamCounters {
  /** Units admitted so far; the next unit's number. */
  admitted: number;
  /** Units handed to updates. */
  consumed: number;
  droppedStale: number;
  droppedFailed: number;
  /** Episodes started again in a fresh session. */
  retried: number;
  /** Batches handed to updates (each update is one). */
  batches: number;
  /** Updates finished: AReaL's version in the admission bound. */
  updatesDone: number;
}

/** What continue-as-new carries: no episode is running (the workflow drains first). */
export interface StreamSnapshot<R> {
  counters: StreamCounters;
  units: StreamUnit<R>[];
  queue: StreamEpisode[];
  /** The counters as the last metrics row reported them. */
  reported: Pick<StreamCounters, 'droppedStale' | 'droppedFailed' | 'retried'>;
}

/** What an update takes: its units (oldest sample first) and what was dropped for staleness on the way. */
export interface StreamBatch<R> {
  units: StreamUnit<R>[];
  /** Lowest and highest sampled version in the batch. */
  versions: [number, number];
  droppedStale: number[];
}

/** Per-update numbers for the metrics row (counts since the previous batch, plus the state now). */
export interface StreamStats {
  in_flight: number;
  queued: number;
  buffered: number;
  groups_dropped_stale: number;
  groups_dropped_failed: number;
  episodes_retried: number;
  min_sampled_version: number;
  max_sampled_version: number;
}

export class RolloutStream<R> {
  readonly counters: StreamCounters;
  private units: StreamUnit<R>[];
  private queue: StreamEpisode[];
  private running = 0;
  private reported: Pick<StreamCounters, 'droppedStale' | 'droppedFailed' | 'retried'>;

  constructor(
    readonly settings: StreamSettings,
    snapshot?: StreamSnapshot<R>,
  ) {
    const s = settings;
    if (s.batchUnits < 1 || s.unitSize < 1 || s.slots < 1 || s.maxStaleness < 0 || s.episodeRetries < 0 || s.updates < 1) {
      throw new RangeError(`invalid stream settings ${JSON.stringify(s)}`);
    }
    this.counters = snapshot ? { ...snapshot.counters } : { admitted: 0, consumed: 0, droppedStale: 0, droppedFailed: 0, retried: 0, batches: 0, updatesDone: 0 };
    this.units = snapshot ? snapshot.units.map((u) => ({ ...u, versions: [...u.versions], results: [...u.results], attempts: [...u.attempts] })) : [];
    this.queue = snapshot ? [...snapshot.queue] : [];
    this.reported = snapshot ? { ...snapshot.reported } : { droppedStale: 0, droppedFailed: 0, retried: 0 };
  }

  get inFlight(): number {
    return this.running;
  }

  get queued(): number {
    return this.queue.length;
  }

  /** Complete units waiting for an update. */
  get buffered(): number {
    return this.units.filter(complete).length;
  }

  /** Units admitted and not dropped: consumed, buffered, running or queued. */
  private live(): number {
    const c = this.counters;
    return c.admitted - c.droppedStale - c.droppedFailed;
  }

  /** Whether the bound lets another unit in (and the run still needs one). */
  admissionOpen(): boolean {
    const s = this.settings;
    const bound = Math.min((s.maxStaleness + this.counters.updatesDone + 1) * s.batchUnits, s.updates * s.batchUnits);
    return this.live() < bound;
  }

  /**
   * The episodes to start now with adapter `version`, filling free slots: queued episodes first, then the
   * members of newly admitted units (`admit` false: none, while pausing, stopping or draining). `lent` slots are
   * in use by other episodes of the run (its evaluation) and stay free of the stream's.
   */
  startable(version: number, admit: boolean, lent = 0): StartedEpisode[] {
    const out: StartedEpisode[] = [];
    while (this.running < this.settings.slots - lent) {
      if (this.queue.length === 0 && admit && this.admissionOpen()) this.admit();
      const next = this.queue.shift();
      if (!next) break;
      const unit = this.unit(next.unit);
      if (!unit) continue; // dropped while its episode waited
      unit.versions[next.member] = version;
      this.running++;
      out.push({ ...next, version });
    }
    return out;
  }

  private admit(): void {
    const n = this.counters.admitted++;
    const size = this.settings.unitSize;
    this.units.push({ unit: n, versions: Array(size).fill(null), results: Array(size).fill(null), attempts: Array(size).fill(0) });
    for (let m = 0; m < size; m++) this.queue.push({ unit: n, member: m, attempt: 0 });
  }

  private unit(n: number): StreamUnit<R> | undefined {
    return this.units.find((u) => u.unit === n);
  }

  /** An episode ended with `result`. A member of a unit dropped meanwhile is ignored. */
  finished(ep: StreamEpisode, result: R): void {
    this.running--;
    const unit = this.unit(ep.unit);
    if (unit && unit.attempts[ep.member] === ep.attempt) unit.results[ep.member] = result;
  }

  /**
   * An episode failed: it goes to the front of the queue for a fresh session while attempts remain ('retry'),
   * otherwise its unit is dropped whole ('dropped'); 'ignored' when its unit is already gone.
   */
  failed(ep: StreamEpisode): 'retry' | 'dropped' | 'ignored' {
    this.running--;
    const unit = this.unit(ep.unit);
    if (!unit || unit.attempts[ep.member] !== ep.attempt) return 'ignored';
    if (ep.attempt < this.settings.episodeRetries) {
      unit.attempts[ep.member] = ep.attempt + 1;
      unit.versions[ep.member] = null;
      this.counters.retried++;
      this.queue.unshift({ unit: ep.unit, member: ep.member, attempt: ep.attempt + 1 });
      return 'retry';
    }
    this.drop(unit);
    this.counters.droppedFailed++;
    return 'dropped';
  }

  private drop(unit: StreamUnit<R>): void {
    this.units = this.units.filter((u) => u !== unit);
    this.queue = this.queue.filter((e) => e.unit !== unit.unit);
  }

  /**
   * The next update's batch when `batchUnits` complete units are within k of adapter `version` (the one the
   * update starts from), oldest sample first; staler complete units are dropped on the way. Null: not yet.
   */
  takeBatch(version: number): StreamBatch<R> | null {
    const s = this.settings;
    const droppedStale: number[] = [];
    for (const u of this.units.filter(complete)) {
      if (version - minVersion(u) > s.maxStaleness) {
        droppedStale.push(u.unit);
        this.drop(u);
        this.counters.droppedStale++;
      }
    }
    const ready = this.units.filter(complete).sort((a, b) => minVersion(a) - minVersion(b) || a.unit - b.unit);
    // Staleness drops without a batch stay counted: the next batch's row reports them.
    if (ready.length < s.batchUnits) return null;
    const units = ready.slice(0, s.batchUnits);
    for (const u of units) this.units = this.units.filter((x) => x !== u);
    this.counters.consumed += units.length;
    this.counters.batches++;
    const versions = units.flatMap((u) => u.versions as number[]);
    return { units, versions: [Math.min(...versions), Math.max(...versions)], droppedStale };
  }

  /** An update (on the last batch taken) finished: the bound moves on by one batch. */
  updated(): void {
    this.counters.updatesDone++;
  }

  /** Whether every update the run makes has taken its batch. */
  get allBatchesTaken(): boolean {
    return this.counters.batches >= this.settings.updates;
  }

  /** The metrics row's stream numbers for `batch`: counts since the last row, and what is in flight now. */
  stats(batch: StreamBatch<R>): StreamStats {
    const c = this.counters;
    const out: StreamStats = {
      in_flight: this.running,
      queued: this.queue.length,
      buffered: this.buffered,
      groups_dropped_stale: c.droppedStale - this.reported.droppedStale,
      groups_dropped_failed: c.droppedFailed - this.reported.droppedFailed,
      episodes_retried: c.retried - this.reported.retried,
      min_sampled_version: batch.versions[0],
      max_sampled_version: batch.versions[1],
    };
    this.reported = { droppedStale: c.droppedStale, droppedFailed: c.droppedFailed, retried: c.retried };
    return out;
  }

  /** The state continue-as-new carries; only when nothing runs (the workflow drains first). */
  snapshot(): StreamSnapshot<R> {
    if (this.running > 0) throw new Error(`cannot snapshot a stream with ${this.running} episodes in flight`);
    return { counters: { ...this.counters }, units: this.units, queue: this.queue, reported: { ...this.reported } };
  }
}

function complete<R>(u: StreamUnit<R>): boolean {
  return u.results.every((r) => r !== null);
}

function minVersion<R>(u: StreamUnit<R>): number {
  return Math.min(...(u.versions as number[]));
}
