/**
 * Turns a vision-language model's raw completion into a typed AgentAction.
 *
 * Model output is untrusted data: anything we cannot turn into a schema-valid
 * action becomes an InvalidAction with a short, specific reason (these are
 * counted as action-validity failures and shown to humans), never an exception.
 *
 * Accepted shapes, in order of preference:
 *  1. Qwen3-VL tool calls: `<tool_call>{"name": "computer_use", "arguments": {...}}</tool_call>`,
 *     with optional prose and `<think>` blocks around them.
 *  2. A JSON object anywhere in the text (bare, in a ```json fence, or with prose),
 *     either in the same `{"name", "arguments"}` shape or flat: `{"action": "click", "x": 1, "y": 2}`.
 */
import { matchingBrace } from './text';
import { firstJsonObject, kindOf, nonObjectJsonKind } from './json-object';
import type { z } from 'zod';
import { actionSchema, clip, GRID_MAX, type AgentAction, type InvalidAction } from './actions';
import { addedTokensIn } from './prompt-text';

/** Longer completions are rejected outright: they are runaway generations, and scanning them costs time. */
export const MAX_OUTPUT_CHARS = 20_000;
/** How much of the raw text an InvalidAction keeps for debugging. */
export const EXCERPT_CHARS = 200;
/** Tool names whose arguments we interpret as actions; browser_use is accepted as an alias of computer_use. */
export const ACCEPTED_TOOL_NAMES: readonly string[] = ['computer_use', 'browser_use'];

const MAX_REASON_CHARS = 200;

type Args = Record<string, unknown>;

/** Internal control flow: thrown by helpers, caught only by parseAction. */
class ParseFailure extends Error {}

function fail(reason: string): never {
  throw new ParseFailure(reason);
}

/** Parses one model completion. Never throws, whatever `text` is at runtime. */
export function parseAction(text: string): AgentAction {
  if (typeof text !== 'string') {
    return invalid(`expected a string, got ${kindOf(text)}`, '');
  }
  const excerpt = text.slice(0, EXCERPT_CHARS);
  try {
    return parseText(text);
  } catch (err) {
    if (err instanceof ParseFailure) return invalid(err.message, excerpt);
    // A bug in this file must still not crash the agent loop; surface it as an invalid action.
    return invalid(`internal parser error: ${err instanceof Error ? err.message : String(err)}`, excerpt);
  }
}

function invalid(reason: string, excerpt: string): InvalidAction {
  return { type: 'invalid', reason: clip(reason, MAX_REASON_CHARS), excerpt };
}

function parseText(text: string): AgentAction {
  // Checked before anything else so a multi-megabyte output is rejected in O(1).
  if (text.length > MAX_OUTPUT_CHARS) fail(`output too long (${text.length} chars)`);
  if (text.trim() === '') fail('empty output');

  const { visible, unterminatedThink } = stripThinking(text);
  const raw = extractToolCall(visible) ?? extractJsonObject(visible);
  if (raw === undefined) {
    fail(unterminatedThink ? 'no action found (unterminated <think> block)' : 'no action found');
  }
  return validate(toCandidate(raw));
}

// ---------------------------------------------------------------------------
// Locating the action in the text
// ---------------------------------------------------------------------------

const THINK_OPEN = '<think>';
const THINK_CLOSE = '</think>';

/**
 * Removes reasoning so tool calls drafted while thinking are not executed.
 * Qwen3 chat templates often put `<think>` in the prompt, so a leading `</think>`
 * without an opener means "everything before this was reasoning". An unclosed
 * `<think>` (generation cut off mid-thought) hides the rest of the text.
 * Uses indexOf rather than a lazy regex to stay linear on adversarial input.
 */
function stripThinking(text: string): { visible: string; unterminatedThink: boolean } {
  let pos = 0;
  const firstOpen = text.indexOf(THINK_OPEN);
  const firstClose = text.indexOf(THINK_CLOSE);
  if (firstClose !== -1 && (firstOpen === -1 || firstClose < firstOpen)) {
    pos = firstClose + THINK_CLOSE.length;
  }
  let visible = '';
  for (;;) {
    const open = text.indexOf(THINK_OPEN, pos);
    if (open === -1) return { visible: visible + text.slice(pos), unterminatedThink: false };
    visible += text.slice(pos, open);
    const close = text.indexOf(THINK_CLOSE, open + THINK_OPEN.length);
    if (close === -1) return { visible, unterminatedThink: true };
    pos = close + THINK_CLOSE.length;
  }
}

const TOOL_OPEN = '<tool_call>';
const TOOL_CLOSE = '</tool_call>';

/**
 * Returns the parsed JSON of the single `<tool_call>`, or undefined when there is none.
 * The closing tag is optional (generation may stop right after the JSON), but the
 * JSON object itself must be complete.
 */
