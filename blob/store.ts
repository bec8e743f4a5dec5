import { createHash } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import { lstat, mkdir, readdir, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { DIR_MODE } from './file-modes';
import { checkPart, describeLocation, keyOf, parseStoreUrl, storeLocation } from './location';
import { ObjectNotFoundError, S3Objects, s3ClientFromEnv } from './s3';
import { folderNow, objectStoreNow } from './store-clock';
import { chmodEach, removeFolderAt, touchOnStoreClock, writeDurably } from './durable-files';

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
  /** Told when a read found bytes that are not the address's: the next put of the right bytes must repair them. */
  damaged?(dir: string, name: string): void;
  /** Writes once unless it is there; the object already being there (same name, so same bytes) is success. */
  putOnce(dir: string, name: string, bytes: Buffer, ext: string): Promise<void>;
  locate(dir: string, name: string): string;
  /** Every blob (and leftover temp file) under the root; nothing else is listed, so nothing else is ever deleted. */
  list(): Promise<StoredObject[]>;
  /** Deletes those objects still as listed (same mtime); returns the ones deleted. */
  deleteUnchanged(objects: StoredObject[]): Promise<StoredObject[]>;
  /** The store's own clock (ms since the epoch), against which listed mtimes are ages. */
  now(): Promise<number>;
  /** Writes `writers/<file>` under the root unless it is there (never listed as a blob, never swept). */
  recordAside(file: string, bytes: Buffer): Promise<void>;
  /** Every `writers/<file>`: where it is and its text. */
  readAside(): Promise<{ where: string; text: string }[]>;
}

/** Who writes to a store: a namespace whose histories name blobs in it (see `BlobStore.recordWriter`). */
export interface StoreWriter {
  namespace: string;
  /** The Temporal server it was on, the host and the home of the first worker that recorded it. */
  address?: string;
  host?: string;
  home?: string;
  /** The record's file or key: removing it is how an operator retires a namespace that no longer writes here. */
  where: string;
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

