import { GRID_MAX, TOOL_ACTIONS, type ToolAction } from './actions';

/**
 * The grammar of constrained action decoding (`policy.constrained`): a JSON schema of one computer_use tool
 * call whose element ids are those on the current page and whose coordinates lie on the grid. Both
 * backends constrain with this same schema: the colocated sampler compiles it with xgrammar, the openai
 * backend sends it in vLLM's `structured_outputs.json`, and the learner compiles it again to apply the same
 * mask when it recomputes log-probs.
 *
 * Free whitespace is not part of the schema: vLLM's xgrammar backend decides it server-wide
 * (`--structured-outputs-config '{"backend":"xgrammar","disable_any_whitespace":true}'`; the request's own
 * `disable_any_whitespace` is ignored), so the stored grammar (`GrammarBlob`) says which whitespace it was
 * sampled under, with the separators of the vLLM release that samples (`policy.server`, lib/model-io/grammar-blob.ts), and
 * the learner compiles exactly that (`policy.grammarWhitespace`).
 *
 * Every string the schema admits is printable ASCII, so a completion has at most one token per byte and
 * `maxBytes` bounds its token count whatever tokenisation the sampler picks; free text is shortened until
 * the longest completion fits the token budget, so a compact constrained sample is never cut off mid-action.
 * With free whitespace no budget can promise that (xgrammar bounds none): `maxBytes` stays the compact length,
 * and a completion that whitespace pushed past the budget ends with finish_reason `length`, an invalid action.
 */

/** `compact`: no whitespace beyond the server's separators (vLLM started with disable_any_whitespace); `any`: vLLM's default. */
export const GRAMMAR_WHITESPACE = ['compact', 'any'] as const;
export type GrammarWhitespace = (typeof GRAMMAR_WHITESPACE)[number];

/**
 * The vLLM flag value (`--structured-outputs-config`) that makes the server sample under `whitespace`:
 * docker-compose.yml, bin/launch-gpu.sh and docs/episodes.md start it with the compact one, `halo doctor` names it.
 */
export function vllmStructuredOutputsConfig(whitespace: GrammarWhitespace): string {
  return JSON.stringify({ backend: 'xgrammar', disable_any_whitespace: whitespace === 'compact' });
}

/**
 * Printable ASCII without `"`, `\` and `<`: one byte per character, nothing to escape, and no way to spell a
 * tokenizer token (`<|im_end|>`, `<|image_pad|>`, `<tool_call>`: every added token of Qwen3-VL starts with `<`).
 * Without `<`, a sampler can neither write such a token character by character nor pick the token itself (its text
 * starts with `<`); the parser still refuses one that another sampler typed (lib/model-io/parse.ts).
 */
const TEXT_CHARS = '[ !#-;=-\\[\\]-~]';
const KEY_PATTERN = '^[A-Za-z0-9+]{1,10}$';
const MAX_KEYS = 3;
/** Free text longer than this is never needed for one action of the tasks we train on. */
export const GRAMMAR_TEXT_MAX = 64;
/** Text shorter than this makes `type` and `answer` useless: a budget that leaves less is a config error. */
const GRAMMAR_TEXT_MIN = 8;
const SCROLL_MAX = 2000;
const WAIT_MAX = 5;
/** Pages rarely carry more interactive elements than this; ids beyond it are left out of the enum. */
export const GRAMMAR_MAX_ELEMENTS = 500;

export interface ActionGrammar {
  /** The JSON schema, serialised compactly: stored as a blob and compiled by the sampler and the learner. */
  schema: Record<string, unknown>;
  /**
   * Longest completion the schema admits, in bytes, written with xgrammar's default `", "`/`": "` separators (an
   * upper bound for vLLM 0.33's `,`/`:`, and for the space xgrammar 0.2.8 still writes after some commas); with
   * `whitespace` any, the length without the free whitespace, which has no bound.
   */
  maxBytes: number;
  whitespace: GrammarWhitespace;
  elementIds: number[];
  textMax: number;
}

/** Element ids of an accessibility tree in our format (`[id] role "name" @(x,y)`, one element per line). */
export function elementIdsOf(axtree: string): number[] {
  const ids = new Set<number>();
  for (const m of axtree.matchAll(/^\s*\[(\d{1,9})\]/gm)) ids.add(Number(m[1]));
  return [...ids].sort((a, b) => a - b).slice(0, GRAMMAR_MAX_ELEMENTS);
}

const obj = (properties: Record<string, unknown>): Record<string, unknown> => ({
  type: 'object',
  properties,
  required: Object.keys(properties),
  additionalProperties: false,
});

const text = (max: number) => ({ type: 'string', pattern: `^${TEXT_CHARS}{0,${max}}$` });

/** One kind of tool call: the actions it admits, its schema, and its longest completion. */
type Variant = { actions: readonly ToolAction[]; schema: Record<string, unknown>; longest: Record<string, unknown> };

