import type { Page } from 'playwright-core';
import type { BlobStore } from '../blob/store';
import { clip } from '../lib/model-io/actions';
import { firstLine, isFatalPageError, sleep } from './page-actions';
import { evaluateFinalState, type EvalResult, type EvaluateOptions } from './real-eval';
import type { RealTask } from './real-tasks';
import type { ApplyResult, StepOutcome } from './types';

// The end of a REAL episode: the site's /finish page renders its client state as JSON in a `<pre>`, the task's
// eval script judges it (reward 1 on SUCCESS, else 0), or the step cap ends the episode unjudged.

export const DEFAULT_FINISH_TIMEOUT_MS = 10_000;
export const DEFAULT_FINISH_POLL_MS = 250;

/** ApplyResult plus what the end of a REAL episode produced. */
export interface RealApplyResult extends ApplyResult {
  /** Blob reference of the /finish JSON (as the site rendered it). */
  finalStateRef?: string;
  evaluation?: EvalResult;
  /** The episode ended at the step cap. */
  truncated?: boolean;
}

export interface RealStepOutcome extends StepOutcome {
  finalStateRef?: string;
  evaluation?: EvalResult;
  truncated?: boolean;
}

/** /finish did not render a JSON `<pre>` in time (an infrastructure failure, not a reward of 0). */
export class FinishStateError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FinishStateError';
  }
}

export interface ReadFinishOptions {
  timeoutMs: number;
  pollMs: number;
  /** Bound on one load of /finish. */
  navigationTimeoutMs: number;
}

const READ_PRE = `(() => { const p = document.querySelector('pre'); return p ? p.innerText : null; })()`;

/**
 * Reloads `<origin>/finish` in the background page and polls until its first `<pre>` holds a JSON object;
 * reloads again if it stays incomplete; bounded by timeoutMs. Throws FinishStateError.
 */
export async function readFinishState(bg: Page | undefined, origin: string, opts: ReadFinishOptions): Promise<{ text: string; value: object }> {
  if (!bg || bg.isClosed()) throw new FinishStateError('REAL background page is closed');
  const url = `${origin}/finish`;
  const { timeoutMs, pollMs } = opts;
  const reloadEveryMs = Math.max(2_000, Math.floor(timeoutMs / 3));
  const deadline = Date.now() + timeoutMs;
  let last = 'nothing read';
  while (Date.now() < deadline) {
    const loadStarted = Date.now();
    try {
      await bg.goto(url, { waitUntil: 'domcontentloaded', timeout: Math.max(1, Math.min(deadline - Date.now(), opts.navigationTimeoutMs)) });
    } catch (err) {
      if (isFatalPageError(err)) throw err;
      last = `loading failed: ${firstLine(err)}`;
      await sleep(Math.min(pollMs, Math.max(0, deadline - Date.now())));
      continue;
    }
    while (Date.now() < deadline && Date.now() - loadStarted < reloadEveryMs) {
      let text: string | null = null;
      try {
        text = (await bg.evaluate(READ_PRE)) as string | null;
      } catch (err) {
        if (isFatalPageError(err)) throw err;
        last = `reading failed: ${firstLine(err)}`;
      }
      if (text === null) {
        if (!last.startsWith('reading failed')) last = 'no <pre> element';
      } else {
        const trimmed = text.trim();
        try {
          const value = JSON.parse(trimmed) as unknown;
          if (value !== null && typeof value === 'object' && !Array.isArray(value)) return { text: trimmed, value };
          last = `<pre> holds JSON that is not an object: ${clip(trimmed, 80)}`;
        } catch {
          last = `<pre> is not JSON yet: ${JSON.stringify(clip(trimmed, 80))}`;
        }
      }
      await sleep(Math.min(pollMs, Math.max(0, deadline - Date.now())));
    }
  }
  throw new FinishStateError(`${url} did not render a JSON <pre> within ${timeoutMs} ms (${last})`);
}

