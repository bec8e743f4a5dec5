/**
 * AI self-critique (Agent Q's "AI process supervision"), pure part: the critic prompt and the parser of
 * its answer. The critic is the base model itself, asked once per expanded state to rank the K candidate
 * actions the policy proposed (best first) and to estimate the probability of task success from that
 * state. (Agent Q asks K times, removing the best action each round; one call with the full ranking is
 * our cheaper variant.)
 *
 * The critic's output is untrusted data: `parseCriticAnswer` never throws, and anything unusable becomes
 * a neutral verdict (ranking = identity, value 0.5) with `ok: false` and a reason, which callers count.
 */
import { firstJsonObject, kindOf, nonObjectJsonKind, type JsonObject } from '../model-io/json-object';
import { clip } from '../model-io/actions';
import { userTurn, type PromptMessage } from '../model-io/prompt';
import type { CredentialName } from '../serving/credentials';

/** The critic model server (OpenAI-compatible; usually the policy's own vLLM serving the base model). */
export interface CriticConfig {
  baseUrl: string;
  model: string;
  /** The API key by name (the worker maps it to its environment); default `critic`. */
  credential?: CredentialName;
  /** Deprecated: accepted only when it names the variable the worker maps the credential to. */
  apiKeyEnv?: string;
  timeoutMs: number;
  temperature: number;
  /** Completion budget; default CRITIC_MAX_TOKENS. */
  maxTokens?: number;
}

export interface CriticObservation {
  goal: string;
  url: string;
  axtree: string;
  screenshotRef: string;
  /** Shown when given. */
  step?: number;
}

export interface CriticVerdict {
  /** A full permutation of 0..k-1, best candidate first. */
  ranking: number[];
  /** Estimated probability of task success from this state, in [0, 1]. */
  value: number;
  /** False when the answer was unusable and the neutral verdict was returned. */
  ok: boolean;
  /** Why the answer was unusable (ok false), or a note on a repaired answer (partial ranking, ok true). */
  reason?: string;
}

/** Longer answers are rejected outright (runaway generations); checked first, so rejecting them is O(1). */
export const MAX_CRITIC_OUTPUT_CHARS = 20_000;
/** The value of the neutral verdict: no information either way. */
export const NEUTRAL_VALUE = 0.5;
/** Candidate texts in the prompt are one line each, clipped to this. */
export const MAX_CANDIDATE_CHARS = 300;
const MAX_REASON_CHARS = 200;

/** Header of the candidate list in the prompt; testing/fake-critic-server.ts reads the list after it. */
export const CANDIDATES_HEADER = 'Candidate actions:';

export function criticSystemPrompt(): string {
  return [
    'You are the critic of a web agent. You see a screenshot of a browser page, its accessibility tree, the',
    "agent's goal and a numbered list of candidate next actions the agent proposed.",
    '1. Rank ALL candidate actions from best to worst: the best action makes the most progress towards the goal',
    '   from the current page; actions that do nothing useful, repeat work or end the task too early are worst.',
    '2. Estimate the probability (0.0 to 1.0) that the agent completes the task successfully from the current state.',
    '',
    'Answer with only a JSON object, no other text, in this format:',
    '{"ranking": [2, 0, 1], "value": 0.6}',
    '"ranking" lists every candidate number exactly once, best first (candidate numbers start at 0);',
    '"value" is the success probability.',
  ].join('\n');
}

/** The critic prompt, in the same message format as lib/model-io/prompt.ts (the screenshot as an image reference). */
export function buildCriticPrompt(obs: CriticObservation, candidates: readonly string[]): PromptMessage[] {
  const k = candidates.length;
  const lines = [
    `Goal: ${obs.goal}`,
    `URL: ${obs.url}`,
    ...(obs.step === undefined ? [] : [`Step: ${obs.step}`]),
    '',
    'Accessibility tree:',
    obs.axtree || '(empty)',
    '',
    CANDIDATES_HEADER,
    ...candidates.map((c, i) => `${i}. ${oneLine(c)}`),
    '',
    `Rank all ${k} candidate actions (numbers 0 to ${k - 1}) from best to worst and estimate the probability of ` + 'success from this state. Answer with the JSON object only.',
  ];
  return [{ role: 'system', content: [{ type: 'text', text: criticSystemPrompt() }] }, userTurn(obs.screenshotRef, lines.join('\n'))];
}

function oneLine(s: string): string {
  return clip(
    String(s)
      .replace(/\s*[\r\n]+\s*/g, ' ')
      .trim(),
    MAX_CANDIDATE_CHARS,
  );
}

