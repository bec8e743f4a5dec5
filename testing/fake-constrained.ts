/**
 * What the vLLM stand-in writes under `structured_outputs.json`, as vLLM's xgrammar backend would: exactly one JSON
 * value the schema accepts, nothing around it (no `<tool_call>` tags, no prose), properties in schema order (xgrammar
 * writes them so), compact with the separators of the release the stand-in plays (vLLM 0.33 `,`/`:`, 0.31 `", "`/`": "`:
 * lib/model-io/grammar-blob.ts; free whitespace is added afterwards when the server allows it: fake-whitespace.ts). The value is what the scripted model meant (the JSON in its answer) when the
 * schema admits it, else the first value the schema admits: a grammar forces a model off what it would have written.
 *
 * The schema subset is the one lib/model-io/action-grammar.ts and `halo doctor`'s probe use: object (properties, required,
 * additionalProperties), anyOf, enum, const, integer/number (minimum, maximum), string (pattern, minLength,
 * maxLength), array (items, minItems, maxItems), boolean, null. Any other type is an error, never a guess.
 */

type Schema = Record<string, unknown>;

const TYPES = ['object', 'array', 'string', 'integer', 'number', 'boolean', 'null'];

function typeOf(schema: Schema): string | undefined {
  const t = schema.type;
  if (t === undefined) return undefined;
  if (typeof t !== 'string' || !TYPES.includes(t)) throw new Error(`the stand-in's schema subset has no type ${JSON.stringify(t)}`);
  return t;
}

const sameJson = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/** Whether `schema` accepts `value` (the subset above). */
export function schemaAdmits(schema: Schema, value: unknown): boolean {
  if (Array.isArray(schema.anyOf)) return (schema.anyOf as Schema[]).some((s) => schemaAdmits(s, value));
  if ('const' in schema && !sameJson(schema.const, value)) return false;
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => sameJson(e, value))) return false;
  const min = typeof schema.minimum === 'number' ? schema.minimum : -Infinity;
  const max = typeof schema.maximum === 'number' ? schema.maximum : Infinity;
  switch (typeOf(schema)) {
    case undefined:
      return true;
    case 'null':
      return value === null;
    case 'boolean':
      return typeof value === 'boolean';
    case 'integer':
      return Number.isInteger(value) && (value as number) >= min && (value as number) <= max;
    case 'number':
      return typeof value === 'number' && Number.isFinite(value) && value >= min && value <= max;
    case 'string': {
      if (typeof value !== 'string') return false;
      if (typeof schema.minLength === 'number' && value.length < schema.minLength) return false;
      if (typeof schema.maxLength === 'number' && value.length > schema.maxLength) return false;
      return typeof schema.pattern !== 'string' || new RegExp(schema.pattern).test(value);
    }
    case 'array': {
      if (!Array.isArray(value)) return false;
      if (typeof schema.minItems === 'number' && value.length < schema.minItems) return false;
      if (typeof schema.maxItems === 'number' && value.length > schema.maxItems) return false;
      const items = schema.items as Schema | undefined;
      return !items || value.every((v) => schemaAdmits(items, v));
    }
    default: {
      if (!value || typeof value !== 'object' || Array.isArray(value)) return false;
      const props = (schema.properties ?? {}) as Record<string, Schema>;
      const v = value as Record<string, unknown>;
      if (Array.isArray(schema.required) && !schema.required.every((k) => k in v)) return false;
      return Object.entries(v).every(([k, x]) => (k in props ? schemaAdmits(props[k], x) : schema.additionalProperties !== false));
    }
  }
}

const STRING_CANDIDATES = ['', 'a', 'x', 'A', '0', 'aa', 'xx'];

/** The first value `schema` admits: the first branch, the first enum entry, the smallest number, required properties only. */
export function firstAdmitted(schema: Schema): unknown {
  const out = first(schema);
  if (out === undefined || !schemaAdmits(schema, out)) throw new Error(`the stand-in finds no value this schema admits: ${JSON.stringify(schema).slice(0, 200)}`);
  return out;
}

