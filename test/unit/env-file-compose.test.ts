import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { composeDisagreements, loadDotEnv } from '../../host/env-file';

// One .env feeds the CLI (dotenv's grammar) and docker compose (its own): a line the two read differently is named
// by key, never by value, with the way to write it that both read alike.

const TEXT = [
  '# a comment with # and $',
  'PLAIN=sk-abc123',
  'SPACED=abc # a comment both drop',
  'HASHED=abc#def',
  'DOLLAR=pa$word',
  'DQ_DOLLAR="x$y"',
  "SQ='literal # and $ kept by both'",
  'DQ_PLAIN="fine"',
  'export EXPORTED=ok',
  'INNER=a b',
].join('\n');

test('the lines compose reads otherwise are named, by key and line', () => {
  assert.deepEqual(
    composeDisagreements(TEXT).map((d) => [d.line, d.key]),
    [
      [4, 'HASHED'],
      [5, 'DOLLAR'],
      [6, 'DQ_DOLLAR'],
      [10, 'INNER'],
    ],
  );
});

test('loading such a file says so without its values, and still loads it as before', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-env-compose-'));
  try {
    const file = join(dir, '.env');
    writeFileSync(file, TEXT);
    const said: string[] = [];
    const env: NodeJS.ProcessEnv = {};
    loadDotEnv(env, file, (m) => said.push(m));
    assert.equal(said.length, 4);
    assert.match(said[0], new RegExp(`${file.replace(/[.]/g, '\\.')} line 4 \\(HASHED\\): an unquoted "#".*HASHED='…'`));
    assert.ok(!said.join('\n').includes('pa$word') && !said.join('\n').includes('def'), 'a value was printed');
    assert.equal(env.HASHED, 'abc');
    assert.equal(env.SQ, 'literal # and $ kept by both');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
