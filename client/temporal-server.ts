import { Connection } from '@temporalio/client';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { mkdirSync, readFileSync } from 'node:fs';
import { msToTs } from '@temporalio/common/lib/time';
import { ALL_SEARCH_ATTRIBUTES } from '../lib/episode/search-attributes';
import { sleep, spawnBackground, temporalBinary, type ManagedProcess } from './processes';
import { connectOptions, temporalSettings } from '../host/connection';

export interface DevServerOptions {
  home: string;
  port: number;
  uiPort?: number;
  /** Without a UI port the server runs headless (tests). */
  name?: string;
  /** SQLite `synchronous`: `full` syncs every commit to disk (stack.sqliteSynchronous); default `normal`. */
  sqliteSynchronous?: 'normal' | 'full';
}

/** The Temporal dev server with its SQLite file under the home folder, so a restart keeps every run. */
export async function startDevServer(o: DevServerOptions): Promise<ManagedProcess> {
  mkdirSync(o.home, { recursive: true });
  await assertPortFree(o.port, 'Temporal gRPC');
  if (o.uiPort) await assertPortFree(o.uiPort, 'Temporal UI');
  const args = devServerArgs(o);
  return spawnBackground(o.home, o.name ?? 'temporal', temporalBinary(), args);
}

/** The `temporal server start-dev` command line for `o`. */
export function devServerArgs(o: DevServerOptions): string[] {
  return [
    'server',
    'start-dev',
    '--db-filename',
    join(o.home, 'temporal.db'),
    '--ip',
    '127.0.0.1',
    '--port',
    String(o.port),
    '--log-level',
    'warn',
    // Activities scheduled on the workflow worker's own queue (policy sampling) start without a poll round trip.
    '--dynamic-config-value',
    'system.enableActivityEagerExecution=true',
    // WAL keeps every committed event across a process kill at a fraction of the fsync cost; only `full` keeps
    // the last commits when the box itself dies (power loss, a preempted VM).
    '--sqlite-pragma',
    'journal_mode=wal',
    '--sqlite-pragma',
    `synchronous=${o.sqliteSynchronous ?? 'normal'}`,
    ...(o.uiPort ? ['--ui-port', String(o.uiPort), '--ui-disable-news-fetch'] : ['--headless']),
  ];
}

export async function assertPortFree(port: number, what: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const srv = createServer();
    srv.once('error', (err: NodeJS.ErrnoException) =>
      reject(
        new Error(
          err.code === 'EADDRINUSE' ? `port ${port} (${what}) is already taken by another program; stop it or choose another port` : `cannot check port ${port}: ${err.message}`,
        ),
      ),
    );
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve()));
  });
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

/** A dev server that died while starting (its port taken, a bad flag): what its log says, at once. */
export class DevServerStartError extends Error {}

/** The line of a dev server's log that says it could not start, or undefined while none does. */
export function devServerStartFailure(logFile: string, fromByte = 0): string | undefined {
  let text: string;
  try {
    text = readFileSync(logFile).subarray(fromByte).toString('utf8');
  } catch {
    return undefined;
  }
  return text.split('\n').find((l) => /bind: address already in use|^panic:|level=(ERROR|FATAL) msg="Failed to start/.test(l));
}

/**
 * Connects, retrying until the server at `address` answers or the deadline passes. With `server` (a dev server this process started) a server that
 * died while starting is reported at once with its log's reason, instead of after the whole timeout.
 */
export async function waitForServer(address: string, timeoutMs = 60_000, server?: ManagedProcess): Promise<Connection> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    const failure = server && devServerStartFailure(server.logFile, server.logOffset);
    if (failure) throw new DevServerStartError(`Temporal dev server for ${address} did not start: ${failure.trim()} (log: ${server.logFile})`);
    try {
      const s = temporalSettings({ address, namespace: 'default' }, { ...process.env, TEMPORAL_ADDRESS: address });
      const conn = await Connection.connect({ ...connectOptions(s), connectTimeout: 2000 });
      await conn.workflowService.getSystemInfo({});
      return conn;
    } catch (err) {
      last = err;
      await sleep(250);
    }
  }
  throw new Error(`Temporal server at ${address} did not answer within ${timeoutMs / 1000}s: ${(last as Error)?.message}`);
}

/** Long retention (closed episodes stay in the UI) and the search attributes the workflows set. */
export async function prepareNamespace(conn: Connection, namespace: string, retentionDays: number): Promise<void> {
  const retention = msToTs(retentionDays * 86_400_000);
  try {
    await conn.workflowService.describeNamespace({ namespace });
    await conn.workflowService.updateNamespace({
      namespace,
      config: { workflowExecutionRetentionTtl: retention },
    });
  } catch (err) {
    if (!/not found/i.test((err as Error).message)) throw err;
    await conn.workflowService.registerNamespace({ namespace, workflowExecutionRetentionPeriod: retention });
  }
  const existing = await conn.operatorService.listSearchAttributes({ namespace });
  const have = new Set(Object.keys(existing.customAttributes ?? {}));
  const missing = ALL_SEARCH_ATTRIBUTES.filter((k) => !have.has(k.name));
  if (missing.length) {
    await conn.operatorService.addSearchAttributes({
      namespace,
      searchAttributes: Object.fromEntries(missing.map((k) => [k.name, 2 /* INDEXED_VALUE_TYPE_KEYWORD */])),
    });
  }
}

/**
 * A dev server on a free port, for a private stack (tests, benches). Another process may take the port between
 * the check and the server's bind, so a server that dies while starting is started again on another port.
 */
export async function startDevServerOnFreePort(
  o: Omit<DevServerOptions, 'port'>,
  attempts = 3,
): Promise<{ server: ManagedProcess; port: number; address: string; connection: Connection }> {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const address = `127.0.0.1:${port}`;
    const server = await startDevServer({ ...o, port });
    try {
      return { server, port, address, connection: await waitForServer(address, 90_000, server) };
    } catch (err) {
      if (!(err instanceof DevServerStartError) || attempt >= attempts) throw err;
      try {
        process.kill(server.pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
    }
  }
}