function first(schema: Schema): unknown {
  if (Array.isArray(schema.anyOf)) {
    for (const s of schema.anyOf as Schema[]) {
      const v = first(s);
      if (v !== undefined && schemaAdmits(s, v)) return v;
    }
    return undefined;
  }
  if ('const' in schema) return schema.const;
  if (Array.isArray(schema.enum)) return schema.enum.find((e) => schemaAdmits({ ...schema, enum: undefined }, e));
  switch (typeOf(schema)) {
    case 'null':
      return null;
    case 'boolean':
      return false;
    case 'integer':
    case 'number': {
      const min = typeof schema.minimum === 'number' ? Math.ceil(schema.minimum) : undefined;
      const max = typeof schema.maximum === 'number' ? Math.floor(schema.maximum) : undefined;
      return min ?? (max !== undefined && max < 0 ? max : 0);
    }
    case 'string':
      return STRING_CANDIDATES.find((s) => schemaAdmits(schema, s));
    case 'array': {
      const n = typeof schema.minItems === 'number' ? schema.minItems : 0;
      const item = schema.items ? first(schema.items as Schema) : null;
      return item === undefined ? undefined : Array(n).fill(item);
    }
    default: {
      const props = (schema.properties ?? {}) as Record<string, Schema>;
      const required = new Set(Array.isArray(schema.required) ? (schema.required as string[]) : []);
      const out: Record<string, unknown> = {};
      for (const [k, s] of Object.entries(props)) {
        if (!required.has(k)) continue;
        const v = first(s);
        if (v === undefined) return undefined;
        out[k] = v;
      }
      return out;
    }
  }
}

/** `value` (admitted by `schema`) with every object's properties in schema order, as xgrammar writes them. */
export function inSchemaOrder(schema: Schema, value: unknown): unknown {
  if (Array.isArray(schema.anyOf)) {
    const branch = (schema.anyOf as Schema[]).find((s) => schemaAdmits(s, value));
    return branch ? inSchemaOrder(branch, value) : value;
  }
  if (Array.isArray(value)) return schema.items ? value.map((v) => inSchemaOrder(schema.items as Schema, v)) : value;
  if (!value || typeof value !== 'object') return value;
  const props = (schema.properties ?? {}) as Record<string, Schema>;
  const v = value as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(props)) if (k in v) out[k] = inSchemaOrder(props[k], v[k]);
  for (const k of Object.keys(v)) if (!(k in props)) out[k] = v[k];
  return out;
}

/** xgrammar's default separators, which a call without `separators` (vLLM 0.31) writes. */
export const XGRAMMAR_DEFAULT_SEPARATORS: [string, string] = [', ', ': '];

/** JSON as xgrammar writes it without free whitespace: `item` between items, `key` after keys. */
export function xgrammarCompact(value: unknown, [item, key]: [string, string] = XGRAMMAR_DEFAULT_SEPARATORS): string {
  const write = (v: unknown) => xgrammarCompact(v, [item, key]);
  if (Array.isArray(value)) return `[${value.map(write).join(item)}]`;
  if (value && typeof value === 'object') {
    return `{${Object.entries(value)
      .map(([k, v]) => `${JSON.stringify(k)}${key}${write(v)}`)
      .join(item)}}`;
  }
  return JSON.stringify(value);
}

/** The JSON value in a model's answer: from its first `{` to its last `}` (a tool call's body), if that parses. */
function meant(text: string): unknown {
  const start = text.indexOf('{');
  const end = text.lastIndexOf('}');
  if (start < 0 || end < start) return undefined;
  try {
    return JSON.parse(text.slice(start, end + 1));
  } catch {
    return undefined;
  }
}

/** A request's `structured_outputs.json` as a schema object (vLLM takes a dict or a JSON string). */
export function jsonSchemaOf(json: unknown): Schema {
  const schema = typeof json === 'string' ? JSON.parse(json) : json;
  if (!schema || typeof schema !== 'object' || Array.isArray(schema)) throw new Error('structured_outputs.json is not a JSON schema object');
  return schema as Schema;
}

/**
 * What the model means under `schema`, tight (`,`/`:`), best first: the JSON in its answer when the schema admits
 * it, then the first value the schema admits. The vLLM stand-in writes the first that xgrammar accepts through it
 * (testing/xgrammar-writer.ts): this subset's checks are looser than xgrammar's in places (a `pattern` is searched
 * here, matched whole there).
 */
export function constrainedCandidates(schema: Schema, modelText: string): string[] {
  const wanted = meant(modelText);
  const values: unknown[] = wanted !== undefined && schemaAdmits(schema, wanted) ? [wanted] : [];
  values.push(firstAdmitted(schema));
  return [...new Set(values.map((v) => xgrammarCompact(inSchemaOrder(schema, v), [',', ':'])))];
}

/** The constrained answer to a request whose unconstrained answer would have been `modelText`, under `separators`. */
export function constrainedAnswer(schema: Schema, modelText: string, separators: [string, string] = XGRAMMAR_DEFAULT_SEPARATORS): string {
  const wanted = meant(modelText);
  const value = wanted !== undefined && schemaAdmits(schema, wanted) ? wanted : firstAdmitted(schema);
  return xgrammarCompact(inSchemaOrder(schema, value), separators);
}
