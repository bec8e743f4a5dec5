/**
 * Untrusted text (goal, URL, accessibility tree, typed text, answers, critic input) on its way into a prompt.
 *
 * A tokenizer matches its added tokens anywhere in a string, before any other rule: a page that spells
 * `<|im_end|>` ends the user turn, a typed `<|image_pad|>` asks for an image that does not exist. So every
 * occurrence of an added token's text is broken with a zero-width space after its first character: the model
 * still reads the characters, the tokenizer no longer sees the token. The learner applies the same rule
 * (workers/learner/halo_learner/prompt_text.py) to what it encodes, so both sides produce the same tokens.
 */

/**
 * The added tokens of Qwen3-VL's tokenizer (`added_tokens` of its tokenizer.json, ids 151643–151668, special or
 * not: the tokenizer splits on both). The learner checks its own tokenizer's added tokens against this list at
 * start and neutralises their union, so a model with more of them is still safe on the colocated path.
 */
export const QWEN3_VL_ADDED_TOKENS: readonly string[] = [
  '<|endoftext|>',
  '<|im_start|>',
  '<|im_end|>',
  '<|object_ref_start|>',
  '<|object_ref_end|>',
  '<|box_start|>',
  '<|box_end|>',
  '<|quad_start|>',
  '<|quad_end|>',
  '<|vision_start|>',
  '<|vision_end|>',
  '<|vision_pad|>',
  '<|image_pad|>',
  '<|video_pad|>',
  '<tool_call>',
  '</tool_call>',
  '<|fim_prefix|>',
  '<|fim_middle|>',
  '<|fim_suffix|>',
  '<|fim_pad|>',
  '<|repo_name|>',
  '<|file_sep|>',
  '<tool_response>',
  '</tool_response>',
  '<think>',
  '</think>',
];

const BREAK = '\u200b';

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

// Longest first, so a token that is a prefix of another never wins the alternation.
const TOKEN_PATTERN = new RegExp(
  [...QWEN3_VL_ADDED_TOKENS]
    .sort((a, b) => b.length - a.length)
    .map(escapeRegExp)
    .join('|'),
  'g',
);

/** The added tokens spelled in `text`, in order of appearance (empty for ordinary text). */
export function addedTokensIn(text: string): string[] {
  return [...text.matchAll(TOKEN_PATTERN)].map((m) => m[0]);
}

/**
 * `text` with every added token's spelling broken. Idempotent, and repeated until nothing matches: breaking one
 * occurrence can never join its neighbours into another, but the loop makes that a checked property, not a belief.
 */
export function neutraliseAddedTokens(text: string): string {
  let out = text;
  for (;;) {
    const next = out.replace(TOKEN_PATTERN, (tok) => tok[0] + BREAK + tok.slice(1));
    if (next === out) return out;
    out = next;
  }
}
