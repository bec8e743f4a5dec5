import { ApplicationFailure } from '@temporalio/activity';
import type { BlobStore } from '../blob/store';

/**
 * Blob writes of the MCTS search (control worker). The colocated sampler returns its completions inline;
 * the search keeps only references in its tree (and so in its snapshots and DPO pairs), so the texts go
 * to the blob store once, here. Content-addressed: a retried call writes nothing new and returns the same
 * references.
 */
export function createMctsStoreActivities(blobs: BlobStore) {
  return {
    /** Stores each text as a `.txt` blob; `refs[i]` is the reference of `texts[i]`. */
    async storeCompletions(input: { texts: string[] }): Promise<{ refs: string[] }> {
      if (!Array.isArray(input?.texts) || input.texts.some((t) => typeof t !== 'string')) {
        throw ApplicationFailure.nonRetryable('storeCompletions needs { texts: string[] }', 'InvalidInput');
      }
      const refs: string[] = [];
      for (const t of input.texts) refs.push(await blobs.put(t, 'txt'));
      return { refs };
    },
  };
}

export type MctsStoreActivities = ReturnType<typeof createMctsStoreActivities>;
