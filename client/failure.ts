import { WorkflowFailedError, type WorkflowHandle } from '@temporalio/client';
import { ActivityFailure, ApplicationFailure, CancelledFailure, ChildWorkflowFailure, TemporalFailure, TerminatedFailure, TimeoutFailure } from '@temporalio/common';
import { ConfigError } from '../lib/config/config-error';

/**
 * Why a workflow the CLI started or attached to failed, read from Temporal's failure cause chain
 * (WorkflowFailedError → ChildWorkflowFailure → ActivityFailure → ApplicationFailure): where it failed, the root
 * error's type, message and the fix it names. Every command reports a failed workflow through this module, so a
 * user reads the same lines (or `--json` fields) whichever command ran it.
 */

/** Exit codes of the CLI (docs/cli.md). */
export const EXIT = { ok: 0, runtime: 1, config: 2 } as const;

export interface WorkflowRef {
  workflowId: string;
  workflowType?: string;
}

export interface RunFailure {
  /** The workflow the command started or attached to. */
  workflow?: WorkflowRef;
  /** Child workflows from the outermost to the one that failed. */
  children: WorkflowRef[];
  /** The activity that failed, when an activity did. */
  activity?: { activityType: string; activityId?: string; retryState?: string };
  /** ApplicationFailure's type; else what kind of failure ended it (Timeout, Cancelled, Terminated). */
  type: string;
  message: string;
  /** The workflow's own failure around the root one (a run that stops after too many failed episodes). */
  outcome?: { type: string; message: string };
  /** What to change, as the error names it (or, for a few known types that name none, what usually fixes it). */
  fix?: string;
  nonRetryable: boolean;
  /** config: the run cannot succeed as configured (exit 2); runtime: it failed while running (exit 1). */
  category: 'config' | 'runtime';
  exitCode: number;
}

/**
 * Non-retryable failure types that mean "the configuration is wrong": trying again with the same config fails the
 * same way. PolicyRequestRejected is a 4xx from the policy server (an unknown model or adapter, a field it refuses).
 */
const CONFIG_TYPES = new Set([
  'InvalidConfig',
  'ConfigError',
  'CriticConfigInvalid',
  'PolicyTokenIdsMissing',
  'PolicyRequestRejected',
  'VllmAdapterRejected',
  'UnknownTask',
  'UnknownEnvironment',
  'UnknownRealTaskError',
  'UnscorableTaskError',
  'EvalScriptChangedError',
  'ModelMismatch',
  'UnsupportedAttention',
  'InvalidRunId',
]);

/** Fixes for failure types whose messages name none. */
const KNOWN_FIXES: Record<string, (message: string) => string | undefined> = {
  PolicyServerUnreachable: () => 'start the policy server, or point policy.baseUrl (--policy-url) at one that runs',
  PolicyRequestRejected: (m) =>
    /does not exist/.test(m)
      ? 'serve that model or adapter, or name one the server lists at GET /v1/models (policy.model, --model)'
      : 'change the request field the server names (policy.* in the config)',
  PolicyServerError: () => "read the policy server's log: it failed on a request it accepted",
  InvalidConfig: () => 'correct the config field the message names (docs/CONFIG.md lists every field)',
  ConfigError: () => 'correct the config field the message names (docs/CONFIG.md lists every field)',
};

// A clause that tells the user what to do: "set …", "to sample without them, set …", "start …".
const IMPERATIVE =
  /^(?:to [^,]{1,80}, )?(?:set|start|run|pass|use|install|give|raise|lower|reduce|increase|remove|delete|add|serve|load|restart|choose|free|check|point|fix|rename|unset)\b/i;

/** The clause of a message that names a fix, if one does. */
export function fixIn(message: string): string | undefined {
  const clauses = message
    .split(/(?<=[.;?])\s+|\n+/)
    .map((c) => c.trim())
    .filter(Boolean);
  const hit = clauses.find((c) => IMPERATIVE.test(c));
  return hit?.replace(/[.;]$/, '');
}

function categoryOf(type: string, nonRetryable: boolean): RunFailure['category'] {
  return nonRetryable && CONFIG_TYPES.has(type) ? 'config' : 'runtime';
}

/**
 * Walks the cause chain of `err` (what `handle.result()` rejects with) down to the root failure. Where a workflow
 * itself failed with a cause (a run that stops after too many failed episodes keeps the first one as its cause), the
 * walk goes on through it: the root is what went wrong first.
 */
export function describeFailure(err: unknown, workflow?: WorkflowRef): RunFailure {
  const children: WorkflowRef[] = [];
  let activity: RunFailure['activity'];
  let root: unknown = err instanceof WorkflowFailedError ? (err.cause ?? err) : err;
  let outer: ApplicationFailure | undefined;
  for (let depth = 0; depth < 32; depth++) {
    if (root instanceof ChildWorkflowFailure) {
      children.push({ workflowId: root.execution.workflowId ?? '?', workflowType: root.workflowType });
    } else if (root instanceof ActivityFailure) {
      activity = { activityType: root.activityType, activityId: root.activityId, ...(root.retryState ? { retryState: root.retryState } : {}) };
    } else if (root instanceof ApplicationFailure && root.cause) {
      outer ??= root;
    } else break;
    if (!(root instanceof TemporalFailure) || !root.cause) break;
    root = root.cause;
  }
  const { type, message, nonRetryable } = rootFields(root, err);
  const category = categoryOf(type, nonRetryable);
  const fix = fixIn(message) ?? KNOWN_FIXES[type]?.(message) ?? (outer ? fixIn(outer.message) : undefined);
  return {
    ...(workflow ? { workflow } : {}),
    children,
    ...(activity ? { activity } : {}),
    type,
    message,
    ...(outer ? { outcome: { type: outer.type ?? 'Error', message: outer.message } } : {}),
    ...(fix ? { fix } : {}),
    nonRetryable,
    category,
    exitCode: category === 'config' ? EXIT.config : EXIT.runtime,
  };
}

