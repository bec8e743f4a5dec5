import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, readdirSync, rmSync, statSync, utimesSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { collectBlobGarbage } from '../../host/blob-gc';

// A gc that keeps everything live and removes the rest: live through a workflow history, a metrics row, an
// eval records file and chains of text blobs (trajectory → screenshots, batch → prompt → screenshot); dead
// blobs older than the grace period go, recent ones stay.

test('mark and sweep keeps every blob a root or a live blob names, removes the rest, reports the bytes', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-'));
  try {
    const blobsDir = join(home, 'blobs');
    const blobs = new BlobStore(blobsDir);
    const png = (i: number) => Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47]), Buffer.alloc(1000 + i, i)]);
    // Live through a running episode's history: its trajectory, and the trajectory's screenshots.
    const shotA = await blobs.put(png(1), 'png');
    const shotB = await blobs.put(png(2), 'png');
    const trajectory = await blobs.putJson({ steps: [{ screenshotRef: shotA }, { screenshotRef: shotB }] });
    // Live through a metrics row: a batch → its prompt → a screenshot.
    const shotC = await blobs.put(png(3), 'png');
    const prompt = await blobs.putJson([{ role: 'user', content: [{ type: 'image', ref: shotC }] }]);
    const batch = await blobs.putJson({ groups: [{ promptRef: prompt, completions: ['x'] }] });
    mkdirSync(join(home, 'grpo-a'), { recursive: true });
    writeFileSync(join(home, 'grpo-a', 'metrics.jsonl'), JSON.stringify({ iteration: 1, batch_ref: batch }) + '\n');
    // Live through an evaluation's records file (eval → records blob → trajectory → screenshot).
    const shotD = await blobs.put(png(4), 'png');
    const evalTrajectory = await blobs.putJson({ steps: [{ screenshotRef: shotD }] });
    const records = await blobs.put(JSON.stringify({ trajectoryRef: evalTrajectory }) + '\n', 'jsonl');
    mkdirSync(join(home, 'evals', 'ev1'), { recursive: true });
    writeFileSync(join(home, 'evals', 'ev1', 'summary.json'), JSON.stringify({ recordsRef: records }));
    // A cycle of text blobs is no problem; a ref to a blob that is gone is counted as missing.
    const gone = `sha256:${'ab'.repeat(32)}.png`;
    const selfish = await blobs.putJson({ note: 'names a missing blob', ref: gone });
    // Dead: an unchosen fork's screenshot, an old prompt naming it, a dead screenshot the store has twice over.
    const deadShot = await blobs.put(png(5), 'png');
    const deadPrompt = await blobs.putJson([{ image: deadShot }]);
    const deadShot2 = await blobs.put(png(6), 'png');
    // Dead but recent: kept (an activity may have written it and not yet reported it).
    const recent = await blobs.put(png(7), 'png');
    // An abandoned temp file of an interrupted write.
    const tmp = join(blobsDir, deadShot.slice(7, 9), `x.${process.pid}.deadbeef.tmp`);
    writeFileSync(tmp, Buffer.alloc(500));

    const old = (Date.now() - 3 * 3600_000) / 1000;
    for (const d of readdirSync(blobsDir)) for (const f of readdirSync(join(blobsDir, d))) utimesSync(join(blobsDir, d, f), old, old);
    const now = Date.now() / 1000;
    const [rd, rn] = [recent.slice(7, 9), recent.slice(9)];
    utimesSync(join(blobsDir, rd, rn), now, now);

    const history = JSON.stringify({ events: [{ result: { trajectoryRef: trajectory } }, { input: { selfRef: selfish } }] });
    const live = [shotA, shotB, trajectory, shotC, prompt, batch, shotD, evalTrajectory, records, selfish];
    const dead = [deadShot, deadPrompt, deadShot2];
    const sizeOf = async (refs: string[]) => (await Promise.all(refs.map(async (r) => (await blobs.get(r)).length))).reduce((a, b) => a + b, 0);
    const deadBytes = (await sizeOf(dead)) + 500;

    const dry = await collectBlobGarbage({ blobsDir, rootPaths: [home], rootTexts: [history], dryRun: true });
    assert.deepEqual([dry.blobs, dry.live, dry.young, dry.removed, dry.tempFilesRemoved, dry.missing], [14, 10, 1, 3, 1, 1]);
    assert.equal(dry.bytesFreed, deadBytes);
    for (const r of [...live, ...dead, recent]) assert.ok(await blobs.exists(r), `dry run removed ${r}`);
    assert.ok(existsSync(tmp));

    const wet = await collectBlobGarbage({ blobsDir, rootPaths: [home], rootTexts: [history] });
    assert.deepEqual(wet.removedRefs.sort(), [...dead].sort());
    assert.equal(wet.bytesFreed, deadBytes);
    for (const r of live) assert.ok(await blobs.exists(r), `live ${r} was removed`);
    for (const r of dead) assert.equal(await blobs.exists(r), false, `dead ${r} is still there`);
    assert.ok(await blobs.exists(recent), 'a recent blob was removed');
    assert.equal(existsSync(tmp), false);

    // Nothing left to take; the history alone no longer names the batch once the metrics row is gone.
    const again = await collectBlobGarbage({ blobsDir, rootPaths: [home], rootTexts: [history] });
    assert.equal(again.removed, 0);
    rmSync(join(home, 'grpo-a'), { recursive: true });
    const third = await collectBlobGarbage({ blobsDir, rootPaths: [home], rootTexts: [history] });
    assert.deepEqual(third.removedRefs.sort(), [batch, prompt, shotC].sort());
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test('a put of bytes already stored makes the blob young again, so a sweep keeps it', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-'));
  try {
    const blobsDir = join(home, 'blobs');
    const blobs = new BlobStore(blobsDir);
    const ref = await blobs.put('reused', 'txt');
    const old = (Date.now() - 3 * 3600_000) / 1000;
    utimesSync(blobs.pathOf(ref), old, old);
    assert.deepEqual((await collectBlobGarbage({ blobsDir, dryRun: true })).removedRefs, [ref]);
    assert.equal(await blobs.put('reused', 'txt'), ref);
    assert.ok(Date.now() - statSync(blobs.pathOf(ref)).mtimeMs < 60_000, 'the mtime was not refreshed');
    const r = await collectBlobGarbage({ blobsDir });
    assert.deepEqual([r.removed, r.young], [0, 1]);
    assert.ok(await blobs.exists(ref));
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});
