import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** What the learner writes into a version folder (workers/learner/halo_learner/adapters.py). */
export const ADAPTER_FILES = ['adapter_config.json', 'adapter_model.safetensors', 'manifest.json'];

/**
 * A LoRA version folder `<root>/<run>/v<version>` in the learner's layout, with placeholder contents: enough
 * for a server that checks which files are there (the fake vLLM does, as vLLM does), not for loading weights.
 * The manifest records the sha256 of each other file written, as the learner's does (the worker checks it before
 * vLLM sees the folder). Leave a file out of `files` to make the folder one that vLLM rejects; `contents` replaces
 * the placeholder of a file (an adapter_config.json with a given rank).
 */
export function writeAdapterFolder(root: string, run: string, version: number, files = ADAPTER_FILES, contents: Record<string, string> = {}): string {
  const dir = join(root, run, `v${version}`);
  mkdirSync(dir, { recursive: true });
  const sums: Record<string, string> = {};
  for (const f of files.filter((f) => f !== 'manifest.json')) {
    const data = f in contents ? Buffer.from(contents[f]) : f.endsWith('.json') ? Buffer.from('{}') : Buffer.alloc(16);
    writeFileSync(join(dir, f), data);
    sums[f] = createHash('sha256').update(data).digest('hex');
  }
  if (files.includes('manifest.json')) writeFileSync(join(dir, 'manifest.json'), JSON.stringify({ run_id: run, version, files: sums }));
  return dir;
}
