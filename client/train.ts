import { WorkflowExecutionAlreadyStartedError, WorkflowIdReusePolicy, type Client, type WorkflowHandle } from '@temporalio/client';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { HaloConfig } from '../lib/config';
import { latestMetrics, parseMetricsJsonl, type MetricsLine } from '../lib/run-metrics';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import type { TrainResult, TrainStatus } from '../workflows/train-grpo';

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
    if (err instanceof WorkflowExecutionAlreadyStartedError) return { handle: client.workflow.getHandle(runId), attached: true };
    throw err;
  }
}

/** Waits for the run, printing a progress line per iteration (iteration, mean reward, success rate). */
export async function followTrain(handle: WorkflowHandle, say: (line: string) => void): Promise<TrainResult> {
  let shown = '';
  const timer = setInterval(async () => {
    try {
      const st = await handle.query<TrainStatus>('status');
      const m = st.lastMetrics;
      const bar = progressBar(st.iteration - 1, st.iterations);
      const line = `${bar} iteration ${st.iteration}/${st.iterations} · ${st.phase}${st.paused ? ' (paused)' : ''}${m ? ` · mean reward ${m.mean_reward.toFixed(3)} · success ${(m.success_rate * 100).toFixed(0)}%` : ''} · adapter v${st.adapterVersion}`;
      if (line !== shown) say((shown = line));
    } catch {
      /* between runs of a continue-as-new chain, or no worker yet */
    }
  }, 1000);
  try {
    // Follows continue-as-new to the run that finishes.
    return (await handle.result()) as TrainResult;
  } finally {
    clearInterval(timer);
  }
}

function progressBar(done: number, total: number, width = 20): string {
  const filled = Math.round((Math.max(0, Math.min(done, total)) / Math.max(1, total)) * width);
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
}

export interface RunStatusView {
  runId: string;
  status: string;
  progress?: TrainStatus;
  result?: TrainResult;
  latest: MetricsLine | null;
  metricsFile: string;
}

export async function runStatus(client: Client, runId: string, home: string): Promise<RunStatusView> {
  const handle = client.workflow.getHandle(runId);
  const d = await handle.describe().catch((err: Error) => {
    throw new Error(`no run ${runId}: ${err.message}`);
  });
  const metricsFile = join(home, runId, 'metrics.jsonl');
  let latest: MetricsLine | null = null;
  try {
    latest = latestMetrics(parseMetricsJsonl(readFileSync(metricsFile, 'utf8'), metricsFile));
  } catch {
    latest = null;
  }
  const view: RunStatusView = { runId, status: d.status.name, latest, metricsFile };
  if (d.status.name === 'RUNNING') view.progress = await handle.query<TrainStatus>('status').catch(() => undefined);
  if (d.status.name === 'COMPLETED') view.result = (await handle.result()) as TrainResult;
  return view;
}
