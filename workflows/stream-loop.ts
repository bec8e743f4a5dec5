import { condition, isCancellation, log, patched } from '@temporalio/workflow';
import { RolloutStream, type StartedEpisode, type StreamSnapshot } from '../lib/training/rollout-stream';
import type { Loop, RunScope, StreamParts, Streamed, TrainingState, TrainingStatus } from './train-engine';
import { checkFailureShare, failureMessage, type Failed } from './pool';
import type { TrainingResult } from './run-control';

/**
 * Streaming rollouts (`train.rollout: stream`), one workflow run of them: every free browser slot starts the
 * next episode at once, sampled with the newest adapter served; an update starts as soon as a batch of complete
 * groups is ready and no update runs, while the episodes go on. The rules (admission, staleness drops, retries,
 * whole-group drops) are lib/training/rollout-stream.ts's.
 *
 * Durable as the iterations are: every episode is a child workflow and every update the engine's `learnFrom`,
 * so a worker or machine restart replays this run and loses no finished episode. After
 * `train.stream.updatesPerRun` updates the run stops starting episodes, lets those in flight finish (their groups
 * join the buffer), and continues as new carrying the buffer, queue and counters by reference; a stop drains
 * the same way, learns from the complete batches it has, and ends.
 */
export async function streamRollouts<D, U, R>(
  loop: Loop<D, U, R>,
  parts: StreamParts<D, R>,
  scope: RunScope,
  state: TrainingState,
  diskOk: boolean,
  describe: (live: () => Partial<TrainingStatus>) => void,
): Promise<TrainingResult> {
  const { runId, run, control, plan } = scope;
  const settings = plan.stream!;
  const snapshot = state.streamRef ? ((await control.loadJson({ ref: state.streamRef })) as StreamSnapshot<R>) : undefined;
  const s = new RolloutStream<R>(
    {
      batchUnits: plan.batchUnits,
      unitSize: parts.unitSize(scope),
      slots: plan.parallelism,
      maxStaleness: plan.maxStaleness,
      episodeRetries: settings.episodeRetries,
      updates: plan.iterations,
    },
    snapshot,
  );

  // Evaluation episodes take their slots from the stream's `parallelism` instead of adding browsers to it: one
  // waiting for a slot holds back new stream episodes, so it gets the next slot an ending episode frees. The slot is
  // claimed inside the condition, so two waiting episodes cannot both take the last one. Runs started before this
  // rule let evaluations run beside every slot; patched() keeps their histories replayable.
  const evalSlots = { running: 0, waiting: 0 };
  if (patched('stream-eval-slots')) {
    const claim = () => {
      if (s.inFlight + evalSlots.running >= plan.parallelism) return false;
      evalSlots.running++;
      return true;
    };
    loop.evalSlots = {
      acquire: async () => {
        evalSlots.waiting++;
        try {
          await condition(claim);
        } finally {
          evalSlots.waiting--;
        }
      },
      release: () => {
        evalSlots.running--;
      },
    };
  }
  const lent = () => Math.min(plan.parallelism, evalSlots.running + evalSlots.waiting);

  const ended: { ep: StartedEpisode; result?: R; error?: unknown }[] = [];
  let updating = false;
  let updateError: unknown;
  let taken = 0;
  let failedSince: Failed<StartedEpisode>[] = [];
  const firstIteration = state.iteration;
  // `iteration` of a streaming run is the update in progress (or next); the stream's own numbers beside it.
  describe(() => {
    // What `halo up` loads into a restarted vLLM: the adapter new episodes sample from.
    const served = loop.servedSampling().adapter;
    return {
      iteration: firstIteration + Math.max(0, taken - (updating ? 1 : 0)),
      adapterVersion: loop.version,
      ...(served ? { servedAdapter: served } : {}),
      stream: { inFlight: s.inFlight, queued: s.queued, buffered: s.buffered, samplingVersion: loop.servedVersion },
    };
  });

  const launch = (ep: StartedEpisode) => {
    parts.runEpisode(scope, ep, loop.servedSampling()).then(
      (result) => ended.push({ ep, result }),
      (error) => ended.push({ ep, error }),
    );
  };

  // One update at a time: the batch's experience, then the engine's update, serving, evaluation and metrics row.
  const learn = (it: number, episodes: R[], sampledVersion: number, streamed: Streamed) => {
    updating = true;
    const seconds: Record<string, number> = {};
    (async () => {
      const c = await parts.build(scope, it, episodes, sampledVersion, seconds);
      c.streamed = streamed;
      await loop.learnFrom(c, seconds);
      s.updated();
    })().then(
      () => {
        updating = false;
      },
      (err) => {
        updateError = err;
        updating = false;
      },
    );
  };

  for (;;) {
    if (updateError) throw updateError;
    const segmentDone = taken >= settings.updatesPerRun;
    const stopping = run.stopping || !diskOk;
    const starting = !stopping && !run.paused && !segmentDone;
    if (!updating) run.phase = run.paused ? 'paused' : stopping || segmentDone ? 'draining' : 'stream';
    if (starting) for (const ep of s.startable(loop.servedVersion, !s.allBatchesTaken, lent())) launch(ep);
    // A stopped run learns from the batches it completed (draining first); no update past the run's last.
    // Paused: nothing new starts, neither an episode nor an update; what runs ends.
    const mayTake = !updating && !run.paused && !s.allBatchesTaken && !segmentDone && (!stopping || s.inFlight === 0);
    const droppedBefore = s.counters.droppedStale;
    const batch = mayTake ? s.takeBatch(loop.version) : null;
    if (s.counters.droppedStale > droppedBefore)
      log.info('groups sampled too long ago dropped', { runId, dropped: s.counters.droppedStale - droppedBefore, maxStaleness: plan.maxStaleness });
    if (batch) {
      checkFailureShare(failedSince, plan.batchUnits + failedSince.length, plan.maxFailedShare, `groups before update ${firstIteration + taken}`, plan.maxFailedShareKey);
      failedSince = [];
      const stats = s.stats(batch);
      // No update runs while a batch is taken: the newest adapter is the one this update starts from.
      learn(
        firstIteration + taken++,
        batch.units.flatMap((u) => u.results as R[]),
        batch.versions[0],
        { staleness: loop.version - batch.versions[0], stats },
      );
      continue;
    }
    // Dropped units free admission: start their replacements before waiting.
    if (s.counters.droppedStale > droppedBefore) continue;
    if (!updating && s.inFlight === 0) {
      const last = firstIteration + taken - 1;
      if (s.allBatchesTaken || stopping) {
        return loop.withBest({ runId, iterations: last, adapterVersion: loop.version, stoppedEarly: !s.allBatchesTaken });
      }
      if (segmentDone) {
        const { ref } = await control.storeJson({ value: s.snapshot() });
        return loop.continue(last + 1, undefined, ref);
      }
    }
    const before = { n: ended.length, updating, paused: run.paused, stopping: run.stopping, lent: lent() };
    await condition(() => ended.length > before.n || updating !== before.updating || run.paused !== before.paused || run.stopping !== before.stopping || lent() !== before.lent);
    for (const e of ended.splice(0)) {
      if (e.error === undefined) {
        s.finished(e.ep, e.result as R);
        continue;
      }
      if (isCancellation(e.error)) throw e.error;
      const what = s.failed(e.ep);
      const error = failureMessage(e.error).slice(0, 500);
      log.warn(what === 'retry' ? 'episode failed; starting it again in a fresh session' : 'episode failed; its group is dropped', {
        runId,
        unit: e.ep.unit,
        member: e.ep.member,
        attempt: e.ep.attempt,
        error,
      });
      if (what === 'dropped') failedSince.push({ index: e.ep.unit, item: e.ep, error, ...(e.error instanceof Error ? { cause: e.error } : {}) });
    }
  }
}
