import { Client, Connection } from '@temporalio/client';
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { HaloConfig } from '../lib/config/config';
import { connectOptions, temporalSettings } from '../host/connection';
import { isAlive, learnerCommand, logTail, readPid, sleep, spawnBackground, stopProcess, workerCommand, REPO_ROOT, type ManagedProcess } from './processes';
import { learnerModelFor, recordLearnerModel } from './learner-record';
import { withoutModelKeys } from '../env/child-env';
import { prepareNamespace, startDevServer, waitForServer } from './temporal-server';
import { metricsEndpoints } from './worker-metrics';
import { WORKER_STOP_GRACE_MS } from '../workers/shutdown';

export interface StackStatus {
  temporal: number | undefined;
  control: number | undefined;
  browsers: (number | undefined)[];
  /** The Python learner worker; undefined when not running (or disabled with HALO_LEARNER=0). */
  learner: number | undefined;
  learnerEnabled: boolean;
  gpuQueue: string;
  learnerModel: string;
  address: string;
  namespace: string;
  uiUrl?: string;
  home: string;
}

const isLocal = (address: string) => /^(127\.0\.0\.1|localhost|\[::1\]):\d+$/.test(address);

/**
 * The learner's settings come from the environment until lib/config/config.ts has fields for them:
 * - HALO_LEARNER: `0`/`off`/`false` leaves the learner out of `halo up` (e.g. it runs on a GPU box elsewhere
 *   and polls the same Temporal server);
 * - HALO_GPU_QUEUE: its task queue, default `gpu`;
 * - HALO_MODEL: the model it holds. The local stack defaults to `tiny-random` (a seeded tiny Qwen3-VL built
 *   on the spot) so `halo up` works offline and on a CPU; set HALO_MODEL=Qwen/Qwen3-VL-8B-Instruct (or a
 *   local path) for real training. The learner's own default, when started by hand, is the 8B model;
 * - HALO_LEARNER_START_TIMEOUT_S: how long `up` waits for it to poll (loading the 8B takes minutes), default 600;
 * - HALO_CHECKPOINTS, HALO_MICRO_BATCH, HALO_LORA_*, HALO_TORCH_THREADS…: passed through (workers/learner/README.md).
 */
export function learnerSettings(env: NodeJS.ProcessEnv = process.env) {
  return {
    enabled: !/^(0|off|false|no)$/i.test(env.HALO_LEARNER ?? ''),
    gpuQueue: env.HALO_GPU_QUEUE || 'gpu',
    model: env.HALO_MODEL || 'tiny-random',
    startTimeoutMs: 1000 * (Number(env.HALO_LEARNER_START_TIMEOUT_S) || 600),
    /** SIGTERM lets the running update finish (HALO_SHUTDOWN_GRACE_S, default 60 s) before SIGKILL. */
    stopGraceMs: 1000 * ((Number(env.HALO_SHUTDOWN_GRACE_S) || 60) + 10),
  };
}

/** What `halo up --role` starts on a host: one part of the stack, against a Temporal server that runs elsewhere. */
export const ROLES = ['browser', 'control', 'learner'] as const;
export type Role = (typeof ROLES)[number];

export function parseRoles(values: string[] | string | undefined): Role[] | undefined {
  if (values === undefined) return undefined;
  const list = (Array.isArray(values) ? values : [values])
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter(Boolean);
  for (const r of list) {
    if (!(ROLES as readonly string[]).includes(r)) throw new Error(`--role ${JSON.stringify(r)}: one of ${ROLES.join(', ')}`);
  }
  return list.length ? [...new Set(list as Role[])] : undefined;
}

function stackEnv(cfg: HaloConfig, home: string, address: string, namespace: string, roles?: Role[]): NodeJS.ProcessEnv {
  const learner = learnerSettings();
  return {
    ...process.env,
    // A host started by role keeps everything under its own home, adapter checkpoints (a cache when
    // HALO_STORE names an object store) included.
    ...(roles && !process.env.HALO_CHECKPOINTS ? { HALO_CHECKPOINTS: join(home, 'checkpoints') } : {}),
    HALO_HOME: home,
    TEMPORAL_ADDRESS: address,
    TEMPORAL_NAMESPACE: namespace,
    HALO_CONTROL_QUEUE: cfg.temporal.controlTaskQueue,
    HALO_BROWSER_QUEUE: cfg.temporal.browserTaskQueue,
    HALO_GPU_QUEUE: learner.gpuQueue,
    HALO_MODEL: learner.model,
  };
}

