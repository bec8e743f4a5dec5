import { Client, Connection } from '@temporalio/client';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, openSync, closeSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT, workerCommand } from '../../client/processes';
import { freePort, prepareNamespace, startDevServer, waitForServer } from '../../client/temporal-server';
import { waitForPollers } from '../../client/stack';

/**
 * A real, private stack for a test file: Temporal dev server (headless, own SQLite file, random port),
 * a control worker and browser workers as child processes, exactly as `halo up` runs them.
 */
export interface TestStack {
  home: string;
  address: string;
  namespace: string;
  controlQueue: string;
  browserQueue: string;
  client: Client;
  connection: Connection;
  startWorker(kind: 'control' | 'browser'): Promise<ChildProcess>;
  workers: ChildProcess[];
  restartServer(): Promise<void>;
  stop(): Promise<void>;
}

export async function startTestStack(opts: { browserWorkers?: number; control?: boolean } = {}): Promise<TestStack> {
  const home = mkdtempSync(join(tmpdir(), 'halo-test-'));
  const port = await freePort();
  const address = `127.0.0.1:${port}`;
  const namespace = 'default';
  const suffix = Math.random().toString(36).slice(2, 8);
  const controlQueue = `halo-control-${suffix}`;
  const browserQueue = `halo-browser-${suffix}`;
  let server = await startDevServer({ home, port });
  let connection = await waitForServer(address, 90_000);
  await prepareNamespace(connection, namespace, 30);
  const workers: ChildProcess[] = [];
  const env = {
    ...process.env,
    HALO_HOME: home,
    TEMPORAL_ADDRESS: address,
    TEMPORAL_NAMESPACE: namespace,
    HALO_CONTROL_QUEUE: controlQueue,
    HALO_BROWSER_QUEUE: browserQueue,
  };
  const stack: TestStack = {
    home,
    address,
    namespace,
    controlQueue,
    browserQueue,
    connection,
    client: new Client({ connection, namespace }),
    workers,
    async startWorker(kind) {
      const { command, args } = workerCommand(kind);
      const fd = openSync(join(home, `${kind}-${workers.length}.log`), 'a');
      const child = spawn(command, args, { cwd: REPO_ROOT, env, stdio: ['ignore', fd, fd] });
      closeSync(fd);
      workers.push(child);
      await waitForPollers(connection, namespace, [kind === 'control' ? controlQueue : browserQueue], home);
      return child;
    },
    async restartServer() {
      process.kill(server.pid, 'SIGTERM');
      await waitExit(server.pid);
      server = await startDevServer({ home, port });
      await waitForServer(address, 90_000);
    },
    async stop() {
      for (const w of workers) if (w.exitCode === null && w.signalCode === null) w.kill('SIGTERM');
      await Promise.all(workers.map((w) => (w.exitCode === null && w.signalCode === null ? new Promise((r) => w.once('exit', r)) : null)));
      await connection.close();
      try {
        process.kill(server.pid, 'SIGTERM');
        await waitExit(server.pid);
      } catch {
        /* already gone */
      }
      if (!process.env.HALO_KEEP_TEST_HOME) rmSync(home, { recursive: true, force: true });
    },
  };
  const starts: Promise<unknown>[] = [];
  if (opts.control !== false) starts.push(stack.startWorker('control'));
  for (let i = 0; i < (opts.browserWorkers ?? 1); i++) starts.push(stack.startWorker('browser'));
  await Promise.all(starts);
  return stack;
}

async function waitExit(pid: number, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      process.kill(pid, 0);
    } catch {
      return;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  process.kill(pid, 'SIGKILL');
}
