import { createHash, randomBytes } from 'node:crypto';
import { lstat, mkdir, readdir, readFile, rename, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { checkPart, describeLocation, keyOf, parseStoreUrl, storeLocation } from './location';
import { ObjectNotFoundError, S3Objects, s3ClientFromEnv } from './s3';

const REF = /^sha256:([0-9a-f]{64})\.([a-z0-9]{1,8})$/;
/** A stored blob's name under its two-hex-digit folder: the other 62 digits and the extension. */
const BLOB_NAME = /^([0-9a-f]{62})\.([A-Za-z0-9]{1,16})$/;
const DIR_NAME = /^[0-9a-f]{2}$/;

/** One object of a store, as a sweep sees it. */
export interface StoredObject {
  /** `<hex[:2]>/<rest>`: its file or key relative to the store's root. */
  name: string;
  /** The blob's reference; undefined for the temp file of an interrupted write (folder store only). */
  ref?: string;
  size: number;
  /** Last write (file mtime; the object's LastModified), refreshed by a put of the same bytes. */
  mtimeMs: number;
}

/** Where the bytes go: a folder, or an S3-compatible bucket prefix. Keys are `<hex[:2]>/<hex[2:]>.<ext>`. */
interface Backend {
  readonly where: string;
  has(dir: string, name: string): Promise<boolean>;
  /** Throws BlobNotFoundError for a missing object. */
  read(ref: string, dir: string, name: string): Promise<Buffer>;
  /** Writes once unless it is there; the object already being there (same name, so same bytes) is success. */
  putOnce(dir: string, name: string, bytes: Buffer, ext: string): Promise<void>;
  locate(dir: string, name: string): string;
  /** Every blob (and leftover temp file) under the root; nothing else is listed, so nothing else is ever deleted. */
  list(): Promise<StoredObject[]>;
  /** Deletes those objects still as listed (same mtime); returns the ones deleted. */
  deleteUnchanged(objects: StoredObject[]): Promise<StoredObject[]>;
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

  /** Whether the bytes are in an S3-compatible bucket rather than a folder. */
  get isObjectStore(): boolean {
    return this.backend instanceof S3Backend;
  }

  /** Every blob of the store, with its size and age (and, in a folder, temp files of writes that never finished). */
  list(): Promise<StoredObject[]> {
    return this.backend.list();
  }

  /**
   * Deletes listed objects, except those written again since they were listed (a put of bytes already there
   * refreshes their age): returns the ones that went. Only for `halo gc`, which knows nothing names them.
   */
  deleteUnchanged(objects: StoredObject[]): Promise<StoredObject[]> {
    return objects.length === 0 ? Promise.resolve([]) : this.backend.deleteUnchanged(objects);
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

/** `<dir>/<file>` of a listed object, checked again: a name can never reach outside the root. */
function splitName(name: string): [string, string] {
  const [dir, file, ...rest] = name.split('/');
  if (rest.length > 0 || !DIR_NAME.test(dir ?? '') || file === undefined) throw new Error(`not a blob store name: ${JSON.stringify(name)}`);
  return [dir, checkPart(file, 'blob file name')];
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
    const path = this.locate(dir, name);
    // Already there: make it young again, so that a sweep does not take an old blob that an activity has just
    // reused and not yet recorded in its history (the sweep also re-checks the mtime right before removing).
    try {
      const now = new Date();
      await utimes(path, now, now);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' && (await this.has(dir, name))) return;
    }
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

  async list(): Promise<StoredObject[]> {
    const out: StoredObject[] = [];
    let dirs: string[];
    try {
      dirs = await readdir(this.where);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return out;
      throw err;
    }
    for (const d of dirs.sort()) {
      if (!DIR_NAME.test(d)) continue;
      for (const file of (await readdir(join(this.where, d)).catch(() => [] as string[])).sort()) {
        const st = await lstat(join(this.where, d, file)).catch(() => undefined);
        if (!st?.isFile()) continue;
        const m = BLOB_NAME.exec(file);
        if (m) out.push({ name: `${d}/${file}`, ref: `sha256:${d}${m[1]}.${m[2]}`, size: st.size, mtimeMs: st.mtimeMs });
        else if (file.endsWith('.tmp')) out.push({ name: `${d}/${file}`, size: st.size, mtimeMs: st.mtimeMs });
      }
    }
    return out;
  }

  async deleteUnchanged(objects: StoredObject[]): Promise<StoredObject[]> {
    const gone: StoredObject[] = [];
    for (const o of objects) {
      const path = this.locate(...splitName(o.name));
      const now = await stat(path).catch(() => undefined);
      if (!now || now.mtimeMs !== o.mtimeMs) continue;
      await rm(path, { force: true });
      gone.push(o);
    }
    return gone;
  }
}

const HEAD_FIRST_BYTES = 1 << 20;
const REFRESH_EVERY_MS = 10 * 60_000;
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
        const there = bytes.length > HEAD_FIRST_BYTES && (await this.objects.exists(key));
        const created = !there && (await this.objects.putIfAbsent(key, bytes, CONTENT_TYPES[ext]));
        if (!created) await this.refresh(key, ext);
      })().finally(() => this.inflight.delete(key));
      this.inflight.set(key, p);
    }
    return p;
  }

  /** When this process last made each key young again (bounded: cleared when large). */
  private readonly refreshed = new Map<string, number>();

  /**
   * An object already there gets a fresh LastModified (a server-side copy onto itself, one request, no bytes
   * sent), so that `halo gc` does not take an old blob an activity has just reused and not yet recorded. Once
   * per key per REFRESH_EVERY_MS from this process, which shortens gc's grace period (an hour by default) for
   * such a blob by at most that much.
   */
  private async refresh(key: string, ext: string): Promise<void> {
    const now = Date.now();
    if (now - (this.refreshed.get(key) ?? -Infinity) < REFRESH_EVERY_MS) return;
    if (this.refreshed.size > 100_000) this.refreshed.clear();
    this.refreshed.set(key, now);
    try {
      await this.objects.touch(key, CONTENT_TYPES[ext]);
    } catch (err) {
      this.refreshed.delete(key);
      throw err;
    }
  }

  async list(): Promise<StoredObject[]> {
    const out: StoredObject[] = [];
    for (const o of await this.objects.listWithAge(this.objects.loc.prefix ? `${this.objects.loc.prefix}/` : '')) {
      const name = this.nameOf(o.key);
      const m = name && BLOB_NAME.exec(name.slice(3));
      if (name && m) out.push({ name, ref: `sha256:${name.slice(0, 2)}${m[1]}.${m[2]}`, size: o.size, mtimeMs: o.mtimeMs });
    }
    return out;
  }

  /** `<2 hex>/<file>` of a key under the prefix; undefined for any other key (never listed, never deleted). */
  private nameOf(key: string): string | undefined {
    const prefix = this.objects.loc.prefix ? `${this.objects.loc.prefix}/` : '';
    if (!key.startsWith(prefix)) return undefined;
    const name = key.slice(prefix.length);
    const [dir, file, ...rest] = name.split('/');
    return rest.length === 0 && DIR_NAME.test(dir) && file !== undefined && BLOB_NAME.test(file) ? name : undefined;
  }

  async deleteUnchanged(objects: StoredObject[]): Promise<StoredObject[]> {
    // A second listing (1,000 keys a request) rather than a HEAD per object: what was written again since
    // the first one (a put refreshes LastModified) stays.
    const now = new Map((await this.list()).map((o) => [o.name, o.mtimeMs]));
    const doomed = objects.filter((o) => now.get(o.name) === o.mtimeMs);
    await this.objects.deleteMany(doomed.map((o) => keyOf(this.objects.loc, ...splitName(o.name))));
    return doomed;
  }
}