function extractToolCall(text: string): unknown {
  const starts = allIndexesOf(text, TOOL_OPEN);
  if (starts.length === 0) return undefined;
  // Executing only the first of several calls would silently drop the model's intent.
  if (starts.length > 1) fail(`${starts.length} tool calls; exactly one expected`);

  const bodyStart = starts[0] + TOOL_OPEN.length;
  const close = text.indexOf(TOOL_CLOSE, bodyStart);
  const body = text.slice(bodyStart, close === -1 ? text.length : close);

  const open = body.indexOf('{');
  if (open === -1) fail('<tool_call> contains no JSON object');
  const end = matchingBrace(body, open);
  if (end === -1) fail('truncated tool call: JSON object is never closed');
  return parseJson(body.slice(open, end), 'invalid JSON in tool call');
}

/**
 * Returns the first JSON object in free text (bare, fenced, or surrounded by prose),
 * or undefined when the text has none. Prose may contain stray `{...}` that are not
 * JSON, so unparseable candidates are skipped as long as a later one parses.
 */
function extractJsonObject(text: string): unknown {
  rejectNonObjectJson(text);
  const scan = firstJsonObject(text);
  if (scan.kind === 'truncated') fail('truncated JSON: object is never closed (unbalanced braces)');
  if (scan.kind === 'invalid') fail(`invalid JSON: ${scan.error}`);
  return scan.kind === 'found' ? scan.value : undefined;
}

/**
 * A completion that is entirely a JSON array or scalar (e.g. `[{...}]` or `null`)
 * is a format error, not "no action": say so instead of digging objects out of it.
 */
function rejectNonObjectJson(text: string): void {
  const kind = nonObjectJsonKind(text);
  if (kind === 'array') fail('JSON array at top level; expected a single action object');
  if (kind !== undefined) fail(`JSON ${kind} at top level; expected an action object`);
}

/** JSON.parse, with its error message (which says where it failed) under `prefix`. */
function parseJson(json: string, prefix: string): unknown {
  try {
    return JSON.parse(json);
  } catch (err) {
    return fail(`${prefix}: ${err instanceof Error ? err.message : String(err)}`);
  }
}

function allIndexesOf(text: string, needle: string): number[] {
  const found: number[] = [];
  for (let i = text.indexOf(needle); i !== -1; i = text.indexOf(needle, i + needle.length)) found.push(i);
  return found;
}

// ---------------------------------------------------------------------------
// From parsed JSON to a candidate action
// ---------------------------------------------------------------------------

/** Unwraps the `{"name", "arguments"}` envelope if present, then maps the action. */
function toCandidate(json: unknown): unknown {
  if (!isPlainObject(json)) fail(`expected a JSON object, got ${kindOf(json)}`);
  const args = has(json, 'name') || has(json, 'arguments') ? unwrapToolCall(json) : json;
  return mapAction(args);
}

function unwrapToolCall(call: Args): Args {
  const name = get(call, 'name');
  if (name === undefined) fail('tool call has no "name"');
  if (typeof name !== 'string') fail(`name: must be a string (got ${kindOf(name)})`);
  if (!ACCEPTED_TOOL_NAMES.includes(name)) {
    fail(`unknown tool "${clip(name, 40)}"; expected ${ACCEPTED_TOOL_NAMES.join(' or ')}`);
  }
  const args = get(call, 'arguments');
  if (args === undefined) fail(`tool call "${name}" has no "arguments"`);
  // OpenAI-style stringified arguments are deliberately not decoded: the prompt asks for an object.
  if (!isPlainObject(args)) fail(`arguments: must be an object (got ${kindOf(args)})`);
  return args;
}

type Mapper = (args: Args, action: string) => unknown;

/** Click with a fixed button/count: Qwen encodes them in the action name. */
const fixedClick =
  (button: 'left' | 'right' | 'middle', count: number): Mapper =>
  (a, action) => ({ type: 'click', ...point(a, action), button, count });

/**
 * Every accepted action name (Qwen3-VL computer_use names plus our schema's own),
 * mapped to a candidate object that actionSchema then validates.
 * A Map, not an object literal, so names like "constructor" do not resolve.
 */