export function stackStatus(cfg: HaloConfig): StackStatus {
  const home = resolve(REPO_ROOT, cfg.stack.home);
  const s = temporalSettings(cfg.temporal);
  const learner = learnerSettings();
  return {
    temporal: readPid(home, 'temporal'),
    control: readPid(home, 'control-worker'),
    browsers: Array.from({ length: cfg.stack.browserWorkers }, (_, i) => readPid(home, `browser-worker-${i}`)),
    learner: readPid(home, 'learner'),
    learnerEnabled: learner.enabled,
    gpuQueue: learner.gpuQueue,
    learnerModel: learnerModelFor(home, learner.model),
    address: s.address,
    namespace: s.namespace,
    uiUrl: isLocal(s.address) ? `http://localhost:${cfg.stack.uiPort}` : undefined,
    home,
  };
}

/**
 * Start what is not running yet (Temporal dev server for a local address, control worker, browser
 * workers, the Python learner) and wait until the server answers and every worker polls its queue. Safe to
 * call twice. A control worker starts on a workflow bundle built here, and only after every open workflow of
 * its queue replayed against that bundle (workers/upgrade-check.ts): otherwise UpgradeRefused, nothing started.
 * `upgrade` restarts a running control worker the same way (new code, runs in flight).
 */
export async function up(cfg: HaloConfig, say: (msg: string) => void = () => {}, opts: { roles?: Role[]; upgrade?: boolean } = {}): Promise<StackStatus> {
  const st = stackStatus(cfg);
  const { home, address, namespace } = st;
  // Without roles: the whole stack on this box. With roles: only those parts, and never a Temporal server.
  const roles = opts.roles;
  const has = (r: Role) => !roles || roles.includes(r);
  if (!roles && isLocal(address) && st.temporal === undefined) {
    const port = Number(address.split(':').pop());
    say(`starting Temporal dev server on ${address} (UI :${cfg.stack.uiPort}, data ${join(home, 'temporal.db')})`);
    await startDevServer({ home, port, uiPort: cfg.stack.uiPort, sqliteSynchronous: cfg.stack.sqliteSynchronous });
  }
  const conn = await waitForServer(address, 90_000);
  try {
    if (!roles && isLocal(address)) await prepareNamespace(conn, namespace, cfg.stack.retentionDays);
    const env = stackEnv(cfg, home, address, namespace, roles);
    const learner = learnerSettings();
    const learnerOn = roles ? roles.includes('learner') : learner.enabled;
    const started = new Map<string, ManagedProcess>();
    // Each worker process serves its SDK metrics on a port of its own (client/worker-metrics.ts).
    const metrics = metricsEndpoints(process.env, cfg.stack.browserWorkers);
    const withMetrics = (e: NodeJS.ProcessEnv, address: string | undefined) => (address ? { ...e, HALO_METRICS_ADDRESS: address } : e);
    if (has('control') && (st.control === undefined || opts.upgrade)) {
      // Before any worker starts: the open workflows must replay against the code the new worker will run. The
      // worker SDK is loaded here, not with the CLI (a quarter second of every `halo` command's start); a require,
      // as the CLI runs under tsx's CommonJS hook, where import() of a .ts path does not resolve.
      const { buildWorkflowBundle } = require('../workers/workflow-bundle') as typeof import('../workers/workflow-bundle');
      const { upgradeWorkflowWorker } = require('../workers/upgrade-check') as typeof import('../workers/upgrade-check');
      const bundle = await buildWorkflowBundle(join(home, 'bundles'));
      const client = new Client({ connection: conn, namespace });
      const { check } = await upgradeWorkflowWorker(client, cfg.temporal.controlTaskQueue, bundle, async () => {
        if (st.control !== undefined && (await stopProcess(home, 'control-worker', WORKER_STOP_GRACE_MS))) say(`stopped control worker (pid ${st.control})`);
        say(`starting control worker on workflow build ${bundle.buildId}${metrics ? ` (metrics on ${metrics.control})` : ''}`);
        const { command, args } = workerCommand('control');
        started.set('control', spawnBackground(home, 'control-worker', command, args, withMetrics({ ...env, HALO_WORKFLOW_BUNDLE: bundle.path }, metrics?.control)));
      });
      if (check.replayed.length > 0) say(`the ${check.replayed.length} open workflow(s) replay against build ${bundle.buildId}`);
    }
    st.browsers.forEach((pid, i) => {
      if (pid !== undefined || !has('browser')) return;
      say(`starting browser worker ${i}${metrics ? ` (metrics on ${metrics.browsers[i]})` : ''}`);
      const { command, args } = workerCommand('browser');
      started.set(`browser-${i}`, spawnBackground(home, `browser-worker-${i}`, command, args, withMetrics(withoutModelKeys(env), metrics?.browsers[i])));
    });
    if (learnerOn && st.learner === undefined) {
      // Without HALO_MODEL: the model this stack's learner last ran (client/learner-record.ts).
      const model = learnerModelFor(home, learner.model);
      say(`starting learner (model ${model}, queue ${learner.gpuQueue})${metrics ? ` (metrics on ${metrics.learner})` : ''}`);
      const l = learnerCommand(withMetrics({ ...env, HALO_MODEL: model }, metrics?.learner));
      started.set('learner', spawnBackground(home, 'learner', l.command, l.args, l.env));
      recordLearnerModel(home, model);
    }
    const browser = [...started.entries()].find(([k]) => k.startsWith('browser'))?.[1];
    await waitForPollers(
      conn,
      namespace,
      [
        ...(has('control') ? [{ name: cfg.temporal.controlTaskQueue, type: 'workflow' as const, process: started.get('control') }] : []),
        ...(has('browser') ? [{ name: cfg.temporal.browserTaskQueue, type: 'activity' as const, process: browser }] : []),
      ],
      home,
    );
    if (learnerOn) {
      await waitForPollers(conn, namespace, [{ name: learner.gpuQueue, type: 'activity', process: started.get('learner') }], home, learner.startTimeoutMs);
    }
  } finally {
    await conn.close();
  }
  return stackStatus(cfg);
}

