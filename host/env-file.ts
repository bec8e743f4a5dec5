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

/** A line of `.env` that docker compose would read otherwise than this parser. */
export interface ComposeDisagreement {
  line: number;
  key: string;
  why: string;
}

const ASSIGNMENT = /^\s*(?:export\s+)?([\w.-]+)\s*=\s*(.*)$/;

/**
 * The subset of `.env` that docker compose and the CLI read alike: unquoted values without `#`, `$`, `\`, quotes or
 * inner spaces; single-quoted values on one line (both read them literally). Compose keeps an unquoted `abc#def`
 * whole (dotenv ends it at `#`) and replaces `$VAR` in unquoted and double-quoted values (dotenv keeps it). Each line
 * outside the subset, by key (never its value); write such a value in single quotes.
 */
export function composeDisagreements(text: string): ComposeDisagreement[] {
  const out: ComposeDisagreement[] = [];
  text.split(/\r?\n/).forEach((line, i) => {
    const m = ASSIGNMENT.exec(line);
    if (!m || line.trimStart().startsWith('#')) return;
    const [, key, raw] = m;
    const add = (why: string) => out.push({ line: i + 1, key, why });
    if (raw.startsWith("'")) {
      if (raw.indexOf("'", 1) < 0) add('a single-quoted value that spans lines: compose and the CLI split it differently');
    } else if (raw.startsWith('"')) {
      const end = raw.indexOf('"', 1);
      if (end < 0) add('a double-quoted value that spans lines: compose and the CLI split it differently');
      else if (raw.slice(1, end).includes('$')) add('"$" in double quotes: compose replaces $NAME with a variable, the CLI keeps it');
    } else if (raw.startsWith('`')) {
      add('a backquoted value: compose keeps the backquotes, the CLI takes them as quotes');
    } else {
      const value = raw.replace(/\s+#.*$/, '').trim();
      if (value.includes('#')) add('an unquoted "#": the CLI ends the value there, compose keeps it');
      else if (value.includes('$')) add('an unquoted "$": compose replaces $NAME with a variable, the CLI keeps it');
      else if (/[\\"'`]/.test(value) || /\s/.test(value)) add('quotes, a backslash or a space inside an unquoted value: compose and the CLI read it differently');
    }
  });
  return out;
}

/**
 * Reads `<repo>/.env` (KEY=value lines, parseDotEnv's grammar) into `env`. A variable that is
 * already set, even to an empty value, is never overridden; a missing file is fine. `HALO_ENV_FILE` names
 * another file (empty: none). Returns the names it set.
 */
export function loadDotEnv(env: NodeJS.ProcessEnv = process.env, file?: string, warn: (msg: string) => void = (m) => process.emitWarning(m)): string[] {
  const path = file ?? (env.HALO_ENV_FILE !== undefined ? env.HALO_ENV_FILE : join(REPO_ROOT, '.env'));
  if (!path) return [];
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw new Error(`cannot read ${path}: ${(err as Error).message}`);
  }
  // The same file feeds docker compose (`env_file`, `${VAR}`): a value the two read differently is said, by key.
  for (const d of composeDisagreements(text)) {
    warn(`${path} line ${d.line} (${d.key}): ${d.why}; write it in single quotes (${d.key}='…') so that compose reads the same value`);
  }
  const set: string[] = [];
  for (const [k, v] of Object.entries(parseDotEnv(text))) {
    if (env[k] !== undefined) continue;
    env[k] = v;
    set.push(k);
  }
  return set;
}
