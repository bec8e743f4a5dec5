import type { GrammarWhitespace } from './action-grammar';

/**
 * The vLLM releases whose grammar call the learner mirrors, by how each compiles `structured_outputs.json`
 * (`v1/structured_output/backend_xgrammar.py`, `compile_grammar`, read from the released wheels; tools/vllm-wheel-contract.py
 * reads them again). With `disable_any_whitespace` on, 0.32 and 0.33 pass `separators=(",", ":")` and write
 * `{"a":1}`; 0.31 (the Python 3.10 fallback of ./launch.sh gpu) passes none and writes xgrammar's default `{"a": 1}`.
 * A learner that compiles the other call refuses every completion (GrammarMismatch), so the blob says which one.
 */
export const VLLM_SERVERS = ['vllm-0.33', 'vllm-0.31'] as const;
export type VllmServer = (typeof VLLM_SERVERS)[number];
/** The colocated sampler is the learner itself: it compiles whatever the blob says, vLLM 0.33's call by default. */
export type GrammarSampler = VllmServer | 'colocated';

export const VLLM_GRAMMAR_CALLS: Record<VllmServer, { compactSeparators: [string, string] | null; xgrammar: string }> = {
  // The xgrammar version is each wheel's pin (METADATA Requires-Dist): masks differ between versions (xgrammar issue 945).
  'vllm-0.33': { compactSeparators: [',', ':'], xgrammar: '0.2.8' },
  'vllm-0.31': { compactSeparators: null, xgrammar: '0.2.7' },
};

/**
 * The grammar blob a constrained sample refers to (its `grammarRef`): the schema and the exact xgrammar call its
 * sampler made (`compile_json_schema(schema, any_whitespace, separators)`, under xgrammar `xgrammar`, null when the
 * sampler is the learner's own), so the learner applies the mask the sample was drawn under.
 */
export interface GrammarBlob {
  schema: Record<string, unknown>;
  any_whitespace: boolean;
  separators: [string, string] | null;
  sampler: GrammarSampler | null;
  xgrammar: string | null;
}

const BLOB_KEYS = ['any_whitespace', 'sampler', 'schema', 'separators', 'xgrammar'];
const OLD_BLOB_KEYS = ['any_whitespace', 'schema'];

/** What `storeGrammar` writes for a grammar sampled by `sampler` under `whitespace`. */
export function grammarBlob(g: { schema: Record<string, unknown>; whitespace: GrammarWhitespace }, sampler: GrammarSampler): GrammarBlob {
  const call = VLLM_GRAMMAR_CALLS[sampler === 'colocated' ? 'vllm-0.33' : sampler];
  const any = g.whitespace === 'any';
  return { schema: g.schema, any_whitespace: any, separators: any ? null : call.compactSeparators, sampler, xgrammar: sampler === 'colocated' ? null : call.xgrammar };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return !!v && typeof v === 'object' && !Array.isArray(v);
}

/**
 * A stored grammar in any of its formats: the full call (recognised by exactly its keys); `{schema, any_whitespace}`
 * or a bare schema, written before blobs said their call, both compiled without separators as then.
 */
export function readGrammarBlob(value: unknown): GrammarBlob {
  if (!isObject(value)) throw new Error(`a grammar blob is a JSON object, got ${JSON.stringify(value)?.slice(0, 80)}`);
  const keys = Object.keys(value).sort().join();
  const old = { separators: null, sampler: null, xgrammar: null };
  if (keys !== BLOB_KEYS.join() && keys !== OLD_BLOB_KEYS.join()) return { schema: value, any_whitespace: false, ...old };
  const { schema, any_whitespace } = value;
  if (!isObject(schema)) throw new Error('grammar blob: schema must be a JSON object');
  if (typeof any_whitespace !== 'boolean') throw new Error(`grammar blob: any_whitespace must be true or false, got ${JSON.stringify(any_whitespace)}`);
  if (keys === OLD_BLOB_KEYS.join()) return { schema, any_whitespace, ...old };
  const { separators, sampler, xgrammar } = value;
  const pair = Array.isArray(separators) && separators.length === 2 && separators.every((s) => typeof s === 'string');
  if (separators !== null && !pair) throw new Error(`grammar blob: separators must be null or two strings, got ${JSON.stringify(separators)}`);
  if (sampler !== null && sampler !== 'colocated' && !VLLM_SERVERS.includes(sampler as VllmServer)) {
    throw new Error(`grammar blob: sampler must be null, colocated or one of ${VLLM_SERVERS.join(', ')}, got ${JSON.stringify(sampler)}`);
  }
  if (xgrammar !== null && typeof xgrammar !== 'string') throw new Error(`grammar blob: xgrammar must be null or a version, got ${JSON.stringify(xgrammar)}`);
  return { schema, any_whitespace, separators: separators as [string, string] | null, sampler: sampler as GrammarSampler | null, xgrammar };
}
