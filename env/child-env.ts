/**
 * The environment of a helper subprocess (REAL eval scripts, the interpreter probes of env/project-python.ts):
 * only what an interpreter needs to start and find its packages, never the worker's secrets (API keys,
 * Temporal credentials, object store keys). An eval script is third-party code fed page-controlled data.
 */

/** Variables passed through by name. */
const KEEP = new Set(['PATH', 'HOME', 'LANG', 'LANGUAGE', 'TZ', 'TMPDIR', 'TEMP', 'TMP', 'VIRTUAL_ENV', 'SYSTEMROOT']);
/** Passed through by prefix: the locale (LC_*) and the interpreter's own settings (PYTHONPATH, PYTHONHOME, …). */
const KEEP_PREFIXES = ['LC_', 'PYTHON'];

export function minimalChildEnv(env: NodeJS.ProcessEnv = process.env, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) continue;
    if (KEEP.has(k) || KEEP_PREFIXES.some((p) => k.startsWith(p))) out[k] = v;
  }
  return { ...out, ...extra };
}
