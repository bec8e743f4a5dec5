import { Client, type Connection } from '@temporalio/client';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, openSync, closeSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT, isAlive, learnerCommand, sleep, workerCommand } from '../client/processes';
import { prepareNamespace, startDevServer, startDevServerOnFreePort, waitForServer } from '../client/temporal-server';
import { waitForPollers } from '../client/stack';

/**
 * A real, private stack for a test file: Temporal dev server (headless, own SQLite file, random port),
 * a control worker and browser workers as child processes, exactly as `halo up` runs them, and on request
 * the Python learner (`learner: true`: tiny-random model, checkpoints under the test home, a private gpu queue).
 */
export interface TestStack {
  home: string;
  address: string;
  namespace: string;
  controlQueue: string;
  browserQueue: string;
  /** The learner's task queue (unique per stack). */
  gpuQueue: string;
  /** HALO_CHECKPOINTS of the learner: `<home>/checkpoints`. */
  checkpoints: string;
  client: Client;
  connection: Connection;
  startWorker(kind: 'control' | 'browser'): Promise<ChildProcess>;
  /** Starts a Python learner worker and waits until it polls the gpu queue (the tiny model is built on first start). */
  startLearner(): Promise<ChildProcess>;
  workers: ChildProcess[];
  restartServer(): Promise<void>;
  stop(): Promise<void>;
  /**
   * Another namespace on the same server whose workers (a control worker and `browserWorkers` browser workers)
   * share this stack's home, blob store included: two teams on one machine. Its workers are in `workers` too.
   */
  addNamespace(namespace: string, browserWorkers?: number): Promise<NamespaceWorkers>;
}

export interface NamespaceWorkers {
  namespace: string;
  client: Client;
  controlQueue: string;
  browserQueue: string;
  workers: ChildProcess[];
}

export interface TestStackOptions {
  browserWorkers?: number;
  control?: boolean;
  /** Start the Python learner too; `model` defaults to tiny-random, `env` adds variables (HALO_MICRO_BATCH…). */
  learner?: boolean | { model?: string; env?: Record<string, string> };
}

