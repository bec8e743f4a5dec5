import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, statSync, truncateSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { ListObjectsV2Command, PutObjectCommand } from '@aws-sdk/client-s3';
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
      assert.equal(
        rejected.length,
        0,
        `rejected puts: ${rejected
          .slice(0, 3)
          .map((r) => String((r as PromiseRejectedResult).reason))
          .join('; ')}`,
      );
      const refs = new Set(results.map((r) => (r as PromiseFulfilledResult<string>).value));
      assert.deepEqual([...refs], [`sha256:${sha(bytes)}.png`]);
      assert.deepEqual(await store.get([...refs][0]), bytes);
      if (backend.name === 'local folder') {
        const dir = join(store.root, sha(bytes).slice(0, 2));
        assert.deepEqual(readdirSync(dir), [`${sha(bytes).slice(2)}.png`], 'no temp file is left behind');
      }
    });

    test('a torn blob (empty, cut short, or zeros of the right length) reads as missing, and a put of its bytes repairs it', async () => {
      const { store, other, env } = backend.open();
      const bytes = Buffer.concat([PNG, Buffer.from(`torn ${backend.name} `.repeat(50))]);
      const ref = await store.put(bytes, 'png');
      const damage = async (content: Buffer) => {
        if (backend.name === 'local folder') {
          const path = store.pathOf(ref);
          writeFileSync(path, content);
          const old = new Date(Date.now() - 7200_000);
          utimesSync(path, old, old);
        } else {
          const loc = parseStoreUrl(env.HALO_STORE!);
          const key = keyOf(loc, 'blobs', sha(bytes).slice(0, 2), `${sha(bytes).slice(2)}.png`);
          await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: key, Body: content }));
        }
      };
      const damages: [string, Buffer][] = [
        ['empty', Buffer.alloc(0)],
        ['cut short', bytes.subarray(0, 10)],
      ];
      if (backend.name === 'local folder') damages.push(['zeros of the right length', Buffer.alloc(bytes.length)]);
      for (const [what, content] of damages) {
        await damage(content);
        await assert.rejects(other.get(ref), (err: Error) => err instanceof BlobNotFoundError && /damaged/.test(err.message) && err.message.includes(ref), what);
        // A fresh handle (another process) and the handle that read it both repair it with a put of the bytes.
        const fixer = what === 'cut short' ? other : blobStoreFor(env.HALO_HOME ?? '', env);
        assert.equal(await fixer.put(bytes, 'png'), ref);
        assert.deepEqual(await other.get(ref), bytes, `${what}: repaired`);
        if (backend.name === 'local folder') assert.ok(Date.now() - statSync(store.pathOf(ref)).mtimeMs < 60_000, 'the repaired file is young');
      }
      if (backend.name === 'local folder') {
        truncateSync(store.pathOf(ref), 0);
        await assert.rejects(store.getJson(ref), BlobNotFoundError);
        assert.deepEqual(readdirSync(dirname(store.pathOf(ref))), [`${sha(bytes).slice(2)}.png`], 'no temp file is left behind');
      }
    });

    test('a missing object is a BlobNotFoundError naming the reference', async () => {
      const { store } = backend.open();
      const ref = `sha256:${'b'.repeat(64)}.json`;
      await assert.rejects(store.get(ref), (err: Error) => err instanceof BlobNotFoundError && err.message.includes(ref));
    });

    test('references that are not content addresses are refused before any I/O', async () => {
      const { store } = backend.open();
      for (const bad of [
        '../etc/passwd',
        `sha256:${'a'.repeat(64)}.png/../../x`,
        `sha256:../${'a'.repeat(61)}.png`,
        `sha256:${'A'.repeat(64)}.png`,
        `sha256:${'a'.repeat(64)}.`,
        `sha256:${'a'.repeat(64)}.p/g`,
      ]) {
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
      })
        .toString()
        .trim();
      assert.deepEqual(await store.getJson(out), { from: 'python', n: [1, 2] });
    });
  });
}

describe('folder store durability', () => {
  const fsMod = require('node:fs/promises') as typeof import('node:fs/promises') & Record<string, unknown>;

  /** Every open, fsync and rename the store makes while `fn` runs, in order. */
  async function traced(fn: () => Promise<unknown>): Promise<string[]> {
    const log: string[] = [];
    const { open, rename } = fsMod;
    fsMod.open = (async (path: string, ...rest: unknown[]) => {
      const fh = await (open as (...a: unknown[]) => Promise<import('node:fs/promises').FileHandle>)(path, ...rest);
      const sync = fh.sync.bind(fh);
      fh.sync = async () => {
        await sync();
        log.push(`fsync ${path}`);
      };
      return fh;
    }) as typeof open;
    fsMod.rename = (async (from: string, to: string) => {
      await rename(from, to);
      log.push(`rename ${from} -> ${to}`);
    }) as typeof rename;
    try {
      await fn();
    } finally {
      fsMod.open = open;
      fsMod.rename = rename;
    }
    return log;
  }

  test("a new blob is fsynced before its rename, and its folder (and a new folder's parent) after it", async () => {
    const root = join(mkdtempSync(join(tmpdir(), 'halo-blobs-')), 'blobs');
    const store = new BlobStore(root);
    let ref = '';
    const log = await traced(async () => {
      ref = await store.put(PNG, 'png');
    });
    const path = store.pathOf(ref);
    const renameAt = log.findIndex((l) => l.startsWith('rename ') && l.endsWith(` -> ${path}`));
    assert.ok(renameAt > 0, `no rename onto the blob: ${log.join('\n')}`);
    const tmp = log[renameAt].slice('rename '.length, log[renameAt].indexOf(' -> '));
    assert.ok(log.slice(0, renameAt).includes(`fsync ${tmp}`), `the temp file is not fsynced before the rename:\n${log.join('\n')}`);
    const afterRename = log.slice(renameAt + 1);
    assert.ok(afterRename.includes(`fsync ${dirname(path)}`), `the blob's folder is not fsynced after the rename:\n${log.join('\n')}`);
    assert.ok(afterRename.includes(`fsync ${root}`), `the new folder's parent is not fsynced:\n${log.join('\n')}`);
    // A put of bytes already there and whole writes nothing.
    const again = await traced(() => store.put(PNG, 'png'));
    assert.deepEqual(
      again.filter((l) => !l.startsWith('open')),
      [],
    );
  });
});

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
