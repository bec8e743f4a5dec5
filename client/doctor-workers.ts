import { Connection } from '@temporalio/client';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { firstLine } from '../env/page-actions';
import { connectOptions, temporalSettings } from '../host/connection';
import type { HaloConfig } from '../lib/config/config';
import { learnerBaseModel } from '../lib/episode/run-context';
import { ALL_SEARCH_ATTRIBUTES } from '../lib/episode/search-attributes';
import type { DoctorCheck } from './doctor-check';
import { pidFile, readPid } from './processes';
import { learnerSettings, stackStatus } from './stack';

// `halo doctor` on the Temporal side: the server, its namespace and search attributes, and the workers that poll
// the run's task queues (the learner among them, with its model, device and watchdog restarts).

/** A poller seen longer ago than this is a worker that went away (Temporal keeps pollers listed for minutes). */
const POLLER_FRESH_MS = 90_000;

const HALO_UP = 'npx halo up';

export async function temporalChecks(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<DoctorCheck[]> {
  const s = temporalSettings(cfg.temporal, env);
  const ids = ['temporal.namespace', 'temporal.search-attributes', 'worker.control', 'worker.browser', 'learner'];
  const names = ['Temporal namespace', 'search attributes', 'control worker', 'browser worker', 'learner'];
  let conn: Connection;
  try {
    conn = await Connection.connect({ ...connectOptions(s), connectTimeout: timeoutMs });
    await conn.workflowService.getSystemInfo({});
  } catch (err) {
    return [
      {
        id: 'temporal',
        name: 'Temporal server',
        status: 'fail',
        detail: `cannot reach ${s.address}: ${firstLine((err as Error).message)}`,
        fix: `${HALO_UP} starts the local dev server; for another server set TEMPORAL_ADDRESS (or temporal.address)`,
      },
      ...ids.map((id, i) => ({ id, name: names[i], status: 'skip' as const, detail: 'Temporal is unreachable' })),
    ];
  }
  const out: DoctorCheck[] = [{ id: 'temporal', name: 'Temporal server', status: 'pass', detail: `${s.address} answers` }];
  try {
    try {
      const ns = await conn.workflowService.describeNamespace({ namespace: s.namespace });
      const days = Number(ns.config?.workflowExecutionRetentionTtl?.seconds ?? 0) / 86_400;
      out.push({ id: 'temporal.namespace', name: 'Temporal namespace', status: 'pass', detail: `${s.namespace} (retention ${days} days)` });
    } catch (err) {
      out.push({
        id: 'temporal.namespace',
        name: 'Temporal namespace',
        status: 'fail',
        detail: `${s.namespace}: ${firstLine((err as Error).message)}`,
        fix: `${HALO_UP} creates it on the local server; elsewhere: temporal operator namespace create --namespace ${s.namespace}`,
      });
      return [...out, ...ids.slice(1).map((id, i) => ({ id, name: names[i + 1], status: 'skip' as const, detail: 'no namespace' }))];
    }
    const sa = await conn.operatorService.listSearchAttributes({ namespace: s.namespace });
    const have = new Set(Object.keys(sa.customAttributes ?? {}));
    const missing = ALL_SEARCH_ATTRIBUTES.map((k) => k.name).filter((n) => !have.has(n));
    out.push(
      missing.length === 0
        ? { id: 'temporal.search-attributes', name: 'search attributes', status: 'pass', detail: ALL_SEARCH_ATTRIBUTES.map((k) => k.name).join(', ') }
        : {
            id: 'temporal.search-attributes',
            name: 'search attributes',
            status: 'fail',
            detail: `missing ${missing.join(', ')}`,
            fix: `${HALO_UP} adds them on the local server; elsewhere: ${missing.map((n) => `temporal operator search-attribute create --namespace ${s.namespace} --name ${n} --type Keyword`).join(' && ')}`,
          },
    );
    const st = stackStatus(cfg);
    const learner = learnerSettings(env);
    out.push(
      await workerCheck(conn, s.namespace, {
        id: 'worker.control',
        name: 'control worker',
        queue: cfg.temporal.controlTaskQueue,
        type: 'workflow',
        pidNames: ['control-worker'],
        home: st.home,
        fix: `${HALO_UP} starts it (log: ${join(st.home, 'logs', 'control-worker.log')})`,
      }),
    );
    out.push(
      await workerCheck(conn, s.namespace, {
        id: 'worker.browser',
        name: 'browser worker',
        queue: cfg.temporal.browserTaskQueue,
        type: 'activity',
        pidNames: Array.from({ length: cfg.stack.browserWorkers }, (_, i) => `browser-worker-${i}`),
        home: st.home,
        fix: `${HALO_UP} starts it (logs: ${join(st.home, 'logs', 'browser-worker-<i>.log')})`,
      }),
    );
    const lc = await workerCheck(conn, s.namespace, {
      id: 'learner',
      name: 'learner',
      queue: cfg.train.gpuTaskQueue,
      type: 'activity',
      pidNames: ['learner'],
      home: st.home,
      fix:
        `${HALO_UP} starts it (HALO_MODEL=Qwen/Qwen3-VL-8B-Instruct for the real model; log: ${join(st.home, 'logs', 'learner.log')}); ` +
        `on a GPU box without Docker: ./launch.sh gpu${learner.enabled ? '' : '; HALO_LEARNER is off in this shell, so halo up leaves it out'}`,
    });
    out.push(learnerDetail(lc, cfg));
  } finally {
    await conn.close();
  }
  return out;
}

interface WorkerSpec {
  id: string;
  name: string;
  queue: string;
  type: 'workflow' | 'activity';
  /** Pid files of the local stack (`halo up`) for this role: a file whose process is gone is a stopped worker. */
  pidNames: string[];
  home: string;
  fix: string;
}

export interface WorkerCheck extends DoctorCheck {
  identities?: string[];
}

async function workerCheck(conn: Connection, namespace: string, w: WorkerSpec): Promise<WorkerCheck> {
  const stale = w.pidNames.filter((n) => {
    // A file whose pid is gone, or is now another process (after a reboot), names nothing that runs.
    return existsSync(pidFile(w.home, n)) && readPid(w.home, n) === undefined;
  });
  if (stale.length) {
    return {
      id: w.id,
      name: w.name,
      status: 'fail',
      detail: `${stale.join(', ')} of the local stack is not running (its pid file in ${join(w.home, 'pids')} names a process that is gone)`,
      fix: w.fix,
    };
  }
  const res = await conn.workflowService.describeTaskQueue({
    namespace,
    taskQueue: { name: w.queue },
    taskQueueType: w.type === 'activity' ? 2 /* ACTIVITY */ : 1 /* WORKFLOW */,
  });
  const now = Date.now();
  const fresh = (res.pollers ?? []).filter((p) => {
    const t = p.lastAccessTime;
    if (!t?.seconds) return true;
    return now - (Number(t.seconds) * 1000 + Math.floor((t.nanos ?? 0) / 1e6)) < POLLER_FRESH_MS;
  });
  if (fresh.length === 0) {
    return { id: w.id, name: w.name, status: 'fail', detail: `no worker polls task queue ${w.queue}`, fix: w.fix };
  }
  const identities = fresh.map((p) => p.identity ?? '?');
  return { id: w.id, name: w.name, status: 'pass', detail: `${fresh.length} poller(s) on ${w.queue}`, identities };
}

/** The learner names its model and device in its worker identity (`… halo-learner model=X device=Y`). */
export function learnerDetail(c: WorkerCheck, cfg: HaloConfig): DoctorCheck {
  const { identities, ...check } = c;
  if (check.status !== 'pass' || !identities) return check;
  const parsed = identities.map((id) => ({
    model: /\bmodel=(\S+)/.exec(id)?.[1],
    device: /\bdevice=(\S+)/.exec(id)?.[1],
    gpu: /\bgpu=(\S+)/.exec(id)?.[1]?.replace(/_/g, ' '),
  }));
  const desc = parsed.map((p) => (p.model ? `${p.model} on ${p.device ?? '?'}${p.gpu ? ` (${p.gpu})` : ''}` : 'model and device not reported')).join('; ');
  const detail = `${check.detail}: ${desc}`;
  const want = learnerBaseModel(cfg);
  const other = want ? parsed.find((p) => p.model && p.model !== want) : undefined;
  if (other) {
    return { ...check, status: 'fail', detail, fix: `the config trains ${want}; restart the learner with HALO_MODEL=${want}` };
  }
  const bigOnCpu = parsed.find(
    (p) => p.device === 'cpu' && p.model && /\b\d{1,3}(\.\d+)?B\b/i.test(p.model.replace(/[-_/]/g, ' ')) && parseFloat(/(\d{1,3}(?:\.\d+)?)B\b/i.exec(p.model)![1]) >= 3,
  );
  if (bigOnCpu) {
    return {
      ...check,
      status: 'warn',
      detail,
      fix: `${bigOnCpu.model} runs on the CPU: an update takes hours; check that torch sees the GPU (python -c "import torch; print(torch.cuda.is_available())")`,
    };
  }
  return { ...check, detail };
}

/** How long a watchdog restart stays a warning. */
const WATCHDOG_RECENT_MS = 24 * 3600_000;

/**
 * The learner restarts itself when its one activity slot stays busy past the activity's timeout
 * (workers/learner/halo_learner/watchdog.py) and leaves a record per queue and host under `<home>/learner/`:
 * a recent one is a warning, with what was stuck.
 */
export function learnerWatchdogCheck(home: string, queue: string, now = Date.now()): DoctorCheck {
  const name = 'learner watchdog';
  const dir = join(home, 'learner');
  const prefix = `watchdog-${queue}-`;
  let latest: { at: number; message?: string; activity_type?: string; workflow_id?: string } | undefined;
  for (const f of existsSync(dir) ? readdirSync(dir) : []) {
    if (!f.startsWith(prefix) || !f.endsWith('.json')) continue;
    try {
      const rec = JSON.parse(readFileSync(join(dir, f), 'utf8'));
      if (typeof rec?.at === 'number' && (!latest || rec.at > latest.at)) latest = rec;
    } catch {
      // a record being replaced, or not ours: the next run of doctor reads it
    }
  }
  if (!latest || now - latest.at * 1000 > WATCHDOG_RECENT_MS) {
    return { id: 'learner.watchdog', name, status: 'pass', detail: `no watchdog restart of the ${queue} learner in the last 24 h` };
  }
  return {
    id: 'learner.watchdog',
    name,
    status: 'warn',
    detail: `restarted itself ${new Date(latest.at * 1000).toISOString()}: ${latest.message ?? `${latest.activity_type} of ${latest.workflow_id} never completed`}`,
    fix: `read the learner's log around that time (${join(home, 'logs', 'learner.log')}): the attempt that held the slot names the run; its retry runs on the restarted learner`,
  };
}