/** agisdk's budgets for reading /finish (webclones/base.py get_finish_json, and the 5 s context default it runs under). */
export const AGISDK_FINISH_LOAD_MS = 1_000;
export const AGISDK_FINISH_IDLE_MS = 1_000;
export const AGISDK_DEFAULT_TIMEOUT_MS = 5_000;

/**
 * /finish read once, as agisdk reads it: load within 1 s, network idle within 1 s, the first `<pre>` taken as it
 * is (a `Loading…` placeholder included), no reload and no retry. `error` carries agisdk's message where it
 * would raise (which ends its episode with reward 0); `text` is whatever the `<pre>` held, JSON or not.
 */
export async function readFinishAsAgisdk(bg: Page | undefined, origin: string): Promise<{ text: string } | { error: string }> {
  if (!bg || bg.isClosed()) throw new FinishStateError('REAL background page is closed');
  try {
    await bg.goto(`${origin}/finish`, { timeout: AGISDK_FINISH_LOAD_MS });
    await bg.waitForLoadState('networkidle', { timeout: AGISDK_FINISH_IDLE_MS });
    const pre = await bg.waitForSelector('pre', { timeout: AGISDK_DEFAULT_TIMEOUT_MS });
    if (!pre) return { error: 'No state data available' };
    // biome-ignore lint/performance/useDomNodeTextContent: agisdk reads inner_text(), and the eval must see the same text
    return { text: await pre.innerText() };
  } catch (err) {
    if (isFatalPageError(err)) throw err;
    if ((err as Error).name === 'TimeoutError') return { error: `Validation endpoint not yet available (${firstLine(err)})` };
    return { error: `Validation error: ${firstLine(err)}` };
  }
}

/**
 * The official end of an episode: agisdk's read of /finish, then its eval; where agisdk would raise (a read that
 * timed out, a `<pre>` that is not JSON) the episode scores 0, with agisdk's reason.
 */
export async function judgeAsAgisdk(bg: Page | undefined, origin: string, task: RealTask, blobs: BlobStore, evalOptions?: EvaluateOptions): Promise<RealApplyResult> {
  const read = await readFinishAsAgisdk(bg, origin);
  const zero = (reason: string, finalStateRef?: string): RealApplyResult => ({
    reward: 0,
    done: true,
    success: false,
    reason: `official scoring: ${reason}`,
    ...(finalStateRef ? { finalStateRef } : {}),
  });
  if ('error' in read) return zero(read.error);
  try {
    JSON.parse(read.text);
  } catch (err) {
    return zero(`Invalid JSON format: ${firstLine(err)} in ${JSON.stringify(clip(read.text.trim(), 80))}`, await blobs.put(read.text, 'json'));
  }
  return judgeFinalState(task, read.text, blobs, { ...evalOptions, runUnscorable: true });
}

/** Stores the /finish text and judges it with the task's eval script: the result that ends the episode. */
export async function judgeFinalState(task: RealTask, finishText: string, blobs: BlobStore, evalOptions?: EvaluateOptions): Promise<RealApplyResult> {
  const finalStateRef = await blobs.put(finishText, 'json');
  const evaluation = await evaluateFinalState(task, finishText, evalOptions);
  return {
    reward: evaluation.success ? 1 : 0,
    done: true,
    success: evaluation.success,
    reason: evalFirstLine(evaluation),
    finalStateRef,
    evaluation,
  };
}

/** The official rule at the step cap: reward 0, not evaluated. */
export function unjudgedAtCap(steps: number): RealApplyResult {
  return { reward: 0, done: true, success: false, reason: `step cap reached after ${steps} steps: not evaluated (official REAL rule)`, truncated: true };
}

function evalFirstLine(e: EvalResult): string {
  if (e.error && !e.success) return `eval error: ${e.error}`;
  const line = e.output.split('\n').find((l) => l.trim() !== '');
  return line ? clip(line.trim(), 300) : '(no eval output)';
}
