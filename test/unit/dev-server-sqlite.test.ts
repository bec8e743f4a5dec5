import { test } from 'node:test';
import assert from 'node:assert/strict';
import { devServerArgs } from '../../client/temporal-server';
import { parseConfig } from '../../lib/config/config';

const pragmas = (args: string[]) => args.flatMap((a, i) => (args[i - 1] === '--sqlite-pragma' ? [a] : []));

test('stack.sqliteSynchronous: full reaches the dev server as a SQLite pragma; normal by default', () => {
  assert.equal(parseConfig({}).stack.sqliteSynchronous, 'normal');
  assert.deepEqual(pragmas(devServerArgs({ home: '/h', port: 7233 })), ['journal_mode=wal', 'synchronous=normal']);
  const full = parseConfig({ stack: { sqliteSynchronous: 'full' } }).stack.sqliteSynchronous;
  assert.deepEqual(pragmas(devServerArgs({ home: '/h', port: 7233, sqliteSynchronous: full })), ['journal_mode=wal', 'synchronous=full']);
});

test('stack.sqliteSynchronous: a value other than normal or full is refused, naming the key', () => {
  assert.throws(() => parseConfig({ stack: { sqliteSynchronous: 'off' } }), /stack\.sqliteSynchronous/);
});
