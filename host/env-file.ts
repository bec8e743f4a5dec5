import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parse } from 'dotenv';

const REPO_ROOT = resolve(__dirname, '..');

/**
 * The key/value map of a `.env` text: the npm `dotenv` package's grammar (its parse(); the learner's
 * halo_learner/envfile.py is a port of it, both tested on test/fixtures/dotenv/). An unquoted value ends at
 * the first `#`; quoted values keep it and may span lines; `export ` is allowed.
 */
export function parseDotEnv(text: string): Record<string, string> {
  return parse(text);
}

/**
 * Reads `<repo>/.env` (KEY=value lines, parseDotEnv's grammar) into `env`. A variable that is
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
  for (const [k, v] of Object.entries(parseDotEnv(text))) {
    if (env[k] !== undefined) continue;
    env[k] = v;
    set.push(k);
  }
  return set;
}
