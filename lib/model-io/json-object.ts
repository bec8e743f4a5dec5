/**
 * Finding a JSON object in a model's free text (the action parser and the critic both read one): prose may
 * hold stray `{…}` that are not JSON, so the first balanced object that parses wins.
 */
import { matchingBrace, stripCodeFence } from './text';

export type JsonObject = Record<string, unknown>;

/**
 * The scan's outcome: the object, or why there is none. `invalid` and `truncated` describe the first failed
 * candidate (`error` is JSON.parse's message, which says where it failed); an object opened and never closed
 * ends the scan, since nothing after it can be a complete top-level object.
 */
export type JsonObjectScan = { kind: 'found'; value: JsonObject } | { kind: 'none' } | { kind: 'truncated' } | { kind: 'invalid'; error: string };

/** The first balanced `{…}` in `text` that parses as JSON. */
export function firstJsonObject(text: string): JsonObjectScan {
  let firstError: string | undefined;
  for (let from = 0; ; ) {
    const open = text.indexOf('{', from);
    if (open === -1) break;
    const end = matchingBrace(text, open);
    if (end === -1) return firstError === undefined ? { kind: 'truncated' } : { kind: 'invalid', error: firstError };
    try {
      // Balanced braces around valid JSON: an object, never an array or a scalar.
      return { kind: 'found', value: JSON.parse(text.slice(open, end)) as JsonObject };
    } catch (err) {
      firstError ??= err instanceof Error ? err.message : String(err);
    }
    from = end;
  }
  return firstError === undefined ? { kind: 'none' } : { kind: 'invalid', error: firstError };
}

/**
 * The kind of value ('array', 'null', 'number', 'boolean', 'string') when the whole text (a code fence
 * stripped) is JSON but not an object; undefined otherwise. Such a text is a format error to name, not a
 * text to dig objects out of.
 */
export function nonObjectJsonKind(text: string): string | undefined {
  const body = stripCodeFence(text.trim());
  if (!/^(\[|null|true|false|-?\d|")/.test(body)) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch {
    return undefined; // Not pure JSON; e.g. prose starting with a number. Let the object scan decide.
  }
  return kindOf(value);
}

/** `typeof`, with null and arrays told apart from objects. */
export function kindOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  return typeof value;
}
