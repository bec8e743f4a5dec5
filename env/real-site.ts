import type { Page } from 'playwright-core';
import { firstLine, isFatalPageError, sleep } from './page-actions';

// Whether a REAL site answers: the health check before a run or an episode, and the page loads that open one.

/** The site (origin) cannot be reached; callers make this non-retryable for the episode. */
export class SiteUnreachableError extends Error {
  readonly origin: string;
  readonly status?: number;
  constructor(origin: string, detail: string, status?: number) {
    super(`REAL site ${origin} is unreachable: ${detail}`);
    this.name = 'SiteUnreachableError';
    this.origin = origin;
    if (status !== undefined) this.status = status;
  }
}

export interface HealthOptions {
  /** Attempts (default 3). */
  attempts?: number;
  /** Per attempt (default 5 s). */
  timeoutMs?: number;
  /** Wait before the second attempt, doubling after (default 500 ms). */
  backoffMs?: number;
}

export interface HealthResult {
  origin: string;
  status: number;
  latencyMs: number;
  attempts: number;
}

/**
 * GET `<origin>/` with bounded retries. Healthy on 2xx/3xx; 429, 5xx and network errors are retried; other
 * 4xx (404 deployment gone, 451 taken down) fail at once. Throws SiteUnreachableError.
 */
export async function checkSiteHealth(originOrUrl: string, opts: HealthOptions = {}): Promise<HealthResult> {
  let origin: string;
  try {
    origin = new URL(originOrUrl).origin;
  } catch {
    throw new SiteUnreachableError(originOrUrl, 'not an http(s) URL');
  }
  const attempts = Math.max(1, opts.attempts ?? 3);
  const timeoutMs = opts.timeoutMs ?? 5_000;
  let backoff = opts.backoffMs ?? 500;
  let last = '';
  let lastStatus: number | undefined;
  for (let i = 1; i <= attempts; i++) {
    const started = Date.now();
    try {
      const res = await fetch(`${origin}/`, { method: 'GET', redirect: 'manual', signal: AbortSignal.timeout(timeoutMs) });
      await res.body?.cancel().catch(() => undefined);
      if (res.status < 400) return { origin, status: res.status, latencyMs: Date.now() - started, attempts: i };
      lastStatus = res.status;
      last = `HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ''}`;
      if (res.status !== 429 && res.status < 500) {
        throw new SiteUnreachableError(origin, `${last} at ${origin}/ (attempt ${i} of ${attempts}, not retried)`, res.status);
      }
    } catch (err) {
      if (err instanceof SiteUnreachableError) throw err;
      const e = err as Error & { cause?: { code?: string; message?: string } };
      last = e.name === 'TimeoutError' ? `no answer within ${timeoutMs} ms` : (e.cause?.code ?? e.cause?.message ?? e.message);
      lastStatus = undefined;
    }
    if (i < attempts) {
      await sleep(backoff);
      backoff *= 2;
    }
  }
  throw new SiteUnreachableError(origin, `${last} (${attempts} attempts)`, lastStatus);
}

/**
 * Loads `url` in `page` while an episode is being opened: a failed load or an HTTP error is the site being
 * unreachable (with the navigations the origin guard blocked on the way, which often explain it).
 */
export async function openOrUnreachable(page: Page, url: string, timeoutMs: number, blocked: readonly string[]): Promise<void> {
  let status: number | undefined;
  try {
    const res = await page.goto(url, { waitUntil: 'load', timeout: timeoutMs });
    status = res?.status();
  } catch (err) {
    if (isFatalPageError(err)) throw err;
    const why = blocked.length > 0 ? ` (${blocked.join('; ')})` : '';
    throw new SiteUnreachableError(new URL(url).origin, `opening ${url} failed: ${firstLine(err)}${why}`);
  }
  if (status !== undefined && status >= 400) {
    throw new SiteUnreachableError(new URL(url).origin, `opening ${url} answered HTTP ${status}`, status);
  }
}
