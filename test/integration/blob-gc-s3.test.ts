import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ListObjectsV2Command, PutObjectCommand } from '@aws-sdk/client-s3';
import { blobStoreFor } from '../../blob/store';
import { collectBlobGarbage } from '../../host/blob-gc';
import { startLocalS3, type LocalS3 } from '../../testing/s3-server';

/**
 * `halo gc` on an S3-compatible store (moto's server mode on loopback): the same mark as the folder sweep,
 * a sweep of the keys under `<prefix>/blobs/` (paged listing, batched deletes), nothing else in the bucket
 * touched, and a put of bytes already stored making the object young again.
 */

let s3: LocalS3;
before(async () => {
  s3 = await startLocalS3();
});
after(async () => {
  await s3?.stop();
});

const allKeys = async (): Promise<string[]> => {
  const keys: string[] = [];
  let token: string | undefined;
  do {
    const res = await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket, ContinuationToken: token }));
    for (const o of res.Contents ?? []) keys.push(o.Key!);
    token = res.IsTruncated ? res.NextContinuationToken : undefined;
  } while (token);
  return keys;
};

/** Until the wall clock is in a later second than `t` (LastModified has whole seconds). */
const nextSecond = (t: number) => new Promise((r) => setTimeout(r, 1000 - (t % 1000) + 50));

test('mark and sweep over a bucket prefix: live and young objects stay, old unreferenced ones go, dry run deletes nothing', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-s3-'));
  try {
    const env = s3.env('gc');
    const store = blobStoreFor(home, env);
    assert.equal(store.root, `s3://${s3.bucket}/gc/blobs`);
    const png = (i: number) => Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47]), Buffer.alloc(200 + i, i)]);

    // Live through a history (trajectory → screenshots) and a metrics row (batch → prompt → screenshot).
    const shotA = await store.put(png(1), 'png');
    const shotB = await store.put(png(2), 'png');
    const trajectory = await store.putJson({ steps: [{ screenshotRef: shotA }, { screenshotRef: shotB }] });
    const shotC = await store.put(png(3), 'png');
    const prompt = await store.putJson([{ role: 'user', content: [{ type: 'image', ref: shotC }] }]);
    const batch = await store.putJson({ groups: [{ promptRef: prompt }] });
    mkdirSync(join(home, 'grpo-a'), { recursive: true });
    writeFileSync(join(home, 'grpo-a', 'metrics.jsonl'), JSON.stringify({ iteration: 1, batch_ref: batch }) + '\n');
    const missingRef = `sha256:${'ab'.repeat(32)}.png`;
    const history = JSON.stringify({ events: [{ result: { trajectoryRef: trajectory } }, { input: { gone: missingRef } }] });
    // Dead: a screenshot, a prompt naming it (dead text blobs are not followed), one put again later.
    const deadShot = await store.put(png(5), 'png');
    const deadPrompt = await store.putJson([{ image: deadShot }]);
    const reused = await store.put(png(6), 'png');
    // More dead objects than a listing page (1,000 keys) and a delete batch (1,000) hold.
    const many = Array.from({ length: 1001 }, (_, i) => `${(i % 256).toString(16).padStart(2, '0')}/${i.toString(16).padStart(62, '0')}.png`);
    for (let i = 0; i < many.length; i += 250) {
      await Promise.all(many.slice(i, i + 250).map((name) => s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `gc/blobs/${name}`, Body: 'x' }))));
    }
    // Never listed, never deleted: other keys under the prefix, another prefix's blobs, the bucket root.
    const strangers = ['gc/blobs/notes.txt', 'gc/blobs/ab/not-a-blob.png', 'gc/checkpoints/run-1/v1/adapter.safetensors', `other/blobs/${deadShot.slice(7, 9)}/${deadShot.slice(9)}`, 'loose'];
    for (const Key of strangers) await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key, Body: 'keep me' }));
    const oldUntil = Date.now();

    // Young: written after every old one (in a later second), and the dead blob put again (a refreshed age).
    await nextSecond(oldUntil);
    const recent = await store.put(png(7), 'png');
    assert.equal(await store.put(png(6), 'png'), reused);
    const now = Date.now();
    // Old: written up to `oldUntil`; young: in a later second.
    const opts = { store, rootPaths: [home], rootTexts: [history], now, graceMs: now - oldUntil };

    const live = [shotA, shotB, trajectory, shotC, prompt, batch];
    const dead = [deadShot, deadPrompt];
    const keysBefore = (await allKeys()).sort();
    const dry = await collectBlobGarbage({ ...opts, dryRun: true });
    assert.deepEqual(
      [dry.blobs, dry.live, dry.young, dry.removed, dry.tempFilesRemoved, dry.missing],
      [live.length + dead.length + 2 + many.length, live.length, 2, dead.length + many.length, 0, 1],
    );
    const deadBytes = (await Promise.all(dead.map(async (r) => (await store.get(r)).length))).reduce((a, b) => a + b, 0) + many.length;
    assert.equal(dry.bytesFreed, deadBytes);
    assert.equal(dry.where, store.root);
    assert.deepEqual((await allKeys()).sort(), keysBefore, 'the dry run changed the bucket');

    const wet = await collectBlobGarbage(opts);
    assert.equal(wet.removed, dead.length + many.length);
    assert.equal(wet.bytesFreed, deadBytes);
    for (const r of dead) assert.ok(wet.removedRefs.includes(r), `${r} not reported removed`);
    for (const r of [...live, recent, reused]) assert.ok(await store.exists(r), `${r} was removed`);
    for (const r of dead) assert.equal(await store.exists(r), false, `dead ${r} is still there`);
    const left = (await allKeys()).sort();
    for (const k of strangers) assert.ok(left.includes(k), `${k} outside the sweep was deleted`);
    assert.equal(left.length, strangers.length + live.length + 2);

    // Nothing more to take; without the metrics row the batch, its prompt and its screenshot go.
    assert.equal((await collectBlobGarbage(opts)).removed, 0);
    rmSync(join(home, 'grpo-a'), { recursive: true });
    const third = await collectBlobGarbage(opts);
    assert.deepEqual(third.removedRefs.sort(), [batch, prompt, shotC].sort());
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});
