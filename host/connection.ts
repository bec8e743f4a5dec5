import type { TLSConfig } from '@temporalio/client';
import { loadClientConfigProfile, toClientOptions } from '@temporalio/envconfig';

/**
 * Where Temporal is and how to reach it, read the way the `temporal` CLI and every SDK read it, so one profile
 * serves `halo`, the workers and `temporal workflow start`:
 *
 * 1. the TOML profile: TEMPORAL_PROFILE (default `default`) of TEMPORAL_CONFIG_FILE (default
 *    ~/.config/temporalio/temporal.toml), when that file exists;
 * 2. TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS*, TEMPORAL_GRPC_META_* over it;
 * 3. the HALO config's `temporal` section for an address or namespace neither gives.
 */
export interface TemporalSettings {
  address: string;
  namespace: string;
  apiKey?: string;
  tls?: boolean | TLSConfig;
  /** gRPC headers of the profile (`grpc_meta`). */
  metadata?: Record<string, string>;
}

/** An empty variable means "not set" (scripts blank TEMPORAL_ADDRESS to fall back to the HALO config). */
function withoutBlanks(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) continue;
    // An empty TEMPORAL_GRPC_META_X removes header x from the profile: keep it.
    if (v === '' && k.startsWith('TEMPORAL_') && !k.startsWith('TEMPORAL_GRPC_META_')) continue;
    out[k] = v;
  }
  // envconfig takes only `1`/`true`; `yes` and upper case keep working as they always did here.
  if (out.TEMPORAL_TLS !== undefined) {
    if (/^(1|true|yes)$/i.test(out.TEMPORAL_TLS)) out.TEMPORAL_TLS = 'true';
    else if (/^(0|false|no)$/i.test(out.TEMPORAL_TLS)) out.TEMPORAL_TLS = 'false';
  }
  return out;
}

export function temporalSettings(defaults: { address: string; namespace: string }, env: NodeJS.ProcessEnv = process.env): TemporalSettings {
  const profile = loadClientConfigProfile({ overrideEnvVars: withoutBlanks(env) });
  if (Boolean(profile.tls?.clientCert) !== Boolean(profile.tls?.clientKey)) {
    // envconfig would silently connect without a client certificate.
    throw new Error('the TLS client certificate and key (TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH) must be set together');
  }
  const { connectionOptions: c, namespace } = toClientOptions(profile);
  // TLS asked for without any detail is plain TLS with the system roots.
  const tls = c.tls && typeof c.tls === 'object' && Object.values(c.tls).every((v) => v === undefined) ? true : c.tls;
  const metadata = profile.grpcMeta;
  return {
    address: c.address || defaults.address,
    namespace: namespace || defaults.namespace,
    apiKey: c.apiKey || undefined,
    tls: tls ?? undefined,
    ...(metadata && Object.keys(metadata).length ? { metadata } : {}),
  };
}

/** The options that `Connection.connect` and `NativeConnection.connect` share. */
export function connectOptions(s: TemporalSettings) {
  return { address: s.address, tls: s.tls, apiKey: s.apiKey, metadata: s.metadata };
}
