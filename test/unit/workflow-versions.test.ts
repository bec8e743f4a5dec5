import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { historyCoverageProblems, patchCalls, patchTableProblems, patchTable, summarizeHistory } from '../helpers/workflow-versions';

const ROOT = join(__dirname, '..', '..');

function workflowSources(): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (dir: string) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, e.name);
      if (e.isDirectory()) walk(path);
      else if (e.name.endsWith('.ts')) out.set(relative(ROOT, path).split(sep).join('/'), readFileSync(path, 'utf8'));
    }
  };
  walk(join(ROOT, 'workflows'));
  return out;
}

test('every patched() id in workflows/ has a row in the patch table of docs/architecture.md naming its file, and every row a call', () => {
  const { calls, problems } = patchCalls(workflowSources());
  assert.deepEqual(problems, []);
  assert.ok(calls.length >= 8, `found the calls: ${calls.map((c) => c.id).join(', ')}`);
  const rows = patchTable(readFileSync(join(ROOT, 'docs', 'architecture.md'), 'utf8'));
  assert.ok(rows.length > 0, 'found the patch table in docs/architecture.md');
  assert.deepEqual(patchTableProblems(calls, rows), []);
});

const DOC = `# x

### Workflow versions and the patches old histories need

| patch id | where | keeps replayable | may be removed |
|---|---|---|---|
| \`a-patch\`, \`b-patch\` | \`one.ts\`, \`two.ts\` | … | … |

### Next
`;

test('each patch-table check can fail', () => {
  const code = new Map([
    ['workflows/one.ts', "if (patched('a-patch')) x();\n// patched() in a comment is not a call\n"],
    ['workflows/two.ts', "deprecatePatch('b-patch');\nif (patched('c-patch')) y();\n"],
  ]);
  const { calls, problems } = patchCalls(code);
  assert.deepEqual(problems, []);
  assert.deepEqual(
    calls.map((c) => c.id),
    ['a-patch', 'b-patch', 'c-patch'],
  );
  const rows = patchTable(DOC);
  assert.deepEqual(rows, [{ ids: ['a-patch', 'b-patch'], where: '`one.ts`, `two.ts`' }]);
  assert.deepEqual(patchTableProblems(calls, rows), ["patch 'c-patch' (workflows/two.ts) has no row in the patch table of docs/architecture.md"]);
  assert.deepEqual(patchTableProblems([{ id: 'a-patch', file: 'workflows/three.ts' }], rows), [
    "the patch table's row for 'a-patch' does not name three.ts, where it is called",
    "the patch table names 'b-patch', which no workflow calls",
  ]);
  assert.deepEqual(patchCalls(new Map([['workflows/x.ts', 'const ID = "p";\npatched(ID);\n']])).problems, ['workflows/x.ts:2: patched() with an id that is not a string literal']);
  assert.deepEqual(patchTable('# no table here\n'), []);
});

test('history coverage names workflow types without a history and patches whose new branch none took', () => {
  const marker = (id: string) => ({
    markerRecordedEventAttributes: {
      markerName: 'core_patch',
      details: { 'patch-data': { payloads: [{ data: Buffer.from(JSON.stringify({ id, deprecated: false })).toString('base64') }] } },
    },
  });
  const h = summarizeHistory('x.json', { events: [{ workflowExecutionStartedEventAttributes: { workflowType: { name: 'episode' } } }, marker('a-patch'), marker('a-patch')] });
  assert.deepEqual(h, { file: 'x.json', workflowType: 'episode', patches: ['a-patch'] });
  assert.deepEqual(historyCoverageProblems([h], ['episode'], ['a-patch']), []);
  assert.deepEqual(historyCoverageProblems([h], ['episode', 'evaluate'], ['a-patch', 'b-patch']), [
    'no recorded history of workflow type evaluate',
    "no recorded history took the patched('b-patch') branch",
  ]);
});
