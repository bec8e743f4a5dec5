import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Client } from '@temporalio/client';
import { BlobStore, REFRESH_EVERY_MS } from '../../blob/store';
import { collectBlobGarbage, MIN_GC_GRACE_MS } from '../../host/blob-gc';
import { describeGc, gcBlobs } from '../../client/commands/gc';
import { recordedStore } from '../../workers/runtime';
import type { HaloConfig } from '../../lib/config/config';
import type { TemporalSettings } from '../../host/connection';

// Two stacks on one home: namespaces A and B share `<home>/blobs`. A sweep run for A alone must not take what
// only B's workflows name, and a blob put again by a writer whose clock lags must not look old.

const REPO = resolve(__dirname, '../..');
const threeHoursAgo = () => (Date.now() - 3 * 3600_000) / 1000;

/** A namespace's Temporal client, as `gcBlobs` reads it: one workflow per entry, its history as given. */
function namespaceClient(namespace: string, histories: Record<string, unknown>): Client {
  return {
    options: { namespace },
    workflow: {
      list: () =>
        (async function* () {
          for (const workflowId of Object.keys(histories)) yield { workflowId, runId: `${workflowId}-run` };
        })(),
      getHandle: (id: string) => ({ fetchHistory: async () => histories[id] }),
    },
  } as unknown as Client;
}

const runningHistory = (ref: string) => ({
  events: [{ activityTaskCompletedEventAttributes: { result: { payloads: [{ data: Buffer.from(JSON.stringify({ batchRef: ref })) }] } } }],
});
const settingsOf = (namespace: string): TemporalSettings => ({ address: '127.0.0.1:7233', namespace });

