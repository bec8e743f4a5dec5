import { open, readdir, realpath, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { BlobNotFoundError, BlobStore, type StoredObject } from '../blob/store';

/**
 * Mark and sweep over the blob store (`<2 hex>/<62 hex>.<ext>` under `<home>/blobs`, or under `<prefix>/blobs/`
 * of the bucket of `HALO_STORE=s3://bucket/prefix`: the store lists and deletes, this file decides). Live: every
 * blob a root names (a workflow history, a metrics row, an eval or snapshot file under the home folder: any text
 * that contains `sha256:<hex>.<ext>`), and every blob a live text blob names in turn (a trajectory names its
 * screenshots, a batch its prompts, an eval's records their trajectories). Everything else that is older than
 * the grace period goes; a blob younger than that may belong to an activity that has written it and not yet
 * reported it, so it stays, which makes a sweep safe while runs are going.
 *
 * Fail-safe: a root or a text blob that cannot be read for any reason other than "it is not there" (a server
 * that is busy, a deadline, a rate limit, a permission) aborts the whole collection with a GcAbortedError that
 * names it, before anything is deleted: what it would have named cannot be known, so nothing is unreferenced.
 * Ages are taken on the store's own clock (`store.now()`), never this host's.
 */

export const REF_PATTERN = /sha256:([0-9a-f]{64})\.([A-Za-z0-9]{1,16})/g;
/** Blobs that may name other blobs; images and other binaries are never read. */
const TEXT_EXTS = new Set(['json', 'jsonl', 'txt', 'md', 'html', 'yaml', 'yml', 'csv']);
/** Root files larger than this are read in pieces; blobs larger than this are not searched for references. */
const READ_CHUNK = 8 * 1024 * 1024;
const MAX_TEXT_BLOB = 256 * 1024 * 1024;

export const DEFAULT_GC_GRACE_MS = 60 * 60_000;
/**
 * `halo gc` refuses a shorter grace: a blob an activity has written but not yet reported (an episode step, a
 * batch being assembled, a put that refreshed an old blob's age) must outlive the sweep's listing.
 */
export const MIN_GC_GRACE_MS = 10 * 60_000;

/** Why a collection stopped before deleting anything: a root, history or text blob that could not be read. */
export class GcAbortedError extends Error {
  constructor(what: string, cause: unknown) {
    super(`halo gc stopped, nothing was deleted: could not read ${what}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = 'GcAbortedError';
  }
}

/** The grace period checked against MIN_GC_GRACE_MS (`halo gc --grace`, gcBlobs). */
export function checkGrace(graceMs: number): number {
  if (!Number.isFinite(graceMs) || graceMs < MIN_GC_GRACE_MS) {
    throw new Error(
      `gc grace ${Number.isFinite(graceMs) ? `${graceMs / 60_000} min` : String(graceMs)} is below the minimum of ${MIN_GC_GRACE_MS / 60_000} minutes: ` +
        'a blob written but not yet recorded in a history could be swept',
    );
  }
  return graceMs;
}

const isEnoent = (err: unknown) => (err as NodeJS.ErrnoException)?.code === 'ENOENT';

export interface GcOptions {
  /** The store to sweep (a folder or an object store: `blobStoreFor(home)`)... */
  store?: BlobStore;
  /** ...or a folder store's root (`<home>/blobs`). */
  blobsDir?: string;
  /** Text that names live blobs (workflow histories, as JSON). */
  rootTexts?: Iterable<string> | AsyncIterable<string>;
  /** Files and folders whose text files name live blobs (the home folder: metrics, evals, snapshots). */
  rootPaths?: string[];
  /** Blobs younger than this (plus the store's `refreshLagMs`) are kept whatever names them (default one hour). */
  graceMs?: number;
  dryRun?: boolean;
  /** The store's clock at the listing (default: asked of the store, `store.now()`); tests only. */
  now?: number;
}

export interface GcReport {
  /** The store swept: its folder, or its `s3://` location. */
  where: string;
  blobs: number;
  bytes: number;
  live: number;
  liveBytes: number;
  /** Unreferenced but younger than the grace period. */
  young: number;
  removed: number;
  /** Freed (or, with dryRun, that would be freed). */
  bytesFreed: number;
  /** Abandoned temp files of interrupted writes, older than the grace period (folder store only). */
  tempFilesRemoved: number;
  /** Refs named by a root or a live blob that the store does not hold. */
  missing: number;
  dryRun: boolean;
  removedRefs: string[];
  /** Namespaces recorded as writing to the store that this sweep did not read (a dry run only: else refused). */
  unreadNamespaces?: string[];
}

function refsIn(text: string, into: Set<string>): void {
  for (const m of text.matchAll(REF_PATTERN)) into.add(`sha256:${m[1]}.${m[2]}`);
}

/** Refs named in a file, read in chunks (a ref split across two chunks is caught by the overlap). */
async function refsInFile(path: string, into: Set<string>): Promise<void> {
  const fh = await open(path, 'r');
  // Read failures (EIO, EACCES…) propagate: the caller aborts, it never treats the file as naming nothing.
  try {
    const buf = Buffer.alloc(READ_CHUNK);
    let pos = 0;
    let carry = '';
    for (;;) {
      const { bytesRead } = await fh.read(buf, 0, READ_CHUNK, pos);
      if (bytesRead === 0) break;
      pos += bytesRead;
      const text = carry + buf.subarray(0, bytesRead).toString('latin1');
      refsIn(text, into);
      carry = text.slice(-100);
    }
  } finally {
    await fh.close();
  }
}

/**
 * Text files under `root`, their refs into `into`. Links are followed (a run folder or a file linked in from
 * another disk names blobs like any other; a folder reached twice is read once), and every folder is read
 * whatever its name (a run may be called `models`); only the blob store's own folders are left out, its blobs
 * being marked through the references that name them.
 */
async function refsUnder(root: string, blobsDir: string | undefined, into: Set<string>): Promise<void> {
  // Only "not there" (a root that does not exist, a file or folder removed while walking, a dangling link)
  // names nothing; any other error aborts the collection.
  const guard = <T>(what: string, p: Promise<T>, absent: T): Promise<T> =>
    p.catch((err) => {
      if (isEnoent(err)) return absent;
      throw new GcAbortedError(what, err);
    });
  const st = await guard(root, stat(root), undefined);
  if (!st) return;
  if (st.isFile()) return guard(root, refsInFile(root, into), undefined);
  const store = blobsDir === undefined ? undefined : await guard(blobsDir, realpath(blobsDir), undefined);
  const walked = new Set<string>();
  const walk = async (dir: string): Promise<void> => {
    const real = await guard(dir, realpath(dir), undefined);
    if (real === undefined || walked.has(real)) return;
    walked.add(real);
    for (const e of await guard(dir, readdir(dir, { withFileTypes: true }), [])) {
      const p = join(dir, e.name);
      if (real === store && (BLOB_FOLDER.test(e.name) || e.name === 'writers')) continue;
      let kind = e.isDirectory() ? 'dir' : e.isFile() ? 'file' : undefined;
      if (e.isSymbolicLink()) {
        const target = await guard(p, stat(p), undefined);
        kind = target?.isDirectory() ? 'dir' : target?.isFile() ? 'file' : undefined;
      }
      if (kind === 'dir') {
        if (['node_modules', '.git'].includes(e.name)) continue;
        await walk(p);
      } else if (kind === 'file' && /\.(jsonl?|txt|md|yaml|yml|csv|html|env)$/.test(e.name)) {
        await guard(p, refsInFile(p, into), undefined);
      }
    }
  };
  await walk(root);
}

/** A folder of blobs in a folder store: two hex digits. */
const BLOB_FOLDER = /^[0-9a-f]{2}$/;

/**
 * Refs a text blob names: a folder blob is read in chunks (any size), an object fetched whole (at most
 * MAX_TEXT_BLOB: a larger one aborts the collection rather than being taken to name nothing). A blob gone
 * since the listing names nothing; any other failure aborts.
 */
async function refsInBlob(store: BlobStore, b: StoredObject, into: Set<string>): Promise<void> {
  const ref = b.ref!;
  try {
    if (!store.isObjectStore) return await refsInFile(store.pathOf(ref), into);
    if (b.size > MAX_TEXT_BLOB) throw new Error(`${b.size} bytes, more than the ${MAX_TEXT_BLOB} read whole from an object store`);
    refsIn((await store.get(ref)).toString('latin1'), into);
  } catch (err) {
    if (err instanceof BlobNotFoundError || isEnoent(err)) return;
    throw new GcAbortedError(`text blob ${ref} in ${store.root}`, err);
  }
}

/** Text blobs read at once while marking (an object store answers each in a round trip). */
const MARK_CONCURRENCY = 16;

export async function collectBlobGarbage(o: GcOptions): Promise<GcReport> {
  const store = o.store ?? (o.blobsDir !== undefined ? new BlobStore(o.blobsDir) : undefined);
  if (!store) throw new Error('collectBlobGarbage: give the store (or blobsDir)');
  // A reused blob's age may trail its last put by the store's refresh period: the grace counts from that put.
  const grace = (o.graceMs ?? DEFAULT_GC_GRACE_MS) + store.refreshLagMs;
  // Ages on the store's clock (a bucket's Date header, a fresh file's mtime on the blobs folder's file
  // system), taken before the listing: an object's age can only be under-estimated, never over.
  const now = o.now ?? (await store.now());
  const blobsDir = store.isObjectStore ? undefined : store.root;
  // Listed first: a blob written after the listing is not a candidate at all.
  const listed = await store.list();
  const blobs = new Map<string, StoredObject>();
  const temps: StoredObject[] = [];
  for (const x of listed) {
    if (x.ref) blobs.set(x.ref, x);
    else temps.push(x);
  }

  const roots = new Set<string>();
  for (const p of o.rootPaths ?? []) await refsUnder(p, blobsDir, roots);
  // A history that cannot be read throws here (historyTexts), before anything is deleted.
  if (o.rootTexts) for await (const t of o.rootTexts) refsIn(t, roots);

  // Mark: follow refs through text blobs, a frontier at a time.
  const live = new Set<string>();
  let missing = 0;
  let frontier = [...roots];
  while (frontier.length > 0) {
    const next = new Set<string>();
    const toRead: StoredObject[] = [];
    for (const ref of frontier) {
      if (live.has(ref)) continue;
      live.add(ref);
      const b = blobs.get(ref);
      if (!b) {
        missing++;
        continue;
      }
      const ext = ref.slice(ref.lastIndexOf('.') + 1);
      if (TEXT_EXTS.has(ext)) toRead.push(b);
    }
    for (let i = 0; i < toRead.length; i += MARK_CONCURRENCY) {
      // Only a blob gone since the listing names nothing; any other read failure aborts (refsInBlob).
      await Promise.all(toRead.slice(i, i + MARK_CONCURRENCY).map((b) => refsInBlob(store, b, next)));
    }
    frontier = [...next].filter((r) => !live.has(r));
  }

  // Sweep.
  const report: GcReport = {
    where: store.root,
    blobs: blobs.size,
    bytes: 0,
    live: 0,
    liveBytes: 0,
    young: 0,
    removed: 0,
    bytesFreed: 0,
    tempFilesRemoved: 0,
    missing,
    dryRun: Boolean(o.dryRun),
    removedRefs: [],
  };
  const doomed: StoredObject[] = [];
  for (const b of blobs.values()) {
    report.bytes += b.size;
    if (live.has(b.ref!)) {
      report.live++;
      report.liveBytes += b.size;
    } else if (now - b.mtimeMs < grace) report.young++;
    else doomed.push(b);
  }
  doomed.push(...temps.filter((t) => now - t.mtimeMs >= grace));
  // Written again since the listing (a put of bytes already there refreshes their age): kept. The store
  // re-checks each object's age right before deleting it (folder: a stat per file; bucket: a re-listing of
  // the folders of each batch of 1,000, just before that batch's DeleteObjects).
  const gone = o.dryRun ? doomed : await store.deleteUnchanged(doomed);
  for (const x of gone) {
    report.bytesFreed += x.size;
    if (x.ref) {
      report.removed++;
      report.removedRefs.push(x.ref);
    } else report.tempFilesRemoved++;
  }
  return report;
}

export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let x = n;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i++;
  }
  return `${i === 0 ? x : x.toFixed(1)} ${units[i]}`;
}
