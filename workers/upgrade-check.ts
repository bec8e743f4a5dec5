import type { Client } from '@temporalio/client';
import { DefaultLogger, Runtime, Worker } from '@temporalio/worker';
import type { WorkflowBundle } from './workflow-bundle';

/**
 * Whether new workflow code can take over the runs in flight: every open workflow of a task queue is replayed
 * against the new bundle (Temporal's replay test, on live histories instead of recorded ones). A change that is
 * not wrapped in `patched()` makes the new worker fail those workflows' tasks over and over; caught here, the
 * old worker keeps running them.
 */

export interface OpenRun {
  workflowId: string;
  runId: string;
  workflowType: string;
}

export interface ReplayFailure extends OpenRun {
  /** The replay error's first line (a nondeterminism names the command that differs). */
  error: string;
}

export interface ReplayCheck {
  replayed: OpenRun[];
  failures: ReplayFailure[];
}

const quote = (s: string) => `"${s.replace(/["\\]/g, '\\$&')}"`;

export async function openRuns(client: Client, taskQueue: string): Promise<OpenRun[]> {
  const runs: OpenRun[] = [];
  for await (const wf of client.workflow.list({ query: `ExecutionStatus = "Running" AND TaskQueue = ${quote(taskQueue)}` })) {
    runs.push({ workflowId: wf.workflowId, runId: wf.runId, workflowType: wf.type });
  }
  return runs;
}

/**
 * In a process that runs no worker of its own (the CLI), the replay's Core lines ("Failing workflow task …") would
 * read as if the live run were failing; the refusal names each run instead. A process whose runtime is already
 * installed (a worker, a test) keeps its own.
 */
function quietReplayRuntime(): void {
  try {
    Runtime.install({ logger: new DefaultLogger('ERROR'), telemetryOptions: { logging: { filter: { core: 'ERROR', other: 'ERROR' }, forward: {} } } });
  } catch {
    // already installed
  }
}

/** Replays the open workflows of `taskQueue` against `bundle`; `failures` names each run the new code cannot continue. */
export async function replayOpenWorkflows(client: Client, taskQueue: string, bundle: WorkflowBundle): Promise<ReplayCheck> {
  const replayed = await openRuns(client, taskQueue);
  if (replayed.length === 0) return { replayed, failures: [] };
  // Only with something to replay: an installed runtime that no worker ever uses keeps the process alive.
  quietReplayRuntime();
  async function* histories() {
    for (const run of replayed) {
      yield { workflowId: run.workflowId, history: await client.workflow.getHandle(run.workflowId, run.runId).fetchHistory() };
    }
  }
  const failures: ReplayFailure[] = [];
  for await (const result of Worker.runReplayHistories({ workflowBundle: { codePath: bundle.path } }, histories())) {
    if (!result.error) continue;
    const run = replayed.find((r) => r.workflowId === result.workflowId && (!result.runId || r.runId === result.runId));
    failures.push({
      workflowId: result.workflowId,
      runId: run?.runId ?? result.runId,
      workflowType: run?.workflowType ?? '?',
      error: (result.error.message || String(result.error)).split('\n')[0],
    });
  }
  return { replayed, failures };
}

export class UpgradeRefused extends Error {
  constructor(
    readonly buildId: string,
    readonly failures: ReplayFailure[],
  ) {
    const lines = failures.map((f) => `  ${f.workflowType} ${f.workflowId} (run ${f.runId}): ${f.error}`);
    super(
      `upgrade refused: the new workflow code (${buildId}) cannot continue ${failures.length} open workflow(s), so no worker was restarted:\n${lines.join('\n')}\n` +
        "wrap the change in patched() (docs/architecture.md, 'Workflow versions'), or let these runs finish (halo stop <run>) before upgrading",
    );
    this.name = 'UpgradeRefused';
  }
}

/**
 * The upgrade of a control worker: replay first, and only when every open workflow replays, `restart` (which
 * stops the old worker and starts one on `bundle`). Throws UpgradeRefused, having restarted nothing, otherwise.
 */
export async function upgradeWorkflowWorker<T>(
  client: Client,
  taskQueue: string,
  bundle: WorkflowBundle,
  restart: () => Promise<T>,
): Promise<{ check: ReplayCheck; restarted: T }> {
  const check = await replayOpenWorkflows(client, taskQueue, bundle);
  if (check.failures.length > 0) throw new UpgradeRefused(bundle.buildId, check.failures);
  return { check, restarted: await restart() };
}