test("a sweep for namespace A deletes nothing while namespace B, which shares the home, is not read; reading both keeps B's live blob", async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-shared-'));
  try {
    // Both stacks' workers start on the same home (HALO_HOME), each recording its namespace before it writes.
    const blobsA = await recordedStore(new BlobStore(join(home, 'blobs')), settingsOf('team-a'));
    const blobsB = await recordedStore(new BlobStore(join(home, 'blobs')), settingsOf('team-b'));
    const onlyB = await blobsB.putJson({ batch: 'of a run that is running in namespace team-b' });
    const dead = await blobsA.put('nothing names this', 'txt');
    for (const r of [onlyB, dead]) utimesSync(blobsA.pathOf(r), threeHoursAgo(), threeHoursAgo());
    const a = namespaceClient('team-a', {});
    const b = namespaceClient('team-b', { 'grpo-b': runningHistory(onlyB) });
    const o = { home, store: blobsA, graceMs: 60 * 60_000 };

    await assert.rejects(gcBlobs({} as HaloConfig, a, { ...o, dryRun: false }), (err: Error) => {
      assert.match(err.message, /namespace team-b also writes to the blob store .*reads only team-a/s);
      assert.match(err.message, new RegExp(`team-b: recorded in ${join(home, 'blobs', 'writers', 'team-b.json').replace(/[.]/g, '\\.')}`));
      assert.match(err.message, /--namespace team-a --namespace team-b.*Nothing was deleted/s);
      return true;
    });
    assert.ok(await blobsA.exists(onlyB), "namespace team-b's live blob was deleted by a sweep for team-a");
    assert.ok(await blobsA.exists(dead));

    // A dry run for A alone still reports, and says what it did not read.
    const dry = await gcBlobs({} as HaloConfig, a, { ...o, dryRun: true });
    assert.deepEqual(dry.unreadNamespaces, ['team-b']);
    assert.match(describeGc(dry), /not read: namespace team-b writes to this store/);

    // Both namespaces read: B's blob is live, only the dead one goes; nothing of the records is touched.
    const wet = await gcBlobs({} as HaloConfig, [a, b], { ...o, dryRun: false });
    assert.deepEqual(wet.removedRefs, [dead]);
    assert.equal(wet.unreadNamespaces, undefined);
    assert.ok(await blobsA.exists(onlyB));
    assert.deepEqual(readdirSync(join(home, 'blobs', 'writers')).sort(), ['team-a.json', 'team-b.json']);
    assert.deepEqual(
      (await blobsA.writers()).map((w) => [w.namespace, w.address]),
      [
        ['team-a', '127.0.0.1:7233'],
        ['team-b', '127.0.0.1:7233'],
      ],
    );
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test('the learner records its namespace in the same place, and a torn record stops the sweep instead of being skipped', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-shared-'));
  try {
    const blobs = new BlobStore(join(home, 'blobs'));
    const py = spawnSync(
      join(REPO, '.venv', 'bin', 'python'),
      ['-c', 'import sys; from halo_learner.blobs import BlobStore; BlobStore(sys.argv[1]).record_writer("learners/ns", "temporal:7233", "gpu-1")', join(home, 'blobs')],
      { cwd: join(REPO, 'workers', 'learner'), env: { ...process.env, HALO_HOME: home, HALO_STORE: '' }, encoding: 'utf8' },
    );
    assert.equal(py.status, 0, py.stderr);
    const [w] = await blobs.writers();
    assert.deepEqual([w.namespace, w.address, w.host], ['learners/ns', 'temporal:7233', 'gpu-1']);
    await assert.rejects(gcBlobs({} as HaloConfig, namespaceClient('default', {}), { home, store: blobs, dryRun: false }), /namespace learners\/ns also writes/);

    writeFileSync(w.where, '{"namesp');
    await assert.rejects(gcBlobs({} as HaloConfig, namespaceClient('learners/ns', {}), { home, store: blobs, dryRun: false }), /writer record .* cannot be read/);
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test("a blob put again by a writer whose clock lags two hours gets the file system's time, and a sweep keeps it", async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-shared-'));
  const RealDate = globalThis.Date;
  try {
    const blobs = new BlobStore(join(home, 'blobs'));
    const ref = await blobs.put('a screenshot every episode of the task starts from', 'txt');
    utimesSync(blobs.pathOf(ref), threeHoursAgo(), threeHoursAgo());
    // This host's clock lags the shared disk by two hours (no NTP on it).
    const lag = 2 * 3600_000;
    class LaggingDate extends RealDate {
      constructor(...args: unknown[]) {
        if (args.length === 0) super(RealDate.now() - lag);
        else super(...(args as [number]));
      }
      static override now(): number {
        return RealDate.now() - lag;
      }
    }
    globalThis.Date = LaggingDate as DateConstructor;
    try {
      assert.equal(await blobs.put('a screenshot every episode of the task starts from', 'txt'), ref);
    } finally {
      globalThis.Date = RealDate;
    }
    assert.ok(Math.abs(statSync(blobs.pathOf(ref)).mtimeMs - (await blobs.now())) < 60_000, "the reused blob's age is not on the store's clock");
    const r = await collectBlobGarbage({ store: blobs, graceMs: MIN_GC_GRACE_MS });
    assert.deepEqual([r.removed, r.young], [0, 1]);
    assert.ok(await blobs.exists(ref), 'a blob reused a moment ago was swept');
  } finally {
    globalThis.Date = RealDate;
    rmSync(home, { recursive: true, force: true });
  }
});

test("the learner refreshes reused objects at the TypeScript side's period, so the sweep's allowance for it holds on both", () => {
  const py = readFileSync(join(REPO, 'workers', 'learner', 'halo_learner', 'blobs.py'), 'utf8');
  const m = /^REFRESH_EVERY_S = ([\d.]+)$/m.exec(py);
  assert.ok(m, 'REFRESH_EVERY_S not found in blobs.py');
  assert.equal(Number(m[1]) * 1000, REFRESH_EVERY_MS);
  // Well under the minimum grace: a reused blob's recorded age trails its last use by at most this.
  assert.ok(REFRESH_EVERY_MS * 5 <= MIN_GC_GRACE_MS);
  assert.equal(new BlobStore(join(tmpdir(), 'halo-none')).refreshLagMs, 0, 'a folder refreshes on every put');
});
