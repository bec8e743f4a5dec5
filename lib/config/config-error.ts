import { editDistance } from '../model-io/text';

/** A bad config value or file; the message names the field. */
export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

// ---- error text for zod issues: every line names the full dotted path ---------------------------------
//
// Unknown keys get the closest valid key at the same place ("did you mean train.iterations?"), found by
// walking the schema along the issue's path (through defaults, optionals, arrays and unions; a union's
// options are narrowed by their literal fields, e.g. an eval mode's `name`).

/** The part of a zod issue this file reads (zod 4's `$ZodIssue` has these fields). */
export interface IssueLike {
  readonly code: string;
  readonly path: readonly PropertyKey[];
  readonly message: string;
  readonly keys?: readonly string[];
}

interface SchemaLike {
  _zod: { def: { type: string } & Record<string, unknown> };
}

const WRAPPERS = new Set(['default', 'prefault', 'optional', 'nullable', 'readonly', 'catch', 'nonoptional', 'success']);

function unwrap(s: SchemaLike): SchemaLike {
  for (let i = 0; i < 32; i++) {
    const d = s._zod.def;
    if (WRAPPERS.has(d.type) && d.innerType) s = d.innerType as SchemaLike;
    else if (d.type === 'pipe' && d.in) s = d.in as SchemaLike;
    else if (d.type === 'lazy' && typeof d.getter === 'function') s = (d.getter as () => SchemaLike)();
    else return s;
  }
  return s;
}

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Whether every literal field of an object schema (a discriminator) agrees with the value given. */
function literalsMatch(obj: SchemaLike, raw: unknown): boolean {
  if (!isRecord(raw)) return true;
  const shape = obj._zod.def.shape as Record<string, SchemaLike>;
  for (const [k, field] of Object.entries(shape)) {
    const f = unwrap(field)._zod.def;
    if (f.type === 'literal' && k in raw && !(f.values as unknown[]).includes(raw[k])) return false;
  }
  return true;
}

/** The object schemas `s` may be for the value `raw` (a union gives its options that fit). */
function objectsOf(s: SchemaLike, raw: unknown, depth = 0): SchemaLike[] {
  const u = unwrap(s);
  const d = u._zod.def;
  if (d.type === 'object') return [u];
  if (d.type === 'union' && depth < 8) {
    const all = (d.options as SchemaLike[]).flatMap((o) => objectsOf(o, raw, depth + 1));
    const fit = all.filter((o) => literalsMatch(o, raw));
    return fit.length ? fit : all;
  }
  if (d.type === 'intersection' && depth < 8) return [...objectsOf(d.left as SchemaLike, raw, depth + 1), ...objectsOf(d.right as SchemaLike, raw, depth + 1)];
  return [];
}

/** The valid keys of the object at `path` of `schema` (given the value `raw` at the root), or [] if unknown. */
export function knownKeysAt(schema: unknown, path: readonly PropertyKey[], raw: unknown): string[] {
  let current: SchemaLike[] = [schema as SchemaLike];
  let value = raw;
  for (const seg of path) {
    const next: SchemaLike[] = [];
    for (const s of current) {
      const u = unwrap(s);
      const d = u._zod.def;
      if (d.type === 'array' && typeof seg === 'number') next.push(d.element as SchemaLike);
      else if (d.type === 'record') next.push(d.valueType as SchemaLike);
      else {
        for (const o of objectsOf(u, value)) {
          const field = (o._zod.def.shape as Record<string, SchemaLike>)[String(seg)];
          if (field) next.push(field);
        }
      }
    }
    current = next;
    value = isRecord(value) || Array.isArray(value) ? (value as Record<string, unknown>)[String(seg)] : undefined;
  }
  const keys = new Set<string>();
  for (const s of current) for (const o of objectsOf(s, value)) for (const k of Object.keys(o._zod.def.shape as object)) keys.add(k);
  return [...keys];
}

/** The valid key closest to a mistyped one (case, a letter or two, snake_case for camelCase), or undefined. */
export function closestKey(key: string, known: readonly string[]): string | undefined {
  const norm = (s: string) => s.toLowerCase().replace(/[_-]/g, '');
  let best: string | undefined;
  let bestDist = Infinity;
  for (const k of known) {
    const d = norm(k) === norm(key) ? 0 : editDistance(key.toLowerCase(), k.toLowerCase());
    if (d < bestDist) {
      best = k;
      bestDist = d;
    }
  }
  const limit = Math.max(1, Math.floor(key.length / 3));
  return bestDist <= limit ? best : undefined;
}

const dotted = (path: readonly PropertyKey[]) => path.map(String).join('.');

/** The text of an unknown key at `path` (the key included): the closest valid key, else the valid ones. */
export function unknownKeyMessage(schema: unknown, path: readonly PropertyKey[], raw: unknown): string {
  const parent = path.slice(0, -1);
  const known = knownKeysAt(schema, parent, raw);
  const key = String(path[path.length - 1]);
  const near = closestKey(key, known);
  if (near) return `unknown key; did you mean ${dotted([...parent, near])}?`;
  return known.length ? `unknown key (valid keys here: ${known.join(', ')})` : 'unknown key';
}

/**
 * One line per problem, `  path.to.key: message`; an unknown key gets a line of its own with the closest
 * valid key. `describe` may reword other issues (e.g. zod's bare "Invalid input" of a union).
 */
export function formatConfigIssues(issues: readonly IssueLike[], schema: unknown, raw: unknown, describe: (issue: IssueLike) => string = (i) => i.message): string[] {
  const lines: string[] = [];
  for (const issue of issues) {
    if (issue.code === 'unrecognized_keys' && issue.keys) {
      for (const key of issue.keys) {
        const path = [...issue.path, key];
        lines.push(`  ${dotted(path)}: ${unknownKeyMessage(schema, path, raw)}`);
      }
    } else {
      lines.push(`  ${issue.path.length ? dotted(issue.path) : '(root)'}: ${describe(issue)}`);
    }
  }
  return lines;
}