const ACTIONS = new Map<string, Mapper>([
  // Our schema's click carries button/count itself; zod applies the defaults.
  ['click', (a, action) => ({ type: 'click', ...point(a, action), button: get(a, 'button'), count: get(a, 'count') })],
  ['left_click', fixedClick('left', 1)],
  ['right_click', fixedClick('right', 1)],
  ['middle_click', fixedClick('middle', 1)],
  ['triple_click', fixedClick('left', 3)],
  ['double_click', (a, action) => ({ type: 'double_click', ...point(a, action) })],
  ['move', (a, action) => ({ type: 'move', ...point(a, action) })],
  ['mouse_move', (a, action) => ({ type: 'move', ...point(a, action) })],
  ['click_element', (a) => ({ type: 'click_element', id: elementId(a) })],
  ['type', (a) => ({ type: 'type', text: get(a, 'text'), id: elementId(a) })],
  ['key', (a) => ({ type: 'key', keys: keyList(get(a, 'keys')) })],
  ['scroll', (a, action) => scroll(a, action, 'vertical')],
  ['hscroll', (a, action) => scroll(a, action, 'horizontal')],
  ['goto', (a) => ({ type: 'goto', url: get(a, 'url') })],
  ['navigate', (a) => ({ type: 'goto', url: get(a, 'url') })],
  // Qwen says "time"; our schema says "seconds".
  ['wait', (a) => ({ type: 'wait', seconds: get(a, 'time') ?? get(a, 'seconds') })],
  ['answer', (a) => ({ type: 'answer', text: get(a, 'text') })],
  // terminate ends the episode; its status ("success"/"failure") is the final message.
  ['terminate', (a) => ({ type: 'answer', text: stringField(a, 'status') })],
]);

/** Names accepted in the "action" (or "type") field, for docs and tests. */
export const ACCEPTED_ACTION_NAMES: readonly string[] = [...ACTIONS.keys()];

function mapAction(args: Args): unknown {
  // Qwen uses "action"; our own schema's objects use "type".
  const name = get(args, 'action') ?? get(args, 'type');
  if (name === undefined) fail('missing "action" field');
  if (typeof name !== 'string') fail(`action: must be a string (got ${kindOf(name)})`);
  const action = name.trim().toLowerCase();
  const mapper = ACTIONS.get(action);
  if (!mapper) fail(`unsupported action "${clip(name, 40)}"`);
  return mapper(args, action);
}

/**
 * Qwen scroll: `pixels` > 0 scrolls up, < 0 down. For hscroll we chose
 * `pixels` > 0 = right, < 0 = left (pyautogui.hscroll's convention).
 * Our schema's own `{direction, amount}` form is accepted for "scroll" too.
 */
function scroll(a: Args, action: string, axis: 'vertical' | 'horizontal'): unknown {
  const at = has(a, 'coordinate') || has(a, 'x') || has(a, 'y') ? point(a, action) : {};
  const pixels = get(a, 'pixels');
  if (pixels === undefined) {
    if (axis === 'vertical' && has(a, 'direction')) {
      return { type: 'scroll', direction: get(a, 'direction'), amount: get(a, 'amount'), ...at };
    }
    fail(axis === 'vertical' ? 'scroll: missing "pixels" (or "direction")' : 'hscroll: missing "pixels"');
  }
  const n = Math.round(finiteNumber(pixels, 'pixels'));
  if (n === 0) fail('pixels: must be non-zero');
  const direction = axis === 'vertical' ? (n > 0 ? 'up' : 'down') : n > 0 ? 'right' : 'left';
  return { type: 'scroll', direction, amount: Math.abs(n), ...at };
}

/** `coordinate: [x, y]` (Qwen) or flat `x`, `y` (our schema); floats are rounded to the grid. */
function point(a: Args, action: string): { x: number; y: number } {
  if (has(a, 'coordinate')) {
    const c = get(a, 'coordinate');
    if (!Array.isArray(c) || c.length !== 2) {
      const got = Array.isArray(c) ? `array of length ${c.length}` : kindOf(c);
      fail(`coordinate: must be [x, y], an array of two numbers (got ${got})`);
    }
    return { x: gridValue(c[0], 'coordinate[0]'), y: gridValue(c[1], 'coordinate[1]') };
  }
  if (!has(a, 'x') && !has(a, 'y')) fail(`${action}: missing coordinate`);
  return { x: gridValue(get(a, 'x'), 'x'), y: gridValue(get(a, 'y'), 'y') };
}

/** Range is checked on the raw value so e.g. -0.4 or 1000.3 are rejected, not rounded into range. */
function gridValue(value: unknown, field: string): number {
  const n = finiteNumber(value, field);
  if (n < 0 || n > GRID_MAX) fail(`${field}: must be between 0 and ${GRID_MAX} (got ${n})`);
  return Math.round(n);
}

/** Strict: numeric strings like "120" are a model format error, not something to coerce. */
function finiteNumber(value: unknown, field: string): number {
  if (value === undefined) fail(`${field}: is required`);
  if (typeof value !== 'number') fail(`${field}: must be a number (got ${kindOf(value)})`);
  if (!Number.isFinite(value)) fail(`${field}: must be a finite number (got ${value})`);
  return value;
}

