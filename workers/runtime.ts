import { hostname } from 'node:os';
import { DefaultLogger, NativeConnection, Runtime, type LogLevel } from '@temporalio/worker';
import type { BlobStore } from '../blob/store';
import { haloHome } from '../host/home';
import { connectOptions, temporalSettings, type TemporalSettings } from '../host/connection';
import { InflightLedger, ledgerDir } from './inflight';
import { createLogger, type Logger } from '../host/log';

const SDK_LOG_LEVELS = ['TRACE', 'DEBUG', 'INFO', 'WARN', 'ERROR'] as const;

/** HALO_TEMPORAL_LOG_LEVEL: the least severe SDK and Core line that reaches the worker's log (WARN unless set). */
export function sdkLogLevel(env: Record<string, string | undefined>): LogLevel {
  const raw = env.HALO_TEMPORAL_LOG_LEVEL?.trim();
  if (!raw) return 'WARN';
  const level = raw.toUpperCase();
  if (!(SDK_LOG_LEVELS as readonly string[]).includes(level)) {
    throw new Error(`HALO_TEMPORAL_LOG_LEVEL ${JSON.stringify(raw)}: one of ${SDK_LOG_LEVELS.join(', ')} (case does not matter)`);
  }
  return level as LogLevel;
}

/**
 * The Temporal runtime logs through pino too (Core's own lines included, forwarded), so worker and SDK lines
 * share one format and destination; `log` is the worker's logger. With HALO_METRICS_ADDRESS (host:port; `halo up`
 * sets it per worker from HALO_METRICS_PORT) the SDK serves its worker metrics there for Prometheus, tagged with
 * the worker's name.
 */
export function installRuntime(name: string, log: Logger = createLogger(name)): Logger {
  const level = sdkLogLevel(process.env);
  const metrics = process.env.HALO_METRICS_ADDRESS?.trim();
  if (metrics && !/^[^\s:]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$/.test(metrics)) {
    throw new Error(`HALO_METRICS_ADDRESS ${JSON.stringify(metrics)}: host:port to serve worker metrics on (e.g. 127.0.0.1:9464)`);
  }
  Runtime.install({
    telemetryOptions: {
      logging: { filter: { core: level, other: 'ERROR' }, forward: {} },
      ...(metrics ? { metrics: { prometheus: { bindAddress: metrics }, globalTags: { halo_worker: name } } } : {}),
    },
    logger: new DefaultLogger(level, (entry) => {
      const fields = { ...(entry.meta ?? {}), sdk: true };
      const msg = entry.message;
      switch (entry.level) {
        case 'ERROR':
          log.error(fields, msg);
          break;
        case 'WARN':
          log.warn(fields, msg);
          break;
        case 'INFO':
          log.info(fields, msg);
          break;
        default:
          log.debug(fields, msg);
      }
    }),
    shutdownSignals: ['SIGINT', 'SIGTERM', 'SIGQUIT'],
  });
  return log;
}

export async function connectWorker(): Promise<{ connection: NativeConnection; namespace: string; settings: TemporalSettings }> {
  const s = temporalSettings({ address: '127.0.0.1:7233', namespace: 'default' });
  const connection = await NativeConnection.connect(connectOptions(s));
  return { connection, namespace: s.namespace, settings: s };
}

/**
 * The ledger of this process's running activities (workers/inflight.ts), after failing the attempts that
 * dead processes of the same role left running on this host.
 */
export async function takeOverLedger(role: string, settings: TemporalSettings, log: Logger): Promise<InflightLedger> {
  const ledger = new InflightLedger(ledgerDir(haloHome()), role);
  const failed = await ledger.releaseOrphans(settings, log);
  if (failed > 0) log.warn({ failed }, `failed ${failed} attempt(s) that a dead ${role} left running: their retries start now`);
  return ledger;
}

/**
 * The blob store of this worker, its namespace recorded there first: `halo gc` then knows that this
 * namespace's histories name blobs in it, even when another namespace shares the home or bucket.
 */
export async function recordedStore(blobs: BlobStore, settings: TemporalSettings): Promise<BlobStore> {
  await blobs.recordWriter({ namespace: settings.namespace, address: settings.address, host: hostname(), home: haloHome() });
  return blobs;
}

export function queueNames() {
  return {
    control: process.env.HALO_CONTROL_QUEUE || 'halo-control',
    browser: process.env.HALO_BROWSER_QUEUE || 'halo-browser',
  };
}
