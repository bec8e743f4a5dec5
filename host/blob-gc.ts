import { lstat, open, readdir, rm, stat } from 'node:fs/promises';
import { join, relative } from 'node:path';

/**
 * Mark and sweep over the folder blob store (`<home>/blobs/<2 hex>/<62 hex>.<ext>`). Live: every blob a root
 * names (a workflow history, a metrics row, an eval or snapshot file under the home folder: any text that
 * contains `sha256:<hex>.<ext>`), and every blob a live text blob names in turn (a trajectory names its
 * screenshots, a batch its prompts, an eval's records their trajectories). Everything else that is older than
 * the grace period goes; a blob younger than that may belong to an activity that has written it and not yet
 * reported it, so it stays, which makes a sweep safe while runs are going.
 */

export const REF_PATTERN = /sha256:([0-9a-f]{64})\.([A-Za-z0-9]{1,16})/g;
/** Blobs that may name other blobs; images and other binaries are never read. */
const TEXT_EXTS = new Set(['json', 'jsonl', 'txt', 'md', 'html', 'yaml', 'yml', 'csv']);
/** Root files larger than this are read in pieces; blobs larger than this are not searched for references. */
const READ_CHUNK = 8 * 1024 * 1024;
const MAX_TEXT_BLOB = 256 * 1024 * 1024;

export const DEFAULT_GC_GRACE_MS = 60 * 60_000;

export interface GcOptions {
  /** The folder store's root (`<home>/blobs`). */
  blobsDir: string;
  /** Text that names live blobs (workflow histories, as JSON). */
  rootTexts?: Iterable<string> | AsyncIterable<string>;
  /** Files and folders whose text files name live blobs (the home folder: metrics, evals, snapshots). */
  rootPaths?: string[];
  /** Blobs younger than this are kept whatever names them (default one hour). */
  graceMs?: number;
  dryRun?: boolean;
  now?: number;
}

export interface GcReport {
  blobs: number;
  bytes: number;
  live: number;
  liveBytes: number;
  /** Unreferenced but younger than the grace period. */
  young: number;
  removed: number;
  /** Freed (or, with dryRun, that would be freed). */
  bytesFreed: number;
  /** Abandoned temp files of interrupted writes, older than the grace period. */
  tempFilesRemoved: number;
  /** Refs named by a root or a live blob that the store does not hold. */
  missing: number;
  dryRun: boolean;
  removedRefs: string[];
}

interface BlobFile {
  ref: string;
  path: string;
  size: number;
  mtimeMs: number;
  ext: string;
}

function refsIn(text: string, into: Set<string>): void {
  for (const m of text.matchAll(REF_PATTERN)) into.add(`sha256:${m[1]}.${m[2]}`);
}

/** Every blob of the store, and the temp files of writes that never finished. */
async function listStore(blobsDir: string): Promise<{ blobs: Map<string, BlobFile>; temps: { path: string; size: number; mtimeMs: number }[] }> {
  const blobs = new Map<string, BlobFile>();
  const temps: { path: string; size: number; mtimeMs: number }[] = [];
  let dirs: string[];
  try {
    dirs = await readdir(blobsDir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { blobs, temps };
    throw err;
  }
  for (const d of dirs) {
    if (!/^[0-9a-f]{2}$/.test(d)) continue;
    for (const name of await readdir(join(blobsDir, d)).catch(() => [] as string[])) {
      const path = join(blobsDir, d, name);
      const st = await lstat(path).catch(() => undefined);
      if (!st?.isFile()) continue;
      const m = /^([0-9a-f]{62})\.([A-Za-z0-9]{1,16})$/.exec(name);
      if (m) blobs.set(`sha256:${d}${m[1]}.${m[2]}`, { ref: `sha256:${d}${m[1]}.${m[2]}`, path, size: st.size, mtimeMs: st.mtimeMs, ext: m[2] });
      else if (name.endsWith('.tmp')) temps.push({ path, size: st.size, mtimeMs: st.mtimeMs });
    }
  }
  return { blobs, temps };
}

/** Refs named in a file, read in chunks (a ref split across two chunks is caught by the overlap). */
async function refsInFile(path: string, into: Set<string>): Promise<void> {
  const fh = await open(path, 'r');
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

/** Text files under `root` (the blob store itself and model folders excluded), their refs into `into`. */
async function refsUnder(root: string, blobsDir: string, into: Set<string>): Promise<void> {
  const st = await stat(root).catch(() => undefined);
  if (!st) return;
  if (st.isFile()) return refsInFile(root, into);
  const walk = async (dir: string): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
      const p = join(dir, e.name);
      if (p === blobsDir || relative(blobsDir, p) === '' || !relative(blobsDir, p).startsWith('..')) continue;
      if (e.isDirectory()) {
        // Temporal's database and model weights hold no blob refs worth a read.
        if (['models', 'node_modules', '.git'].includes(e.name)) continue;
        await walk(p);
      } else if (e.isFile() && /\.(jsonl?|txt|md|yaml|yml|csv|html|env)$/.test(e.name)) {
        await refsInFile(p, into);
      }
    }
  };
  await walk(root);
}

export async function collectBlobGarbage(o: GcOptions): Promise<GcReport> {
  const now = o.now ?? Date.now();
  const grace = o.graceMs ?? DEFAULT_GC_GRACE_MS;
  // Listed first: a blob written after the listing is not a candidate at all.
  const { blobs, temps } = await listStore(o.blobsDir);

  const roots = new Set<string>();
  for (const p of o.rootPaths ?? []) await refsUnder(p, o.blobsDir, roots);
  if (o.rootTexts) for await (const t of o.rootTexts) refsIn(t, roots);

  // Mark: follow refs through text blobs.
  const live = new Set<string>();
  let missing = 0;
  const queue = [...roots];
  while (queue.length > 0) {
    const ref = queue.pop()!;
    if (live.has(ref)) continue;
    live.add(ref);
    const b = blobs.get(ref);
    if (!b) {
      missing++;
      continue;
    }
    if (!TEXT_EXTS.has(b.ext) || b.size > MAX_TEXT_BLOB) continue;
    const named = new Set<string>();
    await refsInFile(b.path, named).catch(() => undefined);
    for (const r of named) if (!live.has(r)) queue.push(r);
  }

  // Sweep.
  const report: GcReport = {
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
  for (const b of blobs.values()) {
    report.bytes += b.size;
    if (live.has(b.ref)) {
      report.live++;
      report.liveBytes += b.size;
      continue;
    }
    if (now - b.mtimeMs < grace) {
      report.young++;
      continue;
    }
    // Written again since the listing (a put of the same bytes touches nothing, but a rename does): keep.
    const again = await stat(b.path).catch(() => undefined);
    if (!again || again.mtimeMs !== b.mtimeMs) continue;
    if (!o.dryRun) await rm(b.path, { force: true });
    report.removed++;
    report.bytesFreed += b.size;
    report.removedRefs.push(b.ref);
  }
  for (const t of temps) {
    if (now - t.mtimeMs < grace) continue;
    if (!o.dryRun) await rm(t.path, { force: true });
    report.tempFilesRemoved++;
    report.bytesFreed += t.size;
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

