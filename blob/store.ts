import { createHash, randomBytes } from 'node:crypto';
import { mkdir, readFile, rename, rm, writeFile, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { describeLocation, keyOf, parseStoreUrl, storeLocation } from './location';
import { ObjectNotFoundError, S3Objects, s3ClientFromEnv } from './s3';

const REF = /^sha256:([0-9a-f]{64})\.([a-z0-9]{1,8})$/;

/** Where the bytes go: a folder, or an S3-compatible bucket prefix. Keys are `<hex[:2]>/<hex[2:]>.<ext>`. */
interface Backend {
  readonly where: string;
  has(dir: string, name: string): Promise<boolean>;
  /** Throws BlobNotFoundError for a missing object. */
  read(ref: string, dir: string, name: string): Promise<Buffer>;
  /** Writes once unless it is there; the object already being there (same name, so same bytes) is success. */
  putOnce(dir: string, name: string, bytes: Buffer, ext: string): Promise<void>;
  locate(dir: string, name: string): string;
}

/**
 * Content-addressed blobs: a reference is `sha256:<hex>.<ext>`, so writing the same bytes twice is free and a
 * reference can never point at changed content. Temporal payloads carry only these references.
 *
 * `root` is a folder (the default, `<HALO_HOME>/blobs`) or `s3://bucket/prefix` (see `blobStoreFor`): the
 * same references, read and written by the TypeScript workers and the Python learner alike.
 */
export class BlobStore {
  private readonly backend: Backend;

  constructor(readonly root: string, opts: { objects?: S3Objects } = {}) {
    this.backend = root.startsWith('s3://') ? new S3Backend(opts.objects ?? new S3Objects(parseStoreUrl(root, 'blob store'))) : new FolderBackend(root);
  }

  async put(bytes: Buffer | string, ext: string): Promise<string> {
    const buf = typeof bytes === 'string' ? Buffer.from(bytes) : bytes;
    const hex = createHash('sha256').update(buf).digest('hex');
    const ref = `sha256:${hex}.${ext}`;
    const [dir, name] = split(ref);
    await this.backend.putOnce(dir, name, buf, ext);
    return ref;
  }

  async putJson(value: unknown): Promise<string> {
    return this.put(JSON.stringify(value), 'json');
  }

  async get(ref: string): Promise<Buffer> {
    const [dir, name] = split(ref);
    return this.backend.read(ref, dir, name);
  }

  async getJson<T>(ref: string): Promise<T> {
    return JSON.parse((await this.get(ref)).toString('utf8')) as T;
  }

  async exists(ref: string): Promise<boolean> {
    const [dir, name] = split(ref);
    return this.backend.has(dir, name);
  }

  /** The file of a reference in a folder store (an error for an object store: use `locationOf`). */
  pathOf(ref: string): string {
    if (!(this.backend instanceof FolderBackend)) throw new Error(`blob store ${this.root} is not a folder: no path for ${ref}`);
    return this.locationOf(ref);
  }

  /** Where a reference's bytes are: a file path, or an `s3://` URL. */
  locationOf(ref: string): string {
    const [dir, name] = split(ref);
    return this.backend.locate(dir, name);
  }
}

/**
 * The blob store of this process: the bucket of `HALO_STORE=s3://bucket/prefix` (blobs under
 * `<prefix>/blobs/`), else the folder `<home>/blobs`.
 */
export function blobStoreFor(home: string, env: NodeJS.ProcessEnv = process.env): BlobStore {
  const loc = storeLocation(env);
  if (!loc) return new BlobStore(join(home, 'blobs'));
  const blobs = { bucket: loc.bucket, prefix: keyOf(loc, 'blobs') };
  return new BlobStore(describeLocation(loc, 'blobs'), { objects: new S3Objects(blobs, s3ClientFromEnv(env)) });
}

export class BlobNotFoundError extends Error {
  constructor(ref: string, root: string) {
    super(`blob ${ref} not found under ${root}`);
    this.name = 'BlobNotFoundError';
  }
}

function split(ref: string): [string, string] {
  const m = REF.exec(ref);
  if (!m) throw new Error(`not a blob reference: ${JSON.stringify(ref)}`);
  return [m[1].slice(0, 2), `${m[1].slice(2)}.${m[2]}`];
}

class FolderBackend implements Backend {
  constructor(readonly where: string) {}

  locate(dir: string, name: string): string {
    return join(this.where, dir, name);
  }

  async has(dir: string, name: string): Promise<boolean> {
    try {
      await stat(this.locate(dir, name));
      return true;
    } catch {
      return false;
    }
  }

  async read(ref: string, dir: string, name: string): Promise<Buffer> {
    try {
      return await readFile(this.locate(dir, name));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new BlobNotFoundError(ref, this.where);
      throw err;
    }
  }

  async putOnce(dir: string, name: string, bytes: Buffer): Promise<void> {
    if (await this.has(dir, name)) return;
    const path = this.locate(dir, name);
    await mkdir(dirname(path), { recursive: true });
    // Readers never see a half-written file: write aside under a name no other writer uses, then rename
    // (atomic; replacing a file a concurrent writer just renamed there changes nothing, the bytes are equal).
    const tmp = `${path}.${process.pid}.${randomBytes(8).toString('hex')}.tmp`;
    try {
      await writeFile(tmp, bytes);
      await rename(tmp, path);
    } catch (err) {
      await rm(tmp, { force: true }).catch(() => {});
      if (await this.has(dir, name)) return;
      throw err;
    }
  }
}

const HEAD_FIRST_BYTES = 1 << 20;
const CONTENT_TYPES: Record<string, string> = { png: 'image/png', jpg: 'image/jpeg', json: 'application/json', txt: 'text/plain' };

class S3Backend implements Backend {
  readonly where: string;

  constructor(private readonly objects: S3Objects) {
    this.where = objects.where();
  }

  locate(dir: string, name: string): string {
    return describeLocation(this.objects.loc, dir, name);
  }

  has(dir: string, name: string): Promise<boolean> {
    return this.objects.exists(keyOf(this.objects.loc, dir, name));
  }

  async read(ref: string, dir: string, name: string): Promise<Buffer> {
    try {
      return await this.objects.get(keyOf(this.objects.loc, dir, name));
    } catch (err) {
      if (err instanceof ObjectNotFoundError) throw new BlobNotFoundError(ref, this.where);
      throw err;
    }
  }

  /** Identical puts in flight in this process (the forks of a step group see the same screen) share one. */
  private readonly inflight = new Map<string, Promise<void>>();

  putOnce(dir: string, name: string, bytes: Buffer, ext: string): Promise<void> {
    const key = keyOf(this.objects.loc, dir, name);
    let p = this.inflight.get(key);
    if (!p) {
      // A conditional put checks existence on the server in the same round trip; only a large object is
      // looked up first, so that bytes already stored are not sent again.
      p = (async () => {
        if (bytes.length > HEAD_FIRST_BYTES && (await this.objects.exists(key))) return;
        await this.objects.putIfAbsent(key, bytes, CONTENT_TYPES[ext]);
      })().finally(() => this.inflight.delete(key));
      this.inflight.set(key, p);
    }
    return p;
  }
}
