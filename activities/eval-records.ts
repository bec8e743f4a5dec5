import type { BlobStore } from '../blob/store';
import { assembleEval } from '../lib/eval/eval-records';
import type { EvalEpisodeRecord } from '../lib/eval/eval-summary';
import type { FinishEvalInput, FinishEvalResult } from '../lib/eval/eval-types';

/** The `evaluate` workflow's records: written per chunk by the workflow (storeJson), assembled here at the end. */
export function createEvalRecordActivities(blobs: BlobStore) {
  return {
    /** Every chunk's records into one JSON-lines blob, the summary computed over all of them. */
    async finishEval(input: FinishEvalInput): Promise<FinishEvalResult> {
      const chunks: EvalEpisodeRecord[][] = [];
      for (const ref of input.chunkRefs) chunks.push(await blobs.getJson<EvalEpisodeRecord[]>(ref));
      const { episodes, jsonl, summary } = assembleEval(input, chunks);
      const recordsRef = await blobs.put(jsonl, 'jsonl');
      const resultsRef = await blobs.putJson({ evalId: input.evalId, modes: input.modes, summary, recordsRef, episodeCount: episodes.length });
      return { summary, recordsRef, resultsRef, episodeCount: episodes.length };
    },
  };
}

export type EvalRecordActivities = ReturnType<typeof createEvalRecordActivities>;
