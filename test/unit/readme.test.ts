import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { brokenLinks, headingAnchors, linkTargets } from '../helpers/markdown-links';

const ROOT = join(__dirname, '..', '..');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const DOCS = readdirSync(join(ROOT, 'docs'))
  .filter((f) => f.endsWith('.md'))
  .map((f) => `docs/${f}`);

test('the README is a short page: at most 250 lines', () => {
  const lines = README.split('\n').length - (README.endsWith('\n') ? 1 : 0);
  assert.ok(lines <= 250, `README.md has ${lines} lines; move guides into docs/ and link them`);
});

test('the README shows both fresh-machine commands, ./launch.sh and ./launch.sh test', () => {
  // The same two patterns CI's check reads.
  assert.match(README, /\.\/launch\.sh test/);
  assert.match(README, /\.\/launch\.sh( |$|`)/m);
});

test("the README's table of contents links every guide in docs/", () => {
  const linked = new Set(linkTargets(README).map((t) => t.split('#')[0]));
  assert.deepEqual(
    DOCS.filter((d) => !linked.has(d)),
    [],
  );
});

test('every link of the README and of docs/ reaches a file, and a heading where it names one', () => {
  assert.deepEqual(brokenLinks(ROOT, ['README.md', ...DOCS]), []);
});

test('a missing file, a missing heading and a link out of the repository are each reported; web links and code are not read', () => {
  const root = mkdtempSync(join(tmpdir(), 'halo-md-'));
  mkdirSync(join(root, 'docs'));
  writeFileSync(join(root, 'docs', 'guide.md'), '# Guide\n\n## Without Docker: `./launch.sh gpu`\n\n## Notes\n\n## Notes\n');
  writeFileSync(
    join(root, 'README.md'),
    [
      '[ok](docs/guide.md#without-docker-launchsh-gpu) [second](docs/guide.md#notes-1) [web](https://example.com/x.md)',
      '[gone](docs/missing.md) [no heading](docs/guide.md#with-docker) [out](../outside.md)',
      '`[code](docs/nothing.md)`',
      '```',
      '[fenced](docs/nothing.md)',
      '```',
    ].join('\n'),
  );
  assert.deepEqual(brokenLinks(root, ['README.md']), [
    'README.md: docs/missing.md: no file docs/missing.md',
    'README.md: docs/guide.md#with-docker: docs/guide.md has no heading with anchor #with-docker',
    'README.md: ../outside.md: no file ../outside.md',
  ]);
  assert.deepEqual([...headingAnchors('# A\n```\n# not a heading\n```\n## A\n')], ['a', 'a-1']);
});
