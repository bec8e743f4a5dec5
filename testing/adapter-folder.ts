import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** What the learner writes into a version folder (workers/learner/halo_learner/adapters.py). */
export const ADAPTER_FILES = ['adapter_config.json', 'adapter_model.safetensors', 'manifest.json'];

/**
 * A LoRA version folder `<root>/<run>/v<version>` in the learner's layout, with placeholder contents: enough
 * for a server that checks which files are there (the fake vLLM does, as vLLM does), not for loading weights.
 * Leave a file out of `files` to make the folder one that vLLM rejects.
 */
export function writeAdapterFolder(root: string, run: string, version: number, files = ADAPTER_FILES): string {
  const dir = join(root, run, `v${version}`);
  mkdirSync(dir, { recursive: true });
  for (const f of files) writeFileSync(join(dir, f), f.endsWith('.json') ? '{}' : Buffer.alloc(16));
  return dir;
}
