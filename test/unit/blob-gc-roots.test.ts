import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { collectBlobGarbage } from '../../host/blob-gc';

// Every root under the home is read as it is: a folder or file linked in from another disk, and runs whose
// ids are names the home also uses (`models`, `blobs`).

test('links under the home are followed and runs called models or blobs are read: what they name stays', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-roots-'));
  const elsewhere = mkdtempSync(join(tmpdir(), 'halo-gc-data-'));
  try {
    const blobsDir = join(home, 'blobs');
    const blobs = new BlobStore(blobsDir);
    const viaLinkedFolder = await blobs.putJson({ records: 'of an evaluation kept on another disk' });
    const viaLinkedFile = await blobs.putJson({ batch: 'named by a linked metrics file' });
    const viaModelsRun = await blobs.putJson({ batch: 'of the run called models' });
    const viaBlobsRun = await blobs.putJson({ batch: 'of the run called blobs' });
    const dead = await blobs.put('named by nothing', 'txt');
    // runs/evals -> <elsewhere>/evals, and a metrics file linked in.
    mkdirSync(join(elsewhere, 'evals', 'ev1'), { recursive: true });
    writeFileSync(join(elsewhere, 'evals', 'ev1', 'summary.json'), JSON.stringify({ recordsRef: viaLinkedFolder }));
    writeFileSync(join(elsewhere, 'metrics.jsonl'), JSON.stringify({ batch_ref: viaLinkedFile }) + '\n');
    symlinkSync(join(elsewhere, 'evals'), join(home, 'evals'));
    mkdirSync(join(home, 'grpo-x'));
    symlinkSync(join(elsewhere, 'metrics.jsonl'), join(home, 'grpo-x', 'metrics.jsonl'));
    // A loop of links is read once, and a dangling link names nothing.
    symlinkSync(home, join(home, 'grpo-x', 'loop'));
    symlinkSync(join(elsewhere, 'gone'), join(home, 'dangling'));
    // Runs whose ids are `models` and `blobs`: their folders are <home>/models and <home>/blobs.
    mkdirSync(join(home, 'models'));
    writeFileSync(join(home, 'models', 'metrics.jsonl'), JSON.stringify({ batch_ref: viaModelsRun }) + '\n');
    writeFileSync(join(blobsDir, 'metrics.jsonl'), JSON.stringify({ batch_ref: viaBlobsRun }) + '\n');
    const old = (Date.now() - 3 * 3600_000) / 1000;
    for (const d of readdirSync(blobsDir).filter((n) => /^[0-9a-f]{2}$/.test(n))) for (const f of readdirSync(join(blobsDir, d))) utimesSync(join(blobsDir, d, f), old, old);

    const r = await collectBlobGarbage({ store: blobs, rootPaths: [home] });
    assert.deepEqual(r.removedRefs, [dead]);
    for (const ref of [viaLinkedFolder, viaLinkedFile, viaModelsRun, viaBlobsRun]) assert.ok(await blobs.exists(ref), `${ref} was swept`);
    assert.equal(r.live, 4);
  } finally {
    rmSync(home, { recursive: true, force: true });
    rmSync(elsewhere, { recursive: true, force: true });
  }
});
