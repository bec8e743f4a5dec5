import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { createMctsStoreActivities } from '../../activities/mcts-store';

test('storeCompletions: content-addressed text blobs, one reference per text', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-mcts-blobs-')));
  const { storeCompletions } = createMctsStoreActivities(blobs, { writeDpoBatch: async () => 'unused' });
  const { refs } = await storeCompletions({ texts: ['a', 'b', 'a'] });
  assert.equal(refs.length, 3);
  assert.equal(refs[0], refs[2]);
  assert.match(refs[1], /^sha256:[0-9a-f]{64}\.txt$/);
  assert.equal((await blobs.get(refs[1])).toString('utf8'), 'b');
  await assert.rejects(storeCompletions({ texts: [1 as unknown as string] }), /texts/);
});
