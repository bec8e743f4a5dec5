import { ApplicationFailure } from '@temporalio/activity';
import { BlobNotFoundError, type BlobStore } from '../blob/store';
import type { LearnerBatchActivities } from './learner-batches';
import { collectPairs, joinSnapshot, pairsSummary, type MctsPairsSummary, type MctsSnapshot, type MctsSnapshotChunk } from '../lib/search/mcts-search';
import type { Tree } from '../lib/search/mcts';
import { MctsPairSchema, type MctsPair } from '../lib/training/experience';
import { describeZodError } from '../lib/training/learner-types';

/**
 * Blob work of the MCTS search (control worker): what grows with the tree stays out of workflow payloads.
 * - `storeCompletions`: the colocated sampler returns its completions inline; the tree keeps only their
 *   references (content-addressed: a retried call writes nothing new and returns the same references).
 * - `collectMctsPairs`: the step-level DPO pairs of a finished search, from its stored tree, as a blob; each
 *   carries the sampler's token references of its two completions when the tree kept them.
 * - `writeMctsDpoBatch`: the learner's DPO batch from those blobs, through `writeDpoBatch` (validated
 *   against the learner's schema, references resolved).
 */

/** A stored search tree (manifest + node chunks) from the blob store. */
export async function loadMctsSnapshot(blobs: BlobStore, ref: string): Promise<{ snapshot: MctsSnapshot; tree: Tree }> {
  const snapshot = await blobs.getJson<MctsSnapshot>(ref);
  if (snapshot?.version !== 1 || !Array.isArray(snapshot.chunks)) throw new Error(`${ref} is not an MCTS tree snapshot`);
  const chunks = await Promise.all(snapshot.chunks.map((c) => blobs.getJson<MctsSnapshotChunk>(c)));
  return { snapshot, tree: joinSnapshot(snapshot, chunks) };
}

function permanent(err: unknown, type: string): never {
  if (err instanceof BlobNotFoundError || (err instanceof Error && !('code' in err))) {
    throw ApplicationFailure.create({ message: (err as Error).message, type, nonRetryable: true });
  }
  throw err; // I/O trouble: let Temporal retry
}

export function createMctsStoreActivities(blobs: BlobStore, batches: Pick<LearnerBatchActivities, 'writeDpoBatch'>) {
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

    /** The DPO pairs of the stored tree (its α and θ): summary plus a blob holding the `MctsPair[]`. */
    async collectMctsPairs(input: { snapshot_ref: string }): Promise<MctsPairsSummary> {
      const loaded = await loadMctsSnapshot(blobs, input.snapshot_ref).catch((err: unknown) => permanent(err, 'MctsSnapshotInvalid'));
      const { snapshot, tree } = loaded;
      const pairs: MctsPair[] = collectPairs(tree, snapshot.alpha, snapshot.pairThreshold);
      return pairsSummary(pairs, pairs.length > 0 ? await blobs.putJson(pairs) : null);
    },

    /** One DPO batch from the pair blobs of an iteration's searches; returns the `batch_ref` for `update_dpo`. */
    async writeMctsDpoBatch(input: { pairs_refs: string[] }): Promise<{ batch_ref: string; pairs: number }> {
      const all: MctsPair[] = [];
      for (const ref of input.pairs_refs ?? []) {
        const value = await blobs.getJson<unknown>(ref).catch((err: unknown) => permanent(err, 'BlobNotFound'));
        const parsed = MctsPairSchema.array().safeParse(value);
        if (!parsed.success) throw ApplicationFailure.create({ message: describeZodError(parsed.error, `DPO pairs ${ref}`), type: 'InvalidLearnerBatch', nonRetryable: true });
        all.push(...parsed.data);
      }
      const batchRef = await batches.writeDpoBatch({
        pairs: all.map((p) => ({
          prompt_ref: p.prompt_ref,
          chosen_ref: p.chosen_ref,
          rejected_ref: p.rejected_ref,
          chosen_tokens_ref: p.chosen_tokens_ref ?? null,
          rejected_tokens_ref: p.rejected_tokens_ref ?? null,
          ref_chosen_logprob: p.ref_chosen_logprob,
          ref_rejected_logprob: p.ref_rejected_logprob,
        })),
      });
      return { batch_ref: batchRef, pairs: all.length };
    },
  };
}

export type MctsStoreActivities = ReturnType<typeof createMctsStoreActivities>;
