import type { JsonReply } from './chat-server';
import { fakeLogprob } from './fake-policy-server';
import { byteIds, DEFAULT_VOCAB, tokenText, type FakeVocab } from './fake-vocab';

/**
 * The fake vLLM's free whitespace in constrained output, as vLLM's xgrammar backend allows it when the server runs
 * without `--structured-outputs-config '{"disable_any_whitespace":true,…}'` (its default; the request's own
 * `disable_any_whitespace` is ignored, vllm/v1/structured_output/backend_xgrammar.py): `[ \n\r\t]*` around every
 * `{ } [ ] , :` of the JSON, never before or after it. A constrained answer (`structured_outputs.json`) gets a space
 * after `{`/`[`, before `}`/`]` and around `:` and `,` (the compact separators' own space counts as the one after). When `logit_bias` favours a whitespace token, the answer is
 * what greedy decoding then gives: the JSON's `{` followed by that whitespace until `max_tokens`, finish_reason
 * `length`. Token ids stay those of the text (the server's byte vocabulary, one id per byte: fake-vocab.ts).
 */

const WHITESPACE = [' ', '\t', '\n', '\r'];
/** The default fake tokenizer's ids of the whitespace characters, which `/tokenize` gives for them. */
export const FAKE_WHITESPACE_IDS = WHITESPACE.map((c) => DEFAULT_VOCAB.byteIds[c.charCodeAt(0)]);
/** What a request without `max_tokens` gets before the whitespace stops (the fake has no context length). */
const DEFAULT_MAX_TOKENS = 256;

/** vLLM's `POST /tokenize` body for a prompt: the fake tokenizer's ids (no special tokens: it has no BOS). */
export function fakeTokenize(prompt: string, maxModelLen: number, vocab: FakeVocab = DEFAULT_VOCAB): Record<string, unknown> {
  const tokens = byteIds(vocab, prompt);
  return { count: tokens.length, max_model_len: maxModelLen, tokens, token_strs: null };
}

/** The whitespace character the request's `logit_bias` favours most, if it favours one. */
function favouredWhitespace(body: Record<string, unknown>, vocab: FakeVocab): string | undefined {
  const bias = body.logit_bias;
  if (!bias || typeof bias !== 'object') return undefined;
  let best: { ch: string; v: number } | undefined;
  for (const [k, v] of Object.entries(bias as Record<string, unknown>)) {
    const i = WHITESPACE.findIndex((c) => vocab.byteIds[c.charCodeAt(0)] === Number(k));
    if (i >= 0 && typeof v === 'number' && v > 0 && (!best || v > best.v)) best = { ch: WHITESPACE[i], v };
  }
  return best?.ch;
}

/** Byte offsets of the JSON's structural characters in `text` (outside strings), from its first `{` to the matching `}`. */
function structure(bytes: Buffer): { at: number; ch: string }[] {
  const out: { at: number; ch: string }[] = [];
  const start = bytes.indexOf('{'.charCodeAt(0));
  if (start < 0) return out;
  let depth = 0;
  let inString = false;
  let escaped = false;
  for (let i = start; i < bytes.length; i++) {
    const ch = String.fromCharCode(bytes[i]);
    if (inString) {
      if (escaped) escaped = false;
      else if (ch === '\\') escaped = true;
      else if (ch === '"') inString = false;
      continue;
    }
    if (ch === '"') inString = true;
    else if ('{}[],:'.includes(ch)) {
      out.push({ at: i, ch });
      if (ch === '{' || ch === '[') depth++;
      if (ch === '}' || ch === ']') depth--;
      if (depth === 0) break;
    }
  }
  return out;
}