/**
 * A task queue to wait for. With `process` (one just started) the wait is for that process's own poller, and
 * fails fast, with its log, if the process dies.
 */
export interface QueueWait {
  name: string;
  type: 'workflow' | 'activity';
  process?: ManagedProcess;
}

export async function waitForPollers(conn: Connection, namespace: string, queues: (string | QueueWait)[], home: string, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  for (const q of queues) {
    // Plain names: the browser queues are activity queues, the rest workflow queues (as before).
    const { name, type, process: proc } = typeof q === 'string' ? { name: q, type: q.includes('browser') ? 'activity' : 'workflow', process: undefined } : q;
    // With a process: its own poller (identity `<pid>@<host>…`), not one a dead predecessor left listed for minutes.
    const ours = (identity?: string | null) => !proc || (identity ?? '').startsWith(`${proc.pid}@`);
    for (;;) {
      const res = await conn.workflowService.describeTaskQueue({
        namespace,
        taskQueue: { name },
        taskQueueType: type === 'activity' ? 2 /* ACTIVITY */ : 1 /* WORKFLOW */,
      });
      if ((res.pollers ?? []).some((p) => ours(p.identity))) break;
      if (proc && !isAlive(proc.pid)) {
        throw new Error(`${proc.name} (pid ${proc.pid}) exited before polling task queue ${name}; the end of ${proc.logFile}:\n${logTail(proc.logFile)}`);
      }
      if (Date.now() > deadline) {
        throw new Error(`no worker polls task queue ${name} after ${timeoutMs / 1000}s; see the logs in ${join(home, 'logs')}`);
      }
      await sleep(300);
    }
  }
}

/**
 * vLLM as `./launch.sh gpu` starts it (bin/launch-gpu.sh): pid in <home>/pids/vllm.pid, leading its own process group;
 * on a box of several GPUs replica i ≥ 2 in vllm-<i>.pid.
 */
export const VLLM_PROCESS = 'vllm';

/** The vLLM replicas `./launch.sh gpu` left pid files for: vllm, vllm-2, vllm-3, … */
export function vllmProcesses(home: string): string[] {
  let files: string[];
  try {
    files = readdirSync(join(home, 'pids'));
  } catch {
    return [];
  }
  const replica = (n: string) => (n === VLLM_PROCESS ? 1 : Number(n.slice(VLLM_PROCESS.length + 1)));
  return files
    .map((f) => f.replace(/\.pid$/, ''))
    .filter((n) => n === VLLM_PROCESS || /^vllm-[1-9][0-9]*$/.test(n))
    .sort((a, b) => replica(a) - replica(b));
}