function rootFields(root: unknown, err: unknown): { type: string; message: string; nonRetryable: boolean } {
  if (root instanceof ApplicationFailure) return { type: root.type ?? 'Error', message: root.message, nonRetryable: root.nonRetryable === true };
  if (root instanceof TimeoutFailure) return { type: `Timeout (${root.timeoutType ?? 'unknown'})`, message: root.message || 'timed out', nonRetryable: false };
  if (root instanceof TerminatedFailure) return { type: 'Terminated', message: root.message || 'terminated', nonRetryable: true };
  if (root instanceof CancelledFailure) return { type: 'Cancelled', message: root.message || 'cancelled', nonRetryable: true };
  const e = root instanceof Error ? root : err instanceof Error ? err : new Error(String(err));
  return { type: e.name || 'Error', message: e.message, nonRetryable: false };
}

/** A workflow the CLI waited on failed: carries the walked failure to the command's exit. */
export class RunFailedError extends Error {
  /** `note`: what to do next, printed after the failure (e.g. how to start the run again). */
  constructor(
    readonly failure: RunFailure,
    readonly note?: string,
  ) {
    super(`${failure.type}: ${failure.message}`);
    this.name = 'RunFailedError';
  }
}

/**
 * The result of a workflow; a failure is rethrown as a RunFailedError naming the workflow (its type read from the
 * server). Other errors (the server unreachable) pass through as they are.
 */
export async function resultOf<T>(handle: WorkflowHandle): Promise<T> {
  try {
    return (await handle.result()) as T;
  } catch (err) {
    if (!(err instanceof WorkflowFailedError)) throw err;
    throw new RunFailedError(describeFailure(err, await workflowRef(handle)));
  }
}

/** The failure of a closed workflow, from its close event; undefined when it did not fail. */
export async function lastFailure(handle: WorkflowHandle): Promise<RunFailure | undefined> {
  try {
    await handle.result();
    return undefined;
  } catch (err) {
    if (!(err instanceof WorkflowFailedError)) throw err;
    return describeFailure(err, await workflowRef(handle));
  }
}

async function workflowRef(handle: WorkflowHandle): Promise<WorkflowRef> {
  const type = await handle
    .describe()
    .then((d) => d.type)
    .catch(() => undefined);
  return { workflowId: handle.workflowId, ...(type ? { workflowType: type } : {}) };
}

const MAX_MESSAGE = 1500;

const clip = (s: string, n: number) => (s.length > n ? `${s.slice(0, n)}…` : s);

/** The failure as indented lines for a terminal. */
export function formatFailure(f: RunFailure): string {
  const where = [
    ...(f.workflow ? [`workflow ${f.workflow.workflowId}${f.workflow.workflowType ? ` (${f.workflow.workflowType})` : ''}`] : []),
    ...f.children.map((c) => `child workflow ${c.workflowId}${c.workflowType ? ` (${c.workflowType})` : ''}`),
    ...(f.activity ? [`activity ${f.activity.activityType}${f.activity.retryState === 'MAXIMUM_ATTEMPTS_REACHED' ? ' (after its last attempt)' : ''}`] : []),
  ];
  const message = clip(f.message, MAX_MESSAGE);
  return [
    `${f.workflow ? `${f.workflow.workflowType ?? 'workflow'} ${f.workflow.workflowId}` : 'workflow'} failed`,
    ...(where.length ? [`  where:   ${where.join(' → ')}`] : []),
    `  error:   ${f.type}${f.nonRetryable ? ' (non-retryable)' : ''}`,
    `  message: ${message}`,
    ...(f.outcome ? [`  outcome: ${f.outcome.type}: ${clip(f.outcome.message, 300)}`] : []),
    ...(f.fix ? [`  fix:     ${f.fix}`] : []),
    `  kind:    ${f.category === 'config' ? 'a configuration error: it fails the same way until the config changes' : 'a runtime failure'} (exit ${f.exitCode})`,
  ].join('\n');
}

/**
 * The CLI's last word on an error: prints it (a failed workflow as its walked failure; with `json`, as an `error`
 * object on stdout too) and returns the exit code.
 */
export function reportError(err: unknown, json: boolean, print: { out: (s: string) => void; err: (s: string) => void } = { out: console.log, err: console.error }): number {
  const failure = err instanceof RunFailedError ? err.failure : err instanceof WorkflowFailedError ? describeFailure(err) : undefined;
  if (failure) {
    if (json) print.out(JSON.stringify({ error: failure }));
    print.err(`halo: ${formatFailure(failure)}`);
    if (err instanceof RunFailedError && err.note) print.err(`halo: ${err.note}`);
    return failure.exitCode;
  }
  const message = err instanceof Error ? err.message : String(err);
  const code = err instanceof ConfigError ? EXIT.config : EXIT.runtime;
  if (json)
    print.out(JSON.stringify({ error: { type: err instanceof Error ? err.name : 'Error', message, category: code === EXIT.config ? 'config' : 'runtime', exitCode: code } }));
  print.err(`halo: ${message}`);
  return code;
}
