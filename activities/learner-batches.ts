import { ApplicationFailure } from '@temporalio/activity';
import { z } from 'zod';
import { BlobNotFoundError, type BlobStore } from '../blob/store';
import { BLOB_REF, DpoBatchSchema, GrpoBatchSchema, describeZodError, type DpoPairInput, type GrpoItemInput, type LearnerPrompt } from '../lib/training/learner-types';

/**
 * Writers of the learner's batch blobs (control worker). The batch is validated against the same schema the
 * Python learner applies (lib/training/learner-types.ts), so a bad batch fails here, next to the code that built it,
 * with the offending field named, and the learner only ever receives batches it accepts.
 *
 * To keep workflow histories small (no large blobs in Temporal payloads), an item may name its prompt and
 * its texts by blob reference instead of inline: `prompt_ref` (the prompt JSON `samplePolicy` stored, e.g.
 * `SampleResult.promptRef`), `completion_ref` / `chosen_ref` / `rejected_ref` (text blobs such as
 * `completionRef`). They are resolved here; the stored batch always holds the full, inline values.
 */

type PromptSource = { prompt: LearnerPrompt; prompt_ref?: never } | { prompt_ref: string; prompt?: never };
type TextSource<K extends string> = ({ [P in K]: string } & { [P in `${K}_ref`]?: never }) | ({ [P in `${K}_ref`]: string } & { [P in K]?: never });

export type GrpoBatchItemRequest = Omit<GrpoItemInput, 'prompt' | 'completion'> & PromptSource & TextSource<'completion'>;
export type DpoBatchPairRequest = Omit<DpoPairInput, 'prompt' | 'chosen' | 'rejected'> & PromptSource & TextSource<'chosen'> & TextSource<'rejected'>;

export interface GrpoBatchRequest {
  items: GrpoBatchItemRequest[];
  max_completion_len?: number | null;
}
export interface DpoBatchRequest {
  pairs: DpoBatchPairRequest[];
}

const ref = z.string().regex(BLOB_REF, 'not a blob reference (sha256:<64 hex>.<ext>)');
const RequestEnvelope = z.looseObject({
  prompt_ref: ref.optional(),
  completion_ref: ref.optional(),
  chosen_ref: ref.optional(),
  rejected_ref: ref.optional(),
});

export function createLearnerBatchActivities(blobs: BlobStore) {
  /** Replaces `<key>_ref` by `<key>` (read from the blob store) in one item; caches reads within one batch. */
  async function resolve(raw: unknown, where: string, keys: string[], cache: Map<string, unknown>): Promise<unknown> {
    const env = RequestEnvelope.safeParse(raw);
    if (!env.success) throw invalid(describeZodError(env.error, where));
    const item: Record<string, unknown> = { ...env.data };
    for (const key of keys) {
      const r = item[`${key}_ref`];
      if (r === undefined) continue;
      if (item[key] !== undefined) throw invalid(`invalid ${where}: give ${key} or ${key}_ref, not both`);
      delete item[`${key}_ref`];
      const cacheKey = `${key}:${r}`;
      if (!cache.has(cacheKey)) {
        const bytes = await read(r as string, `${where}.${key}_ref`);
        cache.set(cacheKey, key === 'prompt' ? parseJson(bytes, `${where}.prompt_ref`) : bytes.toString('utf8'));
      }
      item[key] = cache.get(cacheKey);
    }
    return item;
  }

  async function read(r: string, where: string): Promise<Buffer> {
    try {
      return await blobs.get(r);
    } catch (err) {
      if (err instanceof BlobNotFoundError) {
        throw ApplicationFailure.create({ message: `${where}: ${err.message}`, type: 'BlobNotFound', nonRetryable: true });
      }
      throw err; // I/O trouble: let Temporal retry
    }
  }

  async function store(schema: z.ZodType, value: unknown, what: string): Promise<string> {
    const parsed = schema.safeParse(value);
    if (!parsed.success) throw invalid(describeZodError(parsed.error, what));
    return blobs.putJson(parsed.data);
  }

  return {
    /** Validates a GRPO batch (`GrpoBatch` of payloads.py) and stores it; returns the `batch_ref` for `update_policy`. */
    async writeGrpoBatch(batch: GrpoBatchRequest): Promise<string> {
      if (!Array.isArray(batch?.items)) throw invalid('invalid GRPO batch: items: expected an array');
      const cache = new Map<string, unknown>();
      const items = [];
      for (const [i, it] of batch.items.entries()) items.push(await resolve(it, `items.${i}`, ['prompt', 'completion'], cache));
      return store(GrpoBatchSchema, { ...batch, items }, 'GRPO batch');
    },

    /** Validates a DPO batch (`DpoBatch` of payloads.py) and stores it; returns the `batch_ref` for `update_dpo`. */
    async writeDpoBatch(batch: DpoBatchRequest): Promise<string> {
      if (!Array.isArray(batch?.pairs)) throw invalid('invalid DPO batch: pairs: expected an array');
      const cache = new Map<string, unknown>();
      const pairs = [];
      for (const [i, p] of batch.pairs.entries()) pairs.push(await resolve(p, `pairs.${i}`, ['prompt', 'chosen', 'rejected'], cache));
      return store(DpoBatchSchema, { ...batch, pairs }, 'DPO batch');
    },
  };
}

export type LearnerBatchActivities = ReturnType<typeof createLearnerBatchActivities>;

function invalid(message: string): ApplicationFailure {
  return ApplicationFailure.create({ message, type: 'InvalidLearnerBatch', nonRetryable: true });
}

function parseJson(bytes: Buffer, where: string): unknown {
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch (err) {
    throw invalid(`${where}: the blob is not JSON (${(err as Error).message})`);
  }
}