/** How long vLLM may take to shut down (its engine processes included) before SIGKILL: HALO_VLLM_STOP_GRACE_S, default 30. */
export function vllmStopGraceMs(env: NodeJS.ProcessEnv = process.env): number {
  return 1000 * (Number(env.HALO_VLLM_STOP_GRACE_S) || 30);
}

/**
 * Workers first (they finish in-flight activities, policy calls included), then the server and the vLLM that
 * `./launch.sh gpu` started. Safe to call twice.
 */
export async function down(cfg: HaloConfig, say: (msg: string) => void = () => {}, opts: { roles?: Role[] } = {}): Promise<void> {
  const st = stackStatus(cfg);
  const has = (r: Role) => !opts.roles || opts.roles.includes(r);
  const names = [...(has('control') ? ['control-worker'] : []), ...(has('browser') ? st.browsers.map((_, i) => `browser-worker-${i}`) : [])];
  // The learner is a worker too: stopped with the others (it finishes the running update first), and
  // whether or not it is enabled now, so a stack started with it never leaves it behind.
  await Promise.all([
    ...names.map(async (n) => (await stopProcess(st.home, n, WORKER_STOP_GRACE_MS)) && say(`stopped ${n}`)),
    (async () => has('learner') && (await stopProcess(st.home, 'learner', learnerSettings().stopGraceMs)) && say('stopped learner'))(),
  ]);
  if (opts.roles) return;
  const replicas = vllmProcesses(st.home).map((name) => ({ name, pid: readPid(st.home, name) }));
  const [temporal, ...stopped] = await Promise.all([stopProcess(st.home, 'temporal'), ...replicas.map((r) => stopProcess(st.home, r.name, vllmStopGraceMs(), { group: true }))]);
  if (temporal) say('stopped Temporal dev server');
  for (const [i, r] of replicas.entries()) {
    if (stopped[i])
      say(`stopped vLLM${r.name === VLLM_PROCESS ? '' : ` replica ${r.name}`} (pid ${r.pid}, started by ./launch.sh gpu; log ${join(st.home, 'logs', `${r.name}.log`)})`);
  }
}

/**
 * The docker compose stack of this repository (docker-compose.yml), when any of its services runs: stopped by
 * `./teardown.sh --compose-only` (workers first, then vLLM, Temporal and Postgres; volumes kept). Returns the
 * services it stopped. Only for the stack whose home is the repository's runs folder (the one compose mounts),
 * never for another home (`--home`, a test's config); HALO_DOWN_COMPOSE=0 leaves it alone (./teardown.sh sets
 * it when it calls `halo down`).
 */
export function downCompose(home: string, say: (msg: string) => void = () => {}, env: NodeJS.ProcessEnv = process.env): string[] {
  if (resolve(home) !== join(REPO_ROOT, 'runs')) return [];
  if (/^(0|off|false|no)$/i.test(env.HALO_DOWN_COMPOSE ?? '')) return [];
  const ps = spawnSync('docker', ['compose', 'ps', '--status', 'running', '--services'], { cwd: REPO_ROOT, env, encoding: 'utf8', timeout: 30_000 });
  if (ps.error || ps.status !== 0) return []; // no docker, no compose plugin, no daemon: nothing of compose runs here
  const services = ps.stdout
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean);
  if (services.length === 0) return [];
  say(`the docker compose stack runs (${services.join(', ')}): stopping it with ./teardown.sh --compose-only`);
  const r = spawnSync(join(REPO_ROOT, 'teardown.sh'), ['--compose-only'], { cwd: REPO_ROOT, env, stdio: ['ignore', 2, 2] });
  if (r.status !== 0) throw new Error(`./teardown.sh --compose-only failed (exit ${r.status ?? r.signal}); the compose services ${services.join(', ')} may still run`);
  say(`stopped the docker compose services ${services.join(', ')} (volumes kept: docker compose up -d resumes)`);
  return services;
}

export async function connectClient(cfg: HaloConfig): Promise<{ client: Client; connection: Connection }> {
  const s = temporalSettings(cfg.temporal);
  const connection = await Connection.connect({ ...connectOptions(s), connectTimeout: 5000 }).catch((err: Error) => {
    throw new Error(`cannot reach Temporal at ${s.address} (${err.message}); run \`npx halo up\` first`);
  });
  return { client: new Client({ connection, namespace: s.namespace }), connection };
}
