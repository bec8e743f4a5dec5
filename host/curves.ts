import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { delimiter, join, resolve } from 'node:path';
import type { WandbTarget } from '../lib/training/curves';

export type { WandbTarget };

/**
 * A run's curves outside this repository's own report: TensorBoard event files under `<run>/tensorboard/`
 * (`tensorboard --logdir runs/`) and, when the run's config names a W&B project, a Weights & Biases run.
 *
 * Written by `python -m halo_learner.curves` (workers/learner/halo_learner/curves.py, TensorBoard's own writer
 * and the `wandb` client) from the run's metrics file (`metrics.jsonl`, every algorithm; an old MCTS run's
 * `mcts-metrics.jsonl` when that is all it has), which already holds one line per iteration. A sync
 * writes only the iterations no event file holds yet, under a lock, so syncing again (a retried metrics
 * activity, a restarted worker, `halo report`) never writes an iteration twice, and a sync that failed or
 * never ran is caught up by the next one.
 */

export interface CurvesSyncResult {
  tensorboard: { dir: string; written: number; iterations: number[]; file?: string };
  wandb: { dir: string; project: string; mode: string | null; written: number; iterations: number[] } | null;
}

/** The sink's exit status when a package it needs (tensorboard, wandb) is not installed. */
export const CURVES_MISSING_PACKAGE = 3;

export class CurvesSyncError extends Error {
  constructor(
    message: string,
    readonly missingPackage: boolean,
  ) {
    super(message);
    this.name = 'CurvesSyncError';
  }
}

const REPO_ROOT = resolve(__dirname, '..');

/** HALO_PYTHON, else <repo>/.venv/bin/python, else python3: the interpreter the learner uses. */
export function curvesPython(env: NodeJS.ProcessEnv = process.env): string {
  if (env.HALO_PYTHON) return env.HALO_PYTHON;
  const venv = join(REPO_ROOT, '.venv', 'bin', 'python');
  return existsSync(venv) ? venv : 'python3';
}

/** What the sink process gets: what an interpreter needs, and wandb's own variables (key, mode, base URL). */
function childEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const keep = new Set(['PATH', 'HOME', 'LANG', 'LANGUAGE', 'TZ', 'TMPDIR', 'VIRTUAL_ENV']);
  const out: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(env)) {
    if (v !== undefined && (keep.has(k) || k.startsWith('LC_') || k.startsWith('PYTHON') || k.startsWith('WANDB_'))) out[k] = v;
  }
  const learner = join(REPO_ROOT, 'workers', 'learner');
  out.PYTHONPATH = out.PYTHONPATH ? `${learner}${delimiter}${out.PYTHONPATH}` : learner;
  out.PYTHONDONTWRITEBYTECODE = '1';
  return out;
}

export interface SyncCurvesOptions {
  wandb?: WandbTarget;
  python?: string;
  env?: NodeJS.ProcessEnv;
  /** Default 5 minutes. */
  timeoutMs?: number;
}

/** Brings the run folder's TensorBoard files (and W&B run) up to date with its metrics file. */
export function syncCurves(runDir: string, opts: SyncCurvesOptions = {}): Promise<CurvesSyncResult> {
  const python = opts.python ?? curvesPython(opts.env);
  const args = ['-m', 'halo_learner.curves', '--run-dir', resolve(runDir)];
  if (opts.wandb) {
    args.push('--wandb-project', opts.wandb.project);
    if (opts.wandb.entity) args.push('--wandb-entity', opts.wandb.entity);
    if (opts.wandb.mode) args.push('--wandb-mode', opts.wandb.mode);
  }
  return new Promise((resolvePromise, reject) => {
    const child = spawn(python, args, { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv(opts.env ?? process.env) });
    // Our own timer (spawn's `timeout` keeps a timer alive when the interpreter is not found).
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 300_000);
    timer.unref();
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString('utf8')));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString('utf8')));
    child.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      reject(
        new CurvesSyncError(
          `cannot run ${python} for the run's curves: ${err.code === 'ENOENT' ? 'not found (set HALO_PYTHON or create .venv)' : err.message}`,
          err.code === 'ENOENT',
        ),
      );
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) {
        try {
          const line = stdout.trim().split('\n').pop() ?? '';
          resolvePromise(JSON.parse(line) as CurvesSyncResult);
        } catch {
          reject(new CurvesSyncError(`the curves sink printed no result: ${stdout.slice(-500)}`, false));
        }
        return;
      }
      const why = stderr.trim().split('\n').slice(-3).join(' ') || (signal ? `killed by ${signal}` : `exit status ${code}`);
      reject(new CurvesSyncError(why, code === CURVES_MISSING_PACKAGE));
    });
  });
}

export interface CurvesSink {
  /**
   * Starts a sync of the run in the background (the caller does not wait: an iteration's end is not held up
   * by it). Syncs of one run are serialised; calls made while one runs are folded into one more sync after it.
   */
  schedule(runsRoot: string, runId: string, wandb?: WandbTarget): void;
  /** Resolves when every scheduled sync has ended (tests, shutdown). */
  idle(): Promise<void>;
}

export interface CurvesSinkOptions {
  warn?: (message: string, fields?: Record<string, unknown>) => void;
  python?: string;
  env?: NodeJS.ProcessEnv;
}

interface SyncJob {
  runDir: string;
  wandb?: WandbTarget;
}

export function createCurvesSink(opts: CurvesSinkOptions = {}): CurvesSink {
  const running = new Map<string, { again: SyncJob | null; done: Promise<void> }>();
  const warned = new Set<string>();
  const warn = (message: string, fields?: Record<string, unknown>) => {
    if (warned.has(message)) return; // once per message: a missing package would otherwise repeat every iteration
    warned.add(message);
    (opts.warn ?? ((m, f) => console.warn(m, f ?? '')))(message, fields);
  };

  async function loop(key: string, first: SyncJob): Promise<void> {
    let job: SyncJob | null = first;
    while (job) {
      try {
        await syncCurves(job.runDir, { wandb: job.wandb, python: opts.python, env: opts.env });
      } catch (err) {
        warn(`run curves (TensorBoard${job.wandb ? ', W&B' : ''}) not written: ${(err as Error).message}`, { runDir: job.runDir });
      }
      const entry = running.get(key)!;
      job = entry.again;
      entry.again = null;
    }
    running.delete(key);
  }

  return {
    schedule(runsRoot, runId, wandb) {
      const runDir = join(runsRoot, runId);
      const key = resolve(runDir);
      const entry = running.get(key);
      if (entry) {
        entry.again = { runDir, wandb };
        return;
      }
      const slot: { again: SyncJob | null; done: Promise<void> } = { again: null, done: Promise.resolve() };
      running.set(key, slot);
      slot.done = loop(key, { runDir, wandb });
    },
    async idle() {
      while (running.size > 0) await Promise.all([...running.values()].map((e) => e.done));
    },
  };
}
