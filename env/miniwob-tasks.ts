import { editDistance } from '../lib/model-io/text';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const cache = new Map<string, string[]>();

/**
 * The registered MiniWoB++ tasks (125 for miniwob 1.1.0), read at run time from the installed package's
 * `registration.py` (`id="miniwob/<name>-v1"`), without the FlightWoB ids (`flight.*`, which need other
 * files). Sorted. `htmlDir` is the package's `html/` folder (see findMiniwobHtml()).
 */
export function listMiniwobTasks(htmlDir: string): string[] {
  const dir = resolve(htmlDir);
  const hit = cache.get(dir);
  if (hit) return [...hit];
  const registration = join(dir, '..', 'registration.py');
  let source: string;
  try {
    source = readFileSync(registration, 'utf8');
  } catch {
    throw new Error(`cannot read ${registration}: is ${dir} the html/ folder of an installed miniwob package?`);
  }
  const names = new Set<string>();
  for (const m of source.matchAll(/\bid\s*=\s*["']miniwob\/([A-Za-z0-9._-]+)-v1["']/g)) {
    const name = m[1];
    if (name.startsWith('flight.')) continue;
    names.add(name);
  }
  if (names.size === 0) throw new Error(`no miniwob/<task>-v1 ids found in ${registration}`);
  const missing = [...names].filter((n) => !existsSync(join(dir, 'miniwob', `${n}.html`)));
  if (missing.length > 0) {
    throw new Error(`registered MiniWoB tasks without a page under ${join(dir, 'miniwob')}: ${missing.join(', ')}`);
  }
  const tasks = [...names].sort();
  cache.set(dir, tasks);
  return [...tasks];
}

/** Up to `n` known task names closest to `name` (substring matches first, then by edit distance). */
export function closeMiniwobTasks(name: string, tasks: readonly string[], n = 5): string[] {
  const q = name
    .trim()
    .toLowerCase()
    .replace(/^miniwob[./]/, '')
    .replace(/-v1$/, '')
    .replace(/\.html$/, '');
  const limit = Math.max(2, Math.ceil(q.length / 3));
  return tasks
    .map((t) => ({ t, contains: q.length >= 3 && (t.includes(q) || q.includes(t)), d: editDistance(q, t) }))
    .filter((s) => s.contains || s.d <= limit)
    .sort((a, b) => Number(b.contains) - Number(a.contains) || a.d - b.d || a.t.localeCompare(b.t))
    .slice(0, n)
    .map((s) => s.t);
}

/** Throws a clear error (with suggestions) when `name` is not one of `tasks`. */
export function assertMiniwobTask(name: string, tasks: readonly string[]): void {
  if (tasks.includes(name)) return;
  const close = closeMiniwobTasks(name, tasks);
  const hint = close.length > 0 ? `; did you mean ${close.map((t) => `"${t}"`).join(', ')}?` : '';
  throw new Error(`unknown MiniWoB task "${name}" (${tasks.length} registered tasks)${hint}`);
}