export async function startTestStack(opts: TestStackOptions = {}): Promise<TestStack> {
  const home = mkdtempSync(join(tmpdir(), 'halo-test-'));
  const namespace = 'default';
  const suffix = Math.random().toString(36).slice(2, 8);
  const controlQueue = `halo-control-${suffix}`;
  const browserQueue = `halo-browser-${suffix}`;
  const gpuQueue = `halo-gpu-${suffix}`;
  const checkpoints = join(home, 'checkpoints');
  const learnerOpts = typeof opts.learner === 'object' ? opts.learner : {};
  const started = await startDevServerOnFreePort({ home });
  const { port, address } = started;
  let server = started.server;
  const connection = started.connection;
  await prepareNamespace(connection, namespace, 30);
  const workers: ChildProcess[] = [];
  const env = {
    ...process.env,
    HALO_HOME: home,
    TEMPORAL_ADDRESS: address,
    TEMPORAL_NAMESPACE: namespace,
    HALO_CONTROL_QUEUE: controlQueue,
    HALO_BROWSER_QUEUE: browserQueue,
    HALO_GPU_QUEUE: gpuQueue,
    HALO_CHECKPOINTS: checkpoints,
    HALO_MODEL: learnerOpts.model ?? 'tiny-random',
    HF_HUB_OFFLINE: '1',
  };
  const startIn = async (workerEnv: NodeJS.ProcessEnv, ns: string, cq: string, bq: string, kind: 'control' | 'browser') => {
    const { command, args } = workerCommand(kind);
    const logFile = join(home, `${kind}-${workers.length}.log`);
    const fd = openSync(logFile, 'a');
    const child = spawn(command, args, { cwd: REPO_ROOT, env: workerEnv, stdio: ['ignore', fd, fd] });
    child.on('error', () => {}); // a missing interpreter shows as pid undefined below
    closeSync(fd);
    workers.push(child);
    if (child.pid === undefined) throw new Error(`could not start the ${kind} worker (${command})`);
    // Its own poller: a worker SIGKILLed before it stays listed on the queue for minutes.
    const queue = kind === 'control' ? { name: cq, type: 'workflow' as const } : { name: bq, type: 'activity' as const };
    await waitForPollers(connection, ns, [{ ...queue, process: { name: `${kind} worker`, pid: child.pid, logFile } }], home);
    return child;
  };
  // A test file killed mid-run (node's runner SIGTERMs a file past its timeout) must not leave this stack running
  // beside the files after it: its server, workers and learner get SIGTERM as the process goes.
  const orphans = () => {
    for (const w of workers) if (w.exitCode === null && w.signalCode === null) w.kill('SIGTERM');
    try {
      process.kill(server.pid, 'SIGTERM');
    } catch {
      /* already gone */
    }
  };
  endWithProcess(orphans);
  const stack: TestStack = {
    home,
    address,
    namespace,
    controlQueue,
    browserQueue,
    gpuQueue,
    checkpoints,
    connection,
    client: new Client({ connection, namespace }),
    workers,
    startWorker: (kind) => startIn(env, namespace, controlQueue, browserQueue, kind),
    async addNamespace(other, browserWorkers = 1) {
      // A namespace just registered is not served at once (the server's namespace cache refreshes every few seconds).
      for (let tries = 1; ; tries++) {
        try {
          await prepareNamespace(connection, other, 30);
          break;
        } catch (err) {
          if (!/not found/i.test((err as Error).message) || tries >= 60) throw err;
          await sleep(1_000);
        }
      }
      const tag = Math.random().toString(36).slice(2, 8);
      const q = { control: `halo-control-${tag}`, browser: `halo-browser-${tag}` };
      const otherEnv = { ...env, TEMPORAL_NAMESPACE: other, HALO_CONTROL_QUEUE: q.control, HALO_BROWSER_QUEUE: q.browser };
      const kinds: ('control' | 'browser')[] = ['control', ...Array.from({ length: browserWorkers }, () => 'browser' as const)];
      const started = await Promise.all(kinds.map((k) => startIn(otherEnv, other, q.control, q.browser, k)));
      return { namespace: other, client: new Client({ connection, namespace: other }), controlQueue: q.control, browserQueue: q.browser, workers: started };
    },
    async startLearner() {
      const l = learnerCommand({ ...env, ...learnerOpts.env });
      const logFile = join(home, `learner-${workers.length}.log`);
      const fd = openSync(logFile, 'a');
      const child = spawn(l.command, l.args, { cwd: REPO_ROOT, env: l.env, stdio: ['ignore', fd, fd] });
      child.on('error', () => {}); // a missing interpreter shows as pid undefined below
      closeSync(fd);
      workers.push(child);
      if (child.pid === undefined) throw new Error(`could not start the learner (${l.command})`);
      await waitForPollers(connection, namespace, [{ name: gpuQueue, type: 'activity', process: { name: 'learner', pid: child.pid, logFile } }], home, 180_000);
      return child;
    },
    async restartServer() {
      process.kill(server.pid, 'SIGTERM');
      await waitExit(server.pid);
      server = await startDevServer({ home, port });
      await waitForServer(address, 90_000, server);
    },
    async stop() {
      live.delete(orphans);
      // Bounded: a worker stuck in its shutdown (a browser that does not close, a poll against a restarted
      // server) is SIGKILLed after the grace, so a test file never outlives its tests.
      await Promise.all(workers.map((w) => stopChild(w, STOP_GRACE_MS)));
      await within(connection.close(), 10_000).catch(() => {});
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
  if (opts.learner) starts.push(stack.startLearner());
  try {
    await Promise.all(starts);
  } catch (err) {
    // Leave no server or worker behind when a start fails (HALO_KEEP_TEST_HOME=1 keeps the logs).
    await Promise.allSettled(starts);
    await stack.stop().catch(() => {});
    throw err;
  }
  return stack;
}

const STOP_GRACE_MS = 30_000;

/** The stacks this process started and has not stopped, each as the function that ends its processes. */
const live = new Set<() => void>();
let hooked = false;

/**
 * Runs `end` when this process exits, or is ended by SIGTERM, SIGINT or SIGHUP (a signal with no other listener:
 * Node's default for them is to die without an exit event). A SIGKILLed process runs nothing.
 */
function endWithProcess(end: () => void): void {
  live.add(end);
  if (hooked) return;
  hooked = true;
  const endAll = () => {
    for (const e of live) e();
    live.clear();
  };
  process.on('exit', endAll);
  for (const [signal, code] of [
    ['SIGTERM', 143],
    ['SIGINT', 130],
    ['SIGHUP', 129],
  ] as const) {
    if (process.listenerCount(signal) > 0) continue;
    process.once(signal, () => {
      endAll();
      process.exit(code);
    });
  }
}

/** `p`, or undefined after `ms`; the timer is cleared either way, so it keeps no test file alive. */
export async function within<T>(p: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<undefined>((r) => {
        timer = setTimeout(() => r(undefined), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

async function stopChild(w: ChildProcess, graceMs: number): Promise<void> {
  const running = () => w.exitCode === null && w.signalCode === null;
  if (!running()) return;
  const exited = new Promise<void>((r) => w.once('exit', () => r()));
  w.kill('SIGTERM');
  await within(exited, graceMs);
  if (!running()) return;
  process.stderr.write(`test stack: ${w.spawnargs.join(' ')} (pid ${w.pid}) did not exit ${graceMs / 1000} s after SIGTERM: SIGKILL\n`);
  w.kill('SIGKILL');
  await within(exited, 5_000);
}

/** Waits for `pid` to go (SIGKILL after `timeoutMs`), so a restart can bind the same port again. */
async function waitExit(pid: number, timeoutMs = 20_000): Promise<void> {
  const gone = () => !isAlive(pid);
  const until = async (deadline: number) => {
    while (Date.now() < deadline) {
      if (gone()) return true;
      await sleep(100);
    }
    return gone();
  };
  if (await until(Date.now() + timeoutMs)) return;
  process.kill(pid, 'SIGKILL');
  await until(Date.now() + 5_000);
}
