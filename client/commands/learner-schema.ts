import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import type { Command } from 'commander';
import { z } from 'zod';
import { LEARNER_SCHEMAS } from '../../lib/training/learner-types';
import { REPO_ROOT, pythonBinary } from '../processes';

// The Python learner's pydantic models are generated from the zod contract (lib/training/learner-types.ts): zod writes JSON
// Schema, datamodel-code-generator writes the models, Ruff formats them. `halo learner-schema --write` regenerates
// payloads.py; test/unit/learner-schema.test.ts fails when it is stale.

export const PAYLOADS_PATH = join(REPO_ROOT, 'workers', 'learner', 'halo_learner', 'payloads.py');
const RULES_MODULE = 'halo_learner.payload_rules';

/**
 * The models with a check JSON Schema cannot state (a zod `refine`, or zod's finite numbers where the learner relies
 * on them), and the hand-written base class in payload_rules.py that states it in Python.
 */
export const PYTHON_RULES: Readonly<Partial<Record<keyof typeof LEARNER_SCHEMAS, string>>> = {
  SampledTokens: 'SampledTokensRules',
  GrpoItem: 'GrpoItemRules',
  DpoPair: 'DpoPairRules',
  Completion: 'CompletionRules',
};

type Json = Record<string, unknown>;

/** zod's integers are safe integers (±(2^53 − 1)); Python's are not bounded, so the bound is noise there. */
function dropSafeIntegerBounds(node: Json): void {
  if (node.type === 'integer' || (Array.isArray(node.type) && node.type.includes('integer'))) {
    if (node.maximum === Number.MAX_SAFE_INTEGER) delete node.maximum;
    if (node.minimum === Number.MIN_SAFE_INTEGER) delete node.minimum;
  }
}

/**
 * `{anyOf: [{type: T, ...limits}, {type: null}]}` as `{type: [T, null], ...limits}`: the same set of values, which
 * the generator writes as an annotated field instead of a wrapper model per nullable field.
 */
function foldNullable(node: Json): void {
  const alts = node.anyOf as Json[] | undefined;
  if (alts?.length !== 2) return;
  const nul = alts.findIndex((a) => a.type === 'null' && Object.keys(a).length === 1);
  const other = alts[1 - nul];
  if (nul < 0 || typeof other.type !== 'string' || '$ref' in other) return;
  delete node.anyOf;
  Object.assign(node, other, { type: [other.type, 'null'] });
}

function walk(node: unknown, visit: (n: Json) => void): void {
  if (Array.isArray(node)) for (const n of node) walk(n, visit);
  else if (node && typeof node === 'object') {
    visit(node as Json);
    for (const v of Object.values(node)) walk(v, visit);
  }
}

/** One JSON Schema document with every model of the contract under `$defs`, as a writer may send it (defaults optional). */
export function learnerJsonSchema(): Json {
  const registry = z.registry<{ id: string }>();
  for (const [name, schema] of Object.entries(LEARNER_SCHEMAS)) registry.add(schema, { id: name });
  const { schemas } = z.toJSONSchema(registry, {
    io: 'input',
    uri: (id) => `#/$defs/${id}`,
    override: (ctx) => {
      // A discriminated union says so, and pydantic then picks the member by its tag.
      const def = (ctx.zodSchema as unknown as { _zod: { def: { type: string; discriminator?: string } } })._zod.def;
      if (def.type === 'union' && def.discriminator) ctx.jsonSchema.discriminator = { propertyName: def.discriminator };
    },
  });
  const defs: Record<string, Json> = {};
  for (const [name, schema] of Object.entries(schemas)) {
    const { $schema: _s, $id: _i, ...rest } = schema as Json;
    walk(rest, (n) => {
      foldNullable(n);
      dropSafeIntegerBounds(n);
    });
    defs[name] = rest;
  }
  return { $schema: 'https://json-schema.org/draft/2020-12/schema', $defs: defs };
}

const HEADER = [
  'Generated from lib/training/learner-types.ts by `npx halo learner-schema --write`: do not edit (test/unit/learner-schema.test.ts).',
  '',
  'The learner contract as pydantic models: snake_case keys, unknown keys rejected, the limits, patterns and defaults of',
  "the zod schemas. The checks JSON Schema cannot state come from each model's base class in payload_rules.py.",
].join('\n');

/** The text of payloads.py, generated now (needs datamodel-code-generator and Ruff in the Python environment). */
export function generatePayloads(python = pythonBinary()): string {
  const baseClassMap = Object.fromEntries(Object.entries(PYTHON_RULES).map(([model, base]) => [model, `${RULES_MODULE}.${base}`]));
  const args = [
    '-m',
    'datamodel_code_generator',
    '--input-file-type',
    'jsonschema',
    '--output-model-type',
    'pydantic_v2.BaseModel',
    '--target-python-version',
    '3.10',
    '--use-annotated',
    '--field-constraints',
    // A key with a default is still not nullable unless the schema says so.
    '--strict-nullable',
    '--use-type-alias',
    '--enum-field-as-literal',
    'all',
    '--skip-root-model',
    '--disable-timestamp',
    '--no-formatters',
    '--base-class',
    `${RULES_MODULE}.ContractModel`,
    '--base-class-map',
    JSON.stringify(baseClassMap),
    '--custom-file-header',
    HEADER.split('\n')
      .map((l) => `# ${l}`.trimEnd())
      .join('\n'),
  ];
  const run = (cmd: string[], input: string) => execFileSync(python, cmd, { input, encoding: 'utf8', cwd: REPO_ROOT, maxBuffer: 16 << 20 });
  let models: string;
  try {
    models = run(args, JSON.stringify(learnerJsonSchema()));
  } catch (err) {
    throw new Error(`datamodel-code-generator failed with ${python} (./launch.sh setup installs it into .venv): ${(err as Error).message}`);
  }
  return run(['-m', 'ruff', 'format', '--stdin-filename', relative(REPO_ROOT, PAYLOADS_PATH), '-'], models);
}

export function register(program: Command): void {
  program
    .command('learner-schema')
    .description("print the learner's pydantic models (workers/learner/halo_learner/payloads.py) generated from the zod contract")
    .option('--check', 'exit non-zero when payloads.py is not the generated text')
    .option('--write', 'write payloads.py')
    .action((opts: { check?: boolean; write?: boolean }) => {
      const text = generatePayloads();
      const where = relative(REPO_ROOT, PAYLOADS_PATH);
      if (opts.write) {
        writeFileSync(PAYLOADS_PATH, text);
        console.log(`wrote ${where}`);
      } else if (opts.check) {
        const current = existsSync(PAYLOADS_PATH) ? readFileSync(PAYLOADS_PATH, 'utf8') : undefined;
        if (current !== text) throw new Error(`${where} is ${current === undefined ? 'missing' : 'stale'}: regenerate it with \`npx halo learner-schema --write\``);
        console.log(`${where} is up to date`);
      } else process.stdout.write(text);
    });
}