/** Qwen's documented form is an array; "ctrl+a" as one string is a common variant. */
function keyList(keys: unknown): unknown {
  if (keys === undefined) fail('keys: is required');
  if (typeof keys === 'string') return splitKeyCombo(keys);
  if (!Array.isArray(keys)) fail(`keys: must be an array of strings or a "ctrl+a" string (got ${kindOf(keys)})`);
  return keys;
}

/** "ctrl+a" -> ["ctrl", "a"]; a trailing "+" is the plus key itself ("ctrl++", "+"). */
function splitKeyCombo(combo: string): string[] {
  if (combo === '+') return ['+'];
  const plusKey = combo.length > 2 && combo.endsWith('++');
  const parts = (plusKey ? combo.slice(0, -2) : combo).split('+').map((k) => k.trim());
  return plusKey ? [...parts, '+'] : parts;
}

/** Our click_element/type extension: models write "element_id" or the schema's own "id". */
function elementId(a: Args): unknown {
  return get(a, 'element_id') ?? get(a, 'id');
}

/** Checked here (not by the schema) so the reason names the model's field, not ours. */
function stringField(a: Args, field: string): string {
  const value = get(a, field);
  if (value === undefined) fail(`${field}: is required`);
  if (typeof value !== 'string') fail(`${field}: must be a string (got ${kindOf(value)})`);
  return value;
}

// ---------------------------------------------------------------------------
// Final gate: the schema
// ---------------------------------------------------------------------------

/** actionSchema is the single source of truth; anything the mappers let through is checked here. */
function validate(candidate: unknown): AgentAction {
  const withoutUndefined = isPlainObject(candidate) ? dropUndefined(candidate) : candidate;
  const result = actionSchema.safeParse(withoutUndefined);
  if (result.success) return refuseAddedTokens(result.data);
  fail(result.error.issues.map((issue) => describeIssue(issue, withoutUndefined)).join('; '));
}

/** zod's default messages ("Too big: expected number to be <=1000") rephrased as `field: must be <= 1000`. */
/**
 * An action's free text goes into the next step's prompt (previous actions) and into the page: one that spells a
 * tokenizer token (`<|im_end|>`, `<|image_pad|>`…) is refused, so a sample can never act as prompt structure.
 */
function refuseAddedTokens(action: AgentAction): AgentAction {
  for (const [field, value] of Object.entries(action)) {
    const texts = typeof value === 'string' ? [value] : Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : [];
    for (const t of texts) {
      const found = addedTokensIn(t);
      if (found.length) fail(`${field}: spells the tokenizer's special token ${found[0]}, which an action may not type or answer`);
    }
  }
  return action;
}

function describeIssue(issue: z.core.$ZodIssue, input: unknown): string {
  const field = issue.path.length > 0 ? issue.path.map(String).join('.') : 'action';
  return `${field}: ${describeProblem(issue, valueAt(input, issue.path))}`;
}

function describeProblem(issue: z.core.$ZodIssue, value: unknown): string {
  switch (issue.code) {
    case 'invalid_type':
      if (value === undefined) return 'is required';
      if (issue.expected === 'int') return `must be an integer (got ${String(value)})`;
      return `must be ${issue.expected === 'array' ? 'an' : 'a'} ${issue.expected} (got ${kindOf(value)})`;
    case 'too_big':
      return `must be ${limitText(issue.origin, '<=', 'at most', issue.maximum)}`;
    case 'too_small':
      if (issue.origin === 'string' && Number(issue.minimum) === 1) return 'must not be empty';
      return `must be ${limitText(issue.origin, '>=', 'at least', issue.minimum)}`;
    case 'invalid_value':
      return `must be one of ${issue.values.map((v) => JSON.stringify(v)).join(', ')} (got ${clip(JSON.stringify(value) ?? kindOf(value), 40)})`;
    default:
      return issue.message;
  }
}

function limitText(origin: string, op: string, words: string, limit: number | bigint): string {
  if (origin === 'string') return `${words} ${limit} characters long`;
  if (origin === 'array') return `${words} ${limit} items`;
  return `${op} ${limit}`;
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

function isPlainObject(value: unknown): value is Args {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Own properties only, so "toString" and friends never look like fields. */
function has(obj: Args, key: string): boolean {
  return Object.hasOwn(obj, key);
}

function get(obj: Args, key: string): unknown {
  return has(obj, key) ? obj[key] : undefined;
}

function dropUndefined(obj: Args): Args {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined));
}

function valueAt(input: unknown, path: readonly PropertyKey[]): unknown {
  let cur = input;
  for (const key of path) {
    if (typeof cur !== 'object' || cur === null || typeof key === 'symbol') return undefined;
    cur = (cur as Record<string | number, unknown>)[key];
  }
  return cur;
}
