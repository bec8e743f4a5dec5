import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { DIR_MODE, FILE_MODE } from '../../blob/file-modes';
import { BlobStore } from '../../blob/store';

// One file-mode policy for what one process writes and another reads (docs/operations.md, "File modes"): a blob
// the control worker writes is read by the learner and the other way round, in compose as one uid:gid. Files
// 0640 and folders 0750 whatever the umask: the default 022 made blobs world-readable, 077 would make them 0600.

const mode = (p: string) => statSync(p).mode & 0o777;

for (const umask of [0o022, 0o077]) {
  test(`a blob, its folders and the writer record are group-readable and no more under umask ${umask.toString(8).padStart(3, '0')}`, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'halo-blob-modes-'));
    const old = process.umask(umask);
    try {
      const store = new BlobStore(join(dir, 'home', 'blobs'));
      const path = store.pathOf(await store.put(Buffer.from('a screenshot'), 'png'));
      assert.equal(FILE_MODE, 0o640);
      assert.equal(DIR_MODE, 0o750);
      assert.equal(mode(path).toString(8), '640');
      assert.equal(mode(dirname(path)).toString(8), '750');
      assert.equal(mode(join(dir, 'home', 'blobs')).toString(8), '750');
      await store.recordWriter({ namespace: 'default', address: '127.0.0.1:7233' });
      const [writer] = await store.writers();
      assert.ok(writer, 'the writer record is there');
      assert.equal(mode(writer.where).toString(8), '640');
      assert.equal(mode(dirname(writer.where)).toString(8), '750');
    } finally {
      process.umask(old);
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