  constructor(
    readonly root: string,
    opts: { objects?: S3Objects } = {},
  ) {
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

  /**
   * The bytes of a reference, checked against it: bytes whose sha256 is not the address (a file torn by a
   * power cut, empty or cut short) are a BlobNotFoundError like a missing blob, and the next put of the
   * right bytes writes them again.
   */
  async get(ref: string): Promise<Buffer> {
    const [dir, name] = split(ref);
    const bytes = await this.backend.read(ref, dir, name);
    if (!holds(ref, bytes)) {
      this.backend.damaged?.(dir, name);
      throw new BlobNotFoundError(ref, this.backend.where, `damaged: ${bytes.length} bytes whose sha256 is not the address`);
    }
    return bytes;
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

  /** The store's clock (a bucket's `Date` header; a fresh file's mtime in the folder): `halo gc` ages blobs by it. */
  now(): Promise<number> {
    return this.backend.now();
  }

  /**
   * How much older than its last put a blob's age may be: an object store refreshes a reused blob at most once
   * per REFRESH_EVERY_MS per process, a folder on every put. `halo gc` adds it to the grace period, so that a
   * blob put again just before a sweep is never older than the grace.
   */
  get refreshLagMs(): number {
    return this.backend instanceof S3Backend ? REFRESH_EVERY_MS : 0;
  }

  /**
   * Records that workers of `namespace` write to this store, before they write anything: two namespaces may
   * share one home (and so one blobs folder) or one bucket, and a sweep that reads the histories of only one of
   * them would take the other's live blobs for garbage. `halo gc` refuses to delete while a recorded namespace
   * is not read.
   */
  async recordWriter(w: { namespace: string; address?: string; host?: string; home?: string }): Promise<void> {
    if (w.namespace === '') throw new Error('recordWriter: an empty namespace');
    const text = JSON.stringify({ namespace: w.namespace, address: w.address, host: w.host, home: w.home }) + '\n';
    await this.backend.recordAside(writerFile(w.namespace), Buffer.from(text));
  }

  /** The namespaces recorded as writing to this store (`recordWriter`); a record that cannot be parsed is an error. */
  async writers(): Promise<StoreWriter[]> {
    const out: StoreWriter[] = [];
    for (const { where, text } of await this.backend.readAside()) {
      let v: Partial<StoreWriter>;
      try {
        v = JSON.parse(text) as Partial<StoreWriter>;
      } catch {
        v = {};
      }
      // A torn record still says that some namespace writes here: unreadable is refused, never skipped.
      if (typeof v.namespace !== 'string' || v.namespace === '')
        throw new Error(`the writer record ${where} cannot be read (${JSON.stringify(text.slice(0, 80))}): fix or remove it`);
      out.push({ namespace: v.namespace, address: v.address, host: v.host, home: v.home, where });
    }
    return out;
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
  constructor(ref: string, root: string, why?: string) {
    super(`blob ${ref} not found under ${root}${why ? ` (${why})` : ''}`);
    this.name = 'BlobNotFoundError';
  }
}

/** `<dir>/<file>` of a listed object, checked again: a name can never reach outside the root. */
function splitName(name: string): [string, string] {
  const [dir, file, ...rest] = name.split('/');
  if (rest.length > 0 || !DIR_NAME.test(dir ?? '') || file === undefined) throw new Error(`not a blob store name: ${JSON.stringify(name)}`);
  return [dir, checkPart(file, 'blob file name')];
}

/** Whether `bytes` are the content of `ref` (the address is their sha256). */
function holds(ref: string, bytes: Buffer): boolean {
  return createHash('sha256').update(bytes).digest('hex') === ref.slice(7, 71);
}

/** The folder (under a store's root) of writer records; not two hex digits, so a sweep never lists it. */
const WRITERS = 'writers';

/** A namespace's record file: its name when that is a safe file and key name, else its hex. */
function writerFile(namespace: string): string {
  const plain = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$/.test(namespace);
  return plain ? `${namespace}.json` : `hex-${Buffer.from(namespace).toString('hex').slice(0, 200)}.json`;
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
      return (await stat(this.locate(dir, name))).isFile();
    } catch {
      return false;
    }
  }

  async read(ref: string, dir: string, name: string): Promise<Buffer> {
    try {
      return await fsp.readFile(this.locate(dir, name));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new BlobNotFoundError(ref, this.where);
      // A folder at a blob's address (made by hand, or by a tool that took the path for a folder) holds no blob:
      // missing, and the next put of the bytes replaces it.
      if ((err as NodeJS.ErrnoException).code === 'EISDIR') throw new BlobNotFoundError(ref, this.where, 'a folder is at its address');
      throw err;
    }
  }

  /** Identical puts in flight in this process share one (one read, at most one write and its fsyncs). */
  private readonly inflight = new Map<string, Promise<void>>();

  putOnce(dir: string, name: string, bytes: Buffer): Promise<void> {
    const path = this.locate(dir, name);
    let p = this.inflight.get(path);
    if (!p) {
      p = this.putNow(path, bytes).finally(() => this.inflight.delete(path));
      this.inflight.set(path, p);
    }
    return p;
  }

  private async putNow(path: string, bytes: Buffer): Promise<void> {
    // Already there and whole: make it young again, so that a sweep does not take an old blob that an activity
    // has just reused and not yet recorded in its history (the sweep also re-checks the mtime right before
    // removing). "Whole" is the whole comparison (about the cost of the sha256 the put has just computed: 0.3 ms
    // for 100 kB): a file torn by a power cut (empty, cut short, or zeros of the right length) is what `get`
    // refuses, so it is written again here rather than only made young.
    if (await this.holds(path, bytes)) {
      try {
        await touchOnStoreClock(path, bytes.length);
        return;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') return; // not ours to touch; the bytes are there
      }
    }
    await removeFolderAt(path);
    const made = await mkdir(dirname(path), { recursive: true, mode: DIR_MODE });
    const fresh: string[] = [];
    for (let d = dirname(path); made !== undefined && d.length >= made.length && d !== dirname(d); d = dirname(d)) fresh.push(d);
    await chmodEach(fresh);
    // Readers never see a half-written file, and after a power cut the name is either absent or whole.
    try {
      await writeDurably(path, bytes, fresh);
    } catch (err) {
      if (await this.holds(path, bytes)) return;
      throw err;
    }
  }

  /** Whether the file at `path` holds exactly `bytes`. */
  private async holds(path: string, bytes: Buffer): Promise<boolean> {
    try {
      return (await fsp.readFile(path)).equals(bytes);
    } catch {
      return false;
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
    // Only "gone since" is skipped: a folder or file that cannot be read otherwise fails the listing, since a
    // blob missing from it would look unreferenced (and a text blob missing from it names nothing).
    const unlessGone = <T>(err: unknown, absent: T): T => {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return absent;
      throw err;
    };
    for (const d of dirs.sort()) {
      if (!DIR_NAME.test(d)) continue;
      for (const file of (await readdir(join(this.where, d)).catch((err) => unlessGone(err, [] as string[]))).sort()) {
        const st = await lstat(join(this.where, d, file)).catch((err) => unlessGone(err, undefined));
        if (!st?.isFile()) continue;
        const m = BLOB_NAME.exec(file);
        if (m) out.push({ name: `${d}/${file}`, ref: `sha256:${d}${m[1]}.${m[2]}`, size: st.size, mtimeMs: st.mtimeMs });
        else if (file.endsWith('.tmp')) out.push({ name: `${d}/${file}`, size: st.size, mtimeMs: st.mtimeMs });
      }
    }
    return out;
  }

  now(): Promise<number> {
    return folderNow(this.where);
  }

  async recordAside(file: string, bytes: Buffer): Promise<void> {
    const path = join(this.where, WRITERS, file);
    if (await this.has(WRITERS, file)) return;
    const made = await mkdir(dirname(path), { recursive: true, mode: DIR_MODE });
    if (made !== undefined) await chmodEach([dirname(path)]);
    await writeDurably(path, bytes);
  }

  async readAside(): Promise<{ where: string; text: string }[]> {
    const dir = join(this.where, WRITERS);
    const files = await readdir(dir).catch((err) => {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [] as string[];
      throw err;
    });
    const out: { where: string; text: string }[] = [];
    for (const f of files.sort()) if (f.endsWith('.json')) out.push({ where: join(dir, f), text: await fsp.readFile(join(dir, f), 'utf8') });
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
/**
 * At most one refresh of a reused object per key per this period from one process (a hot screenshot in every
 * fork costs one request a minute, not one a put). Well under gc's minimum grace (10 minutes), and added to
 * the grace by the sweep (`refreshLagMs`); workers/learner/halo_learner/blobs.py's REFRESH_EVERY_S is the same.
 */
export const REFRESH_EVERY_MS = 60_000;
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
        if (!created) await this.refresh(key, ext, bytes);
      })().finally(() => this.inflight.delete(key));
      this.inflight.set(key, p);
    }
    return p;
  }

  damaged(dir: string, name: string): void {
    this.refreshed.delete(keyOf(this.objects.loc, dir, name));
  }

  /** When this process last made each key young again (bounded: cleared when large). */
  private readonly refreshed = new Map<string, number>();

  /**
   * An object already there gets a fresh LastModified (a server-side copy onto itself, one request, no bytes
   * sent), so that `halo gc` does not take an old blob an activity has just reused and not yet recorded. Once
   * per key per REFRESH_EVERY_MS from this process: the sweep keeps blobs younger than its grace plus that
   * period (`refreshLagMs`), so a blob put again is kept for the whole grace after that put.
   */
  private async refresh(key: string, ext: string, bytes: Buffer): Promise<void> {
    const now = Date.now();
    if (now - (this.refreshed.get(key) ?? -Infinity) < REFRESH_EVERY_MS) return;
    if (this.refreshed.size > 100_000) this.refreshed.clear();
    this.refreshed.set(key, now);
    try {
      // An object's put is all or nothing, so a damaged one (a `get` refuses it) is one of another length, e.g.
      // empty: checked here, at most once per REFRESH_EVERY_MS (or after a read found it damaged), and written
      // again (deleted, then put once more, so that a concurrent repair of the same bytes is harmless).
      const stored = (await this.objects.listWithAge(key)).find((o) => o.key === key);
      if (!stored || stored.size !== bytes.length) {
        if (stored) await this.objects.deleteMany([key]);
        if (await this.objects.putIfAbsent(key, bytes, CONTENT_TYPES[ext])) return;
      }
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

  now(): Promise<number> {
    return objectStoreNow(this.objects);
  }

  async recordAside(file: string, bytes: Buffer): Promise<void> {
    await this.objects.putIfAbsent(keyOf(this.objects.loc, WRITERS, file), bytes, 'application/json');
  }

  async readAside(): Promise<{ where: string; text: string }[]> {
    const out: { where: string; text: string }[] = [];
    for (const key of (await this.objects.list(keyOf(this.objects.loc, WRITERS) + '/')).sort()) {
      if (key.endsWith('.json')) out.push({ where: `s3://${this.objects.loc.bucket}/${key}`, text: (await this.objects.get(key)).toString('utf8') });
    }
    return out;
  }

  /** Blobs of the two-hex-digit folders `dirs`, listed now (one paged listing per folder). */
  private async listDirs(dirs: Iterable<string>): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    for (const d of dirs) {
      for (const o of await this.objects.listWithAge(keyOf(this.objects.loc, d) + '/')) {
        const name = this.nameOf(o.key);
        if (name) out.set(name, o.mtimeMs);
      }
    }
    return out;
  }

  /**
   * Deletes in batches of 1,000 (DeleteObjects' limit), sorted by name so that a batch spans few folders.
   * Right before each batch its folders are listed again: an object whose LastModified moved since the
   * sweep's listing (a put of bytes already stored refreshes it) or that is gone stays out of the batch.
   * What is left is the time between that listing and the DeleteObjects (milliseconds; S3 has no
   * conditional delete on LastModified), which the grace period covers: a writer that refreshed a blob
   * records its reference minutes later at most, long before the blob would be old again.
   */
  async deleteUnchanged(objects: StoredObject[]): Promise<StoredObject[]> {
    const sorted = [...objects].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    const gone: StoredObject[] = [];
    for (let i = 0; i < sorted.length; i += DELETE_BATCH) {
      const batch = sorted.slice(i, i + DELETE_BATCH);
      const now = await this.listDirs(new Set(batch.map((o) => o.name.slice(0, 2))));
      const doomed = batch.filter((o) => now.get(o.name) === o.mtimeMs);
      await this.objects.deleteMany(doomed.map((o) => keyOf(this.objects.loc, ...splitName(o.name))));
      gone.push(...doomed);
    }
    return gone;
  }
}

/** Keys a DeleteObjects request takes. */
const DELETE_BATCH = 1000;
