import { WorkflowExecutionAlreadyStartedError, WorkflowIdReusePolicy, type Client, type WorkflowHandle } from '@temporalio/client';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { HaloConfig } from '../lib/config/config';
import { runMetricsFile } from '../host/run-metrics-file';
import { isGrpoMetrics, isMctsMetrics, latestMetrics, parseMetricsJsonl, type MetricsLine, type TrainingMetrics } from '../lib/training/run-metrics';
import { KIND, MODE, RUN_ID, TASK } from '../lib/episode/search-attributes';
import type { TrainingResult, TrainingStatus } from '../workflows/train-engine';
import { statusQuery } from '../workflows/messages';
import { lastFailure, resultOf, RunFailedError, type RunFailure } from './failure';

/**
 * One run per run id: a second `halo train` (running or finished) attaches to the existing run instead of
 * starting another one.
 */
export async function startOrAttachTrain(client: Client, cfg: HaloConfig): Promise<{ handle: WorkflowHandle; attached: boolean }> {
  const runId = cfg.train.runId;
  try {
    const handle = await client.workflow.start('trainGrpo', {
      taskQueue: cfg.temporal.controlTaskQueue,
      workflowId: runId,
      args: [{ config: cfg }],
      workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
      staticSummary: `GRPO run ${runId}: ${cfg.train.iterations} iterations on ${cfg.episode.env}`,
      typedSearchAttributes: [
        { key: RUN_ID, value: runId },
        { key: KIND, value: 'train' },
        { key: MODE, value: 'grpo' },
        { key: TASK, value: `${cfg.episode.env}/${cfg.train.tasks.join(',')}`.slice(0, 200) },
      ],
    });
    return { handle, attached: false };
  } catch (err) {
    if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
    const handle = client.workflow.getHandle(runId);
    await refuseEndedBadly(handle, runId);
    return { handle, attached: true };
  }
}

/**
 * A run that failed, was terminated or cancelled cannot be attached to (it would only report the old
 * failure): say what happened and how to start again.
 */
export async function refuseEndedBadly(handle: WorkflowHandle, runId: string, idField = 'train.runId'): Promise<void> {
  const d = await handle.describe();
  const status = d.status.name;
  if (status === 'RUNNING' || status === 'COMPLETED' || status === 'CONTINUED_AS_NEW') return;
  const note =
    `run ${runId} ${status.toLowerCase().replace(/_/g, ' ')}. Its adapters and metrics stay on disk. To train again, start a new run: set ${idField} to a new id ` +
    `(or pass --run-id), or remove the old run first: temporal workflow delete --workflow-id ${runId}`;
  const failure = await lastFailure(handle);
  if (failure) throw new RunFailedError(failure, note);
  throw new Error(note);
}

/**
 * Waits for a training run (following continue-as-new to the run that finishes), polling its `status` query
 * every `intervalMs` and printing the line `render` makes of it whenever that line changes. One poll at a time;
 * a failed poll (between runs of a continue-as-new chain, no worker yet) is skipped.
 */
export async function followStatus(
  handle: WorkflowHandle,
  render: (st: TrainingStatus) => string | Promise<string>,
  say: (line: string) => void,
  intervalMs = 1000,
): Promise<TrainingResult> {
  let shown = '';
  let busy = false;
  let total = 0;
  const timer = setInterval(async () => {
    if (busy) return;
    busy = true;
    try {
      const st = (await handle.query(statusQuery)) as TrainingStatus;
      // Each run of a continue-as-new chain answers 0 iterations until it has read its config: keep the known total.
      if (st.iterations > 0) total = st.iterations;
      const line = await render(st.iterations > 0 ? st : { ...st, iterations: total });
      if (line !== shown) {
        shown = line;
        say(line);
      }
    } catch {
      /* between runs of a continue-as-new chain, or no worker yet */
    } finally {
      busy = false;
    }
  }, intervalMs);
  try {
    return await resultOf<TrainingResult>(handle);
  } finally {
    clearInterval(timer);
  }
}

/** Waits for the run, printing a progress line per iteration (iteration, the last iteration's numbers). */
export function followTrain(handle: WorkflowHandle, say: (line: string) => void): Promise<TrainingResult> {
  return followStatus(
    handle,
    (st) => {
      const m = st.lastMetrics;
      const bar = progressBar(st.iteration - 1, st.iterations);
      return `${bar} iteration ${st.iteration}/${st.iterations} · ${st.phase}${st.paused ? ' (paused)' : ''}${m ? ` · ${progressNumbers(m)}` : ''} · adapter v${st.adapterVersion}${streamNote(st)}`;
    },
    say,
  );
}

const pct = (x: number) => `${(x * 100).toFixed(0)}%`;

/** A streaming run's rollouts now: episodes in flight and waiting for a slot, complete groups buffered, the adapter new episodes sample. */
export function streamNote(st: Pick<TrainingStatus, 'stream'>): string {
  const s = st.stream;
  return s ? ` · stream: ${s.inFlight} episodes in flight, ${s.queued} queued, ${s.buffered} groups buffered, sampling v${s.samplingVersion}` : '';
}

/** An iteration's headline numbers: GRPO's mean reward or MCTS's pairs, and the success rate. */
export function progressNumbers(m: TrainingMetrics): string {
  const own = isGrpoMetrics(m) ? `mean reward ${m.mean_reward.toFixed(3)} · ` : isMctsMetrics(m) ? `${m.mcts.pairs} pairs · ` : '';
  return `${own}success ${pct(m.success_rate)}`;
}

/** `halo status`'s line for the run's latest metrics row. */
export function describeLatestMetrics(l: MetricsLine): string {
  const own = isGrpoMetrics(l)
    ? `mean reward ${l.mean_reward.toFixed(3)} · success ${pct(l.success_rate)} · validity ${pct(l.action_validity)}`
    : `success ${pct(l.success_rate)} (best paths)${isMctsMetrics(l) ? ` · ${l.mcts.pairs} pairs` : ''}`;
  return `latest: iteration ${l.iteration} · ${own} · loss ${l.loss}`;
}

function progressBar(done: number, total: number, width = 20): string {
  const filled = Math.round((Math.max(0, Math.min(done, total)) / Math.max(1, total)) * width);
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
}

export interface RunStatusView {
  runId: string;
  status: string;
  progress?: TrainingStatus;
  result?: TrainingResult;
  latest: MetricsLine | null;
  metricsFile: string;
  /** Why the run failed (failed, terminated, timed out or cancelled), from its close event. */
  failure?: RunFailure;
}

export async function runStatus(client: Client, runId: string, home: string): Promise<RunStatusView> {
  const handle = client.workflow.getHandle(runId);
  const d = await handle.describe().catch((err: Error) => {
    throw new Error(`no run ${runId}: ${err.message}`);
  });
  const metricsFile = runMetricsFile(join(home, runId));
  let latest: MetricsLine | null = null;
  try {
    latest = latestMetrics(parseMetricsJsonl(readFileSync(metricsFile, 'utf8'), metricsFile));
  } catch {
    latest = null;
  }
  const view: RunStatusView = { runId, status: d.status.name, latest, metricsFile };
  if (d.status.name === 'RUNNING')
    view.progress = await handle
      .query(statusQuery)
      .then((s) => s as TrainingStatus)
      .catch(() => undefined);
  if (d.status.name === 'COMPLETED') view.result = (await handle.result()) as TrainingResult;
  else if (d.status.name !== 'RUNNING' && d.status.name !== 'CONTINUED_AS_NEW') {
    const failure = await lastFailure(handle);
    if (failure) view.failure = failure;
  }
  return view;
}