function variants(ids: number[], textMax: number, allowed: readonly ToolAction[]): Variant[] {
  const element = { enum: ids };
  const widestId = ids.length ? Math.max(...ids) : 0;
  const coordinate = { type: 'array', items: { type: 'integer', minimum: 0, maximum: GRID_MAX }, minItems: 2, maxItems: 2 };
  const pointer = (['left_click', 'double_click', 'right_click', 'mouse_move'] as const).filter((a) => allowed.includes(a));
  const longText = 'x'.repeat(textMax);
  const out: Variant[] = [
    {
      actions: pointer,
      schema: obj({ action: { enum: pointer }, coordinate }),
      longest: { action: pointer.includes('double_click') ? 'double_click' : (pointer[0] ?? 'left_click'), coordinate: [GRID_MAX, GRID_MAX] },
    },
    {
      actions: ['key'],
      schema: obj({ action: { const: 'key' }, keys: { type: 'array', items: { type: 'string', pattern: KEY_PATTERN }, minItems: 1, maxItems: MAX_KEYS } }),
      longest: { action: 'key', keys: Array(MAX_KEYS).fill('x'.repeat(10)) },
    },
    {
      actions: ['scroll'],
      schema: obj({
        action: { const: 'scroll' },
        pixels: {
          anyOf: [
            { type: 'integer', minimum: 1, maximum: SCROLL_MAX },
            { type: 'integer', minimum: -SCROLL_MAX, maximum: -1 },
          ],
        },
      }),
      longest: { action: 'scroll', pixels: -SCROLL_MAX },
    },
    { actions: ['wait'], schema: obj({ action: { const: 'wait' }, time: { type: 'integer', minimum: 1, maximum: WAIT_MAX } }), longest: { action: 'wait', time: WAIT_MAX } },
    { actions: ['answer'], schema: obj({ action: { const: 'answer' }, text: text(textMax) }), longest: { action: 'answer', text: longText } },
  ];
  if (ids.length > 0) {
    out.unshift(
      { actions: ['click_element'], schema: obj({ action: { const: 'click_element' }, element_id: element }), longest: { action: 'click_element', element_id: widestId } },
      {
        actions: ['type'],
        schema: obj({ action: { const: 'type' }, element_id: element, text: text(textMax) }),
        longest: { action: 'type', element_id: widestId, text: longText },
      },
    );
  }
  return out.filter((v) => v.actions.length > 0 && v.actions.every((a) => allowed.includes(a)));
}

/** Compact JSON the way xgrammar writes it without free whitespace: `", "` between items, `": "` after keys. */
function jsonBytes(value: unknown): number {
  return JSON.stringify(value).length + separators(value);
}

function separators(value: unknown): number {
  if (Array.isArray(value)) return Math.max(0, value.length - 1) + value.reduce((s: number, v) => s + separators(v), 0);
  if (value && typeof value === 'object') {
    const entries = Object.values(value as Record<string, unknown>);
    return entries.length + Math.max(0, entries.length - 1) + entries.reduce((s: number, v) => s + separators(v), 0);
  }
  return 0;
}

function build(ids: number[], textMax: number, whitespace: GrammarWhitespace, allowed: readonly ToolAction[] = TOOL_ACTIONS): ActionGrammar {
  const vs = variants(ids, textMax, allowed);
  if (vs.length === 0) {
    throw new Error(
      `policy.actions [${allowed.join(', ')}] leaves no action on this page${ids.length === 0 ? ' (it has no element ids for click_element or type)' : ''}; allow one that needs no element (answer, left_click, scroll, …)`,
    );
  }
  const schema = obj({ name: { const: 'computer_use' }, arguments: { anyOf: vs.map((v) => v.schema) } });
  const maxBytes = Math.max(...vs.map((v) => jsonBytes({ name: 'computer_use', arguments: v.longest })));
  return { schema, maxBytes, whitespace, elementIds: ids, textMax };
}

/**
 * The grammar for one observation under a token budget (`policy.maxTokens`, stop token included), limited to the
 * `allowed` actions (`policy.actions`). Throws when even the shortest useful text does not fit, naming the value
 * to raise, or when no allowed action is possible on the page.
 */
export function actionGrammar(axtree: string, maxTokens: number, whitespace: GrammarWhitespace = 'compact', allowed: readonly ToolAction[] = TOOL_ACTIONS): ActionGrammar {
  const ids = elementIdsOf(axtree);
  const budget = maxTokens - 1; // the stop token
  for (let textMax = GRAMMAR_TEXT_MAX; textMax >= GRAMMAR_TEXT_MIN; textMax--) {
    const g = build(ids, textMax, whitespace, allowed);
    if (g.maxBytes <= budget) return g;
  }
  const needed = build(ids, GRAMMAR_TEXT_MIN, whitespace, allowed).maxBytes + 1;
  throw new Error(
    `policy.maxTokens ${maxTokens} is too small for constrained decoding on this page: the longest action needs ${needed} tokens; raise policy.maxTokens to at least ${needed}`,
  );
}

/** The smallest `policy.maxTokens` that constrained decoding accepts on a page with ids up to `widestId`. */
export function minConstrainedMaxTokens(widestId = 99_999): number {
  return build([widestId], GRAMMAR_TEXT_MIN, 'compact').maxBytes + 1;
}
