import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseEnv } from 'node:util';

const REPO_ROOT = resolve(__dirname, '..');

/**
 * Reads `<repo>/.env` (KEY=value lines, dotenv syntax as Node parses it) into `env`. A variable that is
 * already set, even to an empty value, is never overridden; a missing file is fine. `HALO_ENV_FILE` names
 * another file (empty: none). Returns the names it set.
 */
export function loadDotEnv(env: NodeJS.ProcessEnv = process.env, file?: string): string[] {
  const path = file ?? (env.HALO_ENV_FILE !== undefined ? env.HALO_ENV_FILE : join(REPO_ROOT, '.env'));
  if (!path) return [];
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw new Error(`cannot read ${path}: ${(err as Error).message}`);
  }
  const set: string[] = [];
  for (const [k, v] of Object.entries(parseEnv(text))) {
    if (env[k] !== undefined) continue;
    env[k] = v;
    set.push(k);
  }
  return set;
}
