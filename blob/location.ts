/**
 * Where blobs and adapters live: the local folder (default) or an S3-compatible object store named by
 * `HALO_STORE=s3://bucket/prefix`. Every object key is built here, from parts that cannot leave the prefix.
 */

export interface S3Location {
  bucket: string;
  /** Key prefix without leading or trailing slash; '' for the bucket root. */
  prefix: string;
}

const BUCKET = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;
const PART = /^[A-Za-z0-9._-]+$/;

/** `s3://bucket[/prefix]` → its bucket and prefix; anything else is an error naming the setting. */
export function parseStoreUrl(url: string, what = 'HALO_STORE'): S3Location {
  const m = /^s3:\/\/([^/]+)(?:\/(.*))?$/.exec(url.trim());
  if (!m) throw new Error(`${what}=${JSON.stringify(url)}: expected s3://bucket/prefix (or leave it unset for the local folder)`);
  const [, bucket, rest = ''] = m;
  if (!BUCKET.test(bucket)) throw new Error(`${what}: ${JSON.stringify(bucket)} is not a valid bucket name`);
  const parts = rest.split('/').filter((p) => p !== '');
  for (const p of parts) checkPart(p, `${what} prefix`);
  return { bucket, prefix: parts.join('/') };
}

/** One path segment of a key: letters, digits, `.`, `_`, `-`; never `.` or `..`. */
export function checkPart(part: string, what = 'key part'): string {
  if (!PART.test(part) || part === '.' || part === '..') {
    throw new Error(`${what} ${JSON.stringify(part)}: letters, digits, ".", "_" and "-" only, and not "." or ".."`);
  }
  return part;
}

/** The key of `parts` under the location's prefix; every part is checked, so no key leaves the prefix. */
export function keyOf(loc: S3Location, ...parts: string[]): string {
  for (const p of parts) checkPart(p);
  return [loc.prefix, ...parts].filter((p) => p !== '').join('/');
}

/** The object store configured for this process, if any (`HALO_STORE`); undefined means the local folders. */
export function storeLocation(env: NodeJS.ProcessEnv = process.env): S3Location | undefined {
  const v = env.HALO_STORE?.trim();
  return v ? parseStoreUrl(v) : undefined;
}

export function describeLocation(loc: S3Location, ...parts: string[]): string {
  return `s3://${loc.bucket}/${keyOf(loc, ...parts)}`;
}
