import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import type { z } from 'zod';
import { configSchema } from '../../lib/config/config';
import { CONFIG_DOC_PATH, configSections, describeType, renderConfigReference } from '../../client/commands/config-doc';

// Walks the zod schema itself (not its JSON Schema), so the generator's own walk is checked against it.
type AnySchema = z.ZodType & { _zod: { def: { type: string; innerType?: AnySchema; shape?: Record<string, AnySchema> } } };

function unwrap(s: AnySchema): AnySchema {
  let cur = s;
  while (['default', 'prefault', 'optional', 'nullable', 'readonly', 'catch'].includes(cur._zod.def.type) && cur._zod.def.innerType) {
    cur = cur._zod.def.innerType;
  }
  return cur;
}

/** Every leaf key of the schema as a dotted path. */
function leafPaths(s: AnySchema, prefix = ''): string[] {
  const inner = unwrap(s);
  if (inner._zod.def.type !== 'object' || !inner._zod.def.shape) return [prefix];
  return Object.entries(inner._zod.def.shape).flatMap(([k, v]) => leafPaths(v, prefix ? `${prefix}.${k}` : k));
}

test('docs/CONFIG.md is exactly the generated reference (regenerate: npx halo config-doc --write)', () => {
  const current = readFileSync(CONFIG_DOC_PATH, 'utf8');
  assert.equal(current, renderConfigReference(), 'docs/CONFIG.md is stale: run `npx halo config-doc --write`');
});

test('every key of the config schema has a row, and nothing else does', () => {
  const doc = renderConfigReference();
  const schemaKeys = leafPaths(configSchema as unknown as AnySchema);
  assert.ok(schemaKeys.length > 40, `expected the whole schema, got ${schemaKeys.length} keys`);
  for (const k of schemaKeys) assert.match(doc, new RegExp(`^\\| \`${k.replace(/\./g, '\\.')}\` \\|`, 'm'), `no row for ${k}`);
  const rows = configSections().flatMap((s) => s.keys.map((k) => k.path));
  assert.deepEqual([...rows].sort(), [...schemaKeys].sort());
  // Every top-level section has a heading.
  for (const top of Object.keys((configSchema as unknown as AnySchema)._zod.def.shape ?? {})) assert.match(doc, new RegExp(`^## ${top}$`, 'm'));
});

test('defaults and descriptions come from the schema', () => {
  const keys = new Map(configSections().flatMap((s) => s.keys.map((k) => [k.path, k] as const)));
  const defaults = configSchema.parse({}) as unknown as Record<string, Record<string, unknown>>;
  for (const [path, doc] of keys) {
    const value = path.split('.').reduce<unknown>((o, p) => (o as Record<string, unknown> | undefined)?.[p], defaults);
    if (value === undefined) assert.equal(doc.default, '(unset)', path);
    else assert.equal(doc.default, `\`${JSON.stringify(value)}\``, path);
  }
  assert.match(keys.get('stack.home')!.description, /Temporal database/);
  assert.equal(keys.get('policy.backend')!.type, '"openai" | "colocated"');
  assert.equal(keys.get('stack.uiPort')!.type, 'integer (1–65535)');
  assert.equal(keys.get('train.vllmBaseUrl')!.type, 'string (URL)');
  // Pipes inside cells are escaped so the tables stay tables.
  assert.match(renderConfigReference(), /\| "openai" \\\| "colocated" \|/);
});

test('type texts', () => {
  assert.equal(describeType({ type: 'integer', minimum: 0, maximum: Number.MAX_SAFE_INTEGER }), 'integer (≥ 0)');
  assert.equal(describeType({ type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1 }), 'number (> 0, < 1)');
  assert.equal(describeType({ type: 'array', items: { type: 'string', minLength: 1 }, minItems: 1 }), 'string[] (items non-empty, ≥ 1 item)');
  assert.equal(describeType({ const: 'dr_grpo' }), '"dr_grpo"');
  assert.equal(describeType({ type: 'boolean' }), 'boolean');
});