/** The neutral verdict: identity ranking, value 0.5. */
export function neutralVerdict(k: number, reason: string): CriticVerdict {
  const n = Number.isInteger(k) && k > 0 ? k : 0;
  return { ranking: Array.from({ length: n }, (_, i) => i), value: NEUTRAL_VALUE, ok: false, reason: clip(reason, MAX_REASON_CHARS) };
}

/** Internal control flow: thrown by helpers, caught only by parseCriticAnswer. */
class CriticParseFailure extends Error {}
function fail(reason: string): never {
  throw new CriticParseFailure(reason);
}

/**
 * Parses the critic's answer for `k` candidates. Never throws.
 *
 * Accepted: a JSON object `{"ranking": [...], "value": x}` (other keys ignored), bare, in a ```json fence or
 * inside prose, after an optional `<think>...</think>` block. Rules:
 * - `ranking` is an array of distinct integer indexes in 0..k-1 (JSON numbers; "1" is rejected);
 * - a partial ranking (some indexes missing) is completed by appending the missing indexes in increasing
 *   order: the critic's preferences among the ones it named are kept (ok true, with a note in `reason`);
 *   an empty ranking says nothing and is rejected (for k > 0);
 * - `value` is a JSON number in [0, 1] (percentages such as 70 are rejected).
 * Anything else (no JSON, missing fields, out-of-range or duplicate indexes, a value out of range, text
 * longer than MAX_CRITIC_OUTPUT_CHARS, a non-string) gives the neutral verdict with ok false and a reason.
 */
export function parseCriticAnswer(text: string, k: number): CriticVerdict {
  try {
    if (!Number.isInteger(k) || k < 0) fail(`invalid candidate count ${String(k)}`);
    if (typeof text !== 'string') fail(`expected a string, got ${kindOf(text)}`);
    if (text.length > MAX_CRITIC_OUTPUT_CHARS) fail(`output too long (${text.length} chars)`);
    if (text.trim() === '') fail('empty output');
    const obj = extractObject(stripThinking(text));
    const ranking = readRanking(obj, k);
    const value = readValue(obj);
    const verdict: CriticVerdict = { ranking: ranking.full, value, ok: true };
    if (ranking.named < k) verdict.reason = `partial ranking: ${ranking.named} of ${k} candidates ranked; the rest appended in index order`;
    return verdict;
  } catch (err) {
    const reason = err instanceof CriticParseFailure ? err.message : `internal critic parser error: ${err instanceof Error ? err.message : String(err)}`;
    return neutralVerdict(k, reason);
  }
}

/**
 * Priors from a ranking, linear in the rank: the best candidate gets 1, the worst 0, evenly spaced in
 * between (rank r of k gets (k−1−r)/(k−1)); a single candidate gets 1. `priors[i]` is candidate i's prior.
 * Expects a permutation of 0..k-1 (what parseCriticAnswer returns).
 */
export function rankToPriors(ranking: readonly number[]): number[] {
  const k = ranking.length;
  const priors = new Array<number>(k).fill(0);
  ranking.forEach((candidate, rank) => {
    if (Number.isInteger(candidate) && candidate >= 0 && candidate < k) priors[candidate] = k === 1 ? 1 : (k - 1 - rank) / (k - 1);
  });
  return priors;
}

// ---------------------------------------------------------------------------
// Locating the JSON object
// ---------------------------------------------------------------------------

/** Drops reasoning: everything up to the last `</think>`; an unclosed `<think>` hides the rest. */
function stripThinking(text: string): string {
  const close = text.lastIndexOf('</think>');
  const visible = close === -1 ? text : text.slice(close + '</think>'.length);
  const open = visible.indexOf('<think>');
  if (open !== -1) {
    const before = visible.slice(0, open);
    if (before.trim() === '') fail('no answer found (unterminated <think> block)');
    return before;
  }
  return visible;
}

function extractObject(text: string): JsonObject {
  // A completion that is pure JSON but not an object is a format error; say which.
  const kind = nonObjectJsonKind(text);
  if (kind !== undefined) fail(`JSON ${kind} at top level; expected {"ranking": [...], "value": ...}`);
  const scan = firstJsonObject(text);
  if (scan.kind === 'found') return scan.value;
  if (scan.kind === 'truncated') fail('truncated JSON: object is never closed');
  if (scan.kind === 'invalid') fail(`invalid JSON: ${scan.error}`);
  return fail('no JSON object found');
}

// ---------------------------------------------------------------------------
// Fields
// ---------------------------------------------------------------------------

