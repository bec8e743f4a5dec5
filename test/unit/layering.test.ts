import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { checkLayering, importsOf, MAX_SOURCE_LINES, type Rule } from '../helpers/layering';

const ROOT = join(__dirname, '..', '..');
/** Not ours, or not source. */
const SKIP = new Set(['node_modules', 'checkpoints', 'runs', 'dist', 'docs', 'configs', '__pycache__']);
/** Source files: TypeScript for the import rules, every kind for the length rule. */
const SOURCE = /\.(ts|py|sh|js|cjs|mjs)$|^(launch\.sh|teardown\.sh|run|Dockerfile.*)$/;

function repoSources(): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (dir: string) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (e.name.startsWith('.') || SKIP.has(e.name)) continue;
      const path = join(dir, e.name);
      if (e.isDirectory()) walk(path);
      else if (SOURCE.test(e.name) && !e.name.endsWith('.d.ts')) out.set(relative(ROOT, path).split(sep).join('/'), readFileSync(path, 'utf8'));
    }
  };
  walk(ROOT);
  return out;
}

test('the repository keeps its layers', () => {
  const sources = repoSources();
  assert.ok(
    sources.has('lib/config/config.ts') && sources.has('workflows/index.ts') && sources.has('workers/learner/halo_learner/grpo.py') && sources.has('launch.sh'),
    'the walk found the source tree',
  );
  const violations = checkLayering(sources);
  assert.deepEqual(
    violations.map((v) => v.message),
    [],
    `layering violations:\n${violations.map((v) => `  [${v.rule}] ${v.message}`).join('\n')}`,
  );
});

/** The rules that a set of in-memory files breaks. */
const broken = (files: Record<string, string>): Rule[] => [...new Set(checkLayering(new Map(Object.entries(files))).map((v) => v.rule))].sort();

test('each rule can fail', () => {
  const lib = { 'lib/a.ts': 'export const a = 1;\n' };
  const activity = { 'activities/act.ts': 'export async function act() { return 1; }\nexport type Acts = { act: typeof act };\n' };
  const cases: [Rule, Record<string, string>][] = [
    ['lib-node-import', { 'lib/x.ts': "import { readFileSync } from 'node:fs';\n" }],
    ['lib-node-import', { 'lib/x.ts': "import * as fs from 'fs';\n" }],
    ['lib-node-import', { 'lib/x.ts': "import type { Stats } from 'fs/promises';\n" }],
    // Every rule on lib/ holds in its sub-folders too.
    ['lib-node-import', { 'lib/training/x.ts': "import { readFileSync } from 'node:fs';\n" }],
    ['lib-imports-outside-lib', { 'host/h.ts': 'export const h = 1;\n', 'lib/config/x.ts': "import { h } from '../../host/h';\n" }],
    ['lib-imports-outside-lib', { ...activity, 'lib/x.ts': "import type { Acts } from '../activities/act';\n" }],
    ['lib-imports-outside-lib', { 'host/h.ts': 'export const h = 1;\n', 'lib/x.ts': "export { h } from '../host/h';\n" }],
    ['lib-imports-outside-lib', { 'lib/x.ts': "import pino from 'pino';\n" }],
    ['shared-imports-up', { 'client/c.ts': 'export const c = 1;\n', 'host/x.ts': "import { c } from '../client/c';\n" }],
    ['activities-imports-up', { 'workflows/w.ts': 'export type W = 1;\n', 'activities/x.ts': "import type { W } from '../workflows/w';\n" }],
    ['activities-imports-up', { 'client/c.ts': 'export const c = 1;\n', 'activities/x.ts': "import { c } from '../client/c';\n" }],
    ['activities-imports-up', { 'workers/k.ts': 'export const k = 1;\n', 'activities/x.ts': "const k = require('../workers/k');\n" }],
    ['workflows-imports-up', { 'workers/k.ts': 'export const k = 1;\n', 'workflows/x.ts': "import { k } from '../workers/k';\n" }],
    ['workflows-value-imports-activities', { ...activity, 'workflows/x.ts': "import { act } from '../activities/act';\n" }],
    ['workflows-value-imports-activities', { ...activity, 'workflows/x.ts': "export * from '../activities/act';\n" }],
    ['workflows-node-code', { 'workflows/x.ts': "import { join } from 'node:path';\n" }],
    ['workflows-node-code', { 'blob/store.ts': 'export class BlobStore {}\n', 'workflows/x.ts': "import { BlobStore } from '../blob/store';\n" }],
    ['workers-imports-client', { 'client/c.ts': 'export const c = 1;\n', 'workers/x.ts': "import type { c } from '../client/c';\n" }],
    ['bench-imports-test', { 'test/helpers/s.ts': 'export const s = 1;\n', 'bench/x.ts': "import { s } from '../test/helpers/s';\n" }],
    ['bench-imports-test', { 'test/helpers/s.ts': 'export const s = 1;\n', 'testing/x.ts': "import { s } from '../test/helpers/s';\n" }],
    [
      'import-cycle',
      {
        'lib/p.ts': "import { q } from './q';\nexport const p = 1;\n",
        'lib/q.ts': "import { r } from './r';\nexport const q = 1;\n",
        'lib/r.ts': "export { p as r } from './p';\n",
      },
    ],
    ['import-cycle', { 'env/self.ts': "import './self';\n" }],
    ['file-too-long', { 'workflows/big.ts': 'export const x = 1;\n'.repeat(MAX_SOURCE_LINES + 1) }],
    ['file-too-long', { 'env/big.ts': 'export const x = 1;\n'.repeat(MAX_SOURCE_LINES + 1) }],
    ['file-too-long', { 'workers/learner/halo_learner/big.py': 'x = 1\n'.repeat(MAX_SOURCE_LINES + 1) }],
    [
      'iteration-loop-twice',
      {
        'workflows/loop-a.ts': 'await executeChild(episode, {});\nawait learner.updatePolicy({});\nawait control.loadAdapterIntoVllm({});\n',
        'workflows/loop-b.ts': 'await algorithm.collect(scope);\nawait algorithm.update(scope);\nawait control.loadAdapterIntoVllm({});\n',
      },
    ],
  ];
  for (const [rule, files] of cases) assert.deepEqual(broken({ ...lib, ...files }), [rule], `${rule}: ${Object.keys(files).join(', ')}`);
});

