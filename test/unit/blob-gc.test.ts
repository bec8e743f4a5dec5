import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, readdirSync, rmSync, statSync, utimesSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Client } from '@temporalio/client';
import { defaultPayloadConverter } from '@temporalio/common';
import { BlobNotFoundError, BlobStore } from '../../blob/store';
import { collectBlobGarbage, GcAbortedError, MIN_GC_GRACE_MS } from '../../host/blob-gc';
import { gcBlobs, openRunNeeds, parseGraceMinutes, retentionArgs } from '../../client/commands/gc';
import type { HaloConfig } from '../../lib/config/config';

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

// Data safety (halo gc must never delete what it could not prove unreferenced): reads that fail for any reason
// but "not found" stop the sweep before anything goes; the grace period has a floor; ages use the store's clock.

const threeHoursAgo = () => (Date.now() - 3 * 3600_000) / 1000;
const ageAll = (blobsDir: string) => {
  for (const d of readdirSync(blobsDir)) for (const f of readdirSync(join(blobsDir, d))) utimesSync(join(blobsDir, d, f), threeHoursAgo(), threeHoursAgo());
};

/** A stand-in for the Temporal client: `histories` by workflow id; a function throws what it returns. */
function fakeClient(histories: Record<string, unknown | (() => unknown)>, namespace = 'default'): Client {
  return {
    options: { namespace },
    workflow: {
      list: () =>
        (async function* () {
          for (const workflowId of Object.keys(histories)) yield { workflowId, runId: `${workflowId}-run` };
        })(),
      getHandle: (id: string) => ({
        fetchHistory: async () => {
          const h = histories[id];
          if (typeof h === 'function') throw h();
          return h;
        },
      }),
    },
  } as unknown as Client;
}

const grpcError = (code: number, message: string) => Object.assign(new Error(message), { code });

