import { Client, Connection } from '@temporalio/client';
import { join, resolve } from 'node:path';
import type { HaloConfig } from '../lib/config';
import { temporalSettings } from './connection';
import { readPid, sleep, spawnBackground, stopProcess, workerCommand, REPO_ROOT } from './processes';
import { prepareNamespace, startDevServer, waitForServer } from './temporal-server';

export interface StackStatus {
  temporal: number | undefined;
  control: number | undefined;
  browsers: (number | undefined)[];
  address: string;
  namespace: string;
  uiUrl?: string;
  home: string;
}

const isLocal = (address: string) => /^(127\.0\.0\.1|localhost|\[::1\]):\d+$/.test(address);

function stackEnv(cfg: HaloConfig, home: string, address: string, namespace: string): NodeJS.ProcessEnv {
  return {
    ...process.env,
    HALO_HOME: home,
    TEMPORAL_ADDRESS: address,
    TEMPORAL_NAMESPACE: namespace,
    HALO_CONTROL_QUEUE: cfg.temporal.controlTaskQueue,
    HALO_BROWSER_QUEUE: cfg.temporal.browserTaskQueue,
  };
}

export function stackStatus(cfg: HaloConfig): StackStatus {
  const home = resolve(REPO_ROOT, cfg.stack.home);
  const s = temporalSettings(cfg.temporal);
  return {
    temporal: readPid(home, 'temporal'),
    control: readPid(home, 'control-worker'),
    browsers: Array.from({ length: cfg.stack.browserWorkers }, (_, i) => readPid(home, `browser-worker-${i}`)),
    address: s.address,
    namespace: s.namespace,
    uiUrl: isLocal(s.address) ? `http://localhost:${cfg.stack.uiPort}` : undefined,
    home,
  };
}

/**
 * Start what is not running yet (Temporal dev server for a local address, control worker, browser
 * workers) and wait until the server answers and every worker polls its queue. Safe to call twice.
 */
export async function up(cfg: HaloConfig, say: (msg: string) => void = () => {}): Promise<StackStatus> {
  const st = stackStatus(cfg);
  const { home, address, namespace } = st;
  if (isLocal(address) && st.temporal === undefined) {
    const port = Number(address.split(':').pop());
    say(`starting Temporal dev server on ${address} (UI :${cfg.stack.uiPort}, data ${join(home, 'temporal.db')})`);
    await startDevServer({ home, port, uiPort: cfg.stack.uiPort });
  }
  const conn = await waitForServer(address, 90_000);
  try {
    if (isLocal(address)) await prepareNamespace(conn, namespace, cfg.stack.retentionDays);
    const env = stackEnv(cfg, home, address, namespace);
    if (st.control === undefined) {
      say('starting control worker');
      const { command, args } = workerCommand('control');
      spawnBackground(home, 'control-worker', command, args, env);
    }
    st.browsers.forEach((pid, i) => {
      if (pid !== undefined) return;
      say(`starting browser worker ${i}`);
      const { command, args } = workerCommand('browser');
      spawnBackground(home, `browser-worker-${i}`, command, args, env);
    });
    await waitForPollers(conn, namespace, [cfg.temporal.controlTaskQueue, cfg.temporal.browserTaskQueue], home);
  } finally {
    await conn.close();
  }
  return stackStatus(cfg);
}

export async function waitForPollers(conn: Connection, namespace: string, queues: string[], home: string, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  for (const queue of queues) {
    for (;;) {
      const res = await conn.workflowService.describeTaskQueue({
        namespace,
        taskQueue: { name: queue },
        taskQueueType: queue.includes('browser') ? 2 /* ACTIVITY */ : 1 /* WORKFLOW */,
      });
      if ((res.pollers ?? []).length > 0) break;
      if (Date.now() > deadline) {
        throw new Error(`no worker polls task queue ${queue} after ${timeoutMs / 1000}s; see the logs in ${join(home, 'logs')}`);
      }
      await sleep(300);
    }
  }
}

/** Workers first (they finish in-flight activities), then the server. Safe to call twice. */
export async function down(cfg: HaloConfig, say: (msg: string) => void = () => {}): Promise<void> {
  const st = stackStatus(cfg);
  const names = ['control-worker', ...st.browsers.map((_, i) => `browser-worker-${i}`)];
  await Promise.all(names.map(async (n) => (await stopProcess(st.home, n)) && say(`stopped ${n}`)));
  if (await stopProcess(st.home, 'temporal')) say('stopped Temporal dev server');
}

export async function connectClient(cfg: HaloConfig): Promise<{ client: Client; connection: Connection }> {
  const s = temporalSettings(cfg.temporal);
  const connection = await Connection.connect({ address: s.address, tls: s.tls, apiKey: s.apiKey, connectTimeout: 5000 }).catch(
    (err: Error) => {
      throw new Error(`cannot reach Temporal at ${s.address} (${err.message}); run \`npx halo up\` first`);
    },
  );
  return { client: new Client({ connection, namespace: s.namespace }), connection };
}
