import { CREDENTIAL_NAMES, credentialEnvVar } from '../lib/serving/credentials';

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

/** What Chromium needs to start headless, render text and find fonts (and a display, when there is one). */
const BROWSER_KEEP = new Set(['PATH', 'HOME', 'LANG', 'LANGUAGE', 'TZ', 'TMPDIR', 'DISPLAY', 'WAYLAND_DISPLAY', 'FONTCONFIG_PATH', 'FONTCONFIG_FILE']);
/** The locale, the XDG folders (config, cache, runtime) and a snap's own variables (Ubuntu's Chromium is a snap). */
const BROWSER_KEEP_PREFIXES = ['LC_', 'XDG_', 'SNAP'];

/**
 * The environment of Chromium (every renderer inherits it): allow-listed, so that a renderer exploit that reads
 * /proc/self/environ finds no key of the worker (model servers, OpenAI, Temporal, the object store).
 */
export function browserEnv(env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) continue;
    if (BROWSER_KEEP.has(k) || BROWSER_KEEP_PREFIXES.some((p) => k.startsWith(p))) out[k] = v;
  }
  return out;
}

/**
 * The variables holding model-server keys on this side (each credential's mapped variable): a browser worker
 * calls no model server, so it neither gets nor keeps them (client/stack.ts, workers/browser.ts).
 */
export function modelKeyVars(env: NodeJS.ProcessEnv = process.env): string[] {
  return [...new Set(CREDENTIAL_NAMES.map((n) => credentialEnvVar(n, env)))];
}

/** `env` without the model-server keys (modelKeyVars). */
export function withoutModelKeys(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const out = { ...env };
  for (const k of modelKeyVars(env)) delete out[k];
  return out;
}
