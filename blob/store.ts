import { createHash } from 'node:crypto';
import { mkdir, readFile, rename, writeFile, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';

/**
 * Content-addressed files: a reference is `sha256:<hex>.<ext>`, so writing the same bytes twice is free and a
 * reference can never point at changed content. Temporal payloads carry only these references.
 */
export class BlobStore {
  constructor(readonly root: string) {}

  async put(bytes: Buffer | string, ext: string): Promise<string> {
    const buf = typeof bytes === 'string' ? Buffer.from(bytes) : bytes;
    const hex = createHash('sha256').update(buf).digest('hex');
    const ref = `sha256:${hex}.${ext}`;
    const path = this.pathOf(ref);
    if (await exists(path)) return ref;
    await mkdir(dirname(path), { recursive: true });
    const tmp = `${path}.${process.pid}.${Date.now()}.tmp`;
    await writeFile(tmp, buf);
    await rename(tmp, path);
    return ref;
  }

  async putJson(value: unknown): Promise<string> {
    return this.put(JSON.stringify(value), 'json');
  }

  async get(ref: string): Promise<Buffer> {
    try {
      return await readFile(this.pathOf(ref));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new BlobNotFoundError(ref, this.root);
      throw err;
    }
  }

  async getJson<T>(ref: string): Promise<T> {
    return JSON.parse((await this.get(ref)).toString('utf8')) as T;
  }

  pathOf(ref: string): string {
    const m = /^sha256:([0-9a-f]{64})\.([a-z0-9]{1,8})$/.exec(ref);
    if (!m) throw new Error(`not a blob reference: ${JSON.stringify(ref)}`);
    return join(this.root, m[1].slice(0, 2), `${m[1].slice(2)}.${m[2]}`);
  }
}

export class BlobNotFoundError extends Error {
  constructor(ref: string, root: string) {
    super(`blob ${ref} not found under ${root}`);
    this.name = 'BlobNotFoundError';
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}
