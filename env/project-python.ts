import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { minimalChildEnv } from './child-env';

/** The repository root (this file lives in <repo>/env). */
const REPO_ROOT = resolve(__dirname, '..');

/** Exit status a locating script uses for "the package is not installed". */
export const NOT_INSTALLED_STATUS = 3;

/**
 * Asks the project's Python (<repo>/.venv/bin/python, then python3) where an installed package is:
 * runs `script` with each and returns what `accept` makes of the first answer it accepts. `accept` throws
 * to reject an answer; the thrown message, a missing interpreter or exit status NOT_INSTALLED_STATUS
 * ("<pkg> not installed") go into the error, which ends with `hint`.
 */
export function locateWithProjectPython<T>(pkg: string, script: string, accept: (stdout: string) => T, hint: string): T {
  const venvPython = join(REPO_ROOT, '.venv', 'bin', 'python');
  const pythons = existsSync(venvPython) ? [venvPython, 'python3'] : ['python3'];
  const tried: string[] = [];
  for (const py of pythons) {
    let out: string;
    try {
      out = execFileSync(py, ['-c', script], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 30_000, env: minimalChildEnv() }).trim();
    } catch (err) {
      const e = err as NodeJS.ErrnoException & { status?: number };
      tried.push(`${py}: ${e.code === 'ENOENT' ? 'not found' : e.status === NOT_INSTALLED_STATUS ? `${pkg} not installed` : e.message}`);
      continue;
    }
    try {
      return accept(out);
    } catch (err) {
      tried.push(`${py}: ${(err as Error).message}`);
    }
  }
  throw new Error(`${pkg} is not installed (${tried.join('; ')}); ${hint}`);
}
