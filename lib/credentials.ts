/**
 * Named credentials. A workflow input never names an environment variable: it names one of a fixed set of
 * credentials, and the worker that makes the call maps the name to a variable of its own environment. A key
 * is never sent over plain http to a host other than loopback (or a host the worker allows by name).
 */

export const CREDENTIAL_NAMES = ['policy', 'critic', 'baseline'] as const;
export type CredentialName = (typeof CREDENTIAL_NAMES)[number];

/** The variable each credential is read from, unless the worker sets `HALO_CREDENTIAL_<NAME>_ENV`. */
export const DEFAULT_CREDENTIAL_ENV: Readonly<Record<CredentialName, string>> = {
  policy: 'HALO_POLICY_API_KEY',
  critic: 'HALO_POLICY_API_KEY',
  baseline: 'OPENAI_API_KEY',
};

/** Worker-side: hosts (comma separated) that may receive a key over plain http besides loopback, e.g. `vllm` in compose. */
export const INSECURE_HOSTS_ENV = 'HALO_CREDENTIAL_HTTP_HOSTS';

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

export type CredentialResolution =
  | { ok: true; name: CredentialName; envVar: string; key: string | undefined }
  | { ok: false; kind: 'UnknownCredential' | 'CredentialEnvMismatch' | 'InsecureCredentialTransport' | 'InvalidUrl'; message: string };

/**
 * Which key a request to `url` carries. `credential` must be one of CREDENTIAL_NAMES; a legacy `apiKeyEnv`
 * is accepted only when it names the very variable the worker maps the credential to. With a key, the URL
 * must be https, or http to loopback or to a host in HALO_CREDENTIAL_HTTP_HOSTS.
 */
export function resolveCredential(
  o: { credential?: unknown; apiKeyEnv?: unknown; url: string; field: string; fallback: CredentialName },
  env: Env,
): CredentialResolution {
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
  const key = env[envVar] || undefined;
  if (key) {
    let u: URL;
    try {
      u = new URL(o.url);
    } catch {
      return { ok: false, kind: 'InvalidUrl', message: `${o.field}: ${JSON.stringify(o.url)} is not a URL` };
    }
    const allowed = (env[INSECURE_HOSTS_ENV] ?? '')
      .split(',')
      .map((s) => s.trim().toLowerCase())
      .filter(Boolean);
    const host = u.hostname.toLowerCase();
    if (u.protocol !== 'https:' && !(u.protocol === 'http:' && (isLoopbackHost(host) || allowed.includes(host)))) {
      return {
        ok: false,
        kind: 'InsecureCredentialTransport',
        message:
          `${o.field}: the "${given}" key is never sent over ${u.protocol.replace(':', '')} to ${host} (not loopback): use https, ` +
          `or allow the host on the worker with ${INSECURE_HOSTS_ENV}=${host} when it is on a private network`,
      };
    }
  }
  return { ok: true, name: given, envVar, key };
}
