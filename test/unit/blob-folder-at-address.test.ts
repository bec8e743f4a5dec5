import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { BlobNotFoundError, BlobStore } from '../../blob/store';

// A folder at a blob's address (made by hand, by `mkdir -p` of a mistaken path, by a tool) must not make that blob
// unreadable and unwritable for good: it reads as missing, and the next put of the bytes replaces it.

test('a folder at a blob address reads as missing and the next put replaces it with the blob', async () => {
  const root = mkdtempSync(join(tmpdir(), 'halo-blob-dir-'));
  try {
    const store = new BlobStore(root);
    const bytes = Buffer.from('{"screenshot":"of a page"}');
    const ref = `sha256:${createHash('sha256').update(bytes).digest('hex')}.json`;
    const path = store.pathOf(ref);
    mkdirSync(join(path, 'inside'), { recursive: true });
    writeFileSync(join(path, 'inside', 'x'), 'left there');

    assert.equal(await store.exists(ref), false);
    await assert.rejects(store.get(ref), (err: Error) => err instanceof BlobNotFoundError && /a folder is at its address/.test(err.message));

    assert.equal(await store.put(bytes, 'json'), ref);
    assert.ok(statSync(path).isFile());
    assert.deepEqual(await store.get(ref), bytes);
    assert.equal(await store.exists(ref), true);
    // Nothing is left beside it: the folder was moved aside and removed.
    assert.deepEqual(readdirSync(dirname(path)), [path.slice(dirname(path).length + 1)]);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
