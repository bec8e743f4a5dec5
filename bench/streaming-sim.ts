/**
 * Synchronous iterations, pipelined iterations and streaming rollouts in simulated time: the stream is driven by
 * the very rules the training workflow runs (lib/training/rollout-stream.ts); the iterations are today's engine (an
 * iteration runs its episodes through the slots and ends with its slowest; pipelined: the next iteration's
 * episodes run beside the update on the previous one). Every mode plays the same episodes (lengths keyed by
 * the unit and member number), so the comparison is paired.
 *
 * Assumptions: a policy call takes the same time whatever else runs (a served policy beside the learner, as
 * `configs/grpo-real.yaml`), a step is one policy call plus one browser step, an update a fixed time.
 */
import { fnv1a32 } from '../lib/rewards/shaping';
import { RolloutStream, type StreamSettings } from '../lib/training/rollout-stream';

export interface SimParams {
  slots: number;
  /** Groups per update. */
  batchUnits: number;
  /** Episodes per group: 1 with step grouping, numGenerations with episode grouping. */
  unitSize: number;
  updates: number;
  policySeconds: number;
  envSeconds: number;
  updateSeconds: number;
  /** Steps of episode `member` of unit `unit`. */
  length: (unit: number, member: number) => number;
}

export type SimMode = { kind: 'iterations'; pipelined: boolean } | { kind: 'stream'; k: number };

export interface SimResult {
  mode: string;
  seconds: number;
  groupsPerHour: number;
  /** Busy slot-seconds over slots × wall time. */
  envUtilisation: number;
  meanStaleness: number;
  droppedStale: number;
}

/**
 * Long-tailed REAL-like episode lengths: a log-normal with median `median` steps and spread `sigma`, rounded and
 * clipped to [min, max]; deterministic in (seed, unit, member).
 */
export function longTailedLengths(seed: number, o = { median: 5, sigma: 0.9, min: 2, max: 25 }): (unit: number, member: number) => number {
  return (unit, member) => {
    const u1 = (parseInt(fnv1a32(`${seed}:${unit}:${member}:a`), 16) + 0.5) / 2 ** 32;
    const u2 = (parseInt(fnv1a32(`${seed}:${unit}:${member}:b`), 16) + 0.5) / 2 ** 32;
    const z = Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
    return Math.min(o.max, Math.max(o.min, Math.round(o.median * Math.exp(o.sigma * z))));
  };
}

export function simulate(mode: SimMode, p: SimParams): SimResult {
  return mode.kind === 'stream' ? simulateStream(mode.k, p) : simulateIterations(mode.pipelined, p);
}

const stepSeconds = (p: SimParams) => p.policySeconds + p.envSeconds;

function result(mode: string, p: SimParams, seconds: number, busy: number, staleness: number[], droppedStale: number): SimResult {
  return {
    mode,
    seconds,
    groupsPerHour: (p.updates * p.batchUnits * 3600) / seconds,
    envUtilisation: busy / (p.slots * seconds),
    meanStaleness: staleness.reduce((a, b) => a + b, 0) / staleness.length,
    droppedStale,
  };
}

/** One iteration's episodes through the slots from time `t0`: when the slowest ends, and the busy slot-seconds. */
function runIteration(p: SimParams, it: number, t0: number): { end: number; busy: number } {
  const free = Array(p.slots).fill(t0);
  let busy = 0;
  for (let j = 0; j < p.batchUnits; j++) {
    for (let m = 0; m < p.unitSize; m++) {
      const d = p.length(it * p.batchUnits + j, m) * stepSeconds(p);
      const slot = free.indexOf(Math.min(...free));
      free[slot] += d;
      busy += d;
    }
  }
  return { end: Math.max(...free), busy };
}

function simulateIterations(pipelined: boolean, p: SimParams): SimResult {
  let t = 0;
  let busy = 0;
  const staleness: number[] = [];
  if (!pipelined) {
    for (let it = 0; it < p.updates; it++) {
      const r = runIteration(p, it, t);
      busy += r.busy;
      t = r.end + p.updateSeconds;
      staleness.push(0);
    }
    return result('iterations', p, t, busy, staleness, 0);
  }
  // Iteration i + 1 collects while the update on iteration i runs; each run waits for both halves.
  let collected = runIteration(p, 0, 0);
  busy += collected.busy;
  t = collected.end;
  staleness.push(0);
  for (let it = 1; it < p.updates; it++) {
    collected = runIteration(p, it, t);
    busy += collected.busy;
    t = Math.max(collected.end, t + p.updateSeconds);
    staleness.push(1);
  }
  return result('iterations, pipelined (k = 1)', p, t + p.updateSeconds, busy, staleness, 0);
}

function simulateStream(k: number, p: SimParams): SimResult {
  const settings: StreamSettings = { batchUnits: p.batchUnits, unitSize: p.unitSize, slots: p.slots, maxStaleness: k, episodeRetries: 0, updates: p.updates };
  const s = new RolloutStream<number>(settings);
  const ends: { t: number; unit: number; member: number; attempt: number }[] = [];
  let t = 0;
  let busy = 0;
  let version = 0;
  let updateEnd: number | null = null;
  const staleness: number[] = [];
  for (;;) {
    for (const ep of s.startable(version, true)) {
      const d = p.length(ep.unit, ep.member) * stepSeconds(p);
      busy += d;
      ends.push({ t: t + d, unit: ep.unit, member: ep.member, attempt: ep.attempt });
    }
    if (updateEnd === null) {
      const dropped = s.counters.droppedStale;
      const b = s.takeBatch(version);
      if (b) {
        staleness.push(version - b.versions[0]);
        updateEnd = t + p.updateSeconds;
        continue;
      }
      // Dropped groups free the bound: their replacements start first (as workflows/stream-loop.ts does).
      if (s.counters.droppedStale > dropped) continue;
    }
    if (s.allBatchesTaken && updateEnd === null) break;
    // The next event: an episode's end or the update's.
    ends.sort((a, b) => a.t - b.t);
    const next = ends[0];
    if (updateEnd !== null && (!next || updateEnd <= next.t)) {
      t = updateEnd;
      updateEnd = null;
      version++;
      s.updated();
      continue;
    }
    if (!next) throw new Error('stream simulation stalled: nothing running and no batch');
    ends.shift();
    t = next.t;
    s.finished(next, 1);
  }
  return result(`stream (k = ${k})`, p, t, busy, staleness, s.counters.droppedStale);
}
