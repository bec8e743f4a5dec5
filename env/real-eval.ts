import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { RealTask } from './real-tasks';
import { minimalChildEnv } from './child-env';

/**
 * Runs a REAL v2 eval script on a final state, the way agisdk 0.3.5 does it
 * (`WebCloneEvaluator.execute_eval_script_subprocess`):
 *   - the whole /finish JSON is written to a temporary `.json` file (agisdk: `json.dump(state, f, indent=2)`);
 *   - `python <eval_script.py> <state_file>` runs with a 30 s limit; nothing goes to stdin and the agent's
 *     final message is not passed;
 *   - success iff `"SUCCESS" in stdout.strip().upper()` (so "UNSUCCESSFUL" would count too: that is the
 *     harness's rule, kept as is); the exit code is ignored; a timeout is a failure.
 */

export const EVAL_TIMEOUT_MS = 30_000;
const DEFAULT_MAX_OUTPUT_CHARS = 2_000;
/** Bytes of stdout/stderr kept from the child (the scripts print one word). */
const MAX_CAPTURE_BYTES = 1 << 20;

const REPO_ROOT = resolve(__dirname, '..');

export interface EvalResult {
  success: boolean;
  /** The script's stdout, trimmed and clipped. */
  output: string;
  durationMs: number;
  /** Set when the script did not run to completion (timeout, killed, non-zero exit without SUCCESS). */
  error?: string;
  exitCode?: number | null;
  /** The script's stderr, trimmed and clipped, when it wrote any. */
  stderr?: string;
}

export interface EvaluateOptions {
  /** Interpreter; default HALO_PYTHON, else <repo>/.venv/bin/python, else python3. */
  python?: string;
  /** Default 30 s, as the harness. */
  timeoutMs?: number;
  /** Clip of `output` / `stderr` (default 2000 characters). */
  maxOutputChars?: number;
  /**
   * Run the task's script even when the registry found it unusable (empty or missing): agisdk runs it, prints
   * nothing to find SUCCESS in, and scores 0, which official scoring counts.
   */
  runUnscorable?: boolean;
}

/** The parts of a task the evaluator needs. */
export type EvaluableTask = Pick<RealTask, 'id' | 'evalScript' | 'evalScriptPath' | 'evalSha256' | 'scorable' | 'unscorableReason'>;

export class UnscorableTaskError extends Error {
  readonly taskId: string;
  constructor(task: Pick<RealTask, 'id' | 'evalScript' | 'unscorableReason'>) {
    super(
      `REAL task ${task.id} cannot be scored: ${task.unscorableReason ?? `eval script ${task.evalScript} is unusable`}; ` + 'leave it out of training and evaluation task lists',
    );
    this.name = 'UnscorableTaskError';
    this.taskId = task.id;
  }
}

/** The eval script on disk is not the one the registry recorded (the package changed under a running process). */
export class EvalScriptChangedError extends Error {
  constructor(task: EvaluableTask, actual: string) {
    super(`eval script ${task.evalScriptPath} of REAL task ${task.id} changed: sha256 ${actual}, registry has ${task.evalSha256}`);
    this.name = 'EvalScriptChangedError';
  }
}

/** The harness's success rule: `"SUCCESS" in stdout.strip().upper()`. */
export function isSuccessOutput(stdout: string): boolean {
  return stdout.trim().toUpperCase().includes('SUCCESS');
}

/** HALO_PYTHON, else <repo>/.venv/bin/python, else python3 (the scripts need only the standard library). */
export function resolveEvalPython(): string {
  const fromEnv = process.env.HALO_PYTHON;
  if (fromEnv) return fromEnv;
  const venv = join(REPO_ROOT, '.venv', 'bin', 'python');
  return existsSync(venv) ? venv : 'python3';
}

function clipText(s: string, n: number): string {
  return s.length <= n ? s : `${s.slice(0, n - 1)}…`;
}

/**
 * Judges a final state with the task's eval script. `finalState` is the /finish JSON, either as text (written
 * byte for byte after checking that it parses) or as a value (serialised with two-space indentation like
 * agisdk). Throws UnscorableTaskError for unscorable tasks, and an Error when the interpreter cannot be
 * started; everything the script itself does ends in an EvalResult.
 */
