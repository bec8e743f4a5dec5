import { randomBytes } from 'node:crypto';
import { rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { S3Objects } from './s3';

// The clock of a blob store, for `halo gc`'s ages: an object's LastModified (a file's mtime) is set by the
// store, so its age must be measured on the store's clock, not on the clock of the host that runs the sweep
// (a host whose clock runs ahead would otherwise see young blobs as old).

/** Loaded when an object store is used (as blob/s3.ts does). */
const sdk = (): typeof import('@aws-sdk/client-s3') => require('@aws-sdk/client-s3');

/**
 * The bucket's clock: the `Date` header of a one-key listing under the store's prefix (whole seconds,
 * rounded down, so an age is under-estimated by up to a second, never over). A response without a `Date`
 * header is an error: the sweep does not guess.
 */
export async function objectStoreNow(objects: S3Objects): Promise<number> {
  const cmd = new (sdk().ListObjectsV2Command)({ Bucket: objects.loc.bucket, Prefix: objects.loc.prefix ? `${objects.loc.prefix}/` : '', MaxKeys: 1 });
  let date: string | undefined;
  cmd.middlewareStack.add(
    (next) => async (args) => {
      const out = await next(args);
      const headers = (out.response as { headers?: Record<string, string> } | undefined)?.headers ?? {};
      date = headers.date ?? headers.Date;
      return out;
    },
    { step: 'deserialize', name: 'haloStoreClock' },
  );
  await objects.client.send(cmd);
  const t = date ? Date.parse(date) : NaN;
  if (!Number.isFinite(t)) throw new Error(`${objects.where()} answered without a Date header: its clock is unknown, so blob ages are too`);
  return t;
}

/**
 * A folder's clock: the mtime of a fresh file written at the folder's root (never listed: blobs live in
 * two-hex-digit folders), i.e. the file system's clock, which on a shared disk (NFS) is the server's. A
 * folder that does not exist yet holds nothing to age: this host's clock then.
 */
export async function folderNow(root: string): Promise<number> {
  const probe = join(root, `.gc-clock.${process.pid}.${randomBytes(6).toString('hex')}`);
  try {
    await writeFile(probe, '');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return Date.now();
    throw err;
  }
  try {
    return (await stat(probe)).mtimeMs;
  } finally {
    await rm(probe, { force: true });
  }
}
