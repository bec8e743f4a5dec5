import { randomBytes } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import { lstat, rename, rm } from 'node:fs/promises';
import { dirname } from 'node:path';
import { DIR_MODE, FILE_MODE } from './file-modes';

// The folder store's file operations that must survive a power cut or another writer: durable writes (fsynced
// file and folder), modes whatever the umask, a folder squatting at a blob's address, mtimes on the store's clock.

/**
 * Writes `bytes` to `path` durably: into a temp file of its folder that is fsynced, renamed over `path`, and the
 * folder fsynced, so that after a power cut the name holds either nothing or all of the bytes. `fresh`: folders
 * this write created, whose parents are fsynced too (their entries are new).
 */
export async function writeDurably(path: string, bytes: Buffer, fresh: string[] = []): Promise<void> {
  const dir = dirname(path);
  // A name no other writer uses; replacing a file a concurrent writer just renamed there changes nothing,
  // the bytes are equal.
  const tmp = `${path}.${process.pid}.${randomBytes(8).toString('hex')}.tmp`;
  try {
    const fh = await fsp.open(tmp, 'wx', FILE_MODE);
    try {
      await fh.chmod(FILE_MODE);
      await fh.writeFile(bytes);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await fsp.rename(tmp, path);
  } catch (err) {
    await rm(tmp, { force: true }).catch(() => {});
    throw err;
  }
  await syncDir(dir);
  for (const d of fresh) await syncDir(dirname(d));
}

/** Folders this process created get DIR_MODE whatever its umask (mkdir's mode is narrowed by it). */
export async function chmodEach(dirs: string[]): Promise<void> {
  for (const d of dirs) await fsp.chmod(d, DIR_MODE);
}

/** fsync of a folder: its entries (a rename, a new file) survive a power cut. */
export async function syncDir(dir: string): Promise<void> {
  const fh = await fsp.open(dir, 'r');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** A folder where a blob file belongs would make every write of it fail (EISDIR) for good: moved aside, removed. */
export async function removeFolderAt(path: string): Promise<void> {
  const st = await lstat(path).catch(() => undefined);
  if (!st?.isDirectory()) return;
  const aside = `${path}.folder-${process.pid}-${randomBytes(4).toString('hex')}`;
  try {
    await rename(path, aside);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return; // another writer moved it first
    throw err;
  }
  await rm(aside, { recursive: true, force: true });
}

/**
 * A new mtime for a whole blob file, set by the file system rather than this host: an ftruncate to its own
 * length changes no byte but marks the file modified at the kernel's (on NFS: the server's) time, as a
 * `touch` does. `utimes` with this host's clock would let a host that lags make a just-reused blob look old
 * on a shared disk, and `halo gc` ages blobs by the store's clock.
 */
export async function touchOnStoreClock(path: string, length: number): Promise<void> {
  const fh = await fsp.open(path, 'r+');
  try {
    await fh.truncate(length);
  } finally {
    await fh.close();
  }
}