export async function evaluateFinalState(task: EvaluableTask, finalState: string | object, opts: EvaluateOptions = {}): Promise<EvalResult> {
  if (!task.scorable && !opts.runUnscorable) throw new UnscorableTaskError(task);
  const scriptBytes = await readFile(task.evalScriptPath).catch((err: unknown) => {
    if (task.scorable) throw err;
    return Buffer.alloc(0);
  });
  const sha = createHash('sha256').update(scriptBytes).digest('hex');
  if (task.evalSha256 !== null && sha !== task.evalSha256) throw new EvalScriptChangedError(task, sha);

  let text: string;
  if (typeof finalState === 'string') {
    try {
      JSON.parse(finalState);
    } catch (err) {
      throw new Error(`final state of ${task.id} is not JSON: ${(err as Error).message}`);
    }
    text = finalState;
  } else {
    text = JSON.stringify(finalState, null, 2);
  }

  const timeoutMs = opts.timeoutMs ?? EVAL_TIMEOUT_MS;
  const maxChars = opts.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS;
  const python = opts.python ?? resolveEvalPython();
  const dir = await mkdtemp(join(tmpdir(), `halo-eval-${task.id}-`));
  const statePath = join(dir, 'state.json');
  try {
    await writeFile(statePath, text, 'utf8');
    const run = await runScript(python, task.evalScriptPath, statePath, dir, timeoutMs);
    const stdout = run.stdout.trim();
    const stderr = run.stderr.trim();
    const success = !run.timedOut && isSuccessOutput(stdout);
    let error: string | undefined;
    if (run.timedOut) error = `eval script ${task.evalScript} timed out after ${timeoutMs} ms (killed)`;
    else if (!success && run.signal) error = `eval script ${task.evalScript} was killed by ${run.signal}`;
    else if (!success && run.exitCode !== 0) {
      const last =
        stderr
          .split('\n')
          .filter((l) => l.trim() !== '')
          .pop() ?? '';
      error = `eval script ${task.evalScript} exited with code ${run.exitCode}${last ? `: ${clipText(last, 300)}` : ''}`;
    }
    return {
      success,
      output: clipText(stdout, maxChars),
      durationMs: run.durationMs,
      exitCode: run.exitCode,
      ...(stderr ? { stderr: clipText(stderr, maxChars) } : {}),
      ...(error !== undefined ? { error } : {}),
    };
  } finally {
    await rm(dir, { recursive: true, force: true }).catch(() => undefined);
  }
}

interface ScriptRun {
  stdout: string;
  stderr: string;
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  timedOut: boolean;
  durationMs: number;
}

function runScript(python: string, script: string, statePath: string, cwd: string, timeoutMs: number): Promise<ScriptRun> {
  return new Promise((ok, fail) => {
    const started = Date.now();
    // Own process group, so that a timeout kills anything the script started too.
    const child = spawn(python, [script, statePath], {
      cwd,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
      // Only what the interpreter needs: the script never sees the worker's keys (env/child-env.ts).
      env: minimalChildEnv(process.env, { PYTHONIOENCODING: 'utf-8', PYTHONDONTWRITEBYTECODE: '1' }),
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let outBytes = 0;
    let errBytes = 0;
    child.stdout.on('data', (b: Buffer) => {
      if (outBytes < MAX_CAPTURE_BYTES) out.push(b);
      outBytes += b.length;
    });
    child.stderr.on('data', (b: Buffer) => {
      if (errBytes < MAX_CAPTURE_BYTES) err.push(b);
      errBytes += b.length;
    });
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
    }, timeoutMs);
    child.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      fail(new Error(`cannot run the eval interpreter ${python}: ${e.code === 'ENOENT' ? 'not found' : e.message}; set HALO_PYTHON or create .venv`));
    });
    child.on('close', (exitCode, signal) => {
      clearTimeout(timer);
      ok({
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
        exitCode,
        signal,
        timedOut,
        durationMs: Date.now() - started,
      });
    });
  });
}
