import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DeleteObjectsCommand, ListObjectsV2Command, PutObjectCommand } from '@aws-sdk/client-s3';
import type { Client } from '@temporalio/client';
import { BlobStore, blobStoreFor } from '../../blob/store';
import { parseStoreUrl } from '../../blob/location';
import { S3Objects, s3ClientFromEnv } from '../../blob/s3';
import { collectBlobGarbage, MIN_GC_GRACE_MS } from '../../host/blob-gc';
import { gcBlobs } from '../../client/commands/gc';
import type { HaloConfig } from '../../lib/config/config';
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
    const strangers = [
      'gc/blobs/notes.txt',
      'gc/blobs/ab/not-a-blob.png',
      'gc/checkpoints/run-1/v1/adapter.safetensors',
      `other/blobs/${deadShot.slice(7, 9)}/${deadShot.slice(9)}`,
      'loose',
    ];
    for (const Key of strangers) await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key, Body: 'keep me' }));
    const oldUntil = Date.now();

    // Young: written after every old one (in a later second), and the dead blob put again (a refreshed age).
    await nextSecond(oldUntil);
    const recent = await store.put(png(7), 'png');
    assert.equal(await store.put(png(6), 'png'), reused);
    const now = Date.now();
    // Old: written up to `oldUntil`; young: in a later second (the sweep's clock moved on by the refresh period,
    // which it adds to the grace).
    const opts = { store, rootPaths: [home], rootTexts: [history], now: now + store.refreshLagMs, graceMs: now - oldUntil };

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

/** A namespace with no workflows (the homes' files are the only roots). */
const noHistories = { options: { namespace: 'default' }, workflow: { list: () => (async function* () {})() } } as unknown as Client;

/** The store of `env` with its own S3 client (to watch its requests), on a clock `aheadMs` later than the bucket's. */
function storeOf(env: Record<string, string>, opts: { aheadMs?: number; onSend?: (cmd: unknown) => Promise<void> } = {}): BlobStore {
  const client = s3ClientFromEnv(env);
  if (opts.onSend) {
    const send = client.send.bind(client) as (cmd: unknown) => Promise<unknown>;
    (client as unknown as { send: (cmd: unknown) => Promise<unknown> }).send = async (cmd: unknown) => {
      const out = await send(cmd);
      await opts.onSend!(cmd);
      return out;
    };
  }
  const loc = parseStoreUrl(env.HALO_STORE!);
  const root = `s3://${loc.bucket}/${loc.prefix}/blobs`;
  const store = new BlobStore(root, { objects: new S3Objects({ bucket: loc.bucket, prefix: `${loc.prefix}/blobs` }, client) });
  if (opts.aheadMs) {
    const now = store.now.bind(store);
    store.now = async () => (await now()) + opts.aheadMs!;
  }
  return store;
}

test("ages come from the bucket's Date header: a host whose clock runs two hours ahead sweeps nothing young", async () => {
  const env = s3.env('clock');
  const store = blobStoreFor(mkdtempSync(join(tmpdir(), 'halo-gc-s3-')), env);
  const young = await store.put('just written by another host', 'txt');
  const t = await store.now();
  assert.ok(Math.abs(t - Date.now()) < 5_000, `the bucket's clock ${t} is not the server's time`);
  const realNow = Date.now;
  try {
    Date.now = () => realNow() + 2 * 3600_000;
    const r = await collectBlobGarbage({ store });
    assert.deepEqual([r.removed, r.young], [0, 1]);
  } finally {
    Date.now = realNow;
  }
  assert.ok(await store.exists(young));
});

test('each delete batch re-lists its folders first: a blob reused while an earlier batch was deleted stays', async () => {
  const env = s3.env('race');
  // 1,000 dead blobs fill the first batch; the victim (folder ff, sorted last) is in the second.
  const names = Array.from({ length: 1000 }, (_, i) => `${(i % 200).toString(16).padStart(2, '0')}/${i.toString(16).padStart(62, '0')}.png`);
  const victim = `ff/${'f'.repeat(62)}.png`;
  for (let i = 0; i < names.length; i += 250) {
    await Promise.all(names.slice(i, i + 250).map((name) => s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `race/blobs/${name}`, Body: 'x' }))));
  }
  await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `race/blobs/${victim}`, Body: 'reused' }));
  await nextSecond(Date.now());
  let batches = 0;
  const store = storeOf(env, {
    onSend: async (cmd) => {
      // Right after the first DeleteObjects: an activity puts the victim's bytes again (a fresh LastModified).
      if (cmd instanceof DeleteObjectsCommand && batches++ === 0) await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `race/blobs/${victim}`, Body: 'reused' }));
    },
  });
  // Everything listed is past the grace period (the sweep's clock two hours on).
  const r = await collectBlobGarbage({ store, now: (await store.now()) + 2 * 3600_000 });
  // (Its batch, emptied by the re-listing, needs no DeleteObjects at all.)
  assert.ok(batches >= 1);
  assert.equal(r.removed, names.length, 'the reused blob was deleted');
  const left = (await allKeys()).filter((k) => k.startsWith('race/'));
  assert.deepEqual(left, [`race/blobs/${victim}`]);
});