function readRanking(obj: JsonObject, k: number): { full: number[]; named: number } {
  if (!has(obj, 'ranking')) fail('missing "ranking"');
  const raw = obj.ranking;
  if (!Array.isArray(raw)) fail(`ranking: must be an array (got ${kindOf(raw)})`);
  if (k > 0 && raw.length === 0) fail('ranking: is empty');
  if (raw.length > k) fail(`ranking: has ${raw.length} entries for ${k} candidates`);
  const seen = new Set<number>();
  for (const [pos, v] of raw.entries()) {
    if (typeof v !== 'number' || !Number.isInteger(v)) fail(`ranking[${pos}]: must be an integer index (got ${clip(JSON.stringify(v) ?? kindOf(v), 40)})`);
    if (v < 0 || v >= k) fail(`ranking[${pos}]: index ${v} is out of range 0..${k - 1}`);
    if (seen.has(v)) fail(`ranking: index ${v} appears twice`);
    seen.add(v);
  }
  const full = raw.map((v) => (Object.is(v, -0) ? 0 : (v as number)));
  for (let i = 0; i < k; i++) if (!seen.has(i)) full.push(i);
  return { full, named: raw.length };
}

function readValue(obj: JsonObject): number {
  if (!has(obj, 'value')) fail('missing "value"');
  const v = obj.value;
  if (typeof v !== 'number') fail(`value: must be a number (got ${kindOf(v)})`);
  if (!Number.isFinite(v) || v < 0 || v > 1) fail(`value: must be between 0 and 1 (got ${v})`);
  return v === 0 ? 0 : v; // -0 → 0
}

function has(obj: JsonObject, key: string): boolean {
  return Object.hasOwn(obj, key);
}

// ---------------------------------------------------------------------------
// Outcome judgement (test-time search): was the goal achieved when the episode ended?
// ---------------------------------------------------------------------------

/** Header of the action list in the outcome prompt; testing/fake-critic-server.ts tells the prompts apart by it. */
export const ACTIONS_TAKEN_HEADER = 'Actions taken:';

export function outcomeSystemPrompt(): string {
  return [
    'You are the critic of a web agent. The agent has ended its episode: it finished the task, sent its final',
    'answer, or the page ended the task. You see a screenshot of the final page, its accessibility tree, the',
    "agent's goal and the actions it took.",
    'Estimate the probability (0.0 to 1.0) that the goal was achieved.',
    '',
    'Answer with only a JSON object, no other text, in this format:',
    '{"value": 0.9}',
  ].join('\n');
}

/** The outcome prompt: the final state and the action path, no candidates. */
export function buildOutcomePrompt(obs: CriticObservation, actions: readonly string[]): PromptMessage[] {
  const lines = [
    `Goal: ${obs.goal}`,
    `URL: ${obs.url}`,
    '',
    'Accessibility tree:',
    obs.axtree || '(empty)',
    '',
    ACTIONS_TAKEN_HEADER,
    ...(actions.length ? actions.map((a, i) => `${i + 1}. ${oneLine(a)}`) : ['(none)']),
    '',
    'Estimate the probability that the goal was achieved. Answer with the JSON object only.',
  ];
  return [{ role: 'system', content: [{ type: 'text', text: outcomeSystemPrompt() }] }, userTurn(obs.screenshotRef, lines.join('\n'))];
}

export interface OutcomeVerdict {
  /** Estimated probability that the goal was achieved, in [0, 1]; NEUTRAL_VALUE when unusable. */
  value: number;
  ok: boolean;
  reason?: string;
}

/**
 * Parses the critic's outcome answer. Never throws. Accepted: a JSON object with `value` (a JSON number in
 * [0, 1]; other keys such as a `ranking` are ignored), found as parseCriticAnswer finds it. Anything else gives
 * the neutral value with ok false and a reason.
 */
export function parseOutcomeAnswer(text: string): OutcomeVerdict {
  try {
    if (typeof text !== 'string') fail(`expected a string, got ${kindOf(text)}`);
    if (text.length > MAX_CRITIC_OUTPUT_CHARS) fail(`output too long (${text.length} chars)`);
    if (text.trim() === '') fail('empty output');
    return { value: readValue(extractObject(stripThinking(text))), ok: true };
  } catch (err) {
    const reason = err instanceof CriticParseFailure ? err.message : `internal critic parser error: ${err instanceof Error ? err.message : String(err)}`;
    return { value: NEUTRAL_VALUE, ok: false, reason: clip(reason, MAX_REASON_CHARS) };
  }
}
