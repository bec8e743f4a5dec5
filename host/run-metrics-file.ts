import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { LEGACY_MCTS_METRICS_FILE, METRICS_FILE } from '../lib/training/run-metrics';

/**
 * The metrics file of the run folder `runDir`: `metrics.jsonl`, or, for an MCTS run from before every
 * algorithm shared that file, its `mcts-metrics.jsonl` when that is the only one there (lib/training/run-metrics.ts
 * reads its lines into the same schema). A run with neither gets `metrics.jsonl`, the file it will write.
 */
export function runMetricsFile(runDir: string): string {
  const current = join(runDir, METRICS_FILE);
  if (existsSync(current)) return current;
  const legacy = join(runDir, LEGACY_MCTS_METRICS_FILE);
  return existsSync(legacy) ? legacy : current;
}
