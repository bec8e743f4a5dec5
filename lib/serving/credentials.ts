/**
 * Named credentials. A workflow input never names an environment variable: it names one of a fixed set of
 * credentials, and the worker that makes the call maps the name to a variable of its own environment. A key
 * is bound to exact origins (scheme, host, port) set on the worker's side, wherever a workflow input points:
 * its defaults (DEFAULT_CREDENTIAL_ORIGINS), the local server's (`http://127.0.0.1:<HALO_VLLM_PORT>` and the
 * hosts of `HALO_CREDENTIAL_HTTP_HOSTS`, for the keys of that server) and `HALO_CREDENTIAL_<NAME>_ORIGINS`.
 * Loopback is no exception: on a shared machine any local user may listen on any other port, and the local
 * Temporal server lets anyone start a workflow that names one.
 */

export const CREDENTIAL_NAMES = ['policy', 'critic', 'baseline'] as const;
export type CredentialName = (typeof CREDENTIAL_NAMES)[number];

/** The variable each credential is read from, unless the worker sets `HALO_CREDENTIAL_<NAME>_ENV`. */
export const DEFAULT_CREDENTIAL_ENV: Readonly<Record<CredentialName, string>> = {
  policy: 'HALO_POLICY_API_KEY',
  critic: 'HALO_POLICY_API_KEY',
  baseline: 'OPENAI_API_KEY',
};

/**
 * The origins each credential may be sent to besides the local server's (LOCAL_SERVER_CREDENTIALS), unless the
 * worker adds more with `HALO_CREDENTIAL_<NAME>_ORIGINS`. The policy key goes to the local vLLM only; the critic
 * also to OpenAI's API; the baseline (the OpenAI key) to OpenAI's API only.
 */
export const DEFAULT_CREDENTIAL_ORIGINS: Readonly<Record<CredentialName, readonly string[]>> = {
  policy: [],
  critic: ['https://api.openai.com'],
  baseline: ['https://api.openai.com'],
};

/** The credentials of the local model server (vLLM): sent to its origin, never the baseline's OpenAI key. */
export const LOCAL_SERVER_CREDENTIALS: readonly CredentialName[] = ['policy', 'critic'];

/** Worker-side: the port of the local vLLM on 127.0.0.1 (default 8000, as `./launch.sh gpu` serves it). */
export const LOCAL_SERVER_PORT_ENV = 'HALO_VLLM_PORT';
const DEFAULT_LOCAL_SERVER_PORT = 8000;

/**
 * Worker-side: hosts (comma separated) of the local model server on a private network, `host` (at the local
 * server's port) or `host:port`, e.g. `vllm` in compose: they receive the local server's credentials over http.
 */
export const INSECURE_HOSTS_ENV = 'HALO_CREDENTIAL_HTTP_HOSTS';

/** How much of a server's error body goes into a failure message (and so into a workflow history). */
export const ERROR_BODY_MAX_CHARS = 300;

/** `s` cut to `max` characters (an ellipsis and the cut count after it), for server text that lands in histories. */
export function clipErrorText(s: string, max = ERROR_BODY_MAX_CHARS): string {
  return s.length <= max ? s : `${s.slice(0, max)}… (${s.length - max} more characters)`;
}

export type Env = Readonly<Record<string, string | undefined>>;

export function isCredentialName(x: unknown): x is CredentialName {
  return typeof x === 'string' && (CREDENTIAL_NAMES as readonly string[]).includes(x);
}

export function credentialOverrideVar(name: CredentialName): string {
  return `HALO_CREDENTIAL_${name.toUpperCase()}_ENV`;
}

/** The environment variable `name` is read from on this side (the worker's mapping). */
export function credentialEnvVar(name: CredentialName, env: Env): string {
  const override = env[credentialOverrideVar(name)]?.trim();
  return override && /^[A-Za-z_][A-Za-z0-9_]*$/.test(override) ? override : DEFAULT_CREDENTIAL_ENV[name];
}

