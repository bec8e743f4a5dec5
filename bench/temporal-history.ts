/**
 * Helpers for the GRPO benchmarks: read a trainGrpo continue-as-new chain and its child episodes from
 * Temporal's histories and turn them into activity intervals (server timestamps, ms since the epoch).
 *
 * Temporal writes ActivityTaskStarted lazily (together with the completion) but stamps it with the real
 * start time, so Started → Completed is the time the activity ran on its worker.
 */
import type { Client } from '@temporalio/client';
import { tsToMs } from '@temporalio/common/lib/time';
import { temporal } from '@temporalio/proto';

const ET = temporal.api.enums.v1.EventType;
type HistoryEvent = temporal.api.history.v1.IHistoryEvent;

export interface ActivityRun {
  workflowId: string;
  type: string;
  attempt: number;
  scheduled: number;
  started?: number;
  ended?: number;
  outcome: 'completed' | 'failed' | 'timed out' | 'canceled' | 'pending';
}

export interface WorkflowRun {
  workflowId: string;
  runId: string;
  start: number;
  end: number;
  /** CONTINUED_AS_NEW, COMPLETED, FAILED, … or RUNNING. */
  close: string;
  nextRunId?: string;
  activities: ActivityRun[];
  children: { workflowId: string; runId: string }[];
  /** Workflow task scheduled → completed, the time the workflow code's turn took (queue wait included). */
  workflowTasks: { scheduled: number; started?: number; completed?: number }[];
  events: HistoryEvent[];
}

const ms = (e: HistoryEvent) => tsToMs(e.eventTime);

export async function readRun(client: Client, workflowId: string, runId?: string): Promise<WorkflowRun> {
  const history = await client.workflow.getHandle(workflowId, runId).fetchHistory();
  const events = history.events ?? [];
  const first = events[0];
  const attrs = first.workflowExecutionStartedEventAttributes;
  const run: WorkflowRun = {
    workflowId,
    runId: runId ?? attrs?.originalExecutionRunId ?? '',
    start: ms(first),
    end: ms(events[events.length - 1]),
    close: 'RUNNING',
    activities: [],
    children: [],
    workflowTasks: [],
    events,
  };
  const byScheduled = new Map<number, ActivityRun>();
  const wft = new Map<number, { scheduled: number; started?: number; completed?: number }>();
  for (const e of events) {
    const id = Number(e.eventId);
    switch (e.eventType) {
      case ET.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: {
        const a: ActivityRun = {
          workflowId,
          type: e.activityTaskScheduledEventAttributes?.activityType?.name ?? '?',
          attempt: 1,
          scheduled: ms(e),
          outcome: 'pending',
        };
        byScheduled.set(id, a);
        run.activities.push(a);
        break;
      }
      case ET.EVENT_TYPE_ACTIVITY_TASK_STARTED: {
        const at = e.activityTaskStartedEventAttributes!;
        const a = byScheduled.get(Number(at.scheduledEventId));
        if (a) {
          a.started = ms(e);
          a.attempt = at.attempt ?? 1;
        }
        break;
      }
      case ET.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
      case ET.EVENT_TYPE_ACTIVITY_TASK_FAILED:
      case ET.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
      case ET.EVENT_TYPE_ACTIVITY_TASK_CANCELED: {
        const at = e.activityTaskCompletedEventAttributes ?? e.activityTaskFailedEventAttributes ?? e.activityTaskTimedOutEventAttributes ?? e.activityTaskCanceledEventAttributes;
        const a = byScheduled.get(Number(at?.scheduledEventId));
        if (a) {
          a.ended = ms(e);
          a.outcome =
            e.eventType === ET.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
              ? 'completed'
              : e.eventType === ET.EVENT_TYPE_ACTIVITY_TASK_FAILED
                ? 'failed'
                : e.eventType === ET.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
                  ? 'timed out'
                  : 'canceled';
        }
        break;
      }
      case ET.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED: {
        const we = e.childWorkflowExecutionStartedEventAttributes?.workflowExecution;
        if (we?.workflowId && we.runId) run.children.push({ workflowId: we.workflowId, runId: we.runId });
        break;
      }
      case ET.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
        wft.set(id, { scheduled: ms(e) });
        run.workflowTasks.push(wft.get(id)!);
        break;
      case ET.EVENT_TYPE_WORKFLOW_TASK_STARTED: {
        const t = wft.get(Number(e.workflowTaskStartedEventAttributes?.scheduledEventId));
        if (t) t.started = ms(e);
        break;
      }
      case ET.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: {
        const t = wft.get(Number(e.workflowTaskCompletedEventAttributes?.scheduledEventId));
        if (t) t.completed = ms(e);
        break;
      }
      case ET.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
        run.close = 'CONTINUED_AS_NEW';
        run.nextRunId = e.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId ?? undefined;
        break;
      case ET.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
        run.close = 'COMPLETED';
        break;
      case ET.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        run.close = 'FAILED';
        break;
      case ET.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
        run.close = 'TERMINATED';
        break;
      case ET.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
        run.close = 'TIMED_OUT';
        break;
    }
  }
  return run;
}

/** Every run of a continue-as-new chain, first to last (each run = one GRPO iteration). */
export async function readChain(client: Client, workflowId: string, firstRunId: string): Promise<WorkflowRun[]> {
  const runs: WorkflowRun[] = [];
  let runId: string | undefined = firstRunId;
  while (runId) {
    const r = await readRun(client, workflowId, runId);
    runs.push(r);
    runId = r.nextRunId;
  }
  return runs;
}

/** A GRPO iteration: its trainGrpo run and the child episodes it started. */
export interface Iteration {
  parent: WorkflowRun;
  children: WorkflowRun[];
  activities: ActivityRun[];
}

export async function readIteration(client: Client, parent: WorkflowRun): Promise<Iteration> {
  const children = await Promise.all(parent.children.map((c) => readRun(client, c.workflowId, c.runId)));
  return { parent, children, activities: [parent, ...children].flatMap((r) => r.activities) };
}

export type Interval = [number, number];

/** Total length of the union of intervals, clipped to [lo, hi]. */
export function unionLength(intervals: Interval[], lo = -Infinity, hi = Infinity): number {
  return mergeIntervals(intervals, lo, hi).reduce((s, [a, b]) => s + (b - a), 0);
}

export function mergeIntervals(intervals: Interval[], lo = -Infinity, hi = Infinity): Interval[] {
  const xs = intervals
    .map(([a, b]) => [Math.max(a, lo), Math.min(b, hi)] as Interval)
    .filter(([a, b]) => b > a)
    .sort((p, q) => p[0] - q[0]);
  const out: Interval[] = [];
  for (const [a, b] of xs) {
    const last = out[out.length - 1];
    if (last && a <= last[1]) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

export function activityInterval(a: ActivityRun, outcomes: ActivityRun['outcome'][] = ['completed']): Interval | undefined {
  if (a.started === undefined || a.ended === undefined || !outcomes.includes(a.outcome)) return undefined;
  return [a.started, a.ended];
}