test('what the rules allow', () => {
  const allowed = {
    'lib/a.ts': "import { z } from 'zod';\nimport { parse } from 'yaml';\nimport type { Duration } from '@temporalio/common';\nexport const a = 1;\n",
    'lib/b.ts': "import { a } from './a';\nexport const b = a;\n",
    'lib/search/s.ts': "import { z } from 'zod';\nimport { b } from '../b';\nexport const s = z.literal(b);\n",
    'host/h.ts': "import { readFileSync } from 'node:fs';\nimport { b } from '../lib/b';\nexport const h = b;\n",
    'activities/act.ts': "import { h } from '../host/h';\nexport async function act() { return h; }\n",
    'workflows/w.ts':
      "import type { h } from '../host/h';\nimport type { act } from '../activities/act';\nimport { type act as Act2 } from '../activities/act';\nexport type W = typeof import('../activities/act');\n",
    'workers/k.ts': "import { h } from '../host/h';\nimport * as acts from '../activities/act';\nexport const k = require.resolve('../workflows/w');\n",
    'client/c.ts': "import { k } from '../workers/k';\n",
    // Type-only imports both ways are no cycle: nothing of either runs when the other loads.
    'lib/t1.ts': "import type { T2 } from './t2';\nexport type T1 = { next?: T2 };\n",
    'lib/t2.ts': "import type { T1 } from './t1';\nexport type T2 = { prev?: T1 };\n",
    'workflows/long.ts': 'export const x = 1;\n'.repeat(MAX_SOURCE_LINES),
    'test/unit/long.test.ts': 'export const x = 1;\n'.repeat(MAX_SOURCE_LINES + 1),
    'workers/learner/tests/test_long.py': 'x = 1\n'.repeat(MAX_SOURCE_LINES + 1),
    // Collecting and updating without serving (a search, an evaluation) is no iteration loop; one loop is fine.
    'workflows/loop-a.ts': 'await executeChild(episode, {});\nawait learner.updatePolicy({});\nawait control.loadAdapterIntoVllm({});\n',
    'workflows/search.ts': 'await executeChild(episode, {});\nawait learner.updateDpo({});\n',
    'testing/fake.ts': "import { c } from '../client/c';\nexport const fake = c;\n",
    'bench/b.ts': "import { b } from '../lib/b';\nimport { fake } from '../testing/fake';\n",
    'test/unit/t.test.ts': "import { c } from '../../client/c';\n",
  };
  assert.deepEqual(checkLayering(new Map(Object.entries(allowed))), []);
});

test('a cycle is reported as the path that closes it', () => {
  const v = checkLayering(
    new Map([
      ['lib/p.ts', "import { q } from './q';\n"],
      ['lib/q.ts', "import { r } from './r';\n"],
      ['lib/r.ts', "import { p } from './p';\n"],
      ['lib/s.ts', "import { p } from './p';\n"],
    ]),
  );
  assert.deepEqual(
    v.map((x) => x.message),
    ['import cycle: lib/p.ts → lib/q.ts → lib/r.ts → lib/p.ts'],
  );
});

test('imports are read with their kind', () => {
  const refs = importsOf(
    'x.ts',
    [
      "import a from './a';",
      "import type { B } from './b';",
      "import { type C, type D } from './c';",
      "import { type E, f } from './e';",
      "export type { G } from './g';",
      "export * from './h';",
      "import i = require('./i');",
      "const j = await import('./j');",
      "type K = import('./k').K;",
      "import './l';",
    ].join('\n'),
  );
  assert.deepEqual(
    refs.map((r) => `${r.specifier}:${r.typeOnly ? 'type' : 'value'}`),
    ['./a:value', './b:type', './c:type', './e:value', './g:type', './h:value', './i:value', './j:value', './k:type', './l:value'],
  );
});