test('a history that cannot be read (server busy) stops gc before anything is deleted; a history gone is skipped', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-'));
  try {
    const blobsDir = join(home, 'blobs');
    const blobs = new BlobStore(blobsDir);
    const batch = await blobs.putJson({ running: 'batch of a running run' });
    const trajectory = await blobs.putJson({ running: 'trajectory' });
    const dead = await blobs.putJson({ dead: true });
    ageAll(blobsDir);
    const history = (ref: string) => ({ events: [{ workflowExecutionStartedEventAttributes: { input: { payloads: [{ data: Buffer.from(JSON.stringify({ ref })) }] } } }] });
    const busy = fakeClient({
      'grpo-a': history(trajectory),
      'grpo-b': () => grpcError(8, '8 RESOURCE_EXHAUSTED: namespace rate limit exceeded'),
      'ep-gone': () => grpcError(5, '5 NOT_FOUND: workflow execution not found'),
    });
    const o = { home, store: blobs, dryRun: false, graceMs: 60 * 60_000 };
    await assert.rejects(gcBlobs({} as HaloConfig, busy, o), (err: Error) => {
      assert.ok(err instanceof GcAbortedError, String(err));
      assert.match(err.message, /nothing was deleted.*workflow grpo-b \(run grpo-b-run\) in namespace default.*RESOURCE_EXHAUSTED/s);
      return true;
    });
    for (const r of [batch, trajectory, dead]) assert.ok(await blobs.exists(r), `${r} was deleted although a history could not be read`);

    // The same histories readable (the one gone skipped): only the unreferenced blob goes.
    const ok = fakeClient({ 'grpo-a': history(trajectory), 'grpo-b': history(batch), 'ep-gone': () => grpcError(5, '5 NOT_FOUND') });
    const r = await gcBlobs({} as HaloConfig, ok, o);
    assert.deepEqual(r.removedRefs, [dead]);
    for (const x of [batch, trajectory]) assert.ok(await blobs.exists(x));
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test('a text blob that cannot be read (other than missing) stops gc: what it names is not taken as unreferenced', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-'));
  try {
    const blobsDir = join(home, 'blobs');
    const shot = await new BlobStore(blobsDir).put(Buffer.from([0x89, 0x50, 0x4e, 0x47, 1, 2, 3]), 'png');
    const trajectory = await new BlobStore(blobsDir).putJson({ steps: [{ screenshotRef: shot }] });
    const gone = await new BlobStore(blobsDir).putJson({ note: 'listed, then removed by someone else' });
    const dead = await new BlobStore(blobsDir).put('dead', 'txt');
    ageAll(blobsDir);
    // An object store whose GET of the trajectory fails with a 503, and whose GET of `gone` finds nothing.
    let failing = true;
    class Flaky extends BlobStore {
      override get isObjectStore(): boolean {
        return true;
      }
      override async get(ref: string): Promise<Buffer> {
        if (ref === trajectory && failing) throw Object.assign(new Error('SlowDown: please reduce your request rate'), { $metadata: { httpStatusCode: 503 } });
        if (ref === gone) throw new BlobNotFoundError(ref, this.root);
        return super.get(ref);
      }
    }
    const store = new Flaky(blobsDir);
    const rootTexts = [JSON.stringify({ trajectoryRef: trajectory, also: gone })];
    await assert.rejects(collectBlobGarbage({ store, rootTexts }), (err: Error) => {
      assert.ok(err instanceof GcAbortedError);
      assert.match(err.message, new RegExp(`nothing was deleted: could not read text blob ${trajectory.replace('.', '\\.')}.*SlowDown`));
      return true;
    });
    for (const r of [shot, trajectory, dead]) assert.ok(await store.exists(r), `${r} was deleted`);
    failing = false;
    const r = await collectBlobGarbage({ store, rootTexts });
    assert.deepEqual(r.removedRefs, [dead]);
    assert.ok(await store.exists(shot));
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test('halo gc refuses a grace period under the minimum (--grace 0 included) and deletes nothing', async () => {
  assert.equal(parseGraceMinutes('60'), 3_600_000);
  assert.equal(parseGraceMinutes(String(MIN_GC_GRACE_MS / 60_000)), MIN_GC_GRACE_MS);
  for (const bad of ['0', '5', '-1', 'soon', '', 'NaN']) assert.throws(() => parseGraceMinutes(bad), /--grace .*(at least|minimum of) 10/);
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-'));
  try {
    const blobs = new BlobStore(join(home, 'blobs'));
    const fresh = await blobs.put('written a second ago, not yet recorded', 'txt');
    await assert.rejects(gcBlobs({} as HaloConfig, fakeClient({}), { home, store: blobs, dryRun: false, graceMs: 0 }), /below the minimum of 10 minutes/);
    assert.ok(await blobs.exists(fresh));
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test("ages are measured on the store's clock: a host whose clock runs ahead does not sweep young blobs", async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-'));
  const realNow = Date.now;
  try {
    const blobsDir = join(home, 'blobs');
    const blobs = new BlobStore(blobsDir);
    const young = await blobs.put('just written on another host', 'txt');
    const old = await blobs.put('old and unreferenced', 'txt');
    utimesSync(blobs.pathOf(old), threeHoursAgo(), threeHoursAgo());
    const storeNow = await blobs.now();
    assert.ok(Math.abs(storeNow - realNow()) < 5_000, 'the folder clock is the file system clock');
    Date.now = () => realNow() + 2 * 3600_000; // this host is two hours ahead
    const r = await collectBlobGarbage({ store: blobs });
    assert.deepEqual([r.removedRefs, r.young], [[old], 1]);
    assert.ok(await blobs.exists(young), 'a young blob was swept by a clock that runs ahead');
    assert.deepEqual(
      readdirSync(blobsDir).filter((f) => f.startsWith('.')),
      [],
      'the clock probe was left behind',
    );
  } finally {
    Date.now = realNow;
    rmSync(home, { recursive: true, force: true });
  }
});

test('a folder that cannot be read fails the listing (a blob missing from it is not taken as unreferenced)', async () => {
  const home = mkdtempSync(join(tmpdir(), 'halo-gc-'));
  try {
    const blobsDir = join(home, 'blobs');
    const blobs = new BlobStore(blobsDir);
    const ref = await blobs.put('x', 'txt');
    // A two-hex-digit entry that is a file, not a folder: readdir fails with ENOTDIR, not ENOENT.
    writeFileSync(join(blobsDir, ref.slice(7, 9) === 'ff' ? 'fe' : 'ff'), 'not a folder');
    await assert.rejects(collectBlobGarbage({ store: blobs }), /ENOTDIR/);
    assert.ok(await blobs.exists(ref));
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test('open workflows name the adapter versions retention must keep: a training run from its parent up, evaluations and episodes theirs', async () => {
  const payload = (v: unknown) => defaultPayloadConverter.toPayload(v);
  const sa = (runId?: string) => ({ getAll: () => (runId ? [{ key: { name: 'HaloRunId' }, value: runId }] : []) });
  const open: { workflowId: string; runId: string; type: string; input?: unknown; fail?: number; haloRunId?: string }[] = [
    { workflowId: 'grpo-a', runId: 'r1', type: 'trainGrpo', input: { state: { adapterVersion: 7, adapterPath: '/ck/grpo-a/v7' } }, haloRunId: 'grpo-a' },
    {
      workflowId: 'eval-1',
      runId: 'r2',
      type: 'evaluate',
      haloRunId: 'eval-1',
      input: {
        modes: [
          { runId: 'grpo-a', adapterVersion: 3 },
          { runId: 'grpo-b', adapterVersion: 5 },
        ],
      },
    },
    { workflowId: 'ep-1', runId: 'r3', type: 'episode', haloRunId: 'grpo-a', input: { adapterVersion: 4, run: { runId: 'grpo-a' } } },
    { workflowId: 'ep-2', runId: 'r4', type: 'episode', haloRunId: 'grpo-b', input: { adapterVersion: 9 } },
    { workflowId: 'serve', runId: 'r5', type: 'other', input: { model: 'grpo-a-v2', other: 'grpo-a-v2x grpo-ab-v11 xgrpo-a-v12' } },
    { workflowId: 'gone', runId: 'r6', type: 'episode', fail: 5 },
  ];
  const client = (fail?: number) =>
    ({
      options: { namespace: 'default' },
      workflow: {
        list: (o: { query: string }) => {
          assert.equal(o.query, `ExecutionStatus = 'Running'`);
          return (async function* () {
            for (const w of open) yield { workflowId: w.workflowId, runId: w.runId, type: w.type, typedSearchAttributes: sa(w.haloRunId) };
            if (fail) yield { workflowId: 'busy', runId: 'r7', type: 'evaluate', typedSearchAttributes: sa() };
          })();
        },
      },
      workflowService: {
        getWorkflowExecutionHistory: async (req: { execution: { workflowId: string } }) => {
          const w = open.find((x) => x.workflowId === req.execution.workflowId);
          if (!w) throw grpcError(fail!, '14 UNAVAILABLE: connection reset');
          if (w.fail) throw grpcError(w.fail, '5 NOT_FOUND');
          return { history: { events: [{ workflowExecutionStartedEventAttributes: { input: { payloads: [payload(w.input)] } } }] } };
        },
      },
    }) as unknown as Client;
  const needs = await openRunNeeds(client(), 'grpo-a');
  assert.deepEqual([needs.versions, needs.from], [[2, 3, 4, 7], 6]);
  assert.equal(needs.reasons.length, 5); // the run (its floor, and v7 by its adapterPath), the evaluation, the episode, the served name
  const fresh = await openRunNeeds(
    {
      ...client(),
      workflowService: {
        getWorkflowExecutionHistory: async () => ({ history: { events: [{ workflowExecutionStartedEventAttributes: { input: { payloads: [payload({ config: {} })] } } }] } }),
      },
    } as unknown as Client,
    'grpo-a',
  );
  assert.equal(fresh.from, 1, 'a run in its first iteration keeps every version');
  await assert.rejects(openRunNeeds(client(14), 'grpo-a'), /could not read the input of open workflow busy .*nothing was changed.*UNAVAILABLE/);

  // Passed to the learner's retention; --keep-last 0 is refused before anything runs.
  const base = { run: 'grpo-a', keepLast: '3', keepEvery: '10', need: ['1', '3'], delete: true };
  assert.deepEqual(retentionArgs(base, needs).slice(2), [
    '--run',
    'grpo-a',
    '--keep-last',
    '3',
    '--keep-every',
    '10',
    '--need',
    '1',
    '--need',
    '2',
    '--need',
    '3',
    '--need',
    '4',
    '--need',
    '7',
    '--need-from',
    '6',
    '--delete',
  ]);
  for (const k of ['0', '-1', 'x', '']) assert.throws(() => retentionArgs({ ...base, keepLast: k }, needs), /--keep-last .*1 or more/);
});