/** The text with free whitespace, and for each of its bytes the original byte it is (-1: inserted whitespace). */
function spaced(bytes: Buffer, favoured: string | undefined, maxTokens: number): { bytes: Buffer; origin: number[]; cut: boolean } {
  const marks = structure(bytes);
  if (marks.length === 0) return { bytes, origin: [...bytes.keys()], cut: false };
  if (favoured) {
    // Greedy decoding with whitespace favoured: after the first `{`, whitespace until the token budget runs out.
    const keep = Math.min(marks[0].at + 1, maxTokens);
    const n = Math.max(0, maxTokens - keep);
    const origin = [...Array(keep).keys(), ...Array<number>(n).fill(-1)];
    return { bytes: Buffer.concat([bytes.subarray(0, keep), Buffer.from(favoured.repeat(n))]), origin, cut: true };
  }
  const before = new Map<number, string>();
  const after = new Map<number, string>();
  for (const { at, ch } of marks) {
    if (ch === '{' || ch === '[') after.set(at, ' ');
    else if (ch === '}' || ch === ']') before.set(at, ' ');
    else {
      before.set(at, ' ');
      if (bytes[at + 1] !== 0x20) after.set(at, ' ');
    }
  }
  const out: number[] = [];
  const origin: number[] = [];
  const insert = (ws: string | undefined) => {
    for (const c of ws ?? '') {
      out.push(c.charCodeAt(0));
      origin.push(-1);
    }
  };
  for (let i = 0; i < bytes.length; i++) {
    insert(before.get(i));
    out.push(bytes[i]);
    origin.push(i);
    insert(after.get(i));
  }
  return { bytes: Buffer.from(out), origin, cut: false };
}

type TokenEntry = { token: string; logprob: number; bytes: number[]; top_logprobs: unknown[] };

/** One choice of a constrained answer, rewritten with free whitespace; its token fields follow the new text. */
function rewriteChoice(choice: Record<string, unknown>, body: Record<string, unknown>, vocab: FakeVocab): Record<string, unknown> {
  const message = choice.message as { content?: unknown } | undefined;
  if (typeof message?.content !== 'string') return choice;
  const maxTokens = Number(body.max_tokens ?? body.max_completion_tokens ?? DEFAULT_MAX_TOKENS);
  const old = Buffer.from(message.content, 'utf8');
  const { bytes, origin, cut } = spaced(old, favouredWhitespace(body, vocab), maxTokens);
  const finish = cut ? 'length' : choice.finish_reason;
  const ended = finish === 'stop';
  const out: Record<string, unknown> = { ...choice, message: { ...message, content: bytes.toString('utf8') }, finish_reason: finish };
  const ids = [...byteIds(vocab, bytes), ...(ended ? [vocab.eos] : [])];
  if (Array.isArray(choice.token_ids)) out.token_ids = ids;
  const lp = choice.logprobs as { content?: TokenEntry[] } | undefined;
  if (Array.isArray(lp?.content)) {
    const entries = lp.content;
    const asIds = entries.some((e) => e.token.startsWith('token_id:'));
    const mapped = origin.map((o, j): TokenEntry => {
      if (o >= 0 && entries[o]) return entries[o];
      const id = vocab.byteIds[bytes[j]];
      const token = asIds ? `token_id:${id}` : tokenText(vocab, id);
      return { token, logprob: fakeLogprob(id, j), bytes: [...Buffer.from(token, 'latin1')], top_logprobs: [] };
    });
    if (ended && entries.length > old.length) mapped.push(entries[entries.length - 1]);
    out.logprobs = { ...lp, content: mapped };
  }
  return out;
}

/**
 * A chat answer as a server without `disable_any_whitespace` gives it: unchanged unless the request is constrained
 * (`structured_outputs.json`) and answered (200).
 */
export function withFreeWhitespace(reply: JsonReply, body: Record<string, unknown>, vocab: FakeVocab = DEFAULT_VOCAB): JsonReply {
  const so = body.structured_outputs as { json?: unknown } | undefined;
  if (reply.status !== 200 || so?.json == null) return reply;
  const b = reply.body as { choices?: Record<string, unknown>[] };
  if (!Array.isArray(b?.choices)) return reply;
  return { ...reply, body: { ...b, choices: b.choices.map((c) => rewriteChoice(c, body, vocab)) } };
}
