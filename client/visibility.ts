// Temporal visibility queries of the CLI (`halo runs`, `halo episodes`, `halo export`). Every value a user
// gives is checked against what the workflows write (lib/episode/search-attributes.ts) and quoted, so a flag can
// never add a clause of its own (`--mode "x' OR HaloKind = 'episode"`).

/** HaloKind values the workflows set. */
export const RUN_KINDS = ['train', 'mcts', 'eval'] as const;
export const ALL_KINDS = [...RUN_KINDS, 'episode'] as const;
export const RUN_STATUSES = ['Running', 'Completed', 'Failed', 'Canceled', 'Terminated', 'ContinuedAsNew', 'TimedOut'] as const;

/** HaloMode is a training mode (grpo, mcts), an eval's mode labels, or an episode's policy model (`Qwen/Qwen3-VL-8B-Instruct`). */
const MODE = /^[A-Za-z0-9][A-Za-z0-9._:/,+-]{0,199}$/;
/** Run ids (train.runId, mcts.runId, eval runId). */
const RUN_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/;

export class VisibilityQueryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'VisibilityQueryError';
  }
}

/** A string literal of the visibility query language; the value is checked first, the quoting is belt and braces. */
function literal(value: string): string {
  return `'${value.replace(/\\/g, '\\\\').replace(/'/g, "\\'")}'`;
}

function oneOf<T extends string>(flag: string, value: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(value)) throw new VisibilityQueryError(`${flag} must be one of ${allowed.join(', ')} (got ${JSON.stringify(value)})`);
  return value as T;
}

export interface RunFilter {
  kind?: string;
  mode?: string;
  status?: string;
}

/** The query of `halo runs`: runs of one kind (default: all run kinds), optionally of one mode and status. */
export function runsQuery(f: RunFilter): string {
  const clauses = [f.kind !== undefined ? `HaloKind = ${literal(oneOf('--kind', f.kind, RUN_KINDS))}` : `HaloKind IN (${RUN_KINDS.map(literal).join(', ')})`];
  if (f.mode !== undefined) {
    if (!MODE.test(f.mode)) throw new VisibilityQueryError(`--mode must be a mode or model name: letters, digits, . _ : / , + - (got ${JSON.stringify(f.mode)})`);
    clauses.push(`HaloMode = ${literal(f.mode)}`);
  }
  if (f.status !== undefined) clauses.push(`ExecutionStatus = ${literal(oneOf('--status', f.status, RUN_STATUSES))}`);
  return clauses.join(' AND ');
}

/** The query of a run's episodes. */
export function episodesQuery(runId: string): string {
  if (!RUN_ID.test(runId)) throw new VisibilityQueryError(`run id must be letters, digits, . _ - (got ${JSON.stringify(runId)})`);
  return `HaloRunId = ${literal(runId)} AND HaloKind = 'episode'`;
}
