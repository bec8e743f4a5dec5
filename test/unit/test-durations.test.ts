import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT, pythonBinary } from '../../client/processes';

// Per-file durations of a test run: node's reporter test/reporters/file-durations.mjs writes a line per file, and
// tools/test_durations.py sorts them with pytest's JUnit file into durations.tsv and prints the slowest.

const REPORTER = join(REPO_ROOT, 'test', 'reporters', 'file-durations.mjs');
const SUMMARY = join(REPO_ROOT, 'tools', 'test_durations.py');

test('the reporter writes one line per file: its tests, failures and seconds, a file failing at import counted as one failure', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-durations-'));
  writeFileSync(
    join(dir, 'a.test.mjs'),
    [
      "import { describe, test } from 'node:test';",
      "test('one', () => {});",
      "describe('two of them', () => { test('passes', () => {}); test('fails', () => { throw new Error('no'); }); });",
    ].join('\n'),
  );
  writeFileSync(join(dir, 'b.test.mjs'), "throw new Error('at import');\n");
  // Slower than the others, so with three files at once its tests are still running when the others end.
  writeFileSync(join(dir, 'c.test.mjs'), "import { test } from 'node:test';\ntest('waits', async () => { await new Promise((r) => setTimeout(r, 300)); });\n");
  const out = join(dir, 'node.jsonl');
  const r = spawnSync(
    process.execPath,
    ['--test', `--test-reporter=${REPORTER}`, `--test-reporter-destination=${out}`, '--test-concurrency=3', 'a.test.mjs', 'b.test.mjs', 'c.test.mjs'],
    // Without the variable that makes a node started by a test file report to that file's runner.
    { cwd: dir, encoding: 'utf8', timeout: 60_000, env: { ...process.env, NODE_TEST_CONTEXT: undefined } },
  );
  assert.equal(r.status, 1, r.stderr);
  const rows = readFileSync(out, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { file: string; tests: number; failed: number; seconds: number });
  assert.deepEqual(
    rows.map(({ file, tests, failed }) => ({ file, tests, failed })).sort((x, y) => x.file.localeCompare(y.file)),
    [
      { file: 'a.test.mjs', tests: 3, failed: 1 },
      { file: 'b.test.mjs', tests: 0, failed: 1 },
      { file: 'c.test.mjs', tests: 1, failed: 0 },
    ],
  );
  for (const row of rows) assert.ok(row.seconds > 0, JSON.stringify(row));
});

function summarise(dir: string, ...args: string[]) {
  return spawnSync(pythonBinary(), [SUMMARY, dir, ...args], { cwd: REPO_ROOT, encoding: 'utf8', timeout: 60_000 });
}

test("the summary sorts node's and pytest's files slowest first into durations.tsv, a file's last line counting, and prints the top ones", () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-durations-'));
  writeFileSync(
    join(dir, 'node-fast.jsonl'),
    [
      '{"file":"test/unit/a.test.ts","tests":1,"failed":0,"seconds":1.5}',
      '{"file":"test/workflows/b.test.ts","tests":2,"failed":1,"seconds":30.25}',
      // a.test.ts's last results reached the reporter after its exit: its line again, the counts updated.
      '{"file":"test/unit/a.test.ts","tests":4,"failed":0,"seconds":1.5}',
      '',
    ].join('\n'),
  );
  writeFileSync(
    join(dir, 'learner-fast.xml'),
    '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">' +
      '<testcase classname="tests.test_x" file="tests/test_x.py" name="t1" time="2.0" />' +
      '<testcase classname="tests.test_x" file="tests/test_x.py" name="t2" time="3.5"><failure message="no" /></testcase>' +
      '<testcase classname="tests.test_y" file="tests/test_y.py" name="t3" time="0.1" />' +
      '</testsuite></testsuites>',
  );
  const r = summarise(dir, '--top', '2');
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(readFileSync(join(dir, 'durations.tsv'), 'utf8').trim().split('\n'), [
    'file\ttests\tfailed\tseconds',
    'test/workflows/b.test.ts\t2\t1\t30.25',
    'workers/learner/tests/test_x.py\t2\t1\t5.50',
    'test/unit/a.test.ts\t4\t0\t1.50',
    'workers/learner/tests/test_y.py\t1\t0\t0.10',
  ]);
  const lines = r.stdout.trim().split('\n');
  assert.match(lines[0], /^slowest 2 of 4 test files \(37 s in all; every file: .*durations\.tsv\):$/);
  assert.match(lines[1], /30\.2 s {2}test\/workflows\/b\.test\.ts +2 tests {2}1 failed$/);
  assert.match(lines[2], /5\.5 s {2}workers\/learner\/tests\/test_x\.py +2 tests {2}1 failed$/);
  assert.equal(lines.length, 3);
});

test('the summary refuses a folder without durations, a damaged line and a damaged JUnit file, naming what it read', () => {
  const empty = mkdtempSync(join(tmpdir(), 'halo-durations-'));
  const none = summarise(empty);
  assert.equal(none.status, 2);
  assert.match(none.stderr, /no \*\.jsonl \(node\) or \*\.xml \(pytest\) durations in /);
  assert.match(summarise(join(empty, 'missing')).stderr, /is not a folder/);

  const bad = mkdtempSync(join(tmpdir(), 'halo-durations-'));
  writeFileSync(join(bad, 'node-fast.jsonl'), '{"file":"a.test.ts","tests":1,"failed":0,"seconds":1}\n{"file":"b.test.ts"}\n');
  const line = summarise(bad);
  assert.equal(line.status, 2);
  assert.match(line.stderr, /node-fast\.jsonl:2: not a file-durations line/);

  const xml = mkdtempSync(join(tmpdir(), 'halo-durations-'));
  writeFileSync(join(xml, 'learner-fast.xml'), '<testsuites><testsuite>');
  const junit = summarise(xml);
  assert.equal(junit.status, 2);
  assert.match(junit.stderr, /learner-fast\.xml: not a JUnit XML file/);
});
