import { summarizeEval, type EvalEpisodeRecord, type EvalSummary } from './eval-summary';
import type { FinishEvalInput } from './eval-types';

/**
 * An evaluation's records and summary from its chunks (in order): the records as JSON lines, and the summary
 * with a note when a stop left episodes out.
 */
export function assembleEval(input: FinishEvalInput, chunks: readonly EvalEpisodeRecord[][]): { episodes: EvalEpisodeRecord[]; jsonl: string; summary: EvalSummary } {
  const episodes = chunks.flat();
  const notRun = input.total - episodes.length;
  const summary = summarizeEval({
    evalId: input.evalId,
    env: input.env,
    modes: input.modes.map((m) => m.label),
    episodes,
    skipped: input.skipped,
    notes: notRun > 0 ? [...input.notes, { mode: '*', note: `stopped early: ${notRun} of ${input.total} episodes were not run` }] : input.notes,
    modeDetails: input.modes.map((m) => ({ mode: m.label, describe: m.describe })),
  });
  const jsonl = episodes.map((e) => JSON.stringify(e)).join('\n') + (episodes.length ? '\n' : '');
  return { episodes, jsonl, summary };
}
