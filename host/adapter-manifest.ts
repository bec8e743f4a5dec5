import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';

/**
 * An adapter version folder is whole when its `manifest.json` (written last by the learner,
 * workers/learner/halo_learner/adapters.py) parses and every file it lists has the sha256 it records. vLLM
 * checks none of that: a folder torn by a crash would be served (or refused with an unrelated message), so every
 * path that hands a folder to vLLM asks `adapterFolderDamage` first.
 */
export const MANIFEST_FILE = 'manifest.json';
/** Retention removes the optimiser state of older versions after rewriting their manifest: its absence is normal. */
const OPTIONAL_FILES = new Set(['optimizer.safetensors']);

/** Files that matched in this process, by path: the stat signature they had then and their sha256 (0.17 GiB an 8B adapter: hashed once). */
const verified = new Map<string, { sig: string; sha: string }>();

/** What is wrong with the version folder `dir`, or undefined when it is whole. A folder that does not exist is not judged here. */
export async function adapterFolderDamage(dir: string): Promise<string | undefined> {
  let raw: string;
  try {
    raw = await readFile(join(dir, MANIFEST_FILE), 'utf8');
  } catch (err) {
    return `${MANIFEST_FILE} cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`;
  }
  let files: unknown;
  try {
    files = (JSON.parse(raw) as { files?: unknown })?.files;
  } catch (err) {
    return `${MANIFEST_FILE} is not JSON (${(err as Error).message}): torn by a crash?`;
  }
  if (typeof files !== 'object' || files === null || Array.isArray(files)) return `${MANIFEST_FILE} has no "files" object`;
  for (const [name, sha] of Object.entries(files)) {
    if (typeof sha !== 'string' || !/^[0-9a-f]{64}$/.test(sha)) return `${MANIFEST_FILE} records no sha256 for ${name}`;
    if (name.includes('/') || name.includes('\\') || name === '..' || name === '.') return `${MANIFEST_FILE} lists ${JSON.stringify(name)}, not a file name`;
    const path = join(dir, name);
    let sig: string;
    try {
      const st = await stat(path, { bigint: true });
      sig = `${st.size}:${st.mtimeNs}:${st.ctimeNs}:${st.ino}:${st.dev}`;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
        if (OPTIONAL_FILES.has(name)) continue;
        return `${name} is missing`;
      }
      return `${name} cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`;
    }
    const seen = verified.get(path);
    if (seen && seen.sig === sig && seen.sha === sha) continue;
    if ((await sha256File(path)) !== sha) return `${name} does not match its sha256 in ${MANIFEST_FILE}`;
    verified.set(path, { sig, sha });
  }
  return undefined;
}

async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}
