import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import { BlobNotFoundError, BlobStore, blobStoreFor } from '../../blob/store';
import { keyOf, parseStoreUrl } from '../../blob/location';
import { startLocalS3, type LocalS3 } from '../../testing/s3-server';

/**
 * One contract for both blob store backends: the local folder and an S3-compatible bucket (moto's server
 * mode on loopback, started here). The Python learner's store reads and writes the same references.
 */

const REPO_ROOT = resolve(__dirname, '..', '..');
const PNG = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47]), Buffer.from('a screenshot')]);
const sha = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

let s3: LocalS3;
before(async () => {
  s3 = await startLocalS3();
});
after(async () => {
  await s3?.stop();
});

interface Backend {
  name: string;
  /** A fresh, empty store, and a second handle on the same bytes (another process's view). */
  open(): { store: BlobStore; other: BlobStore; env: NodeJS.ProcessEnv };
}

let n = 0;
const backends: Backend[] = [
  {
    name: 'local folder',
    open: () => {
      const home = mkdtempSync(join(tmpdir(), 'halo-blobs-'));
      const env = { HALO_HOME: home };
      return { store: blobStoreFor(home, env), other: blobStoreFor(home, env), env };
    },
  },
  {
    name: 'S3-compatible (moto server)',
    open: () => {
      const env = { ...s3.env(`contract-${++n}`) };
      const home = mkdtempSync(join(tmpdir(), 'halo-blobs-'));
      return { store: blobStoreFor(home, env), other: blobStoreFor(home, env), env: { ...env, HALO_HOME: home } };
    },
  },
];

for (const backend of backends) {
  describe(`blob store contract: ${backend.name}`, () => {
    test('put, get, exists: content-addressed references', async () => {
      const { store, other } = backend.open();
      const ref = await store.put(PNG, 'png');
      assert.equal(ref, `sha256:${sha(PNG)}.png`);
      assert.ok(await store.exists(ref));
      assert.deepEqual(await other.get(ref), PNG);
      assert.equal(await store.put(PNG, 'png'), ref, 'the same bytes give the same reference');
      const value = { items: [{ a: 1, b: 'é' }], none: null };
      const jref = await store.putJson(value);
      assert.equal(jref, `sha256:${sha(JSON.stringify(value))}.json`);
      assert.deepEqual(await other.getJson(jref), value);
      assert.equal(await store.exists(`sha256:${'c'.repeat(64)}.png`), false);
      assert.match(store.locationOf(ref), new RegExp(`${sha(PNG).slice(0, 2)}/${sha(PNG).slice(2)}\\.png$`));
    });

    test('1,000 concurrent identical puts (from four store handles, as from four processes) all resolve and the blob reads back', async () => {
      const { store, env } = backend.open();
      const handles = [store, ...Array.from({ length: 3 }, () => blobStoreFor(env.HALO_HOME ?? '', env))];
      const bytes = Buffer.concat([PNG, Buffer.from(`identical ${backend.name}`)]);
      const results = await Promise.allSettled(Array.from({ length: 1000 }, (_, i) => handles[i % 4].put(bytes, 'png')));
      const rejected = results.filter((r) => r.status === 'rejected');
      assert.equal(rejected.length, 0, `rejected puts: ${rejected.slice(0, 3).map((r) => String((r as PromiseRejectedResult).reason)).join('; ')}`);
      const refs = new Set(results.map((r) => (r as PromiseFulfilledResult<string>).value));
      assert.deepEqual([...refs], [`sha256:${sha(bytes)}.png`]);
      assert.deepEqual(await store.get([...refs][0]), bytes);
      if (backend.name === 'local folder') {
        const dir = join(store.root, sha(bytes).slice(0, 2));
        assert.deepEqual(readdirSync(dir), [`${sha(bytes).slice(2)}.png`], 'no temp file is left behind');
      }
    });

    test('a missing object is a BlobNotFoundError naming the reference', async () => {
      const { store } = backend.open();
      const ref = `sha256:${'b'.repeat(64)}.json`;
      await assert.rejects(store.get(ref), (err: Error) => err instanceof BlobNotFoundError && err.message.includes(ref));
    });

    test('references that are not content addresses are refused before any I/O', async () => {
      const { store } = backend.open();
      for (const bad of ['../etc/passwd', `sha256:${'a'.repeat(64)}.png/../../x`, `sha256:../${'a'.repeat(61)}.png`, `sha256:${'A'.repeat(64)}.png`, `sha256:${'a'.repeat(64)}.`, `sha256:${'a'.repeat(64)}.p/g`]) {
        await assert.rejects(store.get(bad), /not a blob reference/);
        await assert.rejects(store.exists(bad), /not a blob reference/);
      }
    });

    test('the Python learner reads what TypeScript wrote, and the other way round', async () => {
      const { store, env } = backend.open();
      const ref = await store.put(PNG, 'png');
      const script = [
        'import sys, json',
        'from halo_learner.blobs import BlobStore',
        'b = BlobStore() if len(sys.argv) < 3 else BlobStore(sys.argv[2])',
        'assert b.get(sys.argv[1]) == bytes([0x89, 0x50, 0x4e, 0x47]) + b"a screenshot"',
        'print(b.put_json({"from": "python", "n": [1, 2]}))',
      ].join('\n');
      const args = ['-c', script, ref, ...(backend.name === 'local folder' ? [store.root] : [])];
      const out = execFileSync(join(REPO_ROOT, '.venv/bin/python'), args, {
        cwd: join(REPO_ROOT, 'workers/learner'),
        env: { ...process.env, ...env, PYTHONPATH: join(REPO_ROOT, 'workers/learner') },
      }).toString().trim();
      assert.deepEqual(await store.getJson(out), { from: 'python', n: [1, 2] });
    });
  });
}

describe('object keys stay under the prefix', () => {
  test('HALO_STORE and key parts refuse anything that could leave the prefix', () => {
    assert.deepEqual(parseStoreUrl('s3://my-bucket/team/halo/'), { bucket: 'my-bucket', prefix: 'team/halo' });
    assert.deepEqual(parseStoreUrl('s3://my-bucket'), { bucket: 'my-bucket', prefix: '' });
    for (const bad of ['s3://my-bucket/a/../b', 's3://my-bucket/./a', 's3://My_Bucket/a', 'http://x/y', '/var/blobs', 's3://my-bucket/a b']) {
      assert.throws(() => parseStoreUrl(bad), /HALO_STORE/, bad);
    }
    const loc = parseStoreUrl('s3://my-bucket/halo');
    assert.equal(keyOf(loc, 'checkpoints', 'run-1', 'v3'), 'halo/checkpoints/run-1/v3');
    for (const bad of ['..', '.', 'a/b', '', 'a\\b', '%2e%2e']) assert.throws(() => keyOf(loc, 'checkpoints', bad), /letters, digits/, bad);
  });

  test('after the whole suite the bucket holds keys under the test prefixes only', async () => {
    const { store } = backends[1].open();
    await store.put('last', 'txt');
    const res = await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket }));
    const keys = (res.Contents ?? []).map((o) => o.Key!);
    assert.ok(keys.length > 0);
    for (const k of keys) assert.match(k, /^contract-\d+\/blobs\/[0-9a-f]{2}\/[0-9a-f]{62}\.[a-z0-9]{1,8}$/);
  });
});