export function isLoopbackHost(hostname: string): boolean {
  const h = hostname.toLowerCase().replace(/^\[|\]$/g, '');
  if (h === 'localhost' || h.endsWith('.localhost')) return true;
  if (h === '::1' || h === '0:0:0:0:0:0:0:1') return true;
  if (/^::ffff:127\./.test(h)) return true;
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

export function credentialOriginsVar(name: CredentialName): string {
  return `HALO_CREDENTIAL_${name.toUpperCase()}_ORIGINS`;
}

/** `scheme://host[:port]` of an http(s) URL, lower-cased, default port left out; undefined for anything else. */
export function originOf(url: string): string | undefined {
  try {
    const u = new URL(url);
    return u.protocol === 'http:' || u.protocol === 'https:' ? u.origin : undefined;
  } catch {
    return undefined;
  }
}

/** The local server's port on this side: `HALO_VLLM_PORT` when it is a port number, else 8000. */
export function localServerPort(env: Env): number {
  const v = env[LOCAL_SERVER_PORT_ENV]?.trim() ?? '';
  const n = Number(v);
  return /^\d{1,5}$/.test(v) && n >= 1 && n <= 65535 ? n : DEFAULT_LOCAL_SERVER_PORT;
}

/** The local server's origins for its credentials: 127.0.0.1 at its port, and the HALO_CREDENTIAL_HTTP_HOSTS. */
function localServerOrigins(env: Env): string[] {
  const port = localServerPort(env);
  // Only the address the server binds: [::1] or another 127.x address at the same port is another socket,
  // which another local user may hold (and `localhost` may resolve to ::1 first).
  const hosts = ['127.0.0.1', ...(env[INSECURE_HOSTS_ENV] ?? '').split(',').map((s) => s.trim())].filter(Boolean);
  const out: string[] = [];
  for (const h of hosts) {
    let u: URL;
    try {
      u = new URL(`http://${h}`);
    } catch {
      continue;
    }
    if (u.username || u.password || u.pathname !== '/' || u.search || u.hash) continue;
    const p = /:\d+$/.test(h) ? u.port || '80' : String(port);
    for (const scheme of ['http', 'https']) out.push(originOf(`${scheme}://${u.hostname}:${p}`)!);
  }
  return out;
}

/** The exact origins `name` may be sent to on this side: the local server's, the defaults, `HALO_CREDENTIAL_<NAME>_ORIGINS`. */
export function allowedOrigins(name: CredentialName, env: Env): string[] {
  const extra = (env[credentialOriginsVar(name)] ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((s) => originOf(s))
    .filter((s): s is string => s !== undefined);
  const local = LOCAL_SERVER_CREDENTIALS.includes(name) ? localServerOrigins(env) : [];
  return [...new Set([...local, ...DEFAULT_CREDENTIAL_ORIGINS[name], ...extra])];
}

/** Whether credential `name` may be sent to `url`: its origin (scheme, host, port) is one of allowedOrigins. */
export function originAllowed(name: CredentialName, url: string, env: Env): boolean {
  const origin = originOf(url);
  return origin !== undefined && allowedOrigins(name, env).includes(origin);
}

/** The refusal for a request that would carry credential `name` to `url`, which is not an origin allowed for it. */
export function originRefusal(name: CredentialName, url: string, field: string, env: Env): string {
  const envVar = credentialEnvVar(name, env);
  const origin = originOf(url) ?? url;
  const allowed = allowedOrigins(name, env);
  const configured = (env[credentialOriginsVar(name)] ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  const plainHttp = origin.startsWith('http://');
  const host = originOf(url) ? new URL(origin).hostname : '';
  const loopback =
    host && isLoopbackHost(host)
      ? LOCAL_SERVER_CREDENTIALS.includes(name)
        ? ` A loopback address gets it only at the local server's origin (http://127.0.0.1:${localServerPort(env)}; ${LOCAL_SERVER_PORT_ENV} sets the port): any local user can listen on another port.`
        : ' A loopback address is no exception: any local user can listen there.'
      : '';
  return (
    `${field}: credential "${name}" (${envVar}) is not sent to ${origin}: that origin is not allowed for it ` +
    `(allowed: ${allowed.length ? allowed.join(', ') : 'none'}).${loopback} ` +
    `If ${origin} is a server you trust with that key, set ${credentialOriginsVar(name)}=${[...configured, origin].join(',')} in the worker's environment ` +
    `(and the CLI's)${plainHttp ? ' (over plain http the key can be read on the way: prefer https)' : ''}, ` +
    `or unset ${envVar} there when that server needs no key`
  );
}

export type CredentialResolution =
  | { ok: true; name: CredentialName; envVar: string; key: string | undefined }
  | { ok: false; kind: 'UnknownCredential' | 'CredentialEnvMismatch' | 'CredentialOriginNotAllowed' | 'InvalidUrl'; message: string };

/**
 * Which key a request to `url` carries. `credential` must be one of CREDENTIAL_NAMES; a legacy `apiKeyEnv`
 * is accepted only when it names the very variable the worker maps the credential to. With the credential
 * configured, the URL's origin must be one the credential is allowed to reach (originAllowed).
 */
export function resolveCredential(o: { credential?: unknown; apiKeyEnv?: unknown; url: string; field: string; fallback: CredentialName }, env: Env): CredentialResolution {
  const given = o.credential ?? o.fallback;
  if (!isCredentialName(given)) {
    return {
      ok: false,
      kind: 'UnknownCredential',
      message: `${o.field}.credential ${JSON.stringify(given)} is not a credential this worker knows (one of ${CREDENTIAL_NAMES.join(', ')})`,
    };
  }
  const envVar = credentialEnvVar(given, env);
  if (o.apiKeyEnv !== undefined && o.apiKeyEnv !== envVar) {
    return {
      ok: false,
      kind: 'CredentialEnvMismatch',
      message:
        `${o.field}.apiKeyEnv ${JSON.stringify(o.apiKeyEnv)} is no longer read from workflow input: name a credential instead ` +
        `(${o.field}.credential: ${CREDENTIAL_NAMES.join(' | ')}); the worker maps "${given}" to ${envVar}, ` +
        `which ${credentialOverrideVar(given)} in the worker's environment changes`,
    };
  }
  const raw = env[envVar];
  // A configured credential (its variable set, even to an empty string) is checked against the URL's origin
  // whatever its value; with the variable unset nothing is sent, so any origin is fine.
  if (raw !== undefined) {
    if (!originOf(o.url)) return { ok: false, kind: 'InvalidUrl', message: `${o.field}: ${JSON.stringify(o.url)} is not an http(s) URL` };
    if (!originAllowed(given, o.url, env)) return { ok: false, kind: 'CredentialOriginNotAllowed', message: originRefusal(given, o.url, o.field, env) };
  }
  const key = raw || undefined;
  return { ok: true, name: given, envVar, key };
}