test('a shared bucket is swept only when every writer is listed: other homes are read, and without the word nothing goes', async () => {
  const env = s3.env('shared');
  const here = mkdtempSync(join(tmpdir(), 'halo-gc-s3-a-'));
  const there = mkdtempSync(join(tmpdir(), 'halo-gc-s3-b-'));
  try {
    // The bucket's clock read two hours late: every blob is past the grace period.
    const store = storeOf(env, { aheadMs: 2 * 3600_000 });
    const mine = await store.putJson({ host: 'a' });
    const theirs = await store.putJson({ host: 'b', note: 'named only by the other host (its control worker writes metrics there)' });
    const dead = await store.put('dead', 'txt');
    mkdirSync(join(here, 'grpo-a'), { recursive: true });
    writeFileSync(join(here, 'grpo-a', 'metrics.jsonl'), JSON.stringify({ batch_ref: mine }) + '\n');
    mkdirSync(join(there, 'grpo-b'), { recursive: true });
    writeFileSync(join(there, 'grpo-b', 'metrics.jsonl'), JSON.stringify({ batch_ref: theirs }) + '\n');
    const cfg = {} as HaloConfig;
    const o = { home: here, store, graceMs: 60 * 60_000 };

    // No word that every writer is listed: refused, nothing deleted; a dry run still reports.
    await assert.rejects(
      gcBlobs(cfg, noHistories, { ...o, dryRun: false }),
      /is shared:.*homes: +[^\n]*halo-gc-s3-a-.*--home DIR.*--namespace NS.*--all-writers-listed.*Nothing was deleted/s,
    );
    for (const r of [mine, theirs, dead]) assert.ok(await store.exists(r));
    const dry = await gcBlobs(cfg, noHistories, { ...o, dryRun: true, homes: [there] });
    assert.deepEqual([dry.live, dry.removedRefs], [2, [dead]]);
    // A home that is not there (a failed mount) is an error, not a home that names nothing.
    await assert.rejects(gcBlobs(cfg, noHistories, { ...o, dryRun: false, homes: [join(there, 'nope')], allWritersListed: true }), /not a folder; nothing was deleted/);

    // Every writer listed: the other host's blob stays, the dead one goes.
    const wet = await gcBlobs(cfg, noHistories, { ...o, dryRun: false, homes: [there], allWritersListed: true });
    assert.deepEqual(wet.removedRefs, [dead]);
    for (const r of [mine, theirs]) assert.ok(await store.exists(r), `${r} was deleted`);
  } finally {
    rmSync(here, { recursive: true, force: true });
    rmSync(there, { recursive: true, force: true });
  }
});

test('a blob put again seconds before a sweep is kept for the whole grace, though its refresh is throttled per process', async () => {
  const env = s3.env('refresh');
  const store = storeOf(env);
  const bytes = 'a screenshot every fork of the step puts again';
  const ref = await store.put(bytes, 'txt');
  await nextSecond(Date.now());
  // Put again: the object is made young (a self-copy) and this process notes when.
  await store.put(bytes, 'txt');
  const t0 = await store.now();
  // Nine minutes 58 seconds later on this process's clock the same screenshot is put again, and a sweep with
  // the minimum grace starts four seconds after that put (the bucket's clock shifted by as much).
  const realNow = Date.now;
  const later = 9 * 60_000 + 58_000;
  try {
    Date.now = () => realNow() + later;
    assert.equal(await store.put(bytes, 'txt'), ref);
  } finally {
    Date.now = realNow;
  }
  const sweep = (offset: number) => collectBlobGarbage({ store, graceMs: MIN_GC_GRACE_MS, now: t0 + later + offset });
  const r = await sweep(4_000);
  assert.deepEqual([r.removed, r.young], [0, 1], 'a blob put 4 s before the sweep was deleted');
  assert.ok(await store.exists(ref));
  // Once its last put is more than the grace (and the refresh period) behind, it goes.
  const gone = await sweep(MIN_GC_GRACE_MS + store.refreshLagMs + 2_000);
  assert.deepEqual(gone.removedRefs, [ref]);
});

test('namespaces recorded in a bucket are read like those of a folder: an unread one stops the sweep even with --all-writers-listed', async () => {
  const env = s3.env('writers');
  const here = mkdtempSync(join(tmpdir(), 'halo-gc-s3-w-'));
  try {
    const store = storeOf(env, { aheadMs: 2 * 3600_000 });
    await store.recordWriter({ namespace: 'default', host: 'a' });
    await store.recordWriter({ namespace: 'team-b', host: 'b' });
    const theirs = await store.putJson({ named: 'only by a team-b history' });
    const o = { home: here, store, graceMs: 60 * 60_000, dryRun: false, allWritersListed: true };
    await assert.rejects(gcBlobs({} as HaloConfig, noHistories, o), /namespace team-b also writes to the blob store s3:\/\/.*recorded in s3:\/\/[^\n]*\/writers\/team-b\.json/s);
    assert.ok(await store.exists(theirs));
    assert.ok((await allKeys()).includes('writers/blobs/writers/team-b.json'));
    const b = { ...noHistories, options: { namespace: 'team-b' } } as unknown as Client;
    const r = await gcBlobs({} as HaloConfig, [noHistories, b], o);
    assert.deepEqual(r.removedRefs, [theirs], 'with both namespaces read (neither names it) it goes');
  } finally {
    rmSync(here, { recursive: true, force: true });
  }
});
