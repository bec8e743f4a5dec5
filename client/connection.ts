import { readFileSync } from 'node:fs';
import type { TLSConfig } from '@temporalio/client';

/**
 * Connection settings from the environment, so the same workers and CLI reach the local dev server, a
 * Postgres-backed cluster or Temporal Cloud. Names follow Temporal's own environment configuration.
 */
export interface TemporalSettings {
  address: string;
  namespace: string;
  apiKey?: string;
  tls?: boolean | TLSConfig;
}

export function temporalSettings(
  defaults: { address: string; namespace: string },
  env: NodeJS.ProcessEnv = process.env,
): TemporalSettings {
  const address = env.TEMPORAL_ADDRESS || defaults.address;
  const namespace = env.TEMPORAL_NAMESPACE || defaults.namespace;
  const apiKey = env.TEMPORAL_API_KEY || undefined;
  const certPath = env.TEMPORAL_TLS_CLIENT_CERT_PATH;
  const keyPath = env.TEMPORAL_TLS_CLIENT_KEY_PATH;
  const caPath = env.TEMPORAL_TLS_SERVER_CA_CERT_PATH;
  const serverName = env.TEMPORAL_TLS_SERVER_NAME;
  if (Boolean(certPath) !== Boolean(keyPath)) {
    throw new Error('TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH must be set together');
  }
  const tlsWanted = /^(1|true|yes)$/i.test(env.TEMPORAL_TLS ?? '') || Boolean(certPath || caPath || serverName);
  let tls: boolean | TLSConfig | undefined;
  if (tlsWanted) {
    const cfg: TLSConfig = {};
    if (certPath && keyPath) cfg.clientCertPair = { crt: readFileSync(certPath), key: readFileSync(keyPath) };
    if (caPath) cfg.serverRootCACertificate = readFileSync(caPath);
    if (serverName) cfg.serverNameOverride = serverName;
    tls = Object.keys(cfg).length ? cfg : true;
  } else if (apiKey) {
    // API keys travel only over TLS (Temporal Cloud requires it).
    tls = true;
  }
  return { address, namespace, apiKey, tls };
}

export function haloHome(env: NodeJS.ProcessEnv = process.env, fallback = 'runs'): string {
  return env.HALO_HOME || fallback;
}
